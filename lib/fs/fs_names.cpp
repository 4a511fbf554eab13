// Names and directories (format.md#fs-dirent): getattr and lookup, making
// objects, link, unlink, rmdir, rename and readdir.
#include "fs/fs.h"

#include <dirent.h>
#include <linux/fs.h>

#include <algorithm>

#include "fs/acl.h"
#include "fs/fs_internal.h"
#include "fs/quota.h"

namespace plyfs {

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
  Attr a = PLY_TRY(c.inode(e->ino)).a;
  placing_named(a, dir, name);
  return a;
}

Result<Attr> Filesystem::make_node(uint64_t dir, std::string_view name, uint32_t mode,
                                   uint64_t rdev, uint32_t uid, uint32_t gid,
                                   std::string_view target, uint32_t umask) {
  PLY_CHECK(check_name(name));
  if (read_only()) return Error::io(EROFS, "read-only filesystem");
  // A new inode may take a node; a symlink's target is data (format.md#quotas).
  const QuotaCharge quota = PLY_TRY(charge_quota(vol_, tree_, bs_ + target.size()));
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
  // A directory's compression flags pass to what is made in it, as btrfs's
  // do (format.md#fs-compress, "Policy").
  if (S_ISREG(mode) || is_dir) r.flags |= d.flags & (disk::kInodeCompress | disk::kInodeNoCompress);
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
  Attr a = PLY_TRY(make_node(dir, name, mode, rdev, uid, gid, {}, umask));
  placing_named(a, dir, name);
  return a;
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
  uint64_t freed = 0, erased = 0;
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
      erased = r.a.ino;
    } else {
      PLY_CHECK(c.put_inode(r));
      if (r.a.nlink == 0) {
        PLY_CHECK(c.t.put(tree_, ikey(0, ItemType::Orphan, r.a.ino), {}));
        freed = r.a.ino;
      }
    }
  }
  if (erased) placing_gone(erased);  // free_inode says so for the others
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
  PLY_CHECK(rename_names(odir, oname, ndir, nname, flags));
  // A new name may fall under another placement rule (format.md#migration).
  placing_renamed(ndir, nname);
  if (flags & RENAME_EXCHANGE) placing_renamed(odir, oname);
  return ok();
}

Result<void> Filesystem::rename_names(uint64_t odir, std::string_view oname, uint64_t ndir,
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

}  // namespace plyfs
