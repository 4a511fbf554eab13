// Crash-state enumeration and the oracle (docs/testing.md).
#pragma once

#include <chrono>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "checkers.h"
#include "workload.h"

namespace plyfs::crash {

struct Sampling {
  size_t exhaustive_k = 10;  // every subset of an open set up to this many writes
  size_t random_subsets = 8; // for larger open sets, beside drop-one and keep-one
  double t1 = 1.0;           // share of write prefixes checked
  double t3 = 1.0;           // share of prefixes whose last write is also torn
  size_t tears_per_write = 4;
  double write_checks = 1.0 / 8;  // share of states that also get writes, a commit, fsck
  bool faults = false;       // a run with an injected I/O failure: its states are tier T4
};

struct Totals {
  uint64_t states = 0, failed = 0, workloads = 0, logs_checked = 0, violations = 0;
  uint64_t by_tier[5] = {};
  std::vector<std::string> reproducers;  // the first failures, one line each
  std::set<std::string> failure_classes;
  void add_failure(const std::string& cls, const std::string& line);
};

// Judges one crash state: empty when it passes, else "CLASS: what".
using Oracle = std::function<std::string(const Spec& spec, bool write_check)>;

// Everything about one recorded run: protocol checks (unless skipped), then
// every enumerated crash state through the oracle (check_state unless
// given). `only` restricts to one state id.
void check_run(const Workload& w, const Run& run, const Sampling& s, uint64_t seed, Totals& t,
               const std::string& only = "", bool verbose = false, Oracle oracle = nullptr,
               bool protocol = true);

// fsck -n on a crash state must find nothing: writing nothing, with no
// errors (a superblock copy torn into unreadable sectors needs -y, which
// must then leave it clean).
std::string fsck_after_crash(StateDevice& dev);
// The same on any device showing a crash state (a set of StateDevices):
// `unreadable_tear` allows the copy torn into unreadable sectors,
// `overlay_writes` counts what was written to the state.
std::string fsck_clean(BlockDevice& dev, bool unreadable_tear,
                       const std::function<uint64_t()>& overlay_writes);

// The class of the write at log position `pos`, from the first block it
// carries: 0 superblock, 1 root-tree node, 2 space-tree node, 3 inner node
// of a user tree, 4 user leaf, 5 anything else (T2 keeps or drops a whole
// class at once).
inline constexpr int kClasses = 6;
int block_class(const Log& log, size_t pos);

// The oracle for one state; empty when it passes, else "CLASS: what".
std::string check_state(const Run& run, const Spec& spec, bool write_check, PlantedBug bug);
// The oracle's steps on a device showing a crash state whose recovered
// generation must lie in [lo, hi] (check_state's, and multidev.h's for a
// set of members).
std::string check_image(const Run& run, BlockDevice& dev, uint64_t lo, uint64_t hi, bool unreadable_tear,
                        const std::function<uint64_t()>& overlay_writes, bool write_check,
                        PlantedBug bug);

}  // namespace plyfs::crash
