// The FUSE operations on the mounted union's names and attributes (lookup,
// create and delete names, attributes, listings, statfs), and the table of
// all the session's operations (make_ops). A node of the control folder
// (is_ctl) goes to the folder (ctl_folder.h).
#include <dirent.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "daemon.h"

namespace plyfs::daemon {

namespace {

// --- operations ---------------------------------------------------------------------

void op_init(void*, fuse_conn_info* conn) {
  // The writeback cache makes the kernel the owner of an open file's size
  // and times (format.md#control-folder, "Caching"); -o nowriteback leaves
  // them to the daemon.
  if (g->writeback && (conn->capable & FUSE_CAP_WRITEBACK_CACHE)) {
    conn->want |= FUSE_CAP_WRITEBACK_CACHE;
    g->kernel_caches_writes = true;
    g->u->set_kernel_times(true);  // the kernel owns mtime/ctime of written files
    g->ctl->set_kernel_times(true);
  }
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
  if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
  // With ACLs the filesystem applies the umask itself, because a default
  // ACL replaces it (lib/fs/acl.h).
  if (g->acl && (conn->capable & FUSE_CAP_POSIX_ACL) && (conn->capable & FUSE_CAP_DONT_MASK)) {
    conn->want |= FUSE_CAP_POSIX_ACL | FUSE_CAP_DONT_MASK;
    g->dont_mask = true;
  }
  if (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT) g->no_opendir = true;
  conn->max_write = 1u << 20;
  conn->max_readahead = kMaxReadahead;  // and the mount's read_ahead_kb (plyfs.cpp)
  // No splice (FUSE_CAP_SPLICE_READ/WRITE/MOVE): every data block is
  // checksummed on its way in and verified on its way out (format.md#fs-extent),
  // so the bytes pass through the daemon's memory anyway; splicing from
  // /dev/fuse into a pipe would add a copy out of the pipe, not save one.
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (is_ctl(parent)) return g->ctl->lookup(req, parent, name);
  if (is_ctl_name(parent, name)) return g->ctl->lookup_root(req);  // shadows a branch's .plyfs
  auto a = fs().lookup(to_fs(parent), name);
  if (!a && a.error().code == ENOENT) {
    fuse_entry_param e{};  // a negative entry, cached like a positive one
    e.entry_timeout = g->timeout;
    fuse_reply_entry(req, &e);
    return;
  }
  reply_entry(req, a);
}

void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  if (is_ctl(ino)) {
    g->ctl->forget(ino, n);
    return fuse_reply_none(req);
  }
  auto r = fs().unpin(to_fs(ino), n);
  if (!r) (void)errno_of(r.error());
  fuse_reply_none(req);
}

void op_forget_multi(fuse_req_t req, size_t count, fuse_forget_data* list) {
  for (size_t i = 0; i < count; i++) {
    if (is_ctl(list[i].ino)) {
      g->ctl->forget(list[i].ino, list[i].nlookup);
      continue;
    }
    auto r = fs().unpin(to_fs(list[i].ino), list[i].nlookup);
    if (!r) (void)errno_of(r.error());
  }
  fuse_reply_none(req);
}

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (is_ctl(ino)) return g->ctl->getattr(req, ino);
  auto a = fs().getattr(to_fs(ino));
  if (!a) return reply_err(req, a.error());
  struct stat st = to_stat(*a);
  fuse_reply_attr(req, &st, g->timeout);
}

// access(2). The daemon checks no permission (plyfs.cpp): whoever reaches
// the mount may do what its owner, the mount's user, may. What it must
// still say is what the kernel says to root on any filesystem: X_OK of a
// file (not a directory) with no execute bit is EACCES, as execve(2) of it
// is (the kernel checks that one itself). Without this answer the kernel
// takes the missing operation as "allowed". With default_permissions the
// kernel checks everything and never asks.
void op_access(fuse_req_t req, fuse_ino_t ino, int mask) {
  if (is_ctl(ino) || !(mask & X_OK)) return (void)fuse_reply_err(req, 0);
  auto a = fs().getattr(to_fs(ino));
  if (!a) return reply_err(req, a.error());
  const bool exec = S_ISDIR(a->mode) || (a->mode & (S_IXUSR | S_IXGRP | S_IXOTH));
  fuse_reply_err(req, exec ? 0 : EACCES);
}

void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* st, int valid, fuse_file_info*) {
  if (is_ctl(ino)) return g->ctl->setattr(req, ino, st, valid);
  auto a = fs().setattr(to_fs(ino), setattr_of(st, valid), caller(req));
  if (!a) return reply_err(req, a.error());
  struct stat out = to_stat(*a);
  changed({(valid & FUSE_SET_ATTR_SIZE) ? ViewChange::data(to_fs(ino), uint64_t(st->st_size), 0) : ViewChange::attr(to_fs(ino))});
  fuse_reply_attr(req, &out, g->timeout);
}

void op_readlink(fuse_req_t req, fuse_ino_t ino) {
  if (is_ctl(ino)) return g->ctl->readlink(req, ino);
  auto t = fs().readlink(to_fs(ino));
  if (!t) return reply_err(req, t.error());
  fuse_reply_readlink(req, t->c_str());
}

void op_mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  if (is_ctl(parent)) return g->ctl->mknod(req, parent, name, mode, rdev);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  reply_entry(req, fs().mknod(to_fs(parent), name, mode, rdev, caller(req)), {ViewChange::entry(to_fs(parent), name)});
}

void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  if (is_ctl(parent)) return g->ctl->mkdir(req, parent, name, mode);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  reply_entry(req, fs().mkdir(to_fs(parent), name, mode, caller(req)), {ViewChange::entry(to_fs(parent), name)});
}

void op_symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  if (is_ctl(parent)) return g->ctl->symlink(req, target, parent, name);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  reply_entry(req, fs().symlink(to_fs(parent), name, target, caller(req)), {ViewChange::entry(to_fs(parent), name)});
}

void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char* name) {
  if (is_ctl(ino) || is_ctl(parent)) return g->ctl->link(req, ino, parent, name);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  reply_entry(req, fs().link(to_fs(ino), to_fs(parent), name, caller(req)),
              {ViewChange::entry(to_fs(parent), name), ViewChange::attr(to_fs(ino))});
}

void op_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (is_ctl(parent)) return g->ctl->unlink(req, parent, name);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EBUSY);
  auto r = fs().unlink(to_fs(parent), name);
  if (r) changed({ViewChange::entry(to_fs(parent), name)});
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (is_ctl(parent)) return g->ctl->rmdir(req, parent, name);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EBUSY);
  auto r = fs().rmdir(to_fs(parent), name);
  if (r) changed({ViewChange::entry(to_fs(parent), name)});
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

void op_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
               const char* newname, unsigned flags) {
  if (is_ctl(parent) || is_ctl(newparent))
    return g->ctl->rename(req, parent, name, newparent, newname, flags);
  if (is_ctl_name(parent, name) || is_ctl_name(newparent, newname))
    return (void)fuse_reply_err(req, EBUSY);
  auto r = fs().rename(to_fs(parent), name, to_fs(newparent), newname, flags, caller(req));
  if (r) changed({ViewChange::entry(to_fs(parent), name), ViewChange::entry(to_fs(newparent), newname)});
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

// Directories need no open state (readdir takes the inode and a cookie).
// Answering ENOSYS once turns on the kernel's zero-message opendir
// (FUSE_CAP_NO_OPENDIR_SUPPORT): later opendir and releasedir calls are not
// sent at all, two round trips fewer per directory listing.
void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (g->no_opendir) return (void)fuse_reply_err(req, ENOSYS);
  if (is_ctl(ino)) return g->ctl->opendir(req, ino, fi);
  auto a = fs().getattr(to_fs(ino));
  if (!a) return reply_err(req, a.error());
  if (!S_ISDIR(a->mode)) return (void)fuse_reply_err(req, ENOTDIR);
  fi->cache_readdir = 0;
  fuse_reply_open(req, fi);
}

void readdir_common(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  if (is_ctl(ino)) return g->ctl->readdir(req, ino, size, off, plus);
  // The root does not list the control folder (nor a branch's entry of that name).
  const bool root = ino == FUSE_ROOT_ID;
  std::vector<char> buf(size);
  size_t used = 0;
  Result<void> r = ok();
  if (!plus) {
    r = fs().readdir(to_fs(ino), uint64_t(off), [&](const DirEntry& d) {
      if (root && d.name == kControlFolder) return true;
      std::string name(d.name);
      struct stat st{};
      st.st_ino = to_fuse(d.ino);
      st.st_mode = mode_t(DTTOIF(d.type));
      size_t need = fuse_add_direntry(req, buf.data() + used, size - used, name.c_str(), &st,
                                      off_t(d.next));
      if (need > size - used) return false;
      used += need;
      return true;
    });
  } else {
    // The union resolves each entry from what the listing read, and counts
    // a reference for each one accepted here: the kernel counts a lookup
    // for every entry it links.
    r = fs().readdirplus(to_fs(ino), uint64_t(off), [&](const DirEntry& d, const Attr* a) {
      if (root && d.name == kControlFolder) {
        if (a) (void)fs().unpin(a->ino);  // counted, not handed out
        return true;
      }
      std::string name(d.name);
      fuse_entry_param e{};
      if (a) {
        e = to_entry(*a);
      } else {
        e.attr.st_ino = to_fuse(d.ino);
        e.attr.st_mode = S_IFDIR;
      }
      size_t need = fuse_add_direntry_plus(req, buf.data() + used, size - used, name.c_str(), &e,
                                           off_t(d.next));
      if (need > size - used) return false;
      used += need;
      return true;
    });
  }
  if (!r && used == 0) return reply_err(req, r.error());
  fuse_reply_buf(req, buf.data(), used);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  readdir_common(req, ino, size, off, false);
}
void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  readdir_common(req, ino, size, off, true);
}
void op_releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info*) { fuse_reply_err(req, 0); }

void op_statfs(fuse_req_t req, fuse_ino_t) {
  auto s = fs().statfs();
  struct statvfs v{};
  v.f_bsize = s.bsize;
  v.f_frsize = s.bsize;
  v.f_blocks = s.blocks;
  v.f_bfree = s.bfree;
  v.f_bavail = s.bavail;
  v.f_files = s.files;
  v.f_ffree = s.ffree;
  v.f_favail = s.ffree;
  v.f_namemax = s.namemax;
  fuse_reply_statfs(req, &v);
}

}  // namespace

fuse_lowlevel_ops make_ops() {
  fuse_lowlevel_ops o{};
  o.init = op_init;
  o.lookup = op_lookup;
  o.forget = op_forget;
  o.forget_multi = op_forget_multi;
  o.getattr = op_getattr;
  o.access = op_access;
  o.setattr = op_setattr;
  o.readlink = op_readlink;
  o.mknod = op_mknod;
  o.mkdir = op_mkdir;
  o.symlink = op_symlink;
  o.link = op_link;
  o.unlink = op_unlink;
  o.rmdir = op_rmdir;
  o.rename = op_rename;
  o.open = op_open;
  o.create = op_create;
  o.read = op_read;
  o.write = op_write;
  o.release = op_release;
  o.fsync = op_fsync;
  o.opendir = op_opendir;
  o.readdir = op_readdir;
  o.readdirplus = op_readdirplus;
  o.releasedir = op_releasedir;
  o.fsyncdir = op_fsync;
  o.statfs = op_statfs;
  o.setxattr = op_setxattr;
  o.getxattr = op_getxattr;
  o.listxattr = op_listxattr;
  o.removexattr = op_removexattr;
  o.fallocate = op_fallocate;
  o.ioctl = op_ioctl;
  o.lseek = op_lseek;
  o.copy_file_range = op_copy_file_range;
  return o;
}

}  // namespace plyfs::daemon
