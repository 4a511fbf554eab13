// The control folder (ctl_folder.h; format.md#control-folder): its views of
// the layers' data, one union in a slot of its own each (C1, C3). An
// operation's node id leads to its view (in_view); a folder's data/ makes
// its view on first use (data_view), an idle one frees its union, and
// refresh moves the views after the mount's snapshots, merges and
// rollbacks. The folder's other parts: ctl_layers.cpp (its own nodes and
// the branch table), ctl_names.cpp and ctl_files.cpp (the FUSE
// operations), ctl_caches.cpp (the other unions' caches).
#include "ctl_folder.h"

#include <algorithm>

#include "ctl_nodes.h"

namespace plyfs {

using namespace ctl;

// --- views -------------------------------------------------------------------------------

Result<ControlFolder::InView> ControlFolder::in_view(fuse_ino_t ino) {
  const size_t slot = slot_of(ino);
  if (slot == 0) return Error::io(EPERM, "not a node of a layer's data");
  std::shared_lock lk(mu_);
  if (slot > views_.size() || !views_[slot - 1]->u)
    return Error::io(ESTALE, "the layer of this node is gone");
  View* v = views_[slot - 1].get();
  drain_unholds(*v);
  uint64_t n = num_of(ino);
  return InView{std::move(lk), v, slot, n};
}

void ControlFolder::drain_unholds(View& v) {
  std::vector<uint64_t> inos;
  {
    std::lock_guard lk(v.unhold_mu);
    inos.swap(v.unholds);
  }
  if (v.u)
    for (uint64_t i : inos) (void)v.u->unhold(i);
}

Result<std::vector<ViewLayer>> ControlFolder::stack_of(TreeId tree) {
  // A folder a merge or rollback dropped, reached through a name the
  // kernel resolved just before: ESTALE makes it walk the path again.
  auto b = Filesystem::branch(*h_.vol, tree);
  if (!b || b->doomed) return Error::io(ESTALE, "the branch is gone");
  auto s = PLY_TRY(layer_stack(*h_.vol, b->name));
  if (s.empty() || s[0].tree != tree) return Error::io(ESTALE, "the branch is gone");
  if (h_.read_only)
    for (auto& l : s) l.writable = false;
  return s;
}

Result<std::vector<UnionBranch>> ControlFolder::branches_of(const std::vector<ViewLayer>& s) {
  std::vector<UnionBranch> ub;
  for (const auto& l : s) ub.push_back(UnionBranch{PLY_TRY(h_.open_branch(l.tree)), l.writable});
  return ub;
}

Result<size_t> ControlFolder::data_view(fuse_ino_t folder) {
  // The name, its branch and the view bound to it, in one piece: a
  // snapshot in between would leave the frozen branch (C4, C6).
  std::lock_guard cl(*h_.ctl_mu);
  const TreeId tree = PLY_TRY(folder_branch(folder)).tree;
  {
    std::shared_lock lk(mu_);  // retire_if_idle takes it exclusive
    if (auto it = slot_of_.find(tree.v); it != slot_of_.end() && views_[it->second - 1]->u) {
      views_[it->second - 1]->kernel_refs++;
      return it->second;
    }
  }
  auto s = PLY_TRY(stack_of(tree));
  auto ub = PLY_TRY(branches_of(s));
  std::unique_lock lk(mu_);
  auto make = [&](View& v) {
    v.stack = std::move(s);
    v.u = std::make_unique<Union>(std::move(ub), h_.copyup, h_.del);
    v.u->set_kernel_times(kernel_times_);
    v.kernel_refs++;
  };
  if (auto it = slot_of_.find(tree.v); it != slot_of_.end()) {
    View& v = *views_[it->second - 1];
    if (!v.u) make(v);  // idle until now: the same slot, the same node ids (C3)
    else v.kernel_refs++;
    return it->second;
  }
  if (views_.size() + 1 >= (size_t(1) << (63 - kSlotShift)))
    return Error::io(ENOSPC, "this mount has shown too many layers");
  auto v = std::make_unique<View>();
  v->layer = tree;
  v->name = PLY_TRY(Filesystem::branch(*h_.vol, tree)).name;
  make(*v);
  views_.push_back(std::move(v));
  slot_of_[tree.v] = views_.size();
  live_views_ = slot_of_.size();
  return views_.size();
}

void ControlFolder::unref(size_t slot, uint64_t n) {
  std::atomic<uint64_t>& r = views_[slot - 1]->kernel_refs;
  uint64_t cur = r.load();
  while (!r.compare_exchange_weak(cur, cur - std::min(cur, n))) {
  }
}

bool ControlFolder::bound(size_t slot) const {
  auto it = slot_of_.find(views_[slot - 1]->layer.v);
  return it != slot_of_.end() && it->second == slot;
}

void ControlFolder::retire_if_idle(size_t slot) {
  // Never waits: forget and release must not queue behind a snapshot that
  // holds mu_ (release takes no lock at all otherwise).
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock() || slot > views_.size()) return;
  View& v = *views_[slot - 1];
  // Idle, the union has no node but its root and pins nothing: nothing to
  // release.
  if (v.u && v.idle() && bound(slot)) v.u.reset();
}

void ControlFolder::refresh(const std::vector<TreeId>& replaced) {
  struct Count {  // however the loop ends
    ControlFolder& f;
    ~Count() { f.live_views_ = f.slot_of_.size(); }
  } count{*this};
  auto bs = Filesystem::branches(*h_.vol);
  for (size_t i = 0; i < views_.size(); i++) {
    View& v = *views_[i];
    if (!bound(i + 1)) continue;  // gone (C3)
    if (v.u && v.idle()) v.u.reset();  // idle: no restack, made anew on use
    // A view follows its branch's name, as the catalog's views and the mount
    // follow the branch they write to: after a snapshot the name is the new
    // live layer's (on the frozen branch), after a merge the result's, after
    // a rollback the fresh layer's. Files open in the view stay open.
    TreeId now{0};
    if (bs)
      for (const auto& b : *bs)
        if (!b.doomed && b.name == v.name) now = b.tree;
    if (now != v.layer) {
      slot_of_.erase(v.layer.v);
      if (!now.v || slot_of_.count(now.v)) {  // gone, or another view shows it already
        v.u.reset();  // C3: its nodes answer ESTALE from now on
        continue;
      }
      v.layer = now;
      slot_of_[now.v] = i + 1;
    }
    if (!v.u) continue;  // idle: it follows the name, its stack is read when made
    auto s = stack_of(v.layer);
    bool same = s && s->size() == v.stack.size() &&
                std::equal(s->begin(), s->end(), v.stack.begin(), [](const ViewLayer& a, const ViewLayer& b) {
                  return a.tree == b.tree && a.writable == b.writable;
                }) &&
                std::none_of(v.stack.begin(), v.stack.end(), [&](const ViewLayer& l) {
                  return std::find(replaced.begin(), replaced.end(), l.tree) != replaced.end();
                });
    if (same) continue;
    Result<void> r = s ? Result<void>(ok()) : Result<void>(s.error());
    if (r) {
      auto ub = branches_of(*s);
      r = ub ? v.u->restack(std::move(*ub)) : Result<void>(ub.error());
    }
    if (r) {
      v.stack = std::move(*s);
    } else {
      v.u.reset();  // C3: its nodes answer ESTALE from now on
      slot_of_.erase(v.layer.v);
    }
  }
}

Result<void> ControlFolder::release_all() {
  std::shared_lock lk(mu_);
  Result<void> r = ok();
  for (auto& v : views_)
    if (v->u)
      if (auto e = v->u->release_all(); !e && r) r = e;
  return r;
}

}  // namespace plyfs
