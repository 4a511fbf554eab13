// A device that forwards every call to one someone else owns: a member of a
// DeviceSet (which owns its members) that its owner keeps using, as
// open_volume does when it tries a set before it builds the real one, and
// tests do to clone, tear or damage a member.
#pragma once

#include "blockdev/blockdev.h"

namespace plyfs {

class BorrowedDevice final : public BlockDevice {
 public:
  explicit BorrowedDevice(BlockDevice& d) : d_(d) {}
  Result<void> read(uint64_t o, std::span<std::byte> out) override { return d_.read(o, out); }
  Result<void> read_uncached(uint64_t o, std::span<std::byte> out) override { return d_.read_uncached(o, out); }
  Result<void> write(uint64_t o, std::span<const std::byte> in) override { return d_.write(o, in); }
  Result<void> write_batch(std::span<const WriteReq> reqs) override { return d_.write_batch(reqs); }
  Result<void> flush() override { return d_.flush(); }
  Result<void> discard(uint64_t o, uint64_t n) override { return d_.discard(o, n); }
  uint64_t size_bytes() const override { return d_.size_bytes(); }
  uint32_t logical_sector_size() const override { return d_.logical_sector_size(); }
  uint32_t physical_sector_size() const override { return d_.physical_sector_size(); }
  DeviceSet* device_set() override { return d_.device_set(); }
  std::string display_name() const override { return d_.display_name(); }

 private:
  BlockDevice& d_;
};

}  // namespace plyfs
