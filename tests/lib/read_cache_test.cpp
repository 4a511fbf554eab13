// lib/blockdev/read_cache.h: the read cache an NBD device gets in the daemon.
// The reference is the device under it: every read through the cache must
// return what that device holds at that moment (C1), whatever was cached.
#include <atomic>
#include <condition_variable>
#include <thread>

#include <catch2/generators/catch_generators.hpp>

#include "blockdev/device_set.h"
#include "blockdev/read_cache.h"
#include "test_util.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

constexpr uint64_t kLine = ReadCacheDevice::kLine;

std::vector<std::byte> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng());
  return v;
}

// Reads through it finish reading the device, then wait at a gate the test
// opens: a fill that read old bytes before a write, and returns after it.
class GateDevice final : public BlockDevice {
 public:
  explicit GateDevice(BlockDevice& d) : d_(d) {}
  Result<void> read(uint64_t o, std::span<std::byte> out) override {
    auto r = d_.read(o, out);
    std::unique_lock lk(mu_);
    if (armed_) {
      armed_ = false;
      inside_ = true;
      cv_.notify_all();
      cv_.wait(lk, [&] { return open_; });
    }
    return r;
  }
  Result<void> write(uint64_t o, std::span<const std::byte> in) override { return d_.write(o, in); }
  Result<void> flush() override { return d_.flush(); }
  Result<void> discard(uint64_t o, uint64_t n) override { return d_.discard(o, n); }
  uint64_t size_bytes() const override { return d_.size_bytes(); }
  uint32_t logical_sector_size() const override { return d_.logical_sector_size(); }
  uint32_t physical_sector_size() const override { return d_.physical_sector_size(); }
  void arm() { std::lock_guard lk(mu_); armed_ = true, open_ = false, inside_ = false; }
  void wait_inside() { std::unique_lock lk(mu_); cv_.wait(lk, [&] { return inside_; }); }
  void open() { std::lock_guard lk(mu_); open_ = true; cv_.notify_all(); }

 private:
  BlockDevice& d_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, open_ = false, inside_ = false;
};

}  // namespace

TEST_CASE("read cache: random reads, writes, batches and discards read what the device holds",
          "[blockdev]") {
  std::mt19937_64 rng(test::seed("read cache model"));
  // Not a multiple of a line: the last line is short.
  const uint64_t size = 40 * kLine + 8 * 512;
  // Without C3's stream rule (every short miss fills lines: the most
  // caching there can be), and with it.
  const size_t streams = GENERATE(size_t{0}, ReadCacheDevice::kStreams);
  INFO("streams " << streams);
  MemDevice mem(size);
  FaultDevice counting(mem);  // no rules: counts the calls that reach the device
  ReadCacheDevice dev(std::make_unique<BorrowedDevice>(counting), 8 * kLine, streams);
  must(mem.write(0, random_bytes(rng, size)));
  auto sectors = [&](uint64_t max) { return 512 * (1 + rng() % (max / 512)); };
  for (int i = 0; i < 6000; i++) {
    const uint64_t len = rng() % 8 ? sectors(16384) : sectors(3 * ReadCacheDevice::kBypass / 2);
    const uint64_t off = 512 * (rng() % ((size - len) / 512 + 1));
    switch (rng() % 10) {
      case 0: case 1: must(dev.write(off, random_bytes(rng, len))); break;
      case 2: {
        auto a = random_bytes(rng, 512), b = random_bytes(rng, len);
        const uint64_t off2 = 512 * (rng() % ((size - 512) / 512));
        const WriteReq reqs[] = {{off, b}, {off2, a}};
        must(dev.write_batch(reqs));
        break;
      }
      case 3: must(dev.discard(off, len)); break;
      default: {
        std::vector<std::byte> got(len), want(len);
        must(dev.read(off, got));
        mem.peek_into(off, want);
        REQUIRE(got == want);
      }
    }
    REQUIRE(dev.stats().cached_bytes <= 8 * kLine);
  }
  const auto st = dev.stats();
  INFO("hits " << st.hits << " misses " << st.misses << " bypassed " << st.bypassed);
  // A working set of 40 lines in a cache of 8 still hits. (With the stream
  // rule nearly every read of 40 lines is near a recent one and passes by.)
  if (!streams) {
    REQUIRE(st.hits > 500);
    REQUIRE(st.misses > 500);
  }
  REQUIRE(st.bypassed > 0);
  // Every hit is a read the device did not see.
  REQUIRE(counting.calls(FaultDevice::Op::Read) == st.misses + st.bypassed);
}

TEST_CASE("read cache: small reads fill whole lines, long reads pass by, the oldest line goes",
          "[blockdev]") {
  // Lines 100 apart: no read is near another (C3's stream rule is below).
  constexpr uint64_t A = 100 * kLine, B = 200 * kLine, D = 400 * kLine;
  MemDevice mem(1024 * kLine);
  FaultDevice counting(mem);
  ReadCacheDevice dev(std::make_unique<BorrowedDevice>(counting), 2 * kLine);
  std::vector<std::byte> b4(4096), big(ReadCacheDevice::kBypass);
  auto reads = [&] { return counting.calls(FaultDevice::Op::Read); };
  must(dev.read(A + 8192, b4));
  REQUIRE(reads() == 1);
  must(dev.read(A, b4));  // C2: the same line, from the cache
  must(dev.read(A + kLine - 4096, b4));
  REQUIRE(reads() == 1);
  REQUIRE(dev.stats().cached_bytes == kLine);
  must(dev.read(D, big));  // C3: to the device, not kept
  must(dev.read(D, big));
  REQUIRE(reads() == 3);
  REQUIRE(dev.stats().cached_bytes == kLine);
  must(dev.read(B + kLine - 4096, std::span(big).first(8192)));  // lines B and B+1
  REQUIRE(reads() == 4);
  REQUIRE(dev.stats().cached_bytes == 2 * kLine);  // A went: it was the least recently used
  must(dev.read(B, b4));
  must(dev.read(B + kLine, b4));
  REQUIRE(reads() == 4);
  must(dev.read(A, b4));
  REQUIRE(reads() == 5);
  // Read again so soon, A is near a recent read (C3): passed by, not kept.
  must(dev.read(A + 4096, b4));
  REQUIRE(reads() == 6);
  // A long read of lines all cached is served from them.
  constexpr uint64_t E = 600 * kLine;
  must(dev.read(E, b4));
  REQUIRE(reads() == 7);
  must(dev.read(E, std::span(big).first(kLine)));
  REQUIRE(reads() == 7);
  // A misaligned or out-of-range read is refused before the cache looks.
  REQUIRE(dev.read(100, b4).error().code == EINVAL);
  REQUIRE(dev.read(1024 * kLine, b4).error().code == EIO);
  // No cache at all under one line.
  ReadCacheDevice none(std::make_unique<BorrowedDevice>(counting), kLine - 1);
  const uint64_t now = reads();
  must(none.read(0, b4));
  must(none.read(0, b4));
  REQUIRE(reads() == now + 2);
}

TEST_CASE("read cache: short reads near recent ones are a stream, passed by and not kept", "[blockdev]") {
  MemDevice mem(4096 * kLine);
  FaultDevice counting(mem);
  ReadCacheDevice dev(std::make_unique<BorrowedDevice>(counting), 64 * kLine);
  auto reads = [&] { return counting.calls(FaultDevice::Op::Read); };
  std::vector<std::byte> b(96 << 10);
  // A file read in 96 KiB pieces, in the order several threads might serve
  // the kernel's readahead: only the first piece fills lines.
  const uint64_t at = 1000 * kLine;
  for (uint64_t i : {0, 2, 1, 3, 5, 4, 6, 7}) must(dev.read(at + i * b.size(), b));
  REQUIRE(reads() == 8);
  REQUIRE(dev.stats().cached_bytes == 2 * kLine);  // the first piece's lines
  REQUIRE(dev.stats().bypassed == 7);
  // Far from every recent read: a fill again.
  must(dev.read(3000 * kLine, std::span(b).first(4096)));
  REQUIRE(dev.stats().cached_bytes == 3 * kLine);
  // Off (streams = 0): every short miss fills.
  ReadCacheDevice all(std::make_unique<BorrowedDevice>(counting), 64 * kLine, 0);
  for (uint64_t i = 0; i < 8; i++) must(all.read(at + i * b.size(), b));
  REQUIRE(all.stats().bypassed == 0);
  REQUIRE(all.stats().cached_bytes == 12 * kLine);
}

TEST_CASE("read cache: a fill that read the old bytes before a write is not kept", "[blockdev]") {
  MemDevice mem(16 * kLine);
  GateDevice gate(mem);
  ReadCacheDevice dev(std::make_unique<BorrowedDevice>(gate), 16 * kLine, 0);  // every short miss fills (no stream rule)
  const std::vector<std::byte> old_bytes(4096, std::byte{1}), new_bytes(4096, std::byte{2});
  must(mem.write(3 * kLine + 4096, old_bytes));
  gate.arm();
  std::vector<std::byte> first(4096);
  std::thread reader([&] { must(dev.read(3 * kLine, first)); });
  gate.wait_inside();  // the fill holds line 3's old bytes
  must(dev.write(3 * kLine + 4096, new_bytes));
  gate.open();
  reader.join();
  std::vector<std::byte> got(4096);
  must(dev.read(3 * kLine + 4096, got));
  REQUIRE(got == new_bytes);  // C1: not the fill's old copy
  REQUIRE(dev.stats().dropped == 1);
  // Cached, then written: the line is dropped, the next read sees the write.
  must(dev.read(3 * kLine + 4096, got));
  must(dev.write(3 * kLine + 4096, old_bytes));
  must(dev.read(3 * kLine + 4096, got));
  REQUIRE(got == old_bytes);
  // A discard drops it too (D7: zero or old, but not what the cache had).
  must(mem.write(3 * kLine, std::vector<std::byte>(kLine, std::byte{7})));
  must(dev.discard(3 * kLine, kLine));  // MemDevice: reads back zeroes... or the cache's 7s
  std::vector<std::byte> want(4096);
  mem.peek_into(3 * kLine, want);
  must(dev.read(3 * kLine, got));
  REQUIRE(got == want);
}

TEST_CASE("read cache: a failed fill keeps nothing, and the bytes asked for are read alone",
          "[blockdev]") {
  MemDevice mem(8 * kLine);
  const std::vector<std::byte> data(4096, std::byte{9});
  must(mem.write(4096, data));
  FaultDevice fault(mem);
  ReadCacheDevice dev(std::make_unique<BorrowedDevice>(fault), 8 * kLine, 0);  // every short miss fills (no stream rule)
  fault.add({.op = FaultDevice::Op::Read, .nth = 1});  // the line's fill fails, once
  std::vector<std::byte> got(4096);
  must(dev.read(4096, got));  // C5: read again, the 4 KiB alone
  REQUIRE(got == data);
  REQUIRE(fault.calls(FaultDevice::Op::Read) == 2);
  REQUIRE(dev.stats().cached_bytes == 0);
  must(dev.read(4096, got));  // a fill now
  must(dev.read(0, got));
  REQUIRE(fault.calls(FaultDevice::Op::Read) == 3);
  // A read that fails on its own still fails.
  fault.clear();
  fault.add({.op = FaultDevice::Op::Read, .nth = 1, .sticky = true});
  REQUIRE(!dev.read(2 * kLine, got));
  must(dev.read(4096, got));  // cached before the device went bad
  REQUIRE(got == data);
}

TEST_CASE("read cache: readers and writers at once read only bytes that were written", "[blockdev]") {
  // Each 4 KiB slot holds one value in every byte; a writer bumps it. A
  // reader must never see a slot mixed, nor a value older than one it saw
  // before in that slot (a stale line kept after a write would be).
  constexpr uint64_t kSlots = 64;
  MemDevice mem(kSlots * 4096);
  ReadCacheDevice dev(std::make_unique<BorrowedDevice>(mem), 2 * kLine, 0);  // every short miss fills (no stream rule)
  std::vector<std::atomic<uint8_t>> written(kSlots);
  std::atomic<bool> stop{false}, bad{false};
  const uint64_t seed = test::seed("read cache threads");
  std::thread writer([&] {
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 20000 && !bad; i++) {
      const uint64_t s = rng() % kSlots;
      const uint8_t v = uint8_t(written[s].load() + 1);
      if (v == 0) continue;  // 255 values per slot are enough
      (void)dev.write(s * 4096, std::vector<std::byte>(4096, std::byte{v}));
      written[s].store(v);
    }
    stop = true;
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; t++)
    readers.emplace_back([&, t] {
      std::mt19937_64 rng(seed + 1 + t);
      std::vector<uint8_t> seen(kSlots, 0);
      std::vector<std::byte> b(4096);
      while (!stop && !bad) {
        const uint64_t s = rng() % kSlots;
        const uint8_t floor = written[s].load();  // written before this read began
        if (!dev.read(s * 4096, b)) { bad = true; break; }
        const uint8_t v = uint8_t(b[0]);
        for (auto x : b)
          if (x != b[0]) bad = true;
        if (v < floor || v < seen[s]) bad = true;
        seen[s] = v;
      }
    });
  writer.join();
  for (auto& r : readers) r.join();
  REQUIRE(!bad);
  REQUIRE(dev.stats().hits > 0);
}

TEST_CASE("read cache: read_uncached reads the device, not the lines (a scrub's check)", "[blockdev]") {
  MemDevice mem(16 * kLine);
  must(mem.write(kLine, std::vector<std::byte>(4096, std::byte{1})));
  ReadCacheDevice cache(std::make_unique<BorrowedDevice>(mem), 16 * kLine, 0);
  BorrowedDevice above(cache);  // as a DeviceSet member's owner reads it
  std::vector<std::byte> got(4096);
  must(above.read(kLine, got));  // the line is cached now
  // The medium changes behind the cache's back (rot on the server's disk).
  const std::vector<std::byte> rot(4096, std::byte{2});
  mem.poke(kLine, rot);
  must(above.read(kLine, got));
  REQUIRE(got == std::vector<std::byte>(4096, std::byte{1}));  // the line
  must(above.read_uncached(kLine, got));
  REQUIRE(got == rot);  // the medium
  REQUIRE(cache.stats().misses == 1);
}

TEST_CASE("read cache: a device set forwards read_uncached to the member that holds the bytes", "[blockdev]") {
  // A volume of two devices whose second is on NBD: the set is what the
  // volume reads, and a scrub through it must reach the second's medium.
  MemDevice first(8 * kLine), second(8 * kLine);
  const std::vector<std::byte> ones(4096, std::byte{1}), rot(4096, std::byte{2});
  must(second.write(kLine, ones));
  must(first.write(kLine, ones));  // inside the mirrored area below
  auto cache_first = std::make_unique<ReadCacheDevice>(std::make_unique<BorrowedDevice>(first), 8 * kLine, 0);
  auto cache_second = std::make_unique<ReadCacheDevice>(std::make_unique<BorrowedDevice>(second), 8 * kLine, 0);
  std::vector<DeviceSet::Member> members;
  members.push_back({std::move(cache_first), 0, 8 * kLine, "first"});
  members.push_back({std::move(cache_second), 16 * kLine, 8 * kLine, "second"});
  auto set = must(DeviceSet::make(std::move(members), 2 * kLine));
  std::vector<std::byte> got(4096);
  for (uint64_t at : {kLine, 16 * kLine + kLine}) {  // the mirrored area, then the second member
    INFO(at);
    must(set->read(at, got));  // now cached
    (at < 2 * kLine ? first : second).poke(kLine, rot);
    must(set->read(at, got));
    REQUIRE(got == ones);  // the cached line
    must(set->read_uncached(at, got));
    REQUIRE(got == rot);  // the member's medium
  }
}

TEST_CASE("read cache: under memory pressure it gives lines back, and grows again when memory returns (C8)",
          "[blockdev]") {
  constexpr uint64_t G = 1ull << 30, M = 1ull << 20;
  using Mem = Memory;
  const Mem plenty{16 * G, 8 * G}, between{16 * G, 1536 * M}, short_{16 * G, 512 * M};
  // The rule: half of what it holds below total / 16, as it is in between,
  // and growth by its share of what lies past total / 8 above.
  CHECK(ReadCacheDevice::next_limit(2 * G, 2 * G, 512 * M, short_) == 256 * M);
  CHECK(ReadCacheDevice::next_limit(2 * G, 256 * M, 256 * M, short_) == 128 * M);
  CHECK(ReadCacheDevice::next_limit(2 * G, 2 * G, 0, short_) == 0);
  CHECK(ReadCacheDevice::next_limit(2 * G, 2 * G, kLine + 4096, short_) == 0);  // whole lines
  CHECK(ReadCacheDevice::next_limit(2 * G, 2 * G, 512 * M, between) == 2 * G);
  CHECK(ReadCacheDevice::next_limit(2 * G, 256 * M, 256 * M, between) == 256 * M);
  CHECK(ReadCacheDevice::next_limit(2 * G, 256 * M, 256 * M, {16 * G, 2 * G + 100 * M}) == 356 * M);
  CHECK(ReadCacheDevice::next_limit(2 * G, 256 * M, 256 * M, plenty) == 2 * G);  // at most the capacity
  CHECK(ReadCacheDevice::next_limit(8 * G, 256 * M, 256 * M, plenty, 4) == 256 * M + 1536 * M);  // a share
  CHECK(ReadCacheDevice::next_limit(8 * G, 4 * G, 256 * M, {16 * G, 2 * G + 100 * M}) == 4 * G);  // never lowered there
  CHECK(ReadCacheDevice::next_limit(2 * G, 4 * G, 0, Mem{}) == 2 * G);  // memory unknown: as it is
  CHECK(ReadCacheDevice::next_limit(2 * G, 4 * G, 0, between) == 2 * G);  // never past the capacity

  // set_limit: the least recently used lines go at once, the rest still hit.
  MemDevice mem(1024 * kLine);
  FaultDevice counting(mem);
  ReadCacheDevice dev(std::make_unique<BorrowedDevice>(counting), 8 * kLine);
  REQUIRE(dev.capacity() == 8 * kLine);
  REQUIRE(dev.limit() == 8 * kLine);
  std::vector<std::byte> b4(4096);
  auto reads = [&] { return counting.calls(FaultDevice::Op::Read); };
  for (uint64_t i = 0; i < 8; i++) must(dev.read(i * 100 * kLine, b4));  // far apart: no stream
  REQUIRE(dev.stats().cached_bytes == 8 * kLine);
  dev.set_limit(3 * kLine + 100);
  REQUIRE(dev.limit() == 3 * kLine);
  REQUIRE(dev.stats().cached_bytes == 3 * kLine);
  uint64_t now = reads();
  for (uint64_t i = 5; i < 8; i++) must(dev.read(i * 100 * kLine + 4096, b4));  // the newest three
  REQUIRE(reads() == now);
  // A new line pushes out the oldest kept one: still at most the limit.
  must(dev.read(900 * kLine, b4));
  REQUIRE(dev.stats().cached_bytes == 3 * kLine);
  // Limit 0: nothing kept, every read to the device, and still right.
  dev.set_limit(0);
  REQUIRE(dev.stats().cached_bytes == 0);
  now = reads();
  const std::vector<std::byte> ones(4096, std::byte{1});
  must(dev.write(300 * kLine, ones));
  must(dev.read(300 * kLine, b4));
  must(dev.read(300 * kLine, b4));
  REQUIRE(b4 == ones);
  REQUIRE(reads() == now + 2);
  REQUIRE(dev.stats().cached_bytes == 0);
  // Raised past the capacity: the capacity, and lines are kept again.
  dev.set_limit(100 * kLine);
  REQUIRE(dev.limit() == 8 * kLine);
  must(dev.read(1000 * kLine, b4));  // near no recent read
  REQUIRE(dev.stats().cached_bytes == kLine);
  // A fill in flight while the limit falls to 0, a write of its line, the
  // limit back up before the fill returns: the write still marks the fill
  // (C1 looks at the capacity, not the limit), which is not kept.
  GateDevice gate(mem);
  ReadCacheDevice raced(std::make_unique<BorrowedDevice>(gate), 8 * kLine, 0);
  const std::vector<std::byte> twos(4096, std::byte{2});
  gate.arm();
  std::vector<std::byte> first(4096);
  std::thread reader([&] { must(raced.read(700 * kLine, first)); });
  gate.wait_inside();
  raced.set_limit(0);
  must(raced.write(700 * kLine, twos));
  raced.set_limit(8 * kLine);
  gate.open();
  reader.join();
  must(raced.read(700 * kLine, b4));
  REQUIRE(b4 == twos);
  REQUIRE(raced.stats().dropped == 1);
}

TEST_CASE("read cache: every cache of the process found, none after it is gone (C8)", "[blockdev]") {
  const size_t before = ReadCacheDevice::count();
  MemDevice mem(16 * kLine);
  {
    ReadCacheDevice a(std::make_unique<BorrowedDevice>(mem), 4 * kLine);
    ReadCacheDevice b(std::make_unique<BorrowedDevice>(mem), 8 * kLine);
    REQUIRE(ReadCacheDevice::count() == before + 2);
    uint64_t seen = 0;
    ReadCacheDevice::for_each([&](ReadCacheDevice& c) {
      if (&c == &a || &c == &b) seen += c.capacity();
    });
    REQUIRE(seen == 12 * kLine);
  }
  REQUIRE(ReadCacheDevice::count() == before);
}
