// Directory benchmark (issue 3): lookups in one directory as it grows to a
// million entries, through the filesystem layer (no FUSE), on an in-memory
// device. Names are hashed into the tree (format.md#fs-dirent), so a lookup
// should cost O(log n): the time per lookup at 1,000 and at 1,000,000
// entries should differ by a small factor (the tree's depth), not by 1000.
//
//   dir_bench [--entries N]
//
// Reports, per size: create rate, lookup time (random existing names and
// misses), readdir rate. Not a test: nothing is asserted.
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "blockdev/test_devices.h"
#include "fs/fs.h"

using namespace plyfs;
using Clock = std::chrono::steady_clock;

namespace {
double secs(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }
template <class T>
T must(Result<T> r, const char* what) {
  if (!r) {
    std::fprintf(stderr, "dir_bench: %s: %s\n", what, r.error().message().c_str());
    std::exit(1);
  }
  return std::move(*r);
}
}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 1000000;
  for (int i = 1; i < argc; i++)
    if (!std::strcmp(argv[i], "--entries") && i + 1 < argc) n = std::strtoull(argv[++i], nullptr, 0);
  MemDevice dev(8ull << 30);
  must(format_filesystem(dev, FormatOptions{}, FsCreateOptions{}), "mkfs");
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.cache_bytes = 2ull << 30;
  vo.dirty_limit_bytes = 256ull << 20;
  auto vol = must(Volume::open(dev, vo), "open");
  auto fs = must(Filesystem::open(*vol, must(Filesystem::default_tree(*vol), "tree")), "fs");
  const uint64_t dir = must(fs->mkdir(fs->root(), "big", 0755, 0, 0), "mkdir").ino;
  std::mt19937_64 rng(42);
  auto name = [](uint64_t i) { return "file-" + std::to_string(i) + "-with-a-name-of-some-length"; };
  std::printf("%12s %14s %16s %16s %14s\n", "entries", "creates/s", "lookup hit (us)",
              "lookup miss (us)", "readdir/s");
  uint64_t have = 0;
  for (uint64_t target = 1000; target <= n; target *= 10) {
    auto t0 = Clock::now();
    const uint64_t before = have;
    for (; have < target; have++)
      must(fs->mknod(dir, name(have), S_IFREG | 0644, 0, 0, 0), "create");
    const double create_rate = double(have - before) / secs(t0);
    if (auto s = fs->sync(); !s) {
      std::fprintf(stderr, "dir_bench: sync: %s\n", s.error().message().c_str());
      return 1;
    }
    const int probes = 200000;
    t0 = Clock::now();
    for (int i = 0; i < probes; i++) must(fs->lookup(dir, name(rng() % have)), "lookup");
    const double hit = secs(t0) / probes * 1e6;
    t0 = Clock::now();
    for (int i = 0; i < probes; i++) {
      auto r = fs->lookup(dir, "absent-" + std::to_string(rng()));
      if (r || r.error().code != ENOENT) return 1;
    }
    const double miss = secs(t0) / probes * 1e6;
    uint64_t seen = 0;
    t0 = Clock::now();
    if (!fs->readdir(dir, 0, [&](const DirEntry&) { return ++seen, true; })) return 1;
    const double rd = double(seen) / secs(t0);
    if (seen != have + 2) return 1;
    std::printf("%12llu %14.0f %16.2f %16.2f %14.0f\n", (unsigned long long)have, create_rate, hit,
                miss, rd);
    std::fflush(stdout);
  }
  return 0;
}
