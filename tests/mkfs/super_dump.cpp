// super_dump DEVICE|IMAGE: prints the superblock recovery would choose, one
// key=value per line, so that the shell tests can check what mkfs.plyfs wrote
// without parsing its human summary. Exit 1 (one line on stderr) when no
// plyfs filesystem can be read.
#include <uuid/uuid.h>

#include <cstdio>

#include "blockdev/blockdev.h"
#include "commit/superblock.h"

using namespace plyfs;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: super_dump DEVICE|IMAGE\n");
    return 1;
  }
  // Read-only and without the lock: the tests may read a device that another
  // program holds, and reading never needs exclusion.
  auto dev = FileDevice::open(argv[1], FileOpenOptions{.read_only = true, .lock = false});
  if (!dev) {
    std::fprintf(stderr, "super_dump: %s\n", dev.error().message().c_str());
    return 1;
  }
  auto sb = read_superblocks(**dev);
  if (!sb) {
    std::fprintf(stderr, "super_dump: %s\n", sb.error().message().c_str());
    return 1;
  }
  const SuperInfo& s = sb->info;
  char uuid[37];
  uuid_unparse_lower(s.uuid.data(), uuid);
  auto u64 = [](const char* key, uint64_t v) {
    std::printf("%s=%llu\n", key, static_cast<unsigned long long>(v));
  };
  std::printf("uuid=%s\n", uuid);
  std::printf("label=%s\n", s.label.c_str());
  u64("block_size", s.block_size);
  u64("sector_size", s.sector_size);
  u64("total_blocks", s.total_blocks);
  u64("first_block", s.first_block);
  u64("reserve_blocks", s.reserve_blocks);
  u64("used_blocks", s.used_blocks);
  u64("generation", s.generation.v);
  u64("slot", static_cast<uint64_t>(sb->slot));
  std::printf("slot0=%s\n", slot_state_name(sb->reports[0].state));
  std::printf("slot1=%s\n", slot_state_name(sb->reports[1].state));
  u64("fell_back", sb->fell_back ? 1 : 0);
  return 0;
}
