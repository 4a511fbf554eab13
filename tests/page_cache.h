// What the host's page cache holds of a file: the checks that plyfs's
// devices keep out of it (O_DIRECT, format.md#device-direct) or hand it to
// writeback early (format.md#device-writeback). Shared by the unit and the
// FUSE tests.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace plyfs::test {

// Pages of `path` in the host's page cache (mincore), dirty ones included.
inline uint64_t resident_pages(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  struct stat st {};
  REQUIRE(fstat(fd, &st) == 0);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t len = static_cast<size_t>(st.st_size);
  void* m = mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(m != MAP_FAILED);
  std::vector<unsigned char> vec((len + page - 1) / page);
  REQUIRE(mincore(m, len, vec.data()) == 0);
  munmap(m, len);
  close(fd);
  uint64_t in = 0;
  for (unsigned char c : vec) in += c & 1;
  return in;
}

// Pages of `path` dirty in the host's page cache (cachestat(2), Linux
// 6.5+); -1 where the kernel has no cachestat.
inline long dirty_pages(const std::string& path) {
  struct Range {
    uint64_t off, len;
  } range{0, 0};  // len 0: to the end
  struct Stat {
    uint64_t cache, dirty, writeback, evicted, recently_evicted;
  } st{};
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  const long r = ::syscall(451 /* __NR_cachestat */, fd, &range, &st, 0);
  close(fd);
  return r == 0 ? static_cast<long>(st.dirty) : -1;
}

}  // namespace plyfs::test
