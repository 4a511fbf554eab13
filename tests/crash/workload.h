// Workloads for the crash harness: operations on a volume, a reference model
// of what they do, and a recorded run (docs/testing.md).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "commit/volume.h"
#include "crashlog.h"

namespace plyfs::crash {

inline constexpr uint8_t kKindExtents = 7;  // values: (extent start, length)
std::map<uint8_t, ValueRefs> kinds();
std::map<uint8_t, ValueMove> movers();  // the same kinds' movers (Shrink)

enum class OpKind : uint8_t {
  Put,        // tree slot, key, value size: insert or replace
  PutExtent,  // tree slot, key, extent length: a value referencing a new data extent
  Erase,      // tree slot, key
  Create,     // a new tree of kind `arg` in the next slot
  Clone,      // a clone of the tree in slot `tree`, in the next slot
  Drop,       // the tree in slot `tree`
  Commit,
  Fill,       // puts of large values into slot `tree` until ENOSPC
  Grow,       // the filesystem grows to the whole device (plyctl resize max), one commit
  Shrink,     // the filesystem shrinks to `arg` bytes (plyctl resize), relocating: many commits
};

struct Op {
  OpKind kind;
  uint32_t tree = 0;  // a tree slot, resolved to a tree id at run time
  uint64_t key = 0;
  uint64_t arg = 0;   // value size, extent length or tree kind
  std::string str() const;
};

// What the volume holds, tree id -> items. Values embed (op, generation) so
// that stale or foreign data shows in a failure.
using Items = std::map<Key, std::vector<std::byte>>;
struct Model {
  std::map<uint64_t, Items> trees;
  std::map<uint64_t, uint8_t> kind;  // tree id -> kind
  // A shrink ran: extent values may name their extents anywhere, so they
  // compare by length (the shrink itself checks that the moves are one to
  // one; fsck checks every crash state's references).
  bool moved = false;
  bool operator==(const Model&) const = default;
};
std::string describe_difference(const Model& want, const Model& got);

struct Workload {
  std::string id;
  uint64_t image_bytes = 8ull << 20;
  uint64_t format_bytes = 0;  // the filesystem's size at mkfs (0: the whole image), for Grow
  std::vector<Op> setup;  // applied and committed before recording begins
  std::vector<Op> ops;    // recorded
  PlantedBug bug = PlantedBug::None;
  bool discard = false;   // VolumeOptions::discard: freed blocks discarded once durable (A6)
  // A volume of several devices (format.md#multi-device): each member's
  // size and class (an index into `classes`, the fastest first), laid out
  // by plan_devices. Empty: one device of image_bytes.
  struct Device {
    uint64_t bytes;
    uint8_t class_id;
  };
  std::vector<Device> devices;
  std::vector<std::string> classes;
};

struct Run {
  Log log;        // one device; for several, the marks only (and `multi`)
  MultiLog multi; // several devices: every member's log in one global order
  uint64_t base_gen = 0;
  std::map<uint64_t, Model> model_at;   // generation -> content
  std::vector<uint64_t> acked;          // generations commit() returned
  std::string error;                    // an operation that failed unexpectedly
  int error_code = 0;                   // its errno
  bool fault_fired = false;             // the injected fault happened
  bool failed_writable = false;         // a commit failed and the volume stayed writable (C5)
};

// Reads everything the volume holds.
Result<Model> dump(Volume& vol);
// Compares what the volume holds with the model, streaming (no copy):
// empty when equal, else what differs first. Fills `ids` and `kinds_of`
// with the trees found.
std::string compare(Volume& vol, const Model& want, std::vector<uint64_t>& ids,
                    std::map<uint64_t, uint8_t>& kinds_of);

// Runs the workload on a fresh image, recording every device call of the
// recorded part, with marks for operations and acknowledged commits. A
// workload of several devices records each member (run.multi; no faults).
Run record(const Workload& w, const FaultDevice::Rule* fault = nullptr);

}  // namespace plyfs::crash
