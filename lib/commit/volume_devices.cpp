// Devices joining and leaving a volume in use (format.md#device-add,
// format.md#device-remove): the device table changes in a generation of its
// own; a device leaves only once the relocation engine (relocate.cpp) moved
// every block off it.
#include "blockdev/device_set.h"
#include "commit/devices.h"
#include "commit/volume.h"

namespace plyfs {

namespace {

uint64_t usable_blocks(const SuperInfo& s) {
  uint64_t holes = 0;
  for (const auto& h : space_geometry(s).holes) holes += h.nblocks;
  return s.total_blocks - s.first_block - holes;
}

}  // namespace

Result<Generation> Volume::add_device(std::unique_ptr<BlockDevice> dev, const std::string& name,
                                      const std::string& cls, bool force, const std::string& first_cls) {
  PLY_CHECK(writable());
  DeviceSet* set = dev_.device_set();
  if (!set)
    return Error::io(EOPNOTSUPP, "this volume of one device was not opened as a set and takes no other (format.md#device-convert)");
  std::lock_guard rl(resize_mu_);
  if (!is_multi_device(info_)) {
    // What the add would refuse is refused before the volume changes
    // (format.md#device-convert): planned on the table it is about to get.
    if (!valid_class_name(first_cls)) return Error::invalid("a class name has 1 to 15 bytes of a-z 0-9 _ -");
    SuperInfo conv = super();
    conv.incompat |= kIncompatMultiDevice;
    conv.classes = {first_cls};
    conv.meta_class = 0;
    conv.devices = {DeviceInfo{}};
    conv.devices[0].nblocks = conv.total_blocks;
    (void)PLY_TRY(plan_device_add(conv, *dev, name, cls, force));
    (void)PLY_TRY(make_multi_device_locked(first_cls));
  }
  {
    std::lock_guard cl(commit_mu_);
    PLY_CHECK(writable());
    const SuperInfo sb = super();
    SuperInfo next = PLY_TRY(plan_device_add(sb, *dev, name, cls, force));
    const DeviceInfo d = next.devices.back();
    const uint64_t bs = info_.block_size;
    // 1. The durable generation's slots (no commit runs: commit_mu_) and the
    // label on the new device, flushed: recovery that falls back to it
    // finds it on every device of the new table too.
    PLY_CHECK(join_device(set->member(0), *dev, next));
    // 2. The set, the space and the table with it; the next generation
    // carries the table to every device.
    PLY_CHECK(set->add_member(DeviceSet::Member{std::move(dev), d.first_block * bs, d.nblocks * bs, name}));
    PLY_CHECK(space_->add_region(space_geometry(next)));
    {
      std::lock_guard lk(state_mu_);
      info_.devices = next.devices;
      info_.classes = next.classes;
    }
    total_blocks_.store(next.total_blocks, std::memory_order_release);
    changed_ = true;
  }
  // Two generations: both slots of every device list the new device.
  return commit_twice();
}

Result<Generation> Volume::remove_device(size_t index,
                                         const std::function<void(uint64_t, uint64_t)>& progress) {
  PLY_CHECK(writable());
  DeviceSet* set = dev_.device_set();
  if (!is_multi_device(info_) || !set) return Error::io(EOPNOTSUPP, "a volume of one device has no device to remove");
  std::lock_guard rl(resize_mu_);
  const SuperInfo sb = super();
  const uint64_t bs = info_.block_size;
  if (index >= sb.devices.size())
    return Error::invalid("the volume has no device " + std::to_string(index) + " (it has " +
                          std::to_string(sb.devices.size()) + ")");
  if (sb.devices.size() == 1) return Error::invalid("the only device of a volume cannot be removed");
  if (set->member_count() != sb.devices.size())
    return Error::invalid("the device set does not match the device table");
  // The table without it: a device in the middle leaves a hole in the block
  // space, the last one moves the end back (format.md#device-remove).
  SuperInfo next = sb;
  next.devices.erase(next.devices.begin() + static_cast<std::ptrdiff_t>(index));
  next.total_blocks = next.devices.back().first_block + next.devices.back().nblocks;
  const uint64_t usable = usable_blocks(next);
  next.reserve_blocks = reserve_for(usable);
  const DeviceRegion region = space_geometry(sb).regions[index];
  {
    const SpaceStats st = space_->stats();
    if (st.used_blocks + next.reserve_blocks > usable)
      return Error::no_space("cannot remove device " + std::to_string(index) + ": " +
                             std::to_string(st.used_blocks * bs) + " bytes are in use and the other devices hold " +
                             std::to_string(usable * bs) + ", of which " + std::to_string(next.reserve_blocks * bs) +
                             " must stay free");
  }
  PLY_CHECK(check_movable());
  const auto lift = [&](const Error& e) {
    (void)space_->exclude(0, 0);
    return e;
  };
  const auto [moved, to_move] = PLY_TRY(vacate(region.start, region.end, progress));
  // Nothing lies on the device now, and what the moves freed is durable:
  // it leaves the set and the space, and one generation records the table
  // without it, on the other devices only; a second one puts it in their
  // other slot too.
  DeviceSet::Member gone;
  {
    std::lock_guard cl(commit_mu_);
    if (auto w = writable(); !w) return lift(w.error());
    gate_.close();
    auto r = space_->drop_region(space_geometry(next));
    if (r) {
      auto m = set->remove_member(index);
      if (!m) {
        gate_.open();
        fail(m.error());  // the space no longer has the region: never commit that
        return m.error();
      }
      gone = std::move(*m);
      {
        std::lock_guard lk(state_mu_);
        info_.devices = next.devices;
      }
      total_blocks_.store(next.total_blocks, std::memory_order_release);
      changed_ = true;
    }
    gate_.open();
    if (!r) return lift(r.error());
  }
  const Generation g = PLY_TRY(commit_twice());
  // The device is no longer the volume's in either slot of any device:
  // wiped, it is not taken for one again (a failure here leaves a device
  // that open refuses as not in the table).
  (void)wipe_device(*gone.dev);
  if (progress) progress(std::max(moved, to_move), std::max(moved, to_move));
  return g;
}

Result<Generation> Volume::commit_twice() {
  (void)PLY_TRY(commit());
  changed_ = true;
  return commit();
}

Result<Generation> Volume::make_multi_device(const std::string& cls) {
  std::lock_guard rl(resize_mu_);
  return make_multi_device_locked(cls);
}

Result<Generation> Volume::make_multi_device_locked(const std::string& cls) {
  PLY_CHECK(writable());
  if (!valid_class_name(cls)) return Error::invalid("a class name has 1 to 15 bytes of a-z 0-9 _ -");
  if (is_multi_device(info_)) return Error::invalid("the volume has several devices already");
  DeviceSet* set = dev_.device_set();
  if (set && (set->member_count() != 1 || set->member_info(0).base != 0))
    return Error::invalid("the device set does not match a volume of one device");
  BlockDevice& first = set ? set->member(0) : dev_;
  const SuperInfo sb = super();
  // The label first, flushed: until a slot says MULTI_DEVICE it is unused
  // (open_volume opens a label beside a superblock of one device as the
  // volume of one device). One of this volume that a conversion cut short
  // left keeps its device uuid; anything else in the boot area, which a
  // volume of one device does not use (format.md#layout), is overwritten.
  std::array<uint8_t, 16> duuid{};
  if (auto l = read_device_label(first); l && *l && (*l)->volume_uuid == sb.uuid) duuid = (*l)->device_uuid;
  else duuid = PLY_TRY(random_uuid());
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  PLY_CHECK(write_device_label(first, sb.uuid, duuid, uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec)));
  PLY_CHECK(first.flush());
  {
    std::lock_guard cl(commit_mu_);
    PLY_CHECK(writable());
    // The table of the one device (format.md#device-convert): the block
    // space, the free space and the reserve of one device at block 0 are
    // already those of such a table. A set spans the volume's blocks of
    // it only, so that the next device begins past them.
    if (set) PLY_CHECK(set->clip_last(info_.total_blocks * info_.block_size));
    DeviceInfo d;
    d.uuid = duuid;
    d.first_block = 0;
    d.nblocks = info_.total_blocks;
    d.class_id = 0;
    std::lock_guard lk(state_mu_);
    info_.incompat |= kIncompatMultiDevice;
    info_.classes = {cls};
    info_.meta_class = 0;
    info_.devices = {d};
    changed_ = true;
  }
  return commit_twice();
}

}  // namespace plyfs
