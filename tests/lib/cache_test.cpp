// lib/cache: the memory bound, K1-K3, and write-back coalescing.
#include "cache/cache.h"

#include "test_util.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

int verify_calls = 0;
Result<void> count_verify(const void*, BlockNo, std::span<const std::byte>) {
  verify_calls++;
  return ok();
}
Result<void> reject_verify(const void*, BlockNo b, std::span<const std::byte>) {
  return Error::corrupt(b.v, "rejected");
}

}  // namespace

TEST_CASE("cache: clean blocks are evicted to stay under the bound", "[cache]") {
  MemDevice dev(16 << 20);
  BlockCache cache(dev, 4096, 16 * 4096);
  for (uint64_t b = 0; b < 200; b++) must(cache.get(BlockNo{b}, {}));
  auto st = cache.stats();
  REQUIRE(st.cached_blocks <= 16);
  REQUIRE(st.evictions >= 184);
  REQUIRE(st.misses == 200);
  must(cache.get(BlockNo{199}, {}));
  REQUIRE(cache.stats().hits == 1);
}

TEST_CASE("cache: dirty blocks and blocks in use are never evicted (K1)", "[cache]") {
  MemDevice dev(16 << 20);
  BlockCache cache(dev, 4096, 8 * 4096);
  std::vector<BlockCache::Ref> dirty;
  for (uint64_t b = 100; b < 132; b++) {
    auto r = cache.create(BlockNo{b}, Generation{5});
    r->bytes()[0] = static_cast<std::byte>(b);
    dirty.push_back(r);
  }
  auto held = must(cache.get(BlockNo{7}, {}));
  for (uint64_t b = 200; b < 400; b++) must(cache.get(BlockNo{b}, {}));
  for (uint64_t b = 100; b < 132; b++) {
    auto r = must(cache.get(BlockNo{b}, {}));
    REQUIRE(r == dirty[b - 100]);  // the same object: it was never dropped
    REQUIRE(r->bytes()[0] == static_cast<std::byte>(b));
  }
  REQUIRE(must(cache.get(BlockNo{7}, {})) == held);
  REQUIRE(cache.dirty_bytes() == 32 * 4096);
  REQUIRE(cache.dirty_blocks().size() == 32);
}

TEST_CASE("cache: verification runs once per read, and a rejected block is not cached (K2)",
          "[cache]") {
  MemDevice dev(1 << 20);
  BlockCache cache(dev, 4096, 64 * 4096);
  verify_calls = 0;
  BlockCache::Verifier v{count_verify, nullptr};
  must(cache.get(BlockNo{3}, v));
  must(cache.get(BlockNo{3}, v));
  REQUIRE(verify_calls == 1);
  BlockCache::Verifier bad{reject_verify, nullptr};
  auto r = cache.get(BlockNo{9}, bad);
  REQUIRE_FALSE(r);
  REQUIRE(r.error().code == EUCLEAN);
  REQUIRE(cache.stats().cached_blocks == 1);
  auto past_end = cache.get(BlockNo{1 << 20}, v);
  REQUIRE_FALSE(past_end);
}

TEST_CASE("cache: write-back coalesces adjacent blocks and writes the right bytes", "[cache]") {
  MemDevice dev(1 << 20);
  BlockCache cache(dev, 4096, 64 * 4096);
  for (uint64_t b : {10, 11, 12, 13, 30, 32, 33}) {
    auto r = cache.create(BlockNo{b}, Generation{1});
    std::memset(r->data(), static_cast<int>(b), 4096);
  }
  auto dirty = cache.dirty_blocks();
  REQUIRE(dirty.size() == 7);
  REQUIRE(std::is_sorted(dirty.begin(), dirty.end(),
                         [](auto& a, auto& b) { return a->blockno < b->blockno; }));
  must(cache.write_back(dirty));
  REQUIRE(cache.stats().write_calls == 3);  // 10-13, 30, 32-33
  for (uint64_t b : {10, 11, 12, 13, 30, 32, 33})
    REQUIRE(dev.peek(b * 4096 + 100, 1)[0] == static_cast<std::byte>(b));
  cache.mark_clean(dirty);
  REQUIRE(cache.dirty_bytes() == 0);
}

TEST_CASE("cache: creating a reused block number replaces a stale copy (K3)", "[cache]") {
  MemDevice dev(1 << 20);
  BlockCache cache(dev, 4096, 64 * 4096);
  auto old = must(cache.get(BlockNo{5}, {}));
  auto fresh = cache.create(BlockNo{5}, Generation{2});
  REQUIRE(fresh != old);
  REQUIRE(must(cache.get(BlockNo{5}, {})) == fresh);
  cache.discard(BlockNo{5});
  REQUIRE(cache.dirty_bytes() == 0);
}

// The dirty list (cache.h): whatever mix of creates, re-creates of a number,
// discards, reads, evictions and commits' mark_clean, dirty_blocks() is
// exactly the set of block numbers created and neither discarded nor
// cleaned since, sorted, and dirty_bytes() agrees. A model set is the
// reference.
TEST_CASE("cache: dirty_blocks is exactly the created blocks not yet clean, in order", "[cache]") {
  std::mt19937_64 rng(seed("cache dirty list"));
  MemDevice dev(16 << 20);
  BlockCache cache(dev, 4096, 24 * 4096);  // small: reads evict all the time
  std::map<uint64_t, BlockCache::Ref> model;  // dirty block number -> its copy
  uint64_t gen = 1;
  for (int step = 0; step < 20000; step++) {
    const uint64_t b = rng() % 200;
    switch (rng() % 6) {
      case 0:
      case 1:
        model[b] = cache.create(BlockNo{b}, Generation{gen});
        break;
      case 2:
        cache.discard(BlockNo{b});
        model.erase(b);
        break;
      case 3:
        if (!model.count(b)) must(cache.get(BlockNo{b}, {}));  // a read of a clean block
        else REQUIRE(must(cache.get(BlockNo{b}, {})) == model[b]);
        break;
      case 4: {  // a commit: some of the dirty blocks written and cleaned
        auto d = cache.dirty_blocks();
        std::vector<BlockCache::Ref> half;
        for (size_t i = 0; i < d.size(); i++)
          if (rng() % 2) half.push_back(d[i]), model.erase(d[i]->blockno.v);
        cache.mark_clean(half);
        gen++;
        break;
      }
      default: {
        auto d = cache.dirty_blocks();
        REQUIRE(d.size() == model.size());
        size_t i = 0;
        for (const auto& [no, ref] : model) {
          REQUIRE(d[i]->blockno.v == no);
          REQUIRE(d[i] == ref);
          i++;
        }
        REQUIRE(cache.dirty_bytes() == model.size() * 4096);
      }
    }
  }
}
