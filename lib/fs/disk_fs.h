// On-disk items of a filesystem tree, tree kind 2 (format.md#fs-tree).
//
// Key: hi = object id (an inode number; 0 for the tree's own items),
//      lo = item type << 56 | offset (56 bits, meaning per type).
#pragma once

#include <cstdint>
#include <type_traits>

#include "util/endian.h"

namespace plyfs::disk {

inline constexpr uint8_t kKindFs = 2;

enum class ItemType : uint8_t {
  FsInfo = 0x00,  // object 0, offset 0: FsInfo
  Inode = 0x01,   // offset 0: Inode
  Dirent = 0x02,  // offset = name hash (56 bits, never 0): Dirent records
  Xattr = 0x03,   // offset = name hash: XattrEntry records
  Inline = 0x04,  // offset = byte offset of the chunk: raw bytes
  Extent = 0x05,  // offset = file block: Extent
  Orphan = 0x06,  // object 0, offset = inode number: empty value
  // offset = value id << 16 | byte offset: a chunk of an out-of-line xattr
  // value (format.md#fs-xattr)
  XattrValue = 0x07,
};

inline constexpr uint64_t kOffMask = (1ull << 56) - 1;  // the offset part of a key's lo

inline constexpr uint32_t kFsMagic = 0x53464c50;  // "PLFS"
// Version 2 adds whiteout entries, opaque directories and the branch fields
// of FsInfo (format.md#fs-union); version 3 the DOOMED branch flag
// (format.md#snapshots); version 4 the 128-byte FsInfo with the branch's
// uuid and the SNAPSHOT flag (format.md#fs-info), under the superblock's
// BRANCH_INFO_V4 incompat bit. Older trees are read as the current version
// (they hold none of it) and rewritten so when their info is next written.
inline constexpr uint32_t kFsVersion = 4;
inline constexpr uint32_t kFsVersionMin = 1;

// FsInfo.branch_flags
inline constexpr uint32_t kBranchReadOnly = 1;  // never changed, even in a rw view
// A tree no view may show and the next read-write open drops: the scratch
// copy of an unfinished merge or rollback, or a branch a finished one
// replaced (format.md#snapshots).
inline constexpr uint32_t kBranchDoomed = 2;
// Version 4: a snapshot, an O(1) clone of the branch its root record's
// cloned_from names, taken by `snapshot` (format.md#snapshots).
inline constexpr uint32_t kBranchSnapshot = 4;
// Held (plyctl hold, zfs hold): no delete, merge or automatic retention may
// make the branch go away until it is released. Written only under the
// superblock's HELD_BRANCHES ro_compat bit, so that an older build, which
// would delete the branch and drop the bit when it rewrites the item, only
// reads the image (format.md#features, format.md#snapshots).
inline constexpr uint32_t kBranchHeld = 8;
inline constexpr uint32_t kBranchFlagsKnown = kBranchReadOnly | kBranchDoomed | kBranchSnapshot | kBranchHeld;

// Versions 1-3 store the first 72 bytes only; version 4 all 128.
struct FsInfo {
  le32 magic;
  le32 version;
  le64 root_ino;     // the root directory
  le64 created_ns;   // creation time
  uint8_t name[32];  // branch name, NUL-padded
  le64 parent;       // tree id of the branch this one was created from or layered on; 0: none
  le32 branch_flags; // kBranch*
  le32 reserved;
  uint8_t uuid[16];           // version 4: the branch's identity (random); all zero: none
  uint8_t received_uuid[16];  // version 4: the uuid of the branch a receive copied; zero otherwise
  // Version 4, under the BRANCH_QUOTAS ro_compat bit: the most bytes the
  // branch may reference, and hold exclusively; 0: no limit
  // (format.md#quotas).
  le64 quota_referenced;
  le64 quota_exclusive;
  // Under the COMPRESS incompat bit: the branch's compression default
  // (format.md#fs-compress): 0 none given, 1 none, 2 zstd at
  // compress_level (0: the default level, 3).
  uint8_t compress;
  uint8_t compress_level;
  uint8_t reserved2[6];
};
static_assert(sizeof(FsInfo) == 128);
inline constexpr size_t kFsInfoV3Size = 72;

struct Timespec {
  le64 sec;   // seconds since the epoch (two's complement)
  le32 nsec;  // < 1e9
  le32 reserved;
};
static_assert(sizeof(Timespec) == 16);

inline constexpr uint32_t kInodeInline = 1;  // Inode.flags: the data is in Inline items
inline constexpr uint32_t kInodeOpaque = 2;  // Inode.flags: a directory that hides the
                                             // same directory of the branches below it
// Inode.flags under the COMPRESS incompat bit (format.md#fs-compress): the
// file's data is compressed (chattr +c, FS_COMPR_FL) or never is (chattr
// +m, FS_NOCOMP_FL); a directory passes them to what is created in it.
inline constexpr uint32_t kInodeCompress = 4;
inline constexpr uint32_t kInodeNoCompress = 8;
inline constexpr uint32_t kInodeFlagsKnown = kInodeInline | kInodeOpaque | kInodeCompress | kInodeNoCompress;

// Dirent.type of a whiteout: the name is deleted in the union (it hides the
// name in the branches below); Dirent.ino is 0 and no inode exists.
inline constexpr uint8_t kDtWhiteout = 14;  // DT_WHT

struct Inode {
  le32 mode;        // type and permission bits, as st_mode
  le32 uid, gid;
  le32 nlink;
  le64 size;        // bytes
  le64 blocks;      // 512-byte units mapped by this inode's extents
  le64 rdev;        // device number of a device node
  le64 parent;      // a directory's parent (the root: itself); 0 otherwise
  le64 generation;  // the generation the inode was created in
  le32 flags;       // kInodeInline, or 0
  le32 reserved0;
  Timespec atime, mtime, ctime, btime;
};
static_assert(sizeof(Inode) == 128);

// One directory entry inside a Dirent item (entries with equal name hashes
// share the item). The 63-bit readdir cookie is hash << 7 | seq.
struct Dirent {
  le64 ino;
  uint8_t type;      // DT_* of the target
  uint8_t seq;       // < 128, unique in the item, kept for the entry's life
  uint8_t name_len;  // 1..255
  uint8_t reserved;
  // name_len bytes of name follow
};
static_assert(sizeof(Dirent) == 12);

struct XattrEntry {
  uint8_t name_len;  // 1..255, the full name with its namespace prefix
  uint8_t flags;     // kXattrOutline, or 0 (a reserved byte before large xattrs)
  le16 value_len;    // bytes after the name: the value, or sizeof(XattrOutline)
  // name, then value (or an XattrOutline)
};
static_assert(sizeof(XattrEntry) == 4);

// XattrEntry.flags: the value is out of line, in XattrValue items; an
// XattrOutline follows the name. Set only when the records of one name hash
// would not fit one B-tree value otherwise; images holding one carry the
// superblock's LARGE_XATTR incompat bit (format.md#fs-xattr).
inline constexpr uint8_t kXattrOutline = 1;

struct XattrOutline {
  le64 value_id;  // < 2^40: its chunks are the XattrValue items (ino, value_id << 16 | offset)
  le32 length;    // the value's length, 1..kXattrSizeMax
  le32 reserved;
};
static_assert(sizeof(XattrOutline) == 16);
static_assert(std::is_trivially_copyable_v<XattrOutline>);

inline constexpr uint32_t kXattrSizeMax = 65536;   // Linux's XATTR_SIZE_MAX
inline constexpr unsigned kXattrOffsetBits = 16;   // a chunk's byte offset in its key
inline constexpr uint64_t kXattrValueIds = 1ull << (56 - kXattrOffsetBits);
static_assert(kXattrSizeMax - 1 < (1u << kXattrOffsetBits));

inline constexpr uint8_t kExtentPrealloc = 1;  // flags: allocated, reads as zeros
inline constexpr uint8_t kCompressNone = 0;
inline constexpr uint8_t kCompressZstd = 1;  // under the COMPRESS incompat bit

// What follows a compressed Extent (compression != 0) before its checksums
// (format.md#fs-compress): the frame's stored length and the blocks it
// decompresses to. The checksums, disk_nblocks of them, cover the stored
// blocks, so that a scrub verifies without decompressing.
struct ExtentFrame {
  le32 frame_bytes;  // the zstd frame's length; in ((disk_nblocks - 1) * bs, disk_nblocks * bs]
  le32 ram_blocks;   // blocks of data it decodes to, 2..kMaxExtentBlocks; offset + nblocks <= this
};
static_assert(sizeof(ExtentFrame) == 8);
static_assert(std::is_trivially_copyable_v<ExtentFrame>);

// Maps nblocks file blocks starting at the key's offset to blocks
// [disk_start + offset, +nblocks) of the space extent at disk_start.
struct Extent {
  le64 disk_start;    // the referenced space extent (its space-tree key)
  le64 disk_nblocks;  // that space extent's length
  le64 offset;        // first block used, relative to disk_start
  le32 nblocks;       // 1..kMaxExtentBlocks
  uint8_t compression;
  uint8_t flags;
  le16 reserved;
  // unless prealloc: nblocks le64 XXH3-64 checksums, one per block
};
static_assert(sizeof(Extent) == 32);
static_assert(std::is_trivially_copyable_v<Extent>);

inline constexpr uint32_t kMaxExtentBlocks = 64;
inline constexpr uint32_t kInlineChunk = 512;    // bytes per Inline item
inline constexpr uint32_t kInlineMax = 2048;     // largest inline regular file
inline constexpr uint32_t kSymlinkMax = 4095;

}  // namespace plyfs::disk
