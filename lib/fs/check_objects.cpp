// The checks of whole objects once the scan is done (Checker::finish;
// format.md#fs-invariants): each object against the entries naming it, its
// counts and inline data, the tree's info item and root, inode numbers,
// orphans and out-of-line xattr values.
#include "fs/check_internal.h"

#include <sys/stat.h>

#include <dirent.h>

#include <algorithm>
#include <cstring>

namespace plyfs::fscheck {

// How far past the counter a number may lie and still be repaired by
// advancing the counter (2^32 numbers; about 2^64 remain).
constexpr uint64_t kMaxAdvance = 1ull << 32;

// A mode that names no file type takes the type the entries naming the
// object give it, if they agree; the permission bits stay.
void Checker::modes() {
  for (uint64_t ino : bad_modes_) {
    InodeInfo* ip = inodes_.find(ino);  // at_scan made it: never null (check_internal.h)
    if (!ip) continue;
    InodeInfo& i = *ip;
    if (ino == root_) {  // the info item's root is a directory, named by nothing
      const uint32_t m = (i.mode & 07777) | S_IFDIR;
      problem("F-mode", ino, "mode " + std::to_string(i.mode) + " names no file type", Repair::Lossy, 2,
              "gave objects the file type their entries name", set_inode(ino, [m](Rec& r) { r.a.mode = m; }));
      i.mode = m;
      continue;
    }
    const auto ns = names_of(i);
    const bool agree = !ns.empty() && std::all_of(ns.begin(), ns.end(), [&](const NameRec& n) {
      return n.type == ns[0].type && DTTOIF(n.type) != 0 && n.type != kDtWhiteout;
    });
    // The entries disagree or there are none: what the object holds
    // decides (entries: a directory; else a regular file, whose data,
    // inline or in extents, stays readable).
    const uint32_t type = agree ? DTTOIF(ns[0].type)
                          : i.entries || dirent_items_.count(ino) ? S_IFDIR
                                                                  : S_IFREG;
    const uint32_t m = (i.mode & 07777) | type;
    problem("F-mode", ino, "mode " + std::to_string(i.mode) + " names no file type", Repair::Lossy, 2,
            "gave objects the file type their entries name", set_inode(ino, [m](Rec& r) { r.a.mode = m; }));
    i.mode = m;  // the checks below take the type it will have
  }
}

void Checker::finish() {
  // Each object's names: one sort of every record by target.
  std::sort(names_.begin(), names_.end(), [](const NameRec& a, const NameRec& b) { return a.ino < b.ino; });
  size_t j = 0;
  for (auto& [ino, i] : inodes_) {
    while (j < names_.size() && names_[j].ino < ino) j++;
    i.first_name = j;
    while (j < names_.size() && names_[j].ino == ino) j++;
    i.nnames = uint32_t(j - i.first_name);
  }
  modes();
  info_and_root();
  inode_numbers();
  for (uint64_t o : objects_) {
    // Items met before their object's inode item (only in a tree whose keys
    // are out of order) belong to an object that exists.
    const InodeInfo* oi = inodes_.find(o);
    if (oi && oi->present) continue;
    if (o != root_ && ((oi ? oi->entries : 0) + dirent_items_.count(o)))
      // A directory's entries outlived its inode: make the directory
      // again (mode 0700) rather than give up the subtree.
      problem("F6-orphan-item", o, "a directory's entries without its inode", Repair::Lossy, 2,
              "made directories whose inode was gone again",
              [o](RepairCtx& c) { return remake_dir(c, o, 0); });
    else if (o != root_)
      problem("F6-orphan-item", o, "items of an inode that does not exist", Repair::Lossy, 2,
              "removed the items of inodes that do not exist",
              [o](RepairCtx& c) -> Result<void> {
                std::vector<std::pair<Key, uint64_t>> items;
                PLY_CHECK(c.t.scan(c.tree, Key{o, 0}, Key{o, ~0ull}, [&](Key k, std::span<const std::byte> v) {
                  items.emplace_back(k, extent_ref(k, v));
                  return true;
                }));
                for (auto& [k, ref] : items) PLY_CHECK(erase_item(c, k, ref));
                return ok();
              });
  }
  for (uint64_t o : orphans_) {
    const Key k = ikey(0, ItemType::Orphan, o);
    if (!inodes_.present(o))
      problem("F6-orphan-item", o, "orphan entry for a missing inode", Repair::Safe, 2,
              "removed orphan entries of missing inodes", erase(k, {}));
    else if (inodes_.find(o)->nnames)
      problem("F6-orphan-named", o,
              "orphan entry for an inode that still has names (the next mount would free it)",
              Repair::Safe, 2, "removed orphan entries of named inodes", erase(k, {}));
  }
  for (const NameRec& n : names_)
    if (!inodes_.present(n.ino))
      problem("F2-dirent", n.dir, "entry \"" + name(n) + "\" names missing inode " + std::to_string(n.ino),
              Repair::Lossy, 2, "removed entries of missing inodes", drop(n));
    else if (IFTODT(inodes_.find(n.ino)->mode) != n.type)
      problem("F2-dirent", n.dir, "entry \"" + name(n) + "\" has a type that disagrees with inode " +
                                      std::to_string(n.ino),
              Repair::Safe, 2, "corrected the type of entries",
              [n, t = uint8_t(IFTODT(inodes_.find(n.ino)->mode))](RepairCtx& c) {
                return edit_bucket(c, n.dir, n.hash, [&](std::vector<DirentRec>& r) {
                  for (auto& e : r)
                    if (e.seq == n.seq) e.type = t;
                  return ok();
                });
              });
  for (auto& [ino, i] : inodes_)
    if (i.present) object(ino, i);
  xattr_values();
  std::set<uint64_t> flag_set;
  for (const auto& [ino, off, k] : inline_)
    if (const InodeInfo* ip = inodes_.find(ino); ip && ip->present) {
      const InodeInfo& i = *ip;
      if (S_ISREG(i.mode) && !(i.flags & kInodeInline) && !i.mapped && i.size <= disk::kInlineMax) {
        // The data is inline and nothing else: the flag is what was lost.
        if (flag_set.insert(ino).second)  // once per file
          problem("F5-inline", ino, "inline data on a file without the inline flag", Repair::Safe, 2,
                  "set the inline flag of files whose data is inline",
                  set_inode(ino, [](Rec& r) { r.flags |= kInodeInline; }));
      } else if (!(S_ISLNK(i.mode) || (S_ISREG(i.mode) && (i.flags & kInodeInline))))
        problem("F5-inline", ino, "inline data on an object that keeps none", Repair::Lossy, 2,
                "removed misplaced inline data", erase(k, {}));
      else if (off >= i.size)
        problem("F5-inline", ino, "inline chunk at " + std::to_string(off) + " past the size",
                Repair::Lossy, 2, "removed inline data past the end of files", erase(k, {}));
      else if (i.inline_end > i.size || (S_ISLNK(i.mode) && i.inline_end != i.size))
        problem("F5-inline", ino, "inline data ends at " + std::to_string(i.inline_end) + ", the size is " +
                                      std::to_string(i.size),
                Repair::Lossy, 4, "cut inline files to the data they hold",
                set_inode(ino, [n = i.inline_end](Rec& r) { r.a.size = n; }));
    }
}

// F1: the tree's FsInfo item and its root. A damaged item is written
// again with what it still says (name, parent, flags) and a root that is
// one: the one it names if that is a directory, else a directory whose
// parent field is itself and that no entry names. A root directory whose
// inode is gone is made again (its entries are kept).
void Checker::info_and_root() {
  auto is_root = [&](uint64_t ino) {
    const InodeInfo* i = inodes_.find(ino);
    return i && i->present && S_ISDIR(i->mode);
  };
  uint64_t root = is_root(root_) ? root_ : 0;
  // Else the directory no entry names whose parent is itself; else the
  // only directory no entry names (its parent field was damaged).
  uint64_t nameless = 0, n_nameless = 0;
  if (!root)
    for (const auto& [ino, i] : inodes_) {
      if (!i.present || !S_ISDIR(i.mode) || i.nnames || orphans_.count(ino)) continue;
      if (i.parent == ino) {
        root = ino;
        break;
      }
      nameless = ino;
      n_nameless++;
    }
  if (!root && n_nameless == 1 && !(root_ && inodes_.find(root_) && !inodes_.present(root_))) root = nameless;
  if (!root && root_ && !inodes_.present(root_) && !(inodes_.find(root_) && inodes_.find(root_)->nnames))
    root = root_;
  const bool info_bad = !info_ok_ || root != root_;
  if (!info_seen_) problem("F1-info", 0, "the filesystem info item is missing");
  else if (root_ != root && info_ok_) problem("F1-info", 0, "the info item names no root directory");
  if (info_bad && root && !stray_info_)  // else moving the stray item back mends it
    findings_fix_info(root);
  if (root_ && root == root_ && !inodes_.present(root_)) {
    problem("F1-info", root_, "the root directory's inode is missing", Repair::Lossy, 1,
            "made root directories again", [root](RepairCtx& c) { return remake_dir(c, root, root); });
    return;
  }
  if (!root) {
    // Nothing can be the root: a new, empty one takes its place, and round
    // 3 gives it a /lost+found with everything the tree still holds.
    problem("F1-info", root_, "no directory can be the root");
    if (!stray_info_) findings_fix_info(0);
    return;
  }
  root_ = root;
}

// Root 0: a new root directory, made once by the first fix that runs.
void Checker::findings_fix_info(uint64_t root) {
  // Attach the repair to the problems just reported.
  for (auto& f : out_)
    if (f.p.code == "F1-info" && !f.fix) {
      f.p.repair = Repair::Lossy;
      f.round = 1;
      f.done = "rewrote damaged filesystem info items";
      f.fix = [root, old = info_, tree = tree_](RepairCtx& c) mutable -> Result<void> {
        disk::FsInfo fi;
        const bool readable = decode_info(old, fi);
        if (!readable) fi = disk::FsInfo{};
        auto* d = &fi;
        if (!root) {
          if (auto cur = PLY_TRY(c.t.get(c.tree, ikey(0, ItemType::FsInfo)));
              cur && *cur != old)
            return ok();  // an earlier step of this round made it
          root = c.t.next_inode_number();
          c.t.advance_inode_numbers(root + 1);
          PLY_CHECK(remake_dir(c, root, root));
        }
        d->magic.set(disk::kFsMagic);
        d->root_ino.set(root);
        if (!readable) {
          const std::string name = "recovered~" + std::to_string(tree.v);
          std::memcpy(d->name, name.data(), name.size());
        }
        return write_info(c.t, c.tree, fi);  // as version 4, noted in the name index
      };
    }
}

// F8: numbers come from the image's counter and are never reused
// (format.md#fs-keys): one above it would be handed out again.
void Checker::inode_numbers() {
  uint64_t high = 0;
  for (uint64_t ino : bad_inos_) {
    if (ino < kFirstInode || ino - next_inode_ > kMaxAdvance) {
      // Advancing the counter that far would waste the number space: the
      // object takes a new number, and its names follow it.
      std::vector<NameRec> names;
      if (const InodeInfo* i = inodes_.find(ino))
        for (const NameRec& n : names_of(*i)) names.push_back(n);
      problem("F8-ino", ino, "inode number out of range", Repair::Lossy, 2, "gave objects with numbers out of range new ones",
              [ino, names](RepairCtx& c) { return renumber(c, ino, names); });
    } else {
      high = std::max(high, ino);
    }
  }
  if (high)
    problem("F8-ino", high,
            "inode number not yet handed out (the counter is at " + std::to_string(next_inode_) +
                "): a new file would reuse it",
            Repair::Safe, 2, "advanced the inode number counter",
            [high](RepairCtx& c) { return c.t.advance_inode_numbers(high + 1), ok(); });
}

// F9 (format.md#fs-xattr): every out-of-line value's chunks cover
// [0, length) in order, each starting where the one before ends; every
// chunk belongs to a record; no two records share a value id; and the
// image carries the LARGE_XATTR feature bit.
void Checker::xattr_values() {
  std::stable_sort(outlines_.begin(), outlines_.end(),
                   [](const Outline& a, const Outline& b) { return std::tie(a.ino, a.id) < std::tie(b.ino, b.id); });
  if (!outlines_.empty() && !(incompat_ & kIncompatLargeXattr))
    problem("F-xattr-feature", outlines_[0].ino,
            "xattr \"" + outlines_[0].name + "\" is out of line, but the image lacks the LARGE_XATTR feature flag",
            Repair::Safe, 2, "set the LARGE_XATTR feature flag",
            [](RepairCtx& c) { return c.t.add_incompat(kIncompatLargeXattr), ok(); });
  // chunks_ is in (ino, id, offset) order, the scan's, unless a damaged
  // leaf handed keys over out of order.
  auto chunk_order = [](const Chunk& a, const Chunk& b) { return std::tie(a.ino, a.id, a.off) < std::tie(b.ino, b.id, b.off); };
  if (!std::is_sorted(chunks_.begin(), chunks_.end(), chunk_order)) std::sort(chunks_.begin(), chunks_.end(), chunk_order);
  size_t j = 0;
  auto present = [&](uint64_t ino) { return inodes_.present(ino); };
  auto orphan_chunks = [&](uint64_t ino, uint64_t id, size_t n) {
    if (present(ino))  // else the object's items go whole (F6-orphan-item)
      problem("F-xattr-chunk", ino, std::to_string(n) + " chunk item(s) of xattr value " + std::to_string(id) +
                                        " that no xattr names",
              Repair::Lossy, 2, "removed xattr chunks no xattr names",
              [ino, id](RepairCtx& c) { return erase_chunks(c, ino, id); });
  };
  auto before = [](const Chunk& c, const Outline& o) { return std::tie(c.ino, c.id) < std::tie(o.ino, o.id); };
  for (size_t i = 0; i < outlines_.size(); i++) {
    const Outline& o = outlines_[i];
    while (j < chunks_.size() && before(chunks_[j], o)) {
      size_t n = 0;
      const uint64_t ino = chunks_[j].ino, id = chunks_[j].id;
      while (j < chunks_.size() && chunks_[j].ino == ino && chunks_[j].id == id) j++, n++;
      orphan_chunks(ino, id, n);
    }
    if (!present(o.ino)) continue;
    const std::string at = "xattr \"" + o.name + "\"";
    if (i && outlines_[i - 1].ino == o.ino && outlines_[i - 1].id == o.id) {
      problem("F-xattr-value", o.ino, at + " shares its value's chunks with xattr \"" + outlines_[i - 1].name + "\"",
              Repair::Lossy, 2, "removed xattrs whose value is damaged",
              [o](RepairCtx& c) { return drop_xattr(c, o.ino, o.hash, o.name, o.id, false); });
      continue;
    }
    // The prefix of [0, length) the chunks cover in order.
    uint64_t covered = 0;
    bool in_order = true;
    size_t n = 0;
    for (; j < chunks_.size() && chunks_[j].ino == o.ino && chunks_[j].id == o.id; j++, n++) {
      const Chunk& ch = chunks_[j];
      if (!in_order) continue;
      if (ch.off != covered || ch.len == 0) in_order = false;
      else covered += ch.len;
    }
    std::string why;
    if (n == 0) why = "has no chunks";
    else if (covered < o.length && !in_order) why = "has a chunk out of sequence at byte " + std::to_string(covered);
    else if (covered < o.length)
      why = "has chunks for " + std::to_string(covered) + " of its " + std::to_string(o.length) + " bytes";
    if (!why.empty()) {
      problem("F-xattr-value", o.ino, at + " (" + std::to_string(o.length) + " bytes out of line) " + why,
              Repair::Lossy, 2, "removed xattrs whose value is damaged",
              [o](RepairCtx& c) { return drop_xattr(c, o.ino, o.hash, o.name, o.id, true); });
    } else if (covered > o.length || !in_order) {
      // Every byte of the value is there: what lies past it goes.
      problem("F-xattr-value", o.ino, at + " has chunk bytes past its length " + std::to_string(o.length),
              Repair::Lossy, 2, "cut xattr values to the length their record gives",
              [o](RepairCtx& c) { return cut_chunks(c, o.ino, o.id, o.length); });
    }
  }
  while (j < chunks_.size()) {
    size_t n = 0;
    const uint64_t ino = chunks_[j].ino, id = chunks_[j].id;
    while (j < chunks_.size() && chunks_[j].ino == ino && chunks_[j].id == id) j++, n++;
    orphan_chunks(ino, id, n);
  }
}

// The checks of one object against what names it.
void Checker::object(uint64_t ino, InodeInfo& i) {
  const bool orphan = orphans_.count(ino);
  const auto set = [ino](auto fn) -> FixFn {
    return [ino, fn](RepairCtx& c) { return patch_inode(c, ino, fn); };
  };
  if (S_ISDIR(i.mode)) {
    if (ino == root_) {
      for (const NameRec& n : names_of(i))
        problem("F3-parent", ino, "the root directory has a name", Repair::Lossy, 2,
                "removed entries naming the root directory", drop(n));
      if (i.parent != ino)
        problem("F3-parent", ino, "the root directory's parent field is not itself", Repair::Safe, 4,
                "corrected directories' parent fields", set([ino](Rec& r) { r.parent = ino; }));
    } else if (!orphan) {
      const auto ns = names_of(i);
      if (ns.empty()) {
        problem("F3-unattached", ino, "directory that no entry names", Repair::Lossy, 3,
                "connected unnamed objects to /lost+found",
                [ino, m = i.mode](RepairCtx& c) { return reconnect(c, ino, m); });
      } else if (ns.size() > 1) {
        // Keep the name in the directory its parent field gives, else the first.
        size_t keep = 0;
        for (size_t n = 0; n < ns.size(); n++)
          if (ns[n].dir == i.parent) keep = n;
        for (size_t n = 0; n < ns.size(); n++)
          if (n != keep)
            problem("F3-parent", ino, "directory also named \"" + name(ns[n]) + "\" in " +
                                          std::to_string(ns[n].dir),
                    Repair::Lossy, 2, "removed second names of directories", drop(ns[n]));
      } else if (ns[0].dir != i.parent) {
        problem("F3-parent", ino, "directory's parent field does not name the directory holding it",
                Repair::Safe, 4, "corrected directories' parent fields",
                set([p = ns[0].dir](Rec& r) { r.parent = p; }));
      }
    }
    if (!orphan && i.nlink != 2 + i.subdirs)
      problem("F2-nlink", ino, "directory nlink " + std::to_string(i.nlink) + ", expected " +
                                   std::to_string(2 + i.subdirs),
              Repair::Safe, 4, "corrected link counts", set([n = 2 + i.subdirs](Rec& r) { r.a.nlink = n; }));
    if (!orphan && i.size != i.entries)
      problem("F2-dirsize", ino, "directory size " + std::to_string(i.size) + ", but " +
                                     std::to_string(i.entries) + " entries",
              Repair::Safe, 4, "corrected directory sizes", set([n = i.entries](Rec& r) { r.a.size = n; }));
  } else if (!i.nnames && !orphan && ino != root_) {
    problem("F2-unattached", ino, "nlink " + std::to_string(i.nlink) + " but no entry names it",
            Repair::Lossy, 3, "connected unnamed objects to /lost+found",
            [ino, m = i.mode](RepairCtx& c) { return reconnect(c, ino, m); });
  } else if (i.nlink != i.nnames && !(i.nlink == 0 && orphan && !i.nnames)) {
    problem("F2-nlink", ino, "nlink " + std::to_string(i.nlink) + " but " + std::to_string(i.nnames) +
                                 " names",
            Repair::Safe, 4, "corrected link counts",
            set([n = i.nnames](Rec& r) { r.a.nlink = n; }));
  }
  if (!i.extent_items.empty() && !S_ISREG(i.mode)) {
    problem("F4-extent", ino, "extent items on a non-regular file", Repair::Lossy, 2,
            "removed extent items of non-regular files", [items = i.extent_items](RepairCtx& c) -> Result<void> {
              for (auto& [k, ref] : items) PLY_CHECK(erase_item(c, k, ref));
              return ok();
            });
  } else if (i.blocks != i.mapped * (bs_ / 512)) {
    problem("F4-blocks", ino, "blocks " + std::to_string(i.blocks) + ", extents map " +
                                  std::to_string(i.mapped * (bs_ / 512)),
            Repair::Safe, 4, "corrected block counts",
            set([b = i.mapped * (bs_ / 512)](Rec& r) { r.a.blocks = b; }));
  }
  if ((i.flags & disk::kInodeOpaque) && !S_ISDIR(i.mode))
    problem("U2-opaque", ino, "the opaque flag on a non-directory", Repair::Safe, 2,
            "cleared the opaque flag of non-directories", set([](Rec&) {}));
  // An inline file with extent items: without inline data the flag is
  // the damage (the extents are the data); with it, the extents go.
  bool inline_flag = S_ISREG(i.mode) && (i.flags & kInodeInline);
  if (inline_flag && i.mapped && !i.inline_end) {
    problem("F5-inline", ino, "the inline flag on a file whose data is in extents", Repair::Safe, 2,
            "cleared the inline flag of files whose data is in extents",
            set([](Rec& r) { r.flags &= ~kInodeInline; }));
    inline_flag = false;
  } else if (inline_flag && i.mapped) {
    problem("F5-inline", ino, "inline file with extent items", Repair::Lossy, 2,
            "removed extent items of inline files", [ino](RepairCtx& c) -> Result<void> {
              std::vector<std::pair<Key, uint64_t>> items;
              PLY_CHECK(c.t.scan(c.tree, ikey(ino, ItemType::Extent, 0), ikey(ino, ItemType::Extent, kOffMask),
                                 [&](Key k, std::span<const std::byte> v) {
                                   items.emplace_back(k, extent_ref(k, v));
                                   return true;
                                 }));
              for (auto& [k, ref] : items) PLY_CHECK(erase_item(c, k, ref));
              return ok();
            });
  }
  const uint64_t limit = S_ISLNK(i.mode) ? disk::kSymlinkMax : inline_flag ? disk::kInlineMax : ~0ull;
  if (i.size > limit)
    problem("F5-inline", ino, "size " + std::to_string(i.size) + " is more than inline data may hold",
            Repair::Lossy, 4, "cut inline files to the data they hold",
            set([n = std::min(limit, i.inline_end)](Rec& r) { r.a.size = n; }));
}

}  // namespace plyfs::fscheck
