// The union layer (union.h; semantics in format.md#fs-union): the stack's
// setup, the nodes the union knows and the resolution of names. Beside it:
// listings (union_readdir.cpp), copy-up (union_copyup.cpp), name changes
// (union_names.cpp), attributes and data (union_data.cpp), and live branch
// changes and references (union_stack.cpp); what they share is in
// union_internal.h.
#include "union/union.h"

#include <algorithm>
#include <cstring>

#include "union/union_internal.h"

namespace plyfs {

using namespace union_internal;

Union::Union(std::vector<UnionBranch> branches, CopyUpMode copyup, DeleteMode del)
    : br_(std::move(branches)), copyup_(copyup), del_(del) {
  root_ = br_.at(0).fs->root();
  bs_ = br_[0].fs->block_size();
  Node r;
  r.parent = root_;
  r.is_dir = true;
  r.refs = 1;
  for (size_t b = 0; b < br_.size(); b++) {
    r.inst.emplace_back(int(b), br_[b].fs->root());
    auto a = br_[b].fs->getattr(br_[b].fs->root());
    if (a && a->opaque) break;
  }
  nodes_.emplace(root_, std::move(r));
  for (const auto& b : br_)
    if (b.writable && std::find(holders_.begin(), holders_.end(), b.fs) == holders_.end()) {
      holders_.push_back(b.fs);
      b.fs->attach_pins(refs_);
    }
  compute_origins();
}

void Union::compute_origins() {
  origin_.assign(br_.size(), 0);
  for (size_t b = 0; b < br_.size(); b++) {
    auto txn = br_[b].fs->volume().begin({});
    if (!txn) continue;  // unknown: counted as of every lineage (lineage())
    TreeId t = br_[b].fs->tree();
    for (size_t hop = 0; hop < 64; hop++) {
      auto info = txn->tree_info(t);
      // A source that is gone (a merge's scratch tree, a deleted branch)
      // still names the lineage of the clones made of it.
      if (!info || !info->cloned_from.v) break;
      t = info->cloned_from;
    }
    origin_[b] = t.v;
  }
  any_lineage_ = false;
  for (size_t a = 0; a < br_.size(); a++)
    for (size_t b = a + 1; b < br_.size(); b++) any_lineage_ = any_lineage_ || lineage(int(a), int(b));
}

bool Union::lineage(int a, int b) const {
  return !origin_[size_t(a)] || !origin_[size_t(b)] || origin_[size_t(a)] == origin_[size_t(b)];
}

// --- nodes ------------------------------------------------------------------------

Result<Union::Node> Union::node(uint64_t ino) {
  std::shared_lock lk(nodes_mu_);
  auto it = nodes_.find(ino);
  if (it == nodes_.end()) return Error::io(ESTALE, "inode " + std::to_string(ino) + " is not known to this mount");
  if (it->second.inst.empty())
    return Error::io(ESTALE, "inode " + std::to_string(ino) + " left the view with its branch");
  Node n = it->second;
  for (auto& part : n.inst) {
    part.first += shift_;
    if (part.first < 0 || size_t(part.first) >= br_.size()) return stray(ino);
  }
  return n;
}

// A node whose branch key does not name a branch of the stack: a bug (an
// index stored where a key belongs, Node::inst), answered as an I/O error
// rather than a read past br_.
Error Union::stray(uint64_t ino) const {
  return Error::io(EIO, "inode " + std::to_string(ino) + ": its branch is not in the stack");
}

Result<Union::Part> Union::part(uint64_t ino) {
  std::shared_lock lk(nodes_mu_);
  auto it = nodes_.find(ino);
  if (it == nodes_.end() || it->second.inst.empty())
    return Error::io(ESTALE, "inode " + std::to_string(ino) + " is not known to this mount");
  auto [b, i] = it->second.inst.front();
  if (b + shift_ < 0 || size_t(b + shift_) >= br_.size()) return stray(ino);
  return Part{br_[b + shift_].fs, i};
}

// The part that serves a non-merging operation: copies two integers, so
// that reads and writes take the node lock only shared and briefly.
Result<std::pair<int, uint64_t>> Union::top(uint64_t ino) {
  std::shared_lock lk(nodes_mu_);
  auto it = nodes_.find(ino);
  if (it == nodes_.end() || it->second.inst.empty())
    return Error::io(ESTALE, "inode " + std::to_string(ino) + " is not known to this mount");
  auto [b, i] = it->second.inst.front();
  if (b + shift_ < 0 || size_t(b + shift_) >= br_.size()) return stray(ino);
  return std::pair{b + shift_, i};
}

Attr Union::entry_of(Attr a) {
  std::shared_lock lk(nodes_mu_);
  if (auto it = nodes_.find(a.ino); it != nodes_.end()) a.generation += it->second.incarnation;
  return a;
}

void Union::remember(uint64_t ino, uint64_t parent, std::string_view name, const Found& f,
                     bool count) {
  {
    std::lock_guard lk(nodes_mu_);
    Node& n = nodes_[ino];
    if (count) n.refs++;
    if (ino != root_) {
      n.parent = parent;
      n.name = std::string(name);
      n.is_dir = S_ISDIR(f.attr.mode);
      n.inst = keyed(f.inst);
    }
  }
  // One table for every holder (format.md#fs-union, "Inode references").
  if (count) refs_->pin(ino);
}

int Union::branch_of(uint64_t ino) {
  auto n = node(ino);
  return n ? n->inst.at(0).first : -1;
}

int Union::writable_left_of(int b) const {
  for (int j = std::min<int>(b, int(br_.size()) - 1); j >= 0; j--)
    if (br_[j].writable) return j;
  return -1;
}

int Union::leftmost_writable() const {
  for (size_t j = 0; j < br_.size(); j++)
    if (br_[j].writable) return int(j);
  return -1;
}

// --- resolution ----------------------------------------------------------------------

Result<std::optional<Union::Found>> Union::resolve(const Node& dir, std::string_view name) {
  std::optional<Found> f;
  for (auto [b, dino] : dir.inst) {
    auto e = br_[b].fs->entry(dino, name);
    if (!e) {
      if (missing(e.error())) continue;
      return e.error();
    }
    if (!*e) continue;
    if ((*e)->type == kWh) break;  // hides this name in every branch to the right
    auto a = br_[b].fs->getattr((*e)->ino);
    if (!a) return a.error();
    if (f && !S_ISDIR(a->mode)) break;  // a non-directory ends the merge
    // An object a branch of its lineage further left holds elsewhere: the
    // name is not shown, and hides what lies right of it as a whiteout does.
    if (PLY_TRY(held_left(b, (*e)->ino, f ? f->inst : std::vector<std::pair<int, uint64_t>>{}))) break;
    if (!f) {
      f = Found{*a, {{b, (*e)->ino}}, b};
      if (!S_ISDIR(a->mode) || a->opaque) break;
    } else {
      f->inst.emplace_back(b, (*e)->ino);
      if (a->opaque) break;
    }
  }
  if (f && !S_ISDIR(f->attr.mode)) leftmost_copy(*f);
  if (f) merged_nlink(f->attr, f->inst.size());
  return f;
}

// One inode number names one object in a mount (format.md#fs-union,
// "Inode numbers"). Branches of one lineage (a clone and its source, two
// clones of one tree) hold the same objects under the same numbers, each
// under its own names: an object renamed in a clone keeps its old name in
// the source. Showing both would give two names one number and nlink 1
// each, and a write through one would change the other. So the leftmost
// branch that holds the object decides its names: an entry further right
// is shown only if no branch of its lineage to its left holds the object,
// or that branch shows it under this very name (`shown`: the parts a
// merged directory took so far). Only where lineage branches are stacked
// does this cost anything: one inode lookup per such branch to the left.
Result<bool> Union::held_left(int b, uint64_t ino, const std::vector<std::pair<int, uint64_t>>& shown) {
  if (!any_lineage_) return false;
  for (int j = 0; j < b; j++) {
    if (!lineage(j, b) || std::find(shown.begin(), shown.end(), std::pair{j, ino}) != shown.end()) continue;
    auto a = br_[size_t(j)].fs->getattr(ino);
    if (!a) {
      if (missing(a.error())) continue;
      return a.error();
    }
    if (a->nlink > 0) return true;  // not an orphan kept for an open handle
  }
  return false;
}

void Union::leftmost_copy(Found& f) {
  // A hard link copied up by another name (copy_links) lives in a branch
  // further left, of another lineage (a layer): the number names that copy.
  // Only then can a branch further left hold the number under another
  // name: a copy-up keeps the name, and an object of one lineage is never
  // found right of a branch of that lineage holding it (held_left).
  if (f.attr.nlink <= 1) return;
  const int tb = f.top_branch;
  const uint64_t ino = f.attr.ino;
  for (int j = 0; j < tb; j++) {
    if (any_lineage_ && lineage(j, tb)) continue;
    auto a = br_[size_t(j)].fs->getattr(ino);
    if (a && a->nlink > 0 && !S_ISDIR(a->mode)) {
      f.attr = *a;
      f.inst = {{j, ino}};
      break;
    }
  }
}

Result<bool> Union::below_has(const Node& dir, int b, std::string_view name) {
  for (auto [bb, dino] : dir.inst) {
    if (bb <= b) continue;
    auto e = br_[bb].fs->entry(dino, name);
    if (!e) {
      if (missing(e.error())) continue;
      return e.error();
    }
    if (*e) return true;
  }
  return false;
}

uint64_t Union::mutations() const { return br_.empty() ? 0 : br_[0].fs->volume().mutations(); }

namespace {
std::string resolved_key(uint64_t dir, std::string_view name) {
  std::string k(sizeof dir, '\0');
  std::memcpy(k.data(), &dir, sizeof dir);
  k += name;
  return k;
}
}  // namespace

std::optional<Union::Resolved> Union::cached(uint64_t dir, std::string_view name, uint64_t mutations,
                                             uint64_t changes) {
  std::lock_guard lk(rc_mu_);
  if (rc_mutations_ != mutations || rc_changes_ != changes) {
    rc_.clear();
    rc_mutations_ = mutations;
    rc_changes_ = changes;
    return std::nullopt;
  }
  auto it = rc_.find(resolved_key(dir, name));
  if (it == rc_.end()) return std::nullopt;
  return it->second;
}

void Union::cache(uint64_t dir, std::string_view name, const std::optional<Found>& f, uint64_t mutations,
                  uint64_t changes) {
  std::lock_guard lk(rc_mu_);
  // Counted before the resolution: if anything changed since, the entry
  // may be stale, and the cache has moved on (or will at its next use).
  if (rc_mutations_ != mutations || rc_changes_ != changes) return;
  if (rc_.size() >= kResolvedMax) rc_.clear();
  Resolved r;
  if (f) r = Resolved{true, f->inst, f->top_branch};
  rc_[resolved_key(dir, name)] = std::move(r);
}

Result<Attr> Union::lookup(uint64_t dir, std::string_view name) {
  if (name.size() > 255) return Error::io(ENAMETOOLONG, "name longer than 255 bytes");
  std::shared_lock lk(mu_);
  Node d = PLY_TRY(node(dir));
  if (!d.is_dir) return Error::io(ENOTDIR, "not a directory");
  if (name == ".") return attr_of(dir);
  if (name == "..") return attr_of(d.parent);
  // Both counts before anything is read (mu_'s is exact under mu_).
  const uint64_t muts = mutations(), changes = mu_.changes();
  std::optional<Found> f;
  if (auto c = cached(dir, name, muts, changes)) {
    if (!c->found) return Error::io(ENOENT, "no such entry");
    const auto [b, i] = c->inst.front();
    if (b >= 0 && size_t(b) < br_.size())
      if (auto a = br_[size_t(b)].fs->getattr(i)) {
        f = Found{*a, std::move(c->inst), c->top_branch};
        merged_nlink(f->attr, f->inst.size());
      }
  }
  if (!f) {
    f = PLY_TRY(resolve(d, name));
    cache(dir, name, f, muts, changes);
  }
  if (!f) return Error::io(ENOENT, "no such entry");
  remember(f->attr.ino, dir, name, *f, true);
  return entry_of(f->attr);
}

}  // namespace plyfs
