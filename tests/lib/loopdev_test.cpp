// lib/blockdev on real loop devices: sizes and sector sizes from the ioctls,
// O_EXCL against a second writer, and a whole volume round trip. Needs root
// and loop devices; exits 77 (skipped) without them and says why.
#include <catch2/catch_test_macros.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <chrono>
#include <random>
#include <string>
#include <thread>

#include "../page_cache.h"
#include "test_util.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

std::string sh(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[256];
  while (fgets(buf, sizeof buf, p)) out += buf;
  if (pclose(p) != 0) return "";
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

// A loop device over a sparse file, detached at the end.
struct Loop {
  std::string file, dev;
  Loop(uint64_t bytes, unsigned sector) {
    char tmpl[] = "/tmp/plyfs-loop-XXXXXX";
    int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(bytes)) == 0);
    close(fd);
    file = tmpl;
    dev = sh("losetup -f --show --sector-size " + std::to_string(sector) + " " + file);
    REQUIRE(!dev.empty());
  }
  ~Loop() {
    if (!dev.empty()) sh("losetup -d " + dev);
    unlink(file.c_str());
  }
};

}  // namespace

TEST_CASE("loop device: size and sector sizes come from the device", "[loop]") {
  for (unsigned sector : {512u, 4096u}) {
    Loop loop(64ull << 20, sector);
    auto dev = must(FileDevice::open(loop.dev));
    REQUIRE(dev->is_block_device());
    REQUIRE(dev->size_bytes() == 64ull << 20);
    REQUIRE(dev->logical_sector_size() == sector);
    REQUIRE(dev->physical_sector_size() >= sector);
    // Requests must be whole logical sectors.
    std::vector<std::byte> half(sector / 2);
    if (sector > 512) REQUIRE(dev->read(0, half).error().code == EINVAL);
  }
}

TEST_CASE("loop device: a second writer is kept out", "[loop]") {
  Loop loop(64ull << 20, 512);
  auto first = must(FileDevice::open(loop.dev));
  auto second = FileDevice::open(loop.dev);
  REQUIRE_FALSE(second);
  REQUIRE(second.error().code == EBUSY);
  auto reader = FileDevice::open(loop.dev, FileOpenOptions{true, true});
  REQUIRE_FALSE(reader);  // the writer's lock keeps a checker out, too
}

TEST_CASE("loop device: format, write, commit, reopen", "[loop]") {
  Loop loop(128ull << 20, 4096);
  TreeId t;
  {
    auto dev = must(FileDevice::open(loop.dev));
    FormatOptions fo;
    auto sb = must(Volume::format(*dev, fo));
    REQUIRE(sb.sector_size == 4096);
    auto vol = must(Volume::open(*dev));
    {
      auto txn = must(vol->begin());
      t = must(txn.create_tree(kKindPlain));
      for (uint64_t i = 0; i < 20000; i++) must(txn.put(t, Key{i, 0}, bytes("on a loop device")));
    }
    must(vol->close());
  }
  // Drop the page cache so that the reopen reads the device itself.
  sh("blockdev --flushbufs " + loop.dev);
  auto dev = must(FileDevice::open(loop.dev));
  require_clean(*dev);
  auto vol = must(Volume::open(*dev));
  REQUIRE(dump(*vol, t).size() == 20000);
}

// --- O_DIRECT and its write-back queue (blockdev.h F1-F5, format.md#device-direct)

namespace {

// A sparse file on the real disk (/var/tmp: a filesystem with O_DIRECT,
// where /tmp may be tmpfs), removed at the end.
struct DiskFile {
  std::string path;
  explicit DiskFile(uint64_t bytes, const char* dir = "/var/tmp") {
    std::string tmpl = std::string(dir) + "/plyfs-direct-XXXXXX";
    int fd = mkstemp(tmpl.data());
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, static_cast<off_t>(bytes)) == 0);
    close(fd);
    path = tmpl;
  }
  ~DiskFile() { unlink(path.c_str()); }
};

// What a descriptor of its own reads of the file, past every cache of the
// device under test.
std::vector<std::byte> read_whole(const std::string& path, uint64_t bytes) {
  std::vector<std::byte> out(bytes);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(pread(fd, out.data(), bytes, 0) == static_cast<ssize_t>(bytes));
  close(fd);
  return out;
}

}  // namespace

TEST_CASE("file device: buffered writes start the host's writeback as they go (F7)", "[loop][direct]") {
  DiskFile f(256ull << 20);
  auto dev = must(FileDevice::open(f.path));
  REQUIRE_FALSE(dev->is_direct());
  std::vector<std::byte> data(1 << 20, std::byte{0x3c});
  for (uint64_t i = 0; i < 96; i++) must(dev->write(i << 20, data));
  // 96 MiB written, not flushed: without F7 the host would keep them all
  // dirty for half a minute (dirty_expire_centisecs) or until the flush.
  long dirty = dirty_pages(f.path);
  if (dirty < 0) {
    std::printf("[F7] this kernel has no cachestat(2): the writeback itself is not checked\n");
  } else {
    // At most a quarter: what the last kicks found already under writeback
    // (the host skips such pages) and the 8 MiB after the last kick.
    for (int i = 0; i < 100 && dirty > 6144; i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      dirty = dirty_pages(f.path);
    }
    INFO(dirty << " pages dirty of the 96 MiB written");
    REQUIRE(dirty <= 6144);
  }
  must(dev->flush());
  std::vector<std::byte> back(1 << 20);
  must(dev->read(95ull << 20, back));
  REQUIRE(back == data);
}


TEST_CASE("direct file device: random writes and reads against a model, any buffer alignment", "[loop][direct]") {
  const uint64_t size = 8ull << 20;
  DiskFile f(size);
  std::vector<std::byte> model(size);
  std::mt19937_64 rng(plyfs::test::seed("direct"));
  {
    auto dev = must(FileDevice::open(f.path, FileOpenOptions{.direct = true}));
    REQUIRE(dev->is_direct());
    std::vector<std::byte> src(70 << 10), dst(70 << 10);
    uint64_t reads_right_after = 0, last_off = 0, last_len = 0;
    bool last_was_write = false;
    for (int op = 0; op < 3000; op++) {
      uint64_t len = 512 * (1 + rng() % 128);
      uint64_t off = 512 * (rng() % ((size - len) / 512 + 1));
      // Often right after the last write: a staged run grows (F6).
      if (last_len && rng() % 2 && last_off + last_len + len <= size) off = last_off + last_len;
      const size_t mem = rng() % 3 == 0 ? 0 : rng() % 64;  // misaligned buffers too
      switch (rng() % 8) {
        case 0: case 1: case 2: case 3: {
          for (uint64_t i = 0; i < len; i++) src[mem + i] = static_cast<std::byte>(rng());
          must(dev->write(off, std::span(src).subspan(mem, len)));
          std::memcpy(model.data() + off, src.data() + mem, len);
          last_was_write = true;
          last_off = off, last_len = len;
          break;
        }
        case 4: case 5: case 6: {
          // Right after a write, the bytes it wrote, still queued: F3 makes
          // the read wait for them.
          const uint64_t at = last_was_write ? last_off : off;
          if (last_was_write) len = last_len;
          must(dev->read(at, std::span(dst).subspan(mem, len)));
          REQUIRE(std::memcmp(dst.data() + mem, model.data() + at, len) == 0);
          reads_right_after += last_was_write;
          last_was_write = false;
          break;
        }
        default:
          must(dev->flush());
          last_was_write = false;
      }
    }
    REQUIRE(reads_right_after > 100);
    must(dev->flush());
    // Nothing went through the host's page cache: O_DIRECT (buffered, the
    // file would be resident wherever it was written).
    REQUIRE(resident_pages(f.path) < 8);
    // F2: the flush covered every write; another descriptor sees them all.
    REQUIRE(read_whole(f.path, size) == model);
  }
  auto again = must(FileDevice::open(f.path));
  std::vector<std::byte> all(size);
  must(again->read(0, all));
  REQUIRE(all == model);
}

TEST_CASE("direct file device: writes of bytes in a row reach the device as one (F6)", "[loop][direct]") {
  DiskFile f(16ull << 20);
  std::vector<std::byte> model(16ull << 20);
  std::mt19937_64 rng(plyfs::test::seed("direct-runs"));
  for (auto& b : model) b = static_cast<std::byte>(rng());
  auto dev = must(FileDevice::open(f.path, FileOpenOptions{.direct = true}));
  REQUIRE(dev->is_direct());
  // 512 writes of 4 KiB in a row: two runs of 1 MiB.
  for (uint64_t i = 0; i < 512; i++) must(dev->write(i * 4096, std::span(model).subspan(i * 4096, 4096)));
  // 32 writes 64 KiB apart, from 4 MiB: one each.
  for (uint64_t i = 0; i < 32; i++) {
    const uint64_t off = (4 << 20) + i * 65536;
    must(dev->write(off, std::span(model).subspan(off, 4096)));
  }
  must(dev->flush());
  REQUIRE(dev->direct_writes() == 2 + 32);
  // A read of a staged run's bytes sends it and sees them.
  must(dev->write(8 << 20, std::span(model).subspan(8 << 20, 8192)));
  std::vector<std::byte> back(8192);
  must(dev->read(8 << 20, back));
  REQUIRE(std::equal(back.begin(), back.end(), model.begin() + (8 << 20)));
  REQUIRE(dev->direct_writes() == 2 + 32 + 1);
  must(dev->flush());
  std::vector<std::byte> want(model.size());
  for (uint64_t i = 0; i < 512; i++) std::copy_n(model.begin() + i * 4096, 4096, want.begin() + i * 4096);
  for (uint64_t i = 0; i < 32; i++) {
    const uint64_t off = (4 << 20) + i * 65536;
    std::copy_n(model.begin() + off, 4096, want.begin() + off);
  }
  std::copy_n(model.begin() + (8 << 20), 8192, want.begin() + (8 << 20));
  REQUIRE(read_whole(f.path, model.size()) == want);
}

TEST_CASE("direct file device: writes are queued and a flush waits for them", "[loop][direct]") {
  const uint64_t size = 64ull << 20;
  DiskFile f(size);
  auto dev = must(FileDevice::open(f.path, FileOpenOptions{.direct = true}));
  REQUIRE(dev->is_direct());
  std::vector<std::byte> model(size);
  std::mt19937_64 rng(plyfs::test::seed("direct"));
  for (auto& b : model) b = static_cast<std::byte>(rng());
  // 48 MiB in 1 MiB writes: under kWriteBackBytes, so all queued at once.
  for (uint64_t off = 0; off < (48ull << 20); off += 1 << 20)
    must(dev->write(off, std::span(model).subspan(off, 1 << 20)));
  must(dev->flush());
  std::vector<std::byte> want(model.begin(), model.begin() + (48 << 20));
  want.resize(size);
  REQUIRE(read_whole(f.path, size) == want);
}

TEST_CASE("direct file device: a failed queued write fails the next flush and every later write",
          "[loop][direct]") {
  // A host filesystem that fills up under a sparse image: an ext4 of
  // 16 MiB on a loop device (tmpfs would not be opened O_DIRECT: it has no
  // page cache to bypass).
  char dir[] = "/tmp/plyfs-full-XXXXXX";
  REQUIRE(mkdtemp(dir));
  DiskFile host(16ull << 20);
  REQUIRE(sh("mkfs.ext4 -q -F " + host.path + " && mount -o loop " + host.path + " " + dir + " && echo ok") ==
          "ok");
  struct Unmount {
    const char* d;
    ~Unmount() {
      sh(std::string("umount ") + d);
      rmdir(d);
    }
  } um{dir};
  std::string img;
  {
    DiskFile f(32ull << 20, dir);
    img = f.path;
    auto dev = must(FileDevice::open(f.path, FileOpenOptions{.direct = true}));
    REQUIRE(dev->is_direct());
    std::vector<std::byte> first(512 << 10, std::byte{0x5a});
    must(dev->write(0, first));
    must(dev->flush());
    std::vector<std::byte> piece(256 << 10, std::byte{0x77});
    for (uint64_t off = 1 << 20; off < (16ull << 20); off += piece.size())
      (void)dev->write(off, piece);  // refused once a queued one failed
    auto fl = dev->flush();
    REQUIRE_FALSE(fl);
    REQUIRE(fl.error().code == ENOSPC);
    // D4: never a claim of durability after that, not even for bytes that
    // would fit (already allocated).
    auto w = dev->write(0, std::span(first).first(4096));
    REQUIRE_FALSE(w);
    REQUIRE_FALSE(dev->flush());
    // Reads go on.
    std::vector<std::byte> back(first.size());
    must(dev->read(0, back));
    REQUIRE(back == first);
  }
}

TEST_CASE("direct file device: a loop device of 4096-byte sectors, a volume round trip", "[loop][direct]") {
  Loop loop(128ull << 20, 4096);
  TreeId t;
  {
    auto dev = must(FileDevice::open(loop.dev, FileOpenOptions{.direct = true}));
    REQUIRE(dev->is_direct());
    REQUIRE(dev->logical_sector_size() == 4096);
    FormatOptions fo;
    must(Volume::format(*dev, fo));
    auto vol = must(Volume::open(*dev));
    {
      auto txn = must(vol->begin());
      t = must(txn.create_tree(kKindPlain));
      for (uint64_t i = 0; i < 20000; i++) must(txn.put(t, Key{i, 0}, bytes("direct to a loop device")));
    }
    must(vol->close());
  }
  auto dev = must(FileDevice::open(loop.dev, FileOpenOptions{.direct = true}));
  require_clean(*dev);
  auto vol = must(Volume::open(*dev));
  REQUIRE(dump(*vol, t).size() == 20000);
}
