// Branch quotas (quota.h, format.md#quotas).
#include "fs/quota.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "fs/items.h"

namespace plyfs {

namespace {

struct QuotaTable {
  struct Tree {
    bool loaded = false;                       // the limits were read from FsInfo
    uint64_t lim_ref = 0, lim_excl = 0;        // bytes; 0: none
    // The last exact figures and the counts they were taken at.
    bool exact = false;
    uint64_t ref = 0, excl = 0;                // bytes
    uint64_t allocated = 0, released = 0, epoch = 0, mutations = 0;
    Generation gen;
    uint64_t shared = 0;                       // bytes taken by reference since
    // Bytes charged by operations running at the exact count: what they
    // allocated before it but had not linked yet neither the count nor the
    // allocations since see, so it stays in the bound until the next count.
    uint64_t carried = 0;
    bool over = false;                         // the exact figures said no
    uint64_t inflight = 0;                     // bytes charged by running operations
  };
  std::mutex mu;
  std::condition_variable ended;  // an operation's charge ended
  std::unordered_map<uint64_t, Tree> trees;
};

Error over_quota(const char* which, uint64_t figure, uint64_t limit) {
  return Error::io(EDQUOT, std::string("the branch's ") + which + " bytes (" + std::to_string(figure) +
                               ") would pass its quota (" + std::to_string(limit) + ")");
}

// EDQUOT if `ref`/`excl` bytes plus `bytes` pass a limit.
Result<void> fits(const QuotaTable::Tree& q, uint64_t ref, uint64_t excl, uint64_t bytes) {
  if (q.lim_ref && ref + bytes > q.lim_ref) return over_quota("referenced", ref, q.lim_ref);
  if (q.lim_excl && excl + bytes > q.lim_excl) return over_quota("exclusive", excl, q.lim_excl);
  return ok();
}

}  // namespace

// Reads tree `tree`'s limits from its FsInfo once. qt.mu is never held
// while a Txn begins: a Txn may wait for a commit, which waits for a group
// (Volume::Group) whose thread may be in a quota check.
static Result<void> load_limits(QuotaTable& qt, Volume& v, TreeId tree) {
  {
    std::lock_guard lk(qt.mu);
    if (qt.trees[tree.v].loaded) return ok();
  }
  disk::FsInfo fi;
  {
    auto t = PLY_TRY(v.begin());
    fi = PLY_TRY(fsitems::read_info(t, tree));
  }
  std::lock_guard lk(qt.mu);
  auto& q = qt.trees[tree.v];
  if (!q.loaded) {
    q.loaded = true;
    q.lim_ref = fi.quota_referenced.get();
    q.lim_excl = fi.quota_exclusive.get();
  }
  return ok();
}

// The branch's figures now, exactly, by the accounting walks (format.md#accounting).
static Result<std::pair<uint64_t, uint64_t>> count_exactly(Volume& v, TreeId tree, bool ref, bool excl) {
  const uint64_t bs = v.block_size();
  std::pair<uint64_t, uint64_t> out{0, 0};
  auto t = PLY_TRY(v.begin());
  if (ref) {
    const TreeBlocks r = PLY_TRY(referenced_blocks(t, tree));
    out.first = (r.nodes + r.extent_blocks) * bs;
  }
  if (excl) {
    const BTree::DropStats d = PLY_TRY(t.exclusive(tree));
    out.second = (d.nodes + d.extent_blocks) * bs;
  }
  return out;
}

// An exact count, taken at the counts read before it (qt.mu held).
static void took_count(QuotaTable::Tree& q, uint64_t ref, uint64_t excl, uint64_t allocated, uint64_t released,
                       uint64_t epoch, uint64_t mutations, Generation gen) {
  q.exact = true;
  q.ref = ref;
  q.excl = excl;
  q.allocated = allocated;
  q.released = released;
  q.epoch = epoch;
  q.mutations = mutations;
  q.gen = gen;
  q.shared = 0;
  q.carried = q.inflight;
}

Result<QuotaUsage> quota_usage(Volume& v, TreeId tree) {
  auto& qt = v.extension<QuotaTable>();
  PLY_CHECK(load_limits(qt, v, tree));
  const uint64_t allocated = v.blocks_allocated(), released = v.refs_released(), epoch = v.tree_epoch();
  const uint64_t mutations = v.mutations();
  const Generation gen = v.open_generation();
  QuotaUsage u;
  {
    std::lock_guard lk(qt.mu);
    const auto& q = qt.trees[tree.v];
    u.lim_ref = q.lim_ref;
    u.lim_excl = q.lim_excl;
    if (!u.lim_ref && !u.lim_excl) return u;
    // Nothing changed since the last exact count: it still holds.
    if (q.exact && q.mutations == mutations && q.epoch == epoch && q.allocated == allocated) {
      u.ref = q.ref;
      u.excl = q.excl;
      return u;
    }
  }
  std::tie(u.ref, u.excl) = PLY_TRY(count_exactly(v, tree, u.lim_ref != 0, u.lim_excl != 0));
  std::lock_guard lk(qt.mu);
  auto& q = qt.trees[tree.v];
  took_count(q, u.ref, u.excl, allocated, released, epoch, mutations, gen);
  q.over = false;  // not asked: the next check decides
  return u;
}

// Counts an admitted operation's bytes (qt.mu held).
static QuotaCharge admit(QuotaTable::Tree& q, Volume& v, TreeId tree, uint64_t bytes, bool shares) {
  if (shares) q.shared += bytes;
  q.inflight += bytes;
  return QuotaCharge(&v, tree, bytes);
}

Result<TreeBlocks> referenced_blocks(Volume::Txn& t, TreeId tree) {
  TreeBlocks out;
  std::unordered_set<uint64_t> extents;
  PLY_CHECK(t.reach(tree, [&](BlockNo b, uint64_t n, bool node) {
    if (node) out.nodes++;
    else if (extents.insert(b.v).second) out.extent_blocks += n;
  }));
  return out;
}

void note_quota(Volume::Txn& t, TreeId tree, uint64_t referenced, uint64_t exclusive) {
  auto& qt = t.volume().extension<QuotaTable>();
  std::lock_guard lk(qt.mu);
  auto& q = qt.trees[tree.v];
  const uint64_t inflight = q.inflight;
  q = QuotaTable::Tree{};
  q.inflight = inflight;
  q.loaded = true;
  q.lim_ref = referenced;
  q.lim_excl = exclusive;
}

QuotaCharge::~QuotaCharge() {
  if (!v_) return;
  auto& qt = v_->extension<QuotaTable>();
  std::lock_guard lk(qt.mu);
  auto& q = qt.trees[tree_.v];
  q.inflight -= std::min(q.inflight, bytes_);
  if (q.inflight == 0) qt.ended.notify_all();
}

static Result<QuotaCharge> charge(Volume& v, TreeId tree, uint64_t bytes, bool shares, bool may_wait);

Result<QuotaCharge> charge_quota(Volume& v, TreeId tree, uint64_t bytes, bool shares) {
  return charge(v, tree, bytes, shares, true);
}

// The nodes one operation may add besides its data, charged with it so that
// a branch stays under its limit, metadata included (a write touches a
// leaf and its path; a copy-up, a directory entry too).
constexpr uint64_t kOpNodes = 4;

static Result<QuotaCharge> charge(Volume& v, TreeId tree, uint64_t bytes, bool shares, bool may_wait) {
  auto& qt = v.extension<QuotaTable>();
  PLY_CHECK(load_limits(qt, v, tree));
  const uint64_t bs = v.block_size();
  bytes += kOpNodes * bs;
  // Read before an exact count, so that what others allocate during it is
  // counted again, never missed.
  const uint64_t allocated = v.blocks_allocated(), released = v.refs_released(), epoch = v.tree_epoch();
  const uint64_t mutations = v.mutations();
  const Generation gen = v.open_generation();
  uint64_t lim_ref, lim_excl;
  {
    std::lock_guard lk(qt.mu);
    auto& q = qt.trees[tree.v];
    if (!q.lim_ref && !q.lim_excl) return QuotaCharge{};
    // A tree created, cloned, dropped or reset changes what is shared (a
    // snapshot makes a branch's blocks shared, a deleted one makes them
    // exclusive again). Another branch's writes can make this one's
    // blocks exclusive too, which no count here sees: an exclusive limit
    // counts again at least once per generation.
    const bool valid = q.exact && q.epoch == epoch && (!q.lim_excl || q.gen == gen);
    if (valid) {
      // What running operations may still add counts too: an allocation
      // they made is counted twice meanwhile, which errs on the safe side.
      const uint64_t grown = (allocated - q.allocated) * bs + q.shared + q.carried + q.inflight;
      auto r = fits(q, q.ref + grown, q.excl + grown, bytes);
      if (r) return admit(q, v, tree, bytes, shares);
      // At the limit, and nothing dropped since: still at it.
      if (q.over && released == q.released) return r.error();
    }
    lim_ref = q.lim_ref;
    lim_excl = q.lim_excl;
  }
  const auto [ref, excl] = PLY_TRY(count_exactly(v, tree, lim_ref != 0, lim_excl != 0));
  std::unique_lock lk(qt.mu);
  auto& q = qt.trees[tree.v];
  took_count(q, ref, excl, allocated, released, epoch, mutations, gen);
  auto r = fits(q, ref + q.inflight, excl + q.inflight, bytes);
  if (!r && q.inflight && may_wait) {
    // Running operations' blocks were counted twice (in the walk and in
    // their charges): once they end, one more exact count decides, so that
    // parallel writers fill a quota to its last blocks. Bounded: one that
    // waits for a commit our caller's group holds back must not hang us.
    qt.ended.wait_for(lk, std::chrono::seconds(1), [&] { return q.inflight == 0; });
    lk.unlock();
    return charge(v, tree, bytes, shares, false);
  }
  q.over = !r;
  if (!r) return r.error();
  return admit(q, v, tree, bytes, shares);
}

}  // namespace plyfs
