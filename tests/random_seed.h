// Seeds and scale of the randomized tests, shared by every test program.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace plyfs::test {

// Random tests print their seed and accept it back: PLYFS_SEED=N.
inline uint64_t seed(const char* test_name) {
  uint64_t s;
  if (const char* e = std::getenv("PLYFS_SEED")) s = std::strtoull(e, nullptr, 0);
  else s = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  std::printf("[%s] PLYFS_SEED=%llu\n", test_name, static_cast<unsigned long long>(s));
  std::fflush(stdout);
  return s;
}

// Scale for the long randomized tests (meson -Dlong_tests=true sets it).
inline uint64_t scale() {
  const char* e = std::getenv("PLYFS_TEST_SCALE");
  return e ? std::max<uint64_t>(1, std::strtoull(e, nullptr, 0)) : 1;
}

}  // namespace plyfs::test
