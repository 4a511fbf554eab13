// On-disk superblock (format.md#superblock). Two copies, at fixed offsets,
// written alternately; the generation is stamped at the end of every 512-byte
// sector so that a torn write shows even before the checksum is computed.
#pragma once

#include <type_traits>

#include "util/endian.h"

namespace plyfs::disk {

inline constexpr uint8_t kSuperMagic[8] = {'P', 'L', 'Y', 'F', 'S', 'S', 'B', '1'};
inline constexpr uint64_t kSuperSize = 4096;
inline constexpr uint64_t kSuperOffset[2] = {64 * 1024, 128 * 1024};
inline constexpr uint64_t kReservedBytes = 192 * 1024;  // [0, 192 KiB): boot area + both slots
inline constexpr uint32_t kStampSector = 512;

struct RootPtr {           // format.md#root-pointer
  le64 block;
  le64 generation;         // the root node's header generation
  uint8_t level;
  uint8_t reserved[7];
};
static_assert(sizeof(RootPtr) == 24);

struct SuperSector0 {      // bytes 0..511
  uint8_t magic[8];        // kSuperMagic
  le32 version_major;      // 1
  le32 version_minor;      // 0
  le64 compat;             // features an older reader may ignore
  le64 ro_compat;          // features an older reader may only read
  le64 incompat;           // features an older reader must refuse
  uint8_t uuid[16];
  uint8_t label[64];       // UTF-8, NUL-padded
  le32 block_size;         // 4096..65536, a power of two
  le32 sector_size;        // the device's logical sector size at mkfs
  le64 total_blocks;       // blocks the filesystem spans
  le64 generation;         // this commit's generation
  le32 slot;               // generation % 2
  le32 flags;              // none defined; 0
  le64 fs_id;              // XXH3-64 of the uuid, stamped in every node
  RootPtr root_tree;       // the tree of trees (format.md#root-tree)
  RootPtr space_tree;      // extents and references (format.md#space)
  le64 next_tree_id;       // the next tree id to hand out
  le64 next_inode;         // the next inode number to hand out
  le64 first_block;        // first block after the reserved area
  le64 used_blocks;        // A4: sum of all space item lengths
  le64 meta_blocks;
  le64 data_blocks;
  le64 reserve_blocks;     // kept for deletions and commits (A5)
  le64 mkfs_time_ns;       // CLOCK_REALTIME
  le64 commit_time_ns;
  uint8_t reserved[224];   // 0
  le64 stamp;              // = generation
};
static_assert(sizeof(SuperSector0) == 512);

struct SuperSectorN {      // sectors 1..6
  uint8_t reserved[504];   // 0
  le64 stamp;              // = generation
};
static_assert(sizeof(SuperSectorN) == 512);

struct SuperSector7 {      // bytes 3584..4095
  uint8_t reserved[496];   // 0
  le64 checksum;           // XXH3-64 over bytes [0, 4080)
  le64 stamp;              // = generation
};
static_assert(sizeof(SuperSector7) == 512);

// The device table of a multi-device volume (format.md#device-table,
// incompat MULTI_DEVICE): its header in sector 1, its entries in sectors 2..6,
// seven to a sector. Without the feature these sectors are zero.
inline constexpr uint32_t kMaxDevices = 32;
inline constexpr uint32_t kMaxClasses = 8;
inline constexpr uint32_t kDevicesPerSector = 7;

struct DeviceTableHeader {  // sector 1 (SuperSectorN s[0])
  le32 device_count;        // 1..kMaxDevices
  le32 class_count;         // 1..kMaxClasses
  le32 meta_class;          // the class metadata goes to (format.md#placement)
  le32 reserved0;           // 0
  uint8_t class_names[8][16];  // NUL-padded, [a-z0-9_-], class 0 the fastest
  uint8_t reserved[360];    // 0
  le64 stamp;               // = generation
};
static_assert(sizeof(DeviceTableHeader) == 512);

struct DeviceEntry {        // 64 bytes (format.md#device-table)
  uint8_t uuid[16];         // the device's own uuid (its label's)
  le64 first_block;         // where the device begins in the volume's block space
  le64 nblocks;             // blocks of the device the volume spans
  uint8_t class_id;         // index into class_names
  uint8_t flags;            // none defined; 0
  uint8_t reserved[30];     // 0
};
static_assert(sizeof(DeviceEntry) == 64);

struct DeviceTableSector {  // sectors 2..6
  DeviceEntry entries[kDevicesPerSector];
  uint8_t reserved[56];     // 0
  le64 stamp;               // = generation
};
static_assert(sizeof(DeviceTableSector) == 512);
static_assert(5 * kDevicesPerSector >= kMaxDevices);

// A device's label (format.md#device-label): 512 bytes at byte 32 KiB of
// every device of a multi-device volume, in the boot area before the
// superblock slots. Written once, when the device joins the volume; it says
// which volume and which device this is, so that devices can be found and
// told apart in any order and a device of another volume is refused.
inline constexpr uint8_t kLabelMagic[8] = {'P', 'L', 'Y', 'F', 'S', 'D', 'V', '1'};
inline constexpr uint64_t kLabelOffset = 32 * 1024;
struct DeviceLabel {
  uint8_t magic[8];         // kLabelMagic
  uint8_t volume_uuid[16];  // the superblock's uuid
  uint8_t device_uuid[16];  // this device's entry in the device table
  le64 joined_ns;           // CLOCK_REALTIME when it joined
  uint8_t reserved[456];    // 0
  le64 checksum;            // XXH3-64 over bytes [0, 504)
};
static_assert(sizeof(DeviceLabel) == 512);

struct Superblock {        // format.md#superblock
  SuperSector0 s0;
  SuperSectorN s[6];
  SuperSector7 s7;
};
static_assert(sizeof(Superblock) == kSuperSize);
static_assert(std::is_trivially_copyable_v<Superblock>);

}  // namespace plyfs::disk
