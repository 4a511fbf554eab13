#include "commit/devices.h"

#include <dirent.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "alloc/space.h"
#include "blockdev/device_set.h"
#include "blockdev/borrowed_device.h"
#include "commit/disk_superblock.h"
#include "commit/volume.h"
#include "util/checksum.h"

namespace plyfs {

Result<std::array<uint8_t, 16>> random_uuid() {
  std::array<uint8_t, 16> u{};
  if (getrandom(u.data(), u.size(), 0) != 16) return Error::sys(errno, "cannot get random bytes for a uuid");
  u[6] = static_cast<uint8_t>((u[6] & 0x0f) | 0x40);  // RFC 4122 version 4
  u[8] = static_cast<uint8_t>((u[8] & 0x3f) | 0x80);
  return u;
}

std::string uuid_text(const std::array<uint8_t, 16>& u) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += d[u[i] >> 4];
    s += d[u[i] & 15];
  }
  return s;
}

Result<void> write_device_label(BlockDevice& dev, const std::array<uint8_t, 16>& volume_uuid,
                                const std::array<uint8_t, 16>& device_uuid, uint64_t joined_ns) {
  // A whole 4 KiB (the largest sector a device may have, format.md#layout),
  // the label in its first 512 bytes.
  std::vector<std::byte> buf(4096);
  auto* l = reinterpret_cast<disk::DeviceLabel*>(buf.data());
  std::memcpy(l->magic, disk::kLabelMagic, 8);
  std::memcpy(l->volume_uuid, volume_uuid.data(), 16);
  std::memcpy(l->device_uuid, device_uuid.data(), 16);
  l->joined_ns.set(joined_ns);
  l->checksum.set(xxh3(buf.data(), offsetof(disk::DeviceLabel, checksum)));
  return dev.write(disk::kLabelOffset, buf);
}

Result<std::optional<DeviceLabelInfo>> read_device_label(BlockDevice& dev) {
  if (dev.size_bytes() < disk::kReservedBytes) return std::optional<DeviceLabelInfo>();
  std::vector<std::byte> buf(4096);
  PLY_CHECK(dev.read(disk::kLabelOffset, buf));
  const auto* l = reinterpret_cast<const disk::DeviceLabel*>(buf.data());
  if (std::memcmp(l->magic, disk::kLabelMagic, 8) != 0) return std::optional<DeviceLabelInfo>();
  if (l->checksum.get() != xxh3(buf.data(), offsetof(disk::DeviceLabel, checksum)))
    return Error::corrupt(disk::kLabelOffset / 4096, "the device label's checksum is wrong");
  DeviceLabelInfo i;
  std::memcpy(i.volume_uuid.data(), l->volume_uuid, 16);
  std::memcpy(i.device_uuid.data(), l->device_uuid, 16);
  i.joined_ns = l->joined_ns.get();
  return std::optional<DeviceLabelInfo>(i);
}

std::vector<std::pair<uint64_t, uint64_t>> plan_devices(const std::vector<uint64_t>& device_bytes,
                                                        uint32_t block_size) {
  const uint64_t first = disk::kReservedBytes / block_size, g = SpaceManager::kGroupBlocks;
  std::vector<std::pair<uint64_t, uint64_t>> out;
  uint64_t end = 0;
  for (size_t i = 0; i < device_bytes.size(); i++) {
    const uint64_t n = device_bytes[i] / block_size;
    const uint64_t at = i == 0 ? 0 : first + (end - first + g - 1) / g * g;
    out.emplace_back(at, n);
    end = at + n;
  }
  return out;
}

Result<std::vector<SuperInfo>> member_superblocks(BlockDevice& dev) {
  std::vector<SuperInfo> out;
  std::string why;
  for (int slot = 0; slot < 2; slot++) {
    std::vector<std::byte> buf(disk::kSuperSize);
    auto r = dev.read(disk::kSuperOffset[slot], buf);
    if (!r) {
      why = r.error().message();
      continue;
    }
    // The set's size is not known yet: any span passes here, the set's
    // own read_superblocks() checks it.
    SlotReport rep = decode_superblock(buf, slot, ~0ull);
    if (rep.state != SlotState::Valid) {
      why = std::string(slot_state_name(rep.state)) + ", " + rep.detail;
      continue;
    }
    out.push_back(std::move(*rep.info));
  }
  if (out.empty()) return Error::corrupt(Error::kNoBlock, "no valid superblock on the device (" + why + ")");
  std::sort(out.begin(), out.end(), [](const SuperInfo& a, const SuperInfo& b) { return a.generation > b.generation; });
  return out;
}

Result<SuperInfo> member_superblock(BlockDevice& dev) { return PLY_TRY(member_superblocks(dev)).front(); }

namespace {

struct Found {
  std::string path;
  std::unique_ptr<BlockDevice> dev;
  DeviceLabelInfo label;
  bool scanned = false;  // found in a directory, not named
};

// Every regular file and block device directly in `dir`, for scanning.
std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string p = dir + "/" + e->d_name;
    struct stat st{};
    if (stat(p.c_str(), &st) == 0 && (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) out.push_back(p);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Result<std::unique_ptr<BlockDevice>> open_volume(const std::string& path,
                                                 const std::vector<std::string>& others,
                                                 FileOpenOptions opts) {
  auto first = PLY_TRY(open_device(path, opts));
  auto label = read_device_label(*first);
  if (!label) return Error::io(label.error().code, path + ": " + label.error().message());
  if (!*label) {
    if (!others.empty())
      return Error::invalid(path + " is not a device of a multi-device plyfs volume");
    return first;
  }
  const DeviceLabelInfo lab0 = **label;
  SuperInfo sb = PLY_TRY(member_superblock(*first));
  // A conversion cut short (format.md#device-convert): the label was
  // written, no slot has the table yet. The volume is still of one device.
  if (sb.uuid == lab0.volume_uuid && !is_multi_device(sb)) {
    if (!others.empty())
      return Error::invalid(path + " is not a device of a multi-device plyfs volume");
    return first;
  }
  if (sb.uuid != lab0.volume_uuid || !is_multi_device(sb))
    return Error::corrupt(Error::kNoBlock, path + ": its label names volume " + uuid_text(lab0.volume_uuid) +
                                               ", its superblock " + uuid_text(sb.uuid));
  std::vector<Found> found;
  found.push_back(Found{path, std::move(first), lab0});
  // A device named twice, or the first one named again among the others
  // (`plyfs A -o device=A,device=B`, as btrfs's fstab lines often give
  // every device), is opened once: a second open of it would find it
  // locked by the first.
  std::vector<std::string> opened = {device_identity(path)};
  auto consider = [&](const std::string& p, bool scanning) -> Result<void> {
    const std::string id = device_identity(p);
    if (std::find(opened.begin(), opened.end(), id) != opened.end()) return ok();
    opened.push_back(id);
    auto dev = open_device(p, opts);
    if (!dev) {
      if (scanning) return ok();
      std::string m = dev.error().message();  // most name the device already
      return Error::io(dev.error().code, m.rfind(p + " ", 0) == 0 ? m : p + ": " + m);
    }
    auto l = read_device_label(**dev);
    if (!l || !*l) {
      if (scanning) return ok();
      if (!l) return Error::io(l.error().code, p + ": " + l.error().message());
      return Error::invalid(p + " is not a device of a multi-device plyfs volume (it has no device label, "
                            "which a device loses when it is removed from its volume: leave it out)");
    }
    if ((*l)->volume_uuid != sb.uuid) {
      if (scanning) return ok();
      return Error::invalid(p + " is a device of another plyfs volume (" + uuid_text((*l)->volume_uuid) +
                            "), not of " + uuid_text(sb.uuid));
    }
    for (const auto& f : found)
      if (f.label.device_uuid == (*l)->device_uuid) {
        if (scanning) return ok();  // found again: the same device by another name
        return Error::invalid(p + " and " + f.path + " are the same device of the volume (" +
                              uuid_text(f.label.device_uuid) + ")");
      }
    found.push_back(Found{p, std::move(*dev), **l, scanning});
    return ok();
  };
  for (const auto& o : others) {
    struct stat st{};
    if (stat(o.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      // The devices already open are locked: consider() passes over them.
      for (const auto& p : entries_of(o)) PLY_CHECK(consider(p, true));
    } else {
      PLY_CHECK(consider(o, false));
    }
  }
  // The table the set is assembled by: the first device's newest, unless
  // the generation recovery then chooses lists a device that table lacks:
  // a device change cut short (format.md#device-remove), the first device
  // a generation ahead of the others. Then its other slot's table, with the
  // device it needs, if that one was found. Each tried on borrowed devices.
  auto members_for = [&](const SuperInfo& t, bool borrow) -> Result<std::vector<DeviceSet::Member>> {
    std::vector<DeviceSet::Member> members;
    for (size_t i = 0; i < t.devices.size(); i++) {
      const DeviceInfo& d = t.devices[i];
      auto it = std::find_if(found.begin(), found.end(),
                             [&](const Found& f) { return f.dev && f.label.device_uuid == d.uuid; });
      if (it == found.end())
        return Error::io(ENODEV, "device " + std::to_string(i) + " (" + uuid_text(d.uuid) + ", class " +
                                     t.classes[d.class_id] + ") of volume " + uuid_text(t.uuid) +
                                     " is missing: give its path too (plyfs -o device=PATH, plyctl --device PATH, "
                                     "fsck.plyfs DEVICE...), or a directory to scan");
      if (d.nblocks * t.block_size > it->dev->size_bytes())
        return Error::io(EIO, it->path + " holds " + std::to_string(it->dev->size_bytes()) +
                                  " bytes, but the volume spans " + std::to_string(d.nblocks * t.block_size) +
                                  " of it");
      // The absolute path for listings: a daemon leaves its working directory.
      std::string name = device_display_name(it->path);
      std::unique_ptr<BlockDevice> dev;
      if (borrow) dev = std::make_unique<BorrowedDevice>(*it->dev);
      else dev = std::move(it->dev);
      members.push_back(DeviceSet::Member{std::move(dev), d.first_block * t.block_size,
                                          d.nblocks * t.block_size, std::move(name)});
    }
    return members;
  };
  {
    auto trial = [&](const SuperInfo& t) -> Result<void> {
      auto set = PLY_TRY(DeviceSet::make(PLY_TRY(members_for(t, true)), disk::kReservedBytes));
      auto r = read_superblocks(*set);
      if (!r) return r.error();
      return ok();
    };
    auto first_try = trial(sb);
    if (!first_try && first_try.error().code == ENODEV)
      if (auto both = member_superblocks(*found[0].dev); both)
        for (const auto& other : *both)
          if (other.uuid == sb.uuid && other.generation < sb.generation && is_multi_device(other) &&
              trial(other)) {
            sb = other;
            break;
          }
  }
  std::vector<DeviceSet::Member> members = PLY_TRY(members_for(sb, false));
  // A device the table lacks that a scan found is no device of the volume
  // (one an interrupted add left, format.md#device-add); one named is refused.
  for (const auto& f : found)
    if (f.dev && !f.scanned)
      return Error::invalid(f.path + " is not in the device table of volume " + uuid_text(sb.uuid) +
                            " (a device removed from it, or one whose add was cut short: add it again)");
  auto set = PLY_TRY(DeviceSet::make(std::move(members), disk::kReservedBytes));
  return std::unique_ptr<BlockDevice>(std::move(set));
}

bool valid_class_name(const std::string& name) {
  return !name.empty() && name.size() <= 15 &&
         name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") == std::string::npos;
}

Result<SuperInfo> plan_device_add(const SuperInfo& sb, BlockDevice& dev, const std::string& name,
                                  const std::string& cls, bool force) {
  if (!is_multi_device(sb))
    return Error::io(EOPNOTSUPP, "a volume of one device in use takes no other: unmounted, plyctl device add makes it a volume of several (format.md#device-convert)");
  if (sb.devices.size() >= disk::kMaxDevices)
    return Error::invalid("the volume has " + std::to_string(disk::kMaxDevices) + " devices, the most it may");
  // A label on the device: one of this volume's table is refused; one of
  // this volume that the table lacks is an add a crash cut short (or a
  // device removed), taken again; another volume's is refused unless forced.
  if (auto l = read_device_label(dev); l && *l) {
    if ((*l)->volume_uuid == sb.uuid) {
      for (const auto& d : sb.devices)
        if (d.uuid == (*l)->device_uuid)
          return Error::invalid(name + " is a device of the volume already (" + uuid_text(d.uuid) + ")");
    } else if (!force) {
      return Error::invalid(name + " is a device of another plyfs volume (" + uuid_text((*l)->volume_uuid) +
                            "): give --force to take it");
    }
  }
  const uint32_t bs = sb.block_size;
  const uint64_t group = SpaceManager::kGroupBlocks;
  const uint64_t end = sb.total_blocks;
  const uint64_t first = sb.first_block + (end - sb.first_block + group - 1) / group * group;
  const uint64_t nblocks = dev.size_bytes() / bs;
  if (nblocks < sb.first_block + 16)
    return Error::invalid(name + " is too small: a device of a volume holds at least " +
                          std::to_string((sb.first_block + 16) * bs) + " bytes");
  SuperInfo next = sb;
  uint8_t class_id;
  if (auto it = std::find(sb.classes.begin(), sb.classes.end(), cls); it != sb.classes.end()) {
    class_id = static_cast<uint8_t>(it - sb.classes.begin());
  } else {
    if (sb.classes.size() >= disk::kMaxClasses)
      return Error::invalid("the volume has " + std::to_string(disk::kMaxClasses) + " classes: give one of them");
    if (!valid_class_name(cls)) return Error::invalid("a class name has 1 to 15 bytes of a-z 0-9 _ -");
    next.classes.push_back(cls);
    class_id = static_cast<uint8_t>(next.classes.size() - 1);
  }
  DeviceInfo d;
  d.uuid = PLY_TRY(random_uuid());
  d.first_block = first;
  d.nblocks = nblocks;
  d.class_id = class_id;
  next.devices.push_back(d);
  next.total_blocks = first + nblocks;
  uint64_t holes = 0;
  for (const auto& h : space_geometry(next).holes) holes += h.nblocks;
  next.reserve_blocks = Volume::reserve_for(next.total_blocks - next.first_block - holes);
  return next;
}

Result<void> join_device(BlockDevice& from, BlockDevice& dev, const SuperInfo& next) {
  // The new device gets `from`'s superblock slots byte for byte (so that
  // every device holds the generation the volume is at), then its label;
  // flushed before any other device changes.
  std::vector<std::byte> buf(disk::kSuperSize);
  for (int slot = 0; slot < 2; slot++) {
    PLY_CHECK(from.read(disk::kSuperOffset[slot], buf));
    PLY_CHECK(dev.write(disk::kSuperOffset[slot], buf));
  }
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  const uint64_t now = uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
  PLY_CHECK(write_device_label(dev, next.uuid, next.devices.back().uuid, now));
  return dev.flush();
}

Result<void> wipe_device(BlockDevice& dev) {
  std::vector<std::byte> zero(disk::kReservedBytes);
  PLY_CHECK(dev.write(0, zero));
  return dev.flush();
}

Result<std::unique_ptr<DeviceSet>> make_multi_device(std::unique_ptr<BlockDevice> dev, const std::string& name,
                                                     const std::string& cls) {
  uint64_t bytes;
  {
    auto vol = PLY_TRY(Volume::open(*dev));
    (void)PLY_TRY(vol->make_multi_device(cls));
    bytes = vol->super().total_blocks * vol->block_size();
    PLY_CHECK(vol->close());
  }
  return one_device_set(std::move(dev), name, bytes);
}

Result<std::unique_ptr<DeviceSet>> one_device_set(std::unique_ptr<BlockDevice> dev, const std::string& name,
                                                  uint64_t bytes) {
  if (bytes == 0) bytes = dev->size_bytes();
  std::vector<DeviceSet::Member> m;
  m.push_back(DeviceSet::Member{std::move(dev), 0, bytes, device_display_name(name)});
  return DeviceSet::make(std::move(m), disk::kReservedBytes);
}

Result<std::unique_ptr<DeviceSet>> add_device(std::unique_ptr<DeviceSet> set, std::unique_ptr<BlockDevice> dev,
                                              const std::string& name, const std::string& cls, bool force) {
  // The volume's own add, on a volume opened for it alone: the same steps
  // as on a mounted one (Volume::add_device).
  {
    auto vol = PLY_TRY(Volume::open(*set));
    (void)PLY_TRY(vol->add_device(std::move(dev), device_display_name(name), cls, force));
    PLY_CHECK(vol->close());
  }
  return set;
}

}  // namespace plyfs
