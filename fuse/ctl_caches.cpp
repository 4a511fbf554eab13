// The control folder's part in the kernel's caches of the daemon's other
// unions (ctl_folder.h, C5; format.md#control-folder, "Caching").
#include <algorithm>
#include <span>

#include "ctl_folder.h"
#include "ctl_nodes.h"

namespace plyfs {

using namespace ctl;

namespace {

// The branches a union writes to.
std::vector<Filesystem*> writes_of(Union& u) {
  std::vector<Filesystem*> w;
  for (const auto& b : u.stack())
    if (b.writable) w.push_back(b.fs);
  return w;
}

// Whether union u shows one of the branches `w`.
bool shows(Union& u, const std::vector<Filesystem*>& w) {
  for (const auto& b : u.stack())
    if (std::find(w.begin(), w.end(), b.fs) != w.end()) return true;
  return false;
}

}  // namespace

// The kernel may keep what it caches of the mounted view for its 60 s
// timeouts (entries, negative entries, attributes, pages kept across opens,
// listings: without opendir they are FOPEN_CACHE_DIR, kept while the
// directory's mtime stays), and even under .plyfs, where nothing has a
// timeout, it keeps a listing while the directory's mtime (its leftmost
// part's) stays, the pages of a file while it is open, and, with the
// writeback cache, a regular file's size and times for as long as it holds
// the inode (format.md#control-folder, "Caching"). A change through one
// union therefore drops, in every other one that shows the branch it wrote:
//  - a name (ViewChange::Entry): the entry, and the directory's listing and
//    attributes;
//  - an object: its entry, so that an inode the kernel holds only by its
//    name goes, size and times with it; its pages and attributes; and, as
//    the kernel keeps the size of an inode still open, one stored byte at
//    the end when the file may have grown (a store past the end grows it;
//    nothing shrinks it).
// Objects are found by path: the same directory may have other numbers in
// two unions (its leftmost part's), and the other union's parts of it and
// copies are refreshed on the way (Union::refresh_path).
void ControlFolder::invals_for(Union& from, const std::vector<ViewChange>& cs, Union& to, size_t slot,
                               std::vector<Notifier::Inval>& out) {
  using Inval = Notifier::Inval;
  auto id = [&](uint64_t ino) -> fuse_ino_t {
    if (slot == 0) return ino == to.root() ? FUSE_ROOT_ID : ino;
    return ino > kNumMask ? 0 : node(slot, ino);
  };
  for (const ViewChange& c : cs) {
    const auto path = from.path_of(c.ino);
    const std::vector<uint64_t> at = path ? to.refresh_path(*path) : std::vector<uint64_t>{};
    if (c.kind == ViewChange::Entry) {
      // A directory `to` does not know is not in the kernel either.
      if (!path || at.size() != path->size() + 1 || !id(at.back())) continue;
      if (slot == 0 && at.size() == 1 && c.name == kControlFolder) continue;  // shadowed
      out.push_back(Inval::entry(id(at.back()), c.name));
      out.push_back(Inval::inode(id(at.back()), 0, 0));
      continue;
    }
    if (path && !path->empty() && at.size() >= path->size() && id(at[path->size() - 1]))
      out.push_back(Inval::entry(id(at[path->size() - 1]), path->back()));
    if (!to.knows(c.ino) || !id(c.ino)) continue;
    if (c.kind == ViewChange::Attr) {
      out.push_back(Inval::inode(id(c.ino), -1, 0));
      continue;
    }
    out.push_back(Inval::inode(id(c.ino), off_t(c.off), off_t(c.len)));
    auto a = to.getattr(c.ino);
    if (!a || !S_ISREG(a->mode) || (c.len && c.off + c.len < a->size)) continue;
    // Read when sent, right after the pages were dropped (their dirty ones
    // written back first): a byte read now could overwrite a write of the
    // other view's that lands meanwhile.
    out.push_back(Inval::store(id(c.ino), [this, slot, ino = c.ino](off_t& off, std::string& b) {
      std::shared_lock lk(mu_);
      Union* u = slot == 0 ? h_.mount : slot <= views_.size() ? views_[slot - 1]->u.get() : nullptr;
      if (!u) return false;
      auto now = u->getattr(ino);
      if (!now || !S_ISREG(now->mode) || now->size == 0) return false;
      b.assign(1, '\0');
      auto n = u->read(ino, now->size - 1, std::as_writable_bytes(std::span(b)));
      off = off_t(now->size - 1);
      return n && *n == 1;
    }));
  }
}

void ControlFolder::view_changed(InView& w, const std::vector<ViewChange>& cs) {
  if (cs.empty() || !h_.notifier || !w.v->u) return;
  const auto writes = writes_of(*w.v->u);
  if (writes.empty()) return;
  std::vector<Notifier::Inval> out;
  if (h_.mount && shows(*h_.mount, writes)) invals_for(*w.v->u, cs, *h_.mount, 0, out);
  for (size_t i = 0; i < views_.size(); i++)
    if (i + 1 != w.slot && views_[i]->u && views_[i]->kernel_refs && shows(*views_[i]->u, writes))
      invals_for(*w.v->u, cs, *views_[i]->u, i + 1, out);
  h_.notifier->post(std::move(out));
}

void ControlFolder::mount_changed(const std::vector<ViewChange>& cs) {
  if (!h_.notifier || !h_.mount || !has_views()) return;
  std::vector<Notifier::Inval> out;
  {
    std::shared_lock lk(mu_);
    const auto writes = writes_of(*h_.mount);
    // A view the kernel holds nothing of has nothing cached (C3).
    for (size_t i = 0; i < views_.size(); i++)
      if (views_[i]->u && views_[i]->kernel_refs && shows(*views_[i]->u, writes))
        invals_for(*h_.mount, cs, *views_[i]->u, i + 1, out);
  }
  h_.notifier->post(std::move(out));
}

}  // namespace plyfs
