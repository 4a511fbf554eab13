#include "blockdev/read_cache.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace plyfs {

namespace {
// C8: every cache of the process, for the daemon's memory watch.
std::mutex registry_mu;
std::vector<ReadCacheDevice*>& registry() {
  static std::vector<ReadCacheDevice*> r;
  return r;
}
}  // namespace

ReadCacheDevice::ReadCacheDevice(std::unique_ptr<BlockDevice> inner, uint64_t capacity_bytes, size_t streams)
    : inner_(std::move(inner)),
      capacity_lines_(capacity_bytes / kLine),
      limit_lines_(capacity_lines_),
      streams_(std::min(streams, kStreams)) {
  std::lock_guard lk(registry_mu);
  registry().push_back(this);
}

ReadCacheDevice::~ReadCacheDevice() {
  std::lock_guard lk(registry_mu);
  std::erase(registry(), this);
}

void ReadCacheDevice::for_each(const std::function<void(ReadCacheDevice&)>& fn) {
  std::lock_guard lk(registry_mu);
  for (ReadCacheDevice* c : registry()) fn(*c);
}

size_t ReadCacheDevice::count() {
  std::lock_guard lk(registry_mu);
  return registry().size();
}

uint64_t ReadCacheDevice::next_limit(uint64_t capacity, uint64_t limit, uint64_t cached, Memory m, size_t caches) {
  capacity = capacity / kLine * kLine;
  limit = std::min(limit, capacity);
  if (m.total == 0) return limit;  // nothing known: as it is
  const uint64_t low = m.total / kLowMemory, high = m.total / kHighMemory;
  if (m.available < low) return std::min(limit, cached / 2 / kLine * kLine);
  if (m.available <= high) return limit;
  const uint64_t share = (m.available - high) / std::max<size_t>(caches, 1);
  const uint64_t grown = std::min(capacity, cached + share) / kLine * kLine;
  return std::max(limit, grown);
}

void ReadCacheDevice::set_limit(uint64_t bytes) {
  std::lock_guard lk(mu_);
  limit_lines_.store(std::min(capacity_lines_, bytes / kLine), std::memory_order_relaxed);
  evict_locked();
}

void ReadCacheDevice::evict_locked() {
  const uint64_t limit = limit_lines_.load(std::memory_order_relaxed);
  while (lru_.size() > limit) {  // C4, C8
    stats_.cached_bytes -= lru_.back().bytes.size();
    index_.erase(lru_.back().no);
    lru_.pop_back();
  }
}

bool ReadCacheDevice::all_cached_locked(uint64_t first, uint64_t last) const {
  for (uint64_t n = first; n <= last; n++)
    if (!index_.contains(n)) return false;
  return true;
}

Result<void> ReadCacheDevice::read(uint64_t offset, std::span<std::byte> out) {
  PLY_CHECK(check_range(*this, offset, out.size()));
  if (out.empty()) return ok();
  if (limit_lines_.load(std::memory_order_relaxed) == 0) return inner_->read(offset, out);  // C8: none kept
  const uint64_t len = out.size();
  const uint64_t first = offset / kLine, last = (offset + len - 1) / kLine;
  std::unique_lock lk(mu_);
  // C3: a read near a recent one continues a stream. Near, not right
  // after: a file's extents need not lie in a row, and the kernel's
  // readahead requests are served by several threads in any order.
  const bool stream = std::any_of(recent_.begin(), recent_.begin() + streams_, [&](const Span& r) {
    return first <= r.last + kNear && r.first <= last + kNear;
  });
  if (streams_) recent_[next_recent_++ % streams_] = Span{first, last};
  if (all_cached_locked(first, last)) {
    for (uint64_t n = first; n <= last; n++) {
      auto it = index_.at(n);
      const uint64_t lo = std::max(offset, n * kLine), hi = std::min(offset + len, n * kLine + it->bytes.size());
      std::memcpy(out.data() + (lo - offset), it->bytes.data() + (lo - n * kLine), hi - lo);
      lru_.splice(lru_.begin(), lru_, it);  // C4: most recently used
    }
    stats_.hits++;
    return ok();
  }
  if (len >= kBypass || stream || last - first + 1 > limit_lines_.load(std::memory_order_relaxed)) {  // C3
    stats_.bypassed++;
    lk.unlock();
    return inner_->read(offset, out);
  }
  // C2: the whole lines, read while other threads go on (C1 watches them).
  stats_.misses++;
  Fill fill{first, last};
  fills_.push_back(&fill);
  lk.unlock();
  const uint64_t start = first * kLine;
  const uint64_t end = std::min((last + 1) * kLine, size_bytes());
  std::vector<std::byte> buf(end - start);
  auto r = inner_->read(start, buf);
  lk.lock();
  std::erase(fills_, &fill);
  if (!r) {  // C5: the bytes asked for alone
    lk.unlock();
    return inner_->read(offset, out);
  }
  std::memcpy(out.data(), buf.data() + (offset - start), len);
  if (fill.stale) {  // C1: a write of these lines came meanwhile
    stats_.dropped++;
    return ok();
  }
  for (uint64_t n = first; n <= last; n++) {
    if (index_.contains(n)) continue;  // another fill's, as new as this one (C1)
    const uint64_t lo = n * kLine, hi = std::min(lo + kLine, end);
    lru_.push_front(Line{n, std::vector<std::byte>(buf.begin() + (lo - start), buf.begin() + (hi - start))});
    index_[n] = lru_.begin();
    stats_.cached_bytes += hi - lo;
  }
  evict_locked();
  return ok();
}

void ReadCacheDevice::invalidate(uint64_t offset, uint64_t len) {
  // The capacity, not the limit: a fill begun under a higher limit that
  // returns after it rose again must still learn of the write (C1).
  if (len == 0 || capacity_lines_ == 0) return;
  const uint64_t first = offset / kLine, last = (offset + len - 1) / kLine;
  std::lock_guard lk(mu_);
  for (Fill* f : fills_)
    if (f->first <= last && first <= f->last) f->stale = true;
  if (index_.empty()) return;
  for (uint64_t n = first; n <= last; n++) {
    auto it = index_.find(n);
    if (it == index_.end()) continue;
    stats_.cached_bytes -= it->second->bytes.size();
    lru_.erase(it->second);
    index_.erase(it);
  }
}

void ReadCacheDevice::drop_all() {
  std::lock_guard lk(mu_);
  for (Fill* f : fills_) f->stale = true;
  lru_.clear();
  index_.clear();
  stats_.cached_bytes = 0;
}

// C1: the inner device first, then the lines; whatever it answered (D5: a
// failed write leaves old or new bytes, so neither may be served from here).
Result<void> ReadCacheDevice::write(uint64_t offset, std::span<const std::byte> in) {
  auto r = inner_->write(offset, in);
  invalidate(offset, in.size());
  return r;
}

Result<void> ReadCacheDevice::write_batch(std::span<const WriteReq> reqs) {
  auto r = inner_->write_batch(reqs);
  for (const auto& q : reqs) invalidate(q.offset, q.data.size());
  return r;
}

Result<void> ReadCacheDevice::discard(uint64_t offset, uint64_t len) {
  auto r = inner_->discard(offset, len);
  invalidate(offset, len);  // D7: old or zero, not ours to say which
  return r;
}

Result<uint64_t> ReadCacheDevice::resize(uint64_t at_least) {
  auto r = inner_->resize(at_least);
  drop_all();  // C6
  return r;
}

Result<uint64_t> ReadCacheDevice::truncate(uint64_t bytes) {
  auto r = inner_->truncate(bytes);
  drop_all();
  return r;
}

ReadCacheDevice::Stats ReadCacheDevice::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

}  // namespace plyfs
