#include "blockdev/device_set.h"

#include <algorithm>
#include <mutex>

namespace plyfs {

Result<std::unique_ptr<DeviceSet>> DeviceSet::make(std::vector<Member> members,
                                                   uint64_t mirrored_bytes) {
  if (members.empty()) return Error::invalid("a device set needs at least one device");
  std::unique_ptr<DeviceSet> s(new DeviceSet());
  uint64_t end = 0;
  for (size_t i = 0; i < members.size(); i++) {
    const Member& m = members[i];
    if (!m.dev) return Error::invalid("a device set member is missing");
    if (i > 0 && m.base < end)
      return Error::invalid("device set members overlap or are out of order");
    if (m.bytes < mirrored_bytes || m.bytes > m.dev->size_bytes())
      return Error::invalid("device " + std::to_string(i) + " of the set is smaller than its " +
                            std::to_string(m.bytes) + " bytes in the volume");
    s->lss_ = std::max(s->lss_, m.dev->logical_sector_size());
    s->pss_ = std::max(s->pss_, m.dev->physical_sector_size());
    end = m.base + m.bytes;
  }
  for (const Member& m : members)
    if (m.base % s->lss_ || m.bytes % s->lss_)
      return Error::invalid("a device set member is not aligned to the sector size");
  s->members_ = std::move(members);
  s->mirrored_ = mirrored_bytes;
  s->size_ = end;
  return s;
}

int DeviceSet::member_at(uint64_t offset) const {
  auto it = std::upper_bound(members_.begin(), members_.end(), offset,
                             [](uint64_t off, const Member& m) { return off < m.base; });
  if (it == members_.begin()) return -1;
  --it;
  if (offset - it->base >= it->bytes) return -1;
  return static_cast<int>(it - members_.begin());
}

Result<std::pair<size_t, uint64_t>> DeviceSet::locate(uint64_t offset, uint64_t len) const {
  PLY_CHECK(check_range(*this, offset, len));
  const int i = member_at(offset);
  if (i < 0 || len > members_[i].bytes - (offset - members_[i].base))
    return Error::io(EIO, "I/O at " + std::to_string(offset) + "+" + std::to_string(len) +
                              " is not inside one device of the set");
  return std::pair<size_t, uint64_t>{static_cast<size_t>(i), offset - members_[i].base};
}

Result<void> DeviceSet::add_member(Member m) {
  std::unique_lock lk(mu_);
  if (!m.dev) return Error::invalid("a device set member is missing");
  if (!members_.empty() && m.base < members_.back().base + members_.back().bytes)
    return Error::invalid("a new device set member overlaps the last one");
  if (m.bytes < mirrored_ || m.bytes > m.dev->size_bytes())
    return Error::invalid("the new device is smaller than its " + std::to_string(m.bytes) + " bytes in the volume");
  const uint32_t lss = std::max(lss_, m.dev->logical_sector_size());
  for (const Member& x : members_)
    if (x.base % lss || x.bytes % lss) return Error::invalid("the new device's sector size does not suit the set");
  if (m.base % lss || m.bytes % lss) return Error::invalid("a device set member is not aligned to the sector size");
  lss_ = lss;
  pss_ = std::max(pss_, m.dev->physical_sector_size());
  size_ = m.base + m.bytes;
  members_.push_back(std::move(m));
  return ok();
}

Result<void> DeviceSet::clip_last(uint64_t bytes) {
  std::unique_lock lk(mu_);
  if (members_.empty()) return Error::invalid("the set has no member");
  Member& m = members_.back();
  if (bytes > m.bytes || bytes < mirrored_ || bytes % lss_) return Error::invalid("cannot clip the set's last member to " + std::to_string(bytes) + " bytes");
  m.bytes = bytes;
  size_ = m.base + m.bytes;
  return ok();
}

// A set of one member at byte 0 (a volume of one device held as a set,
// format.md#device-convert) grows and shrinks with that device; any other
// keeps its size (a volume of several devices grows by adding one).
template <class F>
Result<uint64_t> DeviceSet::resize_lone(F&& change) {
  std::unique_lock lk(mu_);
  if (members_.size() != 1 || members_[0].base != 0) return size_.load();
  const uint64_t n = PLY_TRY(change(*members_[0].dev));
  members_[0].bytes = n / lss_ * lss_;
  size_ = members_[0].bytes;
  return size_.load();
}

Result<uint64_t> DeviceSet::resize(uint64_t at_least) {
  return resize_lone([&](BlockDevice& d) { return d.resize(at_least); });
}

Result<uint64_t> DeviceSet::truncate(uint64_t bytes) {
  return resize_lone([&](BlockDevice& d) { return d.truncate(bytes); });
}

Result<DeviceSet::Member> DeviceSet::remove_member(size_t i) {
  std::unique_lock lk(mu_);
  if (i >= members_.size()) return Error::invalid("no such member of the set");
  if (members_.size() == 1) return Error::invalid("the last member of a set cannot leave it");
  Member m = std::move(members_[i]);
  members_.erase(members_.begin() + static_cast<std::ptrdiff_t>(i));
  size_ = members_.back().base + members_.back().bytes;
  return m;
}

Result<void> DeviceSet::read(uint64_t offset, std::span<std::byte> out) { return read_member(offset, out, false); }

Result<void> DeviceSet::read_uncached(uint64_t offset, std::span<std::byte> out) {
  return read_member(offset, out, true);
}

Result<void> DeviceSet::read_member(uint64_t offset, std::span<std::byte> out, bool uncached) {
  std::shared_lock lk(mu_);
  BlockDevice* dev = nullptr;
  if (offset < mirrored_) {  // every member's own copy: the first's
    if (out.size() > mirrored_ - offset) return Error::invalid("a read crosses the end of the mirrored area");
    dev = members_[0].dev.get();
  } else {
    auto [i, off] = PLY_TRY(locate(offset, out.size()));
    dev = members_[i].dev.get();
    offset = off;
  }
  return uncached ? dev->read_uncached(offset, out) : dev->read(offset, out);
}

Result<void> DeviceSet::write(uint64_t offset, std::span<const std::byte> in) {
  std::shared_lock lk(mu_);
  return write_locked(offset, in);
}

Result<void> DeviceSet::write_locked(uint64_t offset, std::span<const std::byte> in) {
  if (offset < mirrored_) {
    // The reserved area is every member's own copy (the superblocks): all of
    // them, each an independent write (D2 lets them land in any order).
    if (in.size() > mirrored_ - offset)
      return Error::invalid("a write crosses the end of the mirrored area");
    Result<void> first = ok();
    for (auto& m : members_) {
      auto r = m.dev->write(offset, in);
      if (!r && first) first = std::move(r);
    }
    return first;
  }
  auto [i, off] = PLY_TRY(locate(offset, in.size()));
  return members_[i].dev->write(off, in);
}

Result<void> DeviceSet::write_batch(std::span<const WriteReq> reqs) {
  std::shared_lock lk(mu_);
  std::vector<std::vector<WriteReq>> per(members_.size());
  for (const auto& r : reqs) {
    if (r.offset < mirrored_) {
      PLY_CHECK(write_locked(r.offset, r.data));
      continue;
    }
    auto [i, off] = PLY_TRY(locate(r.offset, r.data.size()));
    per[i].push_back(WriteReq{off, r.data});
  }
  Result<void> first = ok();
  for (size_t i = 0; i < members_.size(); i++) {
    if (per[i].empty()) continue;
    auto r = members_[i].dev->write_batch(per[i]);
    if (!r && first) first = std::move(r);
  }
  return first;
}

Result<void> DeviceSet::flush() {
  // Every member, even after one failed: the others' writes are then durable
  // and the caller learns of the failure either way (D4).
  std::shared_lock lk(mu_);
  Result<void> first = ok();
  for (auto& m : members_) {
    auto r = m.dev->flush();
    if (!r && first) first = std::move(r);
  }
  return first;
}

Result<void> DeviceSet::discard(uint64_t offset, uint64_t len) {
  if (len == 0) return ok();
  if (offset < mirrored_) return Error::invalid("the reserved area is never discarded");
  std::shared_lock lk(mu_);
  auto [i, off] = PLY_TRY(locate(offset, len));
  return members_[i].dev->discard(off, len);
}

}  // namespace plyfs
