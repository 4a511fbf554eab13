// A bounded cache of a device's bytes in this process, for a device that has
// no host page cache under it: an image on an NBD server (NbdDevice). A
// local image file has the host's page cache, so a FUSE read the kernel
// sends with O_DIRECT, or after its own cache dropped the page, costs the
// daemon a pread of memory; over NBD the same read costs a round trip
// through the server. This cache is that page cache's stand-in
// (format.md#device-nbd-cache), as librbd's cache is for Ceph
// RBD clients. It holds clean bytes only: writes go to the device as before
// and are never delayed or reordered by it, so the device contract (D1-D7)
// is the inner device's.
//
// Invariants:
//   C1 Coherent: once write(), write_batch() or discard() of a range has
//      returned, no read returns the bytes the range held before. The lines
//      it touches are dropped after the inner device took the request (which
//      then serves every later read of it: nbd_device.h N4), and a fill
//      that was reading one of them meanwhile is not kept.
//   C2 A miss of a read shorter than kBypass reads the whole aligned lines
//      (kLine) around it and keeps them (read-around), so that small random
//      reads of a working set that fits warm the cache a line at a time.
//   C3 A read of at least kBypass bytes, or one whose lines lie within
//      kNear lines of those of one of the last kStreams reads, unless every
//      line it touches is cached, goes to the device alone and is not kept:
//      a sequential transfer, which the kernel's page cache above FUSE holds
//      already, neither pays a copy into fresh memory nor pushes out the
//      small random reads' lines (scan resistance). A random read is near a
//      recent one by chance only (16 x 17 lines of a 1 GiB working set's
//      16,384: under 2 %), and then merely not kept.
//   C4 At most capacity bytes of lines, the least recently used dropped
//      first. A line's bytes are read once and then only copied out.
//   C5 A fill that fails (D6: a bad sector anywhere in the line) keeps
//      nothing; the read is then made of exactly the bytes asked for, so it
//      fails only if they do.
//   C6 resize() and truncate() drop every line (the last line's length
//      follows the size).
//   C7 read_uncached() reads the inner device and keeps nothing: a scrub
//      checks the medium, not what the cache read from it earlier.
//   C8 It gives memory back when the machine runs short, as the kernel's
//      page cache would: set_limit() lowers what it may keep below its
//      capacity (the least recently used lines go at once) and raises it
//      again up to the capacity. next_limit() is the rule the daemon applies
//      to every cache of the process once a second (for_each), from
//      util/memory.h's memory_now() (the machine's, or its cgroup's if
//      smaller): below kLowMemory of it available, half of what a cache holds goes;
//      above kHighMemory, it may grow by its share of what is available past
//      that mark; in between, its limit stays.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "blockdev/blockdev.h"
#include "util/memory.h"

namespace plyfs {

class ReadCacheDevice final : public BlockDevice {
 public:
  static constexpr uint64_t kLine = 64u << 10;     // C2
  static constexpr uint64_t kBypass = 256u << 10;  // C3
  static constexpr size_t kStreams = 16;            // C3
  static constexpr uint64_t kNear = 8;              // C3, in lines

  // capacity_bytes is rounded down to whole lines; under one line, nothing
  // is kept (every read goes to the device). streams: how many recent reads
  // C3 compares with (at most kStreams; 0: only the length counts).
  ReadCacheDevice(std::unique_ptr<BlockDevice> inner, uint64_t capacity_bytes, size_t streams = kStreams);
  ~ReadCacheDevice() override;
  ReadCacheDevice(const ReadCacheDevice&) = delete;
  ReadCacheDevice& operator=(const ReadCacheDevice&) = delete;

  Result<void> read(uint64_t offset, std::span<std::byte> out) override;
  // The inner device's bytes, not the lines (and nothing kept).
  Result<void> read_uncached(uint64_t offset, std::span<std::byte> out) override {
    return inner_->read_uncached(offset, out);
  }
  Result<void> write(uint64_t offset, std::span<const std::byte> in) override;
  Result<void> write_batch(std::span<const WriteReq> reqs) override;
  Result<void> flush() override { return inner_->flush(); }
  Result<void> discard(uint64_t offset, uint64_t len) override;
  uint64_t size_bytes() const override { return inner_->size_bytes(); }
  uint32_t logical_sector_size() const override { return inner_->logical_sector_size(); }
  uint32_t physical_sector_size() const override { return inner_->physical_sector_size(); }
  Result<uint64_t> resize(uint64_t at_least) override;
  Result<uint64_t> truncate(uint64_t bytes) override;
  DeviceSet* device_set() override { return inner_->device_set(); }
  std::string display_name() const override { return inner_->display_name(); }

  BlockDevice& inner() { return *inner_; }
  struct Stats {
    uint64_t hits = 0;       // reads served from lines alone
    uint64_t misses = 0;     // reads that filled lines (C2)
    uint64_t bypassed = 0;   // long or streaming reads sent to the device alone (C3)
    uint64_t dropped = 0;    // fills not kept: a write overlapped them (C1)
    uint64_t cached_bytes = 0;
  };
  Stats stats() const;

  // C8: keep at most `bytes` of lines from now on (whole lines, at most the
  // capacity); lines past it go now, the least recently used first.
  void set_limit(uint64_t bytes);
  uint64_t limit() const { return limit_lines_.load(std::memory_order_relaxed) * kLine; }
  uint64_t capacity() const { return capacity_lines_ * kLine; }

  static constexpr unsigned kLowMemory = 16;  // below total / 16 available: give back
  static constexpr unsigned kHighMemory = 8;  // above total / 8 available: may grow
  // The limit a cache of `capacity` that may keep `limit` and holds `cached`
  // bytes gets next, one of `caches` in the process.
  static uint64_t next_limit(uint64_t capacity, uint64_t limit, uint64_t cached, Memory m, size_t caches = 1);
  // Calls fn for every cache alive in this process (none is destroyed
  // meanwhile); how many there are.
  static void for_each(const std::function<void(ReadCacheDevice&)>& fn);
  static size_t count();

 private:
  struct Line {
    uint64_t no;
    std::vector<std::byte> bytes;  // kLine, or less for the device's last line
  };
  // A fill reading lines [first, last] from the device (C1).
  struct Fill {
    uint64_t first, last;
    bool stale = false;
  };
  // C1: drop the lines [offset, offset + len) touches; mark fills of them stale.
  void invalidate(uint64_t offset, uint64_t len);
  void drop_all();
  struct Span {
    uint64_t first, last;  // lines
  };
  static constexpr std::array<Span, kStreams> far_spans() {
    std::array<Span, kStreams> a{};
    a.fill(Span{~uint64_t{0} / 2, ~uint64_t{0} / 2});  // no read yet: near no line
    return a;
  }
  bool all_cached_locked(uint64_t first, uint64_t last) const;

  void evict_locked();

  std::unique_ptr<BlockDevice> inner_;
  const uint64_t capacity_lines_;
  // C8: what may be kept now, at most capacity_lines_; changed under mu_,
  // read without it by a read that need not take it (0: keep nothing).
  std::atomic<uint64_t> limit_lines_;
  const size_t streams_;
  mutable std::mutex mu_;  // guards what follows
  std::list<Line> lru_;    // the most recently used first
  std::unordered_map<uint64_t, std::list<Line>::iterator> index_;
  std::vector<Fill*> fills_;  // those reading now (a few: one per reading thread)
  std::array<Span, kStreams> recent_ = far_spans();  // the last reads' lines (C3)
  uint64_t next_recent_ = 0;
  Stats stats_;
};

}  // namespace plyfs
