// The control folder's FUSE operations on open files, their data and their
// extended attributes: info.json's text, taken whole at open, and the files
// of the views, each held until release (C2, C3).
#include "ctl_folder.h"

#include <fcntl.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "ctl_nodes.h"

namespace plyfs {

using namespace ctl;

void ControlFolder::open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  const bool for_write = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
  if (is_info(ino)) {
    if (for_write) return (void)fuse_reply_err(req, EACCES);  // read-only, whoever asks
    Result<TreeId> tree = Error::io(ESTALE, "");
    {
      std::lock_guard cl(*h_.ctl_mu);  // C4
      auto b = folder_branch(ino);
      tree = b ? Result<TreeId>(b->tree) : Result<TreeId>(b.error());
    }
    if (!tree) return reply_err(req, tree.error());
    auto text = info_json(*tree);
    if (!text) return reply_err(req, text.error());
    auto* s = new std::string(std::move(*text));
    fi->fh = reinterpret_cast<uint64_t>(s);
    fi->direct_io = 1;  // its size may differ from the last getattr's
    if (fuse_reply_open(req, fi) != 0) delete s;
    return;
  }
  if (slot_of(ino) == 0) return (void)fuse_reply_err(req, EISDIR);
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  Union& u = *w->v->u;
  auto a = u.getattr(w->ino);
  if (!a) return reply_err(req, a.error());
  if (S_ISDIR(a->mode)) return (void)fuse_reply_err(req, EISDIR);
  if (for_write && u.read_only()) return (void)fuse_reply_err(req, EROFS);
  // Held until release, as in the mount (ops_files.cpp, op_open).
  if (auto h = u.hold(w->ino); !h) return reply_err(req, h.error());
  auto fail = [&](const Error& e) {
    (void)u.unhold(w->ino);
    reply_err(req, e);
  };
  if (for_write)
    if (auto o = u.open(w->ino, true, h_.caller(req)); !o) return fail(o.error());
  if ((fi->flags & O_TRUNC) && S_ISREG(a->mode)) {
    SetAttr s;
    s.size = 0;
    if (auto k = kill_setid_before_change(u, w->ino, request_kills_setid(), h_.caller(req)); !k)
      return fail(k.error());
    if (auto t = u.setattr(w->ino, s, h_.caller(req)); !t) return fail(t.error());
    view_changed(*w, {ViewChange::data(w->ino, 0, 0)});
  }
  // Another view may have changed the file since the kernel cached it.
  fi->keep_cache = 0;
  fi->fh = reinterpret_cast<uint64_t>(w->v);  // for release, which takes no lock
  w->v->open_files++;
  if (fuse_reply_open(req, fi) != 0) {
    (void)u.unhold(w->ino);
    w->v->open_files--;
  }
}

void ControlFolder::create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                           fuse_file_info* fi) {
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  auto a = w->v->u->mknod(w->ino, name, S_IFREG | (mode & 07777), 0, h_.caller(req));
  if (!a) return reply_err(req, a.error());
  if (a->ino > kNumMask) {
    (void)w->v->u->unpin(a->ino);
    view_changed(*w, {ViewChange::entry(w->ino, name)});
    return (void)fuse_reply_err(req, EOVERFLOW);
  }
  view_changed(*w, {ViewChange::entry(w->ino, name)});
  if (auto h = w->v->u->hold(a->ino); !h) {
    (void)w->v->u->unpin(a->ino);
    return reply_err(req, h.error());
  }
  fuse_entry_param e{};
  e.ino = node(w->slot, a->ino);
  e.generation = a->generation;
  e.attr = view_stat(*w->v, w->slot, *a);
  e.attr_timeout = e.entry_timeout = kTimeout;
  fi->keep_cache = 0;
  fi->fh = reinterpret_cast<uint64_t>(w->v);
  w->v->open_files++;
  w->v->kernel_refs++;
  if (fuse_reply_create(req, &e, fi) != 0) {
    (void)w->v->u->unhold(a->ino);
    w->v->open_files--;
    unref(w->slot, 1);
    (void)w->v->u->unpin(a->ino);
  }
}

void ControlFolder::read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  if (is_info(ino)) {
    // A copy: once the reply is written the kernel may send the release,
    // which frees the text, before fuse_reply_buf has returned.
    const auto* s = reinterpret_cast<const std::string*>(fi->fh);
    const size_t at = std::min(size_t(off), s->size());
    const std::string part = s->substr(at, std::min(size, s->size() - at));
    return (void)fuse_reply_buf(req, part.data(), part.size());
  }
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  std::vector<std::byte> buf(size);
  auto n = w->v->u->read(w->ino, uint64_t(off), buf);
  if (!n) return reply_err(req, n.error());
  fuse_reply_buf(req, reinterpret_cast<const char*>(buf.data()), *n);
}

void ControlFolder::write(fuse_req_t req, fuse_ino_t ino, const char* data, size_t size, off_t off) {
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  if (auto k = kill_setid_before_change(*w->v->u, w->ino, request_kills_setid(), h_.caller(req)); !k)
    return reply_err(req, k.error());
  auto n = w->v->u->write(w->ino, uint64_t(off), std::span(reinterpret_cast<const std::byte*>(data), size),
                          h_.caller(req));
  if (!n) return reply_err(req, n.error());
  view_changed(*w, {ViewChange::data(w->ino, uint64_t(off), *n)});
  fuse_reply_write(req, *n);
}

void ControlFolder::release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (is_info(ino)) {
    delete reinterpret_cast<std::string*>(fi->fh);
  } else if (fi->fh) {
    // Without waiting for mu_, which a snapshot or merge holds for a while:
    // rmdir waits for this. A View is never freed (C3), only its union.
    View* v = reinterpret_cast<View*>(fi->fh);
    // Before open_files drops, which may let the view's union go.
    std::shared_lock lk(mu_, std::try_to_lock);
    if (lk.owns_lock() && v->u) {
      (void)v->u->unhold(num_of(ino));
    } else if (!lk.owns_lock()) {
      std::lock_guard ul(v->unhold_mu);
      v->unholds.push_back(num_of(ino));
    }
    if (lk.owns_lock()) lk.unlock();
    v->open_files--;
    if (v->idle()) retire_if_idle(slot_of(ino));
  }
  fuse_reply_err(req, 0);
}

void ControlFolder::fsync(fuse_req_t req, fuse_ino_t ino) {
  if (slot_of(ino) == 0) return (void)fuse_reply_err(req, 0);
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->sync();
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value,
                             size_t size, int flags) {
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->setxattr(w->ino, name, std::span(reinterpret_cast<const std::byte*>(value), size),
                             flags, h_.caller(req));
  if (r) view_changed(*w, {ViewChange::attr(w->ino)});
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  if (slot_of(ino) == 0) return (void)fuse_reply_err(req, ENODATA);
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto v = w->v->u->getxattr(w->ino, name);
  if (!v) return reply_err(req, v.error());
  if (size == 0) return (void)fuse_reply_xattr(req, v->size());
  if (size < v->size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, reinterpret_cast<const char*>(v->data()), v->size());
}

void ControlFolder::listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  if (slot_of(ino) == 0) return reply_xattr_names(req, {}, size);  // the folder's own: none
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto names = w->v->u->listxattr(w->ino);
  if (!names) return reply_err(req, names.error());
  reply_xattr_names(req, *names, size);
}

void ControlFolder::removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->removexattr(w->ino, name, h_.caller(req));
  if (r) view_changed(*w, {ViewChange::attr(w->ino)});
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len) {
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  if (auto k = kill_setid_before_change(*w->v->u, w->ino, unprivileged(req), h_.caller(req)); !k)
    return reply_err(req, k.error());
  auto r = w->v->u->fallocate(w->ino, mode, uint64_t(off), uint64_t(len), h_.caller(req));
  if (r) view_changed(*w, {ViewChange::data(w->ino, uint64_t(off), uint64_t(len))});
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence) {
  if (slot_of(ino) == 0) return (void)fuse_reply_err(req, ENXIO);
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->lseek(w->ino, uint64_t(off), whence);
  if (!r) return reply_err(req, r.error());
  fuse_reply_lseek(req, off_t(*r));
}

void ControlFolder::copy_file_range(fuse_req_t req, fuse_ino_t in, off_t off_in, fuse_ino_t out,
                                    off_t off_out, size_t len) {
  if (!is_ctl(in) || !is_ctl(out) || slot_of(in) != slot_of(out) || slot_of(in) == 0)
    return (void)fuse_reply_err(req, EXDEV);
  auto w = in_view(in);
  if (!w) return reply_err(req, w.error());
  if (auto k = kill_setid_before_change(*w->v->u, num_of(out), unprivileged(req), h_.caller(req)); !k)
    return reply_err(req, k.error());
  auto r = w->v->u->copy_range(w->ino, uint64_t(off_in), num_of(out), uint64_t(off_out), len, h_.caller(req));
  if (!r) return reply_err(req, r.error());
  view_changed(*w, {ViewChange::data(num_of(out), uint64_t(off_out), *r)});
  fuse_reply_write(req, size_t(*r));
}

}  // namespace plyfs
