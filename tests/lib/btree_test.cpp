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

  uint64_t clones = 0, drops = 0, commits = 0, grafts = 0, shared_leaves = 0;
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
    } else if (what < 17 && trees.size() > 1) {
      // A graft: a key range of one tree copied into another, whose own
      // keys there are erased first. Ranges from 0 have no key below them
      // (every item copied); wide ones share many leaves.
      auto from = pick(), to = pick();
      if (from == to) continue;
      const uint64_t a = rng() % 4 == 0 ? 0 : rng() % 50000;
      const uint64_t b = a + rng() % (rng() % 2 ? 200 : 8000);
      Model& dm = to->second;
      for (auto it = dm.lower_bound(Key{a, 0}); it != dm.end() && it->first <= Key{b, ~0ull};) {
        REQUIRE(must(txn.erase(TreeId{to->first}, it->first)));
        if (with_extents) must(txn.dec_extent(value_extent(it->second)));
        it = dm.erase(it);
      }
      shared_leaves += must(txn.graft(TreeId{to->first}, TreeId{from->first}, Key{a, 0}, Key{b, ~0ull}));
      for (auto it = from->second.lower_bound(Key{a, 0});
           it != from->second.end() && it->first <= Key{b, ~0ull}; ++it)
        dm[it->first] = it->second;
      grafts++;
      // A graft into a range that is not empty changes nothing.
      if (!from->second.empty() && !dm.empty()) {
        const Key k = dm.begin()->first;
        auto r = txn.graft(TreeId{to->first}, TreeId{from->first}, k, k);
        REQUIRE(!r);
        REQUIRE(r.error().code == EEXIST);
      }
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
  std::printf("[%s] %llu rounds, %llu clones, %llu drops, %llu grafts (%llu leaves shared), %llu commits\n",
              name, (unsigned long long)rounds, (unsigned long long)clones, (unsigned long long)drops,
              (unsigned long long)grafts, (unsigned long long)shared_leaves, (unsigned long long)commits);
  // Grafts that shared nothing would not test the sharing.
  REQUIRE(shared_leaves > 0);
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

// ------------------------------------------------------------------ diff

namespace {

// One difference: the key, its value in a and in b (empty: absent there).
struct DiffEntry {
  Key key;
  std::optional<std::vector<std::byte>> a, b;
  bool operator==(const DiffEntry&) const = default;
};
using DiffList = std::vector<DiffEntry>;

// What a diff must report, from two full models.
DiffList naive_diff(const Model& a, const Model& b) {
  DiffList out;
  auto ia = a.begin(), ib = b.begin();
  while (ia != a.end() || ib != b.end()) {
    if (ib == b.end() || (ia != a.end() && ia->first < ib->first)) {
      out.push_back({ia->first, ia->second, std::nullopt});
      ++ia;
    } else if (ia == a.end() || ib->first < ia->first) {
      out.push_back({ib->first, std::nullopt, ib->second});
      ++ib;
    } else {
      if (ia->second != ib->second) out.push_back({ia->first, ia->second, ib->second});
      ++ia;
      ++ib;
    }
  }
  return out;
}

std::optional<std::vector<std::byte>> copy(std::optional<std::span<const std::byte>> v) {
  if (!v) return std::nullopt;
  return std::vector<std::byte>(v->begin(), v->end());
}

// Txn::diff's calls, stopping after `limit`.
DiffList run_diff(Volume& v, TreeId a, TreeId b, uint64_t* nodes_read = nullptr,
                  size_t limit = SIZE_MAX) {
  DiffList out;
  auto txn = must(v.begin());
  must(txn.diff(a, b,
                [&](Key k, auto va, auto vb) {
                  out.push_back({k, copy(va), copy(vb)});
                  return out.size() < limit;
                },
                nodes_read));
  return out;
}

// The list must equal the naive one: same keys, in the same (ascending)
// order, with the same values.
void require_diff(const DiffList& got, const DiffList& want) {
  auto [g, w] = std::mismatch(got.begin(), got.end(), want.begin(), want.end());
  if (g != got.end() || w != want.end()) {
    INFO("first mismatch at entry " << (g - got.begin()) << " of " << got.size() << " (want "
                                    << want.size() << ")");
    if (g != got.end()) INFO("got key (" << g->key.hi << ", " << g->key.lo << ")");
    if (w != want.end()) INFO("want key (" << w->key.hi << ", " << w->key.lo << ")");
    FAIL("diff differs from the model");
  }
}

std::vector<std::byte> diff_value(std::mt19937_64& rng) {
  // 16..80 bytes: about 40 items a leaf, so 20,000 keys make some 500 leaves.
  std::vector<std::byte> v(16 + rng() % 65);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

// `n` random keys in tree t and the model.
void fill_random(Volume::Txn& txn, std::mt19937_64& rng, TreeId t, Model& m, size_t n) {
  while (m.size() < n) {
    Key k = random_key(rng, 1000000);
    auto v = diff_value(rng);
    must(txn.put(t, k, v));
    m[k] = v;
  }
}

// Every node of t: a diff against an empty tree reads each once, and the
// empty tree's root.
uint64_t node_count(Volume& v, TreeId t, TreeId empty, const Model& m) {
  uint64_t n = 0;
  REQUIRE(run_diff(v, t, empty, &n).size() == m.size());
  return n - 1;
}

// Random changes to one side: new keys, overwrites (some with the same
// bytes, which copy a leaf but change no value) and erases.
void change(Volume::Txn& txn, std::mt19937_64& rng, TreeId t, Model& m) {
  const uint32_t op = rng() % 10;
  if (op < 4 || m.empty()) {
    fill_random(txn, rng, t, m, m.size() + 1);  // one new key
  } else if (op < 7) {
    Key k = pick_existing(rng, m, 1000000);
    auto v = rng() % 5 == 0 ? m[k] : diff_value(rng);
    must(txn.put(t, k, v));
    m[k] = v;
  } else {
    Key k = pick_existing(rng, m, 1000000);
    REQUIRE(must(txn.erase(t, k)));
    m.erase(k);
  }
}

}  // namespace

TEST_CASE("diff: a tree and its clone differ exactly where the model says", "[btree][clone][diff]") {
  std::mt19937_64 rng(seed("diff"));
  auto dev = fresh_device(512ull << 20);
  VolumeOptions vo;
  vo.cache_bytes = 4 << 20;  // smaller than two trees: diffs read from the device too
  auto vol = must(Volume::open(*dev, vo));
  TreeId base, empty;
  Model mbase;
  {
    auto txn = must(vol->begin());
    base = must(txn.create_tree(kKindPlain));
    empty = must(txn.create_tree(kKindPlain));
    fill_random(txn, rng, base, mbase, 20000);
  }
  must(vol->commit());

  for (int round = 0; round < 16; round++) {
    TreeId c;
    Model mc = mbase;
    {
      auto txn = must(vol->begin());
      c = must(txn.clone_tree(base));
    }
    if (rng() % 2) must(vol->commit());  // else the changes share the clone's generation
    // 0, a few, some, or heavy changes, to either side or both; or the clone
    // erased down to 30 keys (a tree lower than the base).
    const uint32_t mode = round < 5 ? round : rng() % 5;
    uint64_t nchanges = 0;
    const uint32_t sides = rng() % 3;  // 0: base only, 1: clone only, 2: both
    {
      auto txn = must(vol->begin(Volume::TxnOptions{true, 0}));
      if (mode == 4) {
        for (; mc.size() > 30; nchanges++) {
          if (rng() % 8 == 0) {
            change(txn, rng, c, mc);
            continue;
          }
          Key k = pick_existing(rng, mc, 1000000);
          REQUIRE(must(txn.erase(c, k)));
          mc.erase(k);
        }
      } else {
        nchanges = mode == 0 ? 0 : mode == 1 ? 1 + rng() % 10 : mode == 2 ? 10 + rng() % 300
                                                                           : 2000 + rng() % 20000;
        for (uint64_t i = 0; i < nchanges; i++) {
          const bool on_base = sides == 0 || (sides == 2 && rng() % 2);
          if (on_base) change(txn, rng, base, mbase);
          else change(txn, rng, c, mc);
        }
      }
    }
    if (rng() % 2) must(vol->commit());
    if (rng() % 6 == 0) {  // cold: every node comes from the device
      must(vol->close());
      vol = must(Volume::open(*dev, vo));
    }
    // The models are what the trees hold.
    require_same(*vol, base, mbase);
    require_same(*vol, c, mc);

    uint64_t ab = 0, ba = 0;
    const DiffList want = naive_diff(mbase, mc);
    require_diff(run_diff(*vol, base, c, &ab), want);
    require_diff(run_diff(*vol, c, base, &ba), naive_diff(mc, mbase));
    if (nchanges == 0) REQUIRE(ab == 0);  // the same root: nothing read
    if (mode == 1) {
      // A few changes: about the paths to them, far from the whole tree.
      const uint64_t total = node_count(*vol, base, empty, mbase);
      INFO("nodes read " << ab << " of " << total << " for " << nchanges << " changes");
      REQUIRE(ab * 10 < total);
    }
    // An early stop ends the walk at once, after a prefix of the list.
    if (!want.empty()) {
      const size_t limit = 1 + rng() % want.size();
      auto got = run_diff(*vol, base, c, nullptr, limit);
      require_diff(got, DiffList(want.begin(), want.begin() + limit));
    }
    std::printf("[diff] round %d: mode %u, %llu changes, %zu differences, levels %u/%u, "
                "nodes read %llu (base, clone) and %llu (clone, base)\n",
                round, mode, (unsigned long long)nchanges, want.size(),
                must(must(vol->begin()).tree_info(base)).root.level,
                must(must(vol->begin()).tree_info(c)).root.level, (unsigned long long)ab,
                (unsigned long long)ba);
    {
      auto txn = must(vol->begin(Volume::TxnOptions{true, 0}));
      if (rng() % 4 == 0) {  // the clone becomes the base
        must(txn.drop_tree(base));
        base = c;
        mbase = std::move(mc);
        // Keep the base about 20,000 keys large.
        while (mbase.size() < 20000) {
          Key k = random_key(rng, 1000000);
          auto v = diff_value(rng);
          must(txn.put(base, k, v));
          mbase[k] = v;
        }
      } else {
        must(txn.drop_tree(c));
      }
    }
  }
  must(vol->commit());
  require_clean(*dev);
}

TEST_CASE("diff: 10 changes among 20,000 keys read a small part of the trees",
          "[btree][clone][diff]") {
  std::mt19937_64 rng(seed("diff-few"));
  auto dev = fresh_device(256ull << 20);
  auto vol = must(Volume::open(*dev));
  TreeId a, b, empty;
  Model ma;
  {
    auto txn = must(vol->begin());
    a = must(txn.create_tree(kKindPlain));
    empty = must(txn.create_tree(kKindPlain));
    fill_random(txn, rng, a, ma, 20000);
  }
  must(vol->commit());
  {
    auto txn = must(vol->begin());
    b = must(txn.clone_tree(a));
  }
  must(vol->commit());
  Model mb = ma;
  {
    auto txn = must(vol->begin());
    for (int i = 0; i < 10; i++) {
      if (i % 2) change(txn, rng, a, ma);
      else change(txn, rng, b, mb);
    }
  }
  must(vol->commit());
  uint64_t nodes = 0;
  require_diff(run_diff(*vol, a, b, &nodes), naive_diff(ma, mb));
  const uint64_t ta = node_count(*vol, a, empty, ma), tb = node_count(*vol, b, empty, mb);
  std::printf("[diff-few] nodes read %llu; the trees have %llu and %llu nodes\n",
              (unsigned long long)nodes, (unsigned long long)ta, (unsigned long long)tb);
  // Each change costs its leaf and the inner nodes above it on both sides
  // (a leaf more where one split or merged): 10 changes in a tree of height 3
  // read some 30-40 of its 520 nodes.
  REQUIRE(nodes * 10 < ta);
}

TEST_CASE("diff: trees of different heights still meet at their shared subtrees",
          "[btree][clone][diff]") {
  auto dev = fresh_device(256ull << 20);
  auto vol = must(Volume::open(*dev));
  TreeId a, b, empty;
  Model ma;
  {
    auto txn = must(vol->begin());
    a = must(txn.create_tree(kKindPlain));
    empty = must(txn.create_tree(kKindPlain));
    for (uint64_t i = 0; i < 2000; i++) {
      must(txn.put(a, Key{i, 0}, bytes("v" + std::to_string(i))));
      ma[Key{i, 0}] = bytes("v" + std::to_string(i));
    }
    b = must(txn.clone_tree(a));
  }
  must(vol->commit());
  // Appending to b splits its root: b grows one level above a, and every leaf
  // of a but the last is still shared, now one level deeper in b.
  Model mb = ma;
  {
    auto txn = must(vol->begin());
    for (uint64_t i = 2000; i < 40000; i++) {
      must(txn.put(b, Key{i, 0}, bytes("w" + std::to_string(i))));
      mb[Key{i, 0}] = bytes("w" + std::to_string(i));
    }
  }
  must(vol->commit());
  const auto la = must(must(vol->begin()).tree_info(a)).root.level;
  const auto lb = must(must(vol->begin()).tree_info(b)).root.level;
  REQUIRE(lb > la);
  uint64_t nodes = 0;
  require_diff(run_diff(*vol, a, b, &nodes), naive_diff(ma, mb));
  require_diff(run_diff(*vol, b, a), naive_diff(mb, ma));
  const uint64_t ta = node_count(*vol, a, empty, ma), tb = node_count(*vol, b, empty, mb);
  std::printf("[diff-heights] levels %u/%u, nodes read %llu; the trees have %llu and %llu nodes\n",
              la, lb, (unsigned long long)nodes, (unsigned long long)ta, (unsigned long long)tb);
  // b's new nodes must be read (their keys are the differences); of a's, only
  // the root, the inner nodes and the last leaf, which the appends changed.
  REQUIRE(nodes <= (tb - ta) + 2 * la + 4);
}

TEST_CASE("diff: unrelated trees, empty trees, the same tree, early stops", "[btree][diff]") {
  auto dev = fresh_device(128ull << 20);
  auto vol = must(Volume::open(*dev));
  TreeId a, b, e1, e2;
  Model ma, mb;
  {
    auto txn = must(vol->begin());
    a = must(txn.create_tree(kKindPlain));
    b = must(txn.create_tree(kKindPlain));
    e1 = must(txn.create_tree(kKindPlain));
    e2 = must(txn.create_tree(kKindPlain));
    // Overlapping key ranges; some keys in both with equal values, built in
    // different orders so that the leaves split at different keys.
    for (uint64_t i = 0; i < 6000; i++) {
      Key k{i, 0};
      if (i % 3 != 0) ma[k] = bytes("value " + std::to_string(i));
      if (i % 4 != 0) mb[k] = bytes(i % 5 ? "value " + std::to_string(i) : "other");
    }
    for (const auto& [k, v] : ma) must(txn.put(a, k, v));
    for (auto it = mb.rbegin(); it != mb.rend(); ++it) must(txn.put(b, it->first, it->second));
  }
  must(vol->commit());
  const DiffList want = naive_diff(ma, mb);
  REQUIRE(want.size() > 1000);
  uint64_t nodes = 0;
  require_diff(run_diff(*vol, a, b, &nodes), want);
  require_diff(run_diff(*vol, b, a), naive_diff(mb, ma));
  // Nothing shared: every node of both is read, once.
  const uint64_t ta = node_count(*vol, a, e1, ma), tb = node_count(*vol, b, e1, mb);
  REQUIRE(nodes == ta + tb);

  // Empty against full, both ways; two empty trees; a tree and itself.
  require_diff(run_diff(*vol, e1, a), naive_diff(Model{}, ma));
  require_diff(run_diff(*vol, b, e1), naive_diff(mb, Model{}));
  REQUIRE(run_diff(*vol, e1, e2, &nodes).empty());
  REQUIRE(nodes == 2);
  REQUIRE(run_diff(*vol, a, a, &nodes).empty());
  REQUIRE(nodes == 0);

  // fn returning false stops the walk at once.
  for (size_t limit : {size_t{1}, size_t{2}, size_t{77}, want.size() - 1}) {
    auto got = run_diff(*vol, a, b, nullptr, limit);
    require_diff(got, DiffList(want.begin(), want.begin() + limit));
  }

  // A dropped or unknown tree is an error.
  {
    auto txn = must(vol->begin());
    must(txn.drop_tree(e2));
    auto r = txn.diff(a, e2, [](Key, auto, auto) { return true; });
    REQUIRE_FALSE(r);
    REQUIRE(r.error().code == ENOENT);
    r = txn.diff(TreeId{999999}, a, [](Key, auto, auto) { return true; });
    REQUIRE_FALSE(r);
    REQUIRE(r.error().code == ENOENT);
  }
}

TEST_CASE("a graft shares the leaves wholly inside its range and copies only the two ends",
          "[btree][clone]") {
  auto dev = fresh_device(256 << 20);
  auto vol = must(Volume::open(*dev));
  TreeId src, dst;
  Model ms, md;
  {
    auto txn = must(vol->begin());
    src = must(txn.create_tree(kKindPlain));
    dst = must(txn.create_tree(kKindPlain));
    // 100-byte values: about 30 items a leaf, so [20,000, 80,000) spans
    // at least 60,000 * 124 / 4032 = 1,845 leaves.
    for (uint64_t i = 0; i < 100000; i++) {
      auto v = bytes(std::string(100, char('a' + i % 26)));
      must(txn.put(src, Key{i, 0}, v));
      ms[Key{i, 0}] = v;
      if (i < 20000 || i >= 90000) {
        auto w = bytes("dst" + std::to_string(i));
        must(txn.put(dst, Key{i, 0}, w));
        md[Key{i, 0}] = w;
      }
    }
  }
  must(vol->commit());
  const uint64_t used = vol->space_stats().used_blocks;
  uint64_t shared = 0;
  {
    auto txn = must(vol->begin());
    shared = must(txn.graft(dst, src, Key{20000, 0}, Key{79999, ~0ull}));
  }
  for (uint64_t i = 20000; i < 80000; i++) md[Key{i, 0}] = ms[Key{i, 0}];
  must(vol->commit());
  INFO("shared " << shared << " leaves; " << vol->space_stats().used_blocks - used << " blocks more");
  REQUIRE(shared >= 1800);
  // What a graft writes: the two seams, the level-1 nodes the leaves went
  // into (about 2,000 children at 126 a node), the paths, the records. A
  // copy of the items would take more than 1,845 new leaves.
  REQUIRE(vol->space_stats().used_blocks <= used + 64);
  require_same(*vol, src, ms);
  require_same(*vol, dst, md);
  require_clean(*dev);
  // Both sides change the shared leaves apart (each copies what it changes).
  {
    auto txn = must(vol->begin());
    must(txn.put(src, Key{50000, 0}, bytes("src")));
    must(txn.put(dst, Key{50001, 0}, bytes("dst")));
    REQUIRE(must(txn.erase(dst, Key{20000, 0})));
  }
  ms[Key{50000, 0}] = bytes("src");
  md[Key{50001, 0}] = bytes("dst");
  md.erase(Key{20000, 0});
  must(vol->commit());
  require_same(*vol, src, ms);
  require_same(*vol, dst, md);
  require_clean(*dev);
  // Dropping the source leaves the graft whole.
  {
    auto txn = must(vol->begin());
    must(txn.drop_tree(src));
  }
  must(vol->commit());
  require_same(*vol, dst, md);
  require_clean(*dev);
}
