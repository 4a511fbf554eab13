// Filesystem-object checks and repairs: F1-F9 and U1-U3 (check.h,
// format.md#fs-invariants, #fs-repair).
//
// One ordered scan of a filesystem tree collects what each object is and
// what points at it; the checks then compare the two sides. Every problem
// the scan finds comes with its repair: a change of the tree's items made
// with the layer's own codecs (items.h), so that a repaired tree holds only
// what the layer itself could have written. Repairs go in rounds, each
// after a new scan, because each round's counts depend on the one before:
//   1 the tree's FsInfo item and its root directory;
//   2 items: malformed or misplaced records and items, dangling entries,
//     names given twice, items of objects that do not exist, numbers out of
//     range;
//   3 objects no entry names go to the branch's /lost+found as "#INO";
//   4 counts and back-pointers: nlink, size, blocks, a directory's parent.
#include "fs/check.h"

#include <sys/stat.h>

#include <dirent.h>

#include <cinttypes>
#include <cstdio>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <bitset>
#include <map>
#include <set>

#include "fs/disk_fs.h"
#include "fs/fs.h"
#include "fs/items.h"
#include "util/checksum.h"

namespace plyfs {
namespace {

using namespace fsitems;
using disk::kDtWhiteout;
using Repair = Problem::Repair;

// Blocks reserved for one repair step: a few items of one tree (A5).
constexpr uint64_t kFixBlocks = 64;
constexpr int kMaxRounds = 12;  // scans of one tree during a repair

// A record that names an object (whiteouts are kept apart). Its name is
// in the checker's arena: a million-file tree costs no allocation per name.
struct NameRec {
  uint64_t dir, hash, ino;
  uint32_t name_off = 0;
  uint8_t name_len = 0, seq = 0, type = 0;
};

struct InodeInfo {
  bool present = false;  // it has an inode item
  uint32_t mode = 0, nlink = 0, flags = 0;
  uint64_t size = 0, blocks = 0, parent = 0;
  uint64_t mapped = 0;   // blocks mapped by extent items
  uint64_t ext_end = 0;  // end of the last extent item seen
  uint64_t entries = 0;  // a directory's records that name objects
  uint32_t subdirs = 0;  // ... of which name directories
  uint32_t nnames = 0;   // records naming it: names_[first_name, +nnames) once finish() sorted them
  size_t first_name = 0;
  uint64_t inline_end = 0;  // end of its inline data
  std::vector<std::pair<Key, uint64_t>> extent_items;   // of a file that is not regular: key, extent
  uint64_t data_end = 0;                                // end of the last data (not prealloc) extent
  std::vector<std::pair<Key, uint64_t>> past_end;       // data extents ending past data_end's limit
};

// The objects of one tree in scan order, which is inode-number order: an
// object's entry is made by its first item, so the table stays sorted and
// costs no allocation per object beyond its slot (a million-file tree is
// checked in one pass of appends, then binary searches).
class InodeTable {
 public:
  InodeInfo& at_scan(uint64_t ino) {  // numbers never decrease between calls
    if (v_.empty() || v_.back().first != ino) v_.emplace_back(ino, InodeInfo{});
    return v_.back().second;
  }
  InodeInfo* find(uint64_t ino) {
    auto it = std::lower_bound(v_.begin(), v_.end(), ino, [](const auto& e, uint64_t x) { return e.first < x; });
    return it != v_.end() && it->first == ino ? &it->second : nullptr;
  }
  bool present(uint64_t ino) {
    const InodeInfo* i = find(ino);
    return i && i->present;
  }
  auto begin() { return v_.begin(); }
  auto end() { return v_.end(); }

 private:
  std::vector<std::pair<uint64_t, InodeInfo>> v_;
};

// What a repair step writes, in a transaction of its own.
struct RepairCtx {
  Volume::Txn& t;
  TreeId tree;
  uint64_t root;
  uint64_t& lost_found;  // 0 until found or made, then shared by the round
};
using FixFn = std::function<Result<void>(RepairCtx&)>;

struct Finding {
  Problem p;
  int round = 0;     // 1-4 (above); 0: no repair
  std::string done;  // the repair, as the report says it (aggregated)
  FixFn fix;
};

bool valid_name(std::string_view n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string_view::npos &&
         n.find('\0') == std::string_view::npos;
}

// The records of a Dirent item up to the first malformed one; a repeated
// seq is dropped. `bad` says whether anything was left out.
void lenient_dirents(std::span<const std::byte> v, std::vector<DirentRec>& out, bool* bad = nullptr,
                     bool* reserved = nullptr) {
  out.clear();
  std::bitset<128> seqs;
  size_t p = 0;
  bool b = false;
  while (p < v.size()) {
    if (v.size() - p < sizeof(disk::Dirent)) {
      b = true;
      break;
    }
    const auto* d = view_as<disk::Dirent>(v, p);
    const size_t n = d->name_len;
    if (n == 0 || v.size() - p - sizeof(disk::Dirent) < n || d->seq >= 128) {
      b = true;
      break;
    }
    if (reserved && d->reserved) *reserved = true;
    if (!seqs.test(d->seq) && (seqs.set(d->seq), true))
      out.push_back({d->ino.get(), d->type, d->seq,
                     std::string(reinterpret_cast<const char*>(v.data() + p + sizeof(disk::Dirent)), n)});
    else
      b = true;
    p += sizeof(disk::Dirent) + n;
  }
  if (bad) *bad = b;
}
std::vector<DirentRec> lenient_dirents(std::span<const std::byte> v) {
  std::vector<DirentRec> out;
  lenient_dirents(v, out);
  return out;
}

// The xattr records up to the first malformed one (an out-of-line record
// whose XattrOutline is not one counts as malformed).
std::vector<std::byte> lenient_xattrs(std::span<const std::byte> v, bool* bad) {
  size_t p = 0;
  while (p < v.size()) {
    const size_t next = decode_xattr_at(v, p, nullptr);
    if (!next) break;
    p = next;
  }
  *bad = p != v.size();
  return std::vector<std::byte>(v.begin(), v.begin() + long(p));
}

// The space extent an item references, as fs_value_refs counts it.
uint64_t extent_ref(Key k, std::span<const std::byte> v) {
  if (type_of(k) != ItemType::Extent || k.hi == 0 || v.size() < sizeof(disk::Extent)) return 0;
  return view_as<disk::Extent>(v)->disk_start.get();
}

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
    if (!e.csums.empty()) p.csums.assign(e.csums.begin() + long(a - e.file_blk), e.csums.begin() + long(b - e.file_blk));
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
  if (!v || v->size() != sizeof(disk::FsInfo)) return Error::io(ENOENT, "no info item");
  fn(*view_as<disk::FsInfo>(std::span(*v)));
  return c.t.put(c.tree, ikey(0, ItemType::FsInfo), *v);
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

// How far past the counter a number may lie and still be repaired by
// advancing the counter (2^32 numbers; about 2^64 remain).
constexpr uint64_t kMaxAdvance = 1ull << 32;

class Checker {
 public:
  Checker(TreeId t, uint32_t bs, Volume* data, uint64_t next_inode, uint64_t incompat)
      : tree_(t), bs_(bs), data_(data), next_inode_(next_inode), incompat_(incompat) {}

  std::vector<Finding>& findings() { return out_; }
  uint64_t root() const { return root_; }

  void item(Key k, std::span<const std::byte> v) {
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

  // A mode that names no file type takes the type the entries naming the
  // object give it, if they agree; the permission bits stay.
  void modes() {
    for (uint64_t ino : bad_modes_) {
      InodeInfo& i = *inodes_.find(ino);
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

  void finish() {
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
    for (uint64_t o : objects_)
      if (o != root_ && inodes_.find(o)->entries + dirent_items_.count(o))
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

 private:
  void problem(const std::string& code, uint64_t ino, const std::string& what,
               Repair r = Repair::None, int round = 0, std::string done = {}, FixFn fix = {}) {
    Finding f;
    f.p = Problem{code, Error::kNoBlock, (ino ? "inode " + std::to_string(ino) + ": " : std::string()) + what,
                  tree_.v, r};
    f.round = r == Repair::None ? 0 : round;
    f.done = std::move(done);
    f.fix = std::move(fix);
    out_.push_back(std::move(f));
  }

  // An item back at the key it belongs to, unless one is there already.
  FixFn move_back(Key k, std::span<const std::byte> v, Key home) {
    return [k, home, val = std::vector<std::byte>(v.begin(), v.end())](RepairCtx& c) -> Result<void> {
      (void)PLY_TRY(c.t.erase(c.tree, k));
      if (!PLY_TRY(c.t.get(c.tree, home))) PLY_CHECK(c.t.put(c.tree, home, val));
      return ok();
    };
  }
  // A record's NameRec; its name goes to the arena only if it is kept.
  NameRec rec(uint64_t dir, uint64_t h, const DirentRec& e) const {
    return NameRec{dir, h, e.ino, uint32_t(arena_.size()), uint8_t(e.name.size()), e.seq, e.type};
  }
  std::string name(const NameRec& n) const { return arena_.substr(n.name_off, n.name_len); }
  std::span<const NameRec> names_of(const InodeInfo& i) const {
    return std::span<const NameRec>(names_).subspan(i.first_name, i.nnames);
  }
  FixFn set_inode(uint64_t ino, std::function<void(Rec&)> fn) {
    return [ino, fn](RepairCtx& c) { return patch_inode(c, ino, fn); };
  }

  // Fields of an inode item on their own: reserved bits, times, flags and
  // the file type.
  void inode_fields(uint64_t ino, const disk::Inode& d) {
    bool reserved = d.reserved0.get() != 0;
    for (const disk::Timespec* t : {&d.atime, &d.mtime, &d.ctime, &d.btime})
      reserved |= t->reserved.get() != 0 || t->nsec.get() >= 1000000000u;
    if (reserved)  // the encoder writes them right
      problem("F-reserved", ino, "reserved fields set, or nanoseconds of a second out of range", Repair::Safe, 4,
              "cleared reserved fields", set_inode(ino, [](Rec&) {}));
    const uint32_t known = kInodeInline | kInodeOpaque;
    if ((d.flags.get() & kInodeInline) && !S_ISREG(d.mode.get()))
      problem("F-flags", ino, "the inline flag on a file that is not regular", Repair::Safe, 4,
              "cleared unknown inode flags", set_inode(ino, [](Rec& r) { r.flags &= ~kInodeInline; }));
    if (d.flags.get() & ~known)
      problem("F-flags", ino, "unknown inode flags " + std::to_string(d.flags.get() & ~known), Repair::Safe, 4,
              "cleared unknown inode flags", set_inode(ino, [known](Rec& r) { r.flags &= known; }));
    switch (d.mode.get() & S_IFMT) {
      case S_IFREG: case S_IFDIR: case S_IFLNK: case S_IFCHR: case S_IFBLK: case S_IFIFO: case S_IFSOCK: break;
      default: bad_modes_.push_back(ino);  // the entries naming it may say (finish)
    }
  }

  FixFn erase(Key k, std::span<const std::byte> v) {
    return [k, ref = extent_ref(k, v)](RepairCtx& c) { return erase_item(c, k, ref); };
  }
  FixFn drop(const NameRec& n) {
    return [dir = n.dir, h = n.hash, seq = n.seq](RepairCtx& c) { return drop_record(c, dir, h, seq); };
  }

  void info(std::span<const std::byte> v) {
    info_seen_ = true;
    if (v.size() != sizeof(disk::FsInfo)) return problem("F1-info", 0, "info item of wrong size");
    info_.assign(v.begin(), v.end());
    const auto* d = view_as<disk::FsInfo>(v);
    root_ = d->root_ino.get();
    if (d->magic.get() != disk::kFsMagic || d->version.get() < disk::kFsVersionMin ||
        d->version.get() > disk::kFsVersion)
      return problem("F1-info", 0, "bad magic or version in the info item");
    info_ok_ = true;
    if (d->reserved.get() || (d->branch_flags.get() & ~(disk::kBranchReadOnly | disk::kBranchDoomed)))
      problem("F1-info", 0, "reserved fields or unknown branch flags set in the info item", Repair::Safe, 4,
              "cleared reserved fields", [](RepairCtx& c) {
                return patch_info(c, [](disk::FsInfo& i) {
                  i.reserved.set(0);
                  i.branch_flags.set(i.branch_flags.get() & (disk::kBranchReadOnly | disk::kBranchDoomed));
                });
              });
    if (d->name[0] == 0)
      problem("U3-branch", 0, "the branch has no name", Repair::Lossy, 2, "named branches that had no name",
              [tree = tree_](RepairCtx& c) {
                return patch_info(c, [&](disk::FsInfo& i) {
                  const std::string n = "branch~" + std::to_string(tree.v);
                  std::memcpy(i.name, n.data(), n.size());
                });
              });
  }

  // F1: the tree's FsInfo item and its root. A damaged item is written
  // again with what it still says (name, parent, flags) and a root that is
  // one: the one it names if that is a directory, else a directory whose
  // parent field is itself and that no entry names. A root directory whose
  // inode is gone is made again (its entries are kept).
  void info_and_root() {
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
  void findings_fix_info(uint64_t root) {
    // Attach the repair to the problems just reported.
    for (auto& f : out_)
      if (f.p.code == "F1-info" && !f.fix) {
        f.p.repair = Repair::Lossy;
        f.round = 1;
        f.done = "rewrote damaged filesystem info items";
        f.fix = [root, old = info_, tree = tree_](RepairCtx& c) mutable -> Result<void> {
          std::vector<std::byte> v(sizeof(disk::FsInfo));
          if (old.size() == v.size()) v = old;
          auto* d = view_as<disk::FsInfo>(std::span(v));
          if (!root) {
            if (auto cur = PLY_TRY(c.t.get(c.tree, ikey(0, ItemType::FsInfo)));
                cur && cur->size() == v.size() && *cur != old)
              return ok();  // an earlier step of this round made it
            root = c.t.next_inode_number();
            c.t.advance_inode_numbers(root + 1);
            PLY_CHECK(remake_dir(c, root, root));
          }
          d->magic.set(disk::kFsMagic);
          d->version.set(disk::kFsVersion);
          d->root_ino.set(root);
          if (old.size() != v.size()) {
            const std::string name = "recovered~" + std::to_string(tree.v);
            std::memcpy(d->name, name.data(), name.size());
          }
          return c.t.put(c.tree, ikey(0, ItemType::FsInfo), v);
        };
      }
  }

  // F8: numbers come from the image's counter and are never reused
  // (format.md#fs-keys): one above it would be handed out again.
  void inode_numbers() {
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

  void dirents(Key k, std::span<const std::byte> v) {
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

  void xattrs(Key k, std::span<const std::byte> v) {
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
  void xattr_chunk(Key k, std::span<const std::byte> v) {
    chunks_.push_back(Chunk{k.hi, chunk_value_id(k), uint32_t(chunk_offset(k)), uint32_t(v.size())});
  }

  // F9 (format.md#fs-xattr): every out-of-line value's chunks cover
  // [0, length) in order, each starting where the one before ends; every
  // chunk belongs to a record; no two records share a value id; and the
  // image carries the LARGE_XATTR feature bit.
  void xattr_values() {
    std::stable_sort(outlines_.begin(), outlines_.end(),
                     [](const Outline& a, const Outline& b) { return std::tie(a.ino, a.id) < std::tie(b.ino, b.id); });
    if (!outlines_.empty() && !(incompat_ & kIncompatLargeXattr))
      problem("F-xattr-feature", outlines_[0].ino,
              "xattr \"" + outlines_[0].name + "\" is out of line, but the image lacks the LARGE_XATTR feature flag",
              Repair::Safe, 2, "set the LARGE_XATTR feature flag",
              [](RepairCtx& c) { return c.t.add_incompat(kIncompatLargeXattr), ok(); });
    size_t j = 0;  // chunks_ is in (ino, id, offset) order: the scan's
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

  void inline_item(Key k, std::span<const std::byte> v) {
    const uint64_t off = off_of(k);
    if (off % disk::kInlineChunk || v.size() > disk::kInlineChunk || v.empty())
      return problem("F5-inline", k.hi, "malformed inline chunk", Repair::Lossy, 2,
                     "removed malformed inline data", erase(k, v));
    inline_.emplace_back(k.hi, off, k);
    InodeInfo& i = inodes_.at_scan(k.hi);
    i.inline_end = std::max(i.inline_end, off + v.size());
  }

  void extent(Key k, std::span<const std::byte> v) {
    const uint64_t ino = k.hi, blk = off_of(k);
    auto e = decode_extent(k, v);
    if (!e)
      return problem("F4-extent", ino, "malformed extent item at block " + std::to_string(blk),
                     Repair::Lossy, 2, "removed malformed extent items (their ranges read as holes)",
                     erase(k, v));
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

  // The checks of one object against what names it.
  void object(uint64_t ino, InodeInfo& i) {
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

  TreeId tree_;
  uint32_t bs_;
  Volume* data_;  // -c: read and verify data blocks
  uint64_t next_inode_;
  uint64_t root_ = 0;
  bool info_seen_ = false, info_ok_ = false, stray_info_ = false;
  std::vector<std::byte> info_;
  std::set<uint64_t> dirent_items_;  // objects with Dirent items
  std::vector<uint64_t> bad_modes_;  // inodes whose mode names no file type
  std::vector<Finding> out_;
  InodeTable inodes_;
  std::set<uint64_t> objects_, orphans_, bad_inos_;
  std::vector<NameRec> names_;
  std::string arena_;                       // the names of names_
  std::vector<DirentRec> recs_;             // scratch of dirents()
  std::vector<std::pair<std::string_view, size_t>> seen_;
  std::vector<std::tuple<uint64_t, uint64_t, Key>> inline_;  // ino, offset, key
  uint64_t incompat_;  // the superblock's incompat features
  struct Outline {     // an out-of-line xattr record
    uint64_t ino, id, hash;
    uint32_t length;
    std::string name;
  };
  struct Chunk {       // an XattrValue item
    uint64_t ino, id;
    uint32_t off, len;
  };
  std::vector<Outline> outlines_;
  std::vector<Chunk> chunks_;
};

// One scan of one filesystem tree.
std::vector<Finding> scan_tree(Volume& vol, TreeId id, bool data, uint64_t* root = nullptr) {
  auto fail = [&](const Error& e, const std::string& what) {
    Finding f;
    f.p = Problem{"F-item", e.block, what + e.message(), id.v};
    return std::vector<Finding>{std::move(f)};
  };
  auto t = vol.begin();
  if (!t) return fail(t.error(), "cannot read: ");
  Checker c(id, vol.block_size(), data ? &vol : nullptr, t->next_inode_number(), vol.incompat());
  auto r = t->scan(id, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
    c.item(k, v);
    return true;
  });
  if (!r) return fail(r.error(), "cannot read the tree: ");
  c.finish();
  if (root) *root = c.root();
  return std::move(c.findings());
}

// The branch fields (U3): parents name filesystem trees, without cycles;
// names are unique. A repair renames the later of two branches with one
// name and forgets a parent that does not exist or makes a cycle.
std::vector<Finding> check_branches(Volume& vol) {
  std::vector<Finding> out;
  auto bs = Filesystem::branches(vol);
  if (!bs) return out;  // the per-tree checks report unreadable info items
  auto problem = [&](const BranchMeta& b, const std::string& what, std::string done, BranchMeta fixed) {
    Finding f;
    f.p = Problem{"U3-branch", Error::kNoBlock, what, b.tree.v, Repair::Lossy};
    f.round = 2;
    f.done = std::move(done);
    f.fix = [fixed](RepairCtx& c) { return Filesystem::set_branch(c.t, fixed); };
    out.push_back(std::move(f));
  };
  std::map<uint64_t, const BranchMeta*> by_id;
  std::set<std::string> names;
  for (const auto& b : *bs) by_id[b.tree.v] = &b;
  for (const auto& b : *bs) {
    // A doomed tree's name is free (format.md#snapshots): a rollback's new
    // branch has it while the old one waits to be dropped.
    if (b.doomed || names.insert(b.name).second) continue;
    BranchMeta m = b;
    m.name = b.name.substr(0, 20) + "~" + std::to_string(b.tree.v);
    problem(b, "two branches are named \"" + b.name + "\"", "renamed branches whose names were taken", m);
  }
  for (const auto& b : *bs) {
    // A doomed tree's fields no longer matter: drop_doomed drops them one at
    // a time, so one may outlive the parent it names.
    if (b.doomed) continue;
    BranchMeta m = b;
    m.parent = TreeId{0};
    if (b.parent.v && !by_id.count(b.parent.v)) {
      problem(b, "branch \"" + b.name + "\" names missing parent tree " + std::to_string(b.parent.v),
              "forgot branch parents that do not exist or form a cycle", m);
      continue;
    }
    uint64_t p = b.parent.v;
    for (size_t steps = 0; p; steps++) {
      if (steps > by_id.size() || p == b.tree.v) {
        problem(b, "branch \"" + b.name + "\" is its own ancestor",
                "forgot branch parents that do not exist or form a cycle", m);
        break;
      }
      auto it = by_id.find(p);
      p = it == by_id.end() ? 0 : it->second->parent.v;
    }
  }
  return out;
}

Result<std::vector<TreeId>> fs_trees(Volume& vol) {
  auto t = PLY_TRY(vol.begin());
  std::vector<TreeId> out;
  for (const auto& ti : PLY_TRY(t.list_trees()))
    if (ti.kind == disk::kKindFs) out.push_back(ti.id);
  return out;
}

// Applies the repairs of the lowest round found (only Safe ones unless
// `lossy`); returns how many were applied.
Result<size_t> apply_round(Volume& vol, TreeId tree, uint64_t root, const std::vector<Finding>& fs,
                           bool lossy, std::map<std::string, uint64_t>& done) {
  int round = 0;
  for (const auto& f : fs)
    if (f.round && (lossy || f.p.repair == Repair::Safe) && (!round || f.round < round)) round = f.round;
  if (!round) return 0;
  uint64_t lf = 0;
  size_t n = 0;
  for (const auto& f : fs) {
    if (f.round != round || !(lossy || f.p.repair == Repair::Safe)) continue;
    auto t = PLY_TRY(vol.begin({.for_delete = true, .reserve_blocks = kFixBlocks}));
    RepairCtx c{t, tree, root, lf};
    PLY_CHECK(f.fix(c));
    done[f.done]++;
    n++;
  }
  return n;
}

}  // namespace

std::vector<Problem> check_filesystems(Volume& vol, bool data) {
  std::vector<Problem> out;
  for (auto& f : check_branches(vol)) out.push_back(std::move(f.p));
  auto trees = fs_trees(vol);
  if (!trees) {
    out.push_back(Problem{"F-item", Error::kNoBlock, "cannot list the trees: " + trees.error().message(), 0});
    return out;
  }
  // The trees are independent: they are checked side by side, one thread
  // per core (the volume serves concurrent readers), and reported in order.
  std::vector<std::vector<Finding>> per(trees->size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < per.size();) per[i] = scan_tree(vol, (*trees)[i], data);
  };
  const size_t n = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), per.size());
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n; t++) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (auto& fs : per)
    for (auto& f : fs) out.push_back(std::move(f.p));
  return out;
}

namespace {

// Pass 5 fed by fsck's walk (check.h). The walk's thread only copies each
// tree's items into chunks; workers, one per core, run the Checker on them,
// a tree always on the same worker and in order, so the walk of passes 2-4
// and the objects' checks run side by side and no node is read twice.
class FedCheck : public ObjectChecker {
 public:
  FedCheck(std::unique_ptr<Volume> vol, bool data) : vol_(std::move(vol)), data_(data) {
    auto t = vol_->begin();
    next_inode_ = t ? t->next_inode_number() : 0;
    const size_t n = std::max(1u, std::thread::hardware_concurrency());
    workers_.resize(n);
    for (auto& w : workers_) w = std::make_unique<Worker>();
    for (auto& w : workers_) w->thread = std::thread([this, p = w.get()] { run(*p); });
  }
  ~FedCheck() override { stop(); }

  bool begin_tree(const TreeInfo& t) override {
    if (t.kind != disk::kKindFs) return false;
    trees_.push_back(Tree{t.id, {}, false});
    cur_ = Chunk{&trees_.back(), trees_.size() - 1, buffer(), false};
    return true;
  }
  void item(Key k, std::span<const std::byte> v) override {
    const uint32_t len = uint32_t(v.size());
    const size_t at = cur_.bytes.size();
    cur_.bytes.resize(at + sizeof k + sizeof len + len);
    std::memcpy(cur_.bytes.data() + at, &k, sizeof k);
    std::memcpy(cur_.bytes.data() + at + sizeof k, &len, sizeof len);
    if (len) std::memcpy(cur_.bytes.data() + at + sizeof k + sizeof len, v.data(), len);
    if (cur_.bytes.size() >= kChunkBytes) hand_over(false);
  }
  void end_tree(bool complete) override {
    cur_.tree->complete = complete;
    hand_over(true);
  }

  std::vector<Problem> finish() override {
    stop();
    std::vector<Problem> out;
    for (auto& f : check_branches(*vol_)) out.push_back(std::move(f.p));
    // A tree the walk did not hand over whole (a subtree shared with a clone
    // is walked once) is scanned again on its own.
    for (auto& t : trees_) {
      if (!t.complete) t.findings = scan_tree(*vol_, t.id, data_);
      for (auto& f : t.findings) out.push_back(std::move(f.p));
    }
    return out;
  }

 private:
  static constexpr size_t kChunkBytes = 256 << 10;
  static constexpr size_t kQueued = 8;  // chunks waiting per worker
  struct Tree;
  struct Chunk {
    Tree* tree;  // in trees_, whose elements never move
    size_t index;
    std::vector<std::byte> bytes;
    bool last;
  };
  struct Tree {
    TreeId id;
    std::vector<Finding> findings;
    bool complete;
  };
  struct Worker {
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Chunk> queue;
    bool stop = false;
  };

  void hand_over(bool last) {
    cur_.last = last;
    Worker& w = *workers_[cur_.index % workers_.size()];
    Tree* tree = cur_.tree;
    const size_t index = cur_.index;
    {
      std::unique_lock l(w.mu);
      w.cv.wait(l, [&] { return w.queue.size() < kQueued; });
      w.queue.push_back(std::move(cur_));
    }
    w.cv.notify_all();
    cur_ = Chunk{tree, index, buffer(), false};
  }

  // Chunk buffers go round between the walk and the workers: a fresh one
  // each time would be a fresh mapping, faulted in page by page.
  std::vector<std::byte> buffer() {
    std::lock_guard l(free_mu_);
    if (free_.empty()) {
      std::vector<std::byte> b;
      b.reserve(kChunkBytes + 8192);
      return b;
    }
    auto b = std::move(free_.back());
    free_.pop_back();
    b.clear();
    return b;
  }

  void run(Worker& w) {
    std::unique_ptr<Checker> c;
    for (;;) {
      Chunk ch;
      {
        std::unique_lock l(w.mu);
        w.cv.wait(l, [&] { return w.stop || !w.queue.empty(); });
        if (w.queue.empty()) return;
        ch = std::move(w.queue.front());
        w.queue.pop_front();
      }
      w.cv.notify_all();
      Tree& t = *ch.tree;
      if (!c)
        c = std::make_unique<Checker>(t.id, vol_->block_size(), data_ ? vol_.get() : nullptr, next_inode_,
                                      vol_->incompat());
      for (size_t p = 0; p < ch.bytes.size();) {
        Key k;
        uint32_t len;
        std::memcpy(&k, ch.bytes.data() + p, sizeof k);
        std::memcpy(&len, ch.bytes.data() + p + sizeof k, sizeof len);
        p += sizeof k + sizeof len;
        c->item(k, std::span<const std::byte>(ch.bytes.data() + p, len));
        p += len;
      }
      {
        std::lock_guard l(free_mu_);
        free_.push_back(std::move(ch.bytes));
      }
      if (ch.last) {
        c->finish();
        t.findings = std::move(c->findings());
        c.reset();
      }
    }
  }

  void stop() {
    for (auto& w : workers_) {
      {
        std::lock_guard l(w->mu);
        w->stop = true;
      }
      w->cv.notify_all();
    }
    for (auto& w : workers_)
      if (w->thread.joinable()) w->thread.join();
  }

  std::unique_ptr<Volume> vol_;
  bool data_;
  uint64_t next_inode_ = 0;
  std::deque<Tree> trees_;  // a deque: workers hold references while the walk appends
  Chunk cur_{nullptr, 0, {}, false};
  std::mutex free_mu_;
  std::vector<std::vector<std::byte>> free_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace

std::unique_ptr<ObjectChecker> feed_filesystems(BlockDevice& dev, bool data) {
  auto vol = open_to_check(dev);
  if (!vol) return nullptr;
  return std::make_unique<FedCheck>(std::move(*vol), data);
}

Result<std::vector<std::string>> repair_filesystems(Volume& vol, bool lossy, bool data) {
  std::vector<std::string> actions;
  {
    std::map<std::string, uint64_t> done;
    uint64_t none = 0;
    for (const auto& f : check_branches(vol)) {
      if (!lossy) continue;
      auto t = PLY_TRY(vol.begin({.reserve_blocks = Filesystem::kSetBranchBlocks}));
      RepairCtx c{t, TreeId{f.p.tree}, 0, none};
      PLY_CHECK(f.fix(c));
      done[f.done]++;
    }
    for (const auto& [what, n] : done) actions.push_back(what + " (" + std::to_string(n) + ")");
  }
  auto metas = Filesystem::branches(vol);  // names for the report; a damaged info item has none
  if (!metas) metas = std::vector<BranchMeta>{};
  for (TreeId id : PLY_TRY(fs_trees(vol))) {
    std::string name = "tree " + std::to_string(id.v);
    for (const auto& m : *metas)
      if (m.tree == id) name = "branch \"" + m.name + "\"";
    std::map<std::string, uint64_t> done;
    for (int i = 0; i < kMaxRounds; i++) {
      uint64_t root = 0;
      auto fs = scan_tree(vol, id, data, &root);
      if (!PLY_TRY(apply_round(vol, id, root, fs, lossy, done))) break;
    }
    for (const auto& [what, n] : done)
      actions.push_back(name + ": " + what + " (" + std::to_string(n) + ")");
  }
  return actions;
}

Result<std::unique_ptr<Volume>> open_to_check(BlockDevice& dev) {
  VolumeOptions vo;
  vo.read_only = true;
  vo.kinds = fs_kinds();
  vo.cache_bytes = 64ull << 20;
  return Volume::open(dev, vo);
}

std::vector<Problem> check_filesystems(BlockDevice& dev, bool data) {
  auto vol = open_to_check(dev);
  if (!vol) return {Problem{"F-item", Error::kNoBlock, "cannot open: " + vol.error().message(), 0}};
  return check_filesystems(**vol, data);
}

}  // namespace plyfs
