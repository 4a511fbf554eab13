// The checks of each item of a tree on its own, as the one ordered scan
// meets it (Checker::item; format.md#fs-invariants): a malformed, misplaced
// or damaged item is reported here with its repair, and what the item says
// is kept for the checks of whole objects (check_objects.cpp).
#include "fs/check_internal.h"

#include <sys/stat.h>

#include <dirent.h>

#include <algorithm>
#include <cstring>

#include "util/checksum.h"

namespace plyfs::fscheck {

void Checker::item(Key k, std::span<const std::byte> v) {
  const uint64_t ino = k.hi, off = off_of(k);
  const auto type = type_of(k);
  if (ino == 0) {
    if (type == ItemType::FsInfo && off == 0) return info(v);
    if (type == ItemType::FsInfo) {
      stray_info_ = true;
      return problem("F1-info", 0, "the info item is filed at offset " + std::to_string(off), Repair::Lossy, 1,
                     "moved misplaced items back", move_back(k, v, ikey(0, ItemType::FsInfo)));
    }
    if (type == ItemType::Orphan) return (void)orphans_.insert(off);
    return problem("F-item", 0, "unexpected item of type " + std::to_string(int(type)) + " in object 0",
                   Repair::Lossy, 2, "removed unexpected items", erase(k, v));
  }
  if (ino < kFirstInode || ino >= next_inode_) bad_inos_.insert(ino);
  if (type == ItemType::Inode) {
    if (off != 0)
      return problem("F-item", ino, "inode item filed at offset " + std::to_string(off), Repair::Lossy, 2,
                     "moved misplaced items back", move_back(k, v, ikey(ino, ItemType::Inode)));
    if (v.size() != sizeof(disk::Inode))
      return problem("F-item", ino, "inode item of wrong size", Repair::Lossy, 2,
                     "removed undecodable inodes", erase(k, v));
    const auto* d = view_as<disk::Inode>(v);
    InodeInfo& i = inodes_.at_scan(ino);
    i.present = true;
    i.mode = d->mode.get();
    i.nlink = d->nlink.get();
    i.flags = d->flags.get();
    i.size = d->size.get();
    i.blocks = d->blocks.get();
    i.parent = d->parent.get();
    inode_fields(ino, *d);
    return;
  }
  if (!inodes_.at_scan(ino).present) objects_.insert(ino);  // items without an inode
  switch (type) {
    case ItemType::Dirent: return dirents(k, v);
    case ItemType::Xattr: return xattrs(k, v);
    case ItemType::Inline: return inline_item(k, v);
    case ItemType::Extent: return extent(k, v);
    case ItemType::XattrValue: return xattr_chunk(k, v);
    default:
      return problem("F-item", ino, "item of unknown type " + std::to_string(int(type)),
                     Repair::Lossy, 2, "removed items of unknown types", erase(k, v));
  }
}

// Fields of an inode item on their own: reserved bits, times, flags and
// the file type.
void Checker::inode_fields(uint64_t ino, const disk::Inode& d) {
  bool reserved = d.reserved0.get() != 0;
  for (const disk::Timespec* t : {&d.atime, &d.mtime, &d.ctime, &d.btime})
    reserved |= t->reserved.get() != 0 || t->nsec.get() >= 1000000000u;
  if (reserved)  // the encoder writes them right
    problem("F-reserved", ino, "reserved fields set, or nanoseconds of a second out of range", Repair::Safe, 4,
            "cleared reserved fields", set_inode(ino, [](Rec&) {}));
  const uint32_t known = disk::kInodeFlagsKnown;
  if (d.flags.get() & (disk::kInodeCompress | disk::kInodeNoCompress))
    uses_compression(ino, "a compression flag is set");
  if ((d.flags.get() & kInodeInline) && !S_ISREG(d.mode.get()))
    problem("F-flags", ino, "the inline flag on a file that is not regular", Repair::Safe, 4,
            "cleared unknown inode flags", set_inode(ino, [](Rec& r) { r.flags &= ~kInodeInline; }));
  if (d.flags.get() & ~known)
    problem("F-flags", ino, "unknown inode flags " + std::to_string(d.flags.get() & ~known), Repair::Safe, 4,
            "cleared unknown inode flags", set_inode(ino, [](Rec& r) { r.flags &= disk::kInodeFlagsKnown; }));
  switch (d.mode.get() & S_IFMT) {
    case S_IFREG: case S_IFDIR: case S_IFLNK: case S_IFCHR: case S_IFBLK: case S_IFIFO: case S_IFSOCK: break;
    default: bad_modes_.push_back(ino);  // the entries naming it may say (finish)
  }
}

void Checker::info(std::span<const std::byte> v) {
  info_seen_ = true;
  disk::FsInfo fi;
  // Kept as found even when it cannot be decoded: the fix that rewrites it
  // (findings_fix_info) tells it from one an earlier fix wrote by these bytes.
  info_.assign(v.begin(), v.end());
  if (!decode_info(v, fi)) return problem("F1-info", 0, "info item of wrong size");
  const auto* d = &fi;
  root_ = d->root_ino.get();
  if (d->magic.get() != disk::kFsMagic || d->version.get() < disk::kFsVersionMin ||
      d->version.get() > disk::kFsVersion)
    return problem("F1-info", 0, "bad magic or version in the info item");
  info_ok_ = true;
  bool reserved2 = false;
  for (uint8_t b : d->reserved2) reserved2 |= b != 0;
  if (d->reserved.get() || reserved2 || (d->branch_flags.get() & ~disk::kBranchFlagsKnown))
    problem("F1-info", 0, "reserved fields or unknown branch flags set in the info item", Repair::Safe, 4,
            "cleared reserved fields", [](RepairCtx& c) {
              return patch_info(c, [](disk::FsInfo& i) {
                i.reserved.set(0);
                std::memset(i.reserved2, 0, sizeof i.reserved2);
                i.branch_flags.set(i.branch_flags.get() & disk::kBranchFlagsKnown);
              });
            });
  // A held branch on an image an older build may write would lose its
  // hold there (format.md#features, HELD_BRANCHES).
  if ((d->branch_flags.get() & disk::kBranchHeld) && !(ro_compat_ & kRoCompatHeldBranches))
    problem("F-held-feature", 0, "the branch is held, but the image lacks the HELD_BRANCHES feature flag",
            Repair::Safe, 2, "set the HELD_BRANCHES feature flag",
            [](RepairCtx& c) { return c.t.add_ro_compat(kRoCompatHeldBranches), ok(); });
  // Likewise a quota, which an older build would neither enforce nor keep
  // (format.md#quotas, BRANCH_QUOTAS).
  if ((d->quota_referenced.get() || d->quota_exclusive.get()) && !(ro_compat_ & kRoCompatBranchQuotas))
    problem("F-quota-feature", 0, "the branch has a quota, but the image lacks the BRANCH_QUOTAS feature flag",
            Repair::Safe, 2, "set the BRANCH_QUOTAS feature flag",
            [](RepairCtx& c) { return c.t.add_ro_compat(kRoCompatBranchQuotas), ok(); });
  if (d->compress > uint8_t(Compression::Mode::Zstd) || d->compress_level > Compression::kMaxLevel)
    problem("F1-info", 0, "unknown compression default " + std::to_string(d->compress) + ":" +
                              std::to_string(d->compress_level) + " in the info item",
            Repair::Safe, 4, "cleared unknown compression defaults", [](RepairCtx& c) {
              return patch_info(c, [](disk::FsInfo& i) { i.compress = i.compress_level = 0; });
            });
  else if (d->compress)
    uses_compression(0, "the branch has a compression default");
  if (d->name[0] == 0)
    problem("U3-branch", 0, "the branch has no name", Repair::Lossy, 2, "named branches that had no name",
            [tree = tree_](RepairCtx& c) {
              return patch_info(c, [&](disk::FsInfo& i) {
                const std::string n = "branch~" + std::to_string(tree.v);
                std::memcpy(i.name, n.data(), n.size());
              });
            });
}

void Checker::dirents(Key k, std::span<const std::byte> v) {
  const uint64_t dir = k.hi, h = off_of(k);
  if (!inodes_.at_scan(dir).present) dirent_items_.insert(dir);
  bool bad = false, reserved = false;
  std::vector<DirentRec>& recs = recs_;
  lenient_dirents(v, recs, &bad, &reserved);
  if (reserved && !bad)
    problem("F-reserved", dir, "reserved field set in a directory entry", Repair::Safe, 2, "cleared reserved fields",
            [dir, h](RepairCtx& c) { return edit_bucket(c, dir, h, [](auto&) { return ok(); }); });
  if (bad)
    problem("F-item", dir, "malformed directory entry", Repair::Lossy, 2,
            "rewrote malformed directory items with their readable entries",
            [dir, h](RepairCtx& c) { return edit_bucket(c, dir, h, [](auto&) { return ok(); }); });
  // name -> index in recs of the record kept (an item holds one record
  // but for hash collisions: a linear search)
  auto& seen = seen_;
  seen.clear();
  for (size_t i = 0; i < recs.size(); i++) {
    const DirentRec& e = recs[i];
    auto at = [&] { return "entry \"" + e.name + "\""; };
    NameRec n = rec(dir, h, e);
    if (!valid_name(e.name)) {
      problem("F2-name", dir, at() + " is not a valid name", Repair::Lossy, 2, "removed entries with invalid names",
              drop(n));
      continue;
    }
    auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& x) { return x.first == e.name; });
    if (it != seen.end()) {
      // One record per name (format.md#fs-dirent). An entry wins over a
      // whiteout in its own branch (Unionfs): the whiteout goes.
      const DirentRec& kept = recs[it->second];
      const bool wh = e.type == kDtWhiteout, kept_wh = kept.type == kDtWhiteout;
      if (wh || !kept_wh) {
        problem(wh != kept_wh ? "U1-conflict" : "F2-dup", dir,
                at() + (wh != kept_wh ? " is both an entry and a whiteout" : " is given twice"),
                Repair::Lossy, 2, "removed second records of names", drop(n));
        continue;
      }
      NameRec w = rec(dir, h, kept);
      w.ino = 0;
      problem("U1-conflict", dir, at() + " is both an entry and a whiteout", Repair::Lossy, 2,
              "removed second records of names", drop(w));
      it->second = i;
    } else {
      seen.emplace_back(e.name, i);
    }
  }
  for (const auto& [name, i] : seen) {
    const DirentRec& e = recs[i];
    NameRec n = rec(dir, h, e);
    if (name_hash(e.name) != h) {
      // Lookup would never find it; move it to its item.
      problem("F2-hash", dir, "entry \"" + e.name + "\" is filed under the wrong hash", Repair::Safe, 2,
              "moved entries filed under the wrong hash", [n, name = e.name](RepairCtx& c) -> Result<void> {
                PLY_CHECK(drop_record(c, n.dir, n.hash, n.seq));
                auto r = add_record(c, n.dir, name, n.ino, n.type);
                if (!r && r.error().code != EEXIST) return r.error();
                return ok();  // the name exists where it belongs: this copy goes
              });
    }
    if (e.type == kDtWhiteout) {  // names no inode (format.md#fs-union)
      if (e.ino != 0)
        problem("U1-whiteout", dir, "whiteout \"" + e.name + "\" names inode " + std::to_string(e.ino),
                Repair::Safe, 2, "cleared the inode of whiteouts", [n](RepairCtx& c) {
                  return edit_bucket(c, n.dir, n.hash, [&](std::vector<DirentRec>& r) {
                    for (auto& x : r)
                      if (x.seq == n.seq) x.ino = 0;
                    return ok();
                  });
                });
      continue;
    }
    if (e.ino == 0) {
      problem("F2-dirent", dir, "entry \"" + e.name + "\" names inode 0", Repair::Lossy, 2,
              "removed entries of missing inodes", drop(n));
      continue;
    }
    InodeInfo& d = inodes_.at_scan(dir);
    d.entries++;
    if (e.type == DT_DIR) d.subdirs++;
    arena_.append(e.name);  // kept: rec() pointed at the arena's end
    names_.push_back(n);
  }
}

void Checker::xattrs(Key k, std::span<const std::byte> v) {
  bool bad = false;
  auto good = lenient_xattrs(v, &bad);
  if (auto xs = decode_xattrs(k, good)) {
    bool reserved = false;
    for (const auto& x : *xs) {
      reserved |= (x.flags & ~disk::kXattrOutline) || x.reserved;
      // Out-of-line values are checked against their chunks in finish().
      if (x.outline) outlines_.push_back(Outline{k.hi, x.value_id, off_of(k), x.length, x.name});
    }
    if (reserved)
      problem("F-reserved", k.hi, "unknown flags or reserved field set in an xattr", Repair::Safe, 2,
              "cleared reserved fields",
              [k, xs = *xs](RepairCtx& c) { return c.t.put(c.tree, k, encode_xattrs(xs)); });
    for (const auto& x : *xs)
      if (name_hash(x.name) != off_of(k))
        problem("F-xattr-hash", k.hi, "xattr \"" + x.name + "\" is filed under the wrong hash", Repair::Safe, 2,
                "moved xattrs filed under the wrong hash", [k, x](RepairCtx& c) -> Result<void> {
                  auto xs = [&](Key at) -> Result<std::vector<XattrRec>> {
                    auto v = PLY_TRY(c.t.get(c.tree, at));
                    if (!v) return std::vector<XattrRec>{};
                    bool b = false;
                    return decode_xattrs(at, lenient_xattrs(*v, &b));
                  };
                  auto from = PLY_TRY(xs(k));
                  std::erase_if(from, [&](const XattrRec& r) { return r.name == x.name; });
                  if (from.empty()) (void)PLY_TRY(c.t.erase(c.tree, k));
                  else PLY_CHECK(c.t.put(c.tree, k, encode_xattrs(from)));
                  const Key home = ikey(k.hi, ItemType::Xattr, name_hash(x.name));
                  auto to = PLY_TRY(xs(home));
                  for (const auto& r : to)
                    if (r.name == x.name) return ok();  // the one where it belongs stays
                  to.push_back(x);
                  return c.t.put(c.tree, home, encode_xattrs(to));
                });
  }
  if (!bad) return;
  problem("F-item", k.hi, "malformed xattr", Repair::Lossy, 2, "dropped malformed extended attributes",
          [k, good](RepairCtx& c) -> Result<void> {
            if (good.empty()) return (void)PLY_TRY(c.t.erase(c.tree, k)), ok();
            return c.t.put(c.tree, k, good);
          });
}

// Chunks come after the Xattr items of their object (type 0x07 > 0x03),
// in value id and offset order; they are matched with the records in
// finish().
void Checker::xattr_chunk(Key k, std::span<const std::byte> v) {
  chunks_.push_back(Chunk{k.hi, chunk_value_id(k), uint32_t(chunk_offset(k)), uint32_t(v.size())});
}

void Checker::inline_item(Key k, std::span<const std::byte> v) {
  const uint64_t off = off_of(k);
  if (off % disk::kInlineChunk || v.size() > disk::kInlineChunk || v.empty())
    return problem("F5-inline", k.hi, "malformed inline chunk", Repair::Lossy, 2,
                   "removed malformed inline data", erase(k, v));
  inline_.emplace_back(k.hi, off, k);
  InodeInfo& i = inodes_.at_scan(k.hi);
  i.inline_end = std::max(i.inline_end, off + v.size());
}

void Checker::extent(Key k, std::span<const std::byte> v) {
  const uint64_t ino = k.hi, blk = off_of(k);
  auto e = decode_extent(k, v);
  if (!e)
    return problem("F4-extent", ino, "malformed extent item at block " + std::to_string(blk),
                   Repair::Lossy, 2, "removed malformed extent items (their ranges read as holes)",
                   erase(k, v));
  if (e->compressed() && (e->frame_bytes > e->disk_nblocks * bs_ || e->frame_bytes <= (e->disk_nblocks - 1) * bs_))
    return problem("F4-extent", ino, "compressed extent at block " + std::to_string(blk) +
                                         " has a frame length that does not fit its blocks",
                   Repair::Lossy, 2, "removed malformed extent items (their ranges read as holes)", erase(k, v));
  if (e->compressed()) uses_compression(ino, "a compressed extent");
  InodeInfo& i = inodes_.at_scan(ino);
  if (blk < i.ext_end)
    return problem("F4-extent", ino, "extent items overlap at block " + std::to_string(blk), Repair::Lossy,
                   2, "removed overlapping extent items", erase(k, v));
  i.ext_end = e->end();
  i.mapped += e->nblocks;
  if (!S_ISREG(i.mode)) i.extent_items.emplace_back(k, extent_ref(k, v));
  if (view_as<disk::Extent>(v)->reserved.get())
    problem("F-reserved", ino, "reserved field set in the extent item at block " + std::to_string(blk),
            Repair::Safe, 2, "cleared reserved fields",
            [k, x = *e](RepairCtx& c) { return c.t.put(c.tree, k, encode_extent(x)); });
  // Data lies within the size (only preallocated extents reach past it:
  // fallocate with KEEP_SIZE); inode items come first in key order.
  if (!e->prealloc() && i.present && e->end() > (i.size + bs_ - 1) / bs_)
    problem("F4-extent", ino, "data extent at block " + std::to_string(blk) + " lies past the size " +
                                  std::to_string(i.size),
            Repair::Lossy, 2, "removed data extents past the end of files", erase(k, v));
  if (data_ && e->compressed()) {
    // -c: the stored blocks against their checksums, then the frame must
    // decode to exactly its length (format.md#fs-compress). A damaged frame
    // loses every block it held: -y makes the item's range a hole.
    std::vector<std::byte> buf(e->disk_nblocks * bs_), ram(uint64_t(e->ram_blocks) * bs_);
    std::string why;
    if (auto r = data_->read_data(BlockNo{e->disk_start}, buf); !r) why = "cannot read it: " + r.error().message();
    for (uint64_t b = 0; why.empty() && b < e->disk_nblocks; b++)
      if (xxh3(std::span(buf).subspan(b * bs_, bs_)) != e->csums[b])
        why = "checksum mismatch at device block " + std::to_string(e->disk_start + b);
    if (why.empty())
      if (auto r = decompress_frame(std::span(buf).first(e->frame_bytes), ram); !r) why = r.error().message();
    if (!why.empty())
      problem("F7-data", ino, "compressed frame at file blocks " + std::to_string(blk) + "-" +
                                  std::to_string(e->end() - 1) + ": " + why,
              Repair::Lossy, 2, "made damaged compressed frames holes", erase(k, v));
    return;
  }
  if (data_ && !e->prealloc()) {
    // -c: every block against its checksum (format.md#fs-extent).
    std::vector<std::byte> buf(uint64_t(e->nblocks) * bs_);
    auto r = data_->read_data(BlockNo{e->disk_start + e->offset}, buf);
    // The damaged bytes are lost either way: -y makes them a hole, so
    // that the rest of the file reads again (the report names them).
    if (!r)
      return problem("F7-data", ino, "cannot read the data at file blocks " + std::to_string(blk) + "-" +
                                         std::to_string(e->end() - 1) + ": " + r.error().message(),
                     Repair::Lossy, 2, "made unreadable data blocks holes", erase(k, v));
    for (uint32_t b = 0; b < e->nblocks; b++)
      if (xxh3(std::span(buf).subspan(uint64_t(b) * bs_, bs_)) != e->csums[b])
        problem("F7-data", ino, "data checksum mismatch at file block " + std::to_string(blk + b) +
                                    " (device block " + std::to_string(e->disk_start + e->offset + b) + ")",
                Repair::Lossy, 2, "made data blocks that fail their checksum holes",
                [ino, fb = blk + b](RepairCtx& c) { return punch_block(c, ino, fb); });
  }
}

void Checker::uses_compression(uint64_t ino, const std::string& what) {
  if (compress_reported_ || (incompat_ & kIncompatCompress)) return;
  compress_reported_ = true;
  problem("F-compress-feature", ino, what + ", but the image lacks the COMPRESS feature flag", Repair::Safe, 2,
          "set the COMPRESS feature flag", [](RepairCtx& c) { return c.t.add_incompat(kIncompatCompress), ok(); });
}

}  // namespace plyfs::fscheck
