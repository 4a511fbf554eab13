// The branch lifecycle of the mounted stack as the daemon runs it online
// (snapshot, merge and rollback; control.h, format.md#snapshots "Online"),
// and the two threads that run it unasked: the cleaner, which drops what a
// merge or rollback doomed, and the automatic snapshots (-o
// snapshot_interval, snapshot_keep).
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "blockdev/read_cache.h"
#include "util/memory.h"
#include "daemon.h"
#include "snap/model.h"
#include "snap/snap.h"
#include "util/text.h"

namespace plyfs::daemon {

namespace {

// Takes `tree`'s Filesystem out of use: its branch's content was replaced
// (a rollback or a merge keeps the tree id, snap.h) or the branch is gone.
// The object lives on in `retired` until nothing can use it any more.
void retire_branch(TreeId tree, std::vector<std::unique_ptr<Filesystem>>& retired) {
  auto it = g->branches.find(tree.v);
  if (it == g->branches.end()) return;
  it->second->retire();
  retired.push_back(std::move(it->second));
  g->branches.erase(it);
}

void kick_cleaner() {
  std::lock_guard cl(g->clean_mu);
  g->clean_pending = true;
  g->clean_cv.notify_all();
}

}  // namespace

// A snapshot of the mounted stack's writable branch (format.md#snapshots,
// "Online"): an O(1) clone taken while no operation runs and no data change
// is landing, so that it holds every write that finished before it and none
// after. Nothing the mount shows changes, so nothing is restacked and no
// cache is dropped; the mount never grows deeper. Durable when it returns,
// as btrfs's snapshots are; the commit runs with operations going on
// (format.md#commit), so the mount pauses for the clone alone.
Result<model::Json> take_snapshot(const std::string& name) {
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  const TreeId top = PLY_TRY(snapshot_target(g->stack));
  std::string snap = name;
  if (snap.empty()) snap = PLY_TRY(snapshot_name(*g->vol, PLY_TRY(Filesystem::branch(*g->vol, top)).name));
  Snapshot s;
  {
    // The control folder's views write to the branch too: none of their
    // operations may be half done in the clone (ctl_folder.h C2).
    auto views_held = g->ctl->hold();
    PLY_CHECK(g->u->hold_still([&]() -> Result<void> {
      s = PLY_TRY(snapshot(*g->vol, top, snap));
      return ok();
    }));
  }
  PLY_CHECK(g->vol->commit());
  return model::snapshot(PLY_TRY(model::Branches::read(*g->vol)), s);
}

// Merge or rollback of a branch of the mounted stack (format.md#snapshots,
// "Online"), under ctl_mu. Each runs inside Union::restack's prepare step,
// while no operation runs and no data change is landing, so that a merge
// sees the upper branch hold still. The branch keeps its tree id and place
// in the stack; its Filesystem is replaced by one of the new content, and
// what the old content only held is dropped by the cleaner once the command
// has returned (or at the next mount, after a crash). The answer is the
// object plyctl prints for the command offline (snap/model.h): a Snapshot,
// a Merge, or a Rollback.
Result<model::Json> lifecycle(const std::string& cmd, const std::string& name, const std::string& arg) {
  if (cmd == "snapshot") return take_snapshot(name);
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  // No operation of the control folder's views runs meanwhile (ctl_folder.h C2).
  auto views_held = g->ctl->hold();
  // The mounted stack is checked like a view before anything changes (snap.h):
  // a merge needs the lower branch right below the upper one, a rollback
  // the branch in the stack.
  BranchMeta b = PLY_TRY(find_branch(*g->vol, name));
  auto at = std::find_if(g->stack.begin(), g->stack.end(), [&](const ViewLayer& l) { return l.tree == b.tree; });
  if (at == g->stack.end()) return Error::io(ENOENT, "branch \"" + shown(b.name) + "\" is not in the mounted stack");
  if (cmd == "merge" && (at + 1 == g->stack.end() || (at + 1)->tree != b.parent))
    return Error::io(EBUSY, "the mount does not show \"" + shown(b.name) +
                                "\" right above the branch it is on: move that branch right below it "
                                "(plyctl branch add|move MOUNTPOINT), or merge on the image unmounted");
  std::optional<TreeId> to;
  if (cmd == "rollback" && !arg.empty()) to = PLY_TRY(find_branch(*g->vol, arg)).tree;
  std::vector<ViewLayer> next;
  std::vector<TreeId> gone;  // branches that left the stack and the image
  std::vector<std::unique_ptr<Filesystem>> retired;
  bool changed = false;  // the image changed: the mount must follow or stop
  Merge merge_done;
  Rollback rollback_done;
  // The same line as offline (plyctl merge); a rollback is O(1) here, its
  // freeing the cleaner's.
  std::string what = cmd == "merge" ? "merging " : "rolling back ";
  what += shown(b.name);
  RunningOp op(cmd, what, cmd == "merge" ? "entries" : "");
  auto r = g->u->restack([&]() -> Result<std::vector<UnionBranch>> {
    next = g->stack;
    if (cmd == "merge") {
      auto it = g->branches.find(b.tree.v);
      Merge m = PLY_TRY(merge(*g->vol, b.tree, it == g->branches.end() ? nullptr : it->second.get(),
                              [&](const MergeStats& st) { op.update(st.entries, st.fraction); }));
      changed = true;
      std::erase_if(next, [&](const ViewLayer& l) { return l.tree == m.lower; });
      if (m.lower_doomed) gone.push_back(m.lower);
      merge_done = m;
    } else {
      rollback_done = PLY_TRY(rollback(*g->vol, b.tree, to));
      changed = true;
    }
    // The same tree id with another content: a new Filesystem serves it.
    retire_branch(b.tree, retired);
    return union_branches(next);
  });
  if (!r) {
    // The branches changed but the union could not follow: writing on into
    // a branch whose content was replaced would lose the writes at unmount.
    if (changed) g->vol->fail(r.error());
    return r.error();
  }
  g->stack = next;
  // The views of the control folder move too, onto the new Filesystem of
  // the branch (ctl_folder.h C1), before the retired one goes.
  g->ctl->refresh({b.tree});
  retired.clear();
  for (TreeId t : gone) g->branches.erase(t.v);
  // Durable when the command returns.
  PLY_CHECK(g->vol->commit());
  kick_cleaner();
  // A merge shows the same view, with the same inode numbers and
  // attributes: what the kernel cached stays true. A rollback does not.
  if (cmd == "rollback") invalidate_all();
  auto bs = PLY_TRY(model::Branches::read(*g->vol));
  if (cmd == "merge") return model::merge(bs, merge_done);
  return model::rollback(bs, rollback_done);
}

// Deletes a branch the mount does not show, online (issue 24: space comes
// back without unmounting). No operation of the mount uses a branch outside
// its stack once the restack that took it out returned; the control
// folder's views are held still, and one showing the branch answers ESTALE
// from then on. Its space is free once the commit returns.
Result<model::Json> delete_online(const BranchMeta& b) {
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  if (std::any_of(g->stack.begin(), g->stack.end(), [&](const ViewLayer& l) { return l.tree == b.tree; }))
    return Error::io(EBUSY, "the mount shows \"" + shown(b.name) +
                                "\": take it out of the stack first (plyctl branch remove MOUNTPOINT)");
  auto views_held = g->ctl->hold();
  const model::Json deleted = PLY_TRY(model::Branches::read(*g->vol)).branch(b);
  std::vector<std::unique_ptr<Filesystem>> retired;
  {
    std::string what = "deleting ";
    what += shown(b.name);
    RunningOp op("delete", what, "nodes");
    PLY_CHECK(delete_branch(*g->vol, b.tree, [&](const BTree::DropStats& st) { op.update(st.nodes, st.fraction); }));
  }
  retire_branch(b.tree, retired);
  g->ctl->refresh({b.tree});
  retired.clear();
  PLY_CHECK(g->vol->commit());
  return deleted;
}

// Drops doomed branches whenever a merge or rollback made some, as btrfs's
// cleaner frees deleted subvolumes: under ctl_mu, like the branch changes,
// so that no view of the control folder opens a branch meanwhile. At
// unmount it finishes what is pending before it stops.
void cleaner_loop() {
  std::unique_lock lk(g->clean_mu);
  for (;;) {
    g->clean_cv.wait(lk, [] { return g->clean_pending || g->clean_stop; });
    if (!g->clean_pending) return;
    g->clean_pending = false;
    lk.unlock();
    {
      std::lock_guard cl(g->ctl_mu);
      auto views_held = g->ctl->hold();
      RunningOp op("clean", "freeing the replaced branches", "nodes");
      auto d = drop_doomed(*g->vol, [&](const BTree::DropStats& st) { op.update(st.nodes, st.fraction); });
      if (!d) log_error("dropping replaced branches: %s", d.error().user_message(g->image).c_str());
      else if (*d)
        if (auto c = g->vol->commit(); !c) log_error("commit after dropping branches: %s", c.error().user_message(g->image).c_str());
    }
    lk.lock();
  }
}

// Once a second, the limit of every read cache of the process from the
// memory the machine, or the cgroup the daemon runs in, has left
// (read_cache.h, C8; util/memory.h): what ZFS's ARC does with the kernel's
// shrinkers, which a process cannot register.
void memory_loop() {
  std::unique_lock lk(g->mem_mu);
  while (!g->mem_cv.wait_for(lk, std::chrono::seconds(1), [] { return g->mem_stop; })) {
    const size_t n = ReadCacheDevice::count();
    if (n == 0) continue;  // no NBD device (yet: one may be added)
    const Memory m = memory_now();
    ReadCacheDevice::for_each([&](ReadCacheDevice& c) {
      c.set_limit(ReadCacheDevice::next_limit(c.capacity(), c.limit(), c.stats().cached_bytes, m, n));
    });
  }
}

// Automatic snapshots: every interval, a snapshot of the stack's writable
// branch; of the snapshots of it made this way (named LIVE@...), those the
// retention (-o snapshot_keep: the newest N, or classes, snap/retention.h;
// held snapshots neither go nor count)
// does not keep are deleted: their blocks that newer snapshots or the
// branch share stay, the rest is freed (format.md#snapshots).
void snapper_loop() {
  std::unique_lock lk(g->snap_mu);
  for (;;) {
    if (g->snap_cv.wait_for(lk, std::chrono::seconds(g->snap_interval), [] { return g->snap_stop; })) return;
    lk.unlock();
    auto r = control(model::Json{{"command", "snapshot"}}, true);
    if (!r) log_error("automatic snapshot failed: %s", r.error().user_message(g->image).c_str());
    if (r && !g->snap_keep.keeps_all()) {
      std::vector<std::string> old;  // oldest first, what the retention drops
      {
        std::lock_guard cl(g->ctl_mu);
        auto top = snapshot_target(g->stack);
        auto live = top ? Filesystem::branch(*g->vol, *top) : Result<BranchMeta>(top.error());
        // Held snapshots are skipped and not counted (plyfs.8).
        auto gone = live ? expired_snapshots(*g->vol, live->tree, g->snap_keep)
                         : Result<std::vector<BranchMeta>>(live.error());
        if (gone)
          for (const auto& b : *gone) old.push_back(b.name);
        else
          log_error("choosing the snapshots to prune: %s", gone.error().user_message(g->image).c_str());
      }
      for (const auto& name : old) {
        model::Json req = {{"command", "delete"}};
        model::put_name(req, "branch", name);
        if (auto d = control(req, true); !d)
          log_error("deleting snapshot %s failed: %s", shown(name).c_str(), d.error().user_message(g->image).c_str());
      }
    }
    lk.lock();
  }
}

}  // namespace plyfs::daemon
