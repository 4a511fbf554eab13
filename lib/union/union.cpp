// The union layer (union.h; semantics in format.md#fs-union).
#include "union/union.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>

#include <algorithm>
#include <map>

#include "fs/disk_fs.h"

namespace plyfs {

namespace {
constexpr uint8_t kWh = disk::kDtWhiteout;
// Entries gathered per branch in one readdir round; one hash group (at most
// 128 names) always fits.
constexpr size_t kReaddirBatch = 256;
constexpr int kMaxDepth = 4096;

bool missing(const Error& e) { return e.code == ENOENT || e.code == ENOTDIR; }
}  // namespace

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
    if (!txn) continue;  // unknown: resolve() then always looks
    TreeId t = br_[b].fs->tree();
    for (size_t hop = 0; hop < 64; hop++) {
      auto info = txn->tree_info(t);
      if (!info) {
        t = TreeId{0};
        break;
      }
      if (!info->cloned_from.v) break;
      t = info->cloned_from;
    }
    origin_[b] = t.v;
  }
}

// A merged directory's link count: its parts' counts do not add up to the
// subdirectories the union shows, and counting them means listing every
// part. 1 says "not counted" (as overlayfs, btrfs and find(1)'s -noleaf
// understand it), so no tool takes a wrong count for the true one.
static void merged_nlink(Attr& a, size_t parts) {
  if (parts > 1 && S_ISDIR(a.mode)) a.nlink = 1;
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
    if (!f) {
      f = Found{*a, {{b, (*e)->ino}}, b};
      if (!S_ISDIR(a->mode) || a->opaque) break;
    } else {
      if (!S_ISDIR(a->mode)) break;  // a non-directory ends the merge
      f->inst.emplace_back(b, (*e)->ino);
      if (a->opaque) break;
    }
  }
  if (f && !S_ISDIR(f->attr.mode)) leftmost_copy(*f);
  if (f) merged_nlink(f->attr, f->inst.size());
  return f;
}

void Union::leftmost_copy(Found& f) {
  {
    // A number names one object: its leftmost copy (a hard link copied up
    // by another name, or the same object in a clone of this branch's
    // lineage, format.md#fs-union). Only then can a branch further left hold
    // the number under another name: a copy-up keeps the name.
    const int tb = f.top_branch;
    bool look = f.attr.nlink > 1 || !origin_[size_t(tb)];
    for (int j = 0; j < tb && !look; j++)
      look = !origin_[size_t(j)] || origin_[size_t(j)] == origin_[size_t(tb)];
    const uint64_t ino = f.attr.ino;
    for (int j = 0; j < (look ? tb : 0); j++) {
      auto a = br_[j].fs->getattr(ino);
      if (a && a->nlink > 0 && !S_ISDIR(a->mode)) {
        f.attr = *a;
        f.inst = {{j, ino}};
        break;
      }
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

Result<Attr> Union::getattr(uint64_t ino) {
  std::shared_lock landing(io_mu_);  // a restack waits for this to finish
  return attr_of(ino);
}

Result<Attr> Union::attr_of(uint64_t ino) {
  size_t parts;
  Part p;
  {
    std::shared_lock lk(nodes_mu_);
    auto it = nodes_.find(ino);
    if (it == nodes_.end() || it->second.inst.empty())
      return Error::io(ESTALE, "inode " + std::to_string(ino) + " is not known to this mount");
    auto [b, i] = it->second.inst.front();
    if (b + shift_ < 0 || size_t(b + shift_) >= br_.size()) return stray(ino);
    p = Part{br_[b + shift_].fs, i};
    parts = it->second.inst.size();
  }
  Attr a = PLY_TRY(p.first->getattr(p.second));
  a.ino = ino;
  merged_nlink(a, parts);
  return a;
}

Result<Attr> Union::lookup(uint64_t dir, std::string_view name) {
  if (name.size() > 255) return Error::io(ENAMETOOLONG, "name longer than 255 bytes");
  std::shared_lock lk(mu_);
  Node d = PLY_TRY(node(dir));
  if (!d.is_dir) return Error::io(ENOTDIR, "not a directory");
  if (name == ".") return attr_of(dir);
  if (name == "..") return attr_of(d.parent);
  auto f = PLY_TRY(resolve(d, name));
  if (!f) return Error::io(ENOENT, "no such entry");
  remember(f->attr.ino, dir, name, *f, true);
  return entry_of(f->attr);
}

// --- readdir ------------------------------------------------------------------------------

namespace {
struct Merged {
  std::string name;
  uint64_t ino;
  uint8_t type;
  // Every branch's entry for the name, left to right: (branch, inode, type).
  std::vector<std::tuple<int, uint64_t, uint8_t>> occ;
};
}  // namespace

// One round of a merged listing: the visible names with hash >= from's,
// complete below `bound` (exclusive; ~0: to the end). Cookies are
// hash << 7 | rank, the rank counting the visible names of one hash in
// name order (format.md#fs-union).
static Result<void> gather(const std::vector<UnionBranch>& br,
                           const std::vector<std::pair<int, uint64_t>>& inst, uint64_t from_hash,
                           std::map<std::pair<uint64_t, std::string>, Merged>& first,
                           uint64_t& bound) {
  bound = ~0ull;
  for (const auto& part : inst) {
    const int b = part.first;  // a plain variable: lambdas may not capture bindings (C++17/clang)
    const uint64_t dino = part.second;
    size_t count = 0;
    uint64_t last = 0;
    auto r = br[b].fs->readdir(dino, std::max<uint64_t>(from_hash << 7, 3), [&](const DirEntry& e) {
      const uint64_t h = (e.next - 1) >> 7;
      if (h >= bound) return false;  // past what another branch completed
      if (count >= kReaddirBatch && h != last) {
        bound = std::min(bound, h);
        return false;
      }
      count++;
      last = h;
      auto [it, fresh] = first.try_emplace({h, std::string(e.name)}, Merged{std::string(e.name), e.ino, e.type, {}});
      if (fresh) it->second.occ.reserve(inst.size());  // one allocation per name
      it->second.occ.emplace_back(b, e.ino, e.type);
      return true;
    });
    if (!r && !missing(r.error())) return r.error();
  }
  return ok();
}

// One merged listing from `cookie`: ".", "..", then the visible names in
// cookie order, each handed to fn (with what the listing read of it; none
// for the dots) while `mu` is held shared, so that no name changes between
// reading an entry and handing it out. Stops when fn returns false.
using ListFn = std::function<Result<bool>(const DirEntry&, const Merged*)>;
static Result<void> list_merged(const std::vector<UnionBranch>& br, std::shared_mutex& mu,
                                uint64_t dir, uint64_t parent,
                                const std::vector<std::pair<int, uint64_t>>& inst, uint64_t cookie,
                                const ListFn& fn) {
  if (cookie == 0 && !PLY_TRY(fn(DirEntry{".", dir, DT_DIR, 1}, nullptr))) return ok();
  if (cookie <= 1 && !PLY_TRY(fn(DirEntry{"..", parent, DT_DIR, 2}, nullptr))) return ok();
  uint64_t from = std::max<uint64_t>(cookie, 3);
  for (;;) {
    std::map<std::pair<uint64_t, std::string>, Merged> first;
    uint64_t bound;
    std::shared_lock lk(mu);
    PLY_CHECK(gather(br, inst, from >> 7, first, bound));
    uint64_t group = ~0ull, rank = 0;
    for (const auto& [key, m] : first) {
      if (key.first >= bound) break;
      if (m.type == kWh) continue;
      if (key.first != group) group = key.first, rank = 0;
      const uint64_t ck = key.first << 7 | std::min<uint64_t>(rank++, 127);
      if (ck < from) continue;
      if (!PLY_TRY(fn(DirEntry{m.name, m.ino, m.type, ck + 1}, &m))) return ok();
    }
    if (bound == ~0ull) return ok();
    from = bound << 7;
  }
}

Result<Union::Node> Union::dir_node(uint64_t dir) {
  std::shared_lock lk(mu_);
  Node d = PLY_TRY(node(dir));
  if (!d.is_dir) return Error::io(ENOTDIR, "not a directory");
  return d;
}

Result<void> Union::readdir(uint64_t dir, uint64_t cookie,
                            const std::function<bool(const DirEntry&)>& fn) {
  std::shared_lock landing(io_mu_);  // the parts it found stay the stack's
  const Node d = PLY_TRY(dir_node(dir));
  return list_merged(br_, mu_, dir, d.parent, d.inst, cookie,
                     [&](const DirEntry& e, const Merged*) -> Result<bool> { return fn(e); });
}

Result<void> Union::readdirplus(uint64_t dir, uint64_t cookie,
                                const std::function<bool(const DirEntry&, const Attr*)>& fn) {
  std::shared_lock landing(io_mu_);  // the parts it found stay the stack's
  const Node d = PLY_TRY(dir_node(dir));
  return list_merged(br_, mu_, dir, d.parent, d.inst, cookie,
                     [&](const DirEntry& e, const Merged* mp) -> Result<bool> {
    if (!mp) return fn(e, nullptr);
    const Merged& m = *mp;
    // What lookup would find, from the entries the listing already read:
    // the first decides; a directory merges the directories right of it
    // down to an opaque one or another kind of entry.
    auto [b0, i0, t0] = m.occ.front();
    auto a = br_[b0].fs->getattr(i0);
    if (!a) {
      if (missing(a.error())) return true;  // removed meanwhile: skip it
      return a.error();
    }
    Found f{*a, {{b0, i0}}, b0};
    if (S_ISDIR(a->mode)) {
      bool stop = a->opaque;
      for (size_t k = 1; k < m.occ.size() && !stop; k++) {
        auto [b, i, t] = m.occ[k];
        if (t != DT_DIR) break;  // a file or a whiteout ends the merge
        f.inst.emplace_back(b, i);
        stop = PLY_TRY(br_[b].fs->getattr(i)).opaque;
      }
    } else {
      leftmost_copy(f);
    }
    merged_nlink(f.attr, f.inst.size());
    const Attr ea = entry_of(f.attr);
    if (!fn(DirEntry{m.name, f.attr.ino, m.type, e.next}, &ea)) return false;
    remember(f.attr.ino, dir, m.name, f, true);
    return true;
  });
}

Result<bool> Union::union_empty(uint64_t dir) {
  Node d = PLY_TRY(node(dir));
  std::map<std::pair<uint64_t, std::string>, Merged> first;
  uint64_t from = 0;
  for (;;) {
    uint64_t bound;
    first.clear();
    PLY_CHECK(gather(br_, d.inst, from, first, bound));
    for (const auto& [key, m] : first)
      if (key.first < bound && m.type != kWh) return false;
    if (bound == ~0ull) return true;
    from = bound;
  }
}

// --- copy-up ----------------------------------------------------------------------------------

Result<void> Union::apply_copyup_mode(int b, uint64_t ino, const Caller& c) {
  if (copyup_.kind == CopyUpMode::Owner) return ok();
  auto a = PLY_TRY(br_[b].fs->getattr(ino));
  SetAttr s;
  s.ctime = a.ctime;
  if (copyup_.kind == CopyUpMode::Const) {
    s.uid = copyup_.uid;
    s.gid = copyup_.gid;
    s.mode = copyup_.mode;
  } else {
    s.uid = c.uid;
    s.gid = c.gid;
    s.mode = a.mode & 07777 & ~c.umask;
  }
  if (S_ISLNK(a.mode)) s.mode.reset();
  (void)PLY_TRY(br_[b].fs->setattr(ino, s));
  return ok();
}

Result<bool> Union::reachable(uint64_t dir, int b) {
  for (int depth = 0; depth < kMaxDepth; depth++) {
    Node n = PLY_TRY(node(dir));
    for (auto [bb, i] : n.inst)
      if (bb == b) return true;
    if (dir == root_) return false;
    // Right of the last part the merge was cut (an opaque directory, or a
    // file or whiteout of that name further right): a copy there would not
    // show. Left of it, or between parts, nothing holds the name.
    if (n.inst.back().first < b) return false;
    dir = n.parent;
  }
  return Error::invalid("directory chain too deep");
}

int Union::usable_writable(int b, std::initializer_list<uint64_t> dirs) {
  for (int t = writable_left_of(b); t >= 0; t = writable_left_of(t - 1)) {
    bool all = true;
    for (uint64_t d : dirs) {
      auto r = reachable(d, t);
      all = all && r && *r;
    }
    if (all) return t;
  }
  return -1;
}

Result<uint64_t> Union::dir_in(uint64_t dir, int b) {
  Node n = PLY_TRY(node(dir));
  for (auto [bb, i] : n.inst)
    if (bb == b) return i;
  if (!PLY_TRY(reachable(dir, b))) return Error::io(EROFS, "the directory cannot have a part in that branch");
  const uint64_t pb = PLY_TRY(dir_in(n.parent, b));
  auto [tb, ti] = n.inst.front();
  Attr a = PLY_TRY(br_[b].fs->copy_in(*br_[tb].fs, ti, pb, n.name));
  std::lock_guard lk(nodes_mu_);
  auto& inst = nodes_[dir].inst;
  const std::pair key{b - shift_, a.ino};
  inst.insert(std::upper_bound(inst.begin(), inst.end(), key), key);
  return a.ino;
}

Result<int> Union::copy_up(uint64_t ino, const Caller& c) {
  Node n = PLY_TRY(node(ino));
  auto [b, i] = n.inst.at(0);
  if (br_[b].writable) return b;
  const int t = usable_writable(b, {n.is_dir ? ino : n.parent});
  if (t < 0) return Error::io(EROFS, "no writable branch left of the file's branch");
  if (n.is_dir) {
    (void)PLY_TRY(dir_in(ino, t));
    PLY_CHECK(apply_copyup_mode(t, ino, c));
    return t;
  }
  // The copy, its parent directories and its other names land in one
  // generation: a crash never leaves a hard-linked file half copied up
  // (format.md#fs-union, "Hard links across copy-up"). None of these steps
  // takes an inode lock, which a writer waiting for the group's commit
  // could hold; mu_ keeps every other union change out meanwhile.
  Volume::Group one_generation(br_[t].fs->volume());
  // The name the object was found by must still name it: a file whose
  // name went away has no place to be copied to.
  Node p = PLY_TRY(node(n.parent));
  auto f = PLY_TRY(resolve(p, n.name));
  if (!f || f->attr.ino != ino) return Error::io(ESTALE, "the file's name is gone");
  const uint64_t pd = PLY_TRY(dir_in(n.parent, t));
  (void)PLY_TRY(br_[t].fs->copy_in(*br_[b].fs, i, pd, n.name));
  PLY_CHECK(apply_copyup_mode(t, ino, c));
  {
    std::lock_guard lk(nodes_mu_);
    nodes_[ino].inst = keyed({{t, ino}});
  }
  if (f->attr.nlink > 1) PLY_CHECK(copy_links(ino, b, t));
  return t;
}

// Hard links survive copy-up (format.md#fs-union): every other name of the
// object in its old branch that the union still shows it by is linked to
// the copy, in that name's directory (copied up as needed). Then the copy's
// link count is what the union shows, and deleting one name leaves the
// others on the copy, not on the old version below. Names the union hides
// (a whiteout, another file, an opaque directory above) stay behind.
Result<void> Union::copy_links(uint64_t ino, int b, int t) {
  const Attr a = PLY_TRY(br_[b].fs->getattr(ino));
  for (auto& [bdir, name] : PLY_TRY(br_[b].fs->names_of(ino, a.nlink))) {
    auto p = PLY_TRY(br_[b].fs->path(bdir));
    if (!p) continue;
    // The union's directory at that path, and what it shows at the name.
    uint64_t ud = root_;
    bool found = true;
    for (size_t at = 1; at < p->size() && found;) {
      const size_t end = std::min(p->find('/', at), p->size());
      const std::string comp = p->substr(at, end - at);
      at = end + 1;
      auto f = PLY_TRY(resolve(PLY_TRY(node(ud)), comp));
      found = f && S_ISDIR(f->attr.mode);
      if (!found) break;
      remember(f->attr.ino, ud, comp, *f);
      ud = f->attr.ino;
    }
    if (!found) continue;
    auto f = PLY_TRY(resolve(PLY_TRY(node(ud)), name));
    if (!f || f->attr.ino != ino || !PLY_TRY(reachable(ud, t))) continue;
    const uint64_t pd = PLY_TRY(dir_in(ud, t));
    auto e = PLY_TRY(br_[t].fs->entry(pd, name));
    if (e && e->type != kWh && e->ino == ino) continue;  // the name copied first
    (void)PLY_TRY(br_[t].fs->copy_in(*br_[b].fs, ino, pd, name));
  }
  return ok();
}

Result<Union::Part> Union::writable_instance(uint64_t ino, const Caller& c) {
  {
    std::shared_lock lk(mu_);
    auto [b, i] = PLY_TRY(top(ino));
    if (br_[b].writable) return Part{br_[b].fs, i};
  }
  std::unique_lock lk(mu_);
  const int b = PLY_TRY(copy_up(ino, c));
  for (auto [bb, i] : PLY_TRY(node(ino)).inst)
    if (bb == b) return Part{br_[b].fs, i};
  return Error::io(ESTALE, "the copy is gone");
}

Result<void> Union::open(uint64_t ino, bool for_write, const Caller& c) {
  if (!for_write) return ok();
  (void)PLY_TRY(writable_instance(ino, c));
  return ok();
}

// --- names -------------------------------------------------------------------------------------

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

Result<void> Union::materialize(uint64_t dir, int b, const Caller& c, int depth) {
  if (depth > kMaxDepth) return Error::invalid("directory tree too deep to move");
  const uint64_t tino = PLY_TRY(dir_in(dir, b));
  Node n = PLY_TRY(node(dir));
  std::vector<Merged> names;
  {
    std::map<std::pair<uint64_t, std::string>, Merged> first;
    uint64_t from = 0, bound;
    do {
      first.clear();
      PLY_CHECK(gather(br_, n.inst, from, first, bound));
      for (auto& [key, m] : first)
        if (key.first < bound && m.type != kWh) names.push_back(m);
      from = bound;
    } while (bound != ~0ull);
  }
  for (const Merged& m : names) {
    auto f = PLY_TRY(resolve(n, m.name));
    if (!f) continue;
    const uint64_t ino = f->attr.ino;
    if (S_ISDIR(f->attr.mode)) {
      remember(ino, dir, m.name, *f);
      PLY_CHECK(materialize(ino, b, c, depth + 1));
    } else if (f->top_branch != b) {
      (void)PLY_TRY(br_[b].fs->copy_in(*br_[f->inst[0].first].fs, ino, tino, m.name));
      {
        std::lock_guard lk(nodes_mu_);
        if (auto it = nodes_.find(ino); it != nodes_.end()) it->second.inst = keyed({{b, ino}});
      }
      if (f->attr.nlink > 1) PLY_CHECK(copy_links(ino, f->inst[0].first, b));
    }
  }
  SetAttr s;
  s.opaque = true;
  s.ctime = PLY_TRY(br_[b].fs->getattr(tino)).ctime;
  (void)PLY_TRY(br_[b].fs->setattr(tino, s));
  std::lock_guard lk(nodes_mu_);
  nodes_[dir].inst = keyed({{b, tino}});
  return ok();
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

Result<std::string> Union::readlink(uint64_t ino) {
  std::shared_lock landing(io_mu_);  // a restack waits for this to finish
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->readlink(i);
}

// --- attributes and data --------------------------------------------------------------------

Result<Attr> Union::setattr(uint64_t ino, const SetAttr& s, const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fs, i] = PLY_TRY(writable_instance(ino, c));
  Attr a = PLY_TRY(fs->setattr(i, s));
  a.ino = ino;
  return a;
}

Result<size_t> Union::read(uint64_t ino, uint64_t off, std::span<std::byte> out) {
  std::shared_lock landing(io_mu_);  // a restack waits for this to finish
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->read(i, off, out);
}

Result<size_t> Union::write(uint64_t ino, uint64_t off, std::span<const std::byte> in,
                            const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fs, i] = PLY_TRY(writable_instance(ino, c));
  return fs->write(i, off, in);
}

Result<void> Union::fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len, const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fs, i] = PLY_TRY(writable_instance(ino, c));
  return fs->fallocate(i, mode, off, len);
}

Result<uint64_t> Union::lseek(uint64_t ino, uint64_t off, int whence) {
  std::shared_lock landing(io_mu_);  // a restack waits for this to finish
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->lseek(i, off, whence);
}

Result<uint64_t> Union::copy_range(uint64_t in, uint64_t off_in, uint64_t out, uint64_t off_out,
                                   uint64_t len, const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fo, io] = PLY_TRY(writable_instance(out, c));
  auto [fi, ii] = PLY_TRY(part(in));
  if (fi == fo) return fo->copy_range(ii, off_in, io, off_out, len);
  // Another branch: the same volume, but extents are shared only inside one
  // tree's operation, so the bytes are copied.
  std::vector<std::byte> buf(std::min<uint64_t>(len, 1 << 20));
  uint64_t done = 0;
  while (done < len) {
    auto chunk = std::span(buf).first(std::min<uint64_t>(buf.size(), len - done));
    size_t n = PLY_TRY(fi->read(ii, off_in + done, chunk));
    if (n == 0) break;
    size_t w = PLY_TRY(fo->write(io, off_out + done, chunk.first(n)));
    done += w;
    if (w < n) break;
  }
  return done;
}

Result<void> Union::setxattr(uint64_t ino, std::string_view name, std::span<const std::byte> value,
                             int flags, const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fs, i] = PLY_TRY(writable_instance(ino, c));
  return fs->setxattr(i, name, value, flags);
}

Result<std::vector<std::byte>> Union::getxattr(uint64_t ino, std::string_view name) {
  std::shared_lock landing(io_mu_);  // a restack waits for this to finish
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->getxattr(i, name);
}

Result<std::vector<std::string>> Union::listxattr(uint64_t ino) {
  std::shared_lock landing(io_mu_);  // a restack waits for this to finish
  auto [fs, i] = PLY_TRY(part(ino));
  return fs->listxattr(i);
}

Result<void> Union::removexattr(uint64_t ino, std::string_view name, const Caller& c) {
  std::shared_lock landing(io_mu_);  // a restack waits for this change to land
  auto [fs, i] = PLY_TRY(writable_instance(ino, c));
  return fs->removexattr(i, name);
}

Filesystem::StatFs Union::statfs() {
  std::shared_lock lk(mu_);
  return br_[0].fs->statfs();
}

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
