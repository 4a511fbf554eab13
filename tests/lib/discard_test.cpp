// Discard and trim (A6, format.md#discard): what a generation frees is
// discarded only after that generation is durable, and before the blocks
// are handed out again; trim discards exactly the free space, also while
// operations and commits run. MemDevice zeroes what is discarded, so a
// live block discarded by mistake shows up as a damaged node.
#include <atomic>
#include <random>
#include <thread>

#include "commit/disk_superblock.h"
#include "test_util.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

using Kind = RecordingDevice::Kind;

bool is_super_write(const RecordingDevice::Entry& e) {
  return e.kind == Kind::Write && (e.offset == disk::kSuperOffset[0] || e.offset == disk::kSuperOffset[1]);
}

// Fills tree `t` with `n` items of 900 bytes (a leaf or so every four).
void fill(Volume& v, TreeId t, uint64_t from, uint64_t n, Model& model) {
  std::vector<std::byte> big(900, std::byte{0x5a});
  for (uint64_t i = from; i < from + n; i++) {
    auto txn = must(v.begin());
    big[0] = std::byte(i);
    must(txn.put(t, Key{i, 0}, big));
    model[Key{i, 0}] = big;
  }
}

TreeId plain_tree(Volume& v) {
  auto txn = must(v.begin());
  return must(txn.create_tree(kKindPlain));
}

void erase(Volume& v, TreeId t, uint64_t from, uint64_t n, Model& model) {
  for (uint64_t i = from; i < from + n; i++) {
    auto txn = must(v.begin(Volume::TxnOptions{true, 0}));
    (void)must(txn.erase(t, Key{i, 0}));
    model.erase(Key{i, 0});
  }
}

}  // namespace

TEST_CASE("discard: a generation's frees are discarded right after it is durable, then reused (A6)",
          "[alloc][discard]") {
  auto mem = fresh_device(16 << 20);
  RecordingDevice dev(*mem);
  VolumeOptions vo;
  vo.discard = true;
  auto vol = must(Volume::open(dev, vo));
  const TreeId t = plain_tree(*vol);
  Model model;
  fill(*vol, t, 0, 2000, model);
  must(vol->commit());
  const uint64_t used_full = vol->space_stats().used_blocks;
  erase(*vol, t, 0, 1900, model);
  must(vol->commit());
  const uint64_t freed = used_full - vol->space_stats().used_blocks;
  REQUIRE(freed > 300);

  // Every discard follows the flush that made a superblock durable (or
  // another discard of the same batch): never before, so that the
  // generation before, which reaches these blocks, is never selectable
  // while they are discarded.
  const auto log = dev.log();
  uint64_t discarded = 0;
  for (size_t i = 0; i < log.size(); i++) {
    if (log[i].kind != Kind::Discard) continue;
    discarded += log[i].length / 4096;
    size_t j = i;
    while (j > 0 && log[j - 1].kind == Kind::Discard) j--;
    REQUIRE(j >= 2);
    REQUIRE(log[j - 1].kind == Kind::Flush);
    REQUIRE(is_super_write(log[j - 2]));
  }
  // What the erasing generation freed, and every node the commits before
  // shadowed (their old copies), is discarded; nothing waits any more.
  REQUIRE(discarded >= freed);
  REQUIRE(vol->discarded_bytes() == discarded * 4096);
  REQUIRE(vol->space_stats().discarding == 0);
  REQUIRE(vol->space_stats().pending_free == 0);

  // The discarded blocks are handed out again, and nothing live was lost.
  fill(*vol, t, 5000, 1500, model);
  must(vol->close());
  require_clean(*mem);
  auto again = must(Volume::open(*mem));
  REQUIRE(dump(*again, t) == model);
}

TEST_CASE("discard: without -o discard nothing is discarded; trim discards exactly the free space",
          "[alloc][discard]") {
  auto mem = fresh_device(16 << 20);
  RecordingDevice dev(*mem);
  auto vol = must(Volume::open(dev));
  const TreeId t = plain_tree(*vol);
  Model model;
  fill(*vol, t, 0, 2000, model);
  must(vol->commit());
  erase(*vol, t, 0, 1000, model);
  must(vol->commit());
  must(vol->commit());
  for (const auto& e : dev.log()) REQUIRE(e.kind != Kind::Discard);

  const SpaceStats st = vol->space_stats();
  dev.clear();
  const uint64_t n = must(vol->trim(0, UINT64_MAX, 0));
  // Everything free now, and nothing else, once each.
  REQUIRE(n == st.free_blocks * 4096);
  uint64_t total = 0;
  for (const auto& e : dev.log()) {
    REQUIRE(e.kind == Kind::Discard);
    total += e.length;
  }
  REQUIRE(total == n);
  REQUIRE(vol->space_stats().free_blocks == st.free_blocks);  // all back in the free map

  // A minimum longer than any free run but the tail skips the fragments;
  // a range covers only its own blocks.
  const uint64_t tail_only = must(vol->trim(0, UINT64_MAX, 8ull << 20));
  REQUIRE(tail_only < n);
  const uint64_t first_mib = must(vol->trim(0, 1 << 20, 0));
  REQUIRE(first_mib <= (1u << 20));

  fill(*vol, t, 9000, 500, model);
  must(vol->close());
  require_clean(*mem);
  auto again = must(Volume::open(*mem));
  REQUIRE(dump(*again, t) == model);

  VolumeOptions ro;
  ro.read_only = true;
  auto rov = must(Volume::open(*mem, ro));
  auto r = rov->trim(0, UINT64_MAX, 0);
  REQUIRE_FALSE(r);
  REQUIRE(r.error().code == EROFS);
}

TEST_CASE("discard: trim and -o discard beside writers and commits lose nothing", "[alloc][discard]") {
  const uint64_t seed = test::seed("discard beside writers");
  auto mem = fresh_device(32 << 20);
  VolumeOptions vo;
  vo.discard = true;
  vo.commit_interval_ms = 5;
  auto vol = must(Volume::open(*mem, vo));
  const TreeId t = plain_tree(*vol);
  Model model;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> trims{0};
  std::thread trimmer([&] {
    while (!stop) {
      must(vol->trim(0, UINT64_MAX, 0));
      trims++;
    }
  });
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 30; round++) {
    const uint64_t base = rng() % 4000;
    fill(*vol, t, base, 200, model);
    erase(*vol, t, rng() % 4000, 150, model);
    if (rng() % 3 == 0) must(vol->commit());
  }
  while (trims < 3) std::this_thread::yield();
  stop = true;
  trimmer.join();
  REQUIRE(dump(*vol, t) == model);
  must(vol->close());
  require_clean(*mem);
  auto again = must(Volume::open(*mem));
  REQUIRE(dump(*again, t) == model);
}

TEST_CASE("resize: a full filesystem grows into its device in one generation; a shrink that cannot fit is refused",
          "[alloc][resize]") {
  auto mem = std::make_unique<MemDevice>(32 << 20);
  FormatOptions fo;
  fo.size_bytes = 4 << 20;
  must(Volume::format(*mem, fo));
  auto vol = must(Volume::open(*mem));
  const TreeId t = plain_tree(*vol);
  Model model;
  std::vector<std::byte> big(900, std::byte{0x77});
  uint64_t k = 0;
  for (;; k++) {  // full
    auto txn = must(vol->begin());
    if (!txn.put(t, Key{k, 0}, big)) break;
    model[Key{k, 0}] = big;
  }
  const Generation before = vol->durable_generation();
  REQUIRE(vol->total_blocks() == 1024);
  const Generation g = must(vol->resize(std::nullopt));
  REQUIRE(g.v == before.v + 1);  // one generation
  REQUIRE(vol->total_blocks() == 8192);
  REQUIRE(vol->super().total_blocks == 8192);
  REQUIRE(vol->space_stats().usable_blocks == 8192 - vol->super().first_block);
  // What did not fit now does, beyond the old end.
  for (uint64_t i = 0; i < 4 * k; i++) {
    auto txn = must(vol->begin());
    must(txn.put(t, Key{100000 + i, 0}, big));
    model[Key{100000 + i, 0}] = big;
  }
  // Shrinking below what is used and growing past the device are refused,
  // and change nothing.
  auto s = vol->resize(8 << 20);
  REQUIRE_FALSE(s);
  REQUIRE(s.error().code == ENOSPC);
  auto past = vol->grow(100000);
  REQUIRE_FALSE(past);
  REQUIRE(past.error().code == EINVAL);
  REQUIRE(vol->total_blocks() == 8192);
  must(vol->close());
  require_clean(*mem);
  auto again = must(Volume::open(*mem));
  REQUIRE(again->super().total_blocks == 8192);
  REQUIRE(dump(*again, t) == model);
}
