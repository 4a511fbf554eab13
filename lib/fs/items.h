// The items of a filesystem tree in memory: keys, and the codecs of the
// values of format.md#fs-tree. Internal to lib/fs: the filesystem layer
// (fs.cpp) and its checker and repairer (check.cpp) share them, so that a
// repair writes exactly what the layer would.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include "btree/btree.h"
#include "fs/disk_fs.h"
#include "fs/fs.h"
#include "util/checksum.h"

namespace plyfs::fsitems {

using disk::ItemType;
using disk::kInodeInline;
using disk::kInodeOpaque;
using disk::kOffMask;

inline Key ikey(uint64_t obj, ItemType t, uint64_t off = 0) {
  return Key{obj, (uint64_t(t) << 56) | (off & kOffMask)};
}
inline ItemType type_of(Key k) { return ItemType(k.lo >> 56); }
inline uint64_t off_of(Key k) { return k.lo & kOffMask; }

// An FsInfo value as read (format.md#fs-info): versions 1-3 hold its first
// 72 bytes, version 4 all 128. Returns false for any other size, or a size
// that does not match the version; `out` then holds what fits. The magic,
// version range and fields are the caller's to check.
inline bool decode_info(std::span<const std::byte> v, disk::FsInfo& out) {
  out = disk::FsInfo{};
  if (!v.empty()) std::memcpy(&out, v.data(), std::min(v.size(), sizeof out));  // an empty span's data() may be null
  if (v.size() == sizeof(disk::FsInfo)) return out.version.get() >= 4;
  return v.size() == disk::kFsInfoV3Size && out.version.get() < 4;
}

// The branch table's info item (format.md#fs-info; branches.cpp): read and
// checked; written as version 4 (setting BRANCH_INFO_V4); every write of
// one goes through write_info or, for a writer of its own (fsck), is told
// to note_info, so that the index of branch names stays true.
Result<disk::FsInfo> read_info(Volume::Txn& t, TreeId tree);
Result<void> write_info(Volume::Txn& t, TreeId tree, disk::FsInfo fi);
void note_info(Volume::Txn& t, TreeId tree, const disk::FsInfo& fi);

inline uint64_t name_hash(std::string_view n) {
  uint64_t h = xxh3(n.data(), n.size()) & kOffMask;
  return h ? h : 1;
}


// An inode as the layer uses it: the POSIX attributes plus the fields only
// the layer sees.
struct Rec {
  Attr a;
  uint64_t parent = 0;
  uint32_t flags = 0;
  bool is_inline() const { return flags & kInodeInline; }
};

inline void put_ts(disk::Timespec& d, const timespec& t) {
  d.sec.set(uint64_t(t.tv_sec));
  d.nsec.set(uint32_t(t.tv_nsec));
  d.reserved.set(0);
}
inline timespec get_ts(const disk::Timespec& d) {
  return timespec{time_t(d.sec.get()), long(d.nsec.get() % 1000000000)};
}

inline std::vector<std::byte> encode_inode(const Rec& r) {
  std::vector<std::byte> v(sizeof(disk::Inode));
  auto* d = view_as<disk::Inode>(std::span(v));
  d->mode.set(r.a.mode);
  d->uid.set(r.a.uid);
  d->gid.set(r.a.gid);
  d->nlink.set(r.a.nlink);
  d->size.set(r.a.size);
  d->blocks.set(r.a.blocks);
  d->rdev.set(r.a.rdev);
  d->parent.set(r.parent);
  d->generation.set(r.a.generation);
  d->flags.set((r.flags & ~kInodeOpaque) | (r.a.opaque ? kInodeOpaque : 0));
  d->reserved0.set(0);
  put_ts(d->atime, r.a.atime);
  put_ts(d->mtime, r.a.mtime);
  put_ts(d->ctime, r.a.ctime);
  put_ts(d->btime, r.a.btime);
  return v;
}

inline Result<Rec> decode_inode(uint64_t ino, std::span<const std::byte> v) {
  if (v.size() != sizeof(disk::Inode))
    return Error::corrupt(Error::kNoBlock, "inode " + std::to_string(ino) + " item has " +
                                               std::to_string(v.size()) + " bytes, not 128");
  const auto* d = view_as<disk::Inode>(v);
  Rec r;
  r.a.ino = ino;
  r.a.mode = d->mode.get();
  r.a.uid = d->uid.get();
  r.a.gid = d->gid.get();
  r.a.nlink = d->nlink.get();
  r.a.size = d->size.get();
  r.a.blocks = d->blocks.get();
  r.a.rdev = d->rdev.get();
  r.a.generation = d->generation.get();
  r.parent = d->parent.get();
  r.flags = d->flags.get();
  r.a.atime = get_ts(d->atime);
  r.a.mtime = get_ts(d->mtime);
  r.a.ctime = get_ts(d->ctime);
  r.a.btime = get_ts(d->btime);
  r.a.opaque = S_ISDIR(r.a.mode) && (r.flags & kInodeOpaque);
  return r;
}

// A decoded extent item.
struct Ext {
  uint64_t file_blk = 0;  // the key's offset
  uint64_t disk_start = 0, disk_nblocks = 0, offset = 0;
  uint32_t nblocks = 0;
  uint8_t compression = 0, flags = 0;
  // Compressed (format.md#fs-compress): the frame's length in bytes and the
  // blocks it decodes to; `offset` counts decoded blocks.
  uint32_t frame_bytes = 0, ram_blocks = 0;
  // Plain: one per mapped block. Compressed: one per stored block of the
  // frame (disk_nblocks), whatever part the item maps. Prealloc: none.
  std::vector<uint64_t> csums;
  bool prealloc() const { return flags & disk::kExtentPrealloc; }
  bool compressed() const { return compression != disk::kCompressNone; }
  uint64_t end() const { return file_blk + nblocks; }
  // The device blocks the item's checksums cover: what a read or a scrub
  // reads and verifies.
  uint64_t stored_first() const { return compressed() ? disk_start : disk_start + offset; }
  uint64_t stored_count() const { return prealloc() ? 0 : compressed() ? disk_nblocks : nblocks; }
};

// A branch's compression default from its info item (format.md#fs-compress);
// a value this build does not know is no default (fsck reports it).
inline Compression branch_compression(const disk::FsInfo& fi) {
  Compression c;
  if (fi.compress == uint8_t(Compression::Mode::None)) c.mode = Compression::Mode::None;
  if (fi.compress == uint8_t(Compression::Mode::Zstd)) {
    c.mode = Compression::Mode::Zstd;
    c.level = fi.compress_level <= Compression::kMaxLevel ? fi.compress_level : 0;
  }
  return c;
}

inline Result<Ext> decode_extent(Key k, std::span<const std::byte> v) {
  auto bad = [&](const char* why) {
    return Error::corrupt(Error::kNoBlock, "extent item of inode " + std::to_string(k.hi) +
                                               " at block " + std::to_string(off_of(k)) + ": " +
                                               why);
  };
  if (v.size() < sizeof(disk::Extent)) return bad("too short");
  const auto* d = view_as<disk::Extent>(v);
  Ext e;
  e.file_blk = off_of(k);
  e.disk_start = d->disk_start.get();
  e.disk_nblocks = d->disk_nblocks.get();
  e.offset = d->offset.get();
  e.nblocks = d->nblocks.get();
  e.compression = d->compression;
  e.flags = d->flags;
  if (e.nblocks == 0 || e.nblocks > disk::kMaxExtentBlocks) return bad("bad block count");
  if (e.flags & ~disk::kExtentPrealloc) return bad("unknown flags");
  size_t head = sizeof(disk::Extent), ncsums = e.prealloc() ? 0 : e.nblocks;
  if (e.compression == disk::kCompressZstd) {
    // format.md#fs-compress: a frame of disk_nblocks stored blocks that
    // decodes to ram_blocks; the item maps decoded blocks.
    if (e.prealloc()) return bad("compressed and preallocated");
    if (v.size() < head + sizeof(disk::ExtentFrame)) return bad("too short");
    const auto* f = view_as<disk::ExtentFrame>(v, head);
    e.frame_bytes = f->frame_bytes.get();
    e.ram_blocks = f->ram_blocks.get();
    head += sizeof(disk::ExtentFrame);
    if (e.ram_blocks < 2 || e.ram_blocks > disk::kMaxExtentBlocks) return bad("bad frame length");
    if (e.disk_nblocks == 0 || e.disk_nblocks >= e.ram_blocks) return bad("frame stores no fewer blocks");
    if (e.frame_bytes == 0) return bad("empty frame");
    if (e.offset > e.ram_blocks || e.nblocks > e.ram_blocks - e.offset) return bad("maps past its frame");
    ncsums = e.disk_nblocks;
  } else if (e.compression != disk::kCompressNone) {
    return bad("unknown compression");
  } else if (e.offset > e.disk_nblocks || e.nblocks > e.disk_nblocks - e.offset) {
    return bad("maps past its disk extent");
  }
  if (v.size() != head + 8 * ncsums) return bad("wrong size");
  e.csums.resize(ncsums);
  for (size_t i = 0; i < ncsums; i++) e.csums[i] = view_as<le64>(v, head + 8 * i)->get();
  return e;
}

inline std::vector<std::byte> encode_extent(const Ext& e) {
  const size_t head = sizeof(disk::Extent) + (e.compressed() ? sizeof(disk::ExtentFrame) : 0);
  std::vector<std::byte> v(head + 8 * e.csums.size());
  auto* d = view_as<disk::Extent>(std::span(v));
  d->disk_start.set(e.disk_start);
  d->disk_nblocks.set(e.disk_nblocks);
  d->offset.set(e.offset);
  d->nblocks.set(e.nblocks);
  d->compression = e.compression;
  d->flags = e.flags;
  d->reserved.set(0);
  if (e.compressed()) {
    auto* f = view_as<disk::ExtentFrame>(std::span(v), sizeof(disk::Extent));
    f->frame_bytes.set(e.frame_bytes);
    f->ram_blocks.set(e.ram_blocks);
  }
  for (size_t i = 0; i < e.csums.size(); i++) view_as<le64>(std::span(v), head + 8 * i)->set(e.csums[i]);
  return v;
}


struct DirentRec {
  uint64_t ino;
  uint8_t type, seq;
  std::string name;
};

inline Result<std::vector<DirentRec>> decode_dirents(Key k, std::span<const std::byte> v) {
  std::vector<DirentRec> out;
  size_t p = 0;
  while (p < v.size()) {
    if (v.size() - p < sizeof(disk::Dirent))
      return Error::corrupt(Error::kNoBlock, "truncated directory entry in inode " +
                                                 std::to_string(k.hi));
    const auto* d = view_as<disk::Dirent>(v, p);
    size_t n = d->name_len;
    if (n == 0 || v.size() - p - sizeof(disk::Dirent) < n || d->seq >= 128)
      return Error::corrupt(Error::kNoBlock, "bad directory entry in inode " +
                                                 std::to_string(k.hi));
    out.push_back({d->ino.get(), d->type, d->seq,
                   std::string(reinterpret_cast<const char*>(v.data() + p + sizeof(disk::Dirent)), n)});
    p += sizeof(disk::Dirent) + n;
  }
  return out;
}

inline std::vector<std::byte> encode_dirents(const std::vector<DirentRec>& es) {
  std::vector<std::byte> v;
  for (const auto& e : es) {
    size_t p = v.size();
    v.resize(p + sizeof(disk::Dirent) + e.name.size());
    auto* d = view_as<disk::Dirent>(std::span(v), p);
    d->ino.set(e.ino);
    d->type = e.type;
    d->seq = e.seq;
    d->name_len = uint8_t(e.name.size());
    d->reserved = 0;
    std::memcpy(v.data() + p + sizeof(disk::Dirent), e.name.data(), e.name.size());
  }
  return v;
}

// One xattr record (format.md#fs-xattr). An out-of-line record holds no
// bytes of its value here: `length` and `value_id` find its XattrValue
// chunks. A record the layer is about to put out of line (fit_xattrs) is
// `outline` with its bytes still in `value`, until they are written.
struct XattrRec {
  std::string name;
  std::vector<std::byte> value;
  bool outline = false;
  uint64_t value_id = 0;  // outline: its chunks' key base
  uint32_t length = 0;    // outline: the value's length
  uint8_t flags = 0;      // as read, unknown bits included (fsck reports them)
  uint32_t reserved = 0;  // the XattrOutline's, as read
  size_t size() const { return outline && value.empty() ? length : value.size(); }
};

// The record at byte `p` of an Xattr item: its end, or 0 if it is
// malformed (truncated, an empty name, an out-of-line record whose
// XattrOutline is not one). Every length is checked against the item.
inline size_t decode_xattr_at(std::span<const std::byte> v, size_t p, XattrRec* out) {
  if (v.size() - p < sizeof(disk::XattrEntry)) return 0;
  const auto* d = view_as<disk::XattrEntry>(v, p);
  const size_t n = d->name_len, m = d->value_len.get();
  if (n == 0 || v.size() - p - sizeof(disk::XattrEntry) < n + m) return 0;
  const std::byte* base = v.data() + p + sizeof(disk::XattrEntry);
  const bool outline = d->flags & disk::kXattrOutline;
  if (outline) {
    if (m != sizeof(disk::XattrOutline)) return 0;
    const auto* o = view_as<disk::XattrOutline>(v, p + sizeof(disk::XattrEntry) + n);
    if (o->length.get() == 0 || o->length.get() > disk::kXattrSizeMax ||
        o->value_id.get() >= disk::kXattrValueIds)
      return 0;
    if (out) {
      out->value.clear();
      out->value_id = o->value_id.get();
      out->length = o->length.get();
      out->reserved = o->reserved.get();
    }
  } else if (out) {
    out->value.assign(base + n, base + n + m);
    out->value_id = out->length = out->reserved = 0;
  }
  if (out) {
    out->name.assign(reinterpret_cast<const char*>(base), n);
    out->outline = outline;
    out->flags = d->flags;
  }
  return p + sizeof(disk::XattrEntry) + n + m;
}

inline Result<std::vector<XattrRec>> decode_xattrs(Key k, std::span<const std::byte> v) {
  std::vector<XattrRec> out;
  size_t p = 0;
  while (p < v.size()) {
    XattrRec x;
    const size_t next = decode_xattr_at(v, p, &x);
    if (!next) return Error::corrupt(Error::kNoBlock, "bad xattr in inode " + std::to_string(k.hi));
    out.push_back(std::move(x));
    p = next;
  }
  return out;
}

// Bytes one record takes in its item.
inline size_t xattr_record_size(const XattrRec& x) {
  return sizeof(disk::XattrEntry) + x.name.size() + (x.outline ? sizeof(disk::XattrOutline) : x.value.size());
}

// Writes known flags only and zero reserved fields. A pending out-of-line
// record (bytes still in `value`) must have been given its value id.
inline std::vector<std::byte> encode_xattrs(const std::vector<XattrRec>& xs) {
  std::vector<std::byte> v;
  for (const auto& x : xs) {
    size_t p = v.size();
    v.resize(p + xattr_record_size(x));
    auto* d = view_as<disk::XattrEntry>(std::span(v), p);
    d->name_len = uint8_t(x.name.size());
    d->flags = x.outline ? disk::kXattrOutline : 0;
    std::memcpy(v.data() + p + sizeof(disk::XattrEntry), x.name.data(), x.name.size());
    const size_t at = p + sizeof(disk::XattrEntry) + x.name.size();
    if (x.outline) {
      d->value_len.set(uint16_t(sizeof(disk::XattrOutline)));
      auto* o = view_as<disk::XattrOutline>(std::span(v), at);
      o->value_id.set(x.value_id);
      o->length.set(uint32_t(x.size()));
      o->reserved.set(0);
    } else {
      d->value_len.set(uint16_t(x.value.size()));
      if (!x.value.empty()) std::memcpy(v.data() + at, x.value.data(), x.value.size());
    }
  }
  return v;
}

// Chooses which records of one item go out of line so that the item fits
// `max` bytes (one B-tree value): none if it fits as it is, so that what
// fits is stored as before large xattrs existed; else the largest inline
// values first. Marks them pending (outline, bytes kept); false if even
// then the item does not fit (long names colliding in one 56-bit hash).
inline bool fit_xattrs(std::vector<XattrRec>& xs, size_t max) {
  auto total = [&] {
    size_t t = 0;
    for (const auto& x : xs) t += xattr_record_size(x);
    return t;
  };
  for (size_t t = total(); t > max; t = total()) {
    XattrRec* big = nullptr;
    for (auto& x : xs)
      if (!x.outline && x.value.size() > sizeof(disk::XattrOutline) && (!big || x.value.size() > big->value.size()))
        big = &x;
    if (!big) return false;
    big->outline = true;
    big->length = uint32_t(big->value.size());
  }
  return true;
}

// The key of the chunk at byte `off` of out-of-line value `id`.
inline Key xattr_chunk_key(uint64_t ino, uint64_t id, uint64_t off) {
  return ikey(ino, ItemType::XattrValue, id << disk::kXattrOffsetBits | off);
}
inline uint64_t chunk_value_id(Key k) { return off_of(k) >> disk::kXattrOffsetBits; }
inline uint64_t chunk_offset(Key k) { return off_of(k) & ((1ull << disk::kXattrOffsetBits) - 1); }
// Bytes per chunk: one whole B-tree value, so that a leaf holds as many as
// it can (format.md#fs-xattr).
inline uint32_t xattr_chunk_len(uint32_t block_size) { return BTree::max_value_len(block_size); }


}  // namespace plyfs::fsitems
