// Several devices seen as one (format.md#multi-device): the block-device
// layer of a multi-device volume.
//
// The set's address space is its members' spaces laid end to end, each at a
// base offset the device table gives (format.md#device-table); a gap may lie
// between two members. Every request must fall inside one member: a request
// that reaches into a gap or across a boundary is EIO, as one past the end of
// a device is. The first `mirrored_bytes` (the reserved area with the
// superblock slots, format.md#layout) are every member's own: a write there
// goes to every member, a read comes from the first. Code that must see one
// member's copy (recovery, the device labels) reads the member itself.
//
// The device contract (blockdev.h) holds per member, each on its own: a
// flush of the set flushes every member and fails if any fails (D4 then
// covers the writes of every member). Nothing orders one member's writes
// against another's; the commit protocol never needs it to (format.md#commit).
#pragma once

#include <memory>
#include <vector>

#include "blockdev/blockdev.h"

namespace plyfs {

class DeviceSet final : public BlockDevice {
 public:
  struct Member {
    std::unique_ptr<BlockDevice> dev;
    uint64_t base = 0;   // byte offset of the member's first byte in the set
    uint64_t bytes = 0;  // bytes of the member the set spans (at most its size)
    std::string name;    // the path it was opened by, for messages and listings
  };
  // Members in increasing base order, without overlap; the first at base 0.
  // EINVAL otherwise.
  static Result<std::unique_ptr<DeviceSet>> make(std::vector<Member> members,
                                                 uint64_t mirrored_bytes);

  Result<void> read(uint64_t offset, std::span<std::byte> out) override;
  Result<void> write(uint64_t offset, std::span<const std::byte> in) override;
  Result<void> write_batch(std::span<const WriteReq> reqs) override;
  Result<void> flush() override;
  Result<void> discard(uint64_t offset, uint64_t len) override;
  uint64_t size_bytes() const override { return size_; }
  uint32_t logical_sector_size() const override { return lss_; }
  uint32_t physical_sector_size() const override { return pss_; }
  DeviceSet* device_set() override { return this; }

  size_t member_count() const { return members_.size(); }
  BlockDevice& member(size_t i) { return *members_[i].dev; }
  const Member& member_info(size_t i) const { return members_[i]; }
  // The members, the set left empty (to make a set of more, add_device).
  std::vector<Member> take_members() { return std::move(members_); }
  // The member holding byte `offset`, or -1 in a gap or past the end.
  int member_at(uint64_t offset) const;

 private:
  DeviceSet() = default;
  // The member and member-relative offset of [offset, offset+len); EIO when
  // the range is not inside one member.
  Result<std::pair<size_t, uint64_t>> locate(uint64_t offset, uint64_t len) const;

  std::vector<Member> members_;
  uint64_t mirrored_ = 0;
  uint64_t size_ = 0;
  uint32_t lss_ = 512, pss_ = 512;
};

}  // namespace plyfs
