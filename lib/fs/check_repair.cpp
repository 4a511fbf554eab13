// The repair steps of the checks (format.md#fs-repair): each changes items
// of a tree with the layer's own codecs (items.h), so that a repaired tree
// holds only what the layer itself could have written.
#include "fs/check_internal.h"

#include <sys/stat.h>

#include <dirent.h>
#include <time.h>

#include <cinttypes>
#include <cstdio>

namespace plyfs::fscheck {

// Repair steps (each reads what it changes again: steps of one round may
// touch the same item).
Result<void> erase_item(RepairCtx& c, Key k, uint64_t ref) {
  if (PLY_TRY(c.t.erase(c.tree, k)) && ref) PLY_CHECK(c.t.dec_extent(BlockNo{ref}));
  return ok();
}

// File block `fb` of `ino` becomes a hole: its extent item is cut around
// it, each piece keeping a reference to the data extent, as a punched hole
// leaves it (format.md#fs-extent).
Result<void> punch_block(RepairCtx& c, uint64_t ino, uint64_t fb) {
  std::optional<std::pair<Key, Ext>> hit;
  PLY_CHECK(c.t.scan(c.tree, ikey(ino, ItemType::Extent, 0), ikey(ino, ItemType::Extent, fb),
                     [&](Key k, std::span<const std::byte> v) {
                       auto e = decode_extent(k, v);
                       if (e && e->end() > fb) hit.emplace(k, *e);
                       return true;
                     }));
  if (!hit) return ok();
  const auto& [k, e] = *hit;
  (void)PLY_TRY(c.t.erase(c.tree, k));
  auto piece = [&, &e = e](uint64_t a, uint64_t b) -> Result<void> {
    if (a >= b) return ok();
    Ext p = e;
    p.file_blk = a;
    p.offset = e.offset + (a - e.file_blk);
    p.nblocks = uint32_t(b - a);
    if (!e.csums.empty() && !e.compressed()) p.csums.assign(e.csums.begin() + long(a - e.file_blk), e.csums.begin() + long(b - e.file_blk));
    PLY_CHECK(c.t.put(c.tree, ikey(ino, ItemType::Extent, a), encode_extent(p)));
    return c.t.inc_extent(BlockNo{e.disk_start});
  };
  PLY_CHECK(piece(e.file_blk, fb));
  PLY_CHECK(piece(fb + 1, e.end()));
  return c.t.dec_extent(BlockNo{e.disk_start});
}

Result<void> edit_bucket(RepairCtx& c, uint64_t dir, uint64_t h,
                         const std::function<Result<void>(std::vector<DirentRec>&)>& fn) {
  const Key k = ikey(dir, ItemType::Dirent, h);
  auto v = PLY_TRY(c.t.get(c.tree, k));
  std::vector<DirentRec> recs;
  if (v) recs = lenient_dirents(*v);
  PLY_CHECK(fn(recs));
  if (recs.empty()) return (void)PLY_TRY(c.t.erase(c.tree, k)), ok();
  return c.t.put(c.tree, k, encode_dirents(recs));
}

Result<void> drop_record(RepairCtx& c, uint64_t dir, uint64_t h, uint8_t seq) {
  return edit_bucket(c, dir, h, [&](std::vector<DirentRec>& r) {
    std::erase_if(r, [&](const DirentRec& e) { return e.seq == seq; });
    return ok();
  });
}

Result<void> add_record(RepairCtx& c, uint64_t dir, const std::string& name, uint64_t ino, uint8_t type) {
  return edit_bucket(c, dir, name_hash(name), [&](std::vector<DirentRec>& r) -> Result<void> {
    bool used[128] = {};
    for (const auto& e : r) {
      if (e.name == name) return Error::io(EEXIST, "\"" + name + "\" exists");
      used[e.seq] = true;
    }
    uint8_t seq = 0;
    while (seq < 128 && used[seq]) seq++;
    if (seq == 128) return Error::no_space("too many names with one hash");
    r.push_back({ino, type, seq, name});
    return ok();
  });
}

// Out-of-line xattr values (format.md#fs-xattr): erases the chunks of
// value `id` of object `ino`.
Result<void> erase_chunks(RepairCtx& c, uint64_t ino, uint64_t id) {
  std::vector<Key> keys;
  PLY_CHECK(c.t.scan(c.tree, xattr_chunk_key(ino, id, 0),
                     xattr_chunk_key(ino, id, (1u << disk::kXattrOffsetBits) - 1),
                     [&](Key k, std::span<const std::byte>) {
                       keys.push_back(k);
                       return true;
                     }));
  for (Key k : keys) (void)PLY_TRY(c.t.erase(c.tree, k));
  return ok();
}

// Removes xattr `name` from the item of hash `h` (its readable records
// stay); with `chunks`, the chunks of its value `id` go too.
Result<void> drop_xattr(RepairCtx& c, uint64_t ino, uint64_t h, const std::string& name, uint64_t id,
                        bool chunks) {
  const Key k = ikey(ino, ItemType::Xattr, h);
  if (auto v = PLY_TRY(c.t.get(c.tree, k))) {
    bool bad = false;
    auto xs = PLY_TRY(decode_xattrs(k, lenient_xattrs(*v, &bad)));
    std::erase_if(xs, [&](const XattrRec& x) { return x.name == name && x.outline && x.value_id == id; });
    if (xs.empty()) (void)PLY_TRY(c.t.erase(c.tree, k));
    else PLY_CHECK(c.t.put(c.tree, k, encode_xattrs(xs)));
  }
  return chunks ? erase_chunks(c, ino, id) : ok();
}

// Cuts value `id` to `len` bytes, which its chunks cover in order from 0:
// the chunks in sequence stay (one across the end is shortened), the rest
// go.
Result<void> cut_chunks(RepairCtx& c, uint64_t ino, uint64_t id, uint64_t len) {
  std::vector<std::pair<Key, std::vector<std::byte>>> put;
  std::vector<Key> erase;
  uint64_t at = 0;
  PLY_CHECK(c.t.scan(c.tree, xattr_chunk_key(ino, id, 0),
                     xattr_chunk_key(ino, id, (1u << disk::kXattrOffsetBits) - 1),
                     [&](Key k, std::span<const std::byte> v) {
                       const bool next = chunk_offset(k) == at && at < len && !v.empty();
                       if (!next) erase.push_back(k);
                       else if (at + v.size() > len)
                         put.emplace_back(k, std::vector<std::byte>(v.begin(), v.begin() + long(len - at)));
                       if (next) at += v.size();
                       return true;
                     }));
  for (Key k : erase) (void)PLY_TRY(c.t.erase(c.tree, k));
  for (auto& [k, v] : put) PLY_CHECK(c.t.put(c.tree, k, v));
  return ok();
}

Result<void> patch_inode(RepairCtx& c, uint64_t ino, const std::function<void(Rec&)>& fn) {
  auto v = PLY_TRY(c.t.get(c.tree, ikey(ino, ItemType::Inode)));
  if (!v) return Error::io(ENOENT, "inode " + std::to_string(ino) + " is gone");
  Rec r = PLY_TRY(decode_inode(ino, *v));
  fn(r);  // encoding drops an OPAQUE flag on a non-directory (U2)
  return c.t.put(c.tree, ikey(ino, ItemType::Inode), encode_inode(r));
}

namespace {

// The branch's /lost+found, made (mode 0700) the first time it is needed.
Result<uint64_t> lost_found(RepairCtx& c) {
  if (c.lost_found) return c.lost_found;
  const std::string name = "lost+found";
  auto v = PLY_TRY(c.t.get(c.tree, ikey(c.root, ItemType::Dirent, name_hash(name))));
  if (v)
    for (const auto& e : lenient_dirents(*v))
      if (e.name == name) {
        if (e.type != DT_DIR) return Error::io(EEXIST, "/lost+found is not a directory");
        return c.lost_found = e.ino;
      }
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  Rec r;
  r.a.ino = c.t.take_inode_number();
  r.a.mode = S_IFDIR | 0700;
  r.a.nlink = 2;
  r.a.generation = c.t.gen().v;
  r.a.atime = r.a.mtime = r.a.ctime = r.a.btime = now;
  r.parent = c.root;
  PLY_CHECK(c.t.put(c.tree, ikey(r.a.ino, ItemType::Inode), encode_inode(r)));
  PLY_CHECK(add_record(c, c.root, name, r.a.ino, DT_DIR));
  PLY_CHECK(patch_inode(c, c.root, [](Rec& root) {
    root.a.nlink++;
    root.a.size++;
  }));
  return c.lost_found = r.a.ino;
}

}  // namespace

// Names object `ino` "#INO" in /lost+found (e2fsck's convention).
Result<void> reconnect(RepairCtx& c, uint64_t ino, uint32_t mode) {
  const uint64_t lf = PLY_TRY(lost_found(c));
  // (snprintf: GCC 12 at -O2 warns falsely on building it from std::string.)
  for (int i = 0;; i++) {
    char buf[48];
    if (i == 0) std::snprintf(buf, sizeof buf, "#%" PRIu64, ino);
    else std::snprintf(buf, sizeof buf, "#%" PRIu64 ".%d", ino, i);
    auto r = add_record(c, lf, buf, ino, uint8_t(IFTODT(mode)));
    if (r) break;
    if (r.error().code != EEXIST || i > 100) return r.error();
  }
  const bool dir = S_ISDIR(mode);
  PLY_CHECK(patch_inode(c, lf, [&](Rec& l) {
    l.a.size++;
    if (dir) l.a.nlink++;
  }));
  return patch_inode(c, ino, [&](Rec& r) {
    if (dir) r.parent = lf;
    else r.a.nlink = 1;
  });
}

Result<void> patch_info(RepairCtx& c, const std::function<void(disk::FsInfo&)>& fn) {
  auto v = PLY_TRY(c.t.get(c.tree, ikey(0, ItemType::FsInfo)));
  disk::FsInfo fi;
  if (!v || !decode_info(*v, fi)) return Error::io(ENOENT, "no info item");
  fn(fi);
  return write_info(c.t, c.tree, fi);  // as version 4, noted in the name index
}

// A directory inode for entries whose own inode is gone (mode 0700; the
// counts and parent follow in round 4). `parent` 0: found in round 4 too.
Result<void> remake_dir(RepairCtx& c, uint64_t ino, uint64_t parent) {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  Rec r;
  r.a.ino = ino;
  r.a.mode = S_IFDIR | 0700;
  r.a.nlink = 2;
  r.a.generation = c.t.gen().v;
  r.a.atime = r.a.mtime = r.a.ctime = r.a.btime = now;
  r.parent = parent;
  return c.t.put(c.tree, ikey(ino, ItemType::Inode), encode_inode(r));
}

// Moves every item of object `ino` to a new number; the records naming it
// (and an Orphan item) follow.
Result<void> renumber(RepairCtx& c, uint64_t ino, const std::vector<NameRec>& names) {
  const uint64_t to = c.t.take_inode_number();
  std::vector<std::pair<Key, std::vector<std::byte>>> items;
  PLY_CHECK(c.t.scan(c.tree, Key{ino, 0}, Key{ino, ~0ull}, [&](Key k, std::span<const std::byte> v) {
    items.emplace_back(k, std::vector<std::byte>(v.begin(), v.end()));
    return true;
  }));
  for (auto& [k, v] : items) {
    (void)PLY_TRY(c.t.erase(c.tree, k));
    PLY_CHECK(c.t.put(c.tree, Key{to, k.lo}, v));  // extent references move with the item
  }
  if (PLY_TRY(c.t.erase(c.tree, ikey(0, ItemType::Orphan, ino))))
    PLY_CHECK(c.t.put(c.tree, ikey(0, ItemType::Orphan, to), {}));
  for (const NameRec& n : names)
    PLY_CHECK(edit_bucket(c, n.dir, n.hash, [&](std::vector<DirentRec>& r) {
      for (auto& e : r)
        if (e.seq == n.seq && e.ino == ino) e.ino = to;
      return ok();
    }));
  return ok();
}

}  // namespace plyfs::fscheck
