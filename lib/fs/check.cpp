// Filesystem-object checks, F1-F6 (check.h, format.md#fs-invariants).
//
// One ordered scan of each filesystem tree collects what each object is and
// what points at it; the checks then compare the two sides.
#include "fs/check.h"

#include <sys/stat.h>

#include <dirent.h>

#include <map>
#include <set>

#include "fs/disk_fs.h"
#include "fs/fs.h"
#include "util/checksum.h"

namespace plyfs {
namespace {

using disk::ItemType;
using disk::kOffMask;
using disk::kInodeInline;

struct InodeInfo {
  uint32_t mode = 0, nlink = 0, flags = 0;
  uint64_t size = 0, blocks = 0, parent = 0;
  uint64_t mapped = 0;     // blocks mapped by extent items
  uint64_t ext_end = 0;    // end of the last extent item seen
  uint32_t names = 0;      // dirent records naming it
  uint32_t subdirs = 0;    // for a directory: records naming directories
  std::set<uint64_t> named_in;  // directories holding a record for it
};

class Checker {
 public:
  Checker(TreeId t, uint32_t bs, std::vector<Problem>& out, Volume* data)
      : tree_(t), bs_(bs), out_(out), data_(data) {}

  void problem(const std::string& code, uint64_t ino, const std::string& what) {
    out_.push_back(Problem{code, Error::kNoBlock,
                           (ino ? "inode " + std::to_string(ino) + ": " : std::string()) + what,
                           tree_.v});
  }

  void item(Key k, std::span<const std::byte> v) {
    const uint64_t ino = k.hi, off = k.lo & kOffMask;
    const auto type = ItemType(k.lo >> 56);
    if (ino == 0) {
      if (type == ItemType::FsInfo && off == 0) return info(v);
      if (type == ItemType::Orphan) return (void)orphans_.insert(off);
      return problem("F-item", 0, "unexpected item of type " + std::to_string(int(type)) +
                                      " in object 0");
    }
    if (type == ItemType::Inode) {
      if (v.size() != sizeof(disk::Inode)) return problem("F-item", ino, "inode item of wrong size");
      const auto* d = view_as<disk::Inode>(v);
      InodeInfo& i = inodes_[ino];
      i.mode = d->mode.get();
      i.nlink = d->nlink.get();
      i.flags = d->flags.get();
      i.size = d->size.get();
      i.blocks = d->blocks.get();
      i.parent = d->parent.get();
      return;
    }
    objects_.insert(ino);
    switch (type) {
      case ItemType::Dirent: return dirents(ino, v);
      case ItemType::Xattr: return xattrs(ino, v);
      case ItemType::Inline: return inline_item(ino, off, v);
      case ItemType::Extent: return extent(ino, off, v);
      default: return problem("F-item", ino, "item of unknown type " + std::to_string(int(type)));
    }
  }

  void finish() {
    if (!root_) problem("F1-info", 0, "the filesystem info item is missing");
    else if (!inodes_.count(root_) || !S_ISDIR(inodes_[root_].mode))
      problem("F1-info", root_, "the root directory is missing or not a directory");
    for (uint64_t o : objects_)
      if (!inodes_.count(o)) problem("F6-orphan-item", o, "items of an inode that does not exist");
    for (uint64_t o : orphans_)
      if (!inodes_.count(o)) problem("F6-orphan-item", o, "orphan entry for a missing inode");
    for (const auto& [t, dir] : targets_)
      if (!inodes_.count(t)) problem("F2-dirent", dir, "an entry names missing inode " + std::to_string(t));
    for (auto& [ino, i] : inodes_) {
      const bool orphan = orphans_.count(ino);
      if (S_ISDIR(i.mode)) {
        if (ino == root_) {
          if (i.names) problem("F3-parent", ino, "the root directory has a name");
        } else if (!orphan) {
          if (i.names != 1) problem("F3-parent", ino, "directory with " + std::to_string(i.names) + " names");
          else if (!i.named_in.count(i.parent))
            problem("F3-parent", ino, "directory's parent field does not name the directory holding it");
        }
        if (!orphan && i.nlink != 2 + i.subdirs)
          problem("F2-nlink", ino, "directory nlink " + std::to_string(i.nlink) + ", expected " +
                                       std::to_string(2 + i.subdirs));
      } else if (i.nlink != i.names && !(i.nlink == 0 && orphan)) {
        problem("F2-nlink", ino, "nlink " + std::to_string(i.nlink) + " but " +
                                     std::to_string(i.names) + " names");
      }
      if (i.mapped && !S_ISREG(i.mode)) problem("F4-extent", ino, "extent items on a non-regular file");
      if (i.blocks != i.mapped * (bs_ / 512))
        problem("F4-blocks", ino, "blocks " + std::to_string(i.blocks) + ", extents map " +
                                      std::to_string(i.mapped * (bs_ / 512)));
      if ((i.flags & disk::kInodeOpaque) && !S_ISDIR(i.mode))
        problem("U2-opaque", ino, "the opaque flag on a non-directory");
      if (S_ISREG(i.mode) && (i.flags & kInodeInline) && i.mapped)
        problem("F5-inline", ino, "inline file with extent items");
    }
    for (const auto& [ino, off] : inline_)
      if (auto it = inodes_.find(ino); it != inodes_.end()) {
        const InodeInfo& i = it->second;
        if (!(S_ISLNK(i.mode) || (S_ISREG(i.mode) && (i.flags & kInodeInline))))
          problem("F5-inline", ino, "inline data on an object that keeps none");
        else if (off >= i.size)
          problem("F5-inline", ino, "inline chunk at " + std::to_string(off) + " past the size");
      }
    for (const auto& [dir, typed] : entry_types_)
      for (const auto& [t, type] : typed)
        if (auto it = inodes_.find(t); it != inodes_.end() && IFTODT(it->second.mode) != type)
          problem("F2-dirent", dir, "entry type disagrees with inode " + std::to_string(t));
  }

 private:
  void info(std::span<const std::byte> v) {
    if (v.size() != sizeof(disk::FsInfo)) return problem("F1-info", 0, "info item of wrong size");
    const auto* d = view_as<disk::FsInfo>(v);
    if (d->magic.get() != disk::kFsMagic || d->version.get() < disk::kFsVersionMin ||
        d->version.get() > disk::kFsVersion)
      return problem("F1-info", 0, "bad magic or version in the info item");
    root_ = d->root_ino.get();
  }

  void dirents(uint64_t dir, std::span<const std::byte> v) {
    size_t p = 0;
    std::set<uint8_t> seqs;
    while (p < v.size()) {
      if (v.size() - p < sizeof(disk::Dirent)) return problem("F-item", dir, "truncated directory entry");
      const auto* d = view_as<disk::Dirent>(v, p);
      if (d->name_len == 0 || v.size() - p - sizeof(disk::Dirent) < d->name_len || d->seq >= 128 ||
          !seqs.insert(d->seq).second)
        return problem("F-item", dir, "malformed directory entry");
      const uint64_t t = d->ino.get();
      p += sizeof(disk::Dirent) + d->name_len;
      if (d->type == disk::kDtWhiteout) {  // names no inode (format.md#fs-union)
        if (t != 0) problem("U1-whiteout", dir, "a whiteout entry names inode " + std::to_string(t));
        continue;
      }
      if (t == 0) {
        problem("F2-dirent", dir, "an entry names inode 0");
        continue;
      }
      targets_.emplace(t, dir);
      InodeInfo& i = inodes_[t];  // may be created before its inode item is seen
      i.names++;
      i.named_in.insert(dir);
      if (d->type == DT_DIR) inodes_[dir].subdirs++;
      entry_types_[dir].emplace_back(t, d->type);
    }
  }

  void xattrs(uint64_t ino, std::span<const std::byte> v) {
    size_t p = 0;
    while (p < v.size()) {
      if (v.size() - p < sizeof(disk::XattrEntry)) return problem("F-item", ino, "truncated xattr");
      const auto* d = view_as<disk::XattrEntry>(v, p);
      const size_t n = d->name_len, m = d->value_len.get();
      if (n == 0 || v.size() - p - sizeof(disk::XattrEntry) < n + m)
        return problem("F-item", ino, "malformed xattr");
      p += sizeof(disk::XattrEntry) + n + m;
    }
  }

  void inline_item(uint64_t ino, uint64_t off, std::span<const std::byte> v) {
    if (off % disk::kInlineChunk || v.size() > disk::kInlineChunk || v.empty())
      return problem("F5-inline", ino, "malformed inline chunk");
    inline_.emplace_back(ino, off);
  }

  void extent(uint64_t ino, uint64_t blk, std::span<const std::byte> v) {
    if (v.size() < sizeof(disk::Extent)) return problem("F4-extent", ino, "extent item too short");
    const auto* d = view_as<disk::Extent>(v);
    const uint32_t n = d->nblocks.get();
    const bool pre = d->flags & disk::kExtentPrealloc;
    if (n == 0 || n > disk::kMaxExtentBlocks || d->compression != disk::kCompressNone ||
        (d->flags & ~disk::kExtentPrealloc) || d->offset.get() > d->disk_nblocks.get() ||
        n > d->disk_nblocks.get() - d->offset.get() ||
        v.size() != sizeof(disk::Extent) + (pre ? 0 : 8ull * n))
      return problem("F4-extent", ino, "malformed extent item at block " + std::to_string(blk));
    InodeInfo& i = inodes_[ino];
    if (blk < i.ext_end)
      problem("F4-extent", ino, "extent items overlap at block " + std::to_string(blk));
    i.ext_end = blk + n;
    i.mapped += n;
    if (data_ && !pre) {
      // -c: every block against its checksum (format.md#fs-extent).
      std::vector<std::byte> buf(uint64_t(n) * bs_);
      auto r = data_->read_data(BlockNo{d->disk_start.get() + d->offset.get()}, buf);
      if (!r) return problem("F7-data", ino, "cannot read the data at file block " + std::to_string(blk) + ": " + r.error().message());
      for (uint32_t b = 0; b < n; b++)
        if (xxh3(std::span(buf).subspan(uint64_t(b) * bs_, bs_)) !=
            view_as<le64>(v, sizeof(disk::Extent) + 8ull * b)->get())
          problem("F7-data", ino, "data checksum mismatch at file block " + std::to_string(blk + b) +
                                      " (device block " +
                                      std::to_string(d->disk_start.get() + d->offset.get() + b) + ")");
    }
  }

  TreeId tree_;
  uint32_t bs_;
  std::vector<Problem>& out_;
  Volume* data_;  // -c: read and verify data blocks
  uint64_t root_ = 0;
  std::map<uint64_t, InodeInfo> inodes_;
  std::set<uint64_t> objects_, orphans_;
  std::multimap<uint64_t, uint64_t> targets_;  // target inode -> directory
  std::map<uint64_t, std::vector<std::pair<uint64_t, uint8_t>>> entry_types_;
  std::vector<std::pair<uint64_t, uint64_t>> inline_;
};

}  // namespace

namespace {
// The branch fields (pass 6): parents name filesystem trees, without cycles;
// names are unique.
void check_branches(Volume& vol, std::vector<Problem>& out) {
  auto bs = Filesystem::branches(vol);
  if (!bs) return;  // the per-tree checks report unreadable info items
  std::map<uint64_t, const BranchMeta*> by_id;
  std::set<std::string> names;
  for (const auto& b : *bs) {
    by_id[b.tree.v] = &b;
    // A doomed tree's name is free (format.md#snapshots): a rollback's new
    // branch has it while the old one waits to be dropped.
    if (!b.doomed && !names.insert(b.name).second)
      out.push_back(Problem{"U3-branch", Error::kNoBlock, "two branches are named \"" + b.name + "\"", b.tree.v});
  }
  for (const auto& b : *bs) {
    // A doomed tree's fields no longer matter: drop_doomed drops them one at
    // a time, so one may outlive the parent it names.
    if (b.doomed) continue;
    if (b.parent.v && !by_id.count(b.parent.v)) {
      out.push_back(Problem{"U3-branch", Error::kNoBlock,
                            "branch \"" + b.name + "\" names missing parent tree " + std::to_string(b.parent.v),
                            b.tree.v});
      continue;
    }
    uint64_t p = b.parent.v;
    for (size_t steps = 0; p; steps++) {
      if (steps > by_id.size() || p == b.tree.v) {
        out.push_back(Problem{"U3-branch", Error::kNoBlock, "branch \"" + b.name + "\" is its own ancestor", b.tree.v});
        break;
      }
      auto it = by_id.find(p);
      p = it == by_id.end() ? 0 : it->second->parent.v;
    }
  }
}
}  // namespace

std::vector<Problem> check_filesystems(Volume& vol, bool data) {
  std::vector<Problem> out;
  check_branches(vol, out);
  auto t = vol.begin();
  if (!t) {
    out.push_back(Problem{"F-item", Error::kNoBlock, "cannot read: " + t.error().message(), 0});
    return out;
  }
  auto trees = t->list_trees();
  if (!trees) {
    out.push_back(Problem{"F-item", Error::kNoBlock, "cannot list the trees: " + trees.error().message(), 0});
    return out;
  }
  for (const auto& ti : *trees) {
    if (ti.kind != disk::kKindFs) continue;
    Checker c(ti.id, vol.block_size(), out, data ? &vol : nullptr);
    auto r = t->scan(ti.id, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
      c.item(k, v);
      return true;
    });
    if (!r) {
      out.push_back(Problem{"F-item", r.error().block, "cannot read the tree: " + r.error().message(), ti.id.v});
      continue;
    }
    c.finish();
  }
  return out;
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
