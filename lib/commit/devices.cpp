#include "commit/devices.h"

#include <dirent.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "alloc/space.h"
#include "blockdev/device_set.h"
#include "commit/disk_superblock.h"
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

Result<SuperInfo> member_superblock(BlockDevice& dev) {
  std::optional<SuperInfo> best;
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
    if (!best || rep.info->generation > best->generation) best = std::move(rep.info);
  }
  if (!best) return Error::corrupt(Error::kNoBlock, "no valid superblock on the device (" + why + ")");
  return *best;
}

namespace {

struct Found {
  std::string path;
  std::unique_ptr<BlockDevice> dev;
  DeviceLabelInfo label;
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
  if (sb.uuid != lab0.volume_uuid || !is_multi_device(sb))
    return Error::corrupt(Error::kNoBlock, path + ": its label names volume " + uuid_text(lab0.volume_uuid) +
                                               ", its superblock " + uuid_text(sb.uuid));
  std::vector<Found> found;
  found.push_back(Found{path, std::move(first), lab0});
  auto consider = [&](const std::string& p, bool scanning) -> Result<void> {
    auto dev = open_device(p, opts);
    if (!dev) {
      if (scanning) return ok();
      return Error::io(dev.error().code, p + ": " + dev.error().message());
    }
    auto l = read_device_label(**dev);
    if (!l || !*l) {
      if (scanning) return ok();
      if (!l) return Error::io(l.error().code, p + ": " + l.error().message());
      return Error::invalid(p + " is not a device of a multi-device plyfs volume");
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
    found.push_back(Found{p, std::move(*dev), **l});
    return ok();
  };
  for (const auto& o : others) {
    struct stat st{};
    if (stat(o.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      for (const auto& p : entries_of(o)) {
        // The devices already open are locked: skip them by name first.
        bool known = std::any_of(found.begin(), found.end(), [&](const Found& f) { return f.path == p; });
        if (!known) PLY_CHECK(consider(p, true));
      }
    } else {
      PLY_CHECK(consider(o, false));
    }
  }
  std::vector<DeviceSet::Member> members;
  for (size_t i = 0; i < sb.devices.size(); i++) {
    const DeviceInfo& d = sb.devices[i];
    auto it = std::find_if(found.begin(), found.end(),
                           [&](const Found& f) { return f.label.device_uuid == d.uuid; });
    if (it == found.end())
      return Error::io(ENODEV, "device " + std::to_string(i) + " (" + uuid_text(d.uuid) + ", class " +
                                   sb.classes[d.class_id] + ") of volume " + uuid_text(sb.uuid) +
                                   " is missing: give its path too (plyfs -o device=PATH, plyctl --device PATH, "
                                   "fsck.plyfs DEVICE...), or a directory to scan");
    if (d.nblocks * sb.block_size > it->dev->size_bytes())
      return Error::io(EIO, it->path + " holds " + std::to_string(it->dev->size_bytes()) +
                                " bytes, but the volume spans " + std::to_string(d.nblocks * sb.block_size) +
                                " of it");
    // The absolute path for listings: a daemon leaves its working directory.
    std::string name = it->path;
    if (!is_nbd_uri(name))
      if (char* rp = realpath(name.c_str(), nullptr)) name = rp, free(rp);
    members.push_back(DeviceSet::Member{std::move(it->dev), d.first_block * sb.block_size,
                                        d.nblocks * sb.block_size, std::move(name)});
    it->dev = nullptr;
  }
  for (const auto& f : found)
    if (f.dev)
      return Error::invalid(f.path + " is not in the device table of volume " + uuid_text(sb.uuid) +
                            " (a device removed from it?)");
  auto set = PLY_TRY(DeviceSet::make(std::move(members), disk::kReservedBytes));
  return std::unique_ptr<BlockDevice>(std::move(set));
}

}  // namespace plyfs
