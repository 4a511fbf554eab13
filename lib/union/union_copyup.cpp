// Copy-up (union.h; format.md#fs-union): a change to an object of a
// read-only branch first copies it, its parent directories and its other
// names into a writable branch to its left; materialize copies a whole
// visible subtree for a rename.
#include "union/union.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "union/union_internal.h"

namespace plyfs {

using namespace union_internal;

// --- copy-up ----------------------------------------------------------------------------------

uint32_t copyup_umask(const Caller& c) {
  constexpr uint32_t kFallback = 022;
  if (c.pid == 0) return kFallback;
  const std::string path = "/proc/" + std::to_string(c.pid) + "/status";
  FILE* f = std::fopen(path.c_str(), "re");
  if (!f) return kFallback;
  char line[256];
  uint32_t mask = kFallback;
  while (std::fgets(line, sizeof line, f)) {
    unsigned v;
    if (std::strncmp(line, "Umask:", 6) == 0 && std::sscanf(line + 6, " %o", &v) == 1 && v <= 0777) {
      mask = v;
      break;
    }
  }
  std::fclose(f);
  return mask;
}

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
    s.mode = a.mode & 07777 & ~copyup_umask(c);
  }
  if (S_ISLNK(a.mode)) s.mode.reset();
  const Attr now = PLY_TRY(br_[b].fs->setattr(ino, s));
  if (copyup_hook_ && (now.uid != a.uid || now.gid != a.gid || now.mode != a.mode)) copyup_hook_(ino);
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

}  // namespace plyfs
