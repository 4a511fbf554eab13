// The FUSE operations on the mounted union's open files, their data and
// their extended attributes (open, read, write, fallocate, copies). An open
// file is held until release (union.h, hold), so that it outlives its
// last name.
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>

#include <cstring>
#include <span>
#include <vector>

#include "daemon.h"
#include "kernel_io.h"

namespace plyfs::daemon {

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (is_ctl(ino)) return g->ctl->open(req, ino, fi);
  auto a = fs().getattr(to_fs(ino));
  if (!a) return reply_err(req, a.error());
  if (S_ISDIR(a->mode)) return (void)fuse_reply_err(req, EISDIR);
  const bool for_write = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
  if (for_write && fs().read_only()) return (void)fuse_reply_err(req, EROFS);
  // Held until release: the file outlives its last name meanwhile. A file
  // deleted since the kernel looked it up gives ESTALE, and the kernel
  // looks the name up again (union.h, hold).
  if (auto h = fs().hold(to_fs(ino)); !h) return reply_err(req, h.error());
  auto fail = [&](const Error& e) {
    (void)fs().unhold(to_fs(ino));
    reply_err(req, e);
  };
  // A file of a read-only branch is copied up now, so that the writes of
  // this handle land in a writable branch.
  if (for_write) {
    auto o = fs().open(to_fs(ino), true, caller(req));
    if (!o) return fail(o.error());
  }
  // libfuse turns on FUSE_CAP_ATOMIC_O_TRUNC by default: the kernel then
  // sends O_TRUNC here instead of a SETATTR, and trusts the open to truncate.
  if ((fi->flags & O_TRUNC) && S_ISREG(a->mode)) {
    if (auto k = kill_setid(req, ino, request_kills_setid()); !k) return fail(k.error());
    SetAttr s;
    s.size = 0;
    auto t = fs().setattr(to_fs(ino), s, caller(req));
    if (!t) return fail(t.error());
    changed({ViewChange::data(to_fs(ino), 0, 0)});
  }
  fi->keep_cache = 1;  // only this daemon changes the files
  if (fuse_reply_open(req, fi) != 0) (void)fs().unhold(to_fs(ino));
}

void op_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
               fuse_file_info* fi) {
  if (is_ctl(parent)) return g->ctl->create(req, parent, name, mode, fi);
  if (is_ctl_name(parent, name)) return (void)fuse_reply_err(req, EEXIST);
  auto a = fs().mknod(to_fs(parent), name, S_IFREG | (mode & 07777), 0, caller(req));
  if (!a) return reply_err(req, a.error());
  changed({ViewChange::entry(to_fs(parent), name)});
  // Held as op_open holds (another thread may have deleted it already).
  if (auto h = fs().hold(a->ino); !h) {
    (void)fs().unpin(a->ino);
    return reply_err(req, h.error());
  }
  fuse_entry_param e = to_entry(*a);
  fi->keep_cache = 1;
  if (fuse_reply_create(req, &e, fi) != 0) {
    (void)fs().unhold(a->ino);
    (void)fs().unpin(a->ino);
  }
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  if (is_ctl(ino)) return g->ctl->read(req, ino, size, off, fi);
  thread_local std::vector<std::byte> buf;
  buf.resize(size);
  auto n = fs().read(to_fs(ino), uint64_t(off), buf);
  if (!n) return reply_err(req, n.error());
  fuse_reply_buf(req, reinterpret_cast<const char*>(buf.data()), *n);
}

void op_write(fuse_req_t req, fuse_ino_t ino, const char* data, size_t size, off_t off,
              fuse_file_info*) {
  if (is_ctl(ino)) return g->ctl->write(req, ino, data, size, off);
  if (auto k = kill_setid(req, ino, request_kills_setid()); !k) return reply_err(req, k.error());
  auto n = fs().write(to_fs(ino), uint64_t(off),
                      std::span(reinterpret_cast<const std::byte*>(data), size), caller(req));
  if (!n) return reply_err(req, n.error());
  changed({ViewChange::data(to_fs(ino), uint64_t(off), *n)});
  fuse_reply_write(req, *n);
}

// No flush: the daemon holds no state per handle and no POSIX locks (the
// kernel keeps those), and the kernel writes a file's cached pages back
// before it would send FLUSH, reporting their errors at close, with or
// without it. Unimplemented, libfuse answers ENOSYS once and the kernel
// stops sending FLUSH: one round trip fewer per close(2).
void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (is_ctl(ino)) return g->ctl->release(req, ino, fi);
  auto r = fs().unhold(to_fs(ino));
  if (!r) (void)errno_of(r.error());  // logged; the handle is gone regardless
  fuse_reply_err(req, 0);
}

void op_fsync(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*) {
  if (is_ctl(ino)) return g->ctl->fsync(req, ino);
  auto r = fs().sync();
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value,
                 size_t size, int flags) {
  if (is_ctl(ino)) return g->ctl->setxattr(req, ino, name, value, size, flags);
  auto r = fs().setxattr(to_fs(ino), name,
                         std::span(reinterpret_cast<const std::byte*>(value), size), flags,
                         caller(req));
  if (r) changed({ViewChange::attr(to_fs(ino))});
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  if (is_ctl(ino)) return g->ctl->getxattr(req, ino, name, size);
  auto v = fs().getxattr(to_fs(ino), name);
  if (!v) return reply_err(req, v.error());
  if (size == 0) return (void)fuse_reply_xattr(req, v->size());
  if (size < v->size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, reinterpret_cast<const char*>(v->data()), v->size());
}

void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  if (is_ctl(ino)) return g->ctl->listxattr(req, ino, size);
  auto names = fs().listxattr(to_fs(ino));
  if (!names) return reply_err(req, names.error());
  reply_xattr_names(req, *names, size);
}

void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  if (is_ctl(ino)) return g->ctl->removexattr(req, ino, name);
  auto r = fs().removexattr(to_fs(ino), name, caller(req));
  if (r) changed({ViewChange::attr(to_fs(ino))});
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len,
                  fuse_file_info*) {
  if (off < 0 || len <= 0) return (void)fuse_reply_err(req, EINVAL);
  if (is_ctl(ino)) return g->ctl->fallocate(req, ino, mode, off, len);
  if (auto k = kill_setid(req, ino, unprivileged(req)); !k) return reply_err(req, k.error());
  auto r = fs().fallocate(to_fs(ino), mode, uint64_t(off), uint64_t(len), caller(req));
  if (r) changed({ViewChange::data(to_fs(ino), uint64_t(off), uint64_t(len))});
  fuse_reply_err(req, r ? 0 : errno_of(r.error()));
}

// lsattr and chattr: since Linux 5.13 the kernel asks for FS_IOC_GETFLAGS
// and FS_IOC_SETFLAGS itself (fileattr_get/set), with a 4-byte int, and
// under CONFIG_COMPAT by their 32-bit numbers (format.md#fs-compress).
void op_fsflags(fuse_req_t req, fuse_ino_t ino, unsigned cmd, const void* in_buf, size_t in_size,
                size_t out_size) {
  if (is_ctl(ino)) return (void)fuse_reply_err(req, ENOTTY);
  // The kernel reads the old attributes as an fsxattr before it sets flags
  // (vfs_fileattr_set): none of its xflags are kept here, and c and m have
  // no xflag, so it is all zeros; setting one is not supported.
  if (cmd == FS_IOC_FSGETXATTR) {
    if (out_size < sizeof(fsxattr)) return (void)fuse_reply_err(req, EINVAL);
    fsxattr x{};
    return (void)fuse_reply_ioctl(req, 0, &x, sizeof x);
  }
  if (cmd == FS_IOC_FSSETXATTR) {
    fsxattr x{};
    if (in_size < sizeof x) return (void)fuse_reply_err(req, EINVAL);
    std::memcpy(&x, in_buf, sizeof x);
    if (x.fsx_xflags || x.fsx_extsize || x.fsx_projid || x.fsx_cowextsize) return (void)fuse_reply_err(req, EOPNOTSUPP);
    return (void)fuse_reply_ioctl(req, 0, nullptr, 0);
  }
  uint32_t flags = 0;
  if (cmd == FS_IOC_GETFLAGS || cmd == FS_IOC32_GETFLAGS) {
    if (out_size < sizeof flags) return (void)fuse_reply_err(req, EINVAL);
    auto r = fs().get_fsflags(to_fs(ino));
    if (!r) return reply_err(req, r.error());
    flags = *r;
    return (void)fuse_reply_ioctl(req, 0, &flags, sizeof flags);
  }
  if (in_size < sizeof flags) return (void)fuse_reply_err(req, EINVAL);
  std::memcpy(&flags, in_buf, sizeof flags);
  auto r = fs().set_fsflags(to_fs(ino), flags, caller(req));
  if (!r) return reply_err(req, r.error());
  changed({ViewChange::attr(to_fs(ino))});
  fuse_reply_ioctl(req, 0, nullptr, 0);
}

void seek_now(fuse_req_t req, fuse_ino_t ino, off_t off, int whence) {
  if (is_ctl(ino)) return g->ctl->lseek(req, ino, off, whence);
  auto r = fs().lseek(to_fs(ino), uint64_t(off), whence);
  if (!r) return reply_err(req, r.error());
  fuse_reply_lseek(req, off_t(*r));
}

// SEEK_DATA and SEEK_HOLE. With the writeback cache the kernel may hold
// written pages of the file that have not reached the daemon (it does not
// write them back before asking): answered from the daemon's extents
// alone, a hole (or ENXIO past the old end) would stand where the caller
// just wrote, and a copy by SEEK_DATA would skip those bytes. So the
// kernel first writes the file's pages back: an invalidation of its pages
// launders the dirty ones through this daemon, and returns when they are
// written. Only from the page of `off` on, which is all the answer looks
// at (a write below it ends below it too): a copy that seeks from extent
// to extent drops none of what it has read. That runs on the seeker
// thread, never on the request's: the write-back comes as requests to
// this daemon, which over io_uring go to the queue of the CPU the
// invalidation was sent from, the request thread's own. The seeker
// replies; nothing waits for it but the caller.
void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, fuse_file_info*) {
  if (off < 0) return (void)fuse_reply_err(req, ENXIO);
  if (!g->kernel_caches_writes || (whence != SEEK_DATA && whence != SEEK_HOLE))
    return seek_now(req, ino, off, whence);
  g->seeker.post({Notifier::Inval::inode(ino, off, 0), Notifier::Inval::run([=] { seek_now(req, ino, off, whence); })});
}

void op_copy_file_range(fuse_req_t req, fuse_ino_t in, off_t off_in, fuse_file_info*,
                        fuse_ino_t out, off_t off_out, fuse_file_info*, size_t len, int flags) {
  if (flags) return (void)fuse_reply_err(req, EINVAL);
  if (is_ctl(in) || is_ctl(out)) return g->ctl->copy_file_range(req, in, off_in, out, off_out, len);
  if (auto k = kill_setid(req, out, unprivileged(req)); !k) return reply_err(req, k.error());
  auto r = fs().copy_range(to_fs(in), uint64_t(off_in), to_fs(out), uint64_t(off_out), len,
                           caller(req));
  if (!r) return reply_err(req, r.error());
  changed({ViewChange::data(to_fs(out), uint64_t(off_out), *r)});
  fuse_reply_write(req, size_t(*r));
}

}  // namespace plyfs::daemon
