// The filesystem-object layer (fs.h; items in format.md#fs-tree).
#include "fs/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <cstdio>
#include <cstring>

#include "fs/acl.h"
#include "fs/disk_fs.h"
#include "fs/items.h"
#include "util/checksum.h"

namespace plyfs {

using disk::ItemType;
using namespace fsitems;

namespace {

using disk::kOffMask;
using disk::kInodeInline;
using disk::kInodeOpaque;
using disk::kDtWhiteout;
constexpr uint32_t kMaxLinks = 65000;
// Blocks one tree operation may allocate: a generous bound on
// BTree::max_new_nodes() for trees up to 8 levels, reserved up front so that
// a multi-item operation cannot run out of space halfway.
constexpr uint64_t kOpBlocks = 20;
constexpr size_t kPunchBatch = 512;   // extent items removed per transaction
// Items of an object freed with its last name, in that transaction (an
// empty file has 1, a small one with xattrs a few); larger objects go
// through the orphan list. Its reservation covers shadowing that many
// leaves along with the name's.
constexpr size_t kFreeNow = 16;

// The coarse clock, as the kernel's own filesystems use (current_time()):
// with the writeback cache the kernel compares a file's times with its
// coarse clock on every write, and a finer time from us would look
// different and cost a SETATTR round trip per new file.
timespec now() {
  timespec t;
  clock_gettime(CLOCK_REALTIME_COARSE, &t);
  return t;
}

uint8_t dt_of(uint32_t mode) { return uint8_t(IFTODT(mode)); }

std::span<const std::byte> bytes_of(const void* p, size_t n) {
  return {static_cast<const std::byte*>(p), n};
}

// The part [from, to) of an extent, as its own item.
Ext slice(const Ext& e, uint64_t from, uint64_t to) {
  Ext s = e;
  s.file_blk = from;
  s.offset = e.offset + (from - e.file_blk);
  s.nblocks = uint32_t(to - from);
  if (!e.prealloc())
    s.csums.assign(e.csums.begin() + long(from - e.file_blk),
                   e.csums.begin() + long(to - e.file_blk));
  return s;
}

Result<void> check_name(std::string_view name) {
  if (name.empty()) return Error::io(ENOENT, "empty name");
  if (name.size() > 255) return Error::io(ENAMETOOLONG, "name longer than 255 bytes");
  if (name.find('/') != std::string_view::npos || name == "." || name == "..")
    return Error::invalid("name contains '/' or is . or ..");
  return ok();
}

}  // namespace

ValueRefs fs_value_refs() {
  return [](Key k, std::span<const std::byte> v, std::vector<ExtentRef>& out) {
    if (type_of(k) != ItemType::Extent || k.hi == 0 || v.size() < sizeof(disk::Extent)) return;
    const auto* d = view_as<disk::Extent>(v);
    if (d->disk_start.get() != 0)
      out.push_back(ExtentRef{BlockNo{d->disk_start.get()}, d->disk_nblocks.get()});
  };
}

std::map<uint8_t, ValueRefs> fs_kinds() { return {{disk::kKindFs, fs_value_refs()}}; }

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

// --- creation and opening -------------------------------------------------

Result<TreeId> Filesystem::create(Volume& v, const FsCreateOptions& o) {
  auto t = PLY_TRY(v.begin({.reserve_blocks = 8 * kOpBlocks}));
  return create(t, o);
}

Result<TreeId> Filesystem::create(Volume::Txn& t, const FsCreateOptions& o) {
  TreeId id = PLY_TRY(t.create_tree(disk::kKindFs));
  uint64_t root = t.take_inode_number();
  disk::FsInfo info{};
  info.magic.set(disk::kFsMagic);
  info.version.set(disk::kFsVersion);
  info.root_ino.set(root);
  timespec n = now();
  info.created_ns.set(uint64_t(n.tv_sec) * 1000000000ull + uint64_t(n.tv_nsec));
  if (o.name.empty() || o.name.size() > sizeof info.name)
    return Error::invalid("a branch name has 1 to 32 bytes");
  std::memcpy(info.name, o.name.data(), o.name.size());
  info.parent.set(o.parent.v);
  info.branch_flags.set((o.read_only ? disk::kBranchReadOnly : 0) |
                        (o.doomed ? disk::kBranchDoomed : 0));
  PLY_CHECK(t.put(id, ikey(0, ItemType::FsInfo), bytes_of(&info, sizeof info)));
  Rec r;
  r.a.ino = root;
  r.a.mode = S_IFDIR | (o.root_mode & 07777);
  r.a.uid = o.uid;
  r.a.gid = o.gid;
  r.a.nlink = 2;
  r.a.generation = t.gen().v;
  r.a.atime = r.a.mtime = r.a.ctime = r.a.btime = n;
  r.parent = root;
  PLY_CHECK(t.put(id, ikey(root, ItemType::Inode), encode_inode(r)));
  return id;
}

Result<SuperInfo> format_filesystem(BlockDevice& dev, const FormatOptions& f,
                                    const FsCreateOptions& o) {
  (void)PLY_TRY(Volume::format(dev, f));
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.cache_bytes = 8 << 20;
  auto v = PLY_TRY(Volume::open(dev, vo));
  (void)PLY_TRY(Filesystem::create(*v, o));
  PLY_CHECK(v->close());
  return v->super();
}

Result<TreeId> Filesystem::default_tree(Volume& v) {
  auto t = PLY_TRY(v.begin());
  for (const auto& b : PLY_TRY(branches(t)))
    if (!b.doomed) return b.tree;  // by id; a doomed tree is no branch
  return Error::io(ENOENT, "the image holds no filesystem tree");
}

namespace {
Result<disk::FsInfo> read_info(Volume::Txn& t, TreeId tree) {
  auto info = PLY_TRY(t.tree_info(tree));
  if (info.kind != disk::kKindFs)
    return Error::invalid("tree " + std::to_string(tree.v) + " is not a filesystem tree");
  auto val = PLY_TRY(t.get(tree, ikey(0, ItemType::FsInfo)));
  if (!val || val->size() != sizeof(disk::FsInfo))
    return Error::corrupt(Error::kNoBlock, "filesystem tree without a valid info item");
  disk::FsInfo fi;
  std::memcpy(&fi, val->data(), sizeof fi);
  if (fi.magic.get() != disk::kFsMagic)
    return Error::corrupt(Error::kNoBlock, "filesystem info item has a bad magic number");
  if (fi.version.get() < disk::kFsVersionMin || fi.version.get() > disk::kFsVersion)
    return Error::io(EOPNOTSUPP, "filesystem tree version " + std::to_string(fi.version.get()) +
                                     " is not supported");
  return fi;
}

BranchMeta meta_of(TreeId tree, const disk::FsInfo& fi, Generation created) {
  BranchMeta m;
  m.tree = tree;
  m.name.assign(reinterpret_cast<const char*>(fi.name), strnlen(reinterpret_cast<const char*>(fi.name), sizeof fi.name));
  m.parent = TreeId{fi.parent.get()};
  m.read_only = fi.branch_flags.get() & disk::kBranchReadOnly;
  m.doomed = fi.branch_flags.get() & disk::kBranchDoomed;
  m.root = fi.root_ino.get();
  m.created_ns = fi.created_ns.get();
  m.created = created;
  return m;
}
}  // namespace

Result<BranchMeta> Filesystem::branch(Volume& v, TreeId tree) {
  auto t = PLY_TRY(v.begin());
  return branch(t, tree);
}

Result<BranchMeta> Filesystem::branch(Volume::Txn& t, TreeId tree) {
  auto fi = PLY_TRY(read_info(t, tree));
  return meta_of(tree, fi, PLY_TRY(t.tree_info(tree)).created);
}

Result<std::vector<BranchMeta>> Filesystem::branches(Volume& v) {
  auto t = PLY_TRY(v.begin());
  return branches(t);
}

Result<std::vector<BranchMeta>> Filesystem::branches(Volume::Txn& t) {
  std::vector<BranchMeta> out;
  for (const auto& ti : PLY_TRY(t.list_trees()))
    if (ti.kind == disk::kKindFs) out.push_back(meta_of(ti.id, PLY_TRY(read_info(t, ti.id)), ti.created));
  return out;
}

Result<void> Filesystem::set_branch(Volume& v, const BranchMeta& m) {
  auto t = PLY_TRY(v.begin({.reserve_blocks = 2 * kOpBlocks}));
  return set_branch(t, m);
}

Result<void> Filesystem::set_branch(Volume::Txn& t, const BranchMeta& m) {
  if (m.name.empty() || m.name.size() > 32) return Error::invalid("a branch name has 1 to 32 bytes");
  auto fi = PLY_TRY(read_info(t, m.tree));
  std::memset(fi.name, 0, sizeof fi.name);
  std::memcpy(fi.name, m.name.data(), m.name.size());
  fi.parent.set(m.parent.v);
  fi.branch_flags.set((m.read_only ? disk::kBranchReadOnly : 0) | (m.doomed ? disk::kBranchDoomed : 0));
  fi.version.set(disk::kFsVersion);
  return t.put(m.tree, ikey(0, ItemType::FsInfo), bytes_of(&fi, sizeof fi));
}

Filesystem::Filesystem(Volume& v, TreeId tree, uint64_t root)
    : vol_(v), tree_(tree), root_(root), bs_(v.block_size()) {}

Result<std::unique_ptr<Filesystem>> Filesystem::open(Volume& v, TreeId tree, bool reader) {
  uint64_t root;
  bool old_version;
  {
    auto t = PLY_TRY(v.begin());
    auto fi = PLY_TRY(read_info(t, tree));
    root = fi.root_ino.get();
    old_version = fi.version.get() < disk::kFsVersion;
  }
  if (old_version && !v.read_only() && !reader) PLY_CHECK(set_branch(v, PLY_TRY(branch(v, tree))));
  std::unique_ptr<Filesystem> fs(new Filesystem(v, tree, root));
  {
    auto t = PLY_TRY(v.begin());
    Ctx c{*fs, std::move(t)};
    (void)PLY_TRY(c.dir(root));
  }
  if (!v.read_only() && !reader) PLY_CHECK(fs->free_orphans());
  return fs;
}

bool Filesystem::read_only() const { return failed_ || vol_.read_only(); }

void Filesystem::fail(const Error& e) {
  if (!failed_.exchange(true))
    std::fprintf(stderr, "plyfs: %s; the filesystem is now read-only\n", e.message().c_str());
  vol_.fail(e);
}

Result<void> Filesystem::sync() {
  if (vol_.read_only()) return ok();
  (void)PLY_TRY(vol_.commit());
  return ok();
}

// --- orphans ----------------------------------------------------------------

Result<void> Filesystem::for_each_orphan(const std::function<void(uint64_t)>& fn) {
  auto t = PLY_TRY(vol_.begin());
  return t.scan(tree_, ikey(0, ItemType::Orphan, 0), ikey(0, ItemType::Orphan, kOffMask),
                [&](Key k, std::span<const std::byte>) {
                  fn(off_of(k));
                  return true;
                });
}

Result<void> Filesystem::free_orphans() {
  std::vector<uint64_t> inos;
  PLY_CHECK(for_each_orphan([&](uint64_t ino) { inos.push_back(ino); }));
  for (uint64_t ino : inos) PLY_CHECK(free_inode(ino));
  return ok();
}

size_t Filesystem::orphan_count() {
  size_t n = 0;
  (void)for_each_orphan([&](uint64_t) { n++; });
  return n;
}

// Frees an unlinked inode's items in batches; the orphan item goes last, so
// a crash halfway leaves it to be finished at the next mount.
Result<void> Filesystem::free_inode(uint64_t ino) {
  for (;;) {
    auto t = PLY_TRY(vol_.begin({.for_delete = true, .reserve_blocks = 4 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    std::unique_lock lk(mu_);
    std::vector<std::pair<Key, std::optional<uint64_t>>> items;
    // A batch ends after kPunchBatch items or, for large values (xattr
    // chunks), after as many bytes as the reservation can shadow leaves of.
    uint64_t bytes = 0;
    bool more = false;
    PLY_CHECK(c.t.scan(tree_, Key{ino, 0}, Key{ino, ~0ull}, [&](Key k, std::span<const std::byte> v) {
      std::optional<uint64_t> ext;
      if (type_of(k) == ItemType::Extent && v.size() >= sizeof(disk::Extent))
        ext = view_as<disk::Extent>(v)->disk_start.get();
      items.push_back({k, ext});
      bytes += v.size();
      more = items.size() >= kPunchBatch || bytes >= 16ull * bs_;
      return !more;
    }));
    for (auto& [k, ext] : items) {
      (void)PLY_TRY(c.t.erase(tree_, k));
      if (ext && *ext) PLY_CHECK(c.t.dec_extent(BlockNo{*ext}));
    }
    if (!more) {
      (void)PLY_TRY(c.t.erase(tree_, ikey(0, ItemType::Orphan, ino)));
      return ok();
    }
  }
}

void Filesystem::pin(uint64_t ino, uint64_t n) { pins_.pin(ino, n); }

Result<void> Filesystem::unpin(uint64_t ino, uint64_t n) {
  if (!pins_.pinned(ino) || !pins_.unpin(ino, n)) return ok();
  return release(ino);
}

bool Filesystem::pinned(uint64_t ino) {
  if (pins_.pinned(ino)) return true;
  std::lock_guard lk(pin_mu_);
  for (const auto& t : shared_pins_)
    if (t->pinned(ino)) return true;
  return false;
}

// This filesystem's own pins are strong (a library user that pins an inode
// keeps it readable); a shared table's only by its holds (pins.h).
bool Filesystem::held(uint64_t ino) {
  if (pins_.pinned(ino)) return true;
  std::lock_guard lk(pin_mu_);
  for (const auto& t : shared_pins_)
    if (t->held(ino)) return true;
  return false;
}

Result<void> Filesystem::hold(uint64_t ino, PinTable& t) {
  auto tx = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(tx)};
  // Shared: remove_name decides under the exclusive lock whether anything
  // holds the inode, so a hold is either seen there or sees the result.
  std::shared_lock lk(mu_);
  auto r = c.inode(ino);
  if (!r) return r.error().code == ENOENT ? Error::io(ESTALE, "the file was deleted") : r.error();
  // An orphan nothing holds is being freed; it can only be held again by a
  // holder's second open.
  if (r->a.nlink == 0 && !S_ISDIR(r->a.mode) && !held(ino))
    return Error::io(ESTALE, "the file was deleted");
  t.hold(ino);
  return ok();
}

void Filesystem::add_ghost(const Attr& a) {
  std::lock_guard lk(ghost_mu_);
  ghosts_[a.ino] = a;
}

std::optional<Attr> Filesystem::ghost(uint64_t ino) {
  std::lock_guard lk(ghost_mu_);
  auto it = ghosts_.find(ino);
  if (it == ghosts_.end()) return std::nullopt;
  return it->second;
}

bool Filesystem::drop_ghost(uint64_t ino) {
  std::lock_guard lk(ghost_mu_);
  return ghosts_.erase(ino) != 0;
}

void Filesystem::drop_unpinned_ghosts() {
  std::vector<uint64_t> inos;
  {
    std::lock_guard lk(ghost_mu_);
    for (const auto& [ino, a] : ghosts_) inos.push_back(ino);
  }
  for (uint64_t ino : inos)
    if (!pinned(ino)) drop_ghost(ino);
}

void Filesystem::attach_pins(std::shared_ptr<const PinTable> t) {
  std::lock_guard lk(pin_mu_);
  shared_pins_.push_back(std::move(t));
}

Result<void> Filesystem::detach_pins(const PinTable* t) {
  {
    std::lock_guard lk(pin_mu_);
    std::erase_if(shared_pins_, [&](const auto& p) { return p.get() == t; });
  }
  return t->empty() ? ok() : release_orphans();
}

Result<void> Filesystem::release_orphans() {
  drop_unpinned_ghosts();
  if (read_only()) return ok();
  // The orphans are few (the files unlinked while open), and listed.
  std::vector<uint64_t> inos;
  PLY_CHECK(for_each_orphan([&](uint64_t ino) { inos.push_back(ino); }));
  for (uint64_t ino : inos) PLY_CHECK(release(ino));
  return ok();
}

Result<void> Filesystem::release(uint64_t ino) {
  if (pinned(ino)) return ok();
  if (drop_ghost(ino) || read_only()) return ok();
  auto a = getattr(ino);
  if (!a) return a.error().code == ENOENT ? ok() : Result<void>(a.error());
  if (a->nlink == 0) {
    std::lock_guard il(inode_lock(ino));
    return free_inode(ino);
  }
  return ok();
}

// An inode whose last name just went: freed now unless something above
// still holds it (then at its last unpin, or at the next mount).
Result<void> Filesystem::free_if_unpinned(uint64_t ino) {
  // Not held now, never again (hold refuses an orphan nothing holds): it
  // goes, and lives on as a ghost while the kernel still knows it.
  if (held(ino)) return ok();
  std::lock_guard il(inode_lock(ino));
  std::optional<Attr> a;
  if (pinned(ino))
    if (auto g = getattr(ino)) a = *g;
  PLY_CHECK(free_inode(ino));
  if (a && pinned(ino)) add_ghost(*a);
  return ok();
}

Result<void> Filesystem::release_all() {
  // The orphans pinned here go; one that nothing here pins (another
  // filesystem object of the same tree may) stays for the next mount.
  bool any = !pins_.empty();
  {
    std::lock_guard lk(pin_mu_);
    for (const auto& t : shared_pins_) any = any || !t->empty();
  }
  std::vector<uint64_t> inos;
  if (any && !read_only()) PLY_CHECK(for_each_orphan([&](uint64_t ino) {
    if (pinned(ino)) inos.push_back(ino);
  }));
  pins_.clear();
  {
    std::lock_guard lk(pin_mu_);
    shared_pins_.clear();
  }
  {
    std::lock_guard lk(ghost_mu_);
    ghosts_.clear();
  }
  for (uint64_t ino : inos) PLY_CHECK(release(ino));
  return ok();
}

// --- names ------------------------------------------------------------------

Result<Attr> Filesystem::getattr(uint64_t ino) {
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  auto r = c.inode(ino);
  if (!r && r.error().code == ENOENT)
    if (auto g = ghost(ino)) return *g;
  if (!r) return r.error();
  return r->a;
}

Result<bool> Filesystem::same_content(Filesystem& other, uint64_t ino) {
  if (&other.vol_ != &vol_) return Error::invalid("same_content across volumes");
  auto t = PLY_TRY(vol_.begin());
  // Read-only transaction: a diff may run on an image opened read-only.
  auto items = [&](Filesystem& fs) -> Result<std::vector<std::pair<Key, std::vector<std::byte>>>> {
    std::shared_lock lk(fs.mu_);
    std::vector<std::pair<Key, std::vector<std::byte>>> out;
    PLY_CHECK(t.scan(fs.tree_, Key{ino, 0}, Key{ino, ~0ull}, [&](Key k, std::span<const std::byte> v) {
      if (type_of(k) != ItemType::Inode && type_of(k) != ItemType::Dirent)
        out.emplace_back(k, std::vector<std::byte>(v.begin(), v.end()));
      return true;
    }));
    return out;
  };
  return PLY_TRY(items(*this)) == PLY_TRY(items(other));
}

Result<Attr> Filesystem::lookup(uint64_t dir, std::string_view name) {
  if (name.size() > 255) return Error::io(ENAMETOOLONG, "name longer than 255 bytes");
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  Rec d = PLY_TRY(c.dir(dir));
  if (name == ".") return d.a;
  if (name == "..") return PLY_TRY(c.inode(d.parent)).a;
  auto e = PLY_TRY(c.find_live(dir, name));
  if (!e) return Error::io(ENOENT, "no such entry");
  return PLY_TRY(c.inode(e->ino)).a;
}

Result<Attr> Filesystem::make_node(uint64_t dir, std::string_view name, uint32_t mode,
                                   uint64_t rdev, uint32_t uid, uint32_t gid,
                                   std::string_view target, uint32_t umask) {
  PLY_CHECK(check_name(name));
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 16 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  std::unique_lock lk(mu_);
  Rec d = PLY_TRY(c.dir(dir));
  if (d.a.nlink == 0) return Error::io(ENOENT, "directory was removed");
  if (PLY_TRY(c.find_live(dir, name))) return Error::io(EEXIST, "name exists");
  const bool is_dir = S_ISDIR(mode);
  if (is_dir && d.a.nlink >= ~0u - 1) return Error::io(EMLINK, "too many subdirectories");
  Rec r;
  r.a.ino = c.t.take_inode_number();
  r.a.mode = mode;
  r.a.uid = uid;
  r.a.gid = gid;
  if (d.a.mode & S_ISGID) {  // BSD group semantics on a setgid directory
    r.a.gid = d.a.gid;
    if (is_dir) r.a.mode |= S_ISGID;
  }
  // A default ACL on the parent narrows the mode in place of the umask
  // (posix_acl_create); without one the umask applies.
  InheritedAcl acl;
  if (!S_ISLNK(mode)) {
    auto dflt = PLY_TRY(c.xattr(dir, kAclDefault));
    if (dflt) acl = PLY_TRY(inherit_acl(*dflt, is_dir, r.a.mode));
    else r.a.mode &= ~(umask & 0777);
  }
  // A large ACL goes out of line: its chunks are reserved for before the
  // first change (format.md#fs-xattr).
  std::vector<XattrRec> acc, dfl;
  uint64_t pending = 0;
  if (!acl.access.empty()) acc.push_back(Ctx::xattr_rec(kAclAccess, acl.access)), pending += PLY_TRY(c.fit(acc));
  if (!acl.dflt.empty()) dfl.push_back(Ctx::xattr_rec(kAclDefault, acl.dflt)), pending += PLY_TRY(c.fit(dfl));
  if (pending) PLY_CHECK(c.t.reserve(c.chunk_blocks(pending)));
  r.a.nlink = is_dir ? 2 : 1;
  r.a.rdev = (S_ISCHR(mode) || S_ISBLK(mode)) ? rdev : 0;
  r.a.generation = c.t.gen().v;
  r.a.atime = r.a.mtime = r.a.ctime = r.a.btime = now();
  r.parent = dir;  // a file: a hint for diff (format.md#fs-inode)
  if (S_ISREG(mode)) r.flags = kInodeInline;
  if (S_ISLNK(mode)) {
    r.a.size = target.size();
    PLY_CHECK(c.set_inline(r.a.ino, bytes_of(target.data(), target.size()), 0));
  }
  // A directory made over a whiteout hides what the branches below hold
  // under that name (format.md#fs-union).
  if (is_dir && PLY_TRY(c.find(dir, name))) r.a.opaque = true;
  PLY_CHECK(c.put_inode(r));
  if (!acc.empty()) PLY_CHECK(c.put_xattrs(r.a.ino, name_hash(kAclAccess), acc));
  if (!dfl.empty()) PLY_CHECK(c.put_xattrs(r.a.ino, name_hash(kAclDefault), dfl));
  (void)PLY_TRY(c.add_over_whiteout(dir, name, r.a.ino, dt_of(mode)));
  d.a.mtime = d.a.ctime = r.a.ctime;
  if (is_dir) d.a.nlink++;
  d.a.size++;
  PLY_CHECK(c.put_inode(d));
  return r.a;
}

Result<Attr> Filesystem::mknod(uint64_t dir, std::string_view name, uint32_t mode, uint64_t rdev,
                               uint32_t uid, uint32_t gid, uint32_t umask) {
  const uint32_t type = mode & S_IFMT;
  if (type == 0) mode |= S_IFREG;
  else if (type != S_IFREG && type != S_IFIFO && type != S_IFSOCK && type != S_IFCHR &&
           type != S_IFBLK)
    return Error::invalid("mknod of an unsupported file type");
  return make_node(dir, name, mode, rdev, uid, gid, {}, umask);
}

Result<Attr> Filesystem::mkdir(uint64_t dir, std::string_view name, uint32_t mode, uint32_t uid,
                               uint32_t gid, uint32_t umask) {
  return make_node(dir, name, S_IFDIR | (mode & 07777), 0, uid, gid, {}, umask);
}

Result<Attr> Filesystem::symlink(uint64_t dir, std::string_view name, std::string_view target,
                                 uint32_t uid, uint32_t gid) {
  if (target.empty()) return Error::io(ENOENT, "empty symlink target");
  if (target.size() > disk::kSymlinkMax)
    return Error::io(ENAMETOOLONG, "symlink target longer than 4095 bytes");
  return make_node(dir, name, S_IFLNK | 0777, 0, uid, gid, target, 0);
}

Result<std::string> Filesystem::readlink(uint64_t ino) {
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  Rec r = PLY_TRY(c.inode(ino));
  if (!S_ISLNK(r.a.mode)) return Error::invalid("not a symlink");
  auto d = PLY_TRY(c.inline_data(ino, r.a.size));
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

// --- union support (format.md#fs-union) ---------------------------------------

Result<std::optional<Entry>> Filesystem::entry(uint64_t dir, std::string_view name) {
  PLY_CHECK(check_name(name));
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  (void)PLY_TRY(c.dir(dir));
  auto e = PLY_TRY(c.find(dir, name));
  if (!e) return std::optional<Entry>{};
  return std::optional<Entry>(Entry{e->ino, e->type});
}

Result<void> Filesystem::whiteout(uint64_t dir, std::string_view name) {
  PLY_CHECK(check_name(name));
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 4 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  std::unique_lock lk(mu_);
  Rec d = PLY_TRY(c.dir(dir));
  if (d.a.nlink == 0) return Error::io(ENOENT, "directory was removed");
  auto e = PLY_TRY(c.find(dir, name));
  if (e) return e->type == kDtWhiteout ? ok() : Result<void>(Error::io(EEXIST, "a whiteout cannot replace a file"));
  PLY_CHECK(c.add_entry(dir, name, 0, kDtWhiteout));
  d.a.mtime = d.a.ctime = now();
  return c.put_inode(d);
}

Result<Attr> Filesystem::copy_in(Filesystem& src, uint64_t ino, uint64_t dir,
                                 std::string_view name) {
  PLY_CHECK(check_name(name));
  if (&src == this || &src.vol_ != &vol_) return Error::invalid("copy_in from the same tree or another volume");
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 16 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  // Two tree locks: taken in tree-id order, so two copies in opposite
  // directions cannot deadlock.
  std::shared_lock<std::shared_mutex> ls(src.mu_, std::defer_lock);
  std::unique_lock<std::shared_mutex> lu(mu_, std::defer_lock);
  if (src.tree_.v < tree_.v) ls.lock(), lu.lock();
  else lu.lock(), ls.lock();
  Rec d = PLY_TRY(c.dir(dir));
  if (d.a.nlink == 0) return Error::io(ENOENT, "directory was removed");
  if (PLY_TRY(c.find_live(dir, name))) return Error::io(EEXIST, "name exists in the copy's branch");
  auto sv = PLY_TRY(c.t.get(src.tree_, ikey(ino, ItemType::Inode)));
  if (!sv) return Error::io(ENOENT, "no inode " + std::to_string(ino) + " to copy");
  Rec r = PLY_TRY(decode_inode(ino, *sv));
  const bool is_dir = S_ISDIR(r.a.mode);
  if (auto mine = PLY_TRY(c.t.get(tree_, ikey(ino, ItemType::Inode)))) {
    // Copied up before under another name: one more link to it.
    Rec m = PLY_TRY(decode_inode(ino, *mine));
    if (S_ISDIR(m.a.mode) || m.a.nlink == 0) return Error::io(EEXIST, "object already in this branch");
    if (m.a.nlink >= kMaxLinks) return Error::io(EMLINK, "too many links");
    (void)PLY_TRY(c.add_over_whiteout(dir, name, ino, dt_of(m.a.mode)));
    m.a.nlink++;
    PLY_CHECK(c.put_inode(m));
    d.a.size++;  // a copy-up changes nothing the user sees: times stay
    PLY_CHECK(c.put_inode(d));
    return m.a;
  }
  // Every item of the object except a directory's entries: xattrs, inline
  // data and extents, whose space extents gain a reference. A file's items
  // are grafted: the leaves holding only them are shared, not copied, so a
  // large file costs its leaves at the two ends (format.md#btree-graft).
  if (is_dir) PLY_CHECK(c.take_items(PLY_TRY(c.object_items(src.tree_, ino))));
  else (void)PLY_TRY(c.t.graft(tree_, src.tree_, Key{ino, 0}, Key{ino, ~0ull}));
  if (is_dir) {
    r.a.nlink = 2;
    r.a.size = 0;
    r.parent = dir;
    r.a.opaque = false;
  } else {
    r.a.nlink = 1;
    r.parent = dir;
  }
  PLY_CHECK(c.put_inode(r));
  (void)PLY_TRY(c.add_over_whiteout(dir, name, ino, dt_of(r.a.mode)));
  d.a.size++;
  if (is_dir) d.a.nlink++;
  PLY_CHECK(c.put_inode(d));
  return r.a;
}

Result<Filesystem::Changes> Filesystem::compare(Volume& v, TreeId from, TreeId to) {
  Changes out;
  auto t = PLY_TRY(v.begin());
  std::set<uint64_t> touched;  // objects with a differing item other than entries
  std::optional<Error> err;
  PLY_CHECK(t.diff(from, to, [&](Key k, std::optional<std::span<const std::byte>> a,
                                 std::optional<std::span<const std::byte>> b) {
    if (k.hi == 0) return true;  // FsInfo, orphans: not objects
    if (type_of(k) == ItemType::Inode && a && b) {
      // A rename or link changes only ctime and the parent hint: not a
      // change of the object (zfs diff reports the rename alone).
      auto ra = decode_inode(k.hi, *a), rb = decode_inode(k.hi, *b);
      if (ra && rb) {
        Rec x = *ra, y = *rb;
        y.a.ctime = x.a.ctime;
        y.parent = x.parent;
        if (encode_inode(x) == encode_inode(y)) return true;
      }
    }
    if (type_of(k) != ItemType::Dirent) {
      touched.insert(k.hi);
      return true;
    }
    std::vector<DirentRec> ea, eb;
    if (a) {
      auto r = decode_dirents(k, *a);
      if (!r) return err = r.error(), false;
      ea = std::move(*r);
    }
    if (b) {
      auto r = decode_dirents(k, *b);
      if (!r) return err = r.error(), false;
      eb = std::move(*r);
    }
    auto same = [](const DirentRec& x, const DirentRec& y) {
      return x.name == y.name && x.ino == y.ino && x.type == y.type;
    };
    for (const auto& x : ea)
      if (std::none_of(eb.begin(), eb.end(), [&](auto& y) { return same(x, y); }))
        out.removed.push_back({k.hi, x.name, x.ino, x.type});
    for (const auto& y : eb)
      if (std::none_of(ea.begin(), ea.end(), [&](auto& x) { return same(x, y); }))
        out.added.push_back({k.hi, y.name, y.ino, y.type});
    return true;
  }, &out.nodes_read));
  if (err) return *err;
  for (uint64_t ino : touched)
    if (PLY_TRY(t.get(from, ikey(ino, ItemType::Inode))) && PLY_TRY(t.get(to, ikey(ino, ItemType::Inode))))
      out.modified.push_back(ino);
  return out;
}

Result<std::optional<std::string>> Filesystem::path(uint64_t ino) {
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  std::string out;
  for (int depth = 0; ino != root_; depth++) {
    if (depth > 4096) return Error::corrupt(Error::kNoBlock, "directory parent chain loops");
    auto r = c.inode(ino);
    if (!r) return r.error().code == ENOENT ? std::optional<std::string>{} : Result<std::optional<std::string>>(r.error());
    const uint64_t dir = r->parent;
    if (!dir || dir == ino) return std::optional<std::string>{};
    std::optional<std::string> name;
    std::optional<Error> err;
    PLY_CHECK(c.t.scan(tree_, ikey(dir, ItemType::Dirent, 0), ikey(dir, ItemType::Dirent, kOffMask),
                       [&](Key k, std::span<const std::byte> v) {
                         auto es = decode_dirents(k, v);
                         if (!es) return err = es.error(), false;
                         for (auto& e : *es)
                           if (e.ino == ino && e.type != kDtWhiteout) return name = e.name, false;
                         return true;
                       }));
    if (err) return *err;
    if (!name) return std::optional<std::string>{};
    out = "/" + *name + out;
    ino = dir;
  }
  return std::optional<std::string>(out.empty() ? "/" : out);
}

Result<std::vector<std::pair<uint64_t, std::string>>> Filesystem::names_of(uint64_t ino, size_t limit) {
  auto t = PLY_TRY(vol_.begin());
  std::shared_lock lk(mu_);
  std::vector<std::pair<uint64_t, std::string>> out;
  std::optional<Error> err;
  PLY_CHECK(t.scan(tree_, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
    if (type_of(k) != ItemType::Dirent) return true;
    auto es = decode_dirents(k, v);
    if (!es) return err = es.error(), false;
    for (auto& e : *es)
      if (e.ino == ino && e.type != kDtWhiteout) out.emplace_back(k.hi, std::move(e.name));
    return out.size() < limit;
  }));
  if (err) return *err;
  return out;
}

Result<Attr> Filesystem::replace_from(Filesystem& src, uint64_t ino) {
  if (&src == this || &src.vol_ != &vol_) return Error::invalid("replace_from the same tree or another volume");
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 16 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  std::shared_lock<std::shared_mutex> ls(src.mu_, std::defer_lock);
  std::unique_lock<std::shared_mutex> lu(mu_, std::defer_lock);
  if (src.tree_.v < tree_.v) ls.lock(), lu.lock();
  else lu.lock(), ls.lock();
  Rec mine = PLY_TRY(c.inode(ino));
  auto sv = PLY_TRY(c.t.get(src.tree_, ikey(ino, ItemType::Inode)));
  if (!sv) return Error::io(ENOENT, "no inode " + std::to_string(ino) + " to copy");
  Rec r = PLY_TRY(decode_inode(ino, *sv));
  if ((r.a.mode & S_IFMT) != (mine.a.mode & S_IFMT))
    return Error::corrupt(Error::kNoBlock, "inode " + std::to_string(ino) + " has two types");
  // Everything but the inode and a directory's entries goes, then comes
  // over from src; extents move their references (copy_in's rule).
  const bool is_dir = S_ISDIR(r.a.mode);
  const auto drop = PLY_TRY(c.object_items(tree_, ino));
  const auto take = is_dir ? PLY_TRY(c.object_items(src.tree_, ino)) : decltype(drop){};
  for (const auto& [k, v] : drop) {
    (void)PLY_TRY(c.t.erase(tree_, k));
    if (type_of(k) == ItemType::Extent) {
      Ext e = PLY_TRY(decode_extent(k, v));
      if (e.disk_start) PLY_CHECK(c.t.dec_extent(BlockNo{e.disk_start}));
    }
  }
  if (is_dir) {
    PLY_CHECK(c.take_items(take));
  } else {
    // A file's inode goes too, so that the graft finds its range empty;
    // put_inode below writes the merged one.
    (void)PLY_TRY(c.t.erase(tree_, ikey(ino, ItemType::Inode)));
    (void)PLY_TRY(c.t.graft(tree_, src.tree_, Key{ino, 0}, Key{ino, ~0ull}));
  }
  r.a.nlink = mine.a.nlink;
  r.parent = mine.parent;
  if (S_ISDIR(r.a.mode)) {
    r.a.size = mine.a.size;
    r.a.opaque = mine.a.opaque;
  }
  PLY_CHECK(c.put_inode(r));
  return r.a;
}

Result<Attr> Filesystem::link(uint64_t ino, uint64_t dir, std::string_view name) {
  PLY_CHECK(check_name(name));
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 8 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  std::unique_lock lk(mu_);
  Rec d = PLY_TRY(c.dir(dir));
  if (d.a.nlink == 0) return Error::io(ENOENT, "directory was removed");
  Rec r = PLY_TRY(c.inode(ino));
  if (S_ISDIR(r.a.mode)) return Error::io(EPERM, "hard link to a directory");
  if (r.a.nlink == 0) return Error::io(ENOENT, "the file was removed");
  if (r.a.nlink >= kMaxLinks) return Error::io(EMLINK, "too many links");
  (void)PLY_TRY(c.add_over_whiteout(dir, name, ino, dt_of(r.a.mode)));
  r.a.nlink++;
  r.a.ctime = now();
  PLY_CHECK(c.put_inode(r));
  d.a.mtime = d.a.ctime = r.a.ctime;
  d.a.size++;
  PLY_CHECK(c.put_inode(d));
  return r.a;
}

Result<void> Filesystem::remove_name(uint64_t dir, std::string_view name, bool want_dir,
                                     bool whiteout) {
  if (name.size() > 255) return Error::io(ENAMETOOLONG, "name longer than 255 bytes");
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  uint64_t freed = 0;
  {
    auto t = PLY_TRY(vol_.begin({.for_delete = true, .reserve_blocks = 12 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    std::unique_lock lk(mu_);
    Rec d = PLY_TRY(c.dir(dir));
    auto e = PLY_TRY(c.find_live(dir, name));
    if (!e) return Error::io(ENOENT, "no such entry");
    Rec r = PLY_TRY(c.inode(e->ino));
    const bool is_dir = S_ISDIR(r.a.mode);
    if (want_dir && !is_dir) return Error::io(ENOTDIR, "not a directory");
    if (!want_dir && is_dir) return Error::io(EISDIR, "is a directory");
    if (is_dir && !PLY_TRY(c.dir_empty(r.a.ino))) return Error::io(ENOTEMPTY, "directory not empty");
    if (whiteout) PLY_CHECK(c.retarget(dir, name, 0, kDtWhiteout));
    else PLY_CHECK(c.remove_entry(dir, name));
    timespec n = now();
    d.a.mtime = d.a.ctime = n;
    if (is_dir) d.a.nlink--;
    if (d.a.size) d.a.size--;
    PLY_CHECK(c.put_inode(d));
    r.a.ctime = n;
    r.a.nlink = is_dir ? 0 : r.a.nlink - 1;
    // Nothing holds it open: it goes now, with its name (a ghost keeps its
    // attributes for the kernel meanwhile). Else, or if it is large, it
    // becomes an orphan, freed at the last release (format.md#fs-orphan).
    if (r.a.nlink == 0 && !held(r.a.ino) && PLY_TRY(c.erase_small_object(r.a.ino))) {
      if (pinned(r.a.ino)) add_ghost(r.a);
      return ok();
    }
    PLY_CHECK(c.put_inode(r));
    if (r.a.nlink == 0) {
      PLY_CHECK(c.t.put(tree_, ikey(0, ItemType::Orphan, r.a.ino), {}));
      freed = r.a.ino;
    }
  }
  return freed ? free_if_unpinned(freed) : ok();
}

Result<void> Filesystem::unlink(uint64_t dir, std::string_view name, bool whiteout) {
  return remove_name(dir, name, false, whiteout);
}
Result<void> Filesystem::rmdir(uint64_t dir, std::string_view name, bool whiteout) {
  if (name == ".") return Error::invalid("rmdir of .");
  if (name == "..") return Error::io(ENOTEMPTY, "rmdir of ..");
  return remove_name(dir, name, true, whiteout);
}

Result<void> Filesystem::rename(uint64_t odir, std::string_view oname, uint64_t ndir,
                                std::string_view nname, unsigned flags) {
  if (flags & ~unsigned(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT))
    return Error::invalid("rename flags");
  if ((flags & RENAME_EXCHANGE) && (flags & (RENAME_NOREPLACE | RENAME_WHITEOUT)))
    return Error::invalid("RENAME_EXCHANGE with RENAME_NOREPLACE or RENAME_WHITEOUT");
  PLY_CHECK(check_name(oname));
  PLY_CHECK(check_name(nname));
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  uint64_t freed = 0;
  {
    auto t = PLY_TRY(vol_.begin({.for_delete = true, .reserve_blocks = 16 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    std::unique_lock lk(mu_);
    Rec od0 = PLY_TRY(c.dir(odir));
    Rec nd = PLY_TRY(c.dir(ndir));
    Rec& od = odir == ndir ? nd : od0;  // one record when both are one directory
    auto se = PLY_TRY(c.find_live(odir, oname));
    if (!se) return Error::io(ENOENT, "no such entry");
    auto de = PLY_TRY(c.find_live(ndir, nname));
    if (nd.a.nlink == 0) return Error::io(ENOENT, "directory was removed");
    Rec src = PLY_TRY(c.inode(se->ino));
    // A directory may not move below itself: is `into` inside `moving`?
    auto below = [&](uint64_t moving, uint64_t into) -> Result<bool> {
      uint64_t p = into;
      for (int depth = 0; depth < 100000; depth++) {
        if (p == moving) return true;
        if (p == root_) return false;
        p = PLY_TRY(c.inode(p)).parent;
      }
      return Error::corrupt(Error::kNoBlock, "directory parent chain loops");
    };
    timespec n = now();
    if (flags & RENAME_EXCHANGE) {
      if (!de) return Error::io(ENOENT, "no entry to exchange with");
      Rec dst = PLY_TRY(c.inode(de->ino));
      if (src.a.ino == dst.a.ino) return ok();
      if (odir != ndir) {
        if ((S_ISDIR(src.a.mode) && PLY_TRY(below(src.a.ino, ndir))) ||
            (S_ISDIR(dst.a.mode) && PLY_TRY(below(dst.a.ino, odir))))
          return Error::invalid("moving a directory below itself");
      }
      PLY_CHECK(c.retarget(odir, oname, dst.a.ino, dt_of(dst.a.mode)));
      PLY_CHECK(c.retarget(ndir, nname, src.a.ino, dt_of(src.a.mode)));
      if (odir != ndir) {
        src.parent = ndir;
        dst.parent = odir;
        if (S_ISDIR(src.a.mode)) { nd.a.nlink++; od.a.nlink--; }
        if (S_ISDIR(dst.a.mode)) { od.a.nlink++; nd.a.nlink--; }
      }
      src.a.ctime = dst.a.ctime = n;
      PLY_CHECK(c.put_inode(src));
      PLY_CHECK(c.put_inode(dst));
      od.a.mtime = od.a.ctime = n;
      PLY_CHECK(c.put_inode(od));
      if (odir != ndir) {
        nd.a.mtime = nd.a.ctime = n;
        PLY_CHECK(c.put_inode(nd));
      }
      return ok();
    }
    if (de && (flags & RENAME_NOREPLACE)) return Error::io(EEXIST, "target exists");
    if (de && de->ino == src.a.ino) return ok();  // two names of one inode: nothing to do
    const bool is_dir = S_ISDIR(src.a.mode);
    if (is_dir && odir != ndir && PLY_TRY(below(src.a.ino, ndir)))
      return Error::invalid("moving a directory below itself");
    if (de) {
      Rec dst = PLY_TRY(c.inode(de->ino));
      const bool dst_dir = S_ISDIR(dst.a.mode);
      if (is_dir && !dst_dir) return Error::io(ENOTDIR, "target is not a directory");
      if (!is_dir && dst_dir) return Error::io(EISDIR, "target is a directory");
      if (dst_dir && !PLY_TRY(c.dir_empty(dst.a.ino))) return Error::io(ENOTEMPTY, "target directory not empty");
      PLY_CHECK(c.retarget(ndir, nname, src.a.ino, dt_of(src.a.mode)));
      dst.a.nlink = dst_dir ? 0 : dst.a.nlink - 1;
      dst.a.ctime = n;
      PLY_CHECK(c.put_inode(dst));
      if (dst_dir) nd.a.nlink--;
      // The name stays (it now names src): the entry count does not change.
      if (dst.a.nlink == 0) {
        PLY_CHECK(c.t.put(tree_, ikey(0, ItemType::Orphan, dst.a.ino), {}));
        freed = dst.a.ino;
      }
    } else {
      (void)PLY_TRY(c.add_over_whiteout(ndir, nname, src.a.ino, dt_of(src.a.mode)));
      nd.a.size++;
    }
    if (flags & RENAME_WHITEOUT) PLY_CHECK(c.retarget(odir, oname, 0, kDtWhiteout));
    else PLY_CHECK(c.remove_entry(odir, oname));
    if (od.a.size) od.a.size--;
    src.parent = ndir;  // a file's: a hint for diff
    if (is_dir && odir != ndir) {
      od.a.nlink--;
      nd.a.nlink++;
    }
    src.a.ctime = n;
    PLY_CHECK(c.put_inode(src));
    od.a.mtime = od.a.ctime = n;
    nd.a.mtime = nd.a.ctime = n;
    if (odir != ndir) PLY_CHECK(c.put_inode(od));
    PLY_CHECK(c.put_inode(nd));
  }
  return freed ? free_if_unpinned(freed) : ok();
}

Result<void> Filesystem::readdir(uint64_t dir, uint64_t cookie,
                                 const std::function<bool(const DirEntry&)>& fn) {
  uint64_t parent;
  {
    auto t = PLY_TRY(vol_.begin());
    Ctx c{*this, std::move(t)};
    std::shared_lock lk(mu_);
    Rec d = PLY_TRY(c.dir(dir));
    parent = d.parent;
  }
  if (cookie == 0 && !fn(DirEntry{".", dir, DT_DIR, 1})) return ok();
  if (cookie <= 1 && !fn(DirEntry{"..", parent, DT_DIR, 2})) return ok();
  uint64_t from = std::max<uint64_t>(cookie, 3);
  for (;;) {
    // Collect a batch under the lock, hand it out without: fn may call back
    // into the filesystem (readdirplus looks each entry up).
    struct Item { std::string name; uint64_t ino; uint8_t type; uint64_t cookie; };
    std::vector<Item> batch;
    bool more = false;
    {
      auto t = PLY_TRY(vol_.begin());
      Ctx c{*this, std::move(t)};
      std::shared_lock lk(mu_);
      std::optional<Error> err;
      PLY_CHECK(c.t.scan(tree_, ikey(dir, ItemType::Dirent, from >> 7),
                         ikey(dir, ItemType::Dirent, kOffMask),
                         [&](Key k, std::span<const std::byte> v) {
                           auto es = decode_dirents(k, v);
                           if (!es) {
                             err = es.error();
                             return false;
                           }
                           std::sort(es->begin(), es->end(),
                                     [](auto& a, auto& b) { return a.seq < b.seq; });
                           for (auto& e : *es) {
                             uint64_t ck = off_of(k) << 7 | e.seq;
                             if (ck >= from) batch.push_back({std::move(e.name), e.ino, e.type, ck});
                           }
                           if (batch.size() >= 128) {
                             more = true;
                             return false;
                           }
                           return true;
                         }));
      if (err) return *err;
    }
    for (const auto& it : batch)
      if (!fn(DirEntry{it.name, it.ino, it.type, it.cookie + 1})) return ok();
    if (!more || batch.empty()) return ok();
    from = batch.back().cookie + 1;
  }
}

// --- attributes ---------------------------------------------------------------

namespace {
// setattr's changes to an inode (kernel_times: see set_kernel_times).
Result<void> apply_setattr(Rec& r, const SetAttr& s, timespec n, bool kernel_times) {
  if (s.mode) r.a.mode = (r.a.mode & S_IFMT) | (*s.mode & 07777);
  if (s.uid) r.a.uid = *s.uid;
  if (s.gid) r.a.gid = *s.gid;
  if (s.kill_setid && !s.mode && !S_ISDIR(r.a.mode)) {
    r.a.mode &= ~S_ISUID;
    if (r.a.mode & S_IXGRP) r.a.mode &= ~S_ISGID;  // without g+x it marks locking
  }
  if (s.atime) r.a.atime = s.atime->tv_nsec == UTIME_NOW ? n : *s.atime;
  if (s.mtime) r.a.mtime = s.mtime->tv_nsec == UTIME_NOW ? n : *s.mtime;
  if (s.opaque) {
    if (!S_ISDIR(r.a.mode)) return Error::io(ENOTDIR, "only directories are opaque");
    r.a.opaque = *s.opaque;
  }
  if (s.size && !s.mtime && !kernel_times) r.a.mtime = n;
  r.a.ctime = s.ctime ? *s.ctime : n;
  return ok();
}
}  // namespace

Result<Attr> Filesystem::setattr(uint64_t ino, const SetAttr& s) {
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  // A ghost (inode numbers are never reused, so it is no file of the
  // tree): the kernel flushing the times of a file it saw deleted.
  if (!s.size)
    if (auto g = ghost(ino)) {
      Rec r;
      r.a = *g;
      PLY_CHECK(apply_setattr(r, s, now(), kernel_times_));
      add_ghost(r.a);
      return r.a;
    }
  if (s.size) {
    std::lock_guard il(inode_lock(ino));
    PLY_CHECK(truncate_locked(ino, *s.size));
  }
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 2 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  std::unique_lock lk(mu_);
  Rec r = PLY_TRY(c.inode(ino));
  PLY_CHECK(apply_setattr(r, s, now(), kernel_times_));
  PLY_CHECK(c.put_inode(r));
  return r.a;
}


// --- file data ------------------------------------------------------------------

namespace {
bool all_zero(std::span<const std::byte> s) {
  return std::all_of(s.begin(), s.end(), [](std::byte b) { return b == std::byte{0}; });
}
}  // namespace

Result<size_t> Filesystem::read(uint64_t ino, uint64_t off, std::span<std::byte> out) {
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::vector<Ext> es;
  uint64_t n, fb, lb;
  {
    std::shared_lock lk(mu_);
    Rec r = PLY_TRY(c.inode(ino));
    if (S_ISDIR(r.a.mode)) return Error::io(EISDIR, "is a directory");
    if (off >= r.a.size || out.empty()) return size_t{0};
    n = std::min<uint64_t>(out.size(), r.a.size - off);
    if (r.is_inline()) {
      auto d = PLY_TRY(c.inline_data(ino, r.a.size));
      std::memcpy(out.data(), d.data() + off, n);
      return size_t(n);
    }
    fb = off / bs_;
    lb = (off + n - 1) / bs_;
    es = PLY_TRY(c.extents(ino, fb, lb + 1));
  }
  // The device reads run without the tree lock; the Txn keeps the blocks
  // from being reused (a block freed now is free only once this generation
  // is durable, and it cannot commit while the Txn is open).
  std::memset(out.data(), 0, n);
  std::vector<std::byte> buf;
  for (const Ext& e : es) {
    if (e.prealloc()) continue;
    uint64_t a = std::max(fb, e.file_blk), b = std::min(lb + 1, e.end());
    buf.resize((b - a) * bs_);
    PLY_CHECK(vol_.read_data(BlockNo{e.disk_start + e.offset + (a - e.file_blk)}, buf));
    for (uint64_t i = a; i < b; i++) {
      std::span<const std::byte> blk(buf.data() + (i - a) * bs_, bs_);
      if (xxh3(blk) != e.csums[i - e.file_blk]) {
        Error err = Error::io(EIO, "data checksum mismatch in inode " + std::to_string(ino) +
                                       " file block " + std::to_string(i),
                              e.disk_start + e.offset + (i - e.file_blk));
        fail(err);
        return err;
      }
      // The overlap of block i with [off, off + n).
      uint64_t bs0 = i * bs_, lo = std::max(off, bs0), hi = std::min(off + n, bs0 + bs_);
      std::memcpy(out.data() + (lo - off), blk.data() + (lo - bs0), hi - lo);
    }
  }
  return size_t(n);
}

namespace {
// Allocates blocks for `data` (whole blocks for file blocks from `fb`),
// writes them and returns the extent items to map, in pieces of at most
// kMaxExtentBlocks. On error, frees what it allocated.
Result<std::vector<Ext>> put_blocks(Volume& vol, Volume::Txn& t, uint64_t fb,
                                    std::span<const std::byte> data, uint32_t bs) {
  std::vector<Ext> out;
  const uint64_t total = data.size() / bs;
  uint64_t done = 0;
  auto undo = [&](Error e) -> Error {
    for (const Ext& x : out) (void)t.dec_extent(BlockNo{x.disk_start});
    return e;
  };
  uint32_t want = disk::kMaxExtentBlocks;
  while (done < total) {
    uint32_t n = uint32_t(std::min<uint64_t>(want, total - done));
    auto b = t.alloc_extent(n);
    if (!b) {
      if (b.error().code == ENOSPC && n > 1) {  // fragmented: try shorter pieces
        want = std::max<uint32_t>(1, n / 2);
        continue;
      }
      return undo(b.error());
    }
    Ext e;
    e.file_blk = fb + done;
    e.disk_start = b->v;
    e.disk_nblocks = n;
    e.offset = 0;
    e.nblocks = n;
    out.push_back(e);
    auto piece = data.subspan(done * bs, uint64_t(n) * bs);
    auto w = vol.write_data(*b, piece);
    if (!w) return undo(w.error());
    out.back().csums.resize(n);
    for (uint32_t i = 0; i < n; i++) out.back().csums[i] = xxh3(piece.subspan(uint64_t(i) * bs, bs));
    done += n;
  }
  return out;
}
}  // namespace

// Moves an inline file's data into a block (format.md#fs-inline).
Result<void> Filesystem::unshare_inline(uint64_t ino) {
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 8 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  std::vector<std::byte> data;
  {
    std::shared_lock lk(mu_);
    Rec r = PLY_TRY(c.inode(ino));
    if (!r.is_inline()) return ok();
    data = PLY_TRY(c.inline_data(ino, r.a.size));
  }
  std::vector<Ext> news;
  if (!data.empty() && !all_zero(data)) {
    data.resize(bs_);
    news = PLY_TRY(put_blocks(vol_, c.t, 0, data, bs_));
  }
  std::unique_lock lk(mu_);
  Rec r = PLY_TRY(c.inode(ino));
  PLY_CHECK(c.set_inline(ino, {}, r.a.size));
  for (const Ext& e : news) PLY_CHECK(c.put_extent(ino, e));
  r.flags &= ~kInodeInline;
  r.a.blocks = news.size() * (bs_ / 512);
  return c.put_inode(r);
}

Result<size_t> Filesystem::write(uint64_t ino, uint64_t off, std::span<const std::byte> in) {
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  if (in.empty()) return size_t{0};
  if (off + in.size() < off || off + in.size() > (kOffMask >> 1) * uint64_t(bs_))
    return Error::io(EFBIG, "file too large");
  std::lock_guard il(inode_lock(ino));
  return write_locked(ino, off, in);
}

Result<size_t> Filesystem::write_locked(uint64_t ino, uint64_t off, std::span<const std::byte> in) {
  Attr a = PLY_TRY(getattr(ino));
  if (S_ISDIR(a.mode)) return Error::io(EISDIR, "is a directory");
  if (!S_ISREG(a.mode)) return Error::invalid("not a regular file");
  const uint64_t end = off + in.size();
  {
    auto t = PLY_TRY(vol_.begin({.reserve_blocks = 8 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    std::unique_lock lk(mu_);
    Rec r = PLY_TRY(c.inode(ino));
    if (r.is_inline() && end <= disk::kInlineMax) {
      auto d = PLY_TRY(c.inline_data(ino, r.a.size));
      uint64_t old = r.a.size;
      if (d.size() < end) d.resize(end);
      std::memcpy(d.data() + off, in.data(), in.size());
      PLY_CHECK(c.set_inline(ino, d, old));
      r.a.size = d.size();
      if (!kernel_times_) r.a.mtime = r.a.ctime = now();
      PLY_CHECK(c.put_inode(r));
      return in.size();
    }
  }
  if (a.size <= disk::kInlineMax) PLY_CHECK(unshare_inline(ino));
  a = PLY_TRY(getattr(ino));
  const uint64_t fb = off / bs_, lb = (end - 1) / bs_, nb = lb - fb + 1;
  std::vector<std::byte> buf(nb * bs_);
  // Partial first and last blocks keep their other bytes.
  if (off % bs_ && fb * bs_ < a.size)
    (void)PLY_TRY(read(ino, fb * bs_, std::span(buf).first(bs_)));
  if (end % bs_ && lb * bs_ < a.size && (lb != fb || off % bs_ == 0))
    (void)PLY_TRY(read(ino, lb * bs_, std::span(buf).last(bs_)));
  std::memcpy(buf.data() + off % bs_, in.data(), in.size());

  auto t = PLY_TRY(vol_.begin({.reserve_blocks = (nb / disk::kMaxExtentBlocks + 8) * 2 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  auto news = PLY_TRY(put_blocks(vol_, c.t, fb, buf, bs_));
  std::unique_lock lk(mu_);
  auto apply = [&]() -> Result<void> {
    Rec r = PLY_TRY(c.inode(ino));
    int64_t delta = 0;
    // Blocks past the old end can hold leftovers of a truncation a crash
    // cut short (format.md#fs-extent); they must read as zeros.
    uint64_t eof_blk = (r.a.size + bs_ - 1) / bs_;
    if (eof_blk < fb) (void)PLY_TRY(c.punch(ino, eof_blk, fb, delta));
    (void)PLY_TRY(c.punch(ino, fb, fb + nb, delta));
    for (const Ext& e : news) {
      PLY_CHECK(c.put_extent(ino, e));
      delta += e.nblocks;
    }
    r.a.size = std::max(r.a.size, end);
    r.a.blocks = uint64_t(int64_t(r.a.blocks) + delta * int64_t(bs_ / 512));
    if (!kernel_times_) r.a.mtime = r.a.ctime = now();
    return c.put_inode(r);
  };
  auto r = apply();
  if (!r) {
    if (!vol_.failure()) for (const Ext& e : news) (void)c.t.dec_extent(BlockNo{e.disk_start});
    return r.error();
  }
  return in.size();
}

Result<void> Filesystem::truncate_locked(uint64_t ino, uint64_t size) {
  Attr a = PLY_TRY(getattr(ino));
  if (S_ISDIR(a.mode)) return Error::io(EISDIR, "is a directory");
  if (!S_ISREG(a.mode)) return Error::invalid("not a regular file");
  if (size > (kOffMask >> 1) * uint64_t(bs_)) return Error::io(EFBIG, "file too large");
  {
    auto t = PLY_TRY(vol_.begin({.for_delete = true, .reserve_blocks = 8 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    std::unique_lock lk(mu_);
    Rec r = PLY_TRY(c.inode(ino));
    if (r.is_inline() && size <= disk::kInlineMax) {
      auto d = PLY_TRY(c.inline_data(ino, r.a.size));
      uint64_t old = r.a.size;
      d.resize(size);
      PLY_CHECK(c.set_inline(ino, d, old));
      r.a.size = size;
      if (!kernel_times_) r.a.mtime = r.a.ctime = now();
      return c.put_inode(r);
    }
  }
  if (a.size <= disk::kInlineMax) PLY_CHECK(unshare_inline(ino));
  a = PLY_TRY(getattr(ino));
  // The block that will hold the new end: its bytes past the end become
  // zeros, in the same generation as the size change.
  std::vector<std::byte> tail;
  const uint64_t keep = (size + bs_ - 1) / bs_;  // blocks that stay
  if (size < a.size && size % bs_) {
    tail.assign(bs_, std::byte{0});
    (void)PLY_TRY(read(ino, (size / bs_) * bs_, std::span(tail).first(size % bs_)));
  }
  bool first = true, done = false;
  while (!done) {
    auto t = PLY_TRY(vol_.begin({.for_delete = true, .reserve_blocks = 4 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    std::vector<Ext> news;
    if (first && !tail.empty()) news = PLY_TRY(put_blocks(vol_, c.t, size / bs_, tail, bs_));
    std::unique_lock lk(mu_);
    Rec r = PLY_TRY(c.inode(ino));
    int64_t delta = 0;
    if (size >= r.a.size) {
      // Growing: what lies past the old end must read as zeros.
      uint64_t eof_blk = (r.a.size + bs_ - 1) / bs_;
      done = PLY_TRY(c.punch(ino, eof_blk, keep, delta, kPunchBatch));
    } else {
      if (first && !news.empty()) {
        (void)PLY_TRY(c.punch(ino, size / bs_, size / bs_ + 1, delta));
        PLY_CHECK(c.put_extent(ino, news[0]));
        delta += 1;
      }
      done = PLY_TRY(c.punch(ino, keep, kOffMask, delta, kPunchBatch));
    }
    if (first) {
      r.a.size = size;
      if (!kernel_times_) r.a.mtime = r.a.ctime = now();
    }
    r.a.blocks = uint64_t(int64_t(r.a.blocks) + delta * int64_t(bs_ / 512));
    PLY_CHECK(c.put_inode(r));
    first = false;
  }
  return ok();
}

Result<void> Filesystem::fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len) {
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  const int known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
  if (mode & ~known) return Error::io(EOPNOTSUPP, "unsupported fallocate mode");
  if ((mode & FALLOC_FL_PUNCH_HOLE) && !(mode & FALLOC_FL_KEEP_SIZE))
    return Error::invalid("PUNCH_HOLE needs KEEP_SIZE");
  if ((mode & FALLOC_FL_PUNCH_HOLE) && (mode & FALLOC_FL_ZERO_RANGE))
    return Error::invalid("PUNCH_HOLE with ZERO_RANGE");
  if (len == 0) return Error::invalid("zero length");
  const uint64_t end = off + len;
  if (end < off || end > (kOffMask >> 1) * uint64_t(bs_)) return Error::io(EFBIG, "file too large");
  std::lock_guard il(inode_lock(ino));
  Attr a = PLY_TRY(getattr(ino));
  if (S_ISDIR(a.mode)) return Error::io(EISDIR, "is a directory");
  if (!S_ISREG(a.mode)) return Error::io(ENODEV, "not a regular file");
  PLY_CHECK(unshare_inline(ino));
  a = PLY_TRY(getattr(ino));
  const bool zeroing = mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE);
  if (zeroing) {
    // Partial blocks at the edges get zeros written; whole blocks are unmapped.
    const uint64_t wf = (off + bs_ - 1) / bs_, wl = end / bs_;  // whole blocks [wf, wl)
    auto zero_bytes = [&](uint64_t from, uint64_t to) -> Result<void> {
      to = std::min(to, a.size);
      if (from >= to) return ok();
      std::vector<std::byte> z(to - from);
      (void)PLY_TRY(write_locked(ino, from, z));
      return ok();
    };
    if (wf > wl) {
      PLY_CHECK(zero_bytes(off, end));
    } else {
      PLY_CHECK(zero_bytes(off, wf * bs_));
      PLY_CHECK(zero_bytes(wl * bs_, end));
    }
    bool done = wf >= wl;
    while (!done) {
      auto t = PLY_TRY(vol_.begin({.for_delete = true, .reserve_blocks = 4 * kOpBlocks}));
      Ctx c{*this, std::move(t)};
      std::unique_lock lk(mu_);
      Rec r = PLY_TRY(c.inode(ino));
      int64_t delta = 0;
      done = PLY_TRY(c.punch(ino, wf, wl, delta, kPunchBatch));
      r.a.blocks = uint64_t(int64_t(r.a.blocks) + delta * int64_t(bs_ / 512));
      if (!kernel_times_) r.a.mtime = r.a.ctime = now();
      PLY_CHECK(c.put_inode(r));
    }
    if (mode & FALLOC_FL_PUNCH_HOLE) return ok();
  }
  // Allocate: holes in [off, end) get preallocated extents.
  const uint64_t fb = off / bs_, lb = (end - 1) / bs_ + 1;
  uint64_t pos = fb;
  while (pos < lb) {
    auto t = PLY_TRY(vol_.begin({.reserve_blocks = 8 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    uint64_t stop = std::min<uint64_t>(lb, pos + 16 * disk::kMaxExtentBlocks);
    std::vector<Ext> es;
    {
      std::shared_lock lk(mu_);
      es = PLY_TRY(c.extents(ino, pos, stop));
    }
    std::vector<std::pair<uint64_t, uint64_t>> holes;
    uint64_t p = pos;
    for (const Ext& e : es) {
      if (e.file_blk > p) holes.push_back({p, std::min(e.file_blk, stop)});
      p = std::max(p, e.end());
    }
    if (p < stop) holes.push_back({p, stop});
    std::vector<Ext> news;
    for (auto [h0, h1] : holes) {
      for (uint64_t q = h0; q < h1;) {
        uint32_t n = uint32_t(std::min<uint64_t>(disk::kMaxExtentBlocks, h1 - q));
        auto b = c.t.alloc_extent(n);
        if (!b) {
          for (const Ext& x : news) (void)c.t.dec_extent(BlockNo{x.disk_start});
          return b.error();
        }
        Ext e;
        e.file_blk = q;
        e.disk_start = b->v;
        e.disk_nblocks = n;
        e.nblocks = n;
        e.flags = disk::kExtentPrealloc;
        news.push_back(e);
        q += n;
      }
    }
    std::unique_lock lk(mu_);
    Rec r = PLY_TRY(c.inode(ino));
    int64_t delta = 0;
    for (const Ext& e : news) {
      PLY_CHECK(c.put_extent(ino, e));
      delta += e.nblocks;
    }
    r.a.blocks = uint64_t(int64_t(r.a.blocks) + delta * int64_t(bs_ / 512));
    if (!(mode & FALLOC_FL_KEEP_SIZE) && stop == lb && end > r.a.size) r.a.size = end;
    if (!kernel_times_) r.a.ctime = now();
    if (!kernel_times_ && !(mode & FALLOC_FL_KEEP_SIZE)) r.a.mtime = r.a.ctime;
    PLY_CHECK(c.put_inode(r));
    pos = stop;
  }
  return ok();
}

Result<uint64_t> Filesystem::lseek(uint64_t ino, uint64_t off, int whence) {
  if (whence != SEEK_DATA && whence != SEEK_HOLE) return Error::invalid("lseek whence");
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  Rec r = PLY_TRY(c.inode(ino));
  if (off >= r.a.size) return Error::io(ENXIO, "offset past the end");
  if (r.is_inline()) return whence == SEEK_DATA ? off : r.a.size;
  uint64_t blk = off / bs_;
  const uint64_t eof_blk = (r.a.size + bs_ - 1) / bs_;
  while (blk < eof_blk) {
    auto es = PLY_TRY(c.extents(ino, blk, eof_blk, 64));
    if (whence == SEEK_DATA) {
      if (es.empty()) return Error::io(ENXIO, "no data past the offset");
      uint64_t d = std::max(off, es[0].file_blk * bs_);
      if (d >= r.a.size) return Error::io(ENXIO, "no data past the offset");
      return d;
    }
    uint64_t p = blk;
    for (const Ext& e : es) {
      if (e.file_blk > p) return std::max(off, std::min(p * bs_, r.a.size));
      p = std::max(p, e.end());
    }
    if (es.size() < 64) return std::max(off, std::min(p * bs_, r.a.size));
    blk = p;
  }
  return whence == SEEK_DATA ? Result<uint64_t>(Error::io(ENXIO, "no data past the offset"))
                             : Result<uint64_t>(r.a.size);
}

Result<uint64_t> Filesystem::copy_range(uint64_t in, uint64_t off_in, uint64_t out,
                                        uint64_t off_out, uint64_t len) {
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  Attr ai = PLY_TRY(getattr(in));
  Attr ao = PLY_TRY(getattr(out));
  if (S_ISDIR(ai.mode) || S_ISDIR(ao.mode)) return Error::io(EISDIR, "is a directory");
  if (!S_ISREG(ai.mode) || !S_ISREG(ao.mode)) return Error::invalid("not a regular file");
  if (off_in >= ai.size) return uint64_t{0};
  len = std::min(len, ai.size - off_in);
  if (in == out && off_in < off_out + len && off_out < off_in + len)
    return Error::invalid("overlapping ranges in one file");
  const bool aligned = off_in % bs_ == 0 && off_out % bs_ == 0 &&
                       (len % bs_ == 0 || (off_in + len == ai.size && off_out + len >= ao.size));
  if (!aligned || ai.size <= disk::kInlineMax) {
    // Copy through a buffer.
    std::vector<std::byte> buf(1 << 20);
    uint64_t done = 0;
    while (done < len) {
      size_t n = PLY_TRY(read(in, off_in + done, std::span(buf).first(std::min<uint64_t>(buf.size(), len - done))));
      if (n == 0) break;
      (void)PLY_TRY(write(out, off_out + done, std::span(buf).first(n)));
      done += n;
    }
    return done;
  }
  // Share: lock both files, lower stripe first.
  std::mutex* m1 = &inode_lock(in);
  std::mutex* m2 = &inode_lock(out);
  if (m1 > m2) std::swap(m1, m2);
  std::lock_guard l1(*m1);
  std::unique_lock<std::mutex> l2;
  if (m2 != m1) l2 = std::unique_lock(*m2);
  PLY_CHECK(unshare_inline(in));
  PLY_CHECK(unshare_inline(out));
  const uint64_t sfb = off_in / bs_, dfb = off_out / bs_, nb = (len + bs_ - 1) / bs_;
  for (uint64_t done = 0; done < nb;) {
    uint64_t step = std::min<uint64_t>(nb - done, 64 * disk::kMaxExtentBlocks);
    auto t = PLY_TRY(vol_.begin({.reserve_blocks = (step / disk::kMaxExtentBlocks + 4) * 3 * kOpBlocks}));
    Ctx c{*this, std::move(t)};
    std::unique_lock lk(mu_);
    auto es = PLY_TRY(c.extents(in, sfb + done, sfb + done + step));
    Rec r = PLY_TRY(c.inode(out));
    int64_t delta = 0;
    (void)PLY_TRY(c.punch(out, dfb + done, dfb + done + step, delta));
    for (const Ext& e : es) {
      uint64_t a = std::max(sfb + done, e.file_blk), b = std::min(sfb + done + step, e.end());
      Ext s = slice(e, a, b);
      s.file_blk = dfb + (a - sfb);
      PLY_CHECK(c.put_extent(out, s));
      PLY_CHECK(c.t.inc_extent(BlockNo{s.disk_start}));
      delta += int64_t(b - a);
    }
    r.a.blocks = uint64_t(int64_t(r.a.blocks) + delta * int64_t(bs_ / 512));
    done += step;
    if (done == nb) r.a.size = std::max(r.a.size, off_out + len);
    if (!kernel_times_) r.a.mtime = r.a.ctime = now();
    PLY_CHECK(c.put_inode(r));
  }
  return len;
}

// --- extended attributes ------------------------------------------------------

namespace {
Result<void> check_xattr_name(std::string_view name) {
  if (name.empty() || name.size() > 255) return Error::io(ERANGE, "bad xattr name length");
  for (std::string_view p : {"user.", "trusted.", "security."})
    if (name.substr(0, p.size()) == p && name.size() > p.size()) return ok();
  if (name == "system.posix_acl_access" || name == "system.posix_acl_default") return ok();
  return Error::io(EOPNOTSUPP, "unsupported xattr namespace");
}
}  // namespace

Result<void> Filesystem::setxattr(uint64_t ino, std::string_view name,
                                  std::span<const std::byte> value, int flags) {
  PLY_CHECK(check_xattr_name(name));
  if (value.size() > disk::kXattrSizeMax) return Error::io(E2BIG, "xattr value larger than 64 KiB");
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 4 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  std::unique_lock lk(mu_);
  Rec r = PLY_TRY(c.inode(ino));
  const uint64_t h = name_hash(name);
  auto xs = PLY_TRY(c.xattr_item(ino, h));
  auto it = std::find_if(xs.begin(), xs.end(), [&](auto& x) { return x.name == name; });
  if (it != xs.end() && (flags & XATTR_CREATE)) return Error::io(EEXIST, "xattr exists");
  if (it == xs.end() && (flags & XATTR_REPLACE)) return Error::io(ENODATA, "no such xattr");
  // The old value's chunks go; the new value goes inline if the item then
  // fits, else out of line under a value id of its own.
  std::optional<uint64_t> old_id;
  uint64_t old_len = 0;
  if (it == xs.end()) it = xs.insert(xs.end(), Ctx::xattr_rec(name, value));
  else {
    if (it->outline) old_id = it->value_id, old_len = it->length;
    *it = Ctx::xattr_rec(name, value);
  }
  const uint64_t pending = PLY_TRY(c.fit(xs));
  if (pending || old_id) PLY_CHECK(c.t.reserve(c.chunk_blocks(pending + old_len)));
  if (old_id) PLY_CHECK(c.erase_xattr_chunks(ino, *old_id));
  PLY_CHECK(c.put_xattrs(ino, h, xs));
  r.a.ctime = now();
  return c.put_inode(r);
}

Result<std::vector<std::byte>> Filesystem::getxattr(uint64_t ino, std::string_view name) {
  if (name.empty() || name.size() > 255) return Error::io(ERANGE, "bad xattr name length");
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  (void)PLY_TRY(c.inode(ino));
  auto v = PLY_TRY(c.xattr(ino, name));
  if (!v) return Error::io(ENODATA, "no such xattr");
  return std::move(*v);
}

Result<std::vector<std::string>> Filesystem::listxattr(uint64_t ino) {
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  (void)PLY_TRY(c.inode(ino));
  std::vector<std::string> out;
  std::optional<Error> err;
  PLY_CHECK(c.t.scan(tree_, ikey(ino, ItemType::Xattr, 0), ikey(ino, ItemType::Xattr, kOffMask),
                     [&](Key k, std::span<const std::byte> v) {
                       auto xs = decode_xattrs(k, v);
                       if (!xs) {
                         err = xs.error();
                         return false;
                       }
                       for (auto& x : *xs) out.push_back(std::move(x.name));
                       return true;
                     }));
  if (err) return *err;
  return out;
}

Result<void> Filesystem::removexattr(uint64_t ino, std::string_view name) {
  if (name.empty() || name.size() > 255) return Error::io(ERANGE, "bad xattr name length");
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  auto t = PLY_TRY(vol_.begin({.for_delete = true, .reserve_blocks = 4 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  std::unique_lock lk(mu_);
  Rec r = PLY_TRY(c.inode(ino));
  const uint64_t h = name_hash(name);
  auto xs = PLY_TRY(c.xattr_item(ino, h));
  auto it = std::find_if(xs.begin(), xs.end(), [&](auto& x) { return x.name == name; });
  if (it == xs.end()) return Error::io(ENODATA, "no such xattr");
  // Erasing a value's chunks shadows the leaves that hold them.
  if (it->outline) {
    PLY_CHECK(c.t.reserve(c.chunk_blocks(it->length)));
    PLY_CHECK(c.erase_xattr_chunks(ino, it->value_id));
  }
  xs.erase(it);
  PLY_CHECK(c.put_xattrs(ino, h, xs));
  r.a.ctime = now();
  return c.put_inode(r);
}

Filesystem::StatFs Filesystem::statfs() {
  SpaceStats s = vol_.space_stats();
  StatFs f{};
  f.bsize = bs_;
  f.namemax = 255;
  f.blocks = s.usable_blocks;
  f.bfree = s.free_blocks + s.pending_free;
  f.bavail = f.bfree > s.reserve_blocks ? f.bfree - s.reserve_blocks : 0;
  f.files = f.blocks;
  f.ffree = f.bavail;
  return f;
}

}  // namespace plyfs
