#include "cache/cache.h"

#include <algorithm>
#include <cstring>

namespace plyfs {

BlockCache::BlockCache(BlockDevice& dev, uint32_t block_size, uint64_t capacity_bytes)
    : dev_(dev), block_size_(block_size), capacity_bytes_(capacity_bytes) {}

static BlockCache::Ref new_block(BlockNo b, uint32_t size) {
  auto ref = std::make_shared<CachedBlock>();
  ref->blockno = b;
  ref->size = size;
  ref->data.reset(new std::byte[size]);
  return ref;
}

Result<BlockCache::Ref> BlockCache::get(BlockNo b, const Verifier& verify) {
  {
    std::lock_guard lk(mu_);
    auto it = map_.find(b.v);
    if (it != map_.end()) {
      stats_.hits++;
      if (it->second.in_lru) lru_.splice(lru_.begin(), lru_, it->second.lru);
      return it->second.ref;
    }
    stats_.misses++;
  }
  // Read outside the lock so that misses on different blocks overlap.
  if (b.v > dev_.size_bytes() / block_size_ - 1 || dev_.size_bytes() < block_size_)
    return Error::corrupt(b.v, "block number is beyond the end of the device");
  Ref ref = new_block(b, block_size_);
  PLY_CHECK(dev_.read(block_offset(b), ref->bytes()));
  if (verify.fn) PLY_CHECK(verify.fn(verify.ctx, b, ref->bytes()));

  std::lock_guard lk(mu_);
  auto [it, inserted] = map_.try_emplace(b.v);
  if (!inserted) return it->second.ref;  // another thread read it meanwhile
  it->second.ref = ref;
  lru_.push_front(b.v);
  it->second.lru = lru_.begin();
  it->second.in_lru = true;
  evict_locked();
  return ref;
}

BlockCache::Ref BlockCache::create(BlockNo b, Generation g) {
  Ref ref = new_block(b, block_size_);
  std::memset(ref->data.get(), 0, block_size_);
  ref->dirty_gen = g;
  std::lock_guard lk(mu_);
  erase_locked(b.v);  // K3: a stale clean copy of a reused block number
  auto& e = map_[b.v];
  e.ref = ref;
  e.in_lru = false;
  dirty_.insert(b.v);
  evict_locked();
  return ref;
}

void BlockCache::erase_locked(uint64_t b) {
  auto it = map_.find(b);
  if (it == map_.end()) return;
  if (it->second.in_lru) lru_.erase(it->second.lru);
  dirty_.erase(b);
  map_.erase(it);
}

void BlockCache::discard(BlockNo b) {
  std::lock_guard lk(mu_);
  erase_locked(b.v);
}

void BlockCache::drop_clean(BlockNo b) {
  std::lock_guard lk(mu_);
  auto it = map_.find(b.v);
  if (it != map_.end() && it->second.in_lru) erase_locked(b.v);
}

void BlockCache::evict_locked() {
  // K1: only clean blocks are in the LRU list. A block someone still holds
  // is skipped (it costs memory until released, but never correctness).
  size_t budget = 64;
  auto it = lru_.end();
  while (map_.size() * uint64_t{block_size_} > capacity_bytes_ && it != lru_.begin() &&
         budget-- > 0) {
    --it;
    auto m = map_.find(*it);
    if (m->second.ref.use_count() == 1) {
      auto victim = it++;
      lru_.erase(victim);
      map_.erase(m);
      stats_.evictions++;
    }
  }
}

std::vector<BlockCache::Ref> BlockCache::dirty_blocks() const {
  std::lock_guard lk(mu_);
  std::vector<Ref> out;
  out.reserve(dirty_.size());
  for (uint64_t b : dirty_) out.push_back(map_.at(b).ref);
  std::sort(out.begin(), out.end(),
            [](const Ref& a, const Ref& b) { return a->blockno < b->blockno; });
  return out;
}

Result<void> BlockCache::write_back(const std::vector<Ref>& blocks) {
  // Up to 1 MiB per device write: few system calls, bounded staging memory.
  const size_t max_run = std::max<size_t>(1, (1u << 20) / block_size_);
  std::vector<std::byte> staging;
  uint64_t calls = 0;
  for (size_t i = 0; i < blocks.size();) {
    size_t j = i + 1;
    while (j < blocks.size() && j - i < max_run &&
           blocks[j]->blockno.v == blocks[j - 1]->blockno.v + 1)
      j++;
    if (j - i == 1) {
      PLY_CHECK(dev_.write(block_offset(blocks[i]->blockno), blocks[i]->bytes()));
    } else {
      staging.resize((j - i) * block_size_);
      for (size_t k = i; k < j; k++)
        std::memcpy(staging.data() + (k - i) * block_size_, blocks[k]->data.get(), block_size_);
      PLY_CHECK(dev_.write(block_offset(blocks[i]->blockno), staging));
    }
    calls++;
    i = j;
  }
  std::lock_guard lk(mu_);
  stats_.blocks_written += blocks.size();
  stats_.write_calls += calls;
  return ok();
}

void BlockCache::mark_clean(const std::vector<Ref>& blocks) {
  std::lock_guard lk(mu_);
  for (const Ref& ref : blocks) {
    ref->dirty_gen = Generation{0};
    auto it = map_.find(ref->blockno.v);
    // The block may have been discarded and its number reused since.
    if (it == map_.end() || it->second.ref != ref || it->second.in_lru) continue;
    dirty_.erase(ref->blockno.v);
    lru_.push_front(ref->blockno.v);
    it->second.lru = lru_.begin();
    it->second.in_lru = true;
  }
  evict_locked();
}

uint64_t BlockCache::dirty_bytes() const {
  std::lock_guard lk(mu_);
  return dirty_.size() * uint64_t{block_size_};
}

CacheStats BlockCache::stats() const {
  std::lock_guard lk(mu_);
  CacheStats s = stats_;
  s.cached_blocks = map_.size();
  s.dirty_blocks = dirty_.size();
  return s;
}

}  // namespace plyfs
