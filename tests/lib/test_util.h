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

inline constexpr uint64_t kSlotBytes[2] = {64 * 1024, 128 * 1024};

inline bool is_super_write(uint64_t off) { return off == kSlotBytes[0] || off == kSlotBytes[1]; }

// A device that enforces C3: no write may touch a block that the newest
// durable generation reaches. The reachable set is recomputed from the
// device's content at each flush that follows a superblock write, i.e. each
// time a new generation becomes durable.
class ReachCheckDevice final : public BlockDevice {
 public:
  explicit ReachCheckDevice(MemDevice& inner) : inner_(inner) { refresh(); }
  Result<void> read(uint64_t o, std::span<std::byte> out) override { return inner_.read(o, out); }
  Result<void> write(uint64_t o, std::span<const std::byte> in) override {
    if (is_super_write(o)) {
      super_pending_ = true;
    } else {
      for (const auto& [start, len] : reach_) {
        const uint64_t s = start * bs_, e = (start + len) * bs_;
        if (o < e && s < o + in.size())
          violations.push_back("write at byte " + std::to_string(o) + " hits block " +
                               std::to_string(start) + " of durable generation " +
                               std::to_string(gen_));
      }
    }
    writes++;
    return inner_.write(o, in);
  }
  Result<void> flush() override {
    PLY_CHECK(inner_.flush());
    if (super_pending_) refresh();
    super_pending_ = false;
    return ok();
  }
  Result<void> discard(uint64_t o, uint64_t l) override { return inner_.discard(o, l); }
  uint64_t size_bytes() const override { return inner_.size_bytes(); }
  uint32_t logical_sector_size() const override { return inner_.logical_sector_size(); }
  uint32_t physical_sector_size() const override { return inner_.physical_sector_size(); }

  std::vector<std::string> violations;
  uint64_t writes = 0, refreshes = 0;
  std::map<uint8_t, ValueRefs> kinds;

 private:
  void refresh() {
    VerifyOptions vo;
    vo.collect_reachable = true;
    vo.kinds = kinds;
    auto rep = verify_image(inner_, vo);
    REQUIRE(rep);
    REQUIRE(rep->clean());
    reach_ = rep->reachable;
    bs_ = rep->choice.info.block_size;
    gen_ = rep->choice.info.generation.v;
    refreshes++;
  }
  MemDevice& inner_;
  std::vector<std::pair<uint64_t, uint64_t>> reach_;
  uint64_t bs_ = 4096, gen_ = 0;
  bool super_pending_ = false;
};

}  // namespace plyfs::test
