// Superblock encoding, validation and the choice between the two slots
// (format.md#superblock, format.md#recovery).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "blockdev/blockdev.h"
#include "btree/btree.h"

namespace plyfs {

// Feature flags this build understands (format.md#features). The layer that
// uses a feature sets its bit (Volume::Txn::add_incompat) in the generation
// that first writes what an older reader would misread.
// incompat bit 0: out-of-line xattr values, XattrValue items (lib/fs,
// format.md#fs-xattr).
inline constexpr uint64_t kIncompatLargeXattr = 1ull << 0;
// incompat bit 1: version 4 FsInfo items (128 bytes: branch uuids, the
// SNAPSHOT flag; lib/fs, format.md#fs-info). An older reader refuses a
// version 4 tree, and its fsck would rewrite the item as version 3.
inline constexpr uint64_t kIncompatBranchInfoV4 = 1ull << 1;
// ro_compat bit 0: some branch was held (FsInfo's HELD flag; lib/fs,
// format.md#fs-info). An older build reads such an image correctly, but
// would delete a held branch and clear the flag when it rewrites the item.
inline constexpr uint64_t kRoCompatHeldBranches = 1ull << 0;
inline constexpr uint64_t kCompatKnown = 0;
// Some FsInfo may carry a quota (format.md#quotas): an older build would
// neither enforce it nor keep it when it rewrote the item.
inline constexpr uint64_t kRoCompatBranchQuotas = 1ull << 1;
inline constexpr uint64_t kRoCompatKnown = kRoCompatHeldBranches | kRoCompatBranchQuotas;
// incompat bit 2: zstd-compressed extents, the COMPRESS and NOCOMPRESS
// inode flags and branch compression defaults (lib/fs,
// format.md#fs-compress). An older reader refuses a compressed extent (EIO)
// and its fsck would delete it.
inline constexpr uint64_t kIncompatCompress = 1ull << 2;
// incompat bit 3: several devices (format.md#multi-device): the device
// table in superblock sectors 1..6, device labels, block addresses mapped
// across devices. An older reader would take the first device for the whole
// volume.
inline constexpr uint64_t kIncompatMultiDevice = 1ull << 3;
inline constexpr uint64_t kIncompatKnown =
    kIncompatLargeXattr | kIncompatBranchInfoV4 | kIncompatCompress | kIncompatMultiDevice;
// next_tree_id and next_inode stay below this (format.md#superblock).
inline constexpr uint64_t kCounterLimit = 1ull << 63;
inline constexpr uint32_t kVersionMajor = 1;
inline constexpr uint32_t kVersionMinor = 0;

// One device of a multi-device volume (format.md#device-table).
struct DeviceInfo {
  std::array<uint8_t, 16> uuid{};
  uint64_t first_block = 0;  // its first block in the volume's block space
  uint64_t nblocks = 0;      // blocks of it the volume spans
  uint8_t class_id = 0;      // index into SuperInfo::classes
  bool operator==(const DeviceInfo&) const = default;
};

// The superblock in host form.
struct SuperInfo {
  uint32_t version_major = kVersionMajor, version_minor = kVersionMinor;
  uint64_t compat = 0, ro_compat = 0, incompat = 0;
  std::array<uint8_t, 16> uuid{};
  std::string label;
  uint32_t block_size = 4096;
  uint32_t sector_size = 512;
  uint64_t total_blocks = 0;
  Generation generation;
  uint64_t fs_id = 0;
  RootPtr root_tree, space_tree;
  uint64_t next_tree_id = 0;
  uint64_t next_inode = 0;
  uint64_t first_block = 0;
  uint64_t used_blocks = 0, meta_blocks = 0, data_blocks = 0;
  uint64_t reserve_blocks = 0;
  uint64_t mkfs_time_ns = 0, commit_time_ns = 0;
  // A multi-device volume's device table (kIncompatMultiDevice); all empty
  // for a volume of one device. Class 0 is the fastest.
  std::vector<std::string> classes;
  uint32_t meta_class = 0;
  std::vector<DeviceInfo> devices;
};

bool is_multi_device(const SuperInfo& s);

std::vector<std::byte> encode_superblock(const SuperInfo& s);

enum class SlotState {
  Valid,
  Empty,        // all zero: never written (or wiped)
  Foreign,      // no plyfs magic
  Torn,         // the sectors carry different generations
  BadChecksum,
  BadFields,    // checksum good, but a field is out of range
  Unsupported,  // a version this build cannot read
  Unreadable,   // the device returned an error
};
const char* slot_state_name(SlotState s);

struct SlotReport {
  SlotState state = SlotState::Unreadable;
  std::string detail;      // why, for a state other than Valid
  int torn_sector = -1;    // Torn: the first sector whose stamp differs
  std::optional<SuperInfo> info;  // Valid
};

// Decodes one slot's 4096 bytes read from byte offset kSuperOffset[slot].
// `device_bytes` is the size of what the volume spans: the device, or the
// whole device set (~0 for one member read before its set is assembled).
SlotReport decode_superblock(std::span<const std::byte> bytes, int slot, uint64_t device_bytes);

struct SuperChoice {
  SuperInfo info;
  int slot = 0;
  bool fell_back = false;  // the other slot is damaged (torn, corrupt): a commit was cut short
  SlotReport reports[2];
};
// Reads both slots and picks the valid one with the higher generation. On a
// DeviceSet (format.md#multi-device-recovery): both slots of every member,
// and the newest generation whose superblock every member holds, byte for
// byte; the reports are the first member's, and fell_back says that some
// member holds a newer or damaged copy.
// trust_torn is a planted bug for the crash harness's self-test (it accepts
// a slot whose stamps or checksum are wrong); never set it otherwise.
Result<SuperChoice> read_superblocks(BlockDevice& dev, bool trust_torn = false);

}  // namespace plyfs
