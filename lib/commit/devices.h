// The devices of a volume (format.md#multi-device): their labels, how a new
// volume lays them out in one block space, and finding and assembling them
// when a volume is opened.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "blockdev/blockdev.h"
#include "commit/superblock.h"

namespace plyfs {

// A random RFC 4122 version 4 uuid.
Result<std::array<uint8_t, 16>> random_uuid();

// The label at byte 32 KiB of each device (format.md#device-label).
struct DeviceLabelInfo {
  std::array<uint8_t, 16> volume_uuid{}, device_uuid{};
  uint64_t joined_ns = 0;
};
Result<void> write_device_label(BlockDevice& dev, const std::array<uint8_t, 16>& volume_uuid,
                                const std::array<uint8_t, 16>& device_uuid, uint64_t joined_ns);
// Empty: no label (a volume of one device, or not plyfs). EUCLEAN: a label
// whose checksum is wrong.
Result<std::optional<DeviceLabelInfo>> read_device_label(BlockDevice& dev);

// Where each device of a new volume lies in its block space
// (format.md#device-table): the first at block 0, every other at the first
// group boundary after the one before. Returns {first_block, nblocks} each.
std::vector<std::pair<uint64_t, uint64_t>> plan_devices(const std::vector<uint64_t>& device_bytes,
                                                        uint32_t block_size);

// The newest valid superblock of one device of a set, read on its own
// (before the set is assembled): where its device table comes from.
Result<SuperInfo> member_superblock(BlockDevice& dev);
// Both valid ones, the newest first.
Result<std::vector<SuperInfo>> member_superblocks(BlockDevice& dev);

// Opens the volume at `path`. A device without a label is a volume of one
// device and comes back as open_device() gives it. A device of a
// multi-device volume comes back as a DeviceSet of every device of its
// table, found among `others`: paths of devices, or directories whose
// files and block devices are scanned for the volume's labels. A device
// missing from the table is ENODEV; a given device of another volume, or not
// in this volume's table, EINVAL; all with what to do in the message.
Result<std::unique_ptr<BlockDevice>> open_volume(const std::string& path,
                                                 const std::vector<std::string>& others,
                                                 FileOpenOptions opts = {});

std::string uuid_text(const std::array<uint8_t, 16>& u);

// A class name (format.md#device-table): 1 to 15 bytes of a-z 0-9 _ -.
bool valid_class_name(const std::string& name);

// The superblock of the volume `sb` with `dev` joined as its last device
// (format.md#device-add): at the first group boundary past the end, of
// class `cls` (one of the volume's, or a new one, then the slowest), a new
// uuid, the reserve grown. EINVAL: too small, a device of the volume
// already, of another volume (unless `force`), or 32 devices or 8 classes
// already; EOPNOTSUPP: a volume of one device.
Result<SuperInfo> plan_device_add(const SuperInfo& sb, BlockDevice& dev, const std::string& name,
                                  const std::string& cls, bool force);
// Step 1 of an add: `dev` gets the superblock slots of `from` (a device of
// the volume) byte for byte, then the label of next's last device, flushed.
Result<void> join_device(BlockDevice& from, BlockDevice& dev, const SuperInfo& next);
// A device that left the volume (format.md#device-remove): its reserved
// area (label and superblock slots) zeroed and flushed, so that nothing
// takes it for a device of the volume, or for a volume, again.
Result<void> wipe_device(BlockDevice& dev);

class DeviceSet;
// A volume of one device held as a set of that device alone, its first
// `bytes` (0: all of it), named `name` as device_display_name() shows it:
// how a read-write mount holds such a volume so that it can take a second
// device (format.md#device-convert), and what make_multi_device returns.
Result<std::unique_ptr<DeviceSet>> one_device_set(std::unique_ptr<BlockDevice> dev, const std::string& name,
                                                  uint64_t bytes = 0);
// plyctl device add on a volume of one device, offline
// (format.md#device-convert): `dev` (the volume's device, not open
// otherwise) gets a label, then two generations with MULTI_DEVICE and a
// table of that one device, of class `cls`. Returns the set of that one
// device, ready for add_device. A crash leaves a volume of one device
// (the label unused) or the converted one. EINVAL: a volume of several
// devices already, or a bad class name.
Result<std::unique_ptr<DeviceSet>> make_multi_device(std::unique_ptr<BlockDevice> dev, const std::string& name,
                                                     const std::string& cls);
// plyctl device add, offline (format.md#device-add): `dev` joins the volume
// on `set` (as open_volume assembled it; the volume is not open) as its last
// device, of class `cls` (one of the volume's, or a new one, then the
// slowest), at the first group boundary past the volume's end. Two
// generations that change nothing but the device table, written to every
// device: a crash leaves the volume with the device or without it, and
// without it the device is simply not in the table. Returns the new set.
// EINVAL: the device is too small, a device of the volume already, or of
// another volume (unless `force`); EOPNOTSUPP: a volume of one device.
Result<std::unique_ptr<DeviceSet>> add_device(std::unique_ptr<DeviceSet> set, std::unique_ptr<BlockDevice> dev,
                                              const std::string& name, const std::string& cls, bool force);

}  // namespace plyfs
