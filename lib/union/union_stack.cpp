// The union's stack while mounted (union.h; format.md#fs-union, "Live
// branch changes"): restack, what the union knows for invalidation, and the
// kernel's references that the holding branches keep.
#include "union/union.h"

#include <algorithm>
#include <unordered_map>

#include "union/union_internal.h"

namespace plyfs {

using namespace union_internal;

// --- live branch changes ---------------------------------------------------------------------

std::vector<UnionBranch> Union::stack() {
  std::shared_lock lk(mu_);
  return br_;
}

std::vector<Union::Known> Union::known() {
  std::shared_lock lk(nodes_mu_);
  std::vector<Known> out;
  for (const auto& [ino, n] : nodes_)
    if (ino != root_) out.push_back(Known{n.parent, n.name, ino});
  return out;
}

std::optional<std::vector<std::string>> Union::path_of(uint64_t ino) {
  std::shared_lock lk(nodes_mu_);
  std::vector<std::string> names;
  for (int depth = 0; ino != root_; depth++) {
    auto it = nodes_.find(ino);
    if (it == nodes_.end() || depth >= kMaxDepth) return std::nullopt;
    names.push_back(it->second.name);
    ino = it->second.parent;
  }
  std::reverse(names.begin(), names.end());
  return names;
}

std::vector<uint64_t> Union::refresh_path(const std::vector<std::string>& path) {
  std::shared_lock lk(mu_);  // as a lookup: the resolution holds still
  mu_.note_change();  // names changed: no parked listing goes on (union_readdir.cpp, L1)
  std::vector<uint64_t> out{root_};
  for (const auto& name : path) {
    auto d = node(out.back());
    if (!d || !d->is_dir) break;
    auto f = resolve(*d, name);
    if (!f || !*f) break;
    const uint64_t ino = (*f)->attr.ino;
    {
      // What a lookup would remember, without the reference.
      std::lock_guard nl(nodes_mu_);
      auto it = nodes_.find(ino);
      if (it == nodes_.end()) break;
      it->second.parent = out.back();
      it->second.name = name;
      it->second.inst = keyed((*f)->inst);
    }
    out.push_back(ino);
  }
  return out;
}

bool Union::knows(uint64_t ino) {
  std::shared_lock lk(nodes_mu_);
  return nodes_.count(ino) != 0;
}

// Whether the kernel may hold attributes of `ino` from its instance in
// `from` that the one in `to` does not have. With the writeback cache it
// keeps its own size, mtime and ctime of a regular file while it keeps the
// inode; the rest it takes from every reply, and the pages a restack drops.
static bool kernel_keeps_other(Filesystem& from, Filesystem& to, uint64_t ino) {
  auto a = from.getattr(ino);
  auto b = to.getattr(ino);
  if (!a || !b) return true;
  auto same = [](const timespec& x, const timespec& y) { return x.tv_sec == y.tv_sec && x.tv_nsec == y.tv_nsec; };
  return S_ISREG(b->mode) && (a->size != b->size || !same(a->mtime, b->mtime) || !same(a->ctime, b->ctime));
}

Result<void> Union::restack(std::vector<UnionBranch> nb) {
  return restack([&]() -> Result<std::vector<UnionBranch>> { return std::move(nb); });
}

Result<void> Union::hold_still(const std::function<Result<void>()>& fn) {
  std::unique_lock io(io_mu_);
  std::unique_lock lk(mu_);
  return fn();
}

Result<void> Union::restack(const std::function<Result<std::vector<UnionBranch>>()>& prepare) {
  // No operation runs meanwhile (unpin included), and no data change that
  // resolved its branch before is still landing.
  std::unique_lock io(io_mu_);
  std::unique_lock lk(mu_);
  auto nbr = prepare();
  if (!nbr) return nbr.error();
  std::vector<UnionBranch> nb = std::move(*nbr);
  if (nb.empty()) return Error::invalid("a union needs at least one branch");
  // A snapshot's restack: one branch with an empty root (no entry, no
  // whiteout, not opaque) inserted, the others in their order. Nothing can
  // be found in it, so every resolution stays, its branch indices shifted,
  // and only the root gains a part: O(known objects), no lookups.
  int inserted = -1;
  if (nb.size() == br_.size() + 1) {
    size_t j = 0;
    for (size_t i = 0; i < nb.size() && inserted != -2; i++) {
      if (j < br_.size() && nb[i].fs == br_[j].fs) j++;
      else inserted = inserted == -1 ? int(i) : -2;
    }
    if (inserted >= 0) {
      Filesystem& f = *nb[size_t(inserted)].fs;
      bool empty = true;
      auto ra = f.getattr(f.root());
      auto rr = f.readdir(f.root(), 2, [&](const DirEntry&) { return empty = false; });
      if (!ra || ra->opaque || !rr || !empty) inserted = -1;
    } else {
      inserted = -1;
    }
  }
  // The kernel's references, so that a file unlinked while open lives on:
  // the new writable branches take them (the union's one table, O(1)); a
  // branch that held them keeps them while it stays in the stack (it still
  // serves the files unlinked while open there, read-only or frozen by a
  // snapshot); only a branch that leaves gives them up.
  auto in = [](const auto& v, Filesystem* f) { return std::find(v.begin(), v.end(), f) != v.end(); };
  std::vector<Filesystem*> holders;
  for (const auto& b : nb)
    if ((b.writable || in(holders_, b.fs)) && !in(holders, b.fs)) holders.push_back(b.fs);
  for (Filesystem* f : holders)
    if (!in(holders_, f)) f->attach_pins(refs_);
  for (Filesystem* f : holders_)
    if (!in(holders, f)) (void)f->detach_pins(refs_.get());  // an error fails that branch alone
  holders_ = std::move(holders);
  for (const auto& b : nb) b.fs->set_kernel_times(kernel_times_);

  std::lock_guard nl(nodes_mu_);
  if (inserted >= 0) {
    br_ = std::move(nb);
    compute_origins();
    if (inserted == 0) {
      shift_++;  // every node's branches move one to the right, in O(1)
    } else {
      for (auto& [ino, n] : nodes_)
        for (auto& part : n.inst)
          if (part.first + shift_ >= inserted) part.first++;
    }
    std::vector<std::pair<int, uint64_t>> root;
    for (size_t b = 0; b < br_.size(); b++) {
      root.emplace_back(int(b), br_[b].fs->root());
      auto a = br_[b].fs->getattr(br_[b].fs->root());
      if (a && a->opaque) break;
    }
    nodes_[root_].inst = keyed(std::move(root));
    return ok();
  }
  // Where each file was served from: an unlinked file still open (pinned,
  // no name) stays there if that branch stays.
  std::unordered_map<uint64_t, Filesystem*> was;
  for (const auto& [ino, n] : nodes_)
    if (!n.is_dir && !n.inst.empty()) was[ino] = br_[n.inst.front().first + shift_].fs;
  br_ = std::move(nb);
  compute_origins();
  // Every node is resolved again below, parents first, and written with
  // the new stack's indices as keys.
  shift_ = 0;
  // Parents before children: each directory is found again by its name
  // under its (already re-resolved) parent.
  std::vector<std::pair<int, uint64_t>> order;
  for (const auto& [ino, n] : nodes_) {
    int depth = 0;
    for (uint64_t p = ino; p != root_ && depth < kMaxDepth; depth++) {
      auto it = nodes_.find(p);
      if (it == nodes_.end()) {
        depth = kMaxDepth;  // an orphaned chain: resolved last, and found gone
        break;
      }
      p = it->second.parent;
    }
    order.emplace_back(depth, ino);
  }
  std::sort(order.begin(), order.end());
  for (auto [depth, ino] : order) {
    Node& n = nodes_[ino];
    n.inst.clear();
    if (ino == root_) {
      for (size_t b = 0; b < br_.size(); b++) {
        n.inst.emplace_back(int(b), br_[b].fs->root());
        auto a = br_[b].fs->getattr(br_[b].fs->root());
        if (a && a->opaque) break;
      }
      continue;
    }
    if (!n.is_dir) {
      // The leftmost branch holding the object (a hard link or copy of it).
      for (size_t b = 0; b < br_.size(); b++) {
        auto a = br_[b].fs->getattr(ino);
        if (a && a->nlink > 0 && !S_ISDIR(a->mode)) {
          n.inst = {{int(b), ino}};
          break;
        }
      }
      for (size_t b = 0; b < br_.size() && n.inst.empty(); b++)
        if (br_[b].fs == was[ino] && br_[b].fs->getattr(ino)) n.inst = {{int(b), ino}};
      if (!n.inst.empty() && was[ino] && br_[n.inst.front().first].fs != was[ino] &&
          kernel_keeps_other(*was[ino], *br_[n.inst.front().first].fs, ino))
        n.incarnation++;
      continue;
    }
    auto p = nodes_.find(n.parent);
    if (depth >= kMaxDepth || p == nodes_.end() || p->second.inst.empty()) continue;
    auto f = resolve(p->second, n.name);
    if (f && *f && S_ISDIR((*f)->attr.mode)) n.inst = (*f)->inst;
  }
  return ok();
}

// --- references and state ---------------------------------------------------------------------


Result<void> Union::unpin(uint64_t ino, uint64_t n) {
  std::shared_lock sl(mu_);  // the writable branches stay the same meanwhile
  {
    std::lock_guard lk(nodes_mu_);
    auto it = nodes_.find(ino);
    if (it != nodes_.end() && ino != root_) {
      if (it->second.refs > n) it->second.refs -= n;
      else nodes_.erase(it);
    }
  }
  Result<void> r = ok();
  if (refs_->unpin(ino, n))
    for (Filesystem* f : holders_)
      if (auto e = f->release(ino); !e && r) r = e;
  return r;
}

Result<void> Union::hold(uint64_t ino) {
  std::shared_lock sl(mu_);  // the instance stays where it is meanwhile
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->hold(i, *refs_);
}

Result<void> Union::unhold(uint64_t ino) {
  std::shared_lock sl(mu_);
  Result<void> r = ok();
  if (refs_->unhold(ino) && !refs_->pinned(ino))
    for (Filesystem* f : holders_)
      if (auto e = f->release(ino); !e && r) r = e;
  return r;
}

Result<void> Union::release_all() {
  std::shared_lock lk(mu_);
  // Only this union's references go: another user of the same branches
  // (a view of the control folder) keeps its own.
  if (refs_->empty()) return ok();
  refs_->clear();
  Result<void> r = ok();
  for (Filesystem* f : holders_)
    if (auto e = f->release_orphans(); !e && r) r = e;
  return r;
}

Result<void> Union::sync() {
  std::shared_lock lk(mu_);
  return br_[0].fs->sync();
}

void Union::fail(const Error& e) {
  std::shared_lock lk(mu_);
  for (auto& b : br_) b.fs->fail(e);
}

bool Union::read_only() {
  std::shared_lock lk(mu_);
  return leftmost_writable() < 0 || br_[0].fs->read_only();
}

void Union::set_kernel_times(bool on) {
  std::unique_lock lk(mu_);
  kernel_times_ = on;
  for (auto& b : br_) b.fs->set_kernel_times(on);
}

}  // namespace plyfs
