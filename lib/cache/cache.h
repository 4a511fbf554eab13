// The block cache: filesystem blocks in memory, bounded, with eviction of
// clean blocks and a dirty set that only a commit writes back.
//
// Invariants:
//   K1 a dirty block is never evicted and never written except by
//      write_back(), which the commit calls (format.md#commit).
//   K2 a block is handed to the layer above only after its verifier accepted
//      it; a block that fails verification is not cached.
//   K3 at most one cached copy of a block number is findable at a time
//      (create() replaces a stale clean copy of a reused block).
//
// A lookup is the hot path of every tree operation, so a cached block is one
// allocation (header, then its bytes on the next cache line) found through an
// open-addressing table, and references to it are counted in the block
// itself: a hit touches the table slot and the block, nothing else.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <vector>

#include "blockdev/blockdev.h"
#include "util/types.h"

namespace plyfs {

class BlockRef;
class BlockArena;

struct alignas(64) CachedBlock {
  BlockNo blockno;
  Generation dirty_gen{0};  // 0: the block is clean (identical to the device)
  uint32_t size = 0;

  std::span<std::byte> bytes() { return {data(), size}; }
  std::span<const std::byte> bytes() const { return {data(), size}; }
  std::byte* data() { return reinterpret_cast<std::byte*>(this + 1); }
  const std::byte* data() const { return reinterpret_cast<const std::byte*>(this + 1); }

 private:
  friend class BlockRef;
  friend class BlockCache;
  std::atomic<uint32_t> refs_{0};
  bool in_lru_ = false;
  BlockArena* arena_ = nullptr;  // where the block goes back when the last reference drops
  // The list the block is on: a clean block on the second-chance list, a
  // dirty one on the dirty list (never both: K1), so one pair of links.
  CachedBlock* prev_ = nullptr;
  CachedBlock* next_ = nullptr;
};

// A counted reference to a cached block; the block lives while any
// reference, or the cache itself, holds it.
class BlockRef {
 public:
  BlockRef() = default;
  explicit BlockRef(CachedBlock* p) : p_(p) { if (p_) p_->refs_.fetch_add(1, std::memory_order_relaxed); }
  BlockRef(const BlockRef& o) : BlockRef(o.p_) {}
  BlockRef(BlockRef&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  BlockRef& operator=(BlockRef o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~BlockRef() { release(); }

  CachedBlock* operator->() const { return p_; }
  CachedBlock& operator*() const { return *p_; }
  CachedBlock* get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  bool operator==(const BlockRef& o) const { return p_ == o.p_; }
  uint32_t use_count() const { return p_ ? p_->refs_.load(std::memory_order_acquire) : 0; }

 private:
  void release();
  CachedBlock* p_ = nullptr;
};

struct CacheStats {
  uint64_t hits = 0, misses = 0, evictions = 0;
  uint64_t cached_blocks = 0, dirty_blocks = 0;
  uint64_t blocks_written = 0, write_calls = 0;
};

class BlockCache {
 public:
  using Ref = BlockRef;
  // Checks a freshly read block (checksum, header); runs once per read. A
  // plain function and context, so that a cache hit allocates nothing.
  struct Verifier {
    Result<void> (*fn)(const void* ctx, BlockNo b, std::span<const std::byte> bytes) = nullptr;
    const void* ctx = nullptr;
  };

  BlockCache(BlockDevice& dev, uint32_t block_size, uint64_t capacity_bytes);
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  Result<Ref> get(BlockNo b, const Verifier& verify);

  // A read-only descent without reference counting: while a Pin lives, the
  // cache's shared lock is held, so no block can be evicted or replaced, and
  // find() returns cached blocks by plain pointer (nullptr on a miss: drop
  // the Pin and use get()). Keep a Pin short; never hold it across I/O.
  class Pin {
   public:
    explicit Pin(const BlockCache& c) : c_(c), lk_(c.mu_) {}
    const CachedBlock* find(BlockNo b) const;
   private:
    const BlockCache& c_;
    std::shared_lock<std::shared_mutex> lk_;
  };
  Pin pin() const { return Pin(*this); }
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
  friend class BlockRef;
  // Drops one reference; the last one frees the block.
  static void unref(CachedBlock* blk);
  // A table slot. Bit 0 of `ptr` is the block's CLOCK bit ("used since the
  // eviction scan last passed"): blocks are 64-byte aligned, and keeping the
  // bit here means a hit touches the slot's line and the block's data, not
  // its header. Readers set it under the shared lock, hence atomic.
  struct Slot {
    uint64_t key = 0;  // block number + 1; 0: empty
    std::atomic<uintptr_t> ptr{0};
    Slot() = default;
    Slot(const Slot& o) : key(o.key), ptr(o.ptr.load(std::memory_order_relaxed)) {}
    Slot& operator=(const Slot& o) {
      key = o.key;
      ptr.store(o.ptr.load(std::memory_order_relaxed), std::memory_order_relaxed);
      return *this;
    }
    CachedBlock* blk() const {
      return reinterpret_cast<CachedBlock*>(ptr.load(std::memory_order_relaxed) & ~uintptr_t{1});
    }
  };
  static constexpr uintptr_t kReferenced = 1;
  CachedBlock* new_block(BlockNo b) const;
  size_t slot_of(uint64_t b) const;
  // The slot holding block b, or the table's size.
  size_t index_locked(uint64_t b) const;
  // The block, marked referenced (a hit), or nullptr.
  CachedBlock* find_locked(uint64_t b) const;
  void insert_locked(CachedBlock* blk);
  void erase_locked(uint64_t b);
  void grow_locked();
  void lru_push_front_locked(CachedBlock* blk);
  void lru_unlink_locked(CachedBlock* blk);
  void dirty_push_locked(CachedBlock* blk);
  void dirty_unlink_locked(CachedBlock* blk);
  void evict_locked();

  BlockDevice& dev_;
  const uint32_t block_size_;
  const uint64_t capacity_bytes_;
  BlockArena* arena_;  // blocks come from chunks, not one allocation each
  // Hits take it shared, so that lookups on several threads run in parallel;
  // everything that changes the table or the list takes it exclusively.
  mutable std::shared_mutex mu_;
  std::vector<Slot> table_;  // open addressing, linear probing, power-of-two size
  size_t count_ = 0;
  // Clean blocks in second-chance (CLOCK) order: a hit only sets the slot's
  // referenced bit; eviction takes from the tail and gives a referenced block
  // one more round at the head.
  CachedBlock* lru_head_ = nullptr;
  CachedBlock* lru_tail_ = nullptr;
  // Every dirty block of the table, so that a commit finds them in time
  // proportional to their number, not to the cache's size.
  CachedBlock* dirty_head_ = nullptr;
  size_t dirty_count_ = 0;
  mutable std::atomic<uint64_t> hits_{0};
  CacheStats stats_;
};

}  // namespace plyfs
