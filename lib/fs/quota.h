// Branch quotas (format.md#quotas): a branch's FsInfo may limit the bytes it
// references and the bytes it holds exclusively (btrfs's qgroup rfer/excl
// limits, ZFS's refquota). An operation that would grow a branch past a
// limit fails with EDQUOT before it changes anything; nothing that only
// removes (unlink, rmdir, truncate, punching holes, deleting a branch) is
// ever refused, so a branch over its quota can always be brought back.
//
// Nothing is stored but the limits: the figures are those of
// format.md#accounting, computed from the trees. So that a write does not
// walk its branch, each check bounds the branch's figure from the last
// exact one, by what the volume allocated since (Volume::blocks_allocated)
// and what the branch took by reference (copy-ups, reflinks); only when
// that bound would pass the limit is the figure computed again, exactly.
// A branch at its limit is not walked again until some reference is
// dropped (Volume::refs_released). Per volume (Volume::extension).
#pragma once

#include <cstdint>

#include "commit/volume.h"

namespace plyfs {

// The blocks tree `tree` reaches now, each once: its nodes, and its
// extents, each whole however many items map part of it
// (format.md#accounting, "referenced").
struct TreeBlocks {
  uint64_t nodes = 0, extent_blocks = 0;
};
Result<TreeBlocks> referenced_blocks(Volume::Txn& t, TreeId tree);

// An operation's claim on its branch's quota: the bytes it may still add,
// counted against the limits by every other check while it runs (writers
// in parallel cannot pass a limit together). Ends with the operation.
class QuotaCharge {
 public:
  QuotaCharge() = default;
  QuotaCharge(Volume* v, TreeId tree, uint64_t bytes) : v_(v), tree_(tree), bytes_(bytes) {}
  QuotaCharge(QuotaCharge&& o) noexcept : v_(o.v_), tree_(o.tree_), bytes_(o.bytes_) { o.v_ = nullptr; }
  QuotaCharge& operator=(QuotaCharge&&) = delete;
  ~QuotaCharge();

 private:
  Volume* v_ = nullptr;
  TreeId tree_;
  uint64_t bytes_ = 0;
};

// Before an operation that may make tree `tree` reference up to `bytes`
// more: EDQUOT if that would pass one of its limits. `shares`: the
// operation takes existing blocks by reference (a copy-up, a reflink),
// which no allocation counts, so `bytes` stays in the bound after it.
// Call it outside any Txn of this thread and before changing anything;
// keep the charge until the operation has ended.
Result<QuotaCharge> charge_quota(Volume& v, TreeId tree, uint64_t bytes, bool shares = false);

// What df shows on a mount whose writable branch has a quota (ZFS's
// refquota): the limits (0: none) and the figures now, exact. Counted again
// only when some tree changed since the last count (Volume::mutations).
struct QuotaUsage {
  uint64_t lim_ref = 0, lim_excl = 0, ref = 0, excl = 0;
};
Result<QuotaUsage> quota_usage(Volume& v, TreeId tree);

// The limits in tree `tree`'s FsInfo were written (fsitems::write_info).
void note_quota(Volume::Txn& t, TreeId tree, uint64_t referenced, uint64_t exclusive);

}  // namespace plyfs
