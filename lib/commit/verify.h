// Checks a whole image as it is on the device (the newest durable
// generation): superblocks, every tree (T1-T5), and that the space tree's
// reference counts and counters match what the trees reference (A3, A4).
// The tests run it after commits; fsck builds its passes 1-4 on it.
#pragma once

#include "commit/volume.h"

namespace plyfs {

// Receives the items of the trees as the walk reads them, so that a check of
// what the items mean (fsck's pass 5) reads no node a second time.
class ItemFeed {
 public:
  virtual ~ItemFeed() = default;
  // The walk of a tree starts: whether to hand over its items.
  virtual bool begin_tree(const TreeInfo& t) = 0;
  // Every item of the tree, in key order.
  virtual void item(Key k, std::span<const std::byte> v) = 0;
  // The walk of the tree is over. `complete` is false when some items were
  // not handed over: a subtree an earlier tree shares (the walk reads it
  // once) or a node that could not be read.
  virtual void end_tree(bool complete) = 0;
};

// Whether a value's reference names blocks outside [first_block,
// total_blocks) of `sb`: no extent at all (A3-ref-range). Such a value
// leaves its tree when fsck rebuilds it.
inline bool outside_filesystem(const SuperInfo& sb, const ExtentRef& e) {
  return e.start.v < sb.first_block || e.nblocks == 0 || e.start.v >= sb.total_blocks ||
         e.nblocks > sb.total_blocks - e.start.v;
}

struct VerifyOptions {
  std::map<uint8_t, ValueRefs> kinds;  // as VolumeOptions::kinds
  uint64_t cache_bytes = 64ull << 20;
  // Check this superblock's generation instead of the newest valid one.
  std::optional<SuperInfo> super;
  // Fill VerifyReport::reachable.
  bool collect_reachable = false;
  // Hand the user trees' items to this feed as they are walked.
  ItemFeed* feed = nullptr;
};

struct VerifyReport {
  SuperChoice choice;            // which superblock, and both slots' states
  std::vector<Problem> problems; // empty: the image is consistent
  uint64_t trees = 0, nodes = 0, items = 0, extents = 0;
  // Every extent the generation reaches (start, length): nodes and the
  // extents tree values reference (with collect_reachable).
  std::vector<std::pair<uint64_t, uint64_t>> reachable;
  bool clean() const { return problems.empty(); }
  std::string summary() const;   // one line per problem
};

// Fails only when there is nothing to check (no valid superblock, I/O error
// on the superblocks); every inconsistency found is a Problem.
Result<VerifyReport> verify_image(BlockDevice& dev, const VerifyOptions& opts = {});

}  // namespace plyfs
