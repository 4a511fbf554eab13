// lib/btree: the copy-on-write B+tree against a std::map model, and its edges.
#include "btree/btree.h"

#include "test_util.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

std::vector<std::byte> value_for(std::mt19937_64& rng, uint32_t max_len) {
  // Mostly small values, some at the maximum, so that leaves split by bytes.
  uint32_t len;
  uint32_t r = rng() % 100;
  if (r < 70) len = rng() % 24;
  else if (r < 95) len = rng() % 200;
  else len = max_len - static_cast<uint32_t>(rng() % 3);
  std::vector<std::byte> v(len);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

Key random_key(std::mt19937_64& rng, uint64_t space) {
  uint64_t x = rng() % space;
  return Key{x / 300, (x % 300) * 0x9e3779b97f4a7c15ull};
}

// An existing key near a random point, or a random one if the model is empty.
Key pick_existing(std::mt19937_64& rng, const Model& m, uint64_t space) {
  Key k = random_key(rng, space);
  auto it = m.lower_bound(k);
  if (it == m.end()) it = m.begin();
  return it == m.end() ? k : it->first;
}

void require_same(Volume& v, TreeId t, const Model& m) {
  Model got = dump(v, t);
  REQUIRE(got.size() == m.size());
  REQUIRE(got == m);
}

// The 1,000,000-operation model test of issue 2: inserts, updates, deletes,
// lookups and range scans against std::map, commits at random points with a
// full invariant check (T1-T6, A3, A4) after each, and reopens, clean or as
// a crash (the uncommitted tail must vanish).
void run_model(uint32_t block_size, uint64_t nops, const char* name) {
  const uint64_t s = seed(name);
  std::mt19937_64 rng(s);
  auto dev = fresh_device(512ull << 20, block_size);
  VolumeOptions vo;
  vo.cache_bytes = 4ull << 20;  // small: evictions and re-reads happen all the time
  auto vol = must(Volume::open(*dev, vo));
  TreeId t;
  {
    auto txn = must(vol->begin());
    t = must(txn.create_tree(kKindPlain));
  }
  must(vol->commit());
  const uint32_t max_len = BTree::max_value_len(block_size);
  const uint64_t space = 600000;
  Model model, committed = model;
  uint64_t next_commit = 1 + rng() % 40000;
  uint64_t commits = 0, reopens = 0, crashes = 0, scans = 0, auto_commits = 0;

  Generation durable = vol->durable_generation();
  for (uint64_t i = 0; i < nops; i++) {
    const uint32_t op = rng() % 100;
    auto txn = must(vol->begin());
    // begin() commits by itself when the generation's space changes reach
    // their budget: everything before this operation is durable then.
    if (vol->durable_generation() != durable) {
      durable = vol->durable_generation();
      committed = model;
      auto_commits++;
    }
    if (op < 40) {  // put: insert or replace
      Key k = (rng() % 4 == 0) ? pick_existing(rng, model, space) : random_key(rng, space);
      auto val = value_for(rng, max_len);
      must(txn.put(t, k, val));
      model[k] = val;
    } else if (op < 62) {  // erase, mostly of existing keys
      Key k = (rng() % 10 < 8) ? pick_existing(rng, model, space) : random_key(rng, space);
      bool erased = must(txn.erase(t, k));
      REQUIRE(erased == (model.erase(k) == 1));
    } else if (op < 86) {  // lookup
      Key k = (rng() % 2) ? pick_existing(rng, model, space) : random_key(rng, space);
      auto got = must(txn.get(t, k));
      auto it = model.find(k);
      REQUIRE(got.has_value() == (it != model.end()));
      if (got) REQUIRE(*got == it->second);
    } else if (op < 96) {  // range scan
      scans++;
      Key from = random_key(rng, space);
      Key to = random_key(rng, space);
      if (to < from) std::swap(from, to);
      size_t limit = 1 + rng() % 64;
      auto it = model.lower_bound(from);
      size_t n = 0;
      must(txn.scan(t, from, to, [&](Key k, std::span<const std::byte> v) {
        REQUIRE(it != model.end());
        REQUIRE(k == it->first);
        REQUIRE(std::equal(v.begin(), v.end(), it->second.begin(), it->second.end()));
        ++it;
        return ++n < limit;
      }));
      if (n < limit) REQUIRE((it == model.end() || to < it->first));
    } else {  // insert-only must not replace
      Key k = pick_existing(rng, model, space);
      auto val = value_for(rng, max_len);
      bool inserted = must(txn.insert(t, k, val));
      REQUIRE(inserted == !model.count(k));
      if (inserted) model[k] = val;
    }

    if (i + 1 == next_commit || i + 1 == nops) {
      next_commit = i + 2 + rng() % 40000;
      { auto drop = std::move(txn); }
      const uint32_t what = rng() % 10;
      if (what == 0) {  // crash: the work since the last commit vanishes
        vol.reset();
        crashes++;
        model = committed;
      } else {
        must(vol->commit());
        commits++;
        committed = model;
        durable = vol->durable_generation();
        require_clean(*dev);
        if (what < 3) {  // clean close and reopen
          must(vol->close());
          vol.reset();
          reopens++;
        }
      }
      if (!vol) {
        vol = must(Volume::open(*dev, vo));
        durable = vol->durable_generation();
        require_same(*vol, t, model);
      }
    }
  }
  require_same(*vol, t, model);
  must(vol->close());
  require_clean(*dev);
  std::printf("[%s] %llu ops, %llu commits (+%llu by the change budget), %llu reopens, "
              "%llu crashes, %llu scans, %zu keys\n",
              name, (unsigned long long)nops, (unsigned long long)commits,
              (unsigned long long)auto_commits,
              (unsigned long long)reopens, (unsigned long long)crashes, (unsigned long long)scans,
              model.size());
}

}  // namespace

TEST_CASE("1M random operations against std::map, 4 KiB nodes", "[btree][model][4k]") {
  run_model(4096, 1000000 * scale(), "btree-model-4k");
}

TEST_CASE("1M random operations against std::map, 16 KiB nodes", "[btree][model][16k]") {
  run_model(16384, 1000000 * scale(), "btree-model-16k");
}

TEST_CASE("empty tree, single keys, and the key extremes", "[btree]") {
  auto dev = fresh_device(64 << 20);
  auto vol = must(Volume::open(*dev));
  auto txn = must(vol->begin());
  TreeId t = must(txn.create_tree(kKindPlain));
  REQUIRE_FALSE(must(txn.get(t, Key{1, 1})).has_value());
  REQUIRE_FALSE(must(txn.erase(t, Key{1, 1})));
  size_t n = 0;
  must(txn.scan(t, Key::min(), Key::max(), [&](Key, auto) { return ++n, true; }));
  REQUIRE(n == 0);
  must(txn.put(t, Key::min(), bytes("lo")));
  must(txn.put(t, Key::max(), bytes("hi")));
  must(txn.put(t, Key{5, 5}, {}));  // empty values are values
  REQUIRE(*must(txn.get(t, Key::min())) == bytes("lo"));
  REQUIRE(*must(txn.get(t, Key::max())) == bytes("hi"));
  REQUIRE(must(txn.get(t, Key{5, 5}))->empty());
  REQUIRE(must(txn.erase(t, Key::min())));
  REQUIRE(must(txn.erase(t, Key::max())));
  REQUIRE(must(txn.erase(t, Key{5, 5})));
  REQUIRE_FALSE(must(txn.erase(t, Key{5, 5})));
}

TEST_CASE("values at the size limit and over it", "[btree]") {
  for (uint32_t bs : {4096u, 65536u}) {
    auto dev = fresh_device(64 << 20, bs);
    auto vol = must(Volume::open(*dev));
    const uint32_t max = BTree::max_value_len(bs);
    REQUIRE(max == (bs - 64) / 4 - 24);
    auto txn = must(vol->begin());
    TreeId t = must(txn.create_tree(kKindPlain));
    // Enough maximum-size values to force splits at every level.
    Model m;
    for (uint64_t i = 0; i < 300; i++) {
      std::vector<std::byte> v(max, static_cast<std::byte>(i));
      must(txn.put(t, Key{i * 7919 % 300, 0}, v));
      m[Key{i * 7919 % 300, 0}] = v;
    }
    std::vector<std::byte> big(max + 1);
    auto r = txn.put(t, Key{1000, 0}, big);
    REQUIRE_FALSE(r);
    REQUIRE(r.error().code == EINVAL);
    REQUIRE_FALSE(vol->failure());  // a refused change leaves the volume writable
    { auto d = std::move(txn); }
    require_same(*vol, t, m);
    must(vol->commit());
    require_clean(*dev);
  }
}

TEST_CASE("sequential inserts then deleting everything collapses the tree", "[btree]") {
  auto dev = fresh_device(128 << 20);
  auto vol = must(Volume::open(*dev));
  TreeId t;
  {
    auto txn = must(vol->begin());
    t = must(txn.create_tree(kKindPlain));
    for (uint64_t i = 0; i < 50000; i++) must(txn.put(t, Key{i, i}, bytes("value")));
    REQUIRE(must(txn.tree_info(t)).root.level >= 2);
  }
  must(vol->commit());
  require_clean(*dev);
  const uint64_t used_full = vol->space_stats().used_blocks;
  {
    auto txn = must(vol->begin(Volume::TxnOptions{true, 0}));
    // Delete in an order that empties leaves at both ends and the middle.
    for (uint64_t i = 0; i < 50000; i += 2) REQUIRE(must(txn.erase(t, Key{i, i})));
    for (uint64_t i = 49999; i < 50000; i -= 2) REQUIRE(must(txn.erase(t, Key{i, i})));
    auto info = must(txn.tree_info(t));
    REQUIRE(info.root.level == 0);
  }
  must(vol->commit());
  require_clean(*dev);
  must(vol->commit());
  REQUIRE(vol->space_stats().used_blocks < used_full / 10);
  REQUIRE(dump(*vol, t).empty());
}

TEST_CASE("a cursor walks every key in order across leaves", "[btree]") {
  auto dev = fresh_device(64 << 20);
  auto vol = must(Volume::open(*dev));
  auto txn = must(vol->begin());
  TreeId t = must(txn.create_tree(kKindPlain));
  for (uint64_t i = 0; i < 20000; i++) must(txn.put(t, Key{i % 97, i}, bytes(std::to_string(i))));
  // Every lower bound lands on the first key >= the probe.
  std::mt19937_64 rng(1);
  Model m = dump(*vol, t);
  REQUIRE(m.size() == 20000);
  for (int i = 0; i < 2000; i++) {
    Key probe{rng() % 100, rng() % 21000};
    auto it = m.lower_bound(probe);
    std::optional<Key> first;
    must(txn.scan(t, probe, Key::max(), [&](Key k, auto) { first = k; return false; }));
    REQUIRE(first.has_value() == (it != m.end()));
    if (first) REQUIRE(*first == it->first);
  }
}

TEST_CASE("a node that fails verification is an error, never a crash", "[btree]") {
  auto dev = fresh_device(64 << 20);
  TreeId t;
  {
    auto vol = must(Volume::open(*dev));
    auto txn = must(vol->begin());
    t = must(txn.create_tree(kKindPlain));
    for (uint64_t i = 0; i < 5000; i++) must(txn.put(t, Key{i, 0}, bytes("x")));
    { auto d = std::move(txn); }
    must(vol->close());
  }
  // Damage every leaf of the tree in turn: lookups through it fail with
  // EUCLEAN naming the block; other lookups still work.
  auto rep = must(verify_image(*dev));
  REQUIRE(rep.clean());
  std::vector<uint64_t> leaves;
  {
    auto vol = must(Volume::open(*dev));
    auto txn = must(vol->begin());
    auto info = must(txn.tree_info(t));
    REQUIRE(info.root.level >= 1);
  }
  // Flip a byte in the middle of each block of the filesystem area in turn,
  // and read the whole tree: every damaged node must be reported.
  const uint64_t first = 196608 / 4096;
  int damaged_reads = 0;
  for (uint64_t b = first; b < first + 64; b++) {
    auto copy = dev->clone();
    auto orig = copy->peek(b * 4096 + 2000, 1);
    std::byte flipped = orig[0] ^ std::byte{0x40};
    copy->poke(b * 4096 + 2000, std::span(&flipped, 1));
    auto vol = Volume::open(*copy);
    if (!vol) {
      REQUIRE(vol.error().code == EUCLEAN);  // a damaged root of the root/space tree
      continue;
    }
    auto txn = must((*vol)->begin());
    uint64_t n = 0;
    auto r = txn.scan(t, Key::min(), Key::max(), [&](Key, auto) { return ++n, true; });
    if (!r) {
      REQUIRE(r.error().code == EUCLEAN);
      REQUIRE(r.error().block == b);
      damaged_reads++;
    } else {
      REQUIRE(n == 5000);
    }
    auto vr = must(verify_image(*copy));
    // Flipping a byte of a block in use must be found by verify.
    if (!r) REQUIRE_FALSE(vr.clean());
  }
  REQUIRE(damaged_reads > 10);
}

// ------------------------------------------------------------------ clones

namespace {

constexpr uint8_t kKindExtents = 7;  // test kind: each value references one data extent

void extent_refs(Key, std::span<const std::byte> v, std::vector<ExtentRef>& out) {
  if (v.size() != 16) return;
  uint64_t start, len;
  std::memcpy(&start, v.data(), 8);
  std::memcpy(&len, v.data() + 8, 8);
  out.push_back(ExtentRef{BlockNo{start}, len});
}

std::vector<std::byte> extent_value(BlockNo start, uint64_t len) {
  std::vector<std::byte> v(16);
  std::memcpy(v.data(), &start.v, 8);
  std::memcpy(v.data() + 8, &len, 8);
  return v;
}
BlockNo value_extent(const std::vector<std::byte>& v) {
  uint64_t s;
  std::memcpy(&s, v.data(), 8);
  return BlockNo{s};
}

// Random changes to several trees that share nodes through clones, and, with
// data extents, leaf values that reference shared extents. Every tree must
// match its own model after every commit and reopen, reference counts must
// equal what a full walk finds (A3), and once every tree is dropped every
// block must be free again: no leak, no double free.
void run_clones(bool with_extents, uint64_t rounds, const char* name) {
  const uint64_t s = seed(name);
  std::mt19937_64 rng(s);
  auto dev = fresh_device(1ull << 30);
  VolumeOptions vo;
  vo.cache_bytes = 8 << 20;
  VerifyOptions vfo;
  if (with_extents) {
    vo.kinds[kKindExtents] = extent_refs;
    vfo.kinds[kKindExtents] = extent_refs;
  }
  const uint8_t kind = with_extents ? kKindExtents : kKindPlain;
  auto vol = must(Volume::open(*dev, vo));
  const uint64_t meta_after_mkfs = vol->space_stats().used_blocks;

  std::map<uint64_t, Model> trees;  // tree id -> model
  auto random_value = [&](Volume::Txn& txn) {
    if (!with_extents) return bytes(std::to_string(rng()));
    uint64_t len = 1 + rng() % 4;
    BlockNo e = must(txn.alloc_extent(len));
    return extent_value(e, len);
  };
  {
    auto txn = must(vol->begin());
    TreeId t = must(txn.create_tree(kind));
    Model& m = trees[t.v];
    for (uint64_t i = 0; i < 20000; i++) {
      Key k{rng() % 50000, 0};
      auto old = m.find(k);
      auto v = random_value(txn);
      must(txn.put(t, k, v));
      if (with_extents && old != m.end()) must(txn.dec_extent(value_extent(old->second)));
      m[k] = v;
    }
  }
  must(vol->commit());
  require_clean(*dev, vfo);

  uint64_t clones = 0, drops = 0, commits = 0;
  for (uint64_t r = 0; r < rounds; r++) {
    auto txn = must(vol->begin(Volume::TxnOptions{true, 0}));
    auto pick = [&] {
      auto it = trees.begin();
      std::advance(it, rng() % trees.size());
      return it;
    };
    const uint32_t what = rng() % 100;
    if (what < 8 && trees.size() < 12) {  // clone, often of a tree changed in this generation
      auto it = pick();
      TreeId c = must(txn.clone_tree(TreeId{it->first}));
      trees[c.v] = it->second;
      clones++;
    } else if (what < 12 && trees.size() > 1) {
      auto it = pick();
      must(txn.drop_tree(TreeId{it->first}));
      trees.erase(it);
      drops++;
    } else {
      auto it = pick();
      TreeId t{it->first};
      Model& m = it->second;
      for (int i = 0; i < 40; i++) {
        Key k{rng() % 50000, 0};
        auto old = m.find(k);
        if (rng() % 3 == 0) {
          REQUIRE(must(txn.erase(t, k)) == (old != m.end()));
          if (old != m.end()) {
            if (with_extents) must(txn.dec_extent(value_extent(old->second)));
            m.erase(old);
          }
        } else {
          auto v = random_value(txn);
          must(txn.put(t, k, v));
          // The tree owns one reference per value: the old one goes after
          // the tree change (the change may copy a shared leaf first).
          if (with_extents && old != m.end()) must(txn.dec_extent(value_extent(old->second)));
          m[k] = v;
        }
      }
    }
    { auto done = std::move(txn); }
    if (rng() % 25 == 0 || r + 1 == rounds) {
      must(vol->commit());
      commits++;
      require_clean(*dev, vfo);
      if (rng() % 4 == 0) {
        must(vol->close());
        vol = must(Volume::open(*dev, vo));
      }
      for (const auto& [id, m] : trees) require_same(*vol, TreeId{id}, m);
    }
  }
  // Drop everything: every block but those of the root and space trees
  // must come back.
  {
    auto txn = must(vol->begin(Volume::TxnOptions{true, 0}));
    for (const auto& [id, m] : trees) must(txn.drop_tree(TreeId{id}));
    REQUIRE(must(txn.list_trees()).empty());
  }
  must(vol->commit());
  auto rep = must(verify_image(*dev, vfo));
  INFO(rep.summary());
  REQUIRE(rep.clean());
  REQUIRE(rep.trees == 0);
  const auto st = vol->space_stats();
  REQUIRE(st.data_blocks == 0);
  REQUIRE(st.used_blocks == rep.nodes);  // only root- and space-tree nodes remain
  REQUIRE(st.used_blocks <= meta_after_mkfs + 4);
  std::printf("[%s] %llu rounds, %llu clones, %llu drops, %llu commits\n", name,
              (unsigned long long)rounds, (unsigned long long)clones, (unsigned long long)drops,
              (unsigned long long)commits);
}

}  // namespace

TEST_CASE("clones share nodes, diverge, and free everything when dropped", "[btree][clone]") {
  run_clones(false, 1500 * scale(), "clones");
}

TEST_CASE("clones whose leaves reference data extents keep exact extent counts",
          "[btree][clone]") {
  run_clones(true, 1500 * scale(), "clones-extents");
}

TEST_CASE("a clone is O(1): it writes nothing until one side changes", "[btree][clone]") {
  auto dev = fresh_device(256 << 20);
  auto vol = must(Volume::open(*dev));
  TreeId t;
  {
    auto txn = must(vol->begin());
    t = must(txn.create_tree(kKindPlain));
    for (uint64_t i = 0; i < 100000; i++) must(txn.put(t, Key{i, 0}, bytes("0123456789")));
  }
  must(vol->commit());
  const uint64_t used = vol->space_stats().used_blocks;
  const uint64_t written = vol->cache_stats().blocks_written;
  TreeId c;
  {
    auto txn = must(vol->begin());
    c = must(txn.clone_tree(t));
  }
  must(vol->commit());
  // The clone adds one root record (the root tree may shadow a node or two
  // and the space tree records the root's second reference), nothing that
  // grows with the tree's 100,000 keys.
  REQUIRE(vol->space_stats().used_blocks <= used + 2);
  REQUIRE(vol->cache_stats().blocks_written - written <= 8);
  require_clean(*dev);
  // One change to the clone copies one path, not the tree.
  {
    auto txn = must(vol->begin());
    must(txn.put(c, Key{5, 0}, bytes("changed")));
  }
  must(vol->commit());
  REQUIRE(vol->space_stats().used_blocks <= used + 8);
  REQUIRE(*must(must(vol->begin()).get(t, Key{5, 0})) == bytes("0123456789"));
  REQUIRE(*must(must(vol->begin()).get(c, Key{5, 0})) == bytes("changed"));
  require_clean(*dev);
}
