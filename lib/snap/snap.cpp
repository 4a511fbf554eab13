// Snapshots, clones, merges, rollback, deletion and diff (snap.h;
// format.md#snapshots).
#include "snap/snap.h"

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <set>

#include "fs/disk_fs.h"
#include "snap/retention.h"
#include "union/union.h"
#include "util/text.h"

namespace plyfs {

namespace {

// The blocks a swap may need, reserved before it changes anything (A5): a
// few new trees, every view rewritten, a few branches' FsInfo, and a new
// default view. The helpers it calls reserve nothing more, so that no swap
// fails halfway for want of space.
Result<uint64_t> swap_blocks(Volume& v) {
  auto t = PLY_TRY(v.begin());
  const uint64_t views = PLY_TRY(list_views(t)).size();
  return 2 * Filesystem::kCreateBlocks + 4 * Filesystem::kCloneBlocks + Filesystem::kSetBranchBlocks * 8 +
         kViewBlocks * (views + 2) + 16;
}

Result<BranchMeta> live_branch(Volume::Txn& t, TreeId id) {
  auto b = t.tree_info(id);
  if (!b) return Error::io(ENOENT, "no branch with tree id " + std::to_string(id.v));
  BranchMeta m = PLY_TRY(Filesystem::branch(t, id));
  if (m.doomed) return Error::io(ENOENT, "no branch with tree id " + std::to_string(id.v));
  return m;
}

// A layer is a branch created empty on its parent, as opposed to a clone
// (view.h's is_layer).
bool layer(const BranchMeta& b) { return b.parent.v && b.origin != b.parent; }

// Refuses while a live branch other than `except` is layered on `b`.
Result<void> no_layers_on(Volume::Txn& t, const BranchMeta& b, TreeId except) {
  for (const auto& x : PLY_TRY(Filesystem::children(t, b.tree)))
    if (!x.doomed && x.tree != except && x.tree != b.tree && layer(x))
      return Error::io(EBUSY, "layer \"" + shown(x.name) + "\" is made on \"" + shown(b.name) +
                                  "\": merge or delete that layer first");
  return ok();
}

// Refuses to make a held branch go away (format.md#snapshots, "Holds").
Result<void> not_held(const BranchMeta& b) {
  if (b.held)
    return Error::io(EBUSY, "\"" + shown(b.name) + "\" is held: release it first (plyctl release)");
  return ok();
}

// Clones of a branch that goes record no parent any more (their parent
// field is provenance only; a layer on it was refused before).
Result<void> forget_parent(Volume::Txn& t, TreeId gone) {
  for (auto b : PLY_TRY(Filesystem::children(t, gone)))
    if (!b.doomed && b.tree != gone && !layer(b)) {
      b.parent = TreeId{0};
      PLY_CHECK(Filesystem::set_branch(t, b));
    }
  return ok();
}

// The tree a plain mount shows when no view is the default (the lowest-id
// branch, format.md#fs-info), or 0 when a view is.
Result<TreeId> implicit_default(Volume::Txn& t) {
  for (const auto& view : PLY_TRY(list_views(t)))
    if (view.is_default) return TreeId{0};
  for (const auto& b : PLY_TRY(Filesystem::branches(t)))
    if (!b.doomed) return b.tree;
  return TreeId{0};
}

// When an operation dooms the tree a plain mount shows by default, a
// default view keeps plain mounts on what replaced it (its id may not be
// the lowest). Named "default", or "default-N" if that name is taken.
Result<void> keep_default(Volume::Txn& t, TreeId was, TreeId replaced, const std::vector<ViewLayer>& stack) {
  if (!was.v || was != replaced) return ok();
  auto views = PLY_TRY(list_views(t));
  std::string name = "default";
  for (int i = 1; std::any_of(views.begin(), views.end(), [&](const View& w) { return w.name == name; }); i++)
    name = "default-" + std::to_string(i);
  return put_view(t, View{name, true, stack});
}

// Branch `b` takes the content of tree `src`, keeping its id and fields.
// Its old content first becomes a doomed clone (O(1)), so that the reset
// frees nothing now: the clone is dropped later (drop_doomed), outside the
// command. Returns the doomed tree.
Result<TreeId> replace_content(Volume::Txn& t, const BranchMeta& b, TreeId src) {
  BranchMeta old = b;
  old.doomed = true;
  old.snapshot = false;
  old.held = false;  // the hold stays with the branch
  old.quota_referenced = old.quota_exclusive = 0;  // so does a quota
  old.received_uuid = {};
  const TreeId keep = PLY_TRY(Filesystem::clone(t, b.tree, old)).tree;
  PLY_CHECK(Filesystem::reset(t, b.tree, src));
  return keep;
}

// The root directory's attributes of a branch (a new layer's root starts as
// its parent's).
Result<FsCreateOptions> root_like(Volume& v, TreeId tree) {
  auto fs = PLY_TRY(Filesystem::open(v, tree, true));
  Attr a = PLY_TRY(fs->getattr(fs->root()));
  FsCreateOptions o;
  o.root_mode = a.mode & 07777;
  o.uid = a.uid;
  o.gid = a.gid;
  return o;
}

// Walks the `n` entries of a directory whose part of a whole walk is
// `share`: each weighs share / n, and `fraction` (the share walked, 0 to 1)
// moves past entry k once `entry(k, each)` returned; a directory without
// entries counts whole at once. The progress of a merge (MergeStats) and of
// a diff between views (DiffStats).
template <class F>
Result<void> over_entries(double& fraction, size_t n, double share, F&& entry) {
  const double base = fraction, each = n ? share / double(n) : 0;
  for (size_t k = 0; k < n; k++) {
    PLY_CHECK(entry(k, each));
    fraction = base + double(k + 1) * each;
  }
  if (!n) fraction = base + share;
  return ok();
}

}  // namespace

Result<size_t> drop_doomed(Volume& v, const BTree::DropProgress& progress) {
  if (v.read_only()) return size_t(0);
  std::vector<TreeId> doomed;
  for (const auto& b : PLY_TRY(Filesystem::branches(v)))
    if (b.doomed) doomed.push_back(b.tree);
  BTree::DropStats done;  // the trees dropped before
  for (size_t i = 0; i < doomed.size(); i++) {
    auto t = PLY_TRY(v.begin({.for_delete = true, .reserve_blocks = 64}));
    BTree::DropStats last;
    PLY_CHECK(Filesystem::drop(t, doomed[i], [&](const BTree::DropStats& st) {
      last = st;
      // Each tree weighs the same: their sizes are not known beforehand.
      if (progress)
        progress({done.nodes + st.nodes, done.extents + st.extents, (double(i) + st.fraction) / double(doomed.size())});
    }));
    done.nodes += last.nodes;
    done.extents += last.extents;
  }
  return doomed.size();
}

Result<BranchMeta> clone_branch(Volume& v, TreeId src, std::string_view name, bool read_only) {
  PLY_CHECK(check_branch_name(name));
  auto t = PLY_TRY(v.begin({.reserve_blocks = Filesystem::kCloneBlocks}));
  if (PLY_TRY(Filesystem::find(t, name)))
    return Error::io(EEXIST, "a branch named \"" + shown(name) + "\" exists");
  BranchMeta s = PLY_TRY(live_branch(t, src));
  BranchMeta m = s;
  m.name = std::string(name);
  // A clone of a layer holds only the layer's changes: it is a layer on the
  // same parent (showing the same view). A clone of anything else records
  // its source.
  m.parent = layer(s) ? s.parent : src;
  m.read_only = read_only;
  m.snapshot = false;
  m.held = false;  // a hold is the branch's own, as in ZFS
  m.quota_referenced = m.quota_exclusive = 0;  // so is a quota (btrfs, ZFS)
  m.received_uuid = {};
  return Filesystem::clone(t, src, m);
}

std::string snapshot_prefix(std::string_view base) {
  // 32 bytes: the base, "@YYMMDD-HHMMSS" (14) and room for ".NN" (3).
  return std::string(base.substr(0, 32 - 14 - 3)) + "@";
}

Result<std::string> snapshot_name(Volume& v, std::string_view base) {
  char stamp[32];
  time_t now = time(nullptr);
  tm tmv{};
  gmtime_r(&now, &tmv);
  strftime(stamp, sizeof stamp, "@%y%m%d-%H%M%S", &tmv);
  std::string b = snapshot_prefix(base);
  b.pop_back();  // the '@' is the stamp's
  std::string name = b + stamp;
  auto t = PLY_TRY(v.begin());
  for (int i = 1; PLY_TRY(Filesystem::find(t, name)); i++) {
    if (i > 99) return Error::io(EEXIST, "too many snapshots named " + b + stamp);
    name = b + stamp + "." + std::to_string(i);
  }
  return name;
}

Result<TreeId> snapshot_target(const std::vector<ViewLayer>& stack) {
  auto top = std::find_if(stack.begin(), stack.end(), [](const ViewLayer& l) { return l.writable; });
  if (top == stack.end()) return Error::io(EROFS, "the stack has no writable branch to snapshot");
  return top->tree;
}

Result<Snapshot> snapshot(Volume& v, TreeId tree, std::string_view snap_name) {
  PLY_CHECK(check_branch_name(snap_name, "snapshot"));
  auto t = PLY_TRY(v.begin({.reserve_blocks = Filesystem::kCloneBlocks}));
  if (PLY_TRY(Filesystem::find(t, snap_name)))
    return Error::io(EEXIST, "a branch named \"" + shown(snap_name) + "\" exists");
  Snapshot s;
  s.live = PLY_TRY(live_branch(t, tree));
  BranchMeta m = s.live;
  m.name = std::string(snap_name);
  m.read_only = true;
  m.snapshot = true;
  m.held = false;  // a hold is the branch's own, as in ZFS
  m.quota_referenced = m.quota_exclusive = 0;  // so is a quota (btrfs, ZFS)
  m.received_uuid = {};
  // As a clone: a snapshot of a layer is a layer on its parent.
  m.parent = layer(s.live) ? s.live.parent : tree;
  s.frozen = PLY_TRY(Filesystem::clone(t, tree, m));
  return s;
}

Result<std::vector<BranchMeta>> snapshots_of(Volume& v, TreeId tree) {
  auto t = PLY_TRY(v.begin());
  std::vector<BranchMeta> out;
  for (auto& b : PLY_TRY(Filesystem::clones_of(t, tree)))
    if (b.snapshot && !b.doomed) out.push_back(std::move(b));
  std::sort(out.begin(), out.end(), [](const BranchMeta& a, const BranchMeta& b) {
    return a.created != b.created ? a.created < b.created : a.tree.v < b.tree.v;
  });
  return out;
}

Result<std::vector<BranchMeta>> expired_snapshots(Volume& v, TreeId live, const Retention& r) {
  const BranchMeta b = PLY_TRY(Filesystem::branch(v, live));
  auto snaps = PLY_TRY(snapshots_of(v, live));
  // Held ones are neither deleted nor counted: a hold does not take the
  // place of a snapshot the classes keep (plyfs.8, "snapshot_keep").
  std::erase_if(snaps, [&](const BranchMeta& s) { return s.held || s.name.rfind(snapshot_prefix(b.name), 0) != 0; });
  std::vector<uint64_t> times;
  for (const auto& s : snaps) times.push_back(s.created_ns);
  std::vector<BranchMeta> out;
  for (size_t i : prune(times, r)) out.push_back(snaps[i]);
  return out;
}

Result<BranchMeta> set_held(Volume& v, TreeId tree, bool held) {
  auto t = PLY_TRY(v.begin({.reserve_blocks = Filesystem::kSetBranchBlocks}));
  BranchMeta b = PLY_TRY(live_branch(t, tree));
  if (b.held == held) return b;  // idempotent: nothing is written
  b.held = held;
  PLY_CHECK(Filesystem::set_branch(t, b));
  return Filesystem::branch(t, tree);
}

Result<BranchMeta> set_quota(Volume& v, TreeId tree, const QuotaChange& q) {
  auto t = PLY_TRY(v.begin({.reserve_blocks = Filesystem::kSetBranchBlocks}));
  BranchMeta b = PLY_TRY(live_branch(t, tree));
  const uint64_t ref = q.referenced.value_or(b.quota_referenced), excl = q.exclusive.value_or(b.quota_exclusive);
  if (ref == b.quota_referenced && excl == b.quota_exclusive) return b;  // nothing is written
  b.quota_referenced = ref;
  b.quota_exclusive = excl;
  PLY_CHECK(Filesystem::set_branch(t, b));
  return Filesystem::branch(t, tree);
}

// --- merge --------------------------------------------------------------------------------

namespace {

struct Merger {
  Filesystem& up;   // the upper branch
  Filesystem& low;  // the scratch copy of the lower branch
  bool keep_whiteouts;  // the result must hide what is below it, as the pair did
  const std::function<void(const MergeStats&)>& progress;
  MergeStats st;
  // (directory in the scratch tree, name) where pass 1 found an entry under
  // a directory of the upper branch (which must come over opaque).
  std::set<std::pair<uint64_t, std::string>> occupied;
  std::set<uint64_t> replaced;  // objects whose content came over already

  struct Item {
    std::string name;
    uint64_t ino;
    uint8_t type;
  };
  static Result<std::vector<Item>> list(Filesystem& fs, uint64_t dir) {
    std::vector<Item> out;
    PLY_CHECK(fs.readdir(dir, 2, [&](const DirEntry& e) {
      out.push_back({std::string(e.name), e.ino, e.type});
      return true;
    }));
    return out;
  }

  void tick() {
    if (++st.entries % 1024 == 0 && progress) progress(st);
  }

  // Removes dir/name from the scratch tree with everything below it; with
  // `whiteout` the name stays as a whiteout.
  Result<void> remove(uint64_t dir, const std::string& name, const Entry& e, bool whiteout) {
    st.removed++;
    if (e.type != DT_DIR) return low.unlink(dir, name, whiteout);
    for (const auto& c : PLY_TRY(list(low, e.ino)))
      if (c.type != disk::kDtWhiteout)
        PLY_CHECK(remove(e.ino, c.name, Entry{c.ino, c.type}, false));
    return low.rmdir(dir, name, whiteout);
  }

  // Pass 1: everything the upper branch deletes or replaces goes.
  Result<void> prune(uint64_t udir, uint64_t ldir) {
    for (const auto& e : PLY_TRY(list(up, udir))) {
      auto le = PLY_TRY(low.entry(ldir, e.name));
      const bool here = le && le->type != disk::kDtWhiteout;
      if (e.type == disk::kDtWhiteout) {
        if (here) PLY_CHECK(remove(ldir, e.name, *le, keep_whiteouts));
        else if (!le && keep_whiteouts) PLY_CHECK(low.whiteout(ldir, e.name));
        continue;
      }
      if (e.type == DT_DIR) {
        if (le) occupied.insert({ldir, e.name});
        if (!here) continue;
        Attr ua = PLY_TRY(up.getattr(e.ino));
        if (le->type == DT_DIR && !ua.opaque) {
          occupied.erase({ldir, e.name});
          PLY_CHECK(prune(e.ino, le->ino));
        } else {
          PLY_CHECK(remove(ldir, e.name, *le, false));
        }
        continue;
      }
      if (here && le->ino != e.ino) PLY_CHECK(remove(ldir, e.name, *le, false));
    }
    return ok();
  }

  // A directory's attributes and xattrs from the upper branch.
  Result<void> take_attrs(uint64_t uino, uint64_t lino) {
    if (uino == lino) {
      (void)PLY_TRY(low.replace_from(up, uino));
      return ok();
    }
    Attr a = PLY_TRY(up.getattr(uino));
    SetAttr s;
    s.mode = a.mode & 07777;
    s.uid = a.uid;
    s.gid = a.gid;
    s.atime = a.atime;
    s.mtime = a.mtime;
    (void)PLY_TRY(low.setattr(lino, s));
    auto want = PLY_TRY(up.listxattr(uino));
    for (const auto& n : PLY_TRY(low.listxattr(lino)))
      if (std::find(want.begin(), want.end(), n) == want.end()) PLY_CHECK(low.removexattr(lino, n));
    for (const auto& n : want) PLY_CHECK(low.setxattr(lino, n, PLY_TRY(up.getxattr(uino, n)), 0));
    return ok();
  }

  // Pass 2: everything the upper branch holds comes over. `share`: this
  // directory's part of the whole walk (MergeStats::fraction), split evenly
  // among its entries.
  Result<void> graft(uint64_t udir, uint64_t ldir, double share) {
    const auto es = PLY_TRY(list(up, udir));
    return over_entries(st.fraction, es.size(), share, [&](size_t k, double each) {
      tick();
      return graft_entry(es[k], ldir, each);
    });
  }

  Result<void> graft_entry(const Item& e, uint64_t ldir, double share) {
    auto le = PLY_TRY(low.entry(ldir, e.name));
    if (e.type == disk::kDtWhiteout) {
      // Pass 1 did those in directories the lower branch had; a
      // directory new to it may still hide names further down.
      if (!le && keep_whiteouts) PLY_CHECK(low.whiteout(ldir, e.name));
      return ok();
    }
    const bool here = le && le->type != disk::kDtWhiteout;
    if (e.type == DT_DIR) {
      if (here) {  // a directory that merged: pass 1 kept it
        PLY_CHECK(graft(e.ino, le->ino, share));
        PLY_CHECK(take_attrs(e.ino, le->ino));
        return ok();
      }
      Attr ua = PLY_TRY(up.getattr(e.ino));
      (void)PLY_TRY(low.copy_in(up, e.ino, ldir, e.name));
      st.objects++;
      // What the union showed was this directory alone: it hides the
      // branches below the result too, if anything was there.
      if (keep_whiteouts && (ua.opaque || occupied.count({ldir, e.name}))) {
        SetAttr s;
        s.opaque = true;
        (void)PLY_TRY(low.setattr(e.ino, s));
      }
      PLY_CHECK(graft(e.ino, e.ino, share));
      PLY_CHECK(take_attrs(e.ino, e.ino));
      return ok();
    }
    // A file: pass 1 left only the same object at the name, if any.
    auto mine = low.getattr(e.ino);
    const bool held = mine && mine->nlink > 0;
    if (held && !replaced.count(e.ino)) {
      (void)PLY_TRY(low.replace_from(up, e.ino));
      replaced.insert(e.ino);
      st.objects++;
    }
    if (here) return ok();  // the same object, replaced in place
    if (held) (void)PLY_TRY(low.link(e.ino, ldir, e.name));
    else {
      (void)PLY_TRY(low.copy_in(up, e.ino, ldir, e.name));
      replaced.insert(e.ino);
      st.objects++;
    }
    return ok();
  }
};

}  // namespace

Result<Merge> merge(Volume& v, TreeId upper, Filesystem* upper_fs,
                    const std::function<void(const MergeStats&)>& progress) {
  Merge out;
  BranchMeta up, low;
  bool low_is_layer, low_stays;
  {
    auto t = PLY_TRY(v.begin());
    up = PLY_TRY(live_branch(t, upper));
    if (!layer(up))
      return Error::invalid("branch \"" + up.name + "\" is not a layer (made on a parent): nothing to merge into");
    if (up.read_only) return Error::io(EROFS, "branch \"" + up.name + "\" is read-only");
    low = PLY_TRY(live_branch(t, up.parent));
    low_is_layer = layer(low);
    // Other layers on the lower branch (siblings, snapshots of the upper
    // one) show their content over it: it stays for them.
    auto alone = no_layers_on(t, low, up.tree);
    if (!alone && alone.error().code != EBUSY) return alone.error();
    low_stays = !alone;
    // Every view must show the two together (the result replaces the pair):
    // L alone would lose its own content, U alone would gain L's.
    for (const auto& view : PLY_TRY(list_views(t)))
      for (size_t i = 0; i < view.layers.size(); i++) {
        const TreeId x = view.layers[i].tree;
        if (x == low.tree && (i == 0 || view.layers[i - 1].tree != up.tree))
          return Error::io(EBUSY, "view \"" + shown(view.name) + "\" shows \"" + shown(low.name) +
                                      "\" other than right below \"" + shown(up.name) +
                                      "\": change or delete that view first (plyctl view create|delete)");
        if (x == up.tree && (i + 1 == view.layers.size() || view.layers[i + 1].tree != low.tree))
          return Error::io(EBUSY, "view \"" + shown(view.name) + "\" shows \"" + shown(up.name) + "\" without \"" +
                                      shown(low.name) + "\" right below it: change or delete that view first "
                                      "(plyctl view create|delete)");
      }
    // The lower branch goes unless other layers keep it.
    if (!low_stays) PLY_CHECK(not_held(low));
  }
  const uint64_t swap = PLY_TRY(swap_blocks(v));
  // The scratch tree: a doomed clone of the lower branch (dropped by the
  // next open if the merge does not finish, and at once if it fails).
  BranchMeta res = low;
  {
    auto t = PLY_TRY(v.begin({.reserve_blocks = Filesystem::kCloneBlocks}));
    res.doomed = true;
    res.snapshot = false;
    res.held = false;
    res.quota_referenced = res.quota_exclusive = 0;  // the scratch tree is not charged
    res = PLY_TRY(Filesystem::clone(t, low.tree, res));
  }
  std::unique_ptr<Filesystem> own_up;
  auto work = [&]() -> Result<MergeStats> {
    auto lowfs = PLY_TRY(Filesystem::open(v, res.tree));
    if (!upper_fs) {
      own_up = PLY_TRY(Filesystem::open(v, up.tree));
      upper_fs = own_up.get();
    }
    // Whiteouts and opaque flags are kept even in a base branch, where they
    // hide nothing: a view may stack more branches below it.
    Merger m{*upper_fs, *lowfs, true, progress, {}, {}, {}};
    PLY_CHECK(m.prune(upper_fs->root(), lowfs->root()));
    PLY_CHECK(m.graft(upper_fs->root(), lowfs->root(), 1.0));
    PLY_CHECK(m.take_attrs(upper_fs->root(), lowfs->root()));
    if (progress) progress(m.st);
    return m.st;
  };
  auto st = work();
  own_up.reset();
  if (!st) {
    if (auto t = v.begin({.for_delete = true, .reserve_blocks = 64})) (void)Filesystem::drop(*t, res.tree);
    return st.error();
  }

  // The swap: one generation, every block reserved first. The upper branch
  // takes the scratch tree's content (its old content and the scratch tree
  // are doomed), then its new parent; the lower branch leaves the views.
  auto t = PLY_TRY(v.begin({.reserve_blocks = swap}));
  const TreeId was_default = PLY_TRY(implicit_default(t));
  out.doomed.push_back(PLY_TRY(replace_content(t, up, res.tree)));
  PLY_CHECK(Filesystem::drop(t, res.tree));  // O(1): the upper branch holds its root now
  up.parent = low_is_layer ? low.parent : TreeId{0};
  PLY_CHECK(Filesystem::set_branch(t, up));
  PLY_CHECK(rewrite_views(t, [&](View& view) {
    return std::erase_if(view.layers, [&](const ViewLayer& l) { return l.tree == low.tree; }) > 0;
  }));
  if (!low_stays) {
    PLY_CHECK(forget_parent(t, low.tree));
    PLY_CHECK(keep_default(t, was_default, low.tree, {{up.tree, !up.read_only}}));
    low.doomed = true;
    PLY_CHECK(Filesystem::set_branch(t, low));
    out.doomed.push_back(low.tree);
  }
  out.merged = PLY_TRY(Filesystem::branch(t, up.tree));
  out.lower = low.tree;
  out.lower_doomed = !low_stays;
  out.stats = *st;
  return out;
}

Result<Rollback> rollback(Volume& v, TreeId branch, std::optional<TreeId> to) {
  Rollback out;
  BranchMeta b;
  std::optional<FsCreateOptions> empty;  // a layer going back to empty
  {
    auto t = PLY_TRY(v.begin());
    b = PLY_TRY(live_branch(t, branch));
    if (b.read_only) return Error::io(EROFS, "branch \"" + b.name + "\" is read-only");
    PLY_CHECK(no_layers_on(t, b, TreeId{0}));
    if (to) {
      BranchMeta s = PLY_TRY(live_branch(t, *to));
      if (s.origin != b.tree)
        return Error::invalid("\"" + s.name + "\" is not a snapshot or clone of \"" + b.name + "\"");
      out.to = s;
    }
  }
  if (!to) {
    auto snaps = PLY_TRY(snapshots_of(v, b.tree));
    if (!snaps.empty()) out.to = snaps.back();
    else if (layer(b)) empty = PLY_TRY(root_like(v, b.parent));
    else
      return Error::invalid("branch \"" + b.name + "\" has no snapshot to go back to and is not a layer");
  }
  auto t = PLY_TRY(v.begin({.reserve_blocks = PLY_TRY(swap_blocks(v))}));
  TreeId src;
  if (out.to) {
    src = out.to->tree;
  } else {
    empty->name = b.name;
    empty->doomed = true;  // a scratch tree: dropped below, or by the next open
    src = PLY_TRY(Filesystem::create(t, *empty));
  }
  out.doomed = PLY_TRY(replace_content(t, b, src));
  if (!out.to) PLY_CHECK(Filesystem::drop(t, src));  // the branch holds its root now
  out.branch = PLY_TRY(Filesystem::branch(t, b.tree));
  return out;
}

// What a delete may allocate: the records of the clones it orphans
// (forget_parent) and its own catalog change; dropping the tree only frees.
// Kept small (not swap_blocks, sized for a merge's swaps), so that a full
// image can always delete a snapshot to get space back: a delete draws on
// half of the reserve (A5).
Result<uint64_t> delete_blocks(Volume& v, TreeId branch) {
  auto t = PLY_TRY(v.begin());
  uint64_t orphans = 0;
  for (const auto& b : PLY_TRY(Filesystem::children(t, branch)))
    if (!b.doomed && b.tree != branch && !layer(b)) orphans++;
  return Filesystem::kSetBranchBlocks * (orphans + 1) + 16;
}

Result<void> delete_branch(Volume& v, TreeId branch, const BTree::DropProgress& progress) {
  auto t = PLY_TRY(v.begin({.for_delete = true, .reserve_blocks = PLY_TRY(delete_blocks(v, branch))}));
  BranchMeta b = PLY_TRY(live_branch(t, branch));
  PLY_CHECK(not_held(b));
  if (PLY_TRY(Filesystem::live_branches(t)) <= 1)
    return Error::io(EBUSY, "\"" + shown(b.name) + "\" is the image's only branch: create another first");
  PLY_CHECK(no_layers_on(t, b, TreeId{0}));
  for (const auto& view : PLY_TRY(list_views(t)))
    for (const auto& l : view.layers)
      if (l.tree == b.tree)
        return Error::io(EBUSY, "view \"" + shown(view.name) + "\" shows \"" + shown(b.name) +
                                    "\": delete that view or make it show other branches first (plyctl view "
                                    "delete|create)" +
                                    (view.is_default ? std::string("; it is the default view, the one a mount shows") : ""));
  PLY_CHECK(forget_parent(t, b.tree));
  return Filesystem::drop(t, b.tree, progress);
}

}  // namespace plyfs

// --- diff ---------------------------------------------------------------------------------

namespace plyfs {

namespace {

std::string join(const std::string& dir, std::string_view name) {
  return (dir == "/" ? "" : dir) + "/" + std::string(name);
}

struct Differ {
  Filesystem& to;
  std::vector<DiffEntry> out;
  const std::function<void(const DiffStats&)>* progress = nullptr;
  double fraction = 0;  // DiffStats::fraction
  double said = 0;      // the last fraction reported: rounding must not lower it
  uint64_t steps = 0;

  void report() {
    said = std::max(said, std::min(fraction, 1.0));
    (*progress)(DiffStats{out.size(), said});
  }
  void tick() {
    if (*progress && out.size() % 256 == 0) report();
  }
  // The walk moved on to share `f`: reported every 16 steps (a node read,
  // an entry walked, a change named), so that a walk finding little still
  // shows how far it is.
  void step(double f) {
    fraction = f;
    if (*progress && ++steps % 16 == 0) report();
  }
  // Layer diffs only, one per entry of `out`: the object's inode number and
  // attributes (of the view below for a removal, of the layer otherwise),
  // for pair_renames.
  std::vector<std::pair<uint64_t, Attr>> obj;

  void add(Change c, std::string path, const Attr& a) {
    out.push_back({c, std::move(path), "", uint8_t(IFTODT(a.mode))});
    obj.emplace_back(a.ino, a);
    tick();
  }
  static Result<std::vector<DirEntry>> list(Filesystem& fs, uint64_t dir, std::vector<std::string>& names) {
    std::vector<DirEntry> es;
    PLY_CHECK(fs.readdir(dir, 2, [&](const DirEntry& e) {
      names.emplace_back(e.name);
      es.push_back(e);
      return true;
    }));
    for (size_t i = 0; i < es.size(); i++) es[i].name = names[i];
    return es;
  }
  static bool attrs_differ(const Attr& a, const Attr& b) {
    return a.mode != b.mode || a.uid != b.uid || a.gid != b.gid || a.size != b.size ||
           a.mtime.tv_sec != b.mtime.tv_sec || a.mtime.tv_nsec != b.mtime.tv_nsec ||
           a.ctime.tv_sec != b.ctime.tv_sec || a.ctime.tv_nsec != b.ctime.tv_nsec;
  }
  // Everything below directory `dir` of a view, as removed (the view under
  // a layer) or added.
  static Result<std::map<std::string, Attr>> view_dir(Union& u, uint64_t dir) {
    std::map<std::string, Attr> es;
    PLY_CHECK(u.readdirplus(dir, 2, [&](const DirEntry& e, const Attr* a) {
      if (a) es.emplace(std::string(e.name), *a);
      return true;
    }));
    return es;
  }
  Result<void> all_view(Union& u, uint64_t dir, const std::string& path, Change c = Change::Removed) {
    for (const auto& [name, a] : PLY_TRY(view_dir(u, dir))) {
      add(c, join(path, name), a);
      if (S_ISDIR(a.mode)) PLY_CHECK(all_view(u, a.ino, join(path, name), c));
    }
    return ok();
  }
  // `from` and `to` are layers on one parent (a layer and its snapshot, two
  // snapshots of it): each tree holds only what its layer changed over the
  // same view below, so the trees alone do not say what the views show (a
  // copy-up is no addition, a whiteout removes what is below it). The two
  // views are compared, walking only where either layer holds a directory
  // (fl, tl: its number in each layer's own tree, 0 for none): elsewhere
  // both show the parent's. A rename shows as - and +.
  // `share`: this directory's part of the walk (DiffStats::fraction).
  Result<void> views(Filesystem& ffs, Union& fv, Union& tv, uint64_t fdir, uint64_t tdir, uint64_t fl,
                     uint64_t tl, const std::string& path, double share) {
    if (!fl && !tl) return ok();
    const auto fa = PLY_TRY(view_dir(fv, fdir)), ta = PLY_TRY(view_dir(tv, tdir));
    auto layer_dir = [](Filesystem& fs, uint64_t dir, const std::string& name) -> Result<uint64_t> {
      if (!dir) return uint64_t{0};
      auto e = PLY_TRY(fs.entry(dir, name));
      return e && e->type == DT_DIR ? e->ino : 0;
    };
    std::set<std::string> name_set;
    for (const auto& [n, a] : fa) name_set.insert(n);
    for (const auto& [n, a] : ta) name_set.insert(n);
    const std::vector<std::string> names(name_set.begin(), name_set.end());
    return over_entries(fraction, names.size(), share, [&](size_t k, double each) -> Result<void> {
      step(fraction);
      const std::string& n = names[k];
      const std::string p = join(path, n);
      auto f = fa.find(n), t = ta.find(n);
      const bool in_f = f != fa.end(), in_t = t != ta.end();
      // Another object under the name is a removal and an addition, as in
      // the clone diff.
      const bool same = in_f && in_t && f->second.ino == t->second.ino &&
                        (f->second.mode & S_IFMT) == (t->second.mode & S_IFMT);
      if (in_f && !same) {
        if (S_ISDIR(f->second.mode)) PLY_CHECK(all_view(fv, f->second.ino, p));
        add(Change::Removed, p, f->second);
      }
      if (in_t && !same) {
        add(Change::Added, p, t->second);
        if (S_ISDIR(t->second.mode)) PLY_CHECK(all_view(tv, t->second.ino, p, Change::Added));
      }
      if (!same) return ok();
      bool changed = attrs_differ(f->second, t->second);
      if (!changed && !S_ISDIR(t->second.mode)) {  // written within one tick of the clock
        const int bf = fv.branch_of(f->second.ino), bt = tv.branch_of(t->second.ino);
        if (bf < 0 || bt < 0) return Error::corrupt(0, "an object of a view is in no branch of it");
        changed = !PLY_TRY(tv.stack()[size_t(bt)].fs->same_content(*fv.stack()[size_t(bf)].fs, t->second.ino));
      }
      if (changed) add(Change::Modified, p, t->second);
      if (S_ISDIR(t->second.mode))
        PLY_CHECK(views(ffs, fv, tv, f->second.ino, t->second.ino, PLY_TRY(layer_dir(ffs, fl, n)),
                        PLY_TRY(layer_dir(to, tl, n)), p, each));
      return ok();
    });
  }
  // `to` is a layer on `from`: what the layer holds is the change against
  // the view `below` (from over its ancestors, what the layer was made on).
  // `vdir`: the same directory in that view, 0 if it has none.
  // `share`: this directory's part of the walk (DiffStats::fraction).
  Result<void> layer(Union& below_view, uint64_t ldir, uint64_t vdir, const std::string& path, double share) {
    std::vector<std::string> names;
    names.reserve(1024);
    auto es = PLY_TRY(list(to, ldir, names));
    return over_entries(fraction, es.size(), share, [&](size_t k, double each) -> Result<void> {
      step(fraction);
      const DirEntry& e = es[k];
      const std::string p = join(path, e.name);
      std::optional<Attr> below;
      if (vdir)
        if (auto a = below_view.lookup(vdir, e.name)) below = *a;
      auto gone = [&]() -> Result<void> {
        if (S_ISDIR(below->mode)) PLY_CHECK(all_view(below_view, below->ino, p));
        add(Change::Removed, p, *below);
        return ok();
      };
      if (e.type == DT_WHT) {
        if (below) PLY_CHECK(gone());
        return ok();
      }
      Attr a = PLY_TRY(to.getattr(e.ino));
      if (e.type == DT_DIR) {
        const bool merges = below && S_ISDIR(below->mode) && !a.opaque;
        if (below && !merges) PLY_CHECK(gone());
        if (merges) {
          if (attrs_differ(a, *below)) add(Change::Modified, p, a);
        } else {
          add(Change::Added, p, a);
        }
        return layer(below_view, e.ino, merges ? below->ino : 0, p, each);
      }
      if (below && below->ino == e.ino) {  // a copy-up: the same object, changed
        add(Change::Modified, p, a);
        return ok();
      }
      if (below) PLY_CHECK(gone());
      add(Change::Added, p, a);
      return ok();
    });
  }
  // Two views (views() above): an object removed and added under the same
  // path with the same inode number did not change its name: its directory
  // was replaced around it (removed and made again, the object moved into
  // the new one), and the walk listed it on both sides. It is no - and +,
  // only M if it changed besides the ctime its move set (zfs diff compares
  // the two paths too).
  Result<void> same_path_pairs(Union& fv, Union& tv) {
    std::map<std::pair<std::string, uint64_t>, std::pair<size_t, size_t>> at;  // -> (removed + 1, added + 1)
    for (size_t i = 0; i < out.size(); i++) {
      if (out[i].change == Change::Removed) at[{out[i].path, obj[i].first}].first = i + 1;
      if (out[i].change == Change::Added) at[{out[i].path, obj[i].first}].second = i + 1;
    }
    std::vector<bool> drop(out.size());
    std::vector<std::pair<DiffEntry, std::pair<uint64_t, Attr>>> extra;
    for (const auto& [key, ra] : at) {
      if (!ra.first || !ra.second) continue;
      const size_t r = ra.first - 1, a = ra.second - 1;
      if (out[r].type != out[a].type) continue;
      drop[r] = drop[a] = true;
      Attr moved = obj[a].second;
      moved.ctime = obj[r].second.ctime;
      bool changed = attrs_differ(obj[r].second, moved);
      if (!changed && out[a].type != DT_DIR) {  // written within one tick of the clock
        const int bf = fv.branch_of(obj[r].first), bt = tv.branch_of(obj[a].first);
        if (bf < 0 || bt < 0) return Error::corrupt(0, "an object of a view is in no branch of it");
        changed = !PLY_TRY(tv.stack()[size_t(bt)].fs->same_content(*fv.stack()[size_t(bf)].fs, obj[a].first));
      }
      if (changed) extra.push_back({{Change::Modified, out[a].path, "", out[a].type}, obj[a]});
    }
    std::vector<DiffEntry> kept;
    std::vector<std::pair<uint64_t, Attr>> kept_obj;
    for (size_t i = 0; i < out.size(); i++)
      if (!drop[i]) kept.push_back(std::move(out[i])), kept_obj.push_back(obj[i]);
    for (auto& [e, o] : extra) kept.push_back(std::move(e)), kept_obj.push_back(o);
    out = std::move(kept);
    obj = std::move(kept_obj);
    return ok();
  }
  // A rename in a layer is a copy-up, which keeps the inode number, and a
  // whiteout: the walk above saw the old name removed and the new one
  // added. One object removed under exactly one name and added under exactly
  // one other is reported as the clone diff reports it: R old -> new, plus M
  // at the new name if it changed too: its attributes (but ctime, which the
  // rename set), xattrs or data (the copy-up shared the original's extents
  // until written). A hard-linked object
  // with several names removed or added is ambiguous and stays - and +
  // (format.md#snapshots, "Diff"). What a renamed directory carried along
  // (copied up with it under the same inode numbers and names) is no change
  // of its own, as in the clone diff: only what changed besides stays, M.
  Result<void> pair_renames(Union& below_view) {
    std::map<uint64_t, std::pair<std::vector<size_t>, std::vector<size_t>>> by_ino;  // removed, added
    for (size_t i = 0; i < out.size(); i++) {
      if (out[i].change == Change::Removed) by_ino[obj[i].first].first.push_back(i);
      if (out[i].change == Change::Added) by_ino[obj[i].first].second.push_back(i);
    }
    std::vector<bool> drop(out.size());
    std::map<std::string, std::string> moved_dirs;  // old path -> new path
    std::vector<std::pair<size_t, size_t>> pairs;   // (removed, added)
    for (const auto& [ino, ra] : by_ino)
      if (ra.first.size() == 1 && ra.second.size() == 1) {
        pairs.emplace_back(ra.first[0], ra.second[0]);
        if (out[ra.first[0]].type == DT_DIR) moved_dirs[out[ra.first[0]].path] = out[ra.second[0]].path;
      }
    // Whether old -> new is only the move of a renamed directory above them.
    auto carried = [&](const std::string& from, const std::string& to_path) {
      for (size_t cut = from.rfind('/'); cut != std::string::npos && cut > 0; cut = from.rfind('/', cut - 1)) {
        auto it = moved_dirs.find(from.substr(0, cut));
        if (it != moved_dirs.end() && to_path == it->second + from.substr(cut)) return true;
      }
      return false;
    };
    std::vector<DiffEntry> extra;
    for (auto [r, a] : pairs) {
      // A rename sets ctime: not a change of the object (as in compare).
      Attr renamed = obj[a].second;
      renamed.ctime = obj[r].second.ctime;
      bool changed = attrs_differ(obj[r].second, renamed);
      if (!changed) {  // data written within one tick of the clock leaves the times
        const int b = below_view.branch_of(obj[r].first);
        if (b < 0) return Error::corrupt(0, "a removed object is in no branch of the view");
        changed = !PLY_TRY(to.same_content(*below_view.stack()[size_t(b)].fs, obj[a].first));
      }
      drop[a] = true;
      // Moved into a new directory of the same name (zfs diff's way): the
      // path is unchanged, so it is no rename.
      if (out[r].path == out[a].path || carried(out[r].path, out[a].path)) {
        drop[r] = true;
      } else {
        out[r].change = Change::Renamed;
        out[r].new_path = out[a].path;
      }
      if (changed) extra.push_back({Change::Modified, out[a].path, "", out[a].type});
    }
    std::vector<DiffEntry> kept;
    for (size_t i = 0; i < out.size(); i++)
      if (!drop[i]) kept.push_back(std::move(out[i]));
    kept.insert(kept.end(), extra.begin(), extra.end());
    out = std::move(kept);
    obj.clear();
    return ok();
  }
};

}  // namespace

Result<std::vector<DiffEntry>> diff(Volume& v, TreeId from, TreeId to,
                                    const std::function<void(const DiffStats&)>& progress) {
  BranchMeta a, b;
  bool to_is_layer_on_from, layers_on_one_parent;
  {
    auto t = PLY_TRY(v.begin());
    a = PLY_TRY(live_branch(t, from));
    b = PLY_TRY(live_branch(t, to));
    to_is_layer_on_from = b.parent == a.tree && layer(b);
    layers_on_one_parent = from != to && layer(a) && layer(b) && a.parent == b.parent;
  }
  auto ffs = PLY_TRY(Filesystem::open(v, from, true));
  auto tfs = PLY_TRY(Filesystem::open(v, to, true));
  Differ d{*tfs, {}, &progress, 0, 0, 0, {}};
  if (to_is_layer_on_from) {
    // The layer was made on the view of `from` over its ancestors.
    auto below = PLY_TRY(open_union(v, PLY_TRY(layer_stack(v, a.name)), true, true));
    PLY_CHECK(d.layer(*below.u, tfs->root(), below.u->root(), "/", 1.0));
    PLY_CHECK(d.pair_renames(*below.u));
  } else if (layers_on_one_parent) {
    auto fv = PLY_TRY(open_union(v, PLY_TRY(layer_stack(v, a.name)), true, true));
    auto tv = PLY_TRY(open_union(v, PLY_TRY(layer_stack(v, b.name)), true, true));
    if (Differ::attrs_differ(PLY_TRY(fv.u->getattr(fv.u->root())), PLY_TRY(tv.u->getattr(tv.u->root()))))
      d.add(Change::Modified, "/", PLY_TRY(tv.u->getattr(tv.u->root())));
    PLY_CHECK(d.views(*ffs, *fv.u, *tv.u, fv.u->root(), tv.u->root(), ffs->root(), tfs->root(), "/", 1.0));
    PLY_CHECK(d.same_path_pairs(*fv.u, *tv.u));
  } else if (from != to) {
    // The walk is the first half of the work, naming what it found the
    // second (DiffStats::fraction).
    auto ch = PLY_TRY(Filesystem::compare(v, from, to, [&](double f) { d.step(f / 2); }));
    const size_t found = ch.removed.size() + ch.added.size() + ch.modified.size();
    size_t named = 0;
    auto name_one = [&] { d.step(0.5 + 0.5 * double(++named) / double(found)); };
    // Two trees of one lineage whose root directories have different
    // numbers (a merge gives a branch its lower branch's root, a rollback
    // of a layer a fresh one): an entry of one root and the same entry of
    // the other are the same name at "/", not a change.
    if (ffs->root() != tfs->root()) {
      auto at_root = [&](const Filesystem::NameChange& r, uint64_t root) { return r.dir == root; };
      std::vector<Filesystem::NameChange> kept;
      for (const auto& r : ch.removed) {
        auto twin = std::find_if(ch.added.begin(), ch.added.end(), [&](const Filesystem::NameChange& x) {
          return at_root(r, ffs->root()) && at_root(x, tfs->root()) && x.name == r.name && x.ino == r.ino &&
                 x.type == r.type;
        });
        if (twin != ch.added.end()) ch.added.erase(twin);
        else kept.push_back(r);
      }
      ch.removed = std::move(kept);
    }
    // Paths of objects whose hint fails: one walk of the tree, on demand.
    std::map<uint64_t, std::string> walked;
    bool did_walk = false;
    auto path_in = [&](Filesystem& fs, uint64_t ino) -> Result<std::string> {
      if (ino == fs.root()) return std::string("/");
      if (auto p = PLY_TRY(fs.path(ino))) return *p;
      if (&fs == tfs.get() && !did_walk) {
        did_walk = true;
        std::function<Result<void>(uint64_t, const std::string&)> walk =
            [&](uint64_t dir, const std::string& p) -> Result<void> {
          std::vector<std::string> names;
          for (const auto& e : PLY_TRY(Differ::list(fs, dir, names))) {
            if (e.type == DT_WHT) continue;
            walked.emplace(e.ino, join(p, e.name));
            if (e.type == DT_DIR) PLY_CHECK(walk(e.ino, join(p, e.name)));
          }
          return ok();
        };
        PLY_CHECK(walk(fs.root(), "/"));
      }
      if (auto it = walked.find(ino); &fs == tfs.get() && it != walked.end()) return it->second;
      return std::string("(inode " + std::to_string(ino) + ")");
    };
    std::map<uint64_t, std::pair<int, int>> names;  // ino: (removed, added) names
    for (const auto& r : ch.removed) names[r.ino].first++;
    for (const auto& r : ch.added) names[r.ino].second++;
    std::set<uint64_t> renamed, whole;
    for (const auto& r : ch.removed) {
      name_one();
      if (r.type == DT_WHT) continue;
      auto [rm, ad] = names[r.ino];
      const std::string p = join(PLY_TRY(path_in(*ffs, r.dir)), r.name);
      if (rm == 1 && ad == 1) {
        auto to_name = std::find_if(ch.added.begin(), ch.added.end(), [&](auto& x) { return x.ino == r.ino; });
        std::string np = join(PLY_TRY(path_in(*tfs, to_name->dir)), to_name->name);
        // Moved into a new directory under the same name: its path did not
        // change, so it is no rename (zfs diff compares the two paths too).
        if (np != p) d.out.push_back({Change::Renamed, p, std::move(np), r.type});
        d.tick();
        renamed.insert(r.ino);
        continue;
      }
      d.out.push_back({Change::Removed, p, "", r.type});
      d.tick();
    }
    for (const auto& r : ch.added) {
      name_one();
      if (r.type == DT_WHT || renamed.count(r.ino)) continue;
      d.out.push_back({Change::Added, join(PLY_TRY(path_in(*tfs, r.dir)), r.name), "", r.type});
      d.tick();
      whole.insert(r.ino);
    }
    for (uint64_t ino : ch.modified) {
      name_one();
      if (whole.count(ino)) continue;
      auto at = tfs->getattr(ino);
      if (!at || at->nlink == 0) continue;
      d.out.push_back({Change::Modified, PLY_TRY(path_in(*tfs, ino)), "", uint8_t(IFTODT(at->mode))});
      d.tick();
    }
  }
  std::stable_sort(d.out.begin(), d.out.end(), [](const DiffEntry& x, const DiffEntry& y) { return x.path < y.path; });
  if (progress) {
    d.fraction = 1;
    d.report();
  }
  return std::move(d.out);
}


}  // namespace plyfs
