// What the library benchmarks (snap_bench, merge_bench) share: a clock in
// milliseconds, a fatal exit on any error (a benchmark has nothing to
// recover), and a median. Each program defines BENCH_NAME before including.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "blockdev/test_devices.h"
#include "commit/volume.h"
#include "fs/fs.h"
#include "util/result.h"

namespace bench {

using Clock = std::chrono::steady_clock;

inline double ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

[[noreturn]] inline void fail(const char* what, const plyfs::Error& e) {
  std::fprintf(stderr, "%s: %s: %s\n", BENCH_NAME, what, e.message().c_str());
  std::exit(1);
}

template <class T>
T must(plyfs::Result<T> r, const char* what) {
  if (!r) fail(what, r.error());
  return std::move(*r);
}
inline void must(plyfs::Result<void> r, const char* what) {
  if (!r) fail(what, r.error());
}

// A fresh filesystem image on `dev`, opened with a 1 GiB cache.
inline std::unique_ptr<plyfs::Volume> memory_volume(plyfs::MemDevice& dev) {
  must(plyfs::format_filesystem(dev, plyfs::FormatOptions{}, plyfs::FsCreateOptions{}), "mkfs");
  plyfs::VolumeOptions vo;
  vo.kinds = plyfs::fs_kinds();
  vo.cache_bytes = 1ull << 30;
  return must(plyfs::Volume::open(dev, vo), "open");
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bench
