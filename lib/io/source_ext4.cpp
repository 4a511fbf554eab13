// An ext2/3/4 image or device as a source of entries (source.h), read with
// libext2fs without mounting it, as btrfs-convert does: directories walked
// with ext2fs_dir_iterate2, inodes read whole (nanosecond times, 32-bit
// owners), data found through the extent tree (uninitialized extents are
// holes, as ext4's SEEK_DATA says) or the block map of ext2/3 files, read
// straight from the device in runs; inline data, fast and slow symlinks;
// xattrs through ext2fs_xattrs_* (which hands POSIX ACLs over in the
// kernel's encoding). An image whose superblock records errors, that was
// not cleanly unmounted or whose journal needs recovery is refused unless
// `force`; every block and inode number read is checked against the image
// before it is used, so a damaged image is an error, never a crash.
#include <ext2fs/ext2fs.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <set>

#include "io/source.h"
#include "util/text.h"

namespace plyfs::io {

namespace {

constexpr uint64_t kReadBytes = 8u << 20;

struct Run {
  uint64_t lblk, pblk, len;  // blocks
};

struct Child {
  std::string name;
  ext2_ino_t ino;
};

struct Frame {
  std::string path;
  std::vector<Child> children;
  size_t next = 0;
};

timespec xtime(uint32_t sec, uint32_t extra, bool has_extra) {
  int64_t s = int32_t(sec);
  long ns = 0;
  if (has_extra) {
    s += int64_t(extra & 3) << 32;
    ns = long(extra >> 2);
    if (ns >= 1000000000) ns = 0;
  }
  return {s, ns};
}

class Ext4Source final : public EntrySource {
 public:
  Ext4Source(std::string path, bool force) : path_(std::move(path)), force_(force) {}
  ~Ext4Source() override {
    if (fs_) ext2fs_close_free(&fs_);
  }

  Result<void> open();
  Result<std::optional<SourceEntry>> next() override;
  Result<std::optional<DataPiece>> data() override;
  bool strips_leading_slash() const override { return false; }

 private:
  Error err(errcode_t e, const std::string& what) const;
  Error damaged(const std::string& what) const;
  Result<SourceEntry> describe(ext2_ino_t ino, const std::string& path);
  Result<std::vector<Child>> children(ext2_ino_t dir, const std::string& path);
  Result<std::vector<Xattr>> xattrs(ext2_ino_t ino, const std::string& path);
  Result<void> map_file(ext2_ino_t ino, ext2_inode* inode, const std::string& path);
  Result<std::string> small_data(ext2_ino_t ino, ext2_inode* inode, uint64_t size, const std::string& path);

  std::string path_;
  bool force_;
  ext2_filsys fs_ = nullptr;
  uint64_t nblocks_ = 0, bs_ = 0;
  std::vector<Frame> stack_;
  bool root_done_ = false;
  std::set<ext2_ino_t> dirs_seen_;
  // The current file: its runs (or inline bytes) and where the reading is.
  std::vector<Run> runs_;
  size_t run_ = 0;
  uint64_t run_off_ = 0, file_size_ = 0;
  std::string inline_;
  bool inline_pending_ = false;
  std::vector<std::byte> buf_;
};

Error Ext4Source::err(errcode_t e, const std::string& what) const {
  std::string m = shown(path_);
  m += ": ";
  m += what;
  m += ": ";
  m += error_message(e);
  return Error::io(EIO, m);
}

Error Ext4Source::damaged(const std::string& what) const {
  std::string m = shown(path_);
  m += ": a damaged ext4 image (";
  m += what;
  m += "): run e2fsck";
  return Error::io(EIO, m);
}

Result<void> Ext4Source::open() {
  initialize_ext2_error_table();
  int flags = EXT2_FLAG_64BITS | EXT2_FLAG_SKIP_MMP;
  if (force_) flags |= EXT2_FLAG_IGNORE_CSUM_ERRORS;
  if (errcode_t e = ext2fs_open2(path_.c_str(), nullptr, flags, 0, 0, unix_io_manager, &fs_)) {
    fs_ = nullptr;
    return err(e, "not an ext2/3/4 image libext2fs opens");
  }
  ext2_super_block* sb = fs_->super;
  if (!force_) {
    if (sb->s_state & EXT2_ERROR_FS) return damaged("its superblock records errors; --force imports it anyway");
    if (!(sb->s_state & EXT2_VALID_FS))
      return damaged("it was not cleanly unmounted, or is mounted; --force imports it anyway");
    if (ext2fs_has_feature_journal_needs_recovery(sb))
      return damaged("its journal needs recovery; --force imports it without");
    if (errcode_t e = ext2fs_check_desc(fs_)) return err(e, "its group descriptors are damaged (run e2fsck)");
  }
  nblocks_ = ext2fs_blocks_count(sb);
  bs_ = fs_->blocksize;
  total_ = (nblocks_ - std::min<uint64_t>(nblocks_, ext2fs_free_blocks_count(sb))) * bs_;
  buf_.resize(kReadBytes);
  return ok();
}

Result<std::vector<Child>> Ext4Source::children(ext2_ino_t dir, const std::string& path) {
  if (!dirs_seen_.insert(dir).second) return damaged("directory \"" + shown(path) + "\" appears twice");
  struct Ctx {
    std::vector<Child> out;
    ext2_ino_t max;
    bool bad = false;
  } c{{}, fs_->super->s_inodes_count};
  auto cb = [](ext2_ino_t, int, ext2_dir_entry* d, int, int, char*, void* p) -> int {
    auto* c = static_cast<Ctx*>(p);
    const int len = ext2fs_dirent_name_len(d);
    std::string name(d->name, size_t(len));
    if (name == "." || name == ".." || d->inode == 0) return 0;
    if (d->inode > c->max || name.empty() || name.find('/') != std::string::npos ||
        name.find('\0') != std::string::npos) {
      c->bad = true;
      return DIRENT_ABORT;
    }
    c->out.push_back({std::move(name), d->inode});
    return 0;
  };
  if (errcode_t e = ext2fs_dir_iterate2(fs_, dir, 0, nullptr, cb, &c))
    return err(e, "cannot read directory \"" + shown(path) + "\"");
  if (c.bad) return damaged("an entry of directory \"" + shown(path) + "\"");
  std::sort(c.out.begin(), c.out.end(), [](const Child& a, const Child& b) { return a.name < b.name; });
  return c.out;
}

Result<std::vector<Xattr>> Ext4Source::xattrs(ext2_ino_t ino, const std::string& path) {
  std::vector<Xattr> out;
  if (!ext2fs_has_feature_xattr(fs_->super)) return out;
  ext2_xattr_handle* h = nullptr;
  if (errcode_t e = ext2fs_xattrs_open(fs_, ino, &h)) return err(e, "cannot read the xattrs of \"" + shown(path) + "\"");
  errcode_t e = ext2fs_xattrs_read(h);
  std::vector<std::string> names;
  if (!e) {
    auto cb = [](char* name, char*, size_t, void* p) -> int {
      std::string_view n = name;
      if (n != "system.data")  // ext4's inline data, not an xattr of the file
        static_cast<std::vector<std::string>*>(p)->push_back(std::string(n));
      return 0;
    };
    e = ext2fs_xattrs_iterate(h, cb, &names);
  }
  // Each value through ext2fs_xattr_get, which turns an ACL from ext4's
  // on-disk form into the kernel's (iterate hands over the stored bytes).
  for (size_t i = 0; !e && i < names.size(); i++) {
    void* v = nullptr;
    size_t len = 0;
    e = ext2fs_xattr_get(h, names[i].c_str(), &v, &len);
    if (e) break;
    auto* b = static_cast<const std::byte*>(v);
    out.push_back({names[i], std::vector<std::byte>(b, b + len)});
    ext2fs_free_mem(&v);
  }
  ext2fs_xattrs_close(&h);
  if (e) return err(e, "cannot read the xattrs of \"" + shown(path) + "\"");
  return out;
}

// Inline data, and a fast symlink's target in i_block.
Result<std::string> Ext4Source::small_data(ext2_ino_t ino, ext2_inode* inode, uint64_t size, const std::string& path) {
  if (inode->i_flags & EXT4_INLINE_DATA_FL) {
    std::string s(std::max<size_t>(size_t(EXT2_INODE_SIZE(fs_->super)) + 4096, size_t(size)), '\0');
    size_t got = 0;
    if (size > 65536) return damaged("inline data of \"" + shown(path) + "\" larger than an inode");
    if (errcode_t e = ext2fs_inline_data_get(fs_, ino, inode, s.data(), &got))
      return err(e, "cannot read the inline data of \"" + shown(path) + "\"");
    s.resize(std::min<size_t>(got, size_t(size)));
    return s;
  }
  if (size > sizeof inode->i_block) return damaged("symlink \"" + shown(path) + "\"");
  return std::string(reinterpret_cast<const char*>(inode->i_block), size_t(size));
}

// The file's data as runs of blocks: extents (uninitialized ones are
// holes) or the block map.
Result<void> Ext4Source::map_file(ext2_ino_t ino, ext2_inode* inode, const std::string& path) {
  runs_.clear();
  if (inode->i_flags & EXT4_EXTENTS_FL) {
    ext2_extent_handle_t h;
    if (errcode_t e = ext2fs_extent_open2(fs_, ino, inode, &h)) return err(e, "cannot read the extents of \"" + shown(path) + "\"");
    ext2fs_extent x;
    errcode_t e = ext2fs_extent_get(h, EXT2_EXTENT_ROOT, &x);
    for (size_t guard = 0; !e; guard++) {
      if (guard > (nblocks_ + 16) * 4) {
        e = EXT2_ET_EXTENT_NOT_FOUND;
        break;
      }
      if ((x.e_flags & EXT2_EXTENT_FLAGS_LEAF) && !(x.e_flags & EXT2_EXTENT_FLAGS_UNINIT) && x.e_len)
        runs_.push_back({x.e_lblk, x.e_pblk, x.e_len});
      e = ext2fs_extent_get(h, EXT2_EXTENT_NEXT_LEAF, &x);
    }
    ext2fs_extent_free(h);
    if (e != EXT2_ET_EXTENT_NO_NEXT) return err(e, "cannot read the extents of \"" + shown(path) + "\"");
  } else {
    struct Ctx {
      std::vector<Run>* runs;
    } c{&runs_};
    auto cb = [](ext2_filsys, blk64_t* b, e2_blkcnt_t lblk, blk64_t, int, void* p) -> int {
      auto* runs = static_cast<Ctx*>(p)->runs;
      if (lblk < 0 || *b == 0) return 0;  // metadata blocks of the map
      if (!runs->empty() && runs->back().lblk + runs->back().len == uint64_t(lblk) &&
          runs->back().pblk + runs->back().len == *b)
        runs->back().len++;
      else
        runs->push_back({uint64_t(lblk), *b, 1});
      return 0;
    };
    if (errcode_t e = ext2fs_block_iterate3(fs_, ino, BLOCK_FLAG_READ_ONLY | BLOCK_FLAG_DATA_ONLY, nullptr, cb, &c))
      return err(e, "cannot read the block map of \"" + shown(path) + "\"");
  }
  std::sort(runs_.begin(), runs_.end(), [](const Run& a, const Run& b) { return a.lblk < b.lblk; });
  const uint64_t max_lblk = (file_size_ + bs_ - 1) / bs_;
  std::vector<Run> keep;
  uint64_t end = 0;
  for (Run r : runs_) {
    if (r.pblk >= nblocks_ || r.len > nblocks_ - r.pblk || r.lblk < end)
      return damaged("the data map of \"" + shown(path) + "\"");
    if (r.lblk >= max_lblk) continue;  // preallocated past the end
    r.len = std::min(r.len, max_lblk - r.lblk);
    end = r.lblk + r.len;
    keep.push_back(r);
  }
  runs_ = std::move(keep);
  return ok();
}

Result<SourceEntry> Ext4Source::describe(ext2_ino_t ino, const std::string& path) {
  ext2_inode_large in{};
  if (errcode_t e = ext2fs_read_inode_full(fs_, ino, reinterpret_cast<ext2_inode*>(&in), sizeof in))
    return err(e, "cannot read the inode of \"" + shown(path) + "\"");
  auto* inode = reinterpret_cast<ext2_inode*>(&in);
  const bool large = EXT2_INODE_SIZE(fs_->super) > EXT2_GOOD_OLD_INODE_SIZE;
  auto has = [&](size_t field_end) { return large && size_t(EXT2_GOOD_OLD_INODE_SIZE + in.i_extra_isize) >= field_end; };
  SourceEntry e = SourceEntry::of(path, in.i_mode, inode_uid(in), inode_gid(in),
                                  xtime(in.i_atime, in.i_atime_extra, has(offsetof(ext2_inode_large, i_atime_extra) + 4)),
                                  xtime(in.i_mtime, in.i_mtime_extra, has(offsetof(ext2_inode_large, i_mtime_extra) + 4)));
  const uint64_t size = EXT2_I_SIZE(inode);
  if (in.i_flags & EXT4_ENCRYPT_FL)
    return Error::io(EOPNOTSUPP, shown(path_) + ": \"" + shown(path) + "\" is encrypted (fscrypt): its data cannot be read without its key");
  e.link_key = S_ISDIR(in.i_mode) ? 0 : ino;
  runs_.clear();
  run_ = 0;
  run_off_ = 0;
  inline_pending_ = false;
  file_size_ = 0;
  switch (in.i_mode & S_IFMT) {
    case S_IFREG:
      e.size = file_size_ = size;
      if (in.i_flags & EXT4_INLINE_DATA_FL) {
        inline_ = PLY_TRY(small_data(ino, inode, size, path));
        inline_pending_ = !inline_.empty();
      } else {
        PLY_CHECK(map_file(ino, inode, path));
      }
      break;
    case S_IFLNK:
      if (size == 0 || size > 4095) return damaged("symlink \"" + shown(path) + "\"");
      if (ext2fs_is_fast_symlink(inode) || (in.i_flags & EXT4_INLINE_DATA_FL)) {
        e.target = PLY_TRY(small_data(ino, inode, size, path));
      } else {
        file_size_ = size;
        PLY_CHECK(map_file(ino, inode, path));
        std::string t;
        while (auto piece = PLY_TRY(data())) t.append(reinterpret_cast<const char*>(piece->bytes.data()), piece->bytes.size());
        t.resize(size_t(size), '\0');
        e.target = std::move(t);
        file_size_ = 0;
      }
      break;
    case S_IFCHR:
    case S_IFBLK:
      if (in.i_block[0]) e.rdev = makedev((in.i_block[0] >> 8) & 0xff, in.i_block[0] & 0xff);
      else e.rdev = makedev((in.i_block[1] & 0xfff00) >> 8, (in.i_block[1] & 0xff) | ((in.i_block[1] >> 12) & 0xfff00));
      break;
    case S_IFDIR:
    case S_IFIFO:
    case S_IFSOCK:
      break;
    default:
      return damaged("inode " + std::to_string(ino) + " (\"" + shown(path) + "\") of no known type");
  }
  e.xattrs = PLY_TRY(xattrs(ino, path));
  return e;
}

Result<std::optional<SourceEntry>> Ext4Source::next() {
  runs_.clear();
  inline_pending_ = false;
  if (!root_done_) {
    root_done_ = true;
    SourceEntry root = PLY_TRY(describe(EXT2_ROOT_INO, ""));
    if (!S_ISDIR(root.mode)) return damaged("the root is not a directory");
    stack_.push_back(Frame{"", PLY_TRY(children(EXT2_ROOT_INO, "")), 0});
    return std::optional<SourceEntry>(std::move(root));
  }
  while (!stack_.empty()) {
    Frame& f = stack_.back();
    if (f.next == f.children.size()) {
      stack_.pop_back();
      continue;
    }
    const Child c = f.children[f.next++];
    const std::string path = f.path.empty() ? c.name : f.path + "/" + c.name;
    SourceEntry e = PLY_TRY(describe(c.ino, path));
    if (S_ISDIR(e.mode)) {
      auto kids = PLY_TRY(children(c.ino, path));
      // The lost+found mke2fs makes, while empty, is ext4's, not the tree's.
      if (path == "lost+found" && kids.empty()) continue;
      if (stack_.size() > 4096) return damaged("directories nested too deep");
      stack_.push_back(Frame{path, std::move(kids), 0});
    }
    return std::optional<SourceEntry>(std::move(e));
  }
  return std::optional<SourceEntry>{};
}

Result<std::optional<DataPiece>> Ext4Source::data() {
  if (inline_pending_) {
    inline_pending_ = false;
    read_ += inline_.size();
    return std::optional<DataPiece>(DataPiece{0, std::as_bytes(std::span(inline_.data(), inline_.size()))});
  }
  while (run_ < runs_.size() && run_off_ == runs_[run_].len) run_++, run_off_ = 0;
  if (run_ >= runs_.size()) return std::optional<DataPiece>{};
  const Run& r = runs_[run_];
  const uint64_t n = std::min<uint64_t>(r.len - run_off_, kReadBytes / bs_);
  if (errcode_t e = io_channel_read_blk64(fs_->io, r.pblk + run_off_, int(n), buf_.data()))
    return err(e, "cannot read data blocks");
  const uint64_t off = (r.lblk + run_off_) * bs_;
  run_off_ += n;
  const uint64_t len = std::min<uint64_t>(n * bs_, file_size_ - std::min(file_size_, off));
  read_ += len;
  if (len == 0) return data();
  return std::optional<DataPiece>(DataPiece{off, std::span<const std::byte>(buf_).first(size_t(len))});
}

}  // namespace

Result<std::unique_ptr<EntrySource>> open_ext4_source(const std::string& image, bool force) {
  auto s = std::make_unique<Ext4Source>(image, force);
  PLY_CHECK(s->open());
  return std::unique_ptr<EntrySource>(std::move(s));
}

}  // namespace plyfs::io
