// Helpers shared by the library tests.
#pragma once

#include "../random_seed.h"

#include <catch2/catch_test_macros.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "blockdev/test_devices.h"
#include "commit/verify.h"
#include "commit/volume.h"

namespace plyfs::test {


inline std::vector<std::byte> bytes(const std::string& s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

template <class T>
T must(Result<T> r) {
  if (!r) FAIL("unexpected error: " << r.error().message());
  return std::move(*r);
}
inline void must(Result<void> r) {
  if (!r) FAIL("unexpected error: " << r.error().message());
}

// Formats a fresh in-memory device.
inline std::unique_ptr<MemDevice> fresh_device(uint64_t size_bytes, uint32_t block_size = 4096,
                                               uint32_t sector = 512) {
  auto dev = std::make_unique<MemDevice>(size_bytes, sector);
  FormatOptions fo;
  fo.block_size = block_size;
  must(Volume::format(*dev, fo));
  return dev;
}

inline void require_clean(BlockDevice& dev, const VerifyOptions& vo = {}) {
  auto rep = must(verify_image(dev, vo));
  INFO(rep.summary());
  REQUIRE(rep.clean());
}

using Model = std::map<Key, std::vector<std::byte>>;

// The whole tree, in order.
inline Model dump(Volume& v, TreeId t) {
  Model m;
  auto txn = must(v.begin());
  must(txn.scan(t, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> val) {
    m.emplace(k, std::vector<std::byte>(val.begin(), val.end()));
    return true;
  }));
  return m;
}

}  // namespace plyfs::test
