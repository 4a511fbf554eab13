// Attributes: setattr, and the extended attributes (format.md#fs-xattr),
// whose large values live out of line.
#include "fs/fs.h"

#include <linux/fs.h>

#include <sys/stat.h>
#include <sys/xattr.h>

#include <algorithm>

#include "fs/fs_internal.h"
#include "fs/quota.h"

namespace plyfs {

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
  // A new owner, mode or size may fall under another placement rule
  // (format.md#migration).
  if (s.uid || s.gid || s.mode || s.size) placing_changed(r.a);
  return r.a;
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
  const QuotaCharge quota = PLY_TRY(charge_quota(vol_, tree_, name.size() + value.size()));
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

Result<uint32_t> Filesystem::get_fsflags(uint64_t ino) {
  auto t = PLY_TRY(vol_.begin());
  Ctx c{*this, std::move(t)};
  std::shared_lock lk(mu_);
  Rec r = PLY_TRY(c.inode(ino));
  return uint32_t((r.flags & disk::kInodeCompress ? FS_COMPR_FL : 0) |
                  (r.flags & disk::kInodeNoCompress ? FS_NOCOMP_FL : 0));
}

Result<void> Filesystem::set_fsflags(uint64_t ino, uint32_t fs_flags) {
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  if (fs_flags & ~uint32_t(FS_COMPR_FL | FS_NOCOMP_FL))
    return Error::io(EOPNOTSUPP, "plyfs keeps only the c and m attributes");
  if ((fs_flags & FS_COMPR_FL) && (fs_flags & FS_NOCOMP_FL))
    return Error::invalid("a file is either compressed (c) or not (m)");
  auto t = PLY_TRY(vol_.begin({.reserve_blocks = 4 * kOpBlocks}));
  Ctx c{*this, std::move(t)};
  std::unique_lock lk(mu_);
  Rec r = PLY_TRY(c.inode(ino));
  if (!S_ISREG(r.a.mode) && !S_ISDIR(r.a.mode)) return Error::io(ENOTTY, "not a regular file or directory");
  const uint32_t want = (r.flags & ~(disk::kInodeCompress | disk::kInodeNoCompress)) |
                        (fs_flags & FS_COMPR_FL ? disk::kInodeCompress : 0) |
                        (fs_flags & FS_NOCOMP_FL ? disk::kInodeNoCompress : 0);
  if (want == r.flags) return ok();
  r.flags = want;
  r.a.ctime = now();
  if (want & (disk::kInodeCompress | disk::kInodeNoCompress)) c.t.add_incompat(kIncompatCompress);
  return c.put_inode(r);
}

}  // namespace plyfs
