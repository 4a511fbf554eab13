// Several devices seen as one (format.md#multi-device): the block-device
// layer of a multi-device volume.
//
// The set's address space is its members' spaces laid end to end, each at a
// base offset the device table gives (format.md#device-table); a gap may lie
// between two members. Every request must fall inside one member: a request
// that reaches into a gap or across a boundary is EIO, as one past the end of
// a device is. The first `mirrored_bytes` (the reserved area with the
// superblock slots, format.md#layout) are every member's own, at the same
// offset of each, whatever its base: a write there goes to every member, a
// read comes from the first. Code that must see one member's copy
// (recovery, the device labels) reads the member itself.
//
// Members join and leave while I/O runs (plyctl device add|remove on a
// mounted volume, format.md#device-remove): the member list is behind a
// reader-writer lock, each request holding it shared.
//
// The device contract (blockdev.h) holds per member, each on its own: a
// flush of the set flushes every member and fails if any fails (D4 then
// covers the writes of every member). Nothing orders one member's writes
// against another's; the commit protocol never needs it to (format.md#commit).
#pragma once

#include <atomic>
#include <memory>
#include <shared_mutex>
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
  // Members in increasing base order, without overlap. EINVAL otherwise.
  static Result<std::unique_ptr<DeviceSet>> make(std::vector<Member> members,
                                                 uint64_t mirrored_bytes);

  Result<void> read(uint64_t offset, std::span<std::byte> out) override;
  Result<void> read_uncached(uint64_t offset, std::span<std::byte> out) override;
  Result<void> write(uint64_t offset, std::span<const std::byte> in) override;
  Result<void> write_batch(std::span<const WriteReq> reqs) override;
  Result<void> flush() override;
  Result<void> discard(uint64_t offset, uint64_t len) override;
  uint64_t size_bytes() const override { return size_.load(std::memory_order_acquire); }
  uint32_t logical_sector_size() const override { return lss_; }
  uint32_t physical_sector_size() const override { return pss_; }
  DeviceSet* device_set() override { return this; }
  // A set of one member at byte 0 is that device (a volume of one device
  // that a mount holds as a set, so that it can take a second,
  // format.md#device-convert): it grows and is cut with it, and spans all
  // of it. A set of more keeps its size, as BlockDevice's defaults do.
  Result<uint64_t> resize(uint64_t at_least) override;
  Result<uint64_t> truncate(uint64_t bytes) override;

  // The accessors below are for a set no other thread changes (add_member,
  // remove_member) while they run, or for the thread that changes it.
  size_t member_count() const { return members_.size(); }
  BlockDevice& member(size_t i) { return *members_[i].dev; }
  const Member& member_info(size_t i) const { return members_[i]; }
  // A new last member, past every other; EINVAL if it overlaps or is too
  // small for the mirrored area.
  Result<void> add_member(Member m);
  // The last member spans `bytes` of its device from now on (at most
  // what it spans now, at least the mirrored area): a device of one volume
  // that grew past the volume, made the first of several.
  Result<void> clip_last(uint64_t bytes);
  // Member i leaves: requests that reach its bytes are EIO from now on, and
  // the mirrored area's writes and flushes no longer go to it. The last
  // member cannot leave. Returns it.
  Result<Member> remove_member(size_t i);
  // The members, the set left empty (to make a set of more, add_device).
  std::vector<Member> take_members() { return std::move(members_); }
  // The member holding byte `offset`, or -1 in a gap or past the end.
  int member_at(uint64_t offset) const;

 private:
  DeviceSet() = default;
  // The member and member-relative offset of [offset, offset+len); EIO when
  // the range is not inside one member.
  Result<std::pair<size_t, uint64_t>> locate(uint64_t offset, uint64_t len) const;
  Result<void> write_locked(uint64_t offset, std::span<const std::byte> in);
  Result<void> read_member(uint64_t offset, std::span<std::byte> out, bool uncached);
  // resize() and truncate(): `change` applied to a lone member at byte 0.
  template <class F>
  Result<uint64_t> resize_lone(F&& change);

  mutable std::shared_mutex mu_;  // members_, size_, lss_, pss_ change under it exclusively
  std::vector<Member> members_;
  uint64_t mirrored_ = 0;
  std::atomic<uint64_t> size_{0};
  uint32_t lss_ = 512, pss_ = 512;
};

}  // namespace plyfs
