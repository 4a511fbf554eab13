// Checks a whole image as it is on the device (the newest durable
// generation): superblocks, every tree (T1-T5), and that the space tree's
// reference counts and counters match what the trees reference (A3, A4).
// The tests run it after commits; fsck builds its passes 1-4 on it.
#pragma once

#include "commit/volume.h"

namespace plyfs {

struct VerifyOptions {
  std::map<uint8_t, ValueRefs> kinds;  // as VolumeOptions::kinds
  uint64_t cache_bytes = 64ull << 20;
  // Check this superblock's generation instead of the newest valid one.
  std::optional<SuperInfo> super;
  // Fill VerifyReport::reachable.
  bool collect_reachable = false;
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
