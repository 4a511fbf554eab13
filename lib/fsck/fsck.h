// fsck: check a whole image and repair it (the fsck.plyfs tool and the crash
// tests call this; format.md is the reference for every check).
//
// Passes (format.md cites the invariants):
//   1 superblocks: both slots, which is newer, torn sectors, checksums,
//     fields, feature flags;
//   2 metadata blocks: every reachable node verifies (checksum, header, own
//     address, generation not newer than its parent or the superblock,
//     inside the device); root records;
//   3 B-tree invariants T1-T5: key order, separators, fill, equal depth;
//   4 space: reference counts equal the references found by walking every
//     tree (A3), counters (A4), no block with two owners that do not share it;
//   5 the objects higher layers keep in their trees (FsckOptions::
//     object_checks; fsck.plyfs passes lib/fs's filesystem checks, F1-F8),
//     run when passes 2-4 found nothing;
//   6 branches and views (codes U*), through the same hook.
// Pass 5-6 problems say what their repair costs (Problem::repair); the
// hook FsckOptions::object_repair makes the repairs.
//
// Repairs write one new generation, built from what is readable (R1-R3):
//   R1 a repair never writes a block that the generation it repairs reaches:
//      a crash during the repair leaves the image as it was, and fsck runs
//      again (format.md#commit, C3);
//   R2 intact trees are kept node for node; damaged trees are rebuilt from
//      their readable items; the root and space trees are always rebuilt, so
//      reference counts and free space are recomputed, never patched;
//   R3 when the newest generation has lost data and the older superblock's
//      generation verifies clean, -y falls back to it instead;
//   R4 object repairs (passes 5-6) come after the B-trees and space are
//      sound: a run that rebuilds them checks again and repairs the objects
//      in a second generation (a damaged node shared by several trees may
//      take a structural round per tree first, up to 8 generations in all);
//      each generation lands whole.
#pragma once

#include <atomic>
#include <functional>

#include "commit/verify.h"

namespace plyfs {

enum class FsckMode { Check, Preen, Yes };  // -n, -p, -y

// Which mode may fix a problem. Info is not an error.
enum class FixClass { Info, Preen, Yes, None };

struct FsckProblem {
  std::string code;
  int pass = 0;
  uint64_t block = Error::kNoBlock;
  uint64_t tree = 0;
  std::string message;
  FixClass fix = FixClass::None;
  bool fixed = false;
};

// Pass 5 fed by the walk of passes 2-4 (VerifyOptions::feed): it reads no
// node twice. finish() is called once the walk is over and passes 2-4 found
// nothing; a check whose walk found problems is dropped unfinished.
class ObjectChecker : public ItemFeed {
 public:
  virtual std::vector<Problem> finish() = 0;
};

struct FsckOptions {
  FsckMode mode = FsckMode::Check;
  std::map<uint8_t, ValueRefs> kinds;  // value references per tree kind
  // Pass 5: checks of what the trees hold, by the layers that define it.
  // object_feed, when set, is preferred: the same checks, fed by the walk
  // of passes 2-4 (null when it cannot start: object_checks runs instead).
  std::function<std::vector<Problem>(BlockDevice&)> object_checks;
  std::function<std::unique_ptr<ObjectChecker>(BlockDevice&)> object_feed;
  // Repairs what object_checks found (only Problem::Repair::Safe ones
  // unless `lossy`) in one new generation; returns what it did.
  struct ObjectRepair {
    std::vector<std::string> actions;
    Generation written;
  };
  std::function<Result<ObjectRepair>(BlockDevice&, bool lossy)> object_repair;
  // Progress (fsck -C): called when a pass starts, about 5 times a second
  // while it reads, and when it ends; from one thread at a time. `done`
  // counts the blocks the pass has read, `total` about how many it will
  // read (0: unknown): pass 2 reads every metadata block once, and with
  // `progress_data` (fsck -c) every data block too.
  std::function<void(int pass, const std::string& what, uint64_t done, uint64_t total)> progress;
  bool progress_data = false;
  const std::atomic<bool>* cancel = nullptr;  // checked between passes and before writing
};

// fsck(8) exit codes.
inline constexpr int kFsckClean = 0, kFsckCorrected = 1, kFsckUncorrected = 4,
                     kFsckOperational = 8, kFsckUsage = 16, kFsckCancelled = 32;

struct FsckReport {
  SuperChoice choice;
  Generation checked;                 // the generation that was checked
  std::optional<Generation> written;  // the generation a repair wrote
  std::vector<FsckProblem> problems;
  std::vector<std::string> actions;   // what the repair did, one sentence each
  uint64_t trees = 0, nodes = 0, items = 0, extents = 0;
  uint64_t used_blocks = 0, total_blocks = 0;
  int exit_code = kFsckClean;
  bool cancelled = false;

  size_t errors() const;     // problems that are not Info
  size_t remaining() const;  // errors not fixed
};

// Fails only when the image cannot be examined at all (not plyfs, unknown
// incompatible features, an I/O error on the device): exit code 8.
Result<FsckReport> fsck_run(BlockDevice& dev, const FsckOptions& opts);

const char* fix_class_name(FixClass f);

}  // namespace plyfs
