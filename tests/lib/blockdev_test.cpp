// lib/blockdev: the file device, and the test doubles the other tests rely on.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>

#include "test_util.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

struct TempFile {
  std::string path;
  explicit TempFile(uint64_t size) {
    char tmpl[] = "/tmp/plyfs-test-XXXXXX";
    int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(size)) == 0);
    close(fd);
    path = tmpl;
  }
  ~TempFile() { unlink(path.c_str()); }
};

std::vector<std::byte> pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<std::byte>(seed + i * 7);
  return v;
}

}  // namespace

TEST_CASE("file device: size, round trips, alignment and range errors", "[blockdev]") {
  TempFile f(1 << 20);
  auto dev = must(FileDevice::open(f.path));
  REQUIRE(dev->size_bytes() == 1 << 20);
  REQUIRE(dev->logical_sector_size() == 512);
  REQUIRE_FALSE(dev->is_block_device());
  auto data = pattern(8192, 3);
  must(dev->write(4096, data));
  std::vector<std::byte> back(8192);
  must(dev->read(4096, back));
  REQUIRE(back == data);
  must(dev->flush());

  std::vector<std::byte> sector(512);
  auto misaligned = dev->write(100, sector);
  REQUIRE_FALSE(misaligned);
  REQUIRE(misaligned.error().code == EINVAL);
  auto past = dev->read((1 << 20) - 512, std::span(back).first(1024));
  REQUIRE_FALSE(past);
  REQUIRE(past.error().code == EIO);

  // Discard punches a hole: the range reads as zeroes afterwards.
  must(dev->discard(4096, 4096));
  must(dev->read(4096, back));
  REQUIRE(std::all_of(back.begin(), back.begin() + 4096, [](std::byte b) { return b == std::byte{0}; }));
  REQUIRE(std::equal(back.begin() + 4096, back.end(), data.begin() + 4096));
}

TEST_CASE("file device: one writer at a time, with a clear error", "[blockdev]") {
  TempFile f(1 << 20);
  {
    auto rw = must(FileDevice::open(f.path));
    auto second = FileDevice::open(f.path);
    REQUIRE_FALSE(second);
    REQUIRE(second.error().code == EBUSY);
    REQUIRE(second.error().reason.find("in use") != std::string::npos);
    auto reader = FileDevice::open(f.path, FileOpenOptions{true, true});
    REQUIRE_FALSE(reader);  // a reader would see a filesystem changing under it
    REQUIRE(reader.error().code == EBUSY);
  }
  {
    auto r1 = must(FileDevice::open(f.path, FileOpenOptions{true, true}));
    auto r2 = must(FileDevice::open(f.path, FileOpenOptions{true, true}));  // readers share
    auto w = FileDevice::open(f.path);
    REQUIRE_FALSE(w);
    std::vector<std::byte> s(512);
    auto wr = r1->write(0, s);
    REQUIRE_FALSE(wr);
    REQUIRE(wr.error().code == EROFS);
  }
  must(FileDevice::open(f.path));  // free again once the others closed
}

TEST_CASE("file device: missing paths and wrong file types", "[blockdev]") {
  auto missing = FileDevice::open("/nonexistent/plyfs.img");
  REQUIRE_FALSE(missing);
  REQUIRE(missing.error().code == ENOENT);
  auto dir = FileDevice::open("/tmp");
  REQUIRE_FALSE(dir);
  REQUIRE(dir.error().code == EINVAL);
}

TEST_CASE("memory device: a power cut keeps flushed writes and any mix of unflushed sectors",
          "[blockdev]") {
  MemDevice dev(1 << 20);
  auto old_data = pattern(4096, 1), new_data = pattern(4096, 99);
  must(dev.write(0, old_data));
  dev.track_unflushed(true);
  must(dev.write(8192, old_data));
  must(dev.flush());  // durable
  std::set<std::vector<bool>> outcomes;
  for (int s = 0; s < 64; s++) {
    auto copy = dev.clone();
    copy->track_unflushed(true);
    must(copy->write(0, new_data));
    std::mt19937_64 rng(s);
    copy->crash(rng);
    auto got = copy->peek(0, 4096);
    std::vector<bool> which(8);
    for (int sec = 0; sec < 8; sec++) {
      bool is_old = std::equal(got.begin() + sec * 512, got.begin() + (sec + 1) * 512,
                               old_data.begin() + sec * 512);
      bool is_new = std::equal(got.begin() + sec * 512, got.begin() + (sec + 1) * 512,
                               new_data.begin() + sec * 512);
      REQUIRE((is_old || is_new));  // D1: a sector is old or new, never anything else
      which[sec] = is_new;
    }
    outcomes.insert(which);
    REQUIRE(copy->peek(8192, 4096) == old_data);  // flushed before: untouched
  }
  REQUIRE(outcomes.size() > 16);  // torn mixes do happen
}

TEST_CASE("memory device: several unflushed writes to one sector leave one of them", "[blockdev]") {
  for (int s = 0; s < 32; s++) {
    MemDevice dev(1 << 16);
    must(dev.write(0, pattern(512, 0)));
    dev.track_unflushed(true);
    must(dev.write(0, pattern(512, 1)));
    must(dev.write(0, pattern(512, 2)));
    must(dev.write(0, pattern(512, 3)));
    std::mt19937_64 rng(s);
    dev.crash(rng);
    auto got = dev.peek(0, 512);
    bool one_of = false;
    for (uint8_t p = 0; p < 4; p++) one_of |= got == pattern(512, p);
    REQUIRE(one_of);
  }
}

TEST_CASE("recording device: every call in order, with the bytes written", "[blockdev]") {
  MemDevice mem(1 << 20);
  RecordingDevice rec(mem);
  auto a = pattern(4096, 5);
  must(rec.write(4096, a));
  rec.mark("op-begin", 7);
  must(rec.flush());
  must(rec.discard(8192, 4096));
  auto log = rec.log();
  REQUIRE(log.size() == 4);
  REQUIRE(log[0].kind == RecordingDevice::Kind::Write);
  REQUIRE(log[0].offset == 4096);
  REQUIRE(*log[0].data == a);
  REQUIRE(log[1].kind == RecordingDevice::Kind::Mark);
  REQUIRE(log[1].label == "op-begin");
  REQUIRE(log[1].arg == 7);
  REQUIRE(log[2].kind == RecordingDevice::Kind::Flush);
  REQUIRE(log[3].kind == RecordingDevice::Kind::Discard);
  REQUIRE(mem.peek(4096, 4096) == a);  // forwarded
}

TEST_CASE("fault device: the Nth call fails once or from then on", "[blockdev]") {
  MemDevice mem(1 << 20);
  FaultDevice f(mem);
  auto d = pattern(4096, 9);
  f.add({FaultDevice::Op::Write, 3, false, FaultDevice::Kind::Eio, 0});
  REQUIRE(f.write(0, d));
  REQUIRE(f.write(0, d));
  auto third = f.write(8192, d);
  REQUIRE_FALSE(third);
  REQUIRE(third.error().code == EIO);
  REQUIRE(mem.peek(8192, 4096) != d);  // EIO: nothing written
  REQUIRE(f.write(0, d));              // once only
  REQUIRE(f.fired() == 1);

  f.clear();
  f.add({FaultDevice::Op::Flush, 2, true, FaultDevice::Kind::Eio, 0});
  REQUIRE(f.flush());
  REQUIRE_FALSE(f.flush());
  REQUIRE_FALSE(f.flush());  // sticky
  REQUIRE(f.write(0, d));    // other calls unaffected

  f.clear();
  f.add({FaultDevice::Op::Read, 1, false, FaultDevice::Kind::Eio, 0});
  std::vector<std::byte> buf(4096);
  REQUIRE_FALSE(f.read(0, buf));
  REQUIRE(f.read(0, buf));
}

TEST_CASE("fault device: short and torn writes land partly, then fail", "[blockdev]") {
  MemDevice mem(1 << 20);
  FaultDevice f(mem);
  auto d = pattern(4096, 42);
  f.add({FaultDevice::Op::Write, 1, false, FaultDevice::Kind::Short, 0});
  auto r = f.write(0, d);
  REQUIRE_FALSE(r);
  REQUIRE(r.error().code == ENOSPC);
  auto got = mem.peek(0, 4096);
  REQUIRE(std::equal(got.begin(), got.begin() + 2048, d.begin()));  // the first half landed
  REQUIRE(std::all_of(got.begin() + 2048, got.end(), [](std::byte b) { return b == std::byte{0}; }));

  int partial = 0;
  for (uint64_t seed = 1; seed < 20; seed++) {
    MemDevice m2(1 << 20);
    FaultDevice f2(m2);
    f2.add({FaultDevice::Op::Write, 1, false, FaultDevice::Kind::Torn, seed});
    REQUIRE_FALSE(f2.write(0, d));
    auto t = m2.peek(0, 4096);
    int landed = 0;
    for (int s = 0; s < 8; s++) {
      bool is_new = std::equal(t.begin() + s * 512, t.begin() + (s + 1) * 512, d.begin() + s * 512);
      bool is_zero = std::all_of(t.begin() + s * 512, t.begin() + (s + 1) * 512,
                                 [](std::byte b) { return b == std::byte{0}; });
      REQUIRE((is_new || is_zero));
      landed += is_new;
    }
    if (landed > 0 && landed < 8) partial++;
  }
  REQUIRE(partial > 10);
}
