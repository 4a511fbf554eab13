// Shrinking by relocation (Volume::shrink, BTree::relocate;
// format.md#relocation). The engine test builds random histories of trees,
// clones and shared extents whose data it knows, shrinks to just above what
// is used, and checks that every tree holds what it held, every extent's
// bytes moved with it, whatever was shared is still shared (used blocks do
// not change), no write touched a block the durable generation reached
// (C3, every intermediate generation verified clean), and both superblock
// slots describe the new end. The filesystem test does the same through
// files, snapshots and reflinks.
#include <atomic>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <catch2/generators/catch_generators.hpp>

#include "commit/superblock.h"
#include "fs/check.h"
#include "fs/fs.h"
#include "snap/snap.h"
#include "fs_image.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

// Values of this kind: (extent start, length in blocks, pattern seed).
constexpr uint8_t kKindExt = 9;

void ext_refs(Key, std::span<const std::byte> v, std::vector<ExtentRef>& out) {
  if (v.size() < 24) return;
  uint64_t start, len;
  std::memcpy(&start, v.data(), 8);
  std::memcpy(&len, v.data() + 8, 8);
  out.push_back(ExtentRef{BlockNo{start}, len});
}

bool ext_move(Key, std::span<std::byte> v, const std::function<std::optional<BlockNo>(BlockNo)>& moved) {
  if (v.size() < 24) return false;
  uint64_t start;
  std::memcpy(&start, v.data(), 8);
  auto to = moved(BlockNo{start});
  if (!to) return false;
  std::memcpy(v.data(), &to->v, 8);
  return true;
}

VolumeOptions ext_options() {
  VolumeOptions vo;
  vo.kinds[kKindExt] = ext_refs;
  vo.movers[kKindExt] = ext_move;
  vo.cache_bytes = 8 << 20;
  return vo;
}

std::vector<std::byte> pattern(uint64_t seed, uint64_t nbytes) {
  std::vector<std::byte> v(nbytes);
  std::mt19937_64 r(seed);
  for (size_t i = 0; i < nbytes; i += 8) {
    const uint64_t x = r();
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, nbytes - i));
  }
  return v;
}

struct ExtVal {
  uint64_t start, len, seed;
};
ExtVal decode(const std::vector<std::byte>& v) {
  ExtVal e;
  std::memcpy(&e.start, v.data(), 8);
  std::memcpy(&e.len, v.data() + 8, 8);
  std::memcpy(&e.seed, v.data() + 16, 8);
  return e;
}

struct History {
  std::map<uint64_t, Model> trees;
  std::map<uint64_t, uint8_t> kind;
};

// A random history: plain and extent trees, puts of both, erases, clones
// (which share everything) and drops, with commits between.
History build(Volume& vol, std::mt19937_64& rng, int steps) {
  History h;
  const uint64_t bs = vol.block_size();
  auto make = [&](uint8_t k) {
    auto t = must(vol.begin());
    const TreeId id = must(t.create_tree(k));
    h.trees[id.v];
    h.kind[id.v] = k;
  };
  make(kKindPlain);
  make(kKindExt);
  make(kKindExt);
  for (int step = 0; step < steps; step++) {
    auto it = h.trees.begin();
    std::advance(it, rng() % h.trees.size());
    const uint64_t id = it->first;
    Model& m = it->second;
    const int op = int(rng() % 20);
    if (step % 40 == 39) must(vol.commit());
    auto t = must(vol.begin());
    const Key k{rng() % 400, 0};
    if (op < 10 && h.kind[id] == kKindExt) {
      const uint64_t len = 1 + rng() % 24, seed = rng();
      auto r = t.alloc_extent(len);
      if (!r) {
        REQUIRE(r.error().code == ENOSPC);
        continue;
      }
      must(vol.write_data(*r, pattern(seed, len * bs)));
      std::vector<std::byte> v(24);
      std::memcpy(v.data(), &r->v, 8);
      std::memcpy(v.data() + 8, &len, 8);
      std::memcpy(v.data() + 16, &seed, 8);
      must(t.put(TreeId{id}, k, v));
      if (auto old = m.find(k); old != m.end()) must(t.dec_extent(BlockNo{decode(old->second).start}));
      m[k] = v;
    } else if (op < 10) {
      auto v = pattern(rng(), 16 + rng() % 900);
      must(t.put(TreeId{id}, k, v));
      m[k] = v;
    } else if (op < 15) {
      if (must(t.erase(TreeId{id}, k))) {
        if (h.kind[id] == kKindExt) must(t.dec_extent(BlockNo{decode(m[k]).start}));
        m.erase(k);
      }
    } else if (op < 18 && h.trees.size() < 10) {
      const TreeId c = must(t.clone_tree(TreeId{id}));
      h.trees[c.v] = m;
      h.kind[c.v] = h.kind[id];
    } else if (op < 19 && id > h.trees.begin()->first + 2) {  // a clone; the first three stay
      must(t.drop_tree(TreeId{id}));
      h.trees.erase(id);
      h.kind.erase(id);
    }
  }
  return h;
}

// Everything the volume holds, checked against the history: plain values
// equal, extent values of the same length and bytes, and the old-to-new
// map of extent starts one to one (what was shared is still shared).
void check(Volume& vol, const History& h, const History& before, std::map<uint64_t, uint64_t>* moves) {
  const uint64_t bs = vol.block_size();
  for (const auto& [id, m] : h.trees) {
    const Model got = dump(vol, TreeId{id});
    REQUIRE(got.size() == m.size());
    for (const auto& [k, v] : m) {
      auto g = got.find(k);
      REQUIRE(g != got.end());
      if (h.kind.at(id) != kKindExt) {
        REQUIRE(g->second == v);
        continue;
      }
      const ExtVal want = decode(v), have = decode(g->second);
      REQUIRE(have.len == want.len);
      REQUIRE(have.seed == want.seed);
      REQUIRE(have.start + have.len <= vol.total_blocks());
      std::vector<std::byte> data(have.len * bs);
      must(vol.read_data(BlockNo{have.start}, data));
      REQUIRE(data == pattern(want.seed, have.len * bs));
      if (moves) {
        auto [it, fresh] = moves->emplace(want.start, have.start);
        REQUIRE(it->second == have.start);  // one old extent, one new place
        (void)fresh;
      }
    }
  }
  (void)before;
}

// Closes the image, then checks the engine's invariants and every
// filesystem check, data checksums included (fsck -c), on the smaller image.
void close_and_check(FsImage& im) {
  must(im.vol->close());
  im.vol.reset();
  VerifyOptions vo;
  vo.kinds = fs_kinds();
  require_clean(*im.dev, vo);
  CHECK(check_filesystems(*im.dev, true).empty());
}

}  // namespace

TEST_CASE("relocate: a shrink moves every block past the new end, keeps what was shared shared, and "
          "never writes over the durable generation",
          "[commit][relocate]") {
  const uint64_t seed = GENERATE(1, 2, 3, 4);
  std::mt19937_64 rng(seed);
  auto mem = std::make_unique<MemDevice>(48ull << 20);
  must(Volume::format(*mem, FormatOptions{}));
  ReachCheckDevice dev(*mem);
  dev.kinds[kKindExt] = ext_refs;
  auto vol = must(Volume::open(dev, ext_options()));
  const History h = build(*vol, rng, 900);
  must(vol->commit());
  const SpaceStats st0 = vol->space_stats();
  const uint64_t first = vol->super().first_block, total0 = vol->total_blocks();
  // Just above what is used and the new size's reserve.
  // Room for the reserve and for fragmentation: an extent moves whole, so
  // it needs a free run of its length below the end.
  const uint64_t target = first + st0.used_blocks + st0.used_blocks / 4 + 400;
  REQUIRE(target < total0 / 2);
  INFO("seed " << seed << ", " << st0.used_blocks << " blocks used, shrinking " << total0 << " -> " << target);
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  const Generation g = must(vol->resize(target * 4096, [&](uint64_t d, uint64_t t) { calls.emplace_back(d, t); }));
  REQUIRE(vol->total_blocks() == target);
  REQUIRE(vol->super().total_blocks == target);
  REQUIRE(vol->super().generation == g);
  // Nothing was duplicated: every node and extent moved, none was copied twice.
  const SpaceStats st1 = vol->space_stats();
  // (The space tree itself may take a node more or less: its items moved.)
  CHECK(st1.data_blocks == st0.data_blocks);
  CHECK(st1.meta_blocks <= st0.meta_blocks + 2);
  CHECK(st1.meta_blocks + 2 >= st0.meta_blocks);
  CHECK(st1.usable_blocks == target - first);
  REQUIRE(!calls.empty());
  CHECK(calls.back().first == calls.back().second);
  CHECK(calls.back().second > 0);  // there was something past the end to move
  std::map<uint64_t, uint64_t> moves;
  check(*vol, h, h, &moves);
  std::set<uint64_t> news;
  size_t moved = 0;
  for (auto [from, to] : moves) {
    REQUIRE(news.insert(to).second);  // distinct extents stay distinct
    moved += from != to;
  }
  CHECK(moved > 0);
  REQUIRE(dev.violations.empty());
  CHECK(dev.refreshes >= 3);  // every generation of the move was verified clean when durable
  must(vol->close());
  vol.reset();
  VerifyOptions vo;
  vo.kinds[kKindExt] = ext_refs;
  require_clean(*mem, vo);
  // Both slots describe the new end: with the newest one damaged, recovery
  // falls back to a generation of the same size, as clean.
  const SuperChoice c = must(read_superblocks(*mem));
  REQUIRE(c.reports[0].info);
  REQUIRE(c.reports[1].info);
  CHECK(c.reports[0].info->total_blocks == target);
  CHECK(c.reports[1].info->total_blocks == target);
  std::vector<std::byte> zero(4096);
  must(mem->write(kSlotBytes[c.slot], zero));
  auto again = must(Volume::open(*mem, ext_options()));
  REQUIRE(again->recovery().slot != c.slot);
  REQUIRE(again->super().generation.v + 1 == g.v);
  REQUIRE(again->total_blocks() == target);
  check(*again, h, h, nullptr);
  // And the smaller filesystem is a working one.
  auto t = must(again->begin());
  const TreeId n = must(t.create_tree(kKindPlain));
  must(t.put(n, Key{1, 0}, bytes("after")));
}

TEST_CASE("relocate: a shrink that cannot be done is refused and changes nothing", "[commit][relocate]") {
  std::mt19937_64 rng(7);
  auto mem = std::make_unique<MemDevice>(32ull << 20);
  must(Volume::format(*mem, FormatOptions{}));
  auto vol = must(Volume::open(*mem, ext_options()));
  const History h = build(*vol, rng, 600);
  must(vol->commit());
  const SpaceStats st0 = vol->space_stats();
  const uint64_t first = vol->super().first_block, total0 = vol->total_blocks();
  // Below what is used: ENOSPC, before anything moves.
  auto r = vol->resize((first + st0.used_blocks / 2 + 256) * 4096);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == ENOSPC);
  // Below the smallest filesystem mkfs makes: EINVAL.
  auto tiny = vol->resize(100 * 4096);
  REQUIRE_FALSE(tiny);
  CHECK(tiny.error().code == EINVAL);
  REQUIRE(vol->total_blocks() == total0);
  CHECK(vol->space_stats().free_blocks == st0.free_blocks);
  check(*vol, h, h, nullptr);
  // A kind whose references cannot be moved: EOPNOTSUPP, nothing moved.
  must(vol->close());
  vol.reset();
  VolumeOptions no_mover = ext_options();
  no_mover.movers.clear();
  auto v2 = must(Volume::open(*mem, no_mover));
  auto r2 = v2->resize((total0 - 512) * 4096);
  REQUIRE_FALSE(r2);
  CHECK(r2.error().code == EOPNOTSUPP);
  REQUIRE(v2->total_blocks() == total0);
  // Every block is usable again: the space past the refused end fills.
  const uint64_t free_before = v2->space_stats().free_blocks;
  CHECK(free_before == st0.free_blocks);
  must(v2->close());
  VerifyOptions vo;
  vo.kinds[kKindExt] = ext_refs;
  require_clean(*mem, vo);
}

TEST_CASE("relocate: a filesystem with snapshots and reflinked files shrinks with every file intact",
          "[fs][relocate]") {
  FsImage im(96ull << 20);
  std::mt19937_64 rng(11);
  std::map<std::string, std::vector<std::byte>> want;  // main's files
  {
    auto fs = must(Filesystem::open(*im.vol, im.main));
    for (int i = 0; i < 24; i++) {
      const std::string name = "f" + std::to_string(i);
      auto a = must(fs->mknod(fs->root(), name, S_IFREG | 0644, 0, 0, 0));
      auto data = pattern(rng(), 1 + rng() % (600 << 10));
      REQUIRE(must(fs->write(a.ino, 0, data)) == data.size());
      want[name] = data;
    }
    // A reflinked copy shares f0's blocks.
    auto src = must(fs->lookup(fs->root(), "f0"));
    auto dst = must(fs->mknod(fs->root(), "copy", S_IFREG | 0644, 0, 0, 0));
    (void)must(fs->copy_range(src.ino, 0, dst.ino, 0, want["f0"].size()));
    want["copy"] = want["f0"];
  }
  const Snapshot s1 = must(snapshot(*im.vol, im.main, "s1"));
  const auto at_s1 = want;
  {
    auto fs = must(Filesystem::open(*im.vol, im.main));
    for (int i = 0; i < 24; i += 3) {  // some rewritten after the snapshot, some removed
      const std::string name = "f" + std::to_string(i);
      auto a = must(fs->lookup(fs->root(), name));
      auto data = pattern(rng(), 4096 + rng() % (200 << 10));
      REQUIRE(must(fs->write(a.ino, 8192, data)) == data.size());
      auto& w = want[name];
      if (w.size() < 8192 + data.size()) w.resize(8192 + data.size());
      std::copy(data.begin(), data.end(), w.begin() + 8192);
    }
    must(fs->unlink(fs->root(), "f1"));
    want.erase("f1");
  }
  must(im.vol->commit());
  const uint64_t used = im.vol->space_stats().used_blocks, first = im.vol->super().first_block;
  const uint64_t target = first + used + 600;
  REQUIRE(target * 4096 < (96ull << 20) / 2);
  (void)must(im.vol->resize(target * 4096));
  CHECK(im.vol->space_stats().used_blocks == used);
  check_files(*im.vol, im.main, want);
  check_files(*im.vol, s1.frozen.tree, at_s1);
  im.reopen();
  REQUIRE(im.vol->total_blocks() == target);
  check_files(*im.vol, im.main, want);
  check_files(*im.vol, s1.frozen.tree, at_s1);
  close_and_check(im);
}

TEST_CASE("relocate: writers, readers and deleters go on while a shrink moves their files", "[fs][relocate]") {
  FsImage im(128ull << 20);
  std::mt19937_64 rng(21);
  auto fs = must(Filesystem::open(*im.vol, im.main));
  // Files spread over the first 100 MiB; most deleted, so that the rest
  // lie past where the image will end.
  std::map<std::string, std::vector<std::byte>> want;
  for (int i = 0; i < 50; i++) {
    const std::string name = "f" + std::to_string(i);
    auto a = must(fs->mknod(fs->root(), name, S_IFREG | 0644, 0, 0, 0));
    auto data = pattern(rng(), (1 << 20) + rng() % (1 << 20));
    REQUIRE(must(fs->write(a.ino, 0, data)) == data.size());
    want[name] = data;
  }
  for (int i = 0; i < 50; i++)
    if (i % 5 != 4) {
      must(fs->unlink(fs->root(), "f" + std::to_string(i)));
      want.erase("f" + std::to_string(i));
    }
  must(im.vol->commit());
  const uint64_t target = 48ull << 20;
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::mutex mu;  // guards `want` between the threads
  std::thread writer([&] {
    std::mt19937_64 r(5);
    for (int i = 0; !stop; i++) {
      const std::string name = "w" + std::to_string(i % 6);
      if (i % 7 == 6) {  // a deleter too
        if (fs->lookup(fs->root(), name)) {
          if (!fs->unlink(fs->root(), name)) errors++;
          std::lock_guard lk(mu);
          want.erase(name);
        }
        continue;
      }
      auto data = pattern(r(), 64 << 10);
      auto a = fs->lookup(fs->root(), name);
      const uint64_t ino = a ? a->ino : must(fs->mknod(fs->root(), name, S_IFREG | 0644, 0, 0, 0)).ino;
      auto w = fs->write(ino, 0, data);
      if (!w || *w != data.size()) errors++;
      std::lock_guard lk(mu);
      want[name] = data;
    }
  });
  std::thread reader([&] {
    while (!stop) {
      for (int i = 4; i < 50; i += 5) {
        const std::string name = "f" + std::to_string(i);
        std::vector<std::byte> expect;
        {
          std::lock_guard lk(mu);
          expect = want.at(name);
        }
        auto a = fs->lookup(fs->root(), name);
        std::vector<std::byte> got(expect.size());
        if (!a || !fs->read(a->ino, 0, got) || got != expect) errors++;
      }
    }
  });
  auto r = im.vol->resize(target);
  stop = true;
  writer.join();
  reader.join();
  if (!r) FAIL(r.error().message());
  CHECK(errors == 0);
  REQUIRE(im.vol->total_blocks() * 4096 == target);
  for (const auto& [name, data] : want) {
    INFO(name);
    auto a = must(fs->lookup(fs->root(), name));
    std::vector<std::byte> got(data.size());
    REQUIRE(must(fs->read(a.ino, 0, got)) == data.size());
    REQUIRE(got == data);
  }
  fs.reset();
  close_and_check(im);
}
