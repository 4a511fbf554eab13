// The block cache: filesystem blocks in memory, bounded, with LRU eviction of
// clean blocks and a dirty set that only a commit writes back.
//
// Invariants:
//   K1 a dirty block is never evicted and never written except by
//      write_back(), which the commit calls (format.md#commit).
//   K2 a block is handed to the layer above only after its verifier accepted
//      it; a block that fails verification is not cached.
//   K3 at most one cached copy of a block number is findable at a time
//      (create() replaces a stale clean copy of a reused block).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "blockdev/blockdev.h"
#include "util/types.h"

namespace plyfs {

struct CachedBlock {
  BlockNo blockno;
  Generation dirty_gen{0};  // 0: the block is clean (identical to the device)
  std::span<std::byte> bytes() { return {data.get(), size}; }
  std::span<const std::byte> bytes() const { return {data.get(), size}; }

  std::unique_ptr<std::byte[]> data;
  size_t size = 0;
};

struct CacheStats {
  uint64_t hits = 0, misses = 0, evictions = 0;
  uint64_t cached_blocks = 0, dirty_blocks = 0;
  uint64_t blocks_written = 0, write_calls = 0;
};

class BlockCache {
 public:
  using Ref = std::shared_ptr<CachedBlock>;
  // Checks a freshly read block (checksum, header); runs once per read. A
  // plain function and context, so that a cache hit allocates nothing.
  struct Verifier {
    Result<void> (*fn)(const void* ctx, BlockNo b, std::span<const std::byte> bytes) = nullptr;
    const void* ctx = nullptr;
  };

  BlockCache(BlockDevice& dev, uint32_t block_size, uint64_t capacity_bytes);

  Result<Ref> get(BlockNo b, const Verifier& verify);
  // A new block, zero-filled and dirty in generation g.
  Ref create(BlockNo b, Generation g);
  // Forget a block without writing it (it was freed before it was written).
  void discard(BlockNo b);
  // Drop a clean copy that nobody needs any more; dirty blocks stay.
  void drop_clean(BlockNo b);

  // Every dirty block, sorted by block number.
  std::vector<Ref> dirty_blocks() const;
  // Writes the blocks (sorted, as dirty_blocks() returns them), coalescing
  // runs of adjacent blocks into one device write. Does not flush.
  Result<void> write_back(const std::vector<Ref>& blocks);
  // After the generation that wrote them is durable: the blocks become clean
  // and evictable.
  void mark_clean(const std::vector<Ref>& blocks);

  uint64_t dirty_bytes() const;
  CacheStats stats() const;
  uint32_t block_size() const { return block_size_; }
  BlockDevice& device() { return dev_; }
  uint64_t block_offset(BlockNo b) const { return b.v * block_size_; }

 private:
  struct Entry {
    Ref ref;
    std::list<uint64_t>::iterator lru;
    bool in_lru = false;
  };
  void evict_locked();
  void erase_locked(uint64_t b);

  BlockDevice& dev_;
  const uint32_t block_size_;
  const uint64_t capacity_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> map_;
  std::list<uint64_t> lru_;  // clean blocks, most recently used first
  std::unordered_set<uint64_t> dirty_;
  CacheStats stats_;
};

}  // namespace plyfs
