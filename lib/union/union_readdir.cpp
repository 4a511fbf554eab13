// The union's listings (union.h): readdir and readdirplus merge the
// branches' entries of a directory, with stable cookies
// (format.md#fs-union); union_empty asks the same of a directory about to go.
//
// A listing is a k-way merge over the branches' directory items, which every
// branch keeps in hash order (format.md#fs-dirent): each branch is read
// ahead in batches of whole hash groups, and each step takes the lowest
// hash at the heads, so a listing reads each branch's entries once and
// costs in proportion to the entries, with no map and no string per name.
// Invariants:
//  L1. A name is handed out only while mu_ is held shared since its entries
//      were read, or read again: no name changes between the two (a parked
//      listing whose mu_ count moved is read afresh from its cookie).
//  L2. Cookies are hash << 7 | rank, the rank counting the visible names of
//      one hash in name order (format.md#fs-union), so a listing resumed
//      from any cookie, parked or read afresh, hands out the same entries.
//  L3. A branch's batch ends at a hash boundary: one hash group is whole in
//      every branch's batch when it is merged, and a listing stopped inside
//      a group (a full reply) keeps its heads at the group's start.
#include "union/union.h"

#include <dirent.h>

#include <algorithm>
#include <functional>
#include <map>

#include "union/union_internal.h"

namespace plyfs {

using namespace union_internal;

// --- readdir ------------------------------------------------------------------------------

namespace union_internal {

// Entries gathered per branch in one readdir round; one hash group (at most
// 128 names) always fits.
constexpr size_t kReaddirBatch = 256;

// One round of a merged listing: the visible names with hash >= from's,
// complete below `bound` (exclusive; ~0: to the end). Cookies are
// hash << 7 | rank, the rank counting the visible names of one hash in
// name order (format.md#fs-union).
Result<void> gather(const std::vector<UnionBranch>& br,
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


// A branch's next batch: whole hash groups from s.next_hash on, about
// kStreamBatch entries (L3). A directory gone from the branch ends its stream.
static Result<void> refill(BranchStream& s, const std::vector<UnionBranch>& br) {
  s.ents.clear();
  s.names.clear();
  s.pos = 0;
  size_t count = 0;
  uint64_t last = 0;
  bool cut = false;
  auto r = br[s.b].fs->readdir(s.dino, std::max<uint64_t>(s.next_hash << 7, 3), [&](const DirEntry& e) {
    const uint64_t h = (e.next - 1) >> 7;
    if (count >= kStreamBatch && h != last) {
      s.next_hash = h;
      cut = true;
      return false;
    }
    count++;
    last = h;
    s.ents.push_back({h, e.ino, uint32_t(s.names.size()), uint32_t(e.name.size()), e.type});
    s.names.append(e.name);
    return true;
  });
  if (!r && !missing(r.error())) return r.error();
  s.end = !cut || !r;
  return ok();
}

Listing::Listing(uint64_t dir_ino, uint64_t parent_ino, const std::vector<std::pair<int, uint64_t>>& inst,
                 uint64_t cookie, uint64_t mu_count)
    : dir(dir_ino), parent(parent_ino), next(cookie), changes(mu_count) {
  parts.resize(inst.size());
  for (size_t k = 0; k < inst.size(); k++) {
    parts[k].b = inst[k].first;
    parts[k].dino = inst[k].second;
    parts[k].next_hash = std::max<uint64_t>(cookie, 3) >> 7;
  }
}

// The lowest hash at the branches' heads, reading a batch where a head ran
// out; ~0: every branch is at its end.
static Result<uint64_t> lowest_head(Listing& l, const std::vector<UnionBranch>& br) {
  uint64_t h = ~0ull;
  for (auto& s : l.parts) {
    if (s.pos == s.ents.size() && !s.end) PLY_CHECK(refill(s, br));
    if (s.pos < s.ents.size()) h = std::min(h, s.ents[s.pos].hash);
  }
  return h;
}

// The visible names of hash group h in name order, each handed to fn with
// its cookie; false when fn stopped (the heads stay at the group, L3).
static Result<bool> merge_group(Listing& l, uint64_t h, const HiddenFn& hidden, const ListFn& fn) {
  l.group.clear();
  for (size_t k = 0; k < l.parts.size(); k++) {
    const BranchStream& s = l.parts[k];
    for (size_t i = s.pos; i < s.ents.size() && s.ents[i].hash == h; i++)
      l.group.push_back({uint32_t(k), uint32_t(i)});
  }
  auto name = [&](const GroupRef& g) { return l.parts[g.part].name(l.parts[g.part].ents[g.ent]); };
  // Stable: the occurrences of one name stay left to right.
  if (l.group.size() > 1)
    std::stable_sort(l.group.begin(), l.group.end(),
                     [&](const GroupRef& a, const GroupRef& b) { return name(a) < name(b); });
  uint64_t rank = 0;
  for (size_t i = 0, j; i < l.group.size(); i = j) {
    const std::string_view n = name(l.group[i]);
    for (j = i + 1; j < l.group.size() && name(l.group[j]) == n; j++) {}
    const auto& e0 = l.parts[l.group[i].part].ents[l.group[i].ent];
    if (e0.type == kWh) continue;  // the leftmost decides: a whiteout hides
    Merged& m = l.m;
    m.name.assign(n);
    m.ino = e0.ino;
    m.type = e0.type;
    m.occ.clear();
    for (size_t k = i; k < j; k++) {
      const BranchStream& s = l.parts[l.group[k].part];
      const auto& e = s.ents[l.group[k].ent];
      m.occ.emplace_back(s.b, e.ino, e.type);
    }
    if (PLY_TRY(hidden(m))) continue;  // takes no rank, as a whiteout
    const uint64_t ck = h << 7 | std::min<uint64_t>(rank++, 127);
    if (ck < l.next) continue;
    if (!PLY_TRY(fn(DirEntry{m.name, m.ino, m.type, ck + 1}, &m))) return false;
    l.next = ck + 1;
  }
  return true;
}

// Continues listing l: ".", "..", then the visible names in cookie order,
// each handed to fn (with what the listing read of it; none for the dots),
// the caller holding mu_ shared (L1). Stops when fn returns false.
Result<void> run_listing(Listing& l, const std::vector<UnionBranch>& br, const HiddenFn& hidden,
                         const ListFn& fn) {
  if (l.next == 0) {
    if (!PLY_TRY(fn(DirEntry{".", l.dir, DT_DIR, 1}, nullptr))) return ok();
    l.next = 1;
  }
  if (l.next == 1) {
    if (!PLY_TRY(fn(DirEntry{"..", l.parent, DT_DIR, 2}, nullptr))) return ok();
    l.next = 2;
  }
  for (;;) {
    const uint64_t h = PLY_TRY(lowest_head(l, br));
    if (h == ~0ull) {
      l.done = true;
      return ok();
    }
    if (!PLY_TRY(merge_group(l, h, hidden, fn))) return ok();
    for (auto& s : l.parts)
      while (s.pos < s.ents.size() && s.ents[s.pos].hash == h) s.pos++;
  }
}

}  // namespace union_internal

// --- parked listings --------------------------------------------------------------------

// A listing the kernel continues (its next readdir asks for the cookie
// where the last reply ended) is taken from the parked ones; any other
// cookie, or a name change since (L1), starts one afresh from the cookie.
std::shared_ptr<Listing> Union::take_listing(uint64_t dir, uint64_t cookie) {
  std::lock_guard lk(lot_mu_);
  for (size_t i = 0; i < lot_.size(); i++) {
    if (lot_[i]->dir != dir || lot_[i]->next != cookie) continue;
    auto l = std::move(lot_[i]);
    lot_.erase(lot_.begin() + ptrdiff_t(i));
    return l;
  }
  return nullptr;
}

void Union::park_listing(std::shared_ptr<Listing> l) {
  std::lock_guard lk(lot_mu_);
  if (lot_.size() >= kParkedListings) lot_.erase(lot_.begin());  // the oldest
  lot_.push_back(std::move(l));
}

Result<void> Union::list(uint64_t dir, uint64_t cookie, const ListFn& fn) {
  std::shared_ptr<Listing> l = take_listing(dir, cookie);
  std::shared_lock lk(mu_);
  if (!l || l->changes != mu_.changes()) {
    const Node d = PLY_TRY(node(dir));
    if (!d.is_dir) return Error::io(ENOTDIR, "not a directory");
    l = std::make_shared<Listing>(dir, d.parent, d.inst, cookie, mu_.changes());
  }
  const uint64_t from = l->next;
  PLY_CHECK(run_listing(*l, br_, [&](const Merged& m) { return hidden_name(m); }, fn));
  // A listing that reached its end with this reply is not asked again
  // (the kernel's next request, if any, gets nothing either way).
  if (!l->done || l->next != from) park_listing(std::move(l));
  return ok();
}


Result<Union::Node> Union::dir_node(uint64_t dir) {
  std::shared_lock lk(mu_);
  Node d = PLY_TRY(node(dir));
  if (!d.is_dir) return Error::io(ENOTDIR, "not a directory");
  return d;
}

// A name of a merged listing that the lineage rule hides (held_left): its
// leftmost entry's object is held by a branch of its lineage further left.
Result<bool> Union::hidden_name(const Merged& m) {
  if (!any_lineage_) return false;
  auto [b, ino, type] = m.occ.front();
  return held_left(b, ino, {});
}

Result<void> Union::readdir(uint64_t dir, uint64_t cookie,
                            const std::function<bool(const DirEntry&)>& fn) {
  std::shared_lock landing(io_mu_);  // the parts it found stay the stack's
  return list(dir, cookie, [&](const DirEntry& e, const Merged*) -> Result<bool> { return fn(e); });
}

Result<void> Union::readdirplus(uint64_t dir, uint64_t cookie,
                                const std::function<bool(const DirEntry&, const Attr*)>& fn) {
  std::shared_lock landing(io_mu_);  // the parts it found stay the stack's
  return list(dir, cookie, [&](const DirEntry& e, const Merged* mp) -> Result<bool> {
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
        if (PLY_TRY(held_left(b, i, f.inst))) break;  // as resolve(): not shown
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

// Called with mu_ held (rmdir, rename over a directory).
Result<bool> Union::union_empty(uint64_t dir) {
  Node d = PLY_TRY(node(dir));
  Listing l(dir, d.parent, d.inst, 2, 0);  // past the dots
  bool empty = true;
  PLY_CHECK(run_listing(l, br_, [&](const Merged& m) { return hidden_name(m); },
                        [&](const DirEntry&, const Merged*) -> Result<bool> { return empty = false; }));
  return empty;
}

}  // namespace plyfs
