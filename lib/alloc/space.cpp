#include "alloc/space.h"

#include <algorithm>
#include <cstring>

namespace plyfs {

namespace {

std::vector<std::byte> encode_item(uint64_t nblocks, uint32_t refs, ExtentKind kind) {
  std::vector<std::byte> out(sizeof(disk::SpaceItem));
  auto* it = reinterpret_cast<disk::SpaceItem*>(out.data());
  it->nblocks.set(nblocks);
  it->refs.set(refs);
  it->kind.set(static_cast<uint16_t>(kind));
  it->reserved.set(0);
  return out;
}

Key item_key(uint64_t start) { return Key{start, 0}; }

}  // namespace

// The NodeSpace of the trees that are never shared (root and space trees):
// every node has exactly one reference. They change only while a generation
// is frozen, so their blocks come from any free block, not a reservation.
class SpaceManager::Unshared final : public NodeSpace {
 public:
  explicit Unshared(SpaceManager& sm) : sm_(sm) {}
  Result<BlockNo> alloc_node() override {
    std::unique_lock lk(sm_.mu_);
    return sm_.alloc_locked(lk, 1, ExtentKind::Meta, nullptr);
  }
  Result<uint32_t> refcount(BlockNo) override { return 1u; }
  Result<void> inc_ref(BlockNo b) override {
    return Error::corrupt(b.v, "a node of an unshared tree cannot be shared");
  }
  Result<Freed> dec_ref(BlockNo b) override {
    std::lock_guard lk(sm_.mu_);
    return sm_.free_unshared_locked(b, sm_.fold_gen_);
  }

 private:
  SpaceManager& sm_;
};

SpaceManager::SpaceManager(BlockCache& cache, uint64_t fs_id, SpaceGeometry geo, RootPtr root,
                           SpaceCounters counters)
    : cache_(cache), fs_id_(fs_id), geo_(geo), counters_(counters) {
  tree_ = std::make_unique<BTree>(cache_, fs_id_, TreeConfig{kTreeId, false, Generation{0}, {}},
                                  root);
  unshared_ = std::make_unique<Unshared>(*this);
  uint64_t usable = geo_.total_blocks > geo_.first_block ? geo_.total_blocks - geo_.first_block : 0;
  groups_.resize((usable + kGroupBlocks - 1) / kGroupBlocks);
  cursor_ = geo_.first_block;
  place_classes_locked();
}

void SpaceManager::place_classes_locked() {
  hole_blocks_ = 0;
  for (const auto& h : geo_.holes) hole_blocks_ += h.nblocks;
  classes_.clear();
  meta_order_.clear();
  data_order_.clear();
  if (geo_.regions.empty()) return;
  classes_.resize(geo_.class_count);
  for (const auto& r : geo_.regions) {
    if (r.class_id >= classes_.size() || r.start < geo_.first_block || r.end <= r.start) continue;
    auto& cg = classes_[r.class_id];
    for (size_t g = (r.start - geo_.first_block) / kGroupBlocks;
         g < groups_.size() && geo_.first_block + g * kGroupBlocks < r.end; g++)
      cg.groups.push_back(g);
  }
  for (auto& cg : classes_) {
    std::sort(cg.groups.begin(), cg.groups.end());
    cg.cursor = cg.groups.empty() ? 0 : geo_.first_block + cg.groups[0] * kGroupBlocks;
  }
  meta_order_.push_back(geo_.meta_class);
  for (uint8_t c = 0; c < geo_.class_count; c++)
    if (c != geo_.meta_class) meta_order_.push_back(c);
  for (uint8_t c = geo_.class_count; c-- > 0;) data_order_.push_back(c);
}

// The parts of group g that no device backs (SpaceGeometry::holes) out of
// its free map.
void SpaceManager::hide_holes_locked(size_t g, std::map<uint64_t, uint64_t>& fm) const {
  const uint64_t gs = geo_.first_block + g * kGroupBlocks;
  const uint64_t ge = std::min(gs + kGroupBlocks, geo_.total_blocks);
  for (const auto& h : geo_.holes) {
    const uint64_t hs = std::max(h.start, gs), he = std::min(h.start + h.nblocks, ge);
    if (hs >= he) continue;
    auto it = fm.upper_bound(hs);
    if (it != fm.begin()) --it;
    while (it != fm.end() && it->first < he) {
      const uint64_t fs = it->first, fe = fs + it->second;
      if (fe <= hs) {
        ++it;
        continue;
      }
      it = fm.erase(it);
      if (fs < hs) fm[fs] = hs - fs;
      if (fe > he) it = fm.emplace(he, fe - he).first;
    }
  }
}

SpaceManager::~SpaceManager() = default;

std::unique_ptr<SpaceManager> SpaceManager::fresh(BlockCache& cache, uint64_t fs_id,
                                                  SpaceGeometry geo) {
  auto sm = std::make_unique<SpaceManager>(cache, fs_id, geo, RootPtr{}, SpaceCounters{});
  for (size_t g = 0; g < sm->groups_.size(); g++) {
    uint64_t gs = geo.first_block + g * kGroupBlocks;
    uint64_t ge = std::min(gs + kGroupBlocks, geo.total_blocks);
    sm->groups_[g].loaded = true;
    sm->groups_[g].free[gs] = ge - gs;
    sm->hide_holes_locked(g, sm->groups_[g].free);
  }
  return sm;
}

Result<void> SpaceManager::create_tree(Generation gen) {
  fold_gen_ = gen;
  MutCtx m{gen, *unshared_};
  RootPtr root = PLY_TRY(BTree::create(cache_, fs_id_, kTreeId, m));
  tree_ = std::make_unique<BTree>(cache_, fs_id_, TreeConfig{kTreeId, false, Generation{0}, {}},
                                  root);
  return ok();
}

Result<void> SpaceManager::take_range_locked(uint64_t start, uint64_t nblocks) {
  if (nblocks == 0 || start < geo_.first_block || start + nblocks > geo_.total_blocks ||
      (start - geo_.first_block) / kGroupBlocks !=
          (start + nblocks - 1 - geo_.first_block) / kGroupBlocks)
    return Error::corrupt(start, "extent outside the filesystem or across a group boundary");
  const size_t g = (start - geo_.first_block) / kGroupBlocks;
  PLY_CHECK(load_group_locked(g));
  auto& fm = groups_[g].free;
  auto it = fm.upper_bound(start);
  if (it == fm.begin()) return Error::corrupt(start, "extent is claimed twice");
  --it;
  const uint64_t es = it->first, el = it->second;
  if (start + nblocks > es + el) return Error::corrupt(start, "extent is claimed twice");
  fm.erase(it);
  if (start > es) fm[es] = start - es;
  if (es + el > start + nblocks) fm[start + nblocks] = es + el - (start + nblocks);
  return ok();
}

Result<void> SpaceManager::claim(BlockNo start, uint64_t nblocks, uint32_t refs,
                                 ExtentKind kind) {
  std::lock_guard lk(mu_);
  if (refs == 0) return Error::invalid("an extent in use has at least one reference");
  PLY_CHECK(take_range_locked(start.v, nblocks));
  pending_[start.v] = Delta{refs, nblocks, kind, true};
  account_locked(kind, static_cast<int64_t>(nblocks));
  return ok();
}

Result<void> SpaceManager::hold(BlockNo start, uint64_t nblocks, Generation gen) {
  std::lock_guard lk(mu_);
  PLY_CHECK(take_range_locked(start.v, nblocks));
  deferred_[start.v] = nblocks;
  deferred_by_gen_[gen.v].emplace_back(start.v, nblocks);
  deferred_blocks_ += nblocks;
  return ok();
}

Result<void> SpaceManager::hold_free_parts(BlockNo start, uint64_t nblocks, Generation gen) {
  const uint64_t end = std::min(start.v + nblocks, geo_.total_blocks);
  for (uint64_t pos = std::max(start.v, geo_.first_block); pos < end;) {
    const size_t g = (pos - geo_.first_block) / kGroupBlocks;
    const uint64_t group_end = std::min(end, geo_.first_block + (g + 1) * kGroupBlocks);
    std::vector<std::pair<uint64_t, uint64_t>> parts;
    {
      std::lock_guard lk(mu_);
      PLY_CHECK(load_group_locked(g));
      const auto& fm = groups_[g].free;
      auto it = fm.upper_bound(pos);
      if (it != fm.begin()) --it;
      for (; it != fm.end() && it->first < group_end; ++it) {
        const uint64_t s = std::max(it->first, pos), e = std::min(it->first + it->second, group_end);
        if (s < e) parts.emplace_back(s, e - s);
      }
    }
    for (auto [s, n] : parts) PLY_CHECK(hold(BlockNo{s}, n, gen));
    pos = group_end;
  }
  return ok();
}

NodeSpace& SpaceManager::unshared(Generation gen) {
  fold_gen_ = gen;
  return *unshared_;
}

RootPtr SpaceManager::root() const { return tree_->root(); }

SpaceGeometry SpaceManager::geometry() const {
  std::lock_guard lk(mu_);
  return geo_;
}

Result<void> SpaceManager::grow(uint64_t total_blocks, uint64_t reserve_blocks) {
  std::lock_guard lk(mu_);
  const uint64_t old = geo_.total_blocks;
  if (total_blocks < old) return Error::invalid("grow() cannot shrink");
  if (total_blocks == old) return ok();
  // The old last group, if it is loaded, gets the blocks up to its end;
  // one that is not is derived from the tree with the new end when loaded.
  const size_t last = (old - 1 - geo_.first_block) / kGroupBlocks;
  const uint64_t last_end = geo_.first_block + (last + 1) * kGroupBlocks;
  geo_.total_blocks = total_blocks;
  geo_.reserve_blocks = std::max(geo_.reserve_blocks, reserve_blocks);
  if (groups_[last].loaded && old < last_end) free_range_locked(old, std::min(last_end, total_blocks) - old);
  const size_t n = (total_blocks - geo_.first_block + kGroupBlocks - 1) / kGroupBlocks;
  for (size_t g = groups_.size(); g < n; g++) {
    const uint64_t gs = geo_.first_block + g * kGroupBlocks;
    Group grp;
    grp.loaded = true;  // nothing out there is in use: all of it is free
    grp.free[gs] = std::min(gs + kGroupBlocks, total_blocks) - gs;
    groups_.push_back(std::move(grp));
  }
  return ok();
}

Result<void> SpaceManager::exclude(uint64_t lo, uint64_t hi) {
  std::lock_guard lk(mu_);
  // Lifted (or moved): what was hidden is free again first.
  if (ex_hi_ > ex_lo_) {
    ex_lo_ = ex_hi_ = 0;
    auto runs = std::exchange(beyond_, {});
    beyond_blocks_ = 0;
    for (auto [s, n] : runs) free_range_locked(s, n);
  }
  hi = std::min(hi, geo_.total_blocks);
  lo = std::max(lo, geo_.first_block);
  if (hi <= lo) return ok();
  ex_lo_ = lo;
  ex_hi_ = hi;
  // Every group the range touches is loaded and cut, so that
  // free_now_locked() knows exactly what is out of reach.
  for (size_t g = (lo - geo_.first_block) / kGroupBlocks;
       g < groups_.size() && geo_.first_block + g * kGroupBlocks < hi; g++) {
    if (groups_[g].loaded) hide_beyond_locked(groups_[g].free);
    else PLY_CHECK(load_group_locked(g));
  }
  if (cursor_ >= lo && cursor_ < hi) cursor_ = hi < geo_.total_blocks ? hi : geo_.first_block;
  return ok();
}

Result<void> SpaceManager::limit(uint64_t end) {
  {
    std::lock_guard lk(mu_);
    if (end < geo_.total_blocks && end <= geo_.first_block)
      return Error::invalid("a shrink cannot end before the first usable block");
  }
  if (end >= geometry().total_blocks) return exclude(0, 0);
  return exclude(end, ~0ull);
}

uint64_t SpaceManager::alloc_limit() const {
  std::lock_guard lk(mu_);
  return ex_hi_ > ex_lo_ && ex_hi_ >= geo_.total_blocks ? ex_lo_ : geo_.total_blocks;
}

Result<std::vector<SpaceManager::Placed>> SpaceManager::extents_in(uint64_t from, uint64_t to) {
  std::lock_guard lk(mu_);
  std::vector<Placed> out;
  // No extent is longer than a group: one that reaches `from` starts at
  // most kGroupBlocks before it.
  const uint64_t lo = from > kGroupBlocks ? from - kGroupBlocks : 0;
  if (to <= from) return out;
  Result<void> bad = ok();
  PLY_CHECK(tree_->scan(item_key(lo), Key::max(), [&](Key k, std::span<const std::byte> v) {
    if (k.hi >= to) return false;
    if (v.size() != sizeof(disk::SpaceItem)) {
      bad = Error::corrupt(k.hi, "space item of the wrong size");
      return false;
    }
    const auto* it = reinterpret_cast<const disk::SpaceItem*>(v.data());
    const uint64_t n = it->nblocks.get();
    if (k.hi + n <= from) return true;
    int64_t refs = it->refs.get();
    if (auto p = pending_.find(k.hi); p != pending_.end() && !p->second.is_new) refs += p->second.refs;
    if (refs > 0) out.push_back(Placed{k.hi, n, uint32_t(refs), static_cast<ExtentKind>(it->kind.get())});
    return true;
  }));
  PLY_CHECK(std::move(bad));
  for (const auto& [start, d] : pending_)
    if (d.is_new && d.refs > 0 && start + d.nblocks > from && start < to)
      out.push_back(Placed{start, d.nblocks, uint32_t(d.refs), d.kind});
  std::sort(out.begin(), out.end(), [](const Placed& a, const Placed& b) { return a.start < b.start; });
  return out;
}

Result<void> SpaceManager::relocate_tree(uint64_t lo, uint64_t hi, Generation gen) {
  fold_gen_ = gen;
  MutCtx m{gen, *unshared_};
  BTree::RelocMemo memo;
  auto r = PLY_TRY(BTree::relocate(cache_, fs_id_, tree_->config(), tree_->root(), m,
                                   [lo, hi](BlockNo b) { return b.v >= lo && b.v < hi; }, {}, memo));
  if (r) tree_ = std::make_unique<BTree>(cache_, fs_id_, tree_->config(), *r);
  return ok();
}

// Whether anything of [lo, hi) is still in use or waits to be freed: an
// extent, a queued change, a free not yet durable.
Result<void> SpaceManager::check_vacated_locked(uint64_t lo, uint64_t hi) {
  for (const auto& [start, d] : pending_)
    if (start + d.nblocks > lo && start < hi)
      return Error::io(EBUSY, "an extent in the range has queued changes");
  for (const auto& [start, n] : deferred_)
    if (start + n > lo && start < hi)
      return Error::io(EBUSY, "blocks in the range were freed by a generation not yet durable");
  const uint64_t from = lo > kGroupBlocks ? lo - kGroupBlocks : 0;
  bool in = false;
  PLY_CHECK(tree_->scan(item_key(from), Key::max(), [&](Key k, std::span<const std::byte> v) {
    if (k.hi >= hi) return false;
    if (v.size() == sizeof(disk::SpaceItem) &&
        k.hi + reinterpret_cast<const disk::SpaceItem*>(v.data())->nblocks.get() <= lo)
      return true;
    in = true;
    return false;
  }));
  if (in) return Error::io(EBUSY, "an extent still lies in the range");
  return ok();
}

Result<void> SpaceManager::shrink(uint64_t total_blocks, uint64_t reserve_blocks) {
  std::lock_guard lk(mu_);
  if (total_blocks >= geo_.total_blocks) return Error::invalid("shrink() cannot grow");
  if (ex_lo_ != total_blocks || ex_hi_ < geo_.total_blocks)
    return Error::invalid("shrink() to an end other than the limit");
  PLY_CHECK(check_vacated_locked(total_blocks, geo_.total_blocks));
  geo_.total_blocks = total_blocks;
  geo_.reserve_blocks = reserve_blocks;
  groups_.resize((total_blocks - geo_.first_block + kGroupBlocks - 1) / kGroupBlocks);
  // Every free run past the limit is in beyond_, none in the free maps.
  beyond_.clear();
  beyond_blocks_ = 0;
  ex_lo_ = ex_hi_ = 0;
  if (cursor_ >= total_blocks) cursor_ = geo_.first_block;
  return ok();
}

Result<void> SpaceManager::drop_region(const SpaceGeometry& next) {
  std::lock_guard lk(mu_);
  if (ex_hi_ <= ex_lo_) return Error::invalid("drop_region() without an excluded range");
  if (next.first_block != geo_.first_block || next.total_blocks > geo_.total_blocks ||
      next.regions.empty() || next.class_count < geo_.class_count)
    return Error::invalid("drop_region() to a geometry that is not this one without a range");
  for (const auto& r : next.regions)
    if (r.start < ex_hi_ && r.end > ex_lo_) return Error::invalid("drop_region() keeps part of the range");
  PLY_CHECK(check_vacated_locked(ex_lo_, ex_hi_));
  // Every free run of the range is in beyond_: it leaves with the range.
  // A group the range touched holds nothing else (devices begin at group
  // boundaries): emptied, marked loaded, it is a hole's.
  for (size_t g = (ex_lo_ - geo_.first_block) / kGroupBlocks;
       g < groups_.size() && geo_.first_block + g * kGroupBlocks < ex_hi_; g++) {
    groups_[g].free.clear();
    groups_[g].loaded = true;
  }
  beyond_.clear();
  beyond_blocks_ = 0;
  ex_lo_ = ex_hi_ = 0;
  geo_ = next;
  groups_.resize((geo_.total_blocks - geo_.first_block + kGroupBlocks - 1) / kGroupBlocks);
  place_classes_locked();
  if (cursor_ >= geo_.total_blocks) cursor_ = geo_.first_block;
  return ok();
}

Result<void> SpaceManager::add_region(const SpaceGeometry& next) {
  std::lock_guard lk(mu_);
  const uint64_t old = geo_.total_blocks;
  if (next.first_block != geo_.first_block || next.total_blocks <= old || next.class_count < geo_.class_count)
    return Error::invalid("add_region() to a geometry that does not extend this one");
  geo_ = next;
  // The groups past the old end are new, and free but for their holes (the
  // gap up to the device, its reserved area). The old last group keeps its
  // end: what lies between it and the device is a hole.
  const size_t n = (geo_.total_blocks - geo_.first_block + kGroupBlocks - 1) / kGroupBlocks;
  for (size_t g = groups_.size(); g < n; g++) {
    const uint64_t gs = geo_.first_block + g * kGroupBlocks;
    Group grp;
    grp.loaded = true;
    grp.free[gs] = std::min(gs + kGroupBlocks, geo_.total_blocks) - gs;
    hide_holes_locked(g, grp.free);
    groups_.push_back(std::move(grp));
  }
  place_classes_locked();
  return ok();
}

uint64_t SpaceManager::pending_changes() const {
  return pending_size_.load(std::memory_order_relaxed);
}

SpaceCounters SpaceManager::counters() const {
  std::lock_guard lk(mu_);
  return counters_;
}

uint64_t SpaceManager::free_now_locked() const {
  uint64_t usable = geo_.total_blocks - geo_.first_block - hole_blocks_;
  // Blocks trim() holds out of the free map count as free: an allocation
  // that finds nothing else waits for them (alloc_locked).
  // Free blocks past a shrink's limit are not free to anyone.
  uint64_t taken = counters_.used_blocks + deferred_blocks_ + beyond_blocks_;
  return usable > taken ? usable - taken : 0;
}

SpaceStats SpaceManager::stats() const {
  std::lock_guard lk(mu_);
  return SpaceStats{geo_.total_blocks - geo_.first_block - hole_blocks_,
                    counters_.used_blocks,
                    deferred_blocks_,
                    free_now_locked(),
                    outstanding_,
                    geo_.reserve_blocks,
                    counters_.meta_blocks,
                    counters_.data_blocks,
                    [&] {
                      uint64_t n = 0;
                      for (const auto& r : to_discard_) n += r.nblocks;
                      return n;
                    }()};
}

void SpaceManager::account_locked(ExtentKind kind, int64_t nblocks) {
  counters_.used_blocks += static_cast<uint64_t>(nblocks);
  if (kind == ExtentKind::Meta) counters_.meta_blocks += static_cast<uint64_t>(nblocks);
  else counters_.data_blocks += static_cast<uint64_t>(nblocks);
}

// ------------------------------------------------------------ reservations

Result<void> SpaceManager::reserve(uint64_t nblocks, bool for_delete) {
  std::lock_guard lk(mu_);
  const uint64_t keep = for_delete ? geo_.reserve_blocks / 2 : geo_.reserve_blocks;
  const uint64_t free = free_now_locked();
  const uint64_t avail = free > outstanding_ + keep ? free - outstanding_ - keep : 0;
  if (avail < nblocks)
    return Error::no_space("no space left: " + std::to_string(avail) + " blocks available, " +
                           std::to_string(nblocks) + " needed (" +
                           std::to_string(deferred_blocks_) + " free after the next commit)");
  outstanding_ += nblocks;
  return ok();
}

void SpaceManager::unreserve(uint64_t nblocks) {
  std::lock_guard lk(mu_);
  outstanding_ -= std::min(outstanding_, nblocks);
}

// --------------------------------------------------------------- free map

Result<void> SpaceManager::load_group_locked(size_t g) {
  Group& grp = groups_[g];
  if (grp.loaded) return ok();
  const uint64_t gs = geo_.first_block + g * kGroupBlocks;
  const uint64_t ge = std::min(gs + kGroupBlocks, geo_.total_blocks);
  std::map<uint64_t, uint64_t> free;
  uint64_t pos = gs;
  Result<void> bad = ok();
  PLY_CHECK(tree_->scan(item_key(gs), Key{ge - 1, ~0ull}, [&](Key k, std::span<const std::byte> v) {
    if (v.size() != sizeof(disk::SpaceItem)) {
      bad = Error::corrupt(k.hi, "space item of the wrong size");
      return false;
    }
    const auto* it = reinterpret_cast<const disk::SpaceItem*>(v.data());
    const uint64_t n = it->nblocks.get();
    const uint16_t kind = it->kind.get();
    if (k.lo != 0 || it->refs.get() == 0 || (kind != 1 && kind != 2) || it->reserved.get() != 0) {
      bad = Error::corrupt(k.hi, "malformed space item");
      return false;
    }
    if (k.hi < pos || n == 0 || n > ge - k.hi) {
      bad = Error::corrupt(k.hi, "space items overlap or cross a group boundary");
      return false;
    }
    if (k.hi > pos) free[pos] = k.hi - pos;
    pos = k.hi + n;
    return true;
  }));
  PLY_CHECK(std::move(bad));
  if (ge > pos) free[pos] = ge - pos;
  hide_holes_locked(g, free);
  hide_beyond_locked(free);
  // Extents freed by generations not yet durable are not in the tree any more
  // but must not be handed out (A2).
  for (auto it = deferred_.lower_bound(gs); it != deferred_.end() && it->first < ge; ++it) {
    auto f = free.upper_bound(it->first);
    if (f == free.begin()) continue;
    --f;
    const uint64_t fs = f->first, fl = f->second, ds = it->first, dl = it->second;
    if (ds >= fs + fl) continue;
    free.erase(f);
    if (ds > fs) free[fs] = ds - fs;
    if (fs + fl > ds + dl) free[ds + dl] = fs + fl - (ds + dl);
  }
  grp.free = std::move(free);
  grp.loaded = true;
  return ok();
}

void SpaceManager::hide_beyond_locked(std::map<uint64_t, uint64_t>& fm) {
  if (ex_hi_ <= ex_lo_) return;
  // The runs that meet [ex_lo_, ex_hi_) lose that part to beyond_.
  auto it = fm.upper_bound(ex_lo_);
  if (it != fm.begin() && std::prev(it)->first + std::prev(it)->second > ex_lo_) --it;
  while (it != fm.end() && it->first < ex_hi_) {
    const uint64_t fs = it->first, fe = fs + it->second;
    const uint64_t hs = std::max(fs, ex_lo_), he = std::min(fe, ex_hi_);
    it = fm.erase(it);
    beyond_[hs] = he - hs;
    beyond_blocks_ += he - hs;
    if (fs < hs) fm[fs] = hs - fs;
    if (fe > he) it = fm.emplace(he, fe - he).first;
  }
}

void SpaceManager::free_range_locked(uint64_t start, uint64_t len) {
  if (ex_hi_ > ex_lo_ && start < ex_hi_ && start + len > ex_lo_) {
    // In the excluded range: out of reach (exclude()); the parts on either
    // side are free as ever.
    const uint64_t hs = std::max(start, ex_lo_), he = std::min(start + len, ex_hi_);
    beyond_[hs] = he - hs;
    beyond_blocks_ += he - hs;
    if (start + len > he) free_range_locked(he, start + len - he);
    if (start >= hs) return;
    len = hs - start;
  }
  Group& grp = groups_[(start - geo_.first_block) / kGroupBlocks];
  if (!grp.loaded) return;  // it will be derived from the tree when loaded
  auto& fm = grp.free;
  auto next = fm.lower_bound(start);
  if (next != fm.end() && next->first == start + len) {
    len += next->second;
    next = fm.erase(next);
  }
  if (next != fm.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += len;
      return;
    }
  }
  fm[start] = len;
}

Result<BlockNo> SpaceManager::alloc_locked(std::unique_lock<std::mutex>& lk, uint64_t nblocks, ExtentKind kind,
                                           const Placement* place) {
  auto r = find_locked(nblocks, kind, place);
  // What trim() holds is free and comes back within one discard (A6):
  // wait for it rather than fail a reservation made while it was out.
  while (!r && r.error().code == ENOSPC && trimming_ > 0) {
    const uint64_t epoch = trim_returns_;
    trim_cv_.wait(lk, [&] { return trim_returns_ != epoch; });
    r = find_locked(nblocks, kind, place);
  }
  return r;
}

Result<BlockNo> SpaceManager::find_locked(uint64_t nblocks, ExtentKind kind, const Placement* place) {
  if (nblocks == 0 || nblocks > kGroupBlocks)
    return Error::invalid("extent length " + std::to_string(nblocks) + " out of range");
  if (!classes_.empty()) {
    // Multi-device (format.md#placement): class by class in the kind's
    // order (a rule's classes first, format.md#placement-rules), next fit
    // within each class's groups.
    auto in_class = [&](uint8_t c) -> Result<std::optional<BlockNo>> {
      if (c >= classes_.size()) return std::optional<BlockNo>();
      auto& cg = classes_[c];
      return find_in_locked(&cg.groups, cg.groups.size(), cg.pos, cg.cursor, nblocks, kind);
    };
    const bool ruled = place && place->n > 0 && kind == ExtentKind::Data;
    if (ruled) {
      for (uint8_t i = 0; i < (place->strict ? 1 : place->n); i++)
        if (auto b = PLY_TRY(in_class(place->classes[i]))) return *b;
      if (place->strict)
        return Error::no_space("no free extent of " + std::to_string(nblocks) + " blocks in the rule's class");
    }
    for (uint8_t c : kind == ExtentKind::Meta ? meta_order_ : data_order_) {
      if (ruled && std::find(place->classes, place->classes + place->n, c) != place->classes + place->n) continue;
      if (auto b = PLY_TRY(in_class(c))) return *b;
    }
    return Error::no_space("no free extent of " + std::to_string(nblocks) + " blocks");
  }
  const size_t ngroups = groups_.size();
  if (ngroups == 0) return Error::no_space("the filesystem has no usable blocks");
  // Next fit: from the cursor to the end, then wrap around once.
  size_t pos = (cursor_ - geo_.first_block) / kGroupBlocks % ngroups;
  auto b = PLY_TRY(find_in_locked(nullptr, ngroups, pos, cursor_, nblocks, kind));
  if (b) return *b;
  return Error::no_space("no free extent of " + std::to_string(nblocks) + " blocks");
}

// Next fit over `n` groups (groups[i], or group i without a list), from
// group `pos` at block `cursor`, wrapping around once; both move to the
// extent found. Nothing found: an empty optional.
Result<std::optional<BlockNo>> SpaceManager::find_in_locked(const std::vector<size_t>* groups,
                                                            size_t n, size_t& pos, uint64_t& cursor,
                                                            uint64_t nblocks, ExtentKind kind) {
  for (size_t k = 0; k <= n && n > 0; k++) {
    const size_t i = (pos + k) % n;
    const size_t g = groups ? (*groups)[i] : i;
    PLY_CHECK(load_group_locked(g));
    auto& fm = groups_[g].free;
    const uint64_t from = k == 0 ? cursor : 0;
    auto it = fm.upper_bound(from);
    if (it != fm.begin()) --it;
    for (; it != fm.end(); ++it) {
      const uint64_t es = it->first, el = it->second;
      const uint64_t s = std::max(es, from);
      if (s >= es + el || es + el - s < nblocks) continue;
      fm.erase(it);
      if (s > es) fm[es] = s - es;
      if (es + el > s + nblocks) fm[s + nblocks] = es + el - (s + nblocks);
      cursor = s + nblocks;
      pos = i;
      if (pending_.count(s) && !early_reuse_)
        return Error::corrupt(s, "allocator handed out an extent with queued changes");
      pending_[s] = Delta{1, nblocks, kind, true};
      pending_size_.store(pending_.size(), std::memory_order_relaxed);
      account_locked(kind, static_cast<int64_t>(nblocks));
      return std::optional<BlockNo>(BlockNo{s});
    }
  }
  return std::optional<BlockNo>();
}

int SpaceManager::class_of(uint64_t b) const {
  std::lock_guard lk(mu_);
  for (const auto& r : geo_.regions)
    if (b >= r.start && b < r.end) return r.class_id;
  return -1;
}

int SpaceManager::metadata_class() const {
  std::lock_guard lk(mu_);
  for (uint8_t c : meta_order_)
    if (c < classes_.size() && !classes_[c].groups.empty()) return c;
  return -1;
}

Result<BlockNo> SpaceManager::alloc(uint64_t nblocks, ExtentKind kind, bool reserved, const Placement* place) {
  if (nblocks == 0 || nblocks > kGroupBlocks)
    return Error::invalid("extent length " + std::to_string(nblocks) + " out of range");
  std::unique_lock lk(mu_);
  if (reserved) {
    if (outstanding_ < nblocks)
      return Error::io(EFAULT, "allocation beyond the operation's reservation");
  } else if (free_now_locked() < outstanding_ + nblocks) {
    return Error::no_space("no space left for the commit");
  }
  // Free space may be too fragmented for a long extent; the reservation
  // then stays with the caller.
  BlockNo b = PLY_TRY(alloc_locked(lk, nblocks, kind, place));
  if (reserved) outstanding_ -= nblocks;
  return b;
}

// -------------------------------------------------------------- references

Result<std::optional<disk::SpaceItem>> SpaceManager::item_locked(BlockNo start) {
  auto v = PLY_TRY(tree_->get(item_key(start.v)));
  if (!v) return std::optional<disk::SpaceItem>();
  if (v->size() != sizeof(disk::SpaceItem))
    return Error::corrupt(start.v, "space item of the wrong size");
  disk::SpaceItem it;
  std::memcpy(&it, v->data(), sizeof it);
  const uint16_t kind = it.kind.get();
  if (it.nblocks.get() == 0 || it.refs.get() == 0 || (kind != 1 && kind != 2) ||
      it.reserved.get() != 0)
    return Error::corrupt(start.v, "space item with a zero length, zero references or bad kind");
  return std::optional<disk::SpaceItem>(it);
}

Result<uint32_t> SpaceManager::refcount(BlockNo start) {
  std::lock_guard lk(mu_);
  auto p = pending_.find(start.v);
  if (p != pending_.end() && p->second.is_new) return static_cast<uint32_t>(p->second.refs);
  auto item = PLY_TRY(item_locked(start));
  int64_t refs = (item ? item->refs.get() : 0) + (p != pending_.end() ? p->second.refs : 0);
  if (refs < 0) return Error::corrupt(start.v, "reference count below zero");
  return static_cast<uint32_t>(refs);
}

Result<void> SpaceManager::inc_ref(BlockNo start) {
  std::lock_guard lk(mu_);
  auto p = pending_.find(start.v);
  if (p != pending_.end() && p->second.is_new) {
    p->second.refs++;
    return ok();
  }
  auto item = PLY_TRY(item_locked(start));
  int64_t refs = (item ? item->refs.get() : 0) + (p != pending_.end() ? p->second.refs : 0);
  if (!item || refs <= 0) return Error::corrupt(start.v, "reference taken on a free extent");
  if (refs >= 0xffffffffll) return Error::io(EOVERFLOW, "reference count overflow");
  Delta& d = pending_[start.v];
  d.nblocks = item->nblocks.get();
  d.kind = static_cast<ExtentKind>(item->kind.get());
  d.refs++;
  pending_size_.store(pending_.size(), std::memory_order_relaxed);
  return ok();
}

Result<NodeSpace::Freed> SpaceManager::dec_ref(BlockNo start, Generation gen) {
  std::lock_guard lk(mu_);
  auto p = pending_.find(start.v);
  if (p != pending_.end() && p->second.is_new) {
    if (--p->second.refs > 0) return NodeSpace::Freed::No;
    // Allocated and freed in the open generation, never written: A2 lets it
    // go back at once.
    const Delta d = p->second;
    pending_.erase(p);
    account_locked(d.kind, -static_cast<int64_t>(d.nblocks));
    free_range_locked(start.v, d.nblocks);
    return NodeSpace::Freed::Now;
  }
  auto item = PLY_TRY(item_locked(start));
  int64_t refs = (item ? item->refs.get() : 0) + (p != pending_.end() ? p->second.refs : 0);
  if (!item || refs <= 0) return Error::corrupt(start.v, "extent freed twice");
  Delta& d = pending_[start.v];
  d.nblocks = item->nblocks.get();
  d.kind = static_cast<ExtentKind>(item->kind.get());
  d.refs--;
  pending_size_.store(pending_.size(), std::memory_order_relaxed);
  if (refs > 1) return NodeSpace::Freed::No;
  account_locked(d.kind, -static_cast<int64_t>(d.nblocks));
  if (early_reuse_) {  // planted bug: handed out again before `gen` is durable
    free_range_locked(start.v, d.nblocks);
    return NodeSpace::Freed::Deferred;
  }
  deferred_[start.v] = d.nblocks;
  deferred_by_gen_[gen.v].emplace_back(start.v, d.nblocks);
  deferred_blocks_ += d.nblocks;
  return NodeSpace::Freed::Deferred;
}

Result<NodeSpace::Freed> SpaceManager::free_unshared_locked(BlockNo b, Generation gen) {
  auto p = pending_.find(b.v);
  if (p != pending_.end() && p->second.is_new) {
    pending_.erase(p);
    account_locked(ExtentKind::Meta, -1);
    free_range_locked(b.v, 1);
    return NodeSpace::Freed::Now;
  }
  Delta& d = pending_[b.v];
  d.nblocks = 1;
  d.kind = ExtentKind::Meta;
  d.refs--;
  account_locked(ExtentKind::Meta, -1);
  if (early_reuse_) {  // planted bug, as in dec_ref
    free_range_locked(b.v, 1);
    return NodeSpace::Freed::Deferred;
  }
  deferred_[b.v] = 1;
  deferred_by_gen_[gen.v].emplace_back(b.v, 1);
  deferred_blocks_ += 1;
  return NodeSpace::Freed::Deferred;
}

// ------------------------------------------------------------------ commit

Result<void> SpaceManager::fold(Generation gen) {
  fold_gen_ = gen;
  MutCtx m{gen, *unshared_};
  for (int round = 0; round < 64; round++) {
    std::vector<std::pair<uint64_t, Delta>> batch;
    {
      std::lock_guard lk(mu_);
      batch.assign(pending_.begin(), pending_.end());
      pending_.clear();
      pending_size_.store(0, std::memory_order_relaxed);
    }
    if (batch.empty()) return ok();
    std::sort(batch.begin(), batch.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [start, d] : batch) {
      if (d.is_new) {
        if (d.refs <= 0) return Error::corrupt(start, "queued new extent without references");
        PLY_CHECK(tree_->put(m, item_key(start),
                             encode_item(d.nblocks, static_cast<uint32_t>(d.refs), d.kind)));
        continue;
      }
      if (d.refs == 0) continue;
      std::optional<disk::SpaceItem> item;
      {
        std::lock_guard lk(mu_);
        item = PLY_TRY(item_locked(BlockNo{start}));
      }
      if (!item) return Error::corrupt(start, "queued change to an extent with no space item");
      const int64_t refs = int64_t{item->refs.get()} + d.refs;
      if (refs < 0) return Error::corrupt(start, "reference count below zero");
      if (refs == 0) {
        (void)PLY_TRY(tree_->erase(m, item_key(start)));
      } else {
        PLY_CHECK(tree_->put(m, item_key(start),
                             encode_item(item->nblocks.get(), static_cast<uint32_t>(refs),
                                         static_cast<ExtentKind>(item->kind.get()))));
      }
    }
  }
  return Error::corrupt(Error::kNoBlock, "space fold did not converge");
}

void SpaceManager::durable(Generation gen) {
  std::lock_guard lk(mu_);
  auto end = deferred_by_gen_.upper_bound(gen.v);
  for (auto it = deferred_by_gen_.begin(); it != end; ++it) {
    for (auto [start, len] : it->second) {
      if (discard_) {  // stays in deferred_, out of the free map, until discarded (A6)
        to_discard_.push_back(BlockRange{start, len});
        continue;
      }
      deferred_.erase(start);
      deferred_blocks_ -= len;
      free_range_locked(start, len);
    }
  }
  deferred_by_gen_.erase(deferred_by_gen_.begin(), end);
}

// ----------------------------------------------------------------- discard

void SpaceManager::set_discard(bool on) {
  std::lock_guard lk(mu_);
  discard_ = on;
}

std::vector<BlockRange> SpaceManager::take_discards() {
  std::vector<BlockRange> out;
  {
    std::lock_guard lk(mu_);
    out.swap(to_discard_);
  }
  std::sort(out.begin(), out.end(), [](const BlockRange& a, const BlockRange& b) { return a.start < b.start; });
  return out;
}

void SpaceManager::released(const std::vector<BlockRange>& ranges) {
  std::lock_guard lk(mu_);
  for (const auto& r : ranges) {
    deferred_.erase(r.start);
    deferred_blocks_ -= r.nblocks;
    free_range_locked(r.start, r.nblocks);
  }
}

std::vector<BlockRange> SpaceManager::freed_in(Generation gen) const {
  std::lock_guard lk(mu_);
  std::vector<BlockRange> out;
  if (auto it = deferred_by_gen_.find(gen.v); it != deferred_by_gen_.end())
    for (auto [start, len] : it->second) out.push_back(BlockRange{start, len});
  return out;
}

Result<uint64_t> SpaceManager::trim(BlockRange within, uint64_t min_blocks,
                                    const std::function<Result<void>(BlockRange)>& discard,
                                    const std::function<void(uint64_t, double)>& progress) {
  const SpaceGeometry geo = geometry();
  const uint64_t lo = std::max(within.start, geo.first_block);
  const uint64_t hi = within.nblocks > geo.total_blocks - std::min(within.start, geo.total_blocks)
                          ? geo.total_blocks
                          : within.start + within.nblocks;
  uint64_t done = 0;
  if (lo >= hi) return done;
  min_blocks = std::max<uint64_t>(min_blocks, 1);
  // At most kTrimChunk blocks are out of the free map at a time; an
  // allocation that needs them waits for one discard (alloc_locked).
  for (uint64_t pos = lo; pos < hi;) {
    const size_t g = (pos - geo.first_block) / kGroupBlocks;
    const uint64_t group_end = std::min(hi, geo.first_block + (g + 1) * kGroupBlocks);
    std::vector<BlockRange> out;
    {
      std::lock_guard lk(mu_);
      PLY_CHECK(load_group_locked(g));
      auto& fm = groups_[g].free;
      uint64_t taken = 0;
      auto it = fm.upper_bound(pos);
      if (it != fm.begin() && std::prev(it)->first + std::prev(it)->second > pos) --it;
      for (; it != fm.end() && it->first < group_end && taken < kTrimChunk;) {
        const uint64_t s = std::max(it->first, pos);
        const uint64_t run_end = std::min(it->first + it->second, group_end);
        if (run_end - s < min_blocks) {
          ++it;
          continue;
        }
        const uint64_t e = std::min(run_end, s + (kTrimChunk - taken));
        if (e - s < min_blocks) break;  // the next chunk takes this run whole
        // Only [s, e) leaves the map; the parts outside stay free.
        const uint64_t fs = it->first, fe = it->first + it->second;
        it = fm.erase(it);
        if (fs < s) fm[fs] = s - fs;
        if (e < fe) it = fm.emplace(e, fe - e).first;
        out.push_back(BlockRange{s, e - s});
        trimming_ += e - s;
        taken += e - s;
        pos = e;
      }
      if (taken < kTrimChunk) pos = group_end;  // the group is done
    }
    Result<void> r = ok();
    for (const auto& b : out) {
      if (r) r = discard(b);
      if (r) done += b.nblocks;
    }
    {
      std::lock_guard lk(mu_);
      for (const auto& b : out) {
        trimming_ -= b.nblocks;
        free_range_locked(b.start, b.nblocks);
      }
      trim_returns_++;
    }
    trim_cv_.notify_all();
    PLY_CHECK(std::move(r));
    if (progress) progress(done, double(pos - lo) / double(hi - lo));
  }
  return done;
}

}  // namespace plyfs
