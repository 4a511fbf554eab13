// What the parts of the filesystem-object layer (fs.h, fs*.cpp) share: the
// context of one operation, Filesystem::Ctx, with its item helpers
// (format.md#fs-tree), and the bounds and small helpers the operations use.
// Private to lib/fs: nothing outside it includes this header.
#pragma once

#include <dirent.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fs/disk_fs.h"
#include "fs/fs.h"
#include "fs/items.h"

namespace plyfs {

using disk::ItemType;
using namespace fsitems;

using disk::kOffMask;
using disk::kInodeInline;
using disk::kInodeOpaque;
using disk::kDtWhiteout;
inline constexpr uint32_t kMaxLinks = 65000;
// Blocks one tree operation may allocate: a generous bound on
// BTree::max_new_nodes() for trees up to 8 levels, reserved up front so that
// a multi-item operation cannot run out of space halfway.
inline constexpr uint64_t kOpBlocks = 20;
inline constexpr size_t kPunchBatch = 512;   // extent items removed per transaction
// Items of an object freed with its last name, in that transaction (an
// empty file has 1, a small one with xattrs a few); larger objects go
// through the orphan list. Its reservation covers shadowing that many
// leaves along with the name's.
inline constexpr size_t kFreeNow = 16;

// The coarse clock, as the kernel's own filesystems use (current_time()):
// with the writeback cache the kernel compares a file's times with its
// coarse clock on every write, and a finer time from us would look
// different and cost a SETATTR round trip per new file.
inline timespec now() {
  timespec t;
  clock_gettime(CLOCK_REALTIME_COARSE, &t);
  return t;
}

inline uint8_t dt_of(uint32_t mode) { return uint8_t(IFTODT(mode)); }

inline std::span<const std::byte> bytes_of(const void* p, size_t n) {
  return {static_cast<const std::byte*>(p), n};
}

// The part [from, to) of an extent, as its own item.
inline Ext slice(const Ext& e, uint64_t from, uint64_t to) {
  Ext s = e;
  s.file_blk = from;
  s.offset = e.offset + (from - e.file_blk);
  s.nblocks = uint32_t(to - from);
  // A compressed item keeps the whole frame's checksums (format.md#fs-compress).
  if (!e.prealloc() && !e.compressed())
    s.csums.assign(e.csums.begin() + long(from - e.file_blk),
                   e.csums.begin() + long(to - e.file_blk));
  return s;
}

inline Result<void> check_name(std::string_view name) {
  if (name.empty()) return Error::io(ENOENT, "empty name");
  if (name.size() > 255) return Error::io(ENAMETOOLONG, "name longer than 255 bytes");
  if (name.find('/') != std::string_view::npos || name == "." || name == "..")
    return Error::invalid("name contains '/' or is . or ..");
  return ok();
}

// One operation: a Txn on the filesystem's tree, with item helpers. The
// caller holds the tree lock as the operation needs.
struct Filesystem::Ctx {
  Filesystem& fs;
  Volume::Txn t;

  Result<Rec> inode(uint64_t ino) {
    auto v = PLY_TRY(t.get(fs.tree_, ikey(ino, ItemType::Inode)));
    if (!v) return Error::io(ENOENT, "no inode " + std::to_string(ino));
    return decode_inode(ino, *v);
  }
  Result<void> put_inode(const Rec& r) {
    return t.put(fs.tree_, ikey(r.a.ino, ItemType::Inode), encode_inode(r));
  }
  Result<Rec> dir(uint64_t ino) {
    Rec r = PLY_TRY(inode(ino));
    if (!S_ISDIR(r.a.mode)) return Error::io(ENOTDIR, "not a directory");
    return r;
  }

  // Every item of object `ino` in `tree` but its inode and a directory's
  // entries: xattrs (with out-of-line values' chunks), inline data and
  // extents (for a copy between trees). Large files and large xattrs: it
  // reserves as it goes, by items and by bytes, so that a copy fails
  // cleanly with ENOSPC rather than halfway through a tree update.
  using Items = std::vector<std::pair<Key, std::vector<std::byte>>>;
  Result<Items> object_items(TreeId tree, uint64_t ino) {
    Items out;
    std::optional<Error> err;
    uint64_t bytes = 0;
    PLY_CHECK(t.scan(tree, Key{ino, 0}, Key{ino, ~0ull}, [&](Key k, std::span<const std::byte> v) {
      if (type_of(k) == ItemType::Inode || type_of(k) == ItemType::Dirent) return true;
      out.emplace_back(k, std::vector<std::byte>(v.begin(), v.end()));
      bytes += v.size();
      if (out.size() % 256 == 0 || bytes >= 8ull * fs.bs_) {
        bytes = 0;
        if (auto rr = t.reserve(2 * kOpBlocks); !rr) {
          err = rr.error();
          return false;
        }
      }
      return true;
    }));
    if (err) return *err;
    return out;
  }
  // Removes every item of object `ino` (dereferencing its extents) if it
  // has at most kFreeNow of them: a file freed with its last name, in the
  // same generation. False, with nothing changed, for a larger one, which
  // goes through the orphan list instead (format.md#fs-orphan).
  Result<bool> erase_small_object(uint64_t ino) {
    std::vector<std::pair<Key, uint64_t>> items;  // key, extent start (0: none)
    bool small = true;
    PLY_CHECK(t.scan(fs.tree_, Key{ino, 0}, Key{ino, ~0ull}, [&](Key k, std::span<const std::byte> v) {
      if (items.size() == kFreeNow) return small = false;
      uint64_t ext = 0;
      if (type_of(k) == ItemType::Extent && v.size() >= sizeof(disk::Extent))
        ext = view_as<disk::Extent>(v)->disk_start.get();
      items.emplace_back(k, ext);
      return true;
    }));
    if (!small) return false;
    for (auto& [k, ext] : items) {
      (void)PLY_TRY(t.erase(fs.tree_, k));
      if (ext) PLY_CHECK(t.dec_extent(BlockNo{ext}));
    }
    return true;
  }

  // Puts items of another tree's object into this one; their space extents
  // gain a reference (the blocks are shared, not copied).
  Result<void> take_items(const Items& items) {
    for (const auto& [k, v] : items) {
      if (type_of(k) == ItemType::Extent) {
        Ext e = PLY_TRY(decode_extent(k, v));
        if (e.disk_start) PLY_CHECK(t.inc_extent(BlockNo{e.disk_start}));
      }
      PLY_CHECK(t.put(fs.tree_, k, v));
    }
    return ok();
  }

  Result<std::vector<DirentRec>> bucket(uint64_t dir, uint64_t h) {
    Key k = ikey(dir, ItemType::Dirent, h);
    auto v = PLY_TRY(t.get(fs.tree_, k));
    if (!v) return std::vector<DirentRec>{};
    return decode_dirents(k, *v);
  }
  Result<std::optional<DirentRec>> find(uint64_t dir, std::string_view name) {
    auto b = PLY_TRY(bucket(dir, name_hash(name)));
    for (auto& e : b)
      if (e.name == name) return std::optional<DirentRec>(std::move(e));
    return std::optional<DirentRec>{};
  }
  Result<void> add_entry(uint64_t dir, std::string_view name, uint64_t ino, uint8_t type) {
    const uint64_t h = name_hash(name);
    auto b = PLY_TRY(bucket(dir, h));
    bool used[128] = {};
    for (const auto& e : b) {
      if (e.name == name) return Error::io(EEXIST, "name exists");
      used[e.seq] = true;
    }
    uint8_t seq = 0;
    while (seq < 128 && used[seq]) seq++;
    if (seq == 128) return Error::no_space("too many names with one hash");
    b.push_back({ino, type, seq, std::string(name)});
    auto v = encode_dirents(b);
    if (v.size() > BTree::max_value_len(fs.bs_))
      return Error::no_space("names colliding in one hash do not fit an item");
    return t.put(fs.tree_, ikey(dir, ItemType::Dirent, h), v);
  }
  // Replaces the target of an existing entry.
  Result<void> retarget(uint64_t dir, std::string_view name, uint64_t ino, uint8_t type) {
    const uint64_t h = name_hash(name);
    auto b = PLY_TRY(bucket(dir, h));
    for (auto& e : b)
      if (e.name == name) {
        e.ino = ino;
        e.type = type;
        return t.put(fs.tree_, ikey(dir, ItemType::Dirent, h), encode_dirents(b));
      }
    return Error::io(ENOENT, "no such entry");
  }
  Result<void> remove_entry(uint64_t dir, std::string_view name) {
    const uint64_t h = name_hash(name);
    auto b = PLY_TRY(bucket(dir, h));
    auto it = std::find_if(b.begin(), b.end(), [&](auto& e) { return e.name == name; });
    if (it == b.end()) return Error::io(ENOENT, "no such entry");
    b.erase(it);
    if (b.empty()) {
      (void)PLY_TRY(t.erase(fs.tree_, ikey(dir, ItemType::Dirent, h)));
      return ok();
    }
    return t.put(fs.tree_, ikey(dir, ItemType::Dirent, h), encode_dirents(b));
  }
  // Whiteouts do not count: a directory holding only whiteouts is empty,
  // and removing it removes them (they are items of the directory).
  Result<bool> dir_empty(uint64_t dir) {
    bool empty = true;
    std::optional<Error> err;
    PLY_CHECK(t.scan(fs.tree_, ikey(dir, ItemType::Dirent, 0), ikey(dir, ItemType::Dirent, kOffMask),
                     [&](Key k, std::span<const std::byte> v) {
                       auto es = decode_dirents(k, v);
                       if (!es) {
                         err = es.error();
                         return false;
                       }
                       for (const auto& e : *es)
                         if (e.type != kDtWhiteout) return empty = false;
                       return true;
                     }));
    if (err) return *err;
    return empty;
  }
  // The live entry of `name`: a whiteout counts as none.
  Result<std::optional<DirentRec>> find_live(uint64_t dir, std::string_view name) {
    auto e = PLY_TRY(find(dir, name));
    if (e && e->type == kDtWhiteout) return std::optional<DirentRec>{};
    return e;
  }
  // Adds an entry where `name` is free or a whiteout; true if it was a whiteout.
  Result<bool> add_over_whiteout(uint64_t dir, std::string_view name, uint64_t ino, uint8_t type) {
    auto e = PLY_TRY(find(dir, name));
    if (e && e->type != kDtWhiteout) return Error::io(EEXIST, "name exists (not a whiteout)");
    if (e) {
      PLY_CHECK(retarget(dir, name, ino, type));
      return true;
    }
    PLY_CHECK(add_entry(dir, name, ino, type));
    return false;
  }

  // Extent items overlapping file blocks [from, to), in order. Items are at
  // most kMaxExtentBlocks long, so the scan starts that far back.
  Result<std::vector<Ext>> extents(uint64_t ino, uint64_t from, uint64_t to, size_t limit = ~size_t{0}) {
    std::vector<Ext> out;
    if (to <= from) return out;
    uint64_t s = from >= disk::kMaxExtentBlocks ? from - disk::kMaxExtentBlocks + 1 : 0;
    std::optional<Error> err;
    PLY_CHECK(t.scan(fs.tree_, ikey(ino, ItemType::Extent, s),
                     ikey(ino, ItemType::Extent, std::min<uint64_t>(to - 1, kOffMask)),
                     [&](Key k, std::span<const std::byte> v) {
                       auto e = decode_extent(k, v);
                       if (!e) {
                         err = e.error();
                         return false;
                       }
                       if (e->end() > from) out.push_back(std::move(*e));
                       return out.size() < limit;
                     }));
    if (err) return *err;
    return out;
  }
  Result<void> put_extent(uint64_t ino, const Ext& e) {
    return t.put(fs.tree_, ikey(ino, ItemType::Extent, e.file_blk), encode_extent(e));
  }
  // Unmaps file blocks [from, to), splitting items at the edges. Returns
  // false when it stopped after `limit` items with more left. Counts the
  // blocks unmapped into `delta`.
  Result<bool> punch(uint64_t ino, uint64_t from, uint64_t to, int64_t& delta,
                     size_t limit = ~size_t{0}) {
    auto es = PLY_TRY(extents(ino, from, to, limit == ~size_t{0} ? limit : limit + 1));
    bool done = es.size() <= limit;
    if (!done) es.resize(limit);
    for (const Ext& e : es) {
      uint64_t a = std::max(from, e.file_blk), b = std::min(to, e.end());
      (void)PLY_TRY(t.erase(fs.tree_, ikey(ino, ItemType::Extent, e.file_blk)));
      if (e.file_blk < a) {
        PLY_CHECK(put_extent(ino, slice(e, e.file_blk, a)));
        PLY_CHECK(t.inc_extent(BlockNo{e.disk_start}));
      }
      if (b < e.end()) {
        PLY_CHECK(put_extent(ino, slice(e, b, e.end())));
        PLY_CHECK(t.inc_extent(BlockNo{e.disk_start}));
      }
      PLY_CHECK(t.dec_extent(BlockNo{e.disk_start}));
      delta -= int64_t(b - a);
    }
    return done;
  }

  Result<std::vector<std::byte>> inline_data(uint64_t ino, uint64_t size) {
    // Inline data is small by construction (format.md#fs-inline): a larger
    // size is damage, not a reason to allocate it.
    if (size > std::max(disk::kInlineMax, disk::kSymlinkMax))
      return Error::corrupt(Error::kNoBlock, "inode " + std::to_string(ino) + " keeps " +
                                                 std::to_string(size) + " bytes inline");
    std::vector<std::byte> out(size);
    std::optional<Error> err;
    PLY_CHECK(t.scan(fs.tree_, ikey(ino, ItemType::Inline, 0), ikey(ino, ItemType::Inline, kOffMask),
                     [&](Key k, std::span<const std::byte> v) {
                       uint64_t o = off_of(k);
                       if (o % disk::kInlineChunk || v.size() > disk::kInlineChunk) {
                         err = Error::corrupt(Error::kNoBlock, "bad inline chunk in inode " +
                                                                   std::to_string(ino));
                         return false;
                       }
                       if (o < size)
                         std::memcpy(out.data() + o, v.data(), std::min<uint64_t>(v.size(), size - o));
                       return true;
                     }));
    if (err) return *err;
    return out;
  }
  // Extended attributes (format.md#fs-xattr). The records of one name hash
  // share an Xattr item; a value too large for it lives out of line in
  // XattrValue chunks that the record's value id finds.
  static XattrRec xattr_rec(std::string_view name, std::span<const std::byte> value) {
    XattrRec x;
    x.name = std::string(name);
    x.value.assign(value.begin(), value.end());
    return x;
  }
  Result<std::vector<XattrRec>> xattr_item(uint64_t ino, uint64_t h) {
    Key k = ikey(ino, ItemType::Xattr, h);
    auto v = PLY_TRY(t.get(fs.tree_, k));
    if (!v) return std::vector<XattrRec>{};
    return decode_xattrs(k, *v);
  }
  // A record's value: its bytes, or its chunks read back. The chunks must
  // cover [0, length) exactly, in order; anything else is damage.
  Result<std::vector<std::byte>> xattr_value(uint64_t ino, XattrRec& x) {
    if (!x.outline) return std::move(x.value);
    std::vector<std::byte> out(x.length);
    size_t at = 0;
    bool bad = false;
    PLY_CHECK(t.scan(fs.tree_, xattr_chunk_key(ino, x.value_id, 0),
                     xattr_chunk_key(ino, x.value_id, (1u << disk::kXattrOffsetBits) - 1),
                     [&](Key k, std::span<const std::byte> v) {
                       if (chunk_offset(k) != at || v.empty() || v.size() > out.size() - at) return !(bad = true);
                       std::memcpy(out.data() + at, v.data(), v.size());
                       at += v.size();
                       return true;
                     }));
    if (bad || at != out.size())
      return Error::corrupt(Error::kNoBlock, "the value of xattr \"" + x.name + "\" of inode " +
                                                 std::to_string(ino) + " is not whole");
    return out;
  }
  Result<std::optional<std::vector<std::byte>>> xattr(uint64_t ino, std::string_view name) {
    for (auto& x : PLY_TRY(xattr_item(ino, name_hash(name))))
      if (x.name == name) return std::optional<std::vector<std::byte>>(PLY_TRY(xattr_value(ino, x)));
    return std::optional<std::vector<std::byte>>{};
  }
  // Erases the chunks of out-of-line value `id`.
  Result<void> erase_xattr_chunks(uint64_t ino, uint64_t id) {
    std::vector<Key> keys;
    PLY_CHECK(t.scan(fs.tree_, xattr_chunk_key(ino, id, 0),
                     xattr_chunk_key(ino, id, (1u << disk::kXattrOffsetBits) - 1),
                     [&](Key k, std::span<const std::byte>) {
                       keys.push_back(k);
                       return true;
                     }));
    for (Key k : keys) (void)PLY_TRY(t.erase(fs.tree_, k));
    return ok();
  }
  // Blocks that writing `nbytes` of chunks may allocate: new leaves (a
  // leaf keeps at least a quarter of its capacity, T4) and their parents.
  uint64_t chunk_blocks(uint64_t nbytes) const {
    const uint64_t n = (nbytes + xattr_chunk_len(fs.bs_) - 1) / xattr_chunk_len(fs.bs_);
    return 2 * n + kOpBlocks;
  }
  // Puts the records of one hash's item. Records that fit_xattrs marked
  // pending get a value id and their chunks first; the caller reserved for
  // them (fit). The first value id tried comes from the name's
  // hash; one in use (a collision, or another name of the item) is passed
  // over, and chunk 0 of every value exists, so a probe is one lookup.
  Result<void> put_xattrs(uint64_t ino, uint64_t h, std::vector<XattrRec>& xs) {
    const Key k = ikey(ino, ItemType::Xattr, h);
    if (xs.empty()) return (void)PLY_TRY(t.erase(fs.tree_, k)), ok();
    const uint32_t cl = xattr_chunk_len(fs.bs_);
    for (auto& x : xs) {
      if (!x.outline || x.value.empty()) continue;
      uint64_t id = name_hash(x.name) >> disk::kXattrOffsetBits;
      while (PLY_TRY(t.get(fs.tree_, xattr_chunk_key(ino, id, 0)))) id = (id + 1) % disk::kXattrValueIds;
      for (size_t o = 0; o < x.value.size(); o += cl)
        PLY_CHECK(t.put(fs.tree_, xattr_chunk_key(ino, id, o),
                        std::span(x.value).subspan(o, std::min<size_t>(cl, x.value.size() - o))));
      x.value_id = id;
      x.length = uint32_t(x.value.size());
      x.value.clear();
      t.add_incompat(kIncompatLargeXattr);  // in the generation that first needs it
    }
    return t.put(fs.tree_, k, encode_xattrs(xs));
  }
  // Makes the item fit (fit_xattrs), changing nothing yet: returns the
  // bytes of chunks put_xattrs will write, for the caller to reserve
  // (chunk_blocks) before its first change.
  Result<uint64_t> fit(std::vector<XattrRec>& xs) {
    if (!fit_xattrs(xs, BTree::max_value_len(fs.bs_)))
      return Error::no_space("xattrs colliding in one name hash do not fit an item");
    uint64_t pending = 0;
    for (const auto& x : xs)
      if (x.outline) pending += x.value.size();
    return pending;
  }
  // Replaces the inline chunks by `data`.
  Result<void> set_inline(uint64_t ino, std::span<const std::byte> data, uint64_t old_size) {
    for (uint64_t o = 0; o < std::max<uint64_t>(old_size, data.size()); o += disk::kInlineChunk) {
      if (o >= data.size()) {
        (void)PLY_TRY(t.erase(fs.tree_, ikey(ino, ItemType::Inline, o)));
        continue;
      }
      auto part = data.subspan(o, std::min<uint64_t>(disk::kInlineChunk, data.size() - o));
      bool zero = std::all_of(part.begin(), part.end(), [](std::byte b) { return b == std::byte{0}; });
      if (zero) (void)PLY_TRY(t.erase(fs.tree_, ikey(ino, ItemType::Inline, o)));  // a hole
      else PLY_CHECK(t.put(fs.tree_, ikey(ino, ItemType::Inline, o), part));
    }
    return ok();
  }
};

}  // namespace plyfs
