// Space: which blocks are in use, by how many references, and which are free
// (format.md#space).
//
// Every allocated extent (a tree node is a one-block extent; file data comes
// later) has an item in the space tree: start block -> length, references,
// kind. Free space is what the tree does not cover. Changes are not written
// into the tree as they happen; they queue here as per-extent deltas and are
// folded into the tree when the generation is frozen for commit. Folding
// itself allocates and frees space-tree nodes, which queues more deltas; the
// fold repeats until none remain (each node is shadowed at most once per
// generation, so this ends after a few rounds).
//
// Invariants (format.md#space-invariants, checked by verify and fsck):
//   A1 a block reachable from the last durable generation, or from a
//      generation being committed, is never handed out.
//   A2 an extent freed in generation G becomes allocatable only once G is
//      durable; an extent allocated and freed within the open generation, and
//      never written, is allocatable at once.
//   A3 after a fold, an extent's references equal the number of parent
//      pointers, root pointers and value references to it (T6).
//   A4 used_blocks equals the sum of the lengths of all items.
//   A5 an operation takes every block it may need (a reservation) before it
//      changes anything, so ENOSPC never leaves an operation half done; the
//      last `reserve_blocks` are kept for deletions and for commits.
//   A6 a block is discarded only while it is free in the newest durable
//      generation and in the open one, and out of the free map: what
//      durable(G) releases waits for its discard before it can be handed
//      out again (with discard on), and trim() takes a free range out of the
//      free map while the device is told. No block that recovery may select,
//      and no block written since, is ever discarded (format.md#discard).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "alloc/disk_space.h"
#include "btree/btree.h"

namespace plyfs {

enum class ExtentKind : uint16_t { Meta = 1, Data = 2 };

struct SpaceCounters {
  uint64_t used_blocks = 0;  // A4
  uint64_t meta_blocks = 0;
  uint64_t data_blocks = 0;
};

// A run of blocks, for discards.
struct BlockRange {
  uint64_t start = 0, nblocks = 0;
};

// The blocks of one device of a multi-device volume, and its class
// (format.md#placement).
struct DeviceRegion {
  uint64_t start = 0, end = 0;  // the device's usable blocks
  uint8_t class_id = 0;
};

struct SpaceGeometry {
  uint64_t first_block = 0;   // blocks below are the reserved area (format.md#layout)
  uint64_t total_blocks = 0;  // blocks the filesystem spans
  uint64_t reserve_blocks = 0;
  // Multi-device volumes only (format.md#multi-device): the blocks no device
  // backs for data (the gaps between devices, and the reserved area each
  // device but the first begins with), never free and never counted as
  // usable; and each device's usable blocks with its class. Metadata goes
  // to `meta_class` first, data to the classes from the last to the first
  // (format.md#placement); each falls back to the next class when one is full.
  std::vector<BlockRange> holes{};
  std::vector<DeviceRegion> regions{};
  uint8_t meta_class = 0;
  uint8_t class_count = 0;
};

// Where a data extent should go on a multi-device volume
// (format.md#placement-rules): the classes to try, in order. Not strict:
// then every other class in the default data order, so that a rule never
// makes a write fail while any device has room. Strict: only the first
// class, ENOSPC when it is full. Empty (n == 0): the default data order.
struct Placement {
  uint8_t n = 0;
  bool strict = false;
  uint8_t classes[8]{};
  bool operator==(const Placement& o) const {
    return n == o.n && strict == o.strict && std::equal(classes, classes + n, o.classes);
  }
};

struct SpaceStats {
  uint64_t usable_blocks;  // total - first
  uint64_t used_blocks;    // referenced now
  uint64_t pending_free;   // freed, allocatable once their generation is durable
  uint64_t free_blocks;    // allocatable now
  uint64_t reserved;       // promised to running operations
  uint64_t reserve_blocks; // kept for deletions and commits
  uint64_t meta_blocks, data_blocks;
  uint64_t discarding;     // released, waiting for their discard (A6)
};

class SpaceManager {
 public:
  static constexpr TreeId kTreeId{2};
  // Blocks are grouped by 32768 from first_block; a group's free map is
  // built on first use. No extent crosses a group boundary (format.md#space).
  static constexpr uint64_t kGroupBlocks = 32768;
  // trim() holds at most this many free blocks out of the free map at once.
  static constexpr uint64_t kTrimChunk = 8192;

  // An existing space tree (open), or an empty device (mkfs: call
  // create_tree() next).
  SpaceManager(BlockCache& cache, uint64_t fs_id, SpaceGeometry geo, RootPtr root,
               SpaceCounters counters);
  ~SpaceManager();
  static std::unique_ptr<SpaceManager> fresh(BlockCache& cache, uint64_t fs_id, SpaceGeometry geo);
  Result<void> create_tree(Generation gen);

  // For rebuilding the space tree from what the trees reference (fsck), on a
  // fresh() manager: claim() records an extent in use with its references,
  // hold() keeps a range from being handed out until `gen` is durable (the
  // blocks the previous generation reaches, A1). Both fail with EUCLEAN when
  // the range is not free: two owners claim the same block.
  Result<void> claim(BlockNo start, uint64_t nblocks, uint32_t refs, ExtentKind kind);
  Result<void> hold(BlockNo start, uint64_t nblocks, Generation gen);
  // hold() of just the parts of the range that are still free.
  Result<void> hold_free_parts(BlockNo start, uint64_t nblocks, Generation gen);

  // Reservations (A5). `for_delete` may dig into half of the reserve.
  Result<void> reserve(uint64_t nblocks, bool for_delete);
  void unreserve(uint64_t nblocks);

  // Allocation and references. alloc() draws on a reservation made before
  // (`reserved`), or, at commit time, on any free block.
  // `place` (data on a multi-device volume only): the classes to try.
  Result<BlockNo> alloc(uint64_t nblocks, ExtentKind kind, bool reserved, const Placement* place = nullptr);
  // The class of the device block `b` lies on; -1 on a volume of one device.
  int class_of(uint64_t b) const;
  // The class metadata is allocated from: the first class in the metadata
  // order that has a device (format.md#placement; the volume's metadata
  // class until its last device was removed); -1 on a volume of one device.
  int metadata_class() const;
  Result<uint32_t> refcount(BlockNo start);
  Result<void> inc_ref(BlockNo start);
  Result<NodeSpace::Freed> dec_ref(BlockNo start, Generation gen);

  // For trees that are never shared (root and space trees): their nodes have
  // exactly one reference, so no lookup is needed. Draws on any free block:
  // these trees change only while generation `gen` is frozen for commit.
  NodeSpace& unshared(Generation gen);

  // Commit protocol (format.md#commit): fold the queued deltas into the
  // space tree (gate closed), then, once `gen` is durable, release what it
  // freed (A2).
  Result<void> fold(Generation gen);
  void durable(Generation gen);

  // Discard (A6, format.md#discard). With it on, what durable() releases is
  // queued instead of freed: take_discards() hands the queue over (in block
  // order, adjacent ranges joined) and released() frees it once the device
  // was told. freed_in() lists what the open generation `gen` freed so far
  // (for the crash harness's planted bug only).
  void set_discard(bool on);
  std::vector<BlockRange> take_discards();
  void released(const std::vector<BlockRange>& ranges);
  std::vector<BlockRange> freed_in(Generation gen) const;

  // fstrim's job (A6): every free range of at least `min_blocks` inside
  // `within`, group by group, out of the free map while `discard` runs on
  // it. `progress` gets the blocks discarded so far and the share of groups
  // done. Returns the blocks discarded.
  Result<uint64_t> trim(BlockRange within, uint64_t min_blocks,
                        const std::function<Result<void>(BlockRange)>& discard,
                        const std::function<void(uint64_t, double)>& progress = nullptr);

  // Extents with changes queued in the open generation. A commit folds
  // them; the Volume commits before this outgrows what the reserve can fold.
  uint64_t pending_changes() const;

  // Planted bug for the crash harness (PlantedBug::ReuseFreedBlock): frees
  // become allocatable at once, breaking A2.
  void plant_early_reuse() { early_reuse_ = true; }

  RootPtr root() const;
  SpaceCounters counters() const;
  SpaceStats stats() const;
  SpaceGeometry geometry() const;
  // Grows the filesystem to `total_blocks` and its reserve to
  // `reserve_blocks` (plyctl resize, format.md#resize): the blocks past the
  // old end are free at once; the next superblock records the new end.
  Result<void> grow(uint64_t total_blocks, uint64_t reserve_blocks);
  // Shrinking and removing a device (format.md#relocation,
  // format.md#device-remove). exclude(): no block in [lo, hi) is handed
  // out from now on; free blocks there leave the free map (and stop
  // counting as free, so reservations cannot promise them), and blocks
  // freed there later stay out. exclude(0, 0) lifts it. limit(end) is
  // exclude(end, end of the filesystem); limit(total_blocks) lifts it.
  // Then, once the blocks in the range were moved and what freed them is
  // durable, shrink() makes `end` the filesystem's end, or drop_region()
  // takes the geometry without the range: both fail (EBUSY) while any
  // extent, queued change or pending free still lies there.
  Result<void> exclude(uint64_t lo, uint64_t hi);
  Result<void> limit(uint64_t end);
  Result<void> shrink(uint64_t total_blocks, uint64_t reserve_blocks);
  // A device gone (format.md#device-remove): `next` is the geometry without
  // the excluded range (a hole now, or past the new end).
  Result<void> drop_region(const SpaceGeometry& next);
  // A device joined (format.md#device-add): `next` is the geometry with its
  // region, which lies past the old end; its blocks are free at once.
  Result<void> add_region(const SpaceGeometry& next);
  uint64_t alloc_limit() const;
  // The extents that reach into [lo, hi), with their references now
  // (queued changes included; extents whose count fell to 0 left out).
  struct Placed {
    uint64_t start, nblocks;
    uint32_t refs;
    ExtentKind kind;
  };
  Result<std::vector<Placed>> extents_in(uint64_t lo, uint64_t hi);
  Result<std::vector<Placed>> extents_from(uint64_t from) { return extents_in(from, ~0ull); }
  // Copies every node of the space tree in [lo, hi) out of it
  // (BTree::relocate), in generation `gen`, before its fold.
  Result<void> relocate_tree(uint64_t lo, uint64_t hi, Generation gen);
  // A read-only view of the space tree for checks.
  const BTree& tree() const { return *tree_; }

 private:
  struct Delta {
    int64_t refs = 0;      // change of the reference count this generation
    uint64_t nblocks = 0;
    ExtentKind kind = ExtentKind::Meta;
    bool is_new = false;   // allocated in the open generation (no item yet)
  };
  struct Group {
    bool loaded = false;
    std::map<uint64_t, uint64_t> free;  // start -> length
  };
  class Unshared;

  Result<void> load_group_locked(size_t g);
  Result<void> take_range_locked(uint64_t start, uint64_t nblocks);
  Result<BlockNo> alloc_locked(std::unique_lock<std::mutex>& lk, uint64_t nblocks, ExtentKind kind,
                               const Placement* place);
  Result<BlockNo> find_locked(uint64_t nblocks, ExtentKind kind, const Placement* place);
  Result<std::optional<BlockNo>> find_in_locked(const std::vector<size_t>* groups, size_t n,
                                                size_t& pos, uint64_t& cursor, uint64_t nblocks,
                                                ExtentKind kind);
  void hide_holes_locked(size_t g, std::map<uint64_t, uint64_t>& fm) const;
  // classes_, meta_order_, data_order_ and hole_blocks_ from geo_.
  void place_classes_locked();
  uint64_t hole_blocks_ = 0;
  // Multi-device: the groups of each class, and the next-fit position in them.
  struct ClassGroups {
    std::vector<size_t> groups;
    size_t pos = 0;
    uint64_t cursor = 0;
  };
  std::vector<ClassGroups> classes_;
  std::vector<uint8_t> meta_order_, data_order_;
  Result<std::optional<disk::SpaceItem>> item_locked(BlockNo start);
  void free_range_locked(uint64_t start, uint64_t len);
  Result<void> check_vacated_locked(uint64_t lo, uint64_t hi);
  void hide_beyond_locked(std::map<uint64_t, uint64_t>& fm);
  void account_locked(ExtentKind kind, int64_t nblocks);
  Result<NodeSpace::Freed> free_unshared_locked(BlockNo b, Generation gen);
  uint64_t free_now_locked() const;

  BlockCache& cache_;
  const uint64_t fs_id_;
  SpaceGeometry geo_;  // under mu_: grow() changes it
  std::unique_ptr<BTree> tree_;
  std::unique_ptr<Unshared> unshared_;
  Generation fold_gen_{0};

  mutable std::mutex mu_;
  SpaceCounters counters_;
  std::unordered_map<uint64_t, Delta> pending_;  // the open generation's deltas
  std::atomic<uint64_t> pending_size_{0};         // pending_.size(), read without the lock
  std::vector<Group> groups_;
  uint64_t cursor_ = 0;                          // next-fit position
  uint64_t outstanding_ = 0;                     // reserved, not yet allocated
  std::map<uint64_t, uint64_t> deferred_;        // start -> length, freed not durable
  std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> deferred_by_gen_;
  uint64_t deferred_blocks_ = 0;
  bool discard_ = false;
  std::vector<BlockRange> to_discard_;  // released by durable(), still in deferred_ (A6)
  uint64_t trimming_ = 0;               // taken out of the free map by trim()
  uint64_t trim_returns_ = 0;           // counts trim()'s returns, for alloc_locked's wait
  std::condition_variable trim_cv_;
  bool early_reuse_ = false;
  // exclude(): nothing in [ex_lo_, ex_hi_) is handed out (empty: none).
  uint64_t ex_lo_ = 0, ex_hi_ = 0;
  std::map<uint64_t, uint64_t> beyond_;     // free runs in the excluded range, out of the free maps
  uint64_t beyond_blocks_ = 0;
};

}  // namespace plyfs
