// lib/blockdev on real loop devices: sizes and sector sizes from the ioctls,
// O_EXCL against a second writer, and a whole volume round trip. Needs root
// and loop devices; exits 77 (skipped) without them and says why.
#include <catch2/catch_test_macros.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "test_util.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

std::string sh(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[256];
  while (fgets(buf, sizeof buf, p)) out += buf;
  if (pclose(p) != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// A loop device over a sparse file, detached at the end.
struct Loop {
  std::string file, dev;
  Loop(uint64_t bytes, unsigned sector) {
    char tmpl[] = "/tmp/plyfs-loop-XXXXXX";
    int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(bytes)) == 0);
    close(fd);
    file = tmpl;
    dev = sh("losetup -f --show --sector-size " + std::to_string(sector) + " " + file);
    REQUIRE(!dev.empty());
  }
  ~Loop() {
    if (!dev.empty()) sh("losetup -d " + dev);
    unlink(file.c_str());
  }
};

}  // namespace

TEST_CASE("loop device: size and sector sizes come from the device", "[loop]") {
  for (unsigned sector : {512u, 4096u}) {
    Loop loop(64ull << 20, sector);
    auto dev = must(FileDevice::open(loop.dev));
    REQUIRE(dev->is_block_device());
    REQUIRE(dev->size_bytes() == 64ull << 20);
    REQUIRE(dev->logical_sector_size() == sector);
    REQUIRE(dev->physical_sector_size() >= sector);
    // Requests must be whole logical sectors.
    std::vector<std::byte> half(sector / 2);
    if (sector > 512) REQUIRE(dev->read(0, half).error().code == EINVAL);
  }
}

TEST_CASE("loop device: a second writer is kept out", "[loop]") {
  Loop loop(64ull << 20, 512);
  auto first = must(FileDevice::open(loop.dev));
  auto second = FileDevice::open(loop.dev);
  REQUIRE_FALSE(second);
  REQUIRE(second.error().code == EBUSY);
  auto reader = FileDevice::open(loop.dev, FileOpenOptions{true, true});
  REQUIRE_FALSE(reader);  // the writer's lock keeps a checker out, too
}

TEST_CASE("loop device: format, write, commit, reopen", "[loop]") {
  Loop loop(128ull << 20, 4096);
  TreeId t;
  {
    auto dev = must(FileDevice::open(loop.dev));
    FormatOptions fo;
    auto sb = must(Volume::format(*dev, fo));
    REQUIRE(sb.sector_size == 4096);
    auto vol = must(Volume::open(*dev));
    {
      auto txn = must(vol->begin());
      t = must(txn.create_tree(kKindPlain));
      for (uint64_t i = 0; i < 20000; i++) must(txn.put(t, Key{i, 0}, bytes("on a loop device")));
    }
    must(vol->close());
  }
  // Drop the page cache so that the reopen reads the device itself.
  sh("blockdev --flushbufs " + loop.dev);
  auto dev = must(FileDevice::open(loop.dev));
  require_clean(*dev);
  auto vol = must(Volume::open(*dev));
  REQUIRE(dump(*vol, t).size() == 20000);
}
