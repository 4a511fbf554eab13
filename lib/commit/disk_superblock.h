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

struct Superblock {        // format.md#superblock
  SuperSector0 s0;
  SuperSectorN s[6];
  SuperSector7 s7;
};
static_assert(sizeof(Superblock) == kSuperSize);
static_assert(std::is_trivially_copyable_v<Superblock>);

}  // namespace plyfs::disk
