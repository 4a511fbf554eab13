// The image fuzzer (issue 5): mutated images go to the superblock reader, the
// volume opener and fsck, built with ASan and UBSan. Nothing may crash, hang
// or leak, and an image fsck -y says it corrected must check clean after.
//
// An input is a list of patches to a fixed base image that holds every kind
// of structure (trees with inner nodes, a clone sharing nodes, values that
// reference data extents, both superblocks), so that mutations land in
// metadata instead of in megabytes of zeroes:
//   patch = u32 block, u16 offset, u8 length, u8 flags, then `length` bytes
//   flags bit 0: re-seal the checksum of the patched node or superblock
//                (JANUS-style), so the mutation reaches the field checks
//   flags bit 1: the block number counts from first_block (a metadata block)
//   flags bit 2, in the first patch: the input patches the filesystem image
//                with compressed extents (fuzz_fs_image.cpp, fs_base_z)
// Most patches the fuzzers try are structured (struct_mutate.h): a field of
// an item of a node, set to a value that breaks an invariant, re-sealed.
// Built two ways: with libFuzzer (clang, -Dfuzzer=true) for fuzzing, and as
// a plain program that replays the committed corpus (tests/fuzz/corpus).
// fuzz_fs_image.cpp applies the same patches to an image of filesystem trees.
#include "fuzz_image.h"

#include "struct_mutate.h"

#include <algorithm>
#include <cstring>

#include "blockdev/test_devices.h"
#include "commit/disk_superblock.h"
#include "commit/verify.h"
#include "fsck/fsck.h"
#include "util/checksum.h"

namespace plyfs::fuzz {

namespace {

constexpr uint8_t kKindExtents = 7;

void extent_refs(Key, std::span<const std::byte> v, std::vector<ExtentRef>& out) {
  if (v.size() != 16) return;
  uint64_t start, len;
  std::memcpy(&start, v.data(), 8);
  std::memcpy(&len, v.data() + 8, 8);
  out.push_back(ExtentRef{BlockNo{start}, len});
}

std::map<uint8_t, ValueRefs> kinds() { return {{kKindExtents, extent_refs}}; }

// Every kind of structure, small: about 60 metadata blocks.
std::unique_ptr<MemDevice> build_base() {
  auto dev = std::make_unique<MemDevice>(2ull << 20);
  FormatOptions fo;
  fo.uuid = {7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7};
  fo.time_ns = 1;
  if (!Volume::format(*dev, fo)) __builtin_trap();
  VolumeOptions vo;
  vo.kinds = kinds();
  auto vol = Volume::open(*dev, vo);
  if (!vol) __builtin_trap();
  {
    auto txn = (*vol)->begin();
    TreeId plain = *txn->create_tree(kKindPlain);
    for (uint64_t k = 0; k < 400; k++) {
      std::vector<std::byte> v(20, static_cast<std::byte>(k));
      (void)txn->put(plain, Key{k, k}, v);
    }
    TreeId ext = *txn->create_tree(kKindExtents);
    for (uint64_t k = 0; k < 30; k++) {
      uint64_t len = 1 + k % 2;
      BlockNo e = *txn->alloc_extent(len);
      std::vector<std::byte> v(16);
      std::memcpy(v.data(), &e.v, 8);
      std::memcpy(v.data() + 8, &len, 8);
      (void)txn->put(ext, Key{k, 0}, v);
    }
  }
  (void)(*vol)->commit();
  {
    auto txn = (*vol)->begin();
    TreeId c = *txn->clone_tree(TreeId{kFirstTreeId});
    std::vector<std::byte> v(30, std::byte{1});
    (void)txn->put(c, Key{7, 7}, v);
  }
  if (!(*vol)->close()) __builtin_trap();
  return dev;
}

void reseal(MemDevice& dev, uint64_t byte_offset) {
  for (uint64_t slot : disk::kSuperOffset)
    if (byte_offset >= slot && byte_offset < slot + disk::kSuperSize) {
      auto sb = dev.peek(slot, disk::kSuperSize);
      uint64_t sum = xxh3(sb.data(), disk::kSuperSize - 16);
      std::memcpy(sb.data() + 4080, &sum, 8);
      dev.poke(slot, sb);
      return;
    }
  const uint64_t block = byte_offset / 4096 * 4096;
  auto b = dev.peek(block, 4096);
  uint64_t sum = xxh3(b.data() + 8, 4096 - 8);
  std::memcpy(b.data(), &sum, 8);
  dev.poke(block, b);
}

}  // namespace

// Applies an input's patches (the format above) to a copy of a base image.
void apply_patches(MemDevice& dev, const uint8_t* data, size_t size) {
  const uint64_t blocks = dev.size_bytes() / 4096;
  for (size_t i = 0; i + 8 <= size;) {
    uint32_t block;
    uint16_t off;
    std::memcpy(&block, data + i, 4);
    std::memcpy(&off, data + i + 4, 2);
    const uint8_t len = data[i + 6], flags = data[i + 7];
    i += 8;
    const size_t n = std::min<size_t>(len, size - i);
    if (flags & 2) block += 48;  // relative to first_block
    const uint64_t at = (block % blocks) * 4096 + off % 4096;
    const size_t fit = std::min<size_t>(n, dev.size_bytes() - at);
    dev.poke(at, std::span<const std::byte>(reinterpret_cast<const std::byte*>(data + i), fit));
    if (flags & 1) reseal(dev, at);
    i += n;
  }
}

const MemDevice& engine_base() {
  static const std::unique_ptr<MemDevice> base = build_base();
  return *base;
}

bool uses_z_base(const uint8_t* data, size_t size) { return size >= 8 && (data[7] & kUseZBase); }

size_t custom_mutate(const MemDevice& base, uint8_t* data, size_t size, size_t max_size, unsigned seed,
                     size_t (*byte_mutate)(uint8_t*, size_t, size_t), const MemDevice* zbase) {
  static const NodeMap map = map_nodes(base);  // one base per fuzzer binary (and its zbase)
  static const NodeMap zmap = zbase ? map_nodes(*zbase) : NodeMap{};
  std::mt19937_64 rng(seed);
  if (rng() % 4 == 0) return byte_mutate(data, size, max_size);
  std::vector<uint8_t> in(data, data + whole_patches(data, size));
  if (rng() % 4 == 0 || in.size() > max_size / 2) in.clear();  // a fresh list now and then
  if (in.empty() && zbase && rng() % 3 == 0) {
    // The selection: an empty patch whose flags say kUseZBase.
    const uint8_t select[8] = {0, 0, 0, 0, 0, 0, 0, kUseZBase};
    in.assign(select, select + 8);
  }
  (void)append_struct_patch(in, zbase && uses_z_base(in.data(), in.size()) ? zmap : map, rng);
  if (in.size() > max_size) return byte_mutate(data, size, max_size);
  std::memcpy(data, in.data(), in.size());
  return in.size();
}

void run_one(const uint8_t* data, size_t size) {
  auto dev = engine_base().clone();
  apply_patches(*dev, data, size);

  (void)read_superblocks(*dev);
  VolumeOptions ro;
  ro.read_only = true;
  ro.kinds = kinds();
  ro.cache_bytes = 1 << 20;
  if (auto vol = Volume::open(*dev, ro)) {
    if (auto txn = (*vol)->begin())
      if (auto trees = txn->list_trees())
        for (const auto& t : *trees)
          (void)txn->scan(t.id, Key::min(), Key::max(), [](Key, std::span<const std::byte>) { return true; });
  }
  FsckOptions fo;
  fo.kinds = kinds();
  fsck_cycle(*dev, fo);
}

void fsck_cycle(MemDevice& dev, FsckOptions fo) {
  fo.mode = FsckMode::Check;
  auto check = fsck_run(dev, fo);
  if (!check) return;  // not plyfs any more, or newer features: a clean refusal
  fo.mode = FsckMode::Yes;
  auto fixed = fsck_run(dev, fo);
  // An image -n could check, -y must check too (and repair or refuse).
  if (!fixed) __builtin_trap();
  if (check->exit_code == kFsckClean && fixed->exit_code != kFsckClean) __builtin_trap();
  fo.mode = FsckMode::Check;
  auto after = fsck_run(dev, fo);
  if (!after) __builtin_trap();
  // A repair that does not leave the image clean is a finding; a refusal
  // must leave something no repair can mend (fsck.h: -y stops there).
  if (fixed->exit_code == kFsckCorrected && after->exit_code != kFsckClean) __builtin_trap();
  if (fixed->exit_code == kFsckUncorrected &&
      std::none_of(after->problems.begin(), after->problems.end(),
                   [](const FsckProblem& p) { return p.fix == FixClass::None; }))
    __builtin_trap();
}

}  // namespace plyfs::fuzz

#ifdef PLYFS_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plyfs::fuzz::run_one(data, size);
  return 0;
}
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return plyfs::fuzz::custom_mutate(plyfs::fuzz::engine_base(), data, size, max_size, seed, LLVMFuzzerMutate);
}
#endif
