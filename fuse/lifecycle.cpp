// The branch lifecycle of the mounted stack as the daemon runs it online
// (snapshot, merge and rollback; control.h, format.md#snapshots "Online"),
// and the two threads that run it unasked: the cleaner, which drops what a
// merge or rollback doomed, and the automatic snapshots (-o
// snapshot_interval, snapshot_keep).
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "daemon.h"
#include "snap/model.h"
#include "snap/snap.h"
#include "util/text.h"

namespace plyfs::daemon {

// Snapshot, merge or rollback of the mounted stack (format.md#snapshots,
// "Online"), under ctl_mu. Each runs inside Union::restack's prepare step,
// while no operation runs and no data change is landing, so that a snapshot
// holds every write that finished before it and none after, and a merge
// sees the upper branch hold still. When the restack returns nothing uses
// the replaced (doomed) branches: they are closed and dropped at once (or
// at the next mount, after a crash). The answer is the object plyctl prints
// for the command offline (snap/model.h): a Snapshot, a Merge, or the
// rolled-back Branch.
Result<model::Json> lifecycle(const std::string& cmd, const std::string& name) {
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  // No operation of the control folder's views runs meanwhile (ctl_folder.h C2).
  auto views_held = g->ctl->hold();
  // The mounted stack is checked like a view before anything changes (snap.h):
  // a merge needs the lower branch right below the upper one, a rollback
  // the branch in the stack.
  if (cmd != "snapshot") {
    BranchMeta b = PLY_TRY(find_branch(*g->vol, name));
    auto at = std::find_if(g->stack.begin(), g->stack.end(), [&](const ViewLayer& l) { return l.tree == b.tree; });
    if (at == g->stack.end()) return Error::io(ENOENT, "branch \"" + shown(b.name) + "\" is not in the mounted stack");
    if (cmd == "merge" && (at + 1 == g->stack.end() || (at + 1)->tree != b.parent))
      return Error::io(EBUSY, "the mount does not show \"" + shown(b.name) +
                                  "\" right above the branch it is on: move that branch right below it "
                                  "(plyctl branch add|move MOUNTPOINT), or merge on the image unmounted");
  }
  std::vector<ViewLayer> next;
  Snapshot snap_done;
  Merge merge_done;
  TreeId result;                 // the branch the answer shows (a rollback's fresh one)
  std::vector<TreeId> replaced;  // branches a merge or rollback doomed
  bool changed = false;  // the image changed: the mount must follow or stop
  auto r = g->u->restack([&]() -> Result<std::vector<UnionBranch>> {
    if (cmd == "snapshot") {
      auto top = std::find_if(g->stack.begin(), g->stack.end(), [](const ViewLayer& l) { return l.writable; });
      if (top == g->stack.end()) return Error::io(EROFS, "the stack has no writable branch");
      std::string snap = name;
      if (snap.empty()) snap = PLY_TRY(snapshot_name(*g->vol, PLY_TRY(Filesystem::branch(*g->vol, top->tree)).name));
      snap_done = PLY_TRY(snapshot(*g->vol, g->stack, snap));
      next = snap_done.stack;
      changed = true;
    } else {
      BranchMeta b = PLY_TRY(find_branch(*g->vol, name));
      next = g->stack;
      if (cmd == "merge") {
        auto it = g->branches.find(b.tree.v);
        Merge m = PLY_TRY(merge(*g->vol, b.tree, it == g->branches.end() ? nullptr : it->second.get()));
        merge_done = m;
        changed = true;
        replaced = {m.upper, m.lower};
        for (auto& l : next)
          if (l.tree == m.upper) l.tree = m.merged.tree;
        std::erase_if(next, [&](const ViewLayer& l) { return l.tree == m.lower; });
      } else {
        BranchMeta fresh = PLY_TRY(rollback(*g->vol, b.tree));
        result = fresh.tree;
        changed = true;
        replaced = {b.tree};
        for (auto& l : next)
          if (l.tree == b.tree) l.tree = fresh.tree;
      }
    }
    return union_branches(next);
  });
  if (!r) {
    // The branches changed but the union could not follow: writing on into
    // a branch that is now doomed would lose the writes at unmount.
    if (changed) g->vol->fail(r.error());
    return r.error();
  }
  g->stack = next;
  g->ctl->refresh();  // before the replaced branches close
  // Once the restack returned, nothing uses the replaced branches: they
  // close now, and the cleaner drops them once the command has returned,
  // so that what the freeing costs (it follows the data the merge
  // replaced) is not the command's. Their DOOMED flags are durable with
  // the swap: after a crash the next mount drops them.
  for (TreeId t : replaced) g->branches.erase(t.v);
  // Durable when the command returns, as btrfs's snapshots are.
  PLY_CHECK(g->vol->commit());
  if (!replaced.empty()) {
    std::lock_guard cl(g->clean_mu);
    g->clean_pending = true;
    g->clean_cv.notify_all();
  }
  // A snapshot or a merge shows the same view, with the same inode numbers
  // and attributes: what the kernel cached stays true. A rollback does not.
  if (cmd == "rollback") invalidate_all();
  auto bs = PLY_TRY(model::Branches::read(*g->vol));
  if (cmd == "snapshot") return model::snapshot(bs, snap_done);
  if (cmd == "merge") return model::merge(bs, merge_done);
  const BranchMeta* fresh = bs.find(result);
  if (!fresh) return Error::io(ENOENT, "the rolled-back branch is gone");
  return bs.branch(*fresh);
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
      auto d = drop_doomed(*g->vol);
      if (!d) log_error("dropping replaced branches: %s", d.error().user_message(g->image).c_str());
      else if (*d)
        if (auto c = g->vol->commit(); !c) log_error("commit after dropping branches: %s", c.error().user_message(g->image).c_str());
    }
    lk.lock();
  }
}

// Automatic snapshots: every interval, a snapshot of the stack; beyond
// `keep` snapshots of the live branch (the read-only branches named
// LIVE@... right below it), the oldest goes by merging the next one into it.
void snapper_loop() {
  std::unique_lock lk(g->snap_mu);
  for (;;) {
    if (g->snap_cv.wait_for(lk, std::chrono::seconds(g->snap_interval), [] { return g->snap_stop; })) return;
    lk.unlock();
    auto r = control(model::Json{{"command", "snapshot"}}, true);
    if (!r) log_error("automatic snapshot failed: %s", r.error().user_message(g->image).c_str());
    while (r && g->snap_keep) {
      std::vector<std::string> snaps;  // newest first
      {
        std::lock_guard cl(g->ctl_mu);
        auto top = std::find_if(g->stack.begin(), g->stack.end(), [](const ViewLayer& l) { return l.writable; });
        auto live = top == g->stack.end() ? Result<BranchMeta>(Error::io(ENOENT, "")) : Filesystem::branch(*g->vol, top->tree);
        if (!live) break;
        for (auto it = top + 1; it != g->stack.end() && !it->writable; ++it) {
          auto b = Filesystem::branch(*g->vol, it->tree);
          if (!b || b->name.rfind(snapshot_prefix(live->name), 0) != 0) break;
          snaps.push_back(b->name);
        }
      }
      if (snaps.size() <= g->snap_keep || snaps.size() < 2) break;
      model::Json req = {{"command", "merge"}};
      model::put_name(req, "branch", snaps[snaps.size() - 2]);
      auto m = control(req, true);
      if (!m) {
        log_error("dropping snapshot %s failed: %s", snaps.back().c_str(), m.error().user_message(g->image).c_str());
        break;
      }
    }
    lk.lock();
  }
}

}  // namespace plyfs::daemon
