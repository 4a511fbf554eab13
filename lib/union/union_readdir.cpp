// The union's listings (union.h): readdir and readdirplus merge the
// branches' entries of a directory, with stable cookies
// (format.md#fs-union); union_empty asks the same of a directory about to go.
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

}  // namespace union_internal

// One merged listing from `cookie`: ".", "..", then the visible names in
// cookie order, each handed to fn (with what the listing read of it; none
// for the dots) while `mu` is held shared, so that no name changes between
// reading an entry and handing it out. `hidden` says which names the
// lineage rule hides (Union::held_left): they take no rank, as whiteouts.
// Stops when fn returns false.
using ListFn = std::function<Result<bool>(const DirEntry&, const Merged*)>;
using HiddenFn = std::function<Result<bool>(const Merged&)>;
static Result<void> list_merged(const std::vector<UnionBranch>& br, std::shared_mutex& mu,
                                uint64_t dir, uint64_t parent,
                                const std::vector<std::pair<int, uint64_t>>& inst, uint64_t cookie,
                                const HiddenFn& hidden, const ListFn& fn) {
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
      if (m.type == kWh || PLY_TRY(hidden(m))) continue;
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
  const Node d = PLY_TRY(dir_node(dir));
  return list_merged(br_, mu_, dir, d.parent, d.inst, cookie,
                     [&](const Merged& m) { return hidden_name(m); },
                     [&](const DirEntry& e, const Merged*) -> Result<bool> { return fn(e); });
}

Result<void> Union::readdirplus(uint64_t dir, uint64_t cookie,
                                const std::function<bool(const DirEntry&, const Attr*)>& fn) {
  std::shared_lock landing(io_mu_);  // the parts it found stay the stack's
  const Node d = PLY_TRY(dir_node(dir));
  return list_merged(br_, mu_, dir, d.parent, d.inst, cookie,
                     [&](const Merged& m) { return hidden_name(m); },
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

Result<bool> Union::union_empty(uint64_t dir) {
  Node d = PLY_TRY(node(dir));
  std::map<std::pair<uint64_t, std::string>, Merged> first;
  uint64_t from = 0;
  for (;;) {
    uint64_t bound;
    first.clear();
    PLY_CHECK(gather(br_, d.inst, from, first, bound));
    for (const auto& [key, m] : first)
      if (key.first < bound && m.type != kWh && !PLY_TRY(hidden_name(m))) return false;
    if (bound == ~0ull) return true;
    from = bound;
  }
}

}  // namespace plyfs
