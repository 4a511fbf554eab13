// Shrinking: moving every block at or past a new end below it, then moving
// the end (format.md#relocation). The move itself is general -- "these
// extents and nodes go elsewhere" -- so that removing a device can use it.
#include <unordered_set>

#include "commit/volume.h"

namespace plyfs {

namespace {

// The space a batch's user-tree copies come from: blocks below the limit,
// each taken through a reservation that leaves half the reserve to the
// commit (A5), as a deleting operation may.
struct MoveSpace final : NodeSpace {
  SpaceManager& sm;
  Generation gen;
  std::atomic<uint64_t>& allocated;
  std::atomic<uint64_t>& released;
  MoveSpace(SpaceManager& s, Generation g, std::atomic<uint64_t>& a, std::atomic<uint64_t>& r)
      : sm(s), gen(g), allocated(a), released(r) {}
  Result<BlockNo> alloc_node() override {
    PLY_CHECK(sm.reserve(1, true));
    auto b = sm.alloc(1, ExtentKind::Meta, true);
    if (!b) sm.unreserve(1);
    else allocated.fetch_add(1, std::memory_order_relaxed);
    return b;
  }
  Result<uint32_t> refcount(BlockNo b) override { return sm.refcount(b); }
  Result<void> inc_ref(BlockNo b) override { return sm.inc_ref(b); }
  Result<Freed> dec_ref(BlockNo b) override {
    released.fetch_add(1, std::memory_order_relaxed);
    return sm.dec_ref(b, gen);
  }
};

}  // namespace

// A shrink must be refused before anything moves when some tree's values
// reference extents in a way this program cannot rewrite.
Result<void> Volume::check_movable() {
  std::vector<uint8_t> kinds;
  Result<void> bad = ok();
  PLY_CHECK(root_tree_->scan(Key{kFirstTreeId, 0}, Key::max(), [&](Key k, std::span<const std::byte> v) {
    if (k.lo != 0) return true;
    auto info = decode_root_record(TreeId{k.hi}, v, info_, open_generation());
    if (!info) bad = info.error();
    else kinds.push_back(info->kind);
    return bool(info);
  }));
  PLY_CHECK(std::move(bad));
  {
    std::shared_lock lk(trees_mu_);
    for (const auto& [id, s] : trees_) kinds.push_back(s->info.kind);
  }
  for (uint8_t k : kinds) {
    if (k == kKindPlain || opts_.movers.count(k)) continue;
    return Error::io(EOPNOTSUPP, "trees of kind " + std::to_string(k) +
                                     " hold extent references this program cannot move; the filesystem cannot shrink");
  }
  return ok();
}

Result<bool> Volume::relocate_batch(uint64_t lo, uint64_t hi, uint64_t& moved_blocks) {
  const Generation g = open_generation();
  const auto placed = PLY_TRY(space_->extents_in(lo, hi));
  if (placed.empty()) return false;
  const uint64_t bs = info_.block_size;
  // What one batch moves: nodes first (they are small, and a node that
  // moves rewrites its ancestors), then data up to kRelocateBatchBytes;
  // the space changes it queues stay within what one commit folds.
  const uint64_t budget = std::max<uint64_t>(64, change_budget(space_->geometry().reserve_blocks) / 4);
  std::unordered_set<uint64_t> nodes;
  std::vector<SpaceManager::Placed> data;
  uint64_t changes = 0, data_blocks = 0;
  for (const auto& p : placed) {
    if (changes >= budget) break;
    if (p.kind == ExtentKind::Meta) {
      nodes.insert(p.start);
      changes += 2 + 2 * 8;  // the node and its ancestors, each a new and a freed block
    }
  }
  for (const auto& p : placed) {
    if (p.kind != ExtentKind::Data) continue;
    if (!data.empty() && (changes >= budget || (data_blocks + p.nblocks) * bs > kRelocateBatchBytes)) break;
    data.push_back(p);
    data_blocks += p.nblocks;
    changes += 2;
  }

  // A failure past this point leaves trees half rewritten in memory: the
  // volume must never commit that (C5).
  auto failed = [&](const Error& e) {
    fail(e);
    return e;
  };
  MoveSpace ms(*space_, g, allocated_, released_);
  MutCtx m{g, ms};

  // Data: each extent to a new one of the same length out of the range, its
  // bytes copied as they are (the checksums in the values that reference
  // it stay true), its references carried over.
  std::unordered_map<uint64_t, BlockNo> moved;
  std::vector<std::byte> buf;
  for (const auto& p : data) {
    if (auto r = space_->reserve(p.nblocks, true); !r) {
      if (!moved.empty()) break;  // move what fits now; the rest after a commit frees the old copies
      return r.error();
    }
    auto nb = space_->alloc(p.nblocks, ExtentKind::Data, true);
    if (!nb) {
      space_->unreserve(p.nblocks);
      if (!moved.empty()) break;
      return Error::no_space("free space out of the range is too fragmented for an extent of " +
                             std::to_string(p.nblocks * bs) + " bytes, which moves whole (what moved so far "
                             "stays moved)");
    }
    allocated_.fetch_add(p.nblocks, std::memory_order_relaxed);
    constexpr uint64_t kChunk = 8ull << 20;
    for (uint64_t off = 0; off < p.nblocks * bs; off += kChunk) {
      const uint64_t n = std::min(kChunk, p.nblocks * bs - off);
      buf.resize(n);
      if (auto r = read_data(BlockNo{p.start + off / bs}, buf); !r) return failed(r.error());
      if (auto r = write_data(BlockNo{nb->v + off / bs}, buf); !r) return failed(r.error());
    }
    for (uint32_t r = 1; r < p.refs; r++)
      if (auto x = space_->inc_ref(*nb); !x) return failed(x.error());
    for (uint32_t r = 0; r < p.refs; r++) {
      released_.fetch_add(1, std::memory_order_relaxed);
      if (auto x = space_->dec_ref(BlockNo{p.start}, g); !x) return failed(x.error());
    }
    moved.emplace(p.start, *nb);
    moved_blocks += p.nblocks;
  }
  const std::function<std::optional<BlockNo>(BlockNo)> new_start = [&](BlockNo b) -> std::optional<BlockNo> {
    auto it = moved.find(b.v);
    if (it == moved.end()) return std::nullopt;
    return it->second;
  };

  // Every tree, each shared node copied once (the memo), each parent of a
  // copy copied in turn up to the roots.
  std::vector<uint64_t> ids;
  PLY_CHECK(root_tree_->scan(Key{kFirstTreeId, 0}, Key::max(), [&](Key k, std::span<const std::byte>) {
    if (k.lo == 0) ids.push_back(k.hi);
    return true;
  }));
  {
    std::shared_lock lk(trees_mu_);
    for (const auto& [id, s] : trees_) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  BTree::RelocMemo memo;
  const BTree::MovesNode moves_node = [&](BlockNo b) { return nodes.count(b.v) != 0; };
  for (uint64_t id : ids) {
    auto sr = slot(TreeId{id});
    if (!sr) {
      if (sr.error().code == ENOENT) continue;  // dropped in this generation: it reaches nothing
      return failed(sr.error());
    }
    Slot& s = **sr;
    std::unique_lock lk(s.mu);
    BTree::MoveValue mv;
    if (!moved.empty()) {
      auto it = opts_.movers.find(s.info.kind);
      if (it != opts_.movers.end()) {
        const ValueMove& fn = it->second;
        mv = [&](Key k, std::span<std::byte> v) { return fn(k, v, new_start); };
      }
    }
    auto r = BTree::relocate(*cache_, info_.fs_id, s.tree->config(), s.tree->root(), m, moves_node, mv, memo);
    if (!r) return failed(r.error());
    if (!*r) continue;
    s.info.root = **r;
    s.info.last_shared = g;  // its copies may be shared (BTree::relocate)
    s.tree = std::make_unique<BTree>(*cache_, info_.fs_id, config_for(s.info), s.info.root);
    if (!s.dirty) touch(s);
  }
  moved_blocks += memo.copied;

  // The root and space trees are small and never shared: all of their
  // nodes in the range move in every batch.
  MutCtx um{g, space_->unshared(g)};
  const BTree::MovesNode past = [lo, hi](BlockNo b) { return b.v >= lo && b.v < hi; };
  BTree::RelocMemo rmemo;
  auto rr = BTree::relocate(*cache_, info_.fs_id, root_tree_->config(), root_tree_->root(), um, past, {}, rmemo);
  if (!rr) return failed(rr.error());
  if (*rr) root_tree_ = std::make_unique<BTree>(*cache_, info_.fs_id, root_tree_->config(), **rr);
  if (auto sr = space_->relocate_tree(lo, hi, g); !sr) return failed(sr.error());
  changed_ = true;
  mutations_.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

Result<std::pair<uint64_t, uint64_t>> Volume::vacate(uint64_t lo, uint64_t hi,
                                                     const std::function<void(uint64_t, uint64_t)>& progress) {
  // Everything queued so far durable first: the batches then see one
  // generation's changes at a time.
  (void)PLY_TRY(commit());
  PLY_CHECK(space_->exclude(lo, hi));
  auto lift = [&](const Error& e) {
    (void)space_->exclude(0, 0);
    return e;
  };
  uint64_t to_move = 0, moved = 0;
  {
    auto placed = space_->extents_in(lo, hi);
    if (!placed) return lift(placed.error());
    for (const auto& p : *placed) to_move += p.nblocks;
  }
  if (progress) progress(0, to_move);
  for (;;) {
    bool more;
    {
      std::lock_guard cl(commit_mu_);
      if (auto w = writable(); !w) return lift(w.error());
      gate_.close();
      auto r = relocate_batch(lo, hi, moved);
      gate_.open();
      if (!r) return lift(r.error());
      more = *r;
    }
    if (!more) break;
    if (auto c = commit(); !c) return lift(c.error());
    if (progress) progress(std::min(moved, to_move), std::max(moved, to_move));
  }
  return std::pair{moved, to_move};
}

Result<Generation> Volume::shrink(uint64_t total_blocks,
                                  const std::function<void(uint64_t, uint64_t)>& progress) {
  PLY_CHECK(writable());
  if (is_multi_device(info_))
    return Error::io(EOPNOTSUPP, "a multi-device volume cannot be resized (format.md#multi-device)");
  const uint64_t bs = info_.block_size, first = info_.first_block;
  const uint64_t now = this->total_blocks();
  if (total_blocks >= now) return durable_generation();
  if (total_blocks < first + 256)
    return Error::invalid("a plyfs filesystem spans at least " + std::to_string((first + 256) * bs) + " bytes");
  const uint64_t reserve = reserve_for(total_blocks - first);
  {
    const SpaceStats st = space_->stats();
    if (st.used_blocks + reserve > total_blocks - first)
      return Error::no_space("cannot shrink to " + std::to_string(total_blocks * bs) + " bytes: " +
                             std::to_string(st.used_blocks * bs) + " bytes are in use and " +
                             std::to_string(reserve * bs) + " must stay free");
  }
  PLY_CHECK(check_movable());
  const auto lift = [&](const Error& e) {
    (void)space_->exclude(0, 0);
    return e;
  };
  const auto [moved, to_move] = PLY_TRY(vacate(total_blocks, now, progress));
  // Nothing lies past the end now, and what the moves freed is durable:
  // one generation records the new end, a second one puts it in the other
  // superblock slot too.
  {
    std::lock_guard cl(commit_mu_);
    gate_.close();
    auto r = space_->shrink(total_blocks, reserve);
    if (r) {
      total_blocks_.store(total_blocks, std::memory_order_release);
      changed_ = true;
    }
    gate_.open();
    if (!r) return lift(r.error());
  }
  const Generation g = PLY_TRY(commit_twice());
  if (progress) progress(std::max(moved, to_move), std::max(moved, to_move));
  return g;
}

}  // namespace plyfs
