#include "cache/cache.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace plyfs {

// ---------------------------------------------------------------- BlockArena

// Cached blocks come from chunks of kChunk slots and go back to a free list:
// a cache miss costs no allocation once the cache has warmed up. The arena
// lives until the cache is gone and its last block is back, so a reference
// that outlives its cache stays valid.
class BlockArena {
 public:
  explicit BlockArena(size_t slot_bytes) : slot_(slot_bytes) {}
  void* take() {
    std::lock_guard lk(mu_);
    if (free_.empty()) {
      auto* chunk = static_cast<std::byte*>(
          ::operator new(slot_ * kChunk, std::align_val_t{alignof(CachedBlock)}));
      chunks_.push_back(chunk);
      for (size_t i = kChunk; i-- > 0;) free_.push_back(chunk + i * slot_);
    }
    void* p = free_.back();
    free_.pop_back();
    live_++;
    return p;
  }
  void give_back(void* p) {
    bool last;
    {
      std::lock_guard lk(mu_);
      free_.push_back(p);
      last = --live_ == 0 && orphaned_;
    }
    if (last) delete this;
  }
  // The cache is gone: free the arena now, or when its last block comes back.
  void orphan() {
    bool now;
    {
      std::lock_guard lk(mu_);
      orphaned_ = true;
      now = live_ == 0;
    }
    if (now) delete this;
  }
  ~BlockArena() {
    for (auto* c : chunks_) ::operator delete(c, std::align_val_t{alignof(CachedBlock)});
  }

 private:
  static constexpr size_t kChunk = 32;
  const size_t slot_;
  std::mutex mu_;
  std::vector<std::byte*> chunks_;
  std::vector<void*> free_;
  size_t live_ = 0;
  bool orphaned_ = false;
};

// ------------------------------------------------------------------ BlockRef

void BlockRef::release() {
  if (p_) BlockCache::unref(p_);
  p_ = nullptr;
}

// ---------------------------------------------------------------- BlockCache

BlockCache::BlockCache(BlockDevice& dev, uint32_t block_size, uint64_t capacity_bytes)
    : dev_(dev),
      block_size_(block_size),
      capacity_bytes_(capacity_bytes),
      arena_(new BlockArena(sizeof(CachedBlock) + block_size)),
      table_(1024) {}

void BlockCache::unref(CachedBlock* blk) {
  if (blk->refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    BlockArena* arena = blk->arena_;
    blk->~CachedBlock();
    arena->give_back(blk);
  }
}

BlockCache::~BlockCache() {
  for (Slot& s : table_)
    if (s.key) unref(s.blk());  // each slot holds one reference
  arena_->orphan();
}

CachedBlock* BlockCache::new_block(BlockNo b) const {
  auto* blk = new (arena_->take()) CachedBlock();
  blk->blockno = b;
  blk->size = block_size_;
  blk->arena_ = arena_;
  return blk;
}

size_t BlockCache::slot_of(uint64_t b) const {
  // Fibonacci hashing: neighbouring block numbers spread over the table.
  return static_cast<size_t>((b * 0x9e3779b97f4a7c15ull) >> 20) & (table_.size() - 1);
}

size_t BlockCache::index_locked(uint64_t b) const {
  const uint64_t key = b + 1;
  for (size_t i = slot_of(b);; i = (i + 1) & (table_.size() - 1)) {
    if (table_[i].key == key) return i;
    if (table_[i].key == 0) return table_.size();
  }
}

CachedBlock* BlockCache::find_locked(uint64_t b) const {
  const size_t i = index_locked(b);
  if (i == table_.size()) return nullptr;
  auto& ptr = const_cast<std::atomic<uintptr_t>&>(table_[i].ptr);
  uintptr_t p = ptr.load(std::memory_order_relaxed);
  // Store only when needed, so that hits on hot blocks do not dirty a line.
  if (!(p & kReferenced)) ptr.fetch_or(kReferenced, std::memory_order_relaxed);
  return reinterpret_cast<CachedBlock*>(p & ~kReferenced);
}

void BlockCache::grow_locked() {
  std::vector<Slot> old(table_.size() * 2);
  old.swap(table_);
  for (const Slot& s : old)
    if (s.key) {
      size_t i = slot_of(s.key - 1);
      while (table_[i].key) i = (i + 1) & (table_.size() - 1);
      table_[i] = s;
    }
}

// The table holds one reference to each block it finds.
void BlockCache::insert_locked(CachedBlock* blk) {
  if (2 * (count_ + 1) > table_.size()) grow_locked();
  size_t i = slot_of(blk->blockno.v);
  while (table_[i].key) i = (i + 1) & (table_.size() - 1);
  table_[i].key = blk->blockno.v + 1;
  table_[i].ptr.store(reinterpret_cast<uintptr_t>(blk) | kReferenced, std::memory_order_relaxed);
  blk->refs_.fetch_add(1, std::memory_order_relaxed);
  count_++;
}

void BlockCache::erase_locked(uint64_t b) {
  const size_t mask = table_.size() - 1;
  size_t i = slot_of(b);
  for (;; i = (i + 1) & mask) {
    if (table_[i].key == 0) return;
    if (table_[i].key == b + 1) break;
  }
  CachedBlock* blk = table_[i].blk();
  if (blk->in_lru_) lru_unlink_locked(blk);
  if (blk->dirty_gen.v) dirty_unlink_locked(blk);
  // Backward-shift deletion keeps every probe sequence unbroken.
  for (size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    if (table_[j].key == 0) break;
    const size_t home = slot_of(table_[j].key - 1);
    // Move j back into the hole at i if its home does not lie in (i, j].
    if (((j - home) & mask) >= ((j - i) & mask)) {
      table_[i] = table_[j];
      i = j;
    }
  }
  table_[i] = Slot{};
  count_--;
  unref(blk);
}

void BlockCache::lru_push_front_locked(CachedBlock* blk) {
  blk->prev_ = nullptr;
  blk->next_ = lru_head_;
  if (lru_head_) lru_head_->prev_ = blk;
  lru_head_ = blk;
  if (!lru_tail_) lru_tail_ = blk;
  blk->in_lru_ = true;
}

void BlockCache::lru_unlink_locked(CachedBlock* blk) {
  (blk->prev_ ? blk->prev_->next_ : lru_head_) = blk->next_;
  (blk->next_ ? blk->next_->prev_ : lru_tail_) = blk->prev_;
  blk->prev_ = blk->next_ = nullptr;
  blk->in_lru_ = false;
}

void BlockCache::dirty_push_locked(CachedBlock* blk) {
  blk->prev_ = nullptr;
  blk->next_ = dirty_head_;
  if (dirty_head_) dirty_head_->prev_ = blk;
  dirty_head_ = blk;
  dirty_count_++;
}

void BlockCache::dirty_unlink_locked(CachedBlock* blk) {
  (blk->prev_ ? blk->prev_->next_ : dirty_head_) = blk->next_;
  if (blk->next_) blk->next_->prev_ = blk->prev_;
  blk->prev_ = blk->next_ = nullptr;
  dirty_count_--;
}

const CachedBlock* BlockCache::Pin::find(BlockNo b) const {
  CachedBlock* blk = c_.find_locked(b.v);
  if (blk) c_.hits_.fetch_add(1, std::memory_order_relaxed);
  return blk;
}

Result<BlockCache::Ref> BlockCache::get(BlockNo b, const Verifier& verify) {
  {
    std::shared_lock lk(mu_);
    if (CachedBlock* blk = find_locked(b.v)) {
      hits_.fetch_add(1, std::memory_order_relaxed);
      return Ref(blk);
    }
  }
  // Read outside the lock so that misses on different blocks overlap.
  if (dev_.size_bytes() < block_size_ || b.v > dev_.size_bytes() / block_size_ - 1)
    return Error::corrupt(b.v, "block number is beyond the end of the device");
  Ref ref(new_block(b));
  PLY_CHECK(dev_.read(block_offset(b), ref->bytes()));
  if (verify.fn) PLY_CHECK(verify.fn(verify.ctx, b, ref->bytes()));

  std::lock_guard lk(mu_);
  stats_.misses++;
  if (CachedBlock* other = find_locked(b.v)) return Ref(other);  // read meanwhile
  insert_locked(ref.get());
  lru_push_front_locked(ref.get());
  evict_locked();
  return ref;
}

BlockCache::Ref BlockCache::create(BlockNo b, Generation g) {
  Ref ref(new_block(b));
  std::memset(ref->data(), 0, block_size_);
  ref->dirty_gen = g;
  std::lock_guard lk(mu_);
  erase_locked(b.v);  // K3: a stale clean copy of a reused block number
  insert_locked(ref.get());
  dirty_push_locked(ref.get());
  evict_locked();
  return ref;
}

void BlockCache::discard(BlockNo b) {
  std::lock_guard lk(mu_);
  erase_locked(b.v);
}

void BlockCache::drop_clean(BlockNo b) {
  std::lock_guard lk(mu_);
  CachedBlock* blk = find_locked(b.v);
  if (blk && blk->in_lru_) erase_locked(b.v);
}

void BlockCache::evict_locked() {
  // K1: only clean blocks are on the list. A block someone still holds is
  // skipped (it costs memory until released, never correctness).
  size_t budget = 64;
  CachedBlock* blk = lru_tail_;
  while (blk && count_ * uint64_t{block_size_} > capacity_bytes_ && budget-- > 0) {
    CachedBlock* prev = blk->prev_;
    auto& ptr = table_[index_locked(blk->blockno.v)].ptr;
    if (ptr.load(std::memory_order_relaxed) & kReferenced) {
      ptr.fetch_and(~kReferenced, std::memory_order_relaxed);  // second chance
      lru_unlink_locked(blk);
      lru_push_front_locked(blk);
    } else if (blk->refs_.load(std::memory_order_acquire) == 1) {
      erase_locked(blk->blockno.v);
      stats_.evictions++;
    }
    blk = prev;
  }
}

std::vector<BlockCache::Ref> BlockCache::dirty_blocks() const {
  std::shared_lock lk(mu_);
  std::vector<Ref> out;
  out.reserve(dirty_count_);
  for (CachedBlock* blk = dirty_head_; blk; blk = blk->next_) out.emplace_back(blk);
  std::sort(out.begin(), out.end(),
            [](const Ref& a, const Ref& b) { return a->blockno < b->blockno; });
  return out;
}

Result<void> BlockCache::write_back(const std::vector<Ref>& blocks) {
  // Runs of consecutive blocks, up to 1 MiB per device write (few calls,
  // bounded staging memory), handed to the device in batches of up to 64
  // runs (32 MiB of staging): a device that can have many writes in flight
  // (NBD) gets them together (BlockDevice::write_batch; D2 lets writes
  // before a flush land in any order).
  const size_t max_run = std::max<size_t>(1, (1u << 20) / block_size_);
  constexpr size_t kBatchRuns = 64;
  const size_t max_batch_bytes = size_t(32) << 20;
  std::vector<std::vector<std::byte>> staging;
  staging.reserve(kBatchRuns);
  std::vector<WriteReq> batch;
  size_t batch_bytes = 0;
  uint64_t calls = 0;
  auto flush_batch = [&]() -> Result<void> {
    if (batch.empty()) return ok();
    PLY_CHECK(dev_.write_batch(batch));
    calls += batch.size();
    batch.clear();
    staging.clear();
    batch_bytes = 0;
    return ok();
  };
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i + 1;
    while (j < blocks.size() && j - i < max_run &&
           blocks[j]->blockno.v == blocks[j - 1]->blockno.v + 1)
      j++;
    if (j - i == 1) {
      batch.push_back({block_offset(blocks[i]->blockno), blocks[i]->bytes()});
    } else {
      auto& st = staging.emplace_back((j - i) * block_size_);
      for (size_t k = i; k < j; k++)
        std::memcpy(st.data() + (k - i) * block_size_, blocks[k]->data(), block_size_);
      batch.push_back({block_offset(blocks[i]->blockno), st});
    }
    batch_bytes += (j - i) * block_size_;
    if (batch.size() >= kBatchRuns || batch_bytes >= max_batch_bytes) PLY_CHECK(flush_batch());
    i = j;
  }
  PLY_CHECK(flush_batch());
  std::lock_guard lk(mu_);
  stats_.blocks_written += blocks.size();
  stats_.write_calls += calls;
  return ok();
}

void BlockCache::mark_clean(const std::vector<Ref>& blocks) {
  std::lock_guard lk(mu_);
  for (const Ref& ref : blocks) {
    if (!ref->dirty_gen.v) continue;
    // The block may have been discarded (and left the dirty list) and its
    // number reused since.
    const bool cached = find_locked(ref->blockno.v) == ref.get();
    if (cached) dirty_unlink_locked(ref.get());
    ref->dirty_gen = Generation{0};
    if (cached && !ref->in_lru_) lru_push_front_locked(ref.get());
  }
  evict_locked();
}

uint64_t BlockCache::dirty_bytes() const {
  std::shared_lock lk(mu_);
  return dirty_count_ * uint64_t{block_size_};
}

CacheStats BlockCache::stats() const {
  std::shared_lock lk(mu_);
  CacheStats s = stats_;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.cached_blocks = count_;
  s.dirty_blocks = dirty_count_;
  return s;
}

}  // namespace plyfs
