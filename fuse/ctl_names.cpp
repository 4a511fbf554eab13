// The control folder's FUSE operations on names, attributes and listings
// (lookup, getattr, mkdir, rename, readdir...). A node of the folder's own
// (slot 0) is answered from the branch table (ctl_layers.cpp), a node of a
// view by that view's union; an entry handed out of a view counts a kernel
// reference (C3).
#include "ctl_folder.h"

#include <dirent.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "ctl_nodes.h"

namespace plyfs {

using namespace ctl;

namespace {

constexpr const char* kLayersDir = "layers";
constexpr const char* kInfoFile = "info.json";
constexpr const char* kDataDir = "data";
constexpr const char* kChildrenDir = "children";

}  // namespace

// --- replies ------------------------------------------------------------------------------

struct stat ControlFolder::view_stat(const View& v, size_t slot, const Attr& a) const {
  return stat_of(a, node(slot, a.ino), v.u->block_size());
}

void ControlFolder::reply_view_entry(fuse_req_t req, InView& w, const Result<Attr>& a,
                                     const std::vector<ViewChange>& cs, bool counted) {
  if (!a) {
    if (counted) unref(w.slot, 1);
    return reply_err(req, a.error());
  }
  if (a->ino > kNumMask) {
    (void)w.v->u->unpin(a->ino);
    if (counted) unref(w.slot, 1);
    view_changed(w, cs);
    return (void)fuse_reply_err(req, EOVERFLOW);
  }
  fuse_entry_param e{};
  e.ino = node(w.slot, a->ino);
  e.generation = a->generation;
  e.attr = view_stat(*w.v, w.slot, *a);
  e.attr_timeout = e.entry_timeout = kTimeout;
  view_changed(w, cs);
  // Before the reply: its forget may come before fuse_reply_entry returns.
  if (!counted) w.v->kernel_refs++;
  if (fuse_reply_entry(req, &e) != 0) {
    (void)w.v->u->unpin(a->ino);
    unref(w.slot, 1);
  }
}

// --- operations ---------------------------------------------------------------------------

void ControlFolder::lookup_root(fuse_req_t req) { reply_virtual_entry(req, kRootNode, 0); }

void ControlFolder::lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  const std::string_view n = name;
  if (parent == kRootNode) {
    if (n == kLayersDir) return reply_virtual_entry(req, kLayersNode, 0);
    return (void)fuse_reply_err(req, ENOENT);
  }
  if (parent == kLayersNode) {
    uint64_t id = 0;
    {
      std::lock_guard cl(*h_.ctl_mu);  // C4
      auto b = branch_named(n);
      if (!b) return reply_err(req, b.error());
      id = folder_id(n);
    }
    if (!id) return (void)fuse_reply_err(req, EOVERFLOW);
    // Generation 0: the folder is its name's, whichever branch has the name (C6).
    return reply_virtual_entry(req, folder_node(id), 0);
  }
  if (is_children(parent)) {
    // A layer made on the folder's branch: a link to its own folder.
    uint64_t id = 0;
    {
      std::lock_guard cl(*h_.ctl_mu);  // C4
      auto p = folder_branch(parent);
      if (!p) return reply_err(req, p.error());
      auto c = branch_named(n);
      if (!c) return reply_err(req, c.error());
      auto layer = is_layer(*h_.vol, *c);
      if (!layer) return reply_err(req, layer.error());
      if (c->parent != p->tree || !*layer) return (void)fuse_reply_err(req, ENOENT);
      id = folder_id(n);
    }
    if (!id) return (void)fuse_reply_err(req, EOVERFLOW);
    return reply_virtual_entry(req, named_node(id, kChildLink), 0);
  }
  if (is_folder(parent)) {
    if (n == kInfoFile) return reply_virtual_entry(req, info_node(folder_of(parent)), 0);
    if (n == kChildrenDir) return reply_virtual_entry(req, named_node(folder_of(parent), kChildren), 0);
    if (n != kDataDir) return (void)fuse_reply_err(req, ENOENT);
    auto slot = data_view(parent);  // counts the reference to data
    if (!slot) return reply_err(req, slot.error());
    auto w = in_view(node(*slot, 0));
    if (!w) {
      std::shared_lock lk(mu_);
      unref(*slot, 1);
      return reply_err(req, w.error());
    }
    auto a = w->v->u->getattr(w->v->u->root());  // the root counts no reference
    // data stays the view's root while the branch root it shows changes: a
    // snapshot's new layer, a merge's result, a rollback's fresh layer each
    // bring a root with another generation. A new generation would make
    // the kernel retire the inode it holds (EIO on it, as for an open
    // directory or a path walk that found it just before).
    if (a) a->generation = 0;
    return reply_view_entry(req, *w, a, {}, true);
  }
  if (is_info(parent)) return (void)fuse_reply_err(req, ENOTDIR);
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  reply_view_entry(req, *w, w->v->u->lookup(w->ino, name));
}

void ControlFolder::forget(fuse_ino_t ino, uint64_t n) {
  if (slot_of(ino) == 0) return;
  auto w = in_view(ino);
  if (!w) return;  // its layer is gone, and the references with it
  if (auto r = w->v->u->unpin(w->ino, n); !r) (void)h_.errno_of(r.error());
  unref(w->slot, n);
  if (!w->v->idle()) return;
  w->lk.unlock();
  retire_if_idle(w->slot);
}

void ControlFolder::getattr(fuse_req_t req, fuse_ino_t ino) {
  if (slot_of(ino) == 0) {
    auto st = virtual_attr(ino);
    if (!st) return reply_err(req, st.error());
    return (void)fuse_reply_attr(req, &*st, kTimeout);
  }
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto a = w->v->u->getattr(w->ino);
  if (!a) return reply_err(req, a.error());
  struct stat st = view_stat(*w->v, w->slot, *a);
  fuse_reply_attr(req, &st, kTimeout);
}

void ControlFolder::setattr(fuse_req_t req, fuse_ino_t ino, struct stat* st, int valid) {
  auto w = in_view(ino);  // the folder's own nodes: EPERM
  if (!w) return reply_err(req, w.error());
  auto a = w->v->u->setattr(w->ino, setattr_of(st, valid), h_.caller(req));
  if (!a) return reply_err(req, a.error());
  struct stat out = view_stat(*w->v, w->slot, *a);
  view_changed(*w, {(valid & FUSE_SET_ATTR_SIZE) ? ViewChange::data(w->ino, uint64_t(st->st_size), 0)
                                                 : ViewChange::attr(w->ino)});
  fuse_reply_attr(req, &out, kTimeout);
}

void ControlFolder::readlink(fuse_req_t req, fuse_ino_t ino) {
  if (is_child_link(ino)) {
    std::string target;
    {
      std::lock_guard cl(*h_.ctl_mu);  // C4
      auto c = folder_branch(ino);
      if (!c) return reply_err(req, c.error());
      target = child_target(entry_name(*c));
    }
    return (void)fuse_reply_readlink(req, target.c_str());
  }
  if (slot_of(ino) == 0) return (void)fuse_reply_err(req, EINVAL);
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  auto t = w->v->u->readlink(w->ino);
  if (!t) return reply_err(req, t.error());
  fuse_reply_readlink(req, t->c_str());
}

void ControlFolder::mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  reply_view_entry(req, *w, w->v->u->mknod(w->ino, name, mode, rdev, h_.caller(req)), {ViewChange::entry(w->ino, name)});
}

void ControlFolder::mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  if (parent == kLayersNode || is_children(parent)) {
    if (!may_change(req)) return (void)fuse_reply_err(req, EPERM);
    auto b = make_layer(name, parent == kLayersNode ? 0 : parent);
    if (!b) return reply_err(req, b.error());
    uint64_t id = 0;
    {
      std::lock_guard cl(*h_.ctl_mu);
      id = folder_id(entry_name(*b));
    }
    if (!id) return (void)fuse_reply_err(req, EOVERFLOW);
    return reply_virtual_entry(req, folder_node(id), 0);
  }
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  reply_view_entry(req, *w, w->v->u->mkdir(w->ino, name, mode, h_.caller(req)), {ViewChange::entry(w->ino, name)});
}

void ControlFolder::symlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  reply_view_entry(req, *w, w->v->u->symlink(w->ino, name, target, h_.caller(req)), {ViewChange::entry(w->ino, name)});
}

void ControlFolder::link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t parent, const char* name) {
  if (!is_ctl(ino) || !is_ctl(parent) || slot_of(ino) != slot_of(parent))
    return (void)fuse_reply_err(req, EXDEV);
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  reply_view_entry(req, *w, w->v->u->link(num_of(ino), w->ino, name, h_.caller(req)),
                   {ViewChange::entry(w->ino, name), ViewChange::attr(num_of(ino))});
}

void ControlFolder::unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->unlink(w->ino, name);
  if (r) view_changed(*w, {ViewChange::entry(w->ino, name)});
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (parent == kLayersNode) {
    if (!may_change(req)) return (void)fuse_reply_err(req, EPERM);
    auto r = delete_layer(name);
    return (void)fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
  }
  if (slot_of(parent) == 0) return (void)fuse_reply_err(req, EBUSY);  // layers, data
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->rmdir(w->ino, name);
  if (r) view_changed(*w, {ViewChange::entry(w->ino, name)});
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
                           const char* newname, unsigned flags) {
  if (parent == kLayersNode && newparent == kLayersNode) {
    if (!may_change(req)) return (void)fuse_reply_err(req, EPERM);
    auto r = rename_layer(name, newname, flags);
    return (void)fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
  }
  if (!is_ctl(parent) || !is_ctl(newparent) || slot_of(parent) != slot_of(newparent))
    return (void)fuse_reply_err(req, EXDEV);
  if (slot_of(parent) == 0) return (void)fuse_reply_err(req, EPERM);
  auto w = in_view(parent);
  if (!w) return reply_err(req, w.error());
  auto r = w->v->u->rename(w->ino, name, num_of(newparent), newname, flags, h_.caller(req));
  if (r) view_changed(*w, {ViewChange::entry(w->ino, name), ViewChange::entry(num_of(newparent), newname)});
  fuse_reply_err(req, r ? 0 : h_.errno_of(r.error()));
}

void ControlFolder::opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (slot_of(ino) == 0) {
    if (is_info(ino) || is_child_link(ino)) return (void)fuse_reply_err(req, ENOTDIR);
  } else {
    auto w = in_view(ino);
    if (!w) return reply_err(req, w.error());
    auto a = w->v->u->getattr(w->ino);
    if (!a) return reply_err(req, a.error());
    if (!S_ISDIR(a->mode)) return (void)fuse_reply_err(req, ENOTDIR);
  }
  fi->cache_readdir = 0;
  fuse_reply_open(req, fi);
}

void ControlFolder::readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  std::vector<char> buf(size);
  size_t used = 0;
  // One listed entry; false when the buffer is full.
  auto add = [&](const char* name, fuse_ino_t id, mode_t type, uint64_t next, const fuse_entry_param* ep) {
    fuse_entry_param e{};
    if (ep) e = *ep;
    e.attr.st_ino = id;
    if (!ep) e.attr.st_mode = type;
    size_t need = plus ? fuse_add_direntry_plus(req, buf.data() + used, size - used, name, &e, off_t(next))
                       : fuse_add_direntry(req, buf.data() + used, size - used, name, &e.attr, off_t(next));
    if (need > size - used) return false;
    used += need;
    return true;
  };
  if (slot_of(ino) == 0) {
    // The folder's own directories list their names with cookies 1, 2... (a
    // branch: its tree id, so that a listing survives new and deleted layers).
    // Entries come without attributes (node id 0): nothing to count.
    std::vector<std::tuple<std::string, fuse_ino_t, mode_t, uint64_t>> ents;
    ents.emplace_back(".", ino, S_IFDIR, 1);
    ents.emplace_back("..", ino == kRootNode ? FUSE_ROOT_ID : ino == kLayersNode ? kRootNode : kLayersNode, S_IFDIR, 2);
    if (ino == kRootNode) {
      ents.emplace_back(kLayersDir, kLayersNode, S_IFDIR, 3);
    } else if (ino == kLayersNode) {
      std::lock_guard cl(*h_.ctl_mu);  // C4
      auto bs = Filesystem::branches(*h_.vol);
      if (!bs) return reply_err(req, bs.error());
      std::sort(bs->begin(), bs->end(), [](const BranchMeta& a, const BranchMeta& b) { return a.tree.v < b.tree.v; });
      // Listed with their folders' numbers (C6), which stat shows too.
      for (const auto& b : *bs)
        if (!b.doomed)
          if (const uint64_t id = folder_id(entry_name(b))) ents.emplace_back(entry_name(b), folder_node(id), S_IFDIR, 2 + b.tree.v);
    } else if (is_folder(ino)) {
      // data's node id is its view's root, made on lookup; the listing
      // gives a number of the folder's own instead.
      ents.emplace_back(kDataDir, named_node(folder_of(ino), kDataListed), S_IFDIR, 3);
      ents.emplace_back(kInfoFile, info_node(folder_of(ino)), S_IFREG, 4);
      ents.emplace_back(kChildrenDir, named_node(folder_of(ino), kChildren), S_IFDIR, 5);
    } else if (is_children(ino)) {
      // The layers made on the folder's branch, as info.json's children,
      // cookies by tree id as in layers/.
      std::lock_guard cl(*h_.ctl_mu);  // C4
      auto p = folder_branch(ino);
      if (!p) return reply_err(req, p.error());
      auto bs = Filesystem::branches(*h_.vol);
      if (!bs) return reply_err(req, bs.error());
      std::sort(bs->begin(), bs->end(), [](const BranchMeta& a, const BranchMeta& b) { return a.tree.v < b.tree.v; });
      for (const auto& b : *bs) {
        if (b.doomed || b.parent != p->tree) continue;
        auto layer = is_layer(*h_.vol, b);
        if (!layer) return reply_err(req, layer.error());
        if (*layer)
          if (const uint64_t id = folder_id(entry_name(b))) ents.emplace_back(entry_name(b), named_node(id, kChildLink), S_IFLNK, 2 + b.tree.v);
      }
    } else {
      return (void)fuse_reply_err(req, ENOTDIR);
    }
    for (const auto& [name, id, type, next] : ents)
      if (next > uint64_t(off) && !add(name.c_str(), id, type, next, nullptr)) break;
    return (void)fuse_reply_buf(req, buf.data(), used);
  }
  auto w = in_view(ino);
  if (!w) return reply_err(req, w.error());
  Union& u = *w->v->u;
  Result<void> r = ok();
  if (!plus) {
    r = u.readdir(w->ino, uint64_t(off), [&](const DirEntry& d) {
      return add(std::string(d.name).c_str(), node(w->slot, d.ino & kNumMask), mode_t(DTTOIF(d.type)), d.next, nullptr);
    });
  } else {
    r = u.readdirplus(w->ino, uint64_t(off), [&](const DirEntry& d, const Attr* a) {
      if (!a) return add(std::string(d.name).c_str(), node(w->slot, d.ino & kNumMask), S_IFDIR, d.next, nullptr);
      fuse_entry_param e{};
      e.ino = a->ino > kNumMask ? 0 : node(w->slot, a->ino);
      e.generation = a->generation;
      e.attr = view_stat(*w->v, w->slot, *a);
      e.attr_timeout = e.entry_timeout = kTimeout;
      if (e.ino) w->v->kernel_refs++;  // before the reply, as in reply_view_entry
      const bool fits = add(std::string(d.name).c_str(), e.ino, 0, d.next, &e);
      if (!fits && e.ino) unref(w->slot, 1);
      if (fits && !e.ino) (void)u.unpin(a->ino);  // listed, but not handed out
      return fits;
    });
  }
  if (!r && used == 0) return reply_err(req, r.error());
  fuse_reply_buf(req, buf.data(), used);
}

}  // namespace plyfs
