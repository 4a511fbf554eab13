// lib/alloc: the allocation rule (A1, A2), references, reservations (A5),
// and a full filesystem.
#include "alloc/space.h"

#include <set>

#include "test_util.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

// A space manager on a fresh device, with its tree created and folded.
struct Space {
  MemDevice dev{64 << 20};
  BlockCache cache{dev, 4096, 64 << 20};
  std::unique_ptr<SpaceManager> sm;
  // The reserve mkfs would choose (usable / 64, at least 64). With 2048
  // blocks, a commit may record every usable block as a one-block extent.
  explicit Space(uint64_t total = 16384) {
    sm = SpaceManager::fresh(cache, 1,
                             SpaceGeometry{48, total, std::max<uint64_t>(64, (total - 48) / 64)});
    must(sm->create_tree(Generation{1}));
    must(sm->fold(Generation{1}));
    sm->durable(Generation{1});
  }
};

}  // namespace

TEST_CASE("space: a block freed in generation G is not handed out before G is durable (A2)",
          "[alloc]") {
  Space s(2048);
  must(s.sm->reserve(2, false));
  BlockNo a = must(s.sm->alloc(1, ExtentKind::Meta, true));
  BlockNo b = must(s.sm->alloc(1, ExtentKind::Meta, true));
  must(s.sm->fold(Generation{2}));
  s.sm->durable(Generation{2});  // a and b are now on "disk"

  // Generation 3 frees a: the durable generation 2 still reaches it.
  REQUIRE(must(s.sm->dec_ref(a, Generation{3})) == NodeSpace::Freed::Deferred);
  const auto st = s.sm->stats();
  REQUIRE(st.pending_free == 1);
  // Allocate everything that is free now, but the reserve the commit's own
  // fold needs (A5): a is never among it.
  std::set<uint64_t> got;
  for (uint64_t i = 0; i < st.free_blocks - st.reserve_blocks; i++) {
    BlockNo x = must(s.sm->alloc(1, ExtentKind::Meta, false));
    REQUIRE(x != a);
    REQUIRE(x != b);
    REQUIRE(got.insert(x.v).second);  // never the same block twice (A1)
  }
  REQUIRE_FALSE(s.sm->reserve(1, false));
  must(s.sm->fold(Generation{3}));
  s.sm->durable(Generation{3});
  // The fold itself freed and allocated space-tree nodes; a is among what
  // came back.
  bool a_back = false;
  for (;;) {
    auto x = s.sm->alloc(1, ExtentKind::Meta, false);
    if (!x) break;
    a_back |= *x == a;
  }
  REQUIRE(a_back);
}

TEST_CASE("space: an extent allocated and freed in the open generation returns at once (A2)",
          "[alloc]") {
  Space s;
  const uint64_t before = s.sm->stats().free_blocks;
  must(s.sm->reserve(8, false));
  BlockNo e = must(s.sm->alloc(8, ExtentKind::Data, true));
  REQUIRE(s.sm->stats().free_blocks == before - 8);
  REQUIRE(must(s.sm->refcount(e)) == 1);
  must(s.sm->inc_ref(e));
  REQUIRE(must(s.sm->dec_ref(e, Generation{2})) == NodeSpace::Freed::No);
  REQUIRE(must(s.sm->dec_ref(e, Generation{2})) == NodeSpace::Freed::Now);
  REQUIRE(s.sm->stats().free_blocks == before);
  REQUIRE(s.sm->stats().used_blocks == s.sm->counters().used_blocks);
}

TEST_CASE("space: references to free extents are corruption, not crashes", "[alloc]") {
  Space s;
  auto r = s.sm->dec_ref(BlockNo{5000}, Generation{2});
  REQUIRE_FALSE(r);
  REQUIRE(r.error().code == EUCLEAN);
  REQUIRE_FALSE(s.sm->inc_ref(BlockNo{5000}));
  must(s.sm->reserve(1, false));
  BlockNo e = must(s.sm->alloc(1, ExtentKind::Data, true));
  must(s.sm->fold(Generation{2}));
  s.sm->durable(Generation{2});
  REQUIRE(must(s.sm->dec_ref(e, Generation{3})) == NodeSpace::Freed::Deferred);
  auto twice = s.sm->dec_ref(e, Generation{3});
  REQUIRE_FALSE(twice);
  REQUIRE(twice.error().reason == "extent freed twice");
}

TEST_CASE("space: reservations keep the reserve for deletions and commits (A5)", "[alloc]") {
  Space s;
  const auto st = s.sm->stats();
  const uint64_t avail = st.free_blocks - st.reserve_blocks;
  auto too_much = s.sm->reserve(avail + 1, false);
  REQUIRE_FALSE(too_much);
  REQUIRE(too_much.error().code == ENOSPC);
  must(s.sm->reserve(avail, false));
  REQUIRE_FALSE(s.sm->reserve(1, false));
  const uint64_t half = st.reserve_blocks - st.reserve_blocks / 2;
  must(s.sm->reserve(half, true));  // a deletion digs into half of it
  REQUIRE_FALSE(s.sm->reserve(1, true));
  s.sm->unreserve(avail + half);
  must(s.sm->reserve(avail, false));
}

TEST_CASE("space: a reopened space tree yields the same free map, built group by group",
          "[alloc]") {
  Space s;
  std::mt19937_64 rng(seed("space-reopen"));
  std::vector<BlockNo> live;
  for (int round = 0; round < 20; round++) {
    const Generation g{static_cast<uint64_t>(round) + 2};
    for (int i = 0; i < 150; i++) {
      uint64_t n = 1 + rng() % 16;
      must(s.sm->reserve(n, false));
      live.push_back(must(s.sm->alloc(n, ExtentKind::Data, true)));
    }
    for (int i = 0; i < 120 && !live.empty(); i++) {
      size_t k = rng() % live.size();
      (void)must(s.sm->dec_ref(live[k], g));
      live.erase(live.begin() + k);
    }
    must(s.sm->fold(g));
    s.sm->durable(g);
  }
  const auto st = s.sm->stats();
  SpaceManager again(s.cache, 1, s.sm->geometry(), s.sm->root(), s.sm->counters());
  REQUIRE(again.stats().free_blocks == st.free_blocks);
  // Everything the new manager hands out is free according to the first.
  std::set<uint64_t> in_use;
  must(s.sm->tree().scan(Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
    uint64_t n;
    std::memcpy(&n, v.data(), 8);
    for (uint64_t b = 0; b < n; b++) in_use.insert(k.hi + b);
    return true;
  }));
  uint64_t handed = 0;
  for (;;) {
    auto x = again.alloc(1, ExtentKind::Meta, false);
    if (!x) break;
    REQUIRE_FALSE(in_use.count(x->v));
    handed++;
  }
  REQUIRE(handed == st.free_blocks);
}

TEST_CASE("space: extents longer than a group are refused cleanly", "[alloc]") {
  Space s;
  auto r = s.sm->alloc(SpaceManager::kGroupBlocks + 1, ExtentKind::Data, false);
  REQUIRE_FALSE(r);
  REQUIRE(r.error().code == EINVAL);
}

TEST_CASE("full filesystem: ENOSPC is clean, deletions and commits still work", "[alloc]") {
  auto dev = fresh_device(4 << 20);  // 1024 blocks, 976 usable
  auto vol = must(Volume::open(*dev));
  TreeId t;
  {
    auto txn = must(vol->begin());
    t = must(txn.create_tree(kKindPlain));
  }
  must(vol->commit());
  Model model;
  std::vector<std::byte> big(900, std::byte{0x5a});
  uint64_t i = 0, enospc = 0;
  for (;; i++) {
    Result<void> r = ok();
    {
      auto txn = must(vol->begin());
      r = txn.put(t, Key{i, 0}, big);
    }
    if (r) {
      model[Key{i, 0}] = big;
      continue;
    }
    REQUIRE(r.error().code == ENOSPC);
    enospc++;
    // What the next commit frees may make room; when it does not, it is full.
    must(vol->commit());
    if (enospc == 3) break;
  }
  REQUIRE(i > 500);
  REQUIRE_FALSE(vol->failure());   // a refused operation does not fail the volume
  REQUIRE(dump(*vol, t) == model);  // and left nothing behind
  must(vol->commit());
  require_clean(*dev);

  // Data extents too: the allocation fails before anything changes.
  {
    auto txn = must(vol->begin());
    auto e = txn.alloc_extent(64);
    REQUIRE_FALSE(e);
    REQUIRE(e.error().code == ENOSPC);
  }
  REQUIRE_FALSE(vol->failure());

  // Deleting on the full filesystem works, one operation at a time: each
  // delete fits in the reserve, and when the space its predecessors freed is
  // still waiting for a commit, the commit runs and the delete is retried.
  uint64_t deleted = 0, retries = 0;
  for (auto it = model.begin(); it != model.end();) {
    if (deleted % 2 == 1) {
      ++it, ++deleted;
      continue;
    }
    Result<bool> r = false;
    {
      auto txn = must(vol->begin(Volume::TxnOptions{true, 0}));
      r = txn.erase(t, it->first);
    }
    if (!r) {
      REQUIRE(r.error().code == ENOSPC);
      REQUIRE(retries++ < deleted / 2 + 2);
      must(vol->commit());
      continue;
    }
    REQUIRE(*r);
    it = model.erase(it);
    deleted++;
  }
  REQUIRE_FALSE(vol->failure());
  must(vol->commit());
  must(vol->commit());
  // The space came back: new data fits again.
  {
    auto txn = must(vol->begin());
    for (uint64_t k = 0; k < 50; k++) {
      must(txn.put(t, Key{100000 + k, 0}, big));
      model[Key{100000 + k, 0}] = big;
    }
  }
  must(vol->close());
  require_clean(*dev);
  auto again = must(Volume::open(*dev));
  REQUIRE(dump(*again, t) == model);
}
