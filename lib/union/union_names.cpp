// Name changes in the union (union.h; format.md#fs-union): create, link,
// unlink, rmdir and rename, each ordered so that every step but the last
// leaves the view as it was.
#include "union/union.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>

#include <algorithm>

#include "union/union_internal.h"

namespace plyfs {

using namespace union_internal;

// --- names -------------------------------------------------------------------------------------

// Whether a branch left of `b` holds anything at the name: then a change
// made in b would stay hidden.
static Result<bool> left_has(const std::vector<UnionBranch>& br,
                             const std::vector<std::pair<int, uint64_t>>& inst, int b,
                             std::string_view name) {
  for (auto [bb, dino] : inst) {
    if (bb >= b) break;
    auto e = br[bb].fs->entry(dino, name);
    if (!e) {
      if (missing(e.error())) continue;
      return e.error();
    }
    if (*e) return true;
  }
  return false;
}

Result<Attr> Union::create(uint64_t dir, std::string_view name,
                           const std::function<Result<Attr>(Filesystem&, uint64_t)>& make,
                           bool is_dir) {
  if (name.size() > 255) return Error::io(ENAMETOOLONG, "name longer than 255 bytes");
  std::unique_lock lk(mu_);
  Node d = PLY_TRY(node(dir));
  if (!d.is_dir) return Error::io(ENOTDIR, "not a directory");
  if (PLY_TRY(resolve(d, name))) return Error::io(EEXIST, "name exists");
  const int t = leftmost_writable();
  if (t < 0) return Error::io(EROFS, "no writable branch");
  if (PLY_TRY(left_has(br_, d.inst, t, name)))
    return Error::io(EROFS, "a read-only branch left of every writable one hides the name");
  const uint64_t pd = PLY_TRY(dir_in(dir, t));
  d = PLY_TRY(node(dir));
  // A directory made where a branch to the right holds the name must hide
  // it: a whiteout first (the name is invisible, so the view is unchanged),
  // then the directory over it, which makes it opaque in the same step.
  if (is_dir && PLY_TRY(below_has(d, t, name))) PLY_CHECK(br_[t].fs->whiteout(pd, name));
  Attr a = PLY_TRY(make(*br_[t].fs, pd));
  remember(a.ino, dir, name, Found{a, {{t, a.ino}}, t}, true);
  return entry_of(a);
}

Result<Attr> Union::mknod(uint64_t dir, std::string_view name, uint32_t mode, uint64_t rdev,
                          const Caller& c) {
  return create(dir, name, [&](Filesystem& fs, uint64_t pd) {
    return fs.mknod(pd, name, mode, rdev, c.uid, c.gid, c.umask);
  }, false);
}

Result<Attr> Union::mkdir(uint64_t dir, std::string_view name, uint32_t mode, const Caller& c) {
  return create(dir, name, [&](Filesystem& fs, uint64_t pd) {
    return fs.mkdir(pd, name, mode, c.uid, c.gid, c.umask);
  }, true);
}

Result<Attr> Union::symlink(uint64_t dir, std::string_view name, std::string_view target,
                            const Caller& c) {
  return create(dir, name, [&](Filesystem& fs, uint64_t pd) {
    return fs.symlink(pd, name, target, c.uid, c.gid);
  }, false);
}

Result<Attr> Union::link(uint64_t ino, uint64_t dir, std::string_view name, const Caller& c) {
  if (name.size() > 255) return Error::io(ENAMETOOLONG, "name longer than 255 bytes");
  std::unique_lock lk(mu_);
  Node d = PLY_TRY(node(dir));
  if (!d.is_dir) return Error::io(ENOTDIR, "not a directory");
  if (PLY_TRY(resolve(d, name))) return Error::io(EEXIST, "name exists");
  Node n = PLY_TRY(node(ino));
  if (n.is_dir) return Error::io(EPERM, "hard link to a directory");
  const int t = PLY_TRY(copy_up(ino, c));
  if (PLY_TRY(left_has(br_, d.inst, t, name)) || !PLY_TRY(reachable(dir, t))) {
    // The new name cannot be in the file's branch: a whiteout left of it
    // hides the name there (the name is free in the union, so the leftmost
    // entry is a whiteout), or the directory's merge does not reach it (an
    // opaque directory). The file moves to a writable branch the directory
    // reaches, at or left of that whiteout: copied in at the new name (over
    // the whiteout), its other names following, as a copy-up would do it.
    int lim = t;
    for (auto [bb, i] : d.inst)
      if (bb < lim && PLY_TRY(br_[bb].fs->entry(i, name))) {
        lim = bb;
        break;
      }
    const int lt = usable_writable(lim, {dir});
    if (lt < 0 || PLY_TRY(left_has(br_, d.inst, lt, name)))
      return Error::io(EROFS, "a read-only branch hides the new name");
    const uint64_t pd = PLY_TRY(dir_in(dir, lt));
    Attr a = PLY_TRY(br_[lt].fs->copy_in(*br_[t].fs, ino, pd, name));
    {
      std::lock_guard lk2(nodes_mu_);
      nodes_[ino].inst = keyed({{lt, ino}});
    }
    PLY_CHECK(copy_links(ino, t, lt));
    a = PLY_TRY(br_[lt].fs->getattr(ino));
    remember(ino, dir, name, Found{a, {{lt, ino}}, lt}, true);
    return entry_of(a);
  }
  const uint64_t pd = PLY_TRY(dir_in(dir, t));
  Attr a = PLY_TRY(br_[t].fs->link(ino, pd, name));
  remember(ino, dir, name, Found{a, {{t, ino}}, t}, true);
  return entry_of(a);
}

Result<void> Union::unlink(uint64_t dir, std::string_view name) {
  if (name.size() > 255) return Error::io(ENAMETOOLONG, "name longer than 255 bytes");
  std::unique_lock lk(mu_);
  Node d = PLY_TRY(node(dir));
  auto f = PLY_TRY(resolve(d, name));
  if (!f) return Error::io(ENOENT, "no such entry");
  if (S_ISDIR(f->attr.mode)) return Error::io(EISDIR, "is a directory");
  return remove(dir, d, name, *f, false);
}

// Deletes `name`, visible from branch b: there if b is writable (leaving a
// whiteout when a branch to the right holds the name too), else by a
// whiteout in the nearest usable writable branch to its left.
Result<void> Union::remove(uint64_t dir, const Node& d, std::string_view name, const Found& f,
                           bool is_dir) {
  const int b = f.top_branch;
  if (del_ == DeleteMode::All) PLY_CHECK(remove_hidden(d, name, f));
  if (!is_dir && f.attr.nlink > 1 && !br_[f.inst[0].first].writable) {
    // A name of a hard-linked file of a read-only branch: the file's count
    // must drop with the name, so the file is copied up first with the
    // names the union shows (copy_links), and the name goes in the copy's
    // branch. Each step but the last leaves the view as it was.
    const int c = f.inst[0].first;
    const int t = usable_writable(b, {dir});
    if (t < 0) return Error::io(EROFS, "the name is in a read-only branch");
    const uint64_t pd = PLY_TRY(dir_in(dir, t));
    (void)PLY_TRY(br_[t].fs->copy_in(*br_[c].fs, f.attr.ino, pd, name));
    {
      std::lock_guard lk(nodes_mu_);
      nodes_[f.attr.ino].inst = keyed({{t, f.attr.ino}});
    }
    PLY_CHECK(copy_links(f.attr.ino, c, t));
    return br_[t].fs->unlink(pd, name, PLY_TRY(below_has(PLY_TRY(node(dir)), t, name)));
  }
  if (br_[b].writable) {
    uint64_t dino = 0;
    for (auto [bb, i] : d.inst)
      if (bb == b) dino = i;
    const bool wh = PLY_TRY(below_has(d, b, name));
    return is_dir ? br_[b].fs->rmdir(dino, name, wh) : br_[b].fs->unlink(dino, name, wh);
  }
  const int t = usable_writable(b, {dir});
  if (t < 0) return Error::io(EROFS, "the name is in a read-only branch");
  const uint64_t pd = PLY_TRY(dir_in(dir, t));
  return br_[t].fs->whiteout(pd, name);
}

Result<void> Union::remove_hidden(const Node& d, std::string_view name, const Found& vis) {
  const int b = vis.top_branch;
  if (S_ISDIR(vis.attr.mode)) {
    // A directory: only the parts of its merge, right to left, and only
    // while each goes: the rightmost part's whiteouts hide nothing, but one
    // that stays may hold names that the whiteouts of the parts left of it
    // hide. Entries beyond the merge (a file that ends it, directories past
    // an opaque one) stay: removing them would let more merge in.
    for (auto it = vis.inst.rbegin(); it != vis.inst.rend(); ++it) {
      auto [bb, ino] = *it;
      if (bb <= b) break;
      if (!br_[bb].writable) break;
      uint64_t dino = 0;
      for (auto [pb, pi] : d.inst)
        if (pb == bb) dino = pi;
      if (!dino) break;
      auto r = br_[bb].fs->rmdir(dino, name, false);
      if (!r) {
        if (r.error().code == ENOTEMPTY) break;
        return r.error();
      }
    }
    return ok();
  }
  // Anything else hides every entry of the name right of it, whatever
  // their kinds: each can go (a directory that holds names hidden by
  // whiteouts cannot, and stays behind the final whiteout).
  for (auto it = d.inst.rbegin(); it != d.inst.rend(); ++it) {
    auto [bb, dino] = *it;
    if (bb <= b || !br_[bb].writable) continue;
    auto e = br_[bb].fs->entry(dino, name);
    if (!e) {
      if (missing(e.error())) continue;
      return e.error();
    }
    if (!*e || (*e)->type == kWh) continue;
    const bool dir = (*e)->type == DT_DIR;
    auto r = dir ? br_[bb].fs->rmdir(dino, name, false) : br_[bb].fs->unlink(dino, name, false);
    if (!r) {
      if (dir && r.error().code == ENOTEMPTY) continue;
      return r.error();
    }
  }
  return ok();
}

Result<void> Union::rmdir(uint64_t dir, std::string_view name) {
  if (name == ".") return Error::invalid("rmdir of .");
  if (name == "..") return Error::io(ENOTEMPTY, "rmdir of ..");
  if (name.size() > 255) return Error::io(ENAMETOOLONG, "name longer than 255 bytes");
  std::unique_lock lk(mu_);
  Node d = PLY_TRY(node(dir));
  auto f = PLY_TRY(resolve(d, name));
  if (!f) return Error::io(ENOENT, "no such entry");
  if (!S_ISDIR(f->attr.mode)) return Error::io(ENOTDIR, "not a directory");
  remember(f->attr.ino, dir, name, *f);
  if (!PLY_TRY(union_empty(f->attr.ino))) return Error::io(ENOTEMPTY, "directory not empty");
  return remove(dir, d, name, *f, true);
}

Result<void> Union::rename(uint64_t odir, std::string_view oname, uint64_t ndir,
                           std::string_view nname, unsigned flags, const Caller& c) {
  if (flags & ~unsigned(RENAME_NOREPLACE | RENAME_EXCHANGE)) return Error::invalid("rename flags");
  if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE))
    return Error::invalid("RENAME_NOREPLACE with RENAME_EXCHANGE");
  if (oname.size() > 255 || nname.size() > 255) return Error::io(ENAMETOOLONG, "name longer than 255 bytes");
  std::unique_lock lk(mu_);
  Node od = PLY_TRY(node(odir));
  Node nd = PLY_TRY(node(ndir));
  // Before anything is copied: a failed rename leaves even the branches as they were.
  if (!od.is_dir || !nd.is_dir) return Error::io(ENOTDIR, "not a directory");
  auto src = PLY_TRY(resolve(od, oname));
  if (!src) return Error::io(ENOENT, "no such entry");
  auto dst = PLY_TRY(resolve(nd, nname));
  const bool exchange = flags & RENAME_EXCHANGE;
  if (exchange && !dst) return Error::io(ENOENT, "no entry to exchange with");
  if (dst && (flags & RENAME_NOREPLACE)) return Error::io(EEXIST, "target exists");
  const uint64_t sino = src->attr.ino;
  const bool sdir = S_ISDIR(src->attr.mode);
  if (dst && dst->attr.ino == sino) return ok();
  remember(sino, odir, oname, *src);
  if (dst) remember(dst->attr.ino, ndir, nname, *dst);
  const bool ddir = dst && S_ISDIR(dst->attr.mode);
  // A directory may not move below itself.
  auto below = [&](uint64_t moving, uint64_t into) -> Result<bool> {
    for (int i = 0; i < kMaxDepth; i++) {
      if (into == moving) return true;
      if (into == root_) return false;
      into = PLY_TRY(node(into)).parent;
    }
    return Error::invalid("directory chain too deep");
  };
  if (sdir && PLY_TRY(below(sino, ndir))) return Error::invalid("moving a directory below itself");
  if (exchange && ddir && PLY_TRY(below(dst->attr.ino, odir)))
    return Error::invalid("moving a directory below itself");
  if (!exchange && dst) {
    if (sdir && !ddir) return Error::io(ENOTDIR, "target is not a directory");
    if (!sdir && ddir) return Error::io(EISDIR, "target is a directory");
    if (ddir && !PLY_TRY(union_empty(dst->attr.ino))) return Error::io(ENOTEMPTY, "target directory not empty");
  }
  // The branch the rename happens in: the source's own if writable, else
  // the nearest writable one to its left; further left if a branch there
  // holds something at either name that would hide the result.
  int lim = src->top_branch;
  if (dst) lim = std::min(lim, dst->top_branch);
  for (auto [bb, i] : nd.inst) {
    if (bb >= lim) break;
    auto e = br_[bb].fs->entry(i, nname);
    if (e && *e) { lim = bb; break; }
  }
  const int t = usable_writable(lim, {odir, ndir});
  if (t < 0) return Error::io(EROFS, "no writable branch for the rename");
  // 1. Each object that moves, into branch t at its old name: view-equivalent steps.
  auto bring = [&](uint64_t dir, std::string_view name, const Found& f) -> Result<void> {
    if (S_ISDIR(f.attr.mode)) {
      if (f.inst.size() == 1 && f.inst[0].first == t) return ok();
      return materialize(f.attr.ino, t, c);
    }
    const uint64_t pd = PLY_TRY(dir_in(dir, t));
    auto e = PLY_TRY(br_[t].fs->entry(pd, name));
    if (e && e->type != kWh && e->ino == f.attr.ino) return ok();
    // Another name of a hard-linked object brought it into t before (renamed
    // there): this name links to that copy, as copy_in does from another tree.
    if (f.inst[0].first == t) {
      (void)PLY_TRY(br_[t].fs->link(f.attr.ino, pd, name));
      return ok();
    }
    (void)PLY_TRY(br_[t].fs->copy_in(*br_[f.inst[0].first].fs, f.attr.ino, pd, name));
    {
      // The kernel's handle on the object now means the copy, as after any copy-up.
      std::lock_guard lk(nodes_mu_);
      if (auto it = nodes_.find(f.attr.ino); it != nodes_.end()) it->second.inst = keyed({{t, f.attr.ino}});
    }
    if (f.attr.nlink > 1) PLY_CHECK(copy_links(f.attr.ino, f.inst[0].first, t));
    return ok();
  };
  PLY_CHECK(bring(odir, oname, *src));
  // The target goes too when it is a hard-linked file (its other names
  // stay): brought into t first, so the rename there drops the count its
  // remaining names show, instead of leaving a hidden name counted below.
  if (exchange || (dst && !ddir && dst->attr.nlink > 1)) PLY_CHECK(bring(ndir, nname, *dst));
  const uint64_t opd = PLY_TRY(dir_in(odir, t));
  const uint64_t npd = PLY_TRY(dir_in(ndir, t));
  od = PLY_TRY(node(odir));
  nd = PLY_TRY(node(ndir));
  // 2. A directory that lands where a branch to the right holds the name
  // must hide it; it is alone at its old place, so opaque changes nothing yet.
  auto hide_below = [&](bool is_dir, uint64_t ino, const Node& to, std::string_view name) -> Result<void> {
    if (!is_dir || !PLY_TRY(below_has(to, t, name))) return ok();
    Attr a = PLY_TRY(br_[t].fs->getattr(ino));
    if (a.opaque) return ok();
    SetAttr s;
    s.opaque = true;
    s.ctime = a.ctime;
    (void)PLY_TRY(br_[t].fs->setattr(ino, s));
    return ok();
  };
  PLY_CHECK(hide_below(sdir, sino, nd, nname));
  if (exchange) PLY_CHECK(hide_below(ddir, dst->attr.ino, od, oname));
  // DeleteMode::All: the old name's instances further right go now (the
  // copy in t still shows the same object there).
  if (del_ == DeleteMode::All && !exchange) {
    auto now = PLY_TRY(resolve(od, oname));  // the source as brought into t
    if (now) PLY_CHECK(remove_hidden(od, oname, *now));
  }
  // 3. The one visible step.
  unsigned f = flags & (RENAME_NOREPLACE | RENAME_EXCHANGE);
  if (!exchange && PLY_TRY(below_has(od, t, oname))) f |= RENAME_WHITEOUT;
  PLY_CHECK(br_[t].fs->rename(opd, oname, npd, nname, f));
  std::lock_guard nl(nodes_mu_);
  auto move = [&](uint64_t ino, uint64_t parent, std::string_view name) {
    Node& n = nodes_[ino];
    n.parent = parent;
    n.name = std::string(name);
    n.inst = keyed({{t, ino}});
  };
  move(sino, ndir, nname);
  if (exchange) move(dst->attr.ino, odir, oname);
  return ok();
}

}  // namespace plyfs
