// What the parts of the filesystem-object checker (check.h, check*.cpp)
// share: the tables one scan of a tree fills, the findings with their
// repairs, lenient decoders of damaged items, and the Checker itself.
// Private to lib/fs: nothing outside it includes this header.
#pragma once

#include <algorithm>
#include <bitset>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "commit/volume.h"
#include "fs/check.h"
#include "fs/disk_fs.h"
#include "fs/items.h"

namespace plyfs::fscheck {

using namespace fsitems;
using disk::kDtWhiteout;
using Repair = Problem::Repair;

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

// The objects of one tree, sorted by inode number. A sound tree is scanned
// in key order, which is inode-number order: an object's entry is made by
// its first item and appended, so a million-file tree costs one pass of
// appends, then binary searches. A damaged leaf can hand over keys out of
// order (format.md#btree-invariants, T1: a key's `hi` is read from disk and
// may be anything); such an entry is inserted at its place, so the table
// stays sorted and every lookup finds what at_scan made.
class InodeTable {
 public:
  InodeInfo& at_scan(uint64_t ino) {
    if (v_.empty() || v_.back().first < ino) return v_.emplace_back(ino, InodeInfo{}).second;
    if (v_.back().first == ino) return v_.back().second;
    auto it = std::lower_bound(v_.begin(), v_.end(), ino, [](const auto& e, uint64_t x) { return e.first < x; });
    if (it == v_.end() || it->first != ino) it = v_.emplace(it, ino, InodeInfo{});
    return it->second;
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
  int round = 0;     // 1-4 (check.cpp); 0: no repair
  std::string done;  // the repair, as the report says it (aggregated)
  FixFn fix;
};

inline bool valid_name(std::string_view n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string_view::npos &&
         n.find('\0') == std::string_view::npos;
}

// The records of a Dirent item up to the first malformed one; a repeated
// seq is dropped. `bad` says whether anything was left out.
inline void lenient_dirents(std::span<const std::byte> v, std::vector<DirentRec>& out, bool* bad = nullptr,
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
inline std::vector<DirentRec> lenient_dirents(std::span<const std::byte> v) {
  std::vector<DirentRec> out;
  lenient_dirents(v, out);
  return out;
}

// The xattr records up to the first malformed one (an out-of-line record
// whose XattrOutline is not one counts as malformed).
inline std::vector<std::byte> lenient_xattrs(std::span<const std::byte> v, bool* bad) {
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
inline uint64_t extent_ref(Key k, std::span<const std::byte> v) {
  if (type_of(k) != ItemType::Extent || k.hi == 0 || v.size() < sizeof(disk::Extent)) return 0;
  return view_as<disk::Extent>(v)->disk_start.get();
}

// Repair steps (check_repair.cpp).
Result<void> erase_item(RepairCtx& c, Key k, uint64_t ref);
Result<void> punch_block(RepairCtx& c, uint64_t ino, uint64_t fb);
Result<void> edit_bucket(RepairCtx& c, uint64_t dir, uint64_t h,
                         const std::function<Result<void>(std::vector<DirentRec>&)>& fn);
Result<void> drop_record(RepairCtx& c, uint64_t dir, uint64_t h, uint8_t seq);
Result<void> add_record(RepairCtx& c, uint64_t dir, const std::string& name, uint64_t ino, uint8_t type);
Result<void> erase_chunks(RepairCtx& c, uint64_t ino, uint64_t id);
Result<void> drop_xattr(RepairCtx& c, uint64_t ino, uint64_t h, const std::string& name, uint64_t id,
                        bool chunks);
Result<void> cut_chunks(RepairCtx& c, uint64_t ino, uint64_t id, uint64_t len);
Result<void> patch_inode(RepairCtx& c, uint64_t ino, const std::function<void(Rec&)>& fn);
Result<void> reconnect(RepairCtx& c, uint64_t ino, uint32_t mode);
Result<void> patch_info(RepairCtx& c, const std::function<void(disk::FsInfo&)>& fn);
Result<void> remake_dir(RepairCtx& c, uint64_t ino, uint64_t parent);
Result<void> renumber(RepairCtx& c, uint64_t ino, const std::vector<NameRec>& names);

// The checks of one tree: item() for each item of one ordered scan, then
// finish(), then findings().
class Checker {
 public:
  Checker(TreeId t, uint32_t bs, Volume* data, uint64_t next_inode, uint64_t incompat, uint64_t ro_compat)
      : tree_(t), bs_(bs), data_(data), next_inode_(next_inode), incompat_(incompat), ro_compat_(ro_compat) {}

  std::vector<Finding>& findings() { return out_; }
  uint64_t root() const { return root_; }

  // check_scan.cpp
  void item(Key k, std::span<const std::byte> v);
  // check_objects.cpp
  void modes();
  void finish();

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

  FixFn erase(Key k, std::span<const std::byte> v) {
    return [k, ref = extent_ref(k, v)](RepairCtx& c) { return erase_item(c, k, ref); };
  }
  FixFn drop(const NameRec& n) {
    return [dir = n.dir, h = n.hash, seq = n.seq](RepairCtx& c) { return drop_record(c, dir, h, seq); };
  }

  // Each item on its own, as the scan meets it (check_scan.cpp).
  void inode_fields(uint64_t ino, const disk::Inode& d);
  void info(std::span<const std::byte> v);
  void dirents(Key k, std::span<const std::byte> v);
  void xattrs(Key k, std::span<const std::byte> v);
  void xattr_chunk(Key k, std::span<const std::byte> v);
  void inline_item(Key k, std::span<const std::byte> v);
  void extent(Key k, std::span<const std::byte> v);

  // Whole objects, after the scan (check_objects.cpp).
  void info_and_root();
  void findings_fix_info(uint64_t root);
  void inode_numbers();
  void xattr_values();
  void object(uint64_t ino, InodeInfo& i);

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
  uint64_t ro_compat_;  // and its ro_compat ones
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
  // Something of the COMPRESS feature (format.md#fs-compress) was found:
  // the image must carry its bit. Reported once.
  void uses_compression(uint64_t ino, const std::string& what);
  bool compress_reported_ = false;
};

}  // namespace plyfs::fscheck
