#include "commit/volume.h"

#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <utility>

#include "blockdev/device_set.h"
#include "commit/devices.h"
#include "commit/disk_root.h"
#include "commit/disk_superblock.h"
#include "util/checksum.h"

namespace plyfs {

namespace {

constexpr uint64_t kMinUsableBlocks = 256;

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

// The reserve (A5) must cover the metadata a commit of a full filesystem
// writes: about one space-tree leaf per 64 blocks if every extent changed.
uint64_t Volume::reserve_for(uint64_t usable) { return std::clamp<uint64_t>(usable / 64, 64, 262144); }

std::vector<std::byte> encode_root_record(const TreeInfo& t) {
  std::vector<std::byte> out(sizeof(disk::RootRecord));
  auto* r = reinterpret_cast<disk::RootRecord*>(out.data());
  r->root_block.set(t.root.block.v);
  r->root_gen.set(t.root.gen.v);
  r->level = t.root.level;
  r->kind = t.kind;
  r->created_gen.set(t.created.v);
  r->last_shared_gen.set(t.last_shared.v);
  r->cloned_from.set(t.cloned_from.v);
  return out;
}

Result<TreeInfo> decode_root_record(TreeId id, std::span<const std::byte> v, const SuperInfo& sb,
                                    Generation newest) {
  if (v.size() != sizeof(disk::RootRecord))
    return Error::corrupt(Error::kNoBlock, "root record of tree " + std::to_string(id.v) +
                                               " has the wrong size");
  disk::RootRecord r;
  std::memcpy(&r, v.data(), sizeof r);
  TreeInfo t;
  t.id = id;
  t.kind = r.kind;
  t.root = RootPtr{BlockNo{r.root_block.get()}, Generation{r.root_gen.get()}, r.level};
  t.created = Generation{r.created_gen.get()};
  t.last_shared = Generation{r.last_shared_gen.get()};
  t.cloned_from = TreeId{r.cloned_from.get()};
  if (t.root.block.v < sb.first_block || t.root.block.v >= sb.total_blocks ||
      t.root.level > 16 || t.kind == 0 || r.flags.get() != 0 || r.reserved0.get() != 0 ||
      r.reserved1[0].get() != 0 || r.reserved1[1].get() != 0)
    return Error::corrupt(t.root.block.v,
                          "root record of tree " + std::to_string(id.v) + " is out of range");
  if (t.root.gen > newest || t.created > newest || t.last_shared > newest)
    return Error::corrupt(t.root.block.v, "root record of tree " + std::to_string(id.v) +
                                              " has generations from the future");
  return t;
}

namespace {

Result<void> write_generation_to(BlockDevice& dev, BlockCache& cache,
                                 const std::vector<BlockCache::Ref>& dirty, const SuperInfo& sb,
                                 PlantedBug bug = PlantedBug::None) {
  // C1: every node of the generation, then a flush, before its superblock.
  PLY_CHECK(cache.write_back(dirty));
  if (bug != PlantedBug::NoFlushBeforeSuper) PLY_CHECK(dev.flush());
  // C2: the slot that does not hold the newest durable superblock.
  const auto bytes = encode_superblock(sb);
  PLY_CHECK(dev.write(disk::kSuperOffset[sb.generation.v % 2], bytes));
  // C4: durable only after this flush.
  PLY_CHECK(dev.flush());
  return ok();
}

}  // namespace

Result<void> write_generation(BlockDevice& dev, BlockCache& cache, const SuperInfo& sb) {
  auto dirty = cache.dirty_blocks();
  for (auto& b : dirty) seal_node(b->bytes());
  PLY_CHECK(write_generation_to(dev, cache, dirty, sb));
  cache.mark_clean(dirty);
  return ok();
}

// ------------------------------------------------------------------- gate

namespace {
// The volume whose Group this thread holds, if any.
thread_local const Volume* tl_group = nullptr;
}  // namespace

void Volume::Gate::enter() {
  for (;;) {
    uint64_t s = state_.load(std::memory_order_acquire);
    if (!(s & kClosed)) {
      if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) return;
      continue;
    }
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return !(state_.load(std::memory_order_acquire) & kClosed); });
  }
}
void Volume::Gate::leave() {
  const uint64_t s = state_.fetch_sub(1, std::memory_order_acq_rel) - 1;
  // The last Txn out of a closing gate wakes the commit. Notifying under the
  // mutex pairs with close() checking the count under it: no lost wakeup.
  if ((s & kClosed) && (s & ~kClosed) == 0) {
    std::lock_guard lk(mu_);
    cv_.notify_all();
  }
}
void Volume::Gate::close() {
  state_.fetch_or(kClosed, std::memory_order_acq_rel);
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return (state_.load(std::memory_order_acquire) & ~kClosed) == 0; });
}
void Volume::Gate::open() {
  state_.fetch_and(~kClosed, std::memory_order_acq_rel);
  std::lock_guard lk(mu_);
  cv_.notify_all();
}

// ------------------------------------------------------------- formatting

Result<SuperInfo> Volume::plan(const BlockDevice& dev, const FormatOptions& o) {
  const uint32_t bs = o.block_size;
  if (bs < 4096 || bs > 65536 || (bs & (bs - 1)) != 0)
    return Error::invalid("block size must be a power of two from 4096 to 65536");
  const uint32_t lss = dev.logical_sector_size();
  if (lss > 4096 || lss > bs)
    return Error::invalid("the device's sector size (" + std::to_string(lss) +
                          ") is larger than the block size");
  uint64_t size = o.size_bytes ? o.size_bytes : dev.size_bytes();
  if (size > dev.size_bytes())
    return Error::invalid("requested size " + std::to_string(size) + " is larger than the device (" +
                          std::to_string(dev.size_bytes()) + " bytes)");
  SuperInfo s;
  s.block_size = bs;
  s.sector_size = lss;
  s.total_blocks = size / bs;
  s.first_block = disk::kReservedBytes / bs;
  if (s.total_blocks < s.first_block + kMinUsableBlocks)
    return Error::invalid("too small: a plyfs filesystem needs at least " +
                          std::to_string((s.first_block + kMinUsableBlocks) * bs) + " bytes");
  if (o.label.size() > 64 || o.label.find('\0') != std::string::npos)
    return Error::invalid("the label must be at most 64 bytes, without NUL");
  s.label = o.label;
  s.uuid = o.uuid;
  if (std::all_of(s.uuid.begin(), s.uuid.end(), [](uint8_t b) { return b == 0; }))
    s.uuid = PLY_TRY(random_uuid());
  s.fs_id = xxh3(s.uuid.data(), 16);
  s.reserve_blocks = reserve_for(s.total_blocks - s.first_block);
  s.next_tree_id = kFirstTreeId;
  s.next_inode = kFirstInode;
  s.mkfs_time_ns = o.time_ns ? o.time_ns : now_ns();
  s.commit_time_ns = s.mkfs_time_ns;
  // A multi-device volume (format.md#device-table): the table from the
  // set's layout, a uuid for each device, and the reserve of what the
  // devices hold (not the gaps between them).
  if (!o.device_classes.empty()) {
    const auto* set = const_cast<BlockDevice&>(dev).device_set();
    if (!set || set->member_count() != o.device_classes.size())
      return Error::invalid("a class for each device of the set is needed");
    if (o.classes.empty() || o.classes.size() > disk::kMaxClasses)
      return Error::invalid("a multi-device volume has 1 to " + std::to_string(disk::kMaxClasses) +
                            " classes");
    if (set->member_count() > disk::kMaxDevices)
      return Error::invalid("a volume has at most " + std::to_string(disk::kMaxDevices) + " devices");
    if (o.meta_class >= o.classes.size()) return Error::invalid("the metadata class is not a class");
    s.incompat |= kIncompatMultiDevice;
    s.classes = o.classes;
    s.meta_class = o.meta_class;
    for (size_t i = 0; i < set->member_count(); i++) {
      const auto& m = set->member_info(i);
      if (o.device_classes[i] >= o.classes.size()) return Error::invalid("a device has no class");
      DeviceInfo d;
      d.first_block = m.base / bs;
      d.nblocks = m.bytes / bs;
      d.class_id = o.device_classes[i];
      d.uuid = PLY_TRY(random_uuid());
      if (d.nblocks < s.first_block + 16)
        return Error::invalid("device " + std::to_string(i) + " is too small: a device of a volume holds at least " +
                              std::to_string((s.first_block + 16) * bs) + " bytes");
      s.devices.push_back(d);
    }
    s.total_blocks = s.devices.back().first_block + s.devices.back().nblocks;
    uint64_t holes = 0;
    for (const auto& h : space_geometry(s).holes) holes += h.nblocks;
    if (s.total_blocks - s.first_block - holes < kMinUsableBlocks)
      return Error::invalid("too small: a plyfs filesystem needs at least " +
                            std::to_string((s.first_block + kMinUsableBlocks) * bs) + " bytes");
    s.reserve_blocks = reserve_for(s.total_blocks - s.first_block - holes);
  }
  return s;
}

SpaceGeometry space_geometry(const SuperInfo& s) {
  SpaceGeometry g{s.first_block, s.total_blocks, s.reserve_blocks, {}, {}, 0, 0};
  if (!is_multi_device(s)) return g;
  g.meta_class = static_cast<uint8_t>(s.meta_class);
  g.class_count = static_cast<uint8_t>(s.classes.size());
  uint64_t end = s.first_block;
  for (size_t i = 0; i < s.devices.size(); i++) {
    const DeviceInfo& d = s.devices[i];
    // Each device begins with its own reserved area (its label and
    // superblock copies; block 0's is the volume's), after a gap up to a
    // group boundary.
    const uint64_t usable = d.first_block + s.first_block;
    if (usable > end) g.holes.push_back(BlockRange{end, usable - end});
    g.regions.push_back(DeviceRegion{usable, d.first_block + d.nblocks, d.class_id});
    end = d.first_block + d.nblocks;
  }
  return g;
}

Result<SuperInfo> Volume::format(BlockDevice& dev, const FormatOptions& o) {
  SuperInfo s = PLY_TRY(plan(dev, o));
  const uint32_t bs = s.block_size;
  auto* set = dev.device_set();
  // Wipe the reserved area (both superblock slots) and flush first: a crash
  // during mkfs then leaves no superblock at all, never an old one in front
  // of half-written new trees.
  std::vector<std::byte> zero(64 * 1024);
  for (uint64_t off = 0; off < s.first_block * bs; off += zero.size())
    PLY_CHECK(dev.write(off, std::span(zero).first(std::min<uint64_t>(zero.size(),
                                                                       s.first_block * bs - off))));
  PLY_CHECK(dev.flush());
  // Then each device's label (format.md#device-label): which volume, which
  // device; the superblocks that list the devices follow.
  if (is_multi_device(s)) {
    for (size_t i = 0; i < set->member_count(); i++)
      PLY_CHECK(write_device_label(set->member(i), s.uuid, s.devices[i].uuid, s.mkfs_time_ns));
    PLY_CHECK(dev.flush());
  }

  BlockCache cache(dev, bs, 64ull << 20);
  auto space = SpaceManager::fresh(cache, s.fs_id, space_geometry(s));
  const Generation g1{1};
  PLY_CHECK(space->create_tree(g1));
  MutCtx m{g1, space->unshared(g1)};
  s.root_tree = PLY_TRY(BTree::create(cache, s.fs_id, kRootTreeId, m));
  PLY_CHECK(space->fold(g1));
  s.space_tree = space->root();
  const SpaceCounters c = space->counters();
  s.used_blocks = c.used_blocks;
  s.meta_blocks = c.meta_blocks;
  s.data_blocks = c.data_blocks;
  s.generation = g1;
  PLY_CHECK(plyfs::write_generation(dev, cache, s));
  // Generation 2 into the other slot, same trees: from the start both slots
  // hold a valid superblock.
  s.generation = Generation{2};
  PLY_CHECK(plyfs::write_generation(dev, cache, s));
  return s;
}

// ---------------------------------------------------------------- opening

Volume::Volume(BlockDevice& dev, VolumeOptions opts) : dev_(dev), opts_(std::move(opts)) {}

Result<std::unique_ptr<Volume>> Volume::open(BlockDevice& dev, VolumeOptions opts) {
  SuperChoice choice =
      PLY_TRY(read_superblocks(dev, opts.planted_bug == PlantedBug::TrustTornSuper));
  const SuperInfo& s = choice.info;
  // A copy that cannot be read may hold a newer generation: writing would
  // overwrite it and reuse its blocks, turning a read error into a rollback.
  for (int slot = 0; slot < 2; slot++)
    if (choice.reports[slot].state == SlotState::Unreadable && !opts.read_only)
      return Error::io(EIO, "superblock slot " + std::to_string(slot) +
                                " cannot be read (" + choice.reports[slot].detail +
                                "); open read-only, or let fsck.plyfs -y rewrite it");
  if (s.incompat & ~kIncompatKnown)
    return Error::io(EOPNOTSUPP, "the filesystem uses incompatible features this build lacks");
  if ((s.ro_compat & ~kRoCompatKnown) && !opts.read_only)
    return Error::io(EROFS, "the filesystem uses features this build can only read");
  if (dev.logical_sector_size() > s.block_size)
    return Error::invalid("the device's sector size is larger than the filesystem's block size");

  std::unique_ptr<Volume> v(new Volume(dev, std::move(opts)));
  v->info_ = s;
  v->recovery_ = choice;
  v->cache_ = std::make_unique<BlockCache>(dev, s.block_size, v->opts_.cache_bytes);
  v->space_ = std::make_unique<SpaceManager>(
      *v->cache_, s.fs_id, space_geometry(s),
      s.space_tree, SpaceCounters{s.used_blocks, s.meta_blocks, s.data_blocks});
  v->root_tree_ = std::make_unique<BTree>(
      *v->cache_, s.fs_id, TreeConfig{kRootTreeId, false, Generation{0}, {}}, s.root_tree);
  if (v->opts_.planted_bug == PlantedBug::ReuseFreedBlock) v->space_->plant_early_reuse();
  v->space_->set_discard(v->opts_.discard && !v->opts_.read_only);
  // Read both roots now, so that a damaged root shows at open, not later.
  (void)PLY_TRY(v->root_tree_->contains(Key{}));
  (void)PLY_TRY(v->space_->tree().contains(Key{}));
  v->open_gen_ = next(s.generation).v;
  v->durable_gen_ = s.generation;
  v->total_blocks_ = s.total_blocks;
  v->next_tree_id_ = s.next_tree_id;
  v->next_inode_ = s.next_inode;
  if (!v->opts_.read_only && (v->opts_.commit_interval_ms || v->opts_.dirty_limit_bytes))
    v->committer_ = std::thread([p = v.get()] { p->committer_loop(); });
  return v;
}

Volume::~Volume() {
  {
    std::lock_guard lk(cmt_mu_);
    cmt_stop_ = true;
  }
  cmt_cv_.notify_all();
  if (committer_.joinable()) committer_.join();
}

Result<void> Volume::close() {
  {
    std::lock_guard lk(cmt_mu_);
    cmt_stop_ = true;
  }
  cmt_cv_.notify_all();
  if (committer_.joinable()) committer_.join();
  if (opts_.read_only) return ok();
  PLY_CHECK(writable());
  (void)PLY_TRY(commit());
  return ok();
}

Generation Volume::durable_generation() const {
  std::lock_guard lk(state_mu_);
  return durable_gen_;
}
Generation Volume::open_generation() const {
  return Generation{open_gen_.load(std::memory_order_acquire)};
}
SuperInfo Volume::super() const {
  std::lock_guard lk(state_mu_);
  return info_;
}
std::optional<Error> Volume::failure() const {
  std::lock_guard lk(state_mu_);
  return failure_;
}

void Volume::fail(const Error& e) {
  std::lock_guard lk(state_mu_);
  if (!failure_) failure_ = e;
}

Result<void> Volume::data_range(BlockNo start, size_t bytes) const {
  const uint64_t bs = info_.block_size;
  if (bytes % bs) return Error::invalid("data I/O of a partial block");
  const uint64_t n = bytes / bs;
  const uint64_t total = total_blocks();
  if (start.v < info_.first_block || start.v > total || n > total - start.v)
    return Error::corrupt(start.v, "data extent outside the filesystem");
  return ok();
}

Result<void> Volume::write_data(BlockNo start, std::span<const std::byte> data) {
  PLY_CHECK(writable());
  PLY_CHECK(data_range(start, data.size()));
  auto r = dev_.write(start.v * info_.block_size, data);
  if (!r) fail(r.error());
  return r;
}

Result<void> Volume::read_data(BlockNo start, std::span<std::byte> out) {
  PLY_CHECK(data_range(start, out.size()));
  return dev_.read(start.v * info_.block_size, out);
}

Result<void> Volume::read_data_uncached(BlockNo start, std::span<std::byte> out) {
  PLY_CHECK(data_range(start, out.size()));
  return dev_.read_uncached(start.v * info_.block_size, out);
}

Result<void> Volume::verify_node_on_device(BlockNo b, Generation gen, int level) {
  PLY_CHECK(data_range(b, info_.block_size));
  std::vector<std::byte> buf(info_.block_size);
  PLY_CHECK(dev_.read_uncached(b.v * info_.block_size, buf));  // the medium's copy, not a cache's
  return verify_node(buf, b, info_.fs_id, gen, level);
}

Result<void> Volume::writable() const {
  if (opts_.read_only) return Error::io(EROFS, "the volume is open read-only");
  std::lock_guard lk(state_mu_);
  if (failure_)
    return Error::io(EROFS, "the volume turned read-only after an error: " + failure_->message());
  return ok();
}

TreeConfig Volume::config_for(const TreeInfo& info) const {
  auto it = opts_.kinds.find(info.kind);
  return TreeConfig{info.id, true, info.last_shared,
                    it == opts_.kinds.end() ? ValueRefs{} : it->second};
}

Result<Volume::Slot*> Volume::slot(TreeId id) {
  {
    std::shared_lock lk(trees_mu_);
    auto it = trees_.find(id.v);
    if (it != trees_.end()) {
      if (it->second->dropped)
        return Error::io(ENOENT, "tree " + std::to_string(id.v) + " was dropped");
      return it->second.get();
    }
  }
  std::lock_guard lk(trees_mu_);
  auto it = trees_.find(id.v);
  if (it != trees_.end()) {
    if (it->second->dropped) return Error::io(ENOENT, "tree " + std::to_string(id.v) + " was dropped");
    return it->second.get();
  }
  if (id.v < kFirstTreeId) return Error::invalid("tree id " + std::to_string(id.v) + " is reserved");
  auto v = PLY_TRY(root_tree_->get(Key{id.v, 0}));
  if (!v) return Error::io(ENOENT, "no tree " + std::to_string(id.v));
  TreeInfo info = PLY_TRY(decode_root_record(id, *v, info_, open_generation()));
  auto s = std::make_unique<Slot>();
  s->id = id.v;
  s->info = info;
  s->tree = std::make_unique<BTree>(*cache_, info_.fs_id, config_for(info), info.root);
  Slot* p = s.get();
  trees_[id.v] = std::move(s);
  return p;
}

// ------------------------------------------------------------------ commit

Result<void> Volume::freeze(Generation g, std::vector<BlockCache::Ref>& dirty, SuperInfo& sb) {
  MutCtx m{g, space_->unshared(g)};
  {
    std::lock_guard lk(trees_mu_);
    std::vector<uint64_t> ids;
    {
      std::lock_guard tl(touched_mu_);
      ids.swap(touched_);
    }
    std::sort(ids.begin(), ids.end());  // the root tree changes in key order
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (uint64_t id : ids) {
      auto it = trees_.find(id);
      if (it == trees_.end()) continue;
      Slot& s = *it->second;
      const Key k{id, 0};
      if (s.dropped) {
        (void)PLY_TRY(root_tree_->erase(m, k));
        trees_.erase(it);
        continue;
      }
      if (s.dirty) {
        s.info.root = s.tree->root();
        PLY_CHECK(root_tree_->put(m, k, encode_root_record(s.info)));
        s.dirty = false;
      }
    }
  }
  PLY_CHECK(space_->fold(g));
  dirty = cache_->dirty_blocks();
  for (auto& b : dirty) seal_node(b->bytes());
  {
    std::lock_guard lk(state_mu_);
    sb = info_;
  }
  sb.generation = g;
  // A grow since the last commit (under commit_mu_, as this freeze).
  sb.total_blocks = total_blocks();
  sb.reserve_blocks = space_->geometry().reserve_blocks;
  sb.root_tree = root_tree_->root();
  sb.space_tree = space_->root();
  const SpaceCounters c = space_->counters();
  sb.used_blocks = c.used_blocks;
  sb.meta_blocks = c.meta_blocks;
  sb.data_blocks = c.data_blocks;
  sb.next_tree_id = next_tree_id_.load();
  sb.next_inode = next_inode_.load();
  // A Txn of this generation that added a bit ended before the gate closed.
  sb.incompat |= incompat_added_.load();
  sb.ro_compat |= ro_compat_added_.load();
  sb.commit_time_ns = now_ns();
  return ok();
}

Result<void> Volume::write_generation(const std::vector<BlockCache::Ref>& dirty,
                                      const SuperInfo& sb) {
  return write_generation_to(dev_, *cache_, dirty, sb, opts_.planted_bug);
}

Result<Generation> Volume::commit_for(CommitStats::Cause cause) {
  if (tl_group == this) return Error::io(EDEADLK, "commit inside a group of operations");
  std::lock_guard cl(commit_mu_);
  PLY_CHECK(writable());
  if (!changed_.load()) return durable_generation();

  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  gate_.close();
  const auto t1 = Clock::now();
  const Generation g = open_generation();
  changed_ = false;
  std::vector<BlockCache::Ref> dirty;
  SuperInfo sb;
  auto fr = freeze(g, dirty, sb);
  if (!fr) {
    fail(fr.error());
    gate_.open();
    return fr.error();
  }
  // Planted bug (A6): what g freed is still reachable from g - 1, which
  // recovery selects until g is durable.
  std::vector<BlockRange> early;
  if (opts_.planted_bug == PlantedBug::DiscardEarly) early = space_->freed_in(g);
  open_gen_.store(next(g).v, std::memory_order_release);
  gate_.open();  // generation g+1 runs while g is written
  const auto t2 = Clock::now();

  for (const auto& r : early) (void)dev_.discard(r.start * info_.block_size, r.nblocks * info_.block_size);
  auto wr = write_generation(dirty, sb);
  if (!wr) {
    fail(wr.error());  // C5
    return wr.error();
  }
  space_->durable(g);
  discard_released();
  cache_->mark_clean(dirty);
  {
    std::lock_guard lk(state_mu_);
    info_ = sb;
    durable_gen_ = g;
  }
  if (opts_.on_commit) {
    auto us = [](Clock::time_point a, Clock::time_point b) {
      return uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(b - a).count());
    };
    CommitStats st;
    st.gen = g;
    st.cause = cause;
    st.wait_us = us(t0, t1);
    st.frozen_us = us(t1, t2);
    st.write_us = us(t2, Clock::now());
    st.blocks = dirty.size();
    opts_.on_commit(st);
  }
  return g;
}

// What durable() released, told to the device before it is handed out
// again (A6): joined into runs, one discard each. A discard that fails
// loses nothing (D7: the blocks are free), so the blocks go back anyway.
void Volume::discard_released() {
  const auto ranges = space_->take_discards();
  if (ranges.empty()) return;
  const uint64_t bs = info_.block_size;
  for (size_t i = 0; i < ranges.size();) {
    uint64_t start = ranges[i].start, end = start + ranges[i].nblocks;
    for (i++; i < ranges.size() && ranges[i].start == end; i++) end += ranges[i].nblocks;
    if (dev_.discard(start * bs, (end - start) * bs)) discarded_bytes_ += (end - start) * bs;
  }
  space_->released(ranges);
}

bool Volume::reclaim() {
  if (tl_group == this || opts_.read_only || failure()) return false;
  const SpaceStats st = space_->stats();
  if (st.pending_free == 0 && st.discarding == 0) return false;
  return bool(commit());
}

Result<std::vector<Volume::DeviceUse>> Volume::device_usage() {
  const SuperInfo sb = super();
  std::vector<DeviceUse> out(std::max<size_t>(1, sb.devices.size()));
  for (const auto& e : PLY_TRY(space_->extents_from(sb.first_block))) {
    size_t i = 0;
    while (i + 1 < sb.devices.size() && sb.devices[i + 1].first_block <= e.start) i++;
    out[i].used_blocks += e.nblocks;
    (e.kind == ExtentKind::Meta ? out[i].meta_blocks : out[i].data_blocks) += e.nblocks;
  }
  return out;
}

Result<Generation> Volume::grow(uint64_t total_blocks) {
  PLY_CHECK(writable());
  if (is_multi_device(info_))
    return Error::io(EOPNOTSUPP, "a multi-device volume cannot be resized (format.md#multi-device)");
  const uint64_t bs = info_.block_size;
  {
    std::lock_guard cl(commit_mu_);  // a freeze sees the old size or the new one, whole
    const uint64_t now = total_blocks_.load();
    if (total_blocks < now) return Error::invalid("grow() cannot shrink: shrink() moves blocks first");
    if (total_blocks > dev_.size_bytes() / bs)
      return Error::invalid("the device holds " + std::to_string(dev_.size_bytes()) + " bytes, not " +
                            std::to_string(total_blocks * bs));
    if (total_blocks == now) return durable_generation();
    PLY_CHECK(space_->grow(total_blocks, reserve_for(total_blocks - info_.first_block)));
    total_blocks_.store(total_blocks, std::memory_order_release);
    changed_ = true;
  }
  return commit();
}

Result<Generation> Volume::resize(std::optional<uint64_t> bytes,
                                  const std::function<void(uint64_t, uint64_t)>& progress) {
  PLY_CHECK(writable());
  if (is_multi_device(info_))
    return Error::io(EOPNOTSUPP, "a multi-device volume cannot be resized (format.md#multi-device)");
  std::lock_guard rl(resize_mu_);
  const uint64_t bs = info_.block_size;
  if (bytes && *bytes / bs < total_blocks()) {
    const Generation g = PLY_TRY(shrink(*bytes / bs, progress));
    // Both superblock slots now describe the new end: nothing recovery
    // could select reaches past it (format.md#relocation).
    (void)PLY_TRY(dev_.truncate(*bytes / bs * bs));
    return g;
  }
  const uint64_t dev_bytes = PLY_TRY(dev_.resize(bytes.value_or(0)));
  return grow((bytes ? std::min(*bytes, dev_bytes) : dev_bytes) / bs);
}

Result<uint64_t> Volume::trim(uint64_t start, uint64_t len, uint64_t min_bytes,
                              const std::function<void(uint64_t, double)>& progress) {
  PLY_CHECK(writable());
  const uint64_t bs = info_.block_size;
  // Whole blocks inside the range; a length past the end means "to the end".
  const uint64_t first = start / bs + (start % bs != 0);
  const uint64_t end = len > UINT64_MAX - start ? UINT64_MAX / bs : (start + len) / bs;
  const BlockRange within{first, end > first ? end - first : 0};
  const uint64_t n = PLY_TRY(space_->trim(
      within, (min_bytes + bs - 1) / bs, [&](BlockRange r) { return dev_.discard(r.start * bs, r.nblocks * bs); },
      [&](uint64_t done, double f) {
        if (progress) progress(done * bs, f);
      }));
  discarded_bytes_ += n * bs;
  return n * bs;
}

void Volume::committer_loop() {
  std::unique_lock lk(cmt_mu_);
  while (!cmt_stop_) {
    auto wake = [&] { return cmt_stop_ || cmt_kick_; };
    if (opts_.commit_interval_ms)
      cmt_cv_.wait_for(lk, std::chrono::milliseconds(opts_.commit_interval_ms), wake);
    else
      cmt_cv_.wait(lk, wake);
    if (cmt_stop_) break;
    const bool kicked = std::exchange(cmt_kick_, false);
    lk.unlock();
    if (changed_.load() && !failure())  // an error stays in failure()
      (void)commit_for(kicked ? CommitStats::Cause::Dirty : CommitStats::Cause::Periodic);
    lk.lock();
  }
}

// -------------------------------------------------------------------- Txn

Result<BlockNo> Volume::Txn::State::alloc_node() {
  if (reserved == 0) {  // every tree operation tops up first; this is a fallback
    PLY_CHECK(v->space_->reserve(1, for_delete));
    reserved = 1;
  }
  reserved--;
  v->allocated_.fetch_add(1, std::memory_order_relaxed);
  return v->space_->alloc(1, ExtentKind::Meta, true);
}
Result<uint32_t> Volume::Txn::State::refcount(BlockNo b) { return v->space_->refcount(b); }
Result<void> Volume::Txn::State::inc_ref(BlockNo b) { return v->space_->inc_ref(b); }
Result<NodeSpace::Freed> Volume::Txn::State::dec_ref(BlockNo b) {
  v->released_.fetch_add(1, std::memory_order_relaxed);
  return v->space_->dec_ref(b, gen);
}

// The space changes one generation may queue: their fold must fit in half
// the reserve (A5). A space-tree leaf holds at least 25 items (T4), and a
// fold shadows each leaf once; 16 changes per block leaves ample margin.
uint64_t Volume::change_budget(uint64_t reserve_blocks) {
  return std::max<uint64_t>(64, (reserve_blocks / 2 > 16 ? reserve_blocks / 2 - 16 : 0) * 16);
}

Volume::Group::Group(Volume& v) {
  if (tl_group) return;  // nested, or another volume's: Txns behave as usual
  v.gate_.enter();
  tl_group = &v;
  v_ = &v;
}

Volume::Group::~Group() {
  if (!v_) return;
  tl_group = nullptr;
  v_->gate_.leave();
  if (v_->opts_.commit_each_txn) (void)v_->commit();  // an error fails the volume (C5)
}

Result<Volume::Txn> Volume::begin(TxnOptions o) {
  // Inside this thread's group the gate is already held: entering again
  // could wait for a commit that waits for the group.
  const bool grouped = tl_group == this;
  if (!grouped && !opts_.read_only && space_->pending_changes() > change_budget(info_.reserve_blocks) &&
      !failure())
    (void)PLY_TRY(commit_for(CommitStats::Cause::Budget));
  if (!grouped) gate_.enter();
  Txn t(this, open_generation(), o.for_delete, grouped);
  if (o.reserve_blocks) PLY_CHECK(t.reserve(o.reserve_blocks));
  return t;
}

Volume::Txn::Txn(Volume* v, Generation gen, bool for_delete, bool grouped) {
  s_.v = v;
  s_.gen = gen;
  s_.for_delete = for_delete;
  s_.grouped = grouped;
}
Volume::Txn::Txn(Txn&& o) noexcept {
  s_.v = std::exchange(o.s_.v, nullptr);
  s_.gen = o.s_.gen;
  s_.for_delete = o.s_.for_delete;
  s_.grouped = o.s_.grouped;
  s_.reserved = std::exchange(o.s_.reserved, 0);
  s_.epoch = o.s_.epoch;
  s_.place = o.s_.place;
}

Volume::Txn::~Txn() {
  if (!s_.v) return;
  Volume* v = s_.v;
  if (s_.reserved) v->space_->unreserve(s_.reserved);
  if (s_.grouped) return;  // the group leaves the gate and commits
  v->gate_.leave();
  if (v->opts_.commit_each_txn) {
    // An error fails the volume (C5); the next operation reports it.
    (void)v->commit();
    return;
  }
  if (v->opts_.dirty_limit_bytes && v->cache_->dirty_bytes() >= v->opts_.dirty_limit_bytes) {
    std::lock_guard lk(v->cmt_mu_);
    v->cmt_kick_ = true;
    v->cmt_cv_.notify_all();
  }
}

Generation Volume::Txn::gen() const { return s_.gen; }

Result<void> Volume::Txn::reserve(uint64_t nblocks) {
  PLY_CHECK(s_.v->writable());
  PLY_CHECK(s_.v->space_->reserve(nblocks, s_.for_delete));
  s_.reserved += nblocks;
  return ok();
}

Result<void> Volume::Txn::top_up(uint64_t nblocks) {
  if (s_.reserved >= nblocks) return ok();
  PLY_CHECK(s_.v->space_->reserve(nblocks - s_.reserved, s_.for_delete));
  s_.reserved = nblocks;
  return ok();
}

void Volume::touch(Slot& s) {
  s.dirty = true;
  std::lock_guard lk(touched_mu_);
  touched_.push_back(s.id);
}

// A change that failed after it started may have left a tree half changed in
// memory: the volume must never commit that (C5). Everything that can refuse
// a change without side effects (reservations, value sizes, kinds) is
// checked before the change starts, so any error here fails the volume.
Result<void> Volume::Txn::mutated(const Result<void>& r, Slot* s) {
  if (!r) {
    s_.v->fail(r.error());
    return r.error();
  }
  if (s && !s->dirty) s_.v->touch(*s);  // s->mu is held exclusively
  s_.v->changed_ = true;
  s_.v->mutations_.fetch_add(1, std::memory_order_acq_rel);
  return ok();
}

static Result<void> check_value(const Volume& v, std::span<const std::byte> val) {
  if (val.size() > BTree::max_value_len(v.block_size()))
    return Error::invalid("value of " + std::to_string(val.size()) + " bytes exceeds the " +
                          std::to_string(BTree::max_value_len(v.block_size())) + "-byte limit");
  return ok();
}

static Result<void> check_kind(const VolumeOptions& o, const TreeInfo& info) {
  if (info.kind != kKindPlain && !o.kinds.count(info.kind))
    return Error::io(EOPNOTSUPP, "tree " + std::to_string(info.id.v) + " is of kind " +
                                     std::to_string(info.kind) +
                                     ", which this program cannot change safely");
  return ok();
}

Result<TreeId> Volume::Txn::create_tree(uint8_t kind) {
  Volume* v = s_.v;
  PLY_CHECK(v->writable());
  if (kind == 0) return Error::invalid("tree kind 0 is not valid");
  PLY_CHECK(top_up(1));
  const TreeId id{v->next_tree_id_++};
  // A damaged next_tree_id must not make two trees share an id.
  if (PLY_TRY(v->root_tree_->contains(Key{id.v, 0})))
    return Error::corrupt(Error::kNoBlock, "tree id " + std::to_string(id.v) +
                                               " is already in use: next_tree_id is damaged");
  MutCtx m{s_.gen, s_};
  auto root = BTree::create(*v->cache_, v->info_.fs_id, id, m);
  if (!root) return mutated(root.error(), nullptr).error();
  auto s = std::make_unique<Slot>();
  s->id = id.v;
  s->info = TreeInfo{id, kind, *root, s_.gen, Generation{0}, TreeId{0}};
  s->tree = std::make_unique<BTree>(*v->cache_, v->info_.fs_id, v->config_for(s->info), *root);
  v->touch(*s);
  {
    std::lock_guard lk(v->trees_mu_);
    v->trees_[id.v] = std::move(s);
  }
  s_.epoch = ++v->tree_epoch_;
  PLY_CHECK(mutated(ok(), nullptr));
  return id;
}

Result<TreeId> Volume::Txn::clone_tree(TreeId src) {
  Volume* v = s_.v;
  PLY_CHECK(v->writable());
  Slot* s = PLY_TRY(v->slot(src));
  TreeInfo info;
  {
    std::unique_lock lk(s->mu);
    PLY_CHECK(check_kind(v->opts_, s->info));
    PLY_CHECK(mutated(BTree::clone_root(s_, s->tree->root()), s));
    // Both trees may now share every node written up to this generation.
    s->tree->set_last_shared(s_.gen);
    s->info.last_shared = s_.gen;
    info = s->info;
    info.root = s->tree->root();
  }
  info.id = TreeId{v->next_tree_id_++};
  info.created = s_.gen;
  info.cloned_from = src;
  auto c = std::make_unique<Slot>();
  c->id = info.id.v;
  c->info = info;
  c->tree = std::make_unique<BTree>(*v->cache_, v->info_.fs_id, v->config_for(info), info.root);
  v->touch(*c);
  std::lock_guard lk(v->trees_mu_);
  v->trees_[info.id.v] = std::move(c);
  s_.epoch = ++v->tree_epoch_;
  return info.id;
}

Result<void> Volume::Txn::drop_tree(TreeId id, const BTree::DropProgress& progress) {
  Volume* v = s_.v;
  PLY_CHECK(v->writable());
  Slot* s = PLY_TRY(v->slot(id));
  std::unique_lock lk(s->mu);
  PLY_CHECK(check_kind(v->opts_, s->info));
  MutCtx m{s_.gen, s_};
  PLY_CHECK(mutated(BTree::drop(*v->cache_, v->info_.fs_id, s->tree->config(), s->tree->root(), m, progress),
                    s));
  s->dropped = true;
  s_.epoch = ++v->tree_epoch_;
  return ok();
}

Result<void> Volume::Txn::reset_tree(TreeId dst, TreeId src, const BTree::DropProgress& progress) {
  Volume* v = s_.v;
  PLY_CHECK(v->writable());
  if (dst == src) return Error::invalid("a tree cannot take its own content");
  Slot* d = PLY_TRY(v->slot(dst));
  Slot* s = PLY_TRY(v->slot(src));
  // Two slot locks: always the lower id first.
  std::unique_lock first(dst.v < src.v ? d->mu : s->mu);
  std::unique_lock second(dst.v < src.v ? s->mu : d->mu);
  PLY_CHECK(check_kind(v->opts_, d->info));
  PLY_CHECK(check_kind(v->opts_, s->info));
  if (d->info.kind != s->info.kind)
    return Error::invalid("tree " + std::to_string(dst.v) + " cannot take the content of a tree of another kind");
  // As clone_tree: dst's new root is one more reference to src's, and both
  // may share every node written up to this generation (format.md#btree-cow).
  PLY_CHECK(mutated(BTree::clone_root(s_, s->tree->root()), s));
  s->tree->set_last_shared(s_.gen);
  s->info.last_shared = s_.gen;
  // Then dst's reference on its old root goes, as in drop_tree.
  MutCtx m{s_.gen, s_};
  PLY_CHECK(mutated(BTree::drop(*v->cache_, v->info_.fs_id, d->tree->config(), d->tree->root(), m, progress),
                    d));
  d->info.last_shared = s_.gen;
  d->info.root = s->tree->root();
  d->tree = std::make_unique<BTree>(*v->cache_, v->info_.fs_id, v->config_for(d->info), d->info.root);
  s_.epoch = ++v->tree_epoch_;
  return ok();
}

Result<TreeInfo> Volume::Txn::tree_info(TreeId id) {
  Slot* s = PLY_TRY(s_.v->slot(id));
  std::shared_lock lk(s->mu);
  TreeInfo info = s->info;
  info.root = s->tree->root();
  return info;
}

Result<std::vector<TreeInfo>> Volume::Txn::list_trees() {
  Volume* v = s_.v;
  std::vector<uint64_t> ids;
  PLY_CHECK(v->root_tree_->scan(Key{kFirstTreeId, 0}, Key::max(),
                                [&](Key k, std::span<const std::byte>) {
                                  if (k.lo == 0) ids.push_back(k.hi);
                                  return true;
                                }));
  {
    std::lock_guard lk(v->trees_mu_);
    for (const auto& [id, s] : v->trees_) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::vector<TreeInfo> out;
  for (uint64_t id : ids) {
    auto info = tree_info(TreeId{id});
    if (info) out.push_back(*info);
    else if (info.error().code != ENOENT) return info.error();
  }
  return out;
}

Result<std::optional<std::vector<std::byte>>> Volume::Txn::get(TreeId t, Key k) {
  Slot* s = PLY_TRY(s_.v->slot(t));
  std::shared_lock lk(s->mu);
  return s->tree->get(k);
}

Result<void> Volume::Txn::scan(TreeId t, Key from, Key to,
                               const std::function<bool(Key, std::span<const std::byte>)>& fn) {
  Slot* s = PLY_TRY(s_.v->slot(t));
  std::shared_lock lk(s->mu);
  return s->tree->scan(from, to, fn);
}

Result<void> Volume::Txn::diff(TreeId a, TreeId b, const BTree::DiffFn& fn,
                               uint64_t* nodes_read, const BTree::DiffProgress& progress) {
  Slot* sa = PLY_TRY(s_.v->slot(a));
  Slot* sb = PLY_TRY(s_.v->slot(b));
  // Shared locks in tree-id order: with writers queued on both trees, two
  // diffs taking them in opposite orders could otherwise wait on each other.
  // The same tree twice is locked once (a shared_mutex is not recursive).
  std::shared_lock first(a.v <= b.v ? sa->mu : sb->mu);
  std::shared_lock<std::shared_mutex> second;
  if (a.v != b.v) second = std::shared_lock(a.v < b.v ? sb->mu : sa->mu);
  return BTree::diff(*sa->tree, *sb->tree, fn, nodes_read, progress);
}

namespace {
// The counts a drop would leave, over the space's own (BTree::exclusive):
// dec_ref only notes the decrement.
struct DryCounts final : NodeSpace {
  SpaceManager& space;
  std::unordered_map<uint64_t, uint32_t> taken;
  explicit DryCounts(SpaceManager& s) : space(s) {}
  Result<BlockNo> alloc_node() override { return Error::invalid("a dry drop allocates nothing"); }
  Result<uint32_t> refcount(BlockNo b) override {
    uint32_t r = PLY_TRY(space.refcount(b));
    auto it = taken.find(b.v);
    return it == taken.end() ? r : r - it->second;
  }
  Result<void> inc_ref(BlockNo) override { return Error::invalid("a dry drop takes no reference"); }
  Result<Freed> dec_ref(BlockNo b) override {
    uint32_t r = PLY_TRY(refcount(b));
    // A count that a drop would take below zero is damage (T6, A3).
    if (r == 0) return Error::corrupt(b.v, "extent reached by more references than its count");
    taken[b.v]++;
    return r == 1 ? Freed::Deferred : Freed::No;
  }
};
}  // namespace

Result<BTree::DropStats> Volume::Txn::exclusive(TreeId id) {
  Volume* v = s_.v;
  Slot* s = PLY_TRY(v->slot(id));
  std::shared_lock lk(s->mu);
  DryCounts counts(*v->space_);
  return BTree::exclusive(*v->cache_, v->info_.fs_id, s->tree->config(), s->tree->root(), counts);
}

Result<uint64_t> Volume::Txn::count_nodes(TreeId id, BTree::CountMemo& memo) {
  Volume* v = s_.v;
  Slot* s = PLY_TRY(v->slot(id));
  std::shared_lock lk(s->mu);
  return BTree::count_nodes(*v->cache_, v->info_.fs_id, s->tree->root(), s_.gen, memo);
}

Result<void> Volume::Txn::walk_nodes(TreeId id, std::unordered_set<uint64_t>& seen, const BTree::NodeFn& fn) {
  Slot* s = PLY_TRY(s_.v->slot(id));
  std::shared_lock lk(s->mu);
  return BTree::walk_nodes(*s_.v->cache_, s_.v->info_.fs_id, s->tree->root(), seen, fn);
}

Result<void> Volume::Txn::walk_system_nodes(std::unordered_set<uint64_t>& seen, const BTree::NodeFn& fn) {
  // Both change only while a generation is frozen, which this Txn holds off.
  PLY_CHECK(BTree::walk_nodes(*s_.v->cache_, s_.v->info_.fs_id, s_.v->root_tree_->root(), seen, fn));
  return BTree::walk_nodes(*s_.v->cache_, s_.v->info_.fs_id, s_.v->space_->root(), seen, fn);
}

Result<void> Volume::Txn::reach(TreeId id, const BTree::ReachFn& fn) {
  Volume* v = s_.v;
  Slot* s = PLY_TRY(v->slot(id));
  std::shared_lock lk(s->mu);
  return BTree::reach(*v->cache_, v->info_.fs_id, s->tree->config(), s->tree->root(), fn);
}

Result<void> Volume::Txn::put(TreeId t, Key k, std::span<const std::byte> val) {
  PLY_CHECK(s_.v->writable());
  PLY_CHECK(check_value(*s_.v, val));
  Slot* s = PLY_TRY(s_.v->slot(t));
  std::unique_lock lk(s->mu);
  PLY_CHECK(check_kind(s_.v->opts_, s->info));
  PLY_CHECK(top_up(s->tree->max_new_nodes()));
  MutCtx m{s_.gen, s_};
  return mutated(s->tree->put(m, k, val), s);
}

Result<uint64_t> Volume::Txn::graft(TreeId dst, TreeId src, Key lo, Key hi) {
  Volume* v = s_.v;
  PLY_CHECK(v->writable());
  if (dst == src) return Error::invalid("graft of a tree into itself");
  Slot* sd = PLY_TRY(v->slot(dst));
  Slot* ss = PLY_TRY(v->slot(src));
  // Both exclusive (the source's last_shared changes), in tree-id order.
  std::unique_lock first(dst.v < src.v ? sd->mu : ss->mu);
  std::unique_lock second(dst.v < src.v ? ss->mu : sd->mu);
  PLY_CHECK(check_kind(v->opts_, sd->info));
  PLY_CHECK(check_kind(v->opts_, ss->info));
  if (sd->info.kind != ss->info.kind) return Error::invalid("graft between trees of different kinds");
  {
    auto c = sd->tree->lower_bound(lo);
    if (!c) return c.error();
    if (c->valid() && c->key() <= hi) return Error::io(EEXIST, "graft target range is not empty");
  }
  auto plan = BTree::plan_graft(*ss->tree, lo, hi);
  if (!plan) return plan.error();
  PLY_CHECK(top_up(plan->max_new_nodes(*sd->tree)));
  MutCtx m{s_.gen, s_};
  auto shared = sd->tree->graft(m, *plan);
  if (!shared) return mutated(shared.error(), sd).error();
  sd->info.last_shared = sd->tree->config().last_shared;
  if (*shared) {
    // The source now shares those leaves too: its changes to them must
    // look their counts up, from this generation's commit on.
    const Generation g = std::max(ss->tree->config().last_shared, plan->newest);
    ss->tree->set_last_shared(g);
    ss->info.last_shared = g;
    PLY_CHECK(mutated(ok(), ss));
  }
  PLY_CHECK(mutated(ok(), sd));
  return *shared;
}

Result<bool> Volume::Txn::insert(TreeId t, Key k, std::span<const std::byte> val) {
  PLY_CHECK(s_.v->writable());
  PLY_CHECK(check_value(*s_.v, val));
  Slot* s = PLY_TRY(s_.v->slot(t));
  std::unique_lock lk(s->mu);
  PLY_CHECK(check_kind(s_.v->opts_, s->info));
  PLY_CHECK(top_up(s->tree->max_new_nodes()));
  MutCtx m{s_.gen, s_};
  auto r = s->tree->insert(m, k, val);
  if (!r) return mutated(r.error(), s).error();
  if (*r) PLY_CHECK(mutated(ok(), s));
  return *r;
}

Result<bool> Volume::Txn::erase(TreeId t, Key k) {
  PLY_CHECK(s_.v->writable());
  Slot* s = PLY_TRY(s_.v->slot(t));
  std::unique_lock lk(s->mu);
  PLY_CHECK(check_kind(s_.v->opts_, s->info));
  PLY_CHECK(top_up(s->tree->max_new_nodes()));
  MutCtx m{s_.gen, s_};
  auto r = s->tree->erase(m, k);
  if (!r) return mutated(r.error(), s).error();
  if (*r) PLY_CHECK(mutated(ok(), s));
  return *r;
}

int Volume::class_of(BlockNo b) const { return space_->class_of(b.v); }
int Volume::metadata_class() const { return space_->metadata_class(); }

Result<BlockNo> Volume::Txn::alloc_extent(uint64_t nblocks) {
  Volume* v = s_.v;
  PLY_CHECK(v->writable());
  PLY_CHECK(top_up(nblocks));
  // Nothing has changed yet when this fails (fragmented free space): the
  // caller may retry with a shorter extent.
  BlockNo b = PLY_TRY(v->space_->alloc(nblocks, ExtentKind::Data, true, &s_.place));
  s_.reserved -= nblocks;
  v->changed_ = true;
  v->allocated_.fetch_add(nblocks, std::memory_order_relaxed);
  return b;
}

Result<void> Volume::Txn::inc_extent(BlockNo start) {
  PLY_CHECK(s_.v->writable());
  return mutated(s_.v->space_->inc_ref(start), nullptr);
}

Result<uint32_t> Volume::Txn::extent_refs(BlockNo start) { return s_.v->space_->refcount(start); }

Result<void> Volume::Txn::dec_extent(BlockNo start) {
  PLY_CHECK(s_.v->writable());
  s_.v->released_.fetch_add(1, std::memory_order_relaxed);
  auto r = s_.v->space_->dec_ref(start, s_.gen);
  if (!r) return mutated(r.error(), nullptr);
  return mutated(ok(), nullptr);
}

uint64_t Volume::Txn::take_inode_number() {
  s_.v->changed_ = true;
  return s_.v->next_inode_++;
}

void Volume::Txn::add_incompat(uint64_t bits) {
  if ((s_.v->incompat() & bits) == bits) return;
  s_.v->incompat_added_.fetch_or(bits);
  s_.v->changed_ = true;
}

void Volume::Txn::add_ro_compat(uint64_t bits) {
  if ((s_.v->ro_compat() & bits) == bits) return;
  s_.v->ro_compat_added_.fetch_or(bits);
  s_.v->changed_ = true;
}

uint64_t Volume::ro_compat() const {
  std::lock_guard lk(state_mu_);
  return info_.ro_compat | ro_compat_added_.load();
}

uint64_t Volume::incompat() const {
  std::lock_guard lk(state_mu_);
  return info_.incompat | incompat_added_.load();
}

void Volume::Txn::advance_inode_numbers(uint64_t n) {
  uint64_t cur = s_.v->next_inode_.load();
  while (cur < n && !s_.v->next_inode_.compare_exchange_weak(cur, n)) {
  }
  s_.v->changed_ = true;
}

uint64_t Volume::Txn::next_inode_number() const { return s_.v->next_inode_.load(); }

}  // namespace plyfs
