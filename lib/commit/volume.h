// The volume: one plyfs image opened for use. It owns the stack (device,
// cache, space, trees) and runs the generation protocol (format.md#commit).
//
// Every operation runs inside one generation through a Txn: it takes the
// blocks it may need before it changes anything (A5), and a commit never
// splits it. Commit (format.md#commit):
//   1. freeze: close the gate (wait for running Txns), persist changed tree
//      roots into the root tree, fold the space deltas, checksum every dirty
//      node, build the superblock; the open generation becomes G+1 and the
//      gate reopens. CPU only: the world stops for microseconds, not I/O.
//   2. write every dirty node of G; flush;
//   3. write the superblock of G into slot G % 2; flush;
//   4. G is durable: release what G freed (A2), mark its blocks clean.
// Operations of G+1 run during 2-4 (the paper's forking of the superblock);
// they never change a node of G in place, because its generation is not
// theirs (format.md#btree-cow).
//
// Invariants (format.md#commit-invariants; the crash tests cite them):
//   C1 every block reachable from generation G is written and flushed before
//      the superblock of G is written.
//   C2 the superblock of G goes to slot G % 2, so the newest durable
//      superblock, in the other slot, is never overwritten by this commit.
//   C3 no write touches a block reachable from the newest durable generation
//      or from the generation being committed (A1, A2).
//   C4 commit() returns success only after the flush that follows the
//      superblock write.
//   C5 an I/O error during a commit fails it and every later one (the volume
//      turns read-only): a failed flush leaves the covered writes unknown
//      (blockdev.h D4), so nothing may be acknowledged on top of them.
//   C6 opening never writes: recovery is choosing the valid superblock with
//      the highest generation.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <unordered_map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <typeindex>

#include "alloc/space.h"
#include "commit/superblock.h"

namespace plyfs {

inline constexpr TreeId kRootTreeId{1};
inline constexpr uint64_t kFirstTreeId = 256;
inline constexpr uint64_t kFirstInode = 256;

// Tree kinds (format.md#tree-kinds). Higher layers add theirs.
inline constexpr uint8_t kKindPlain = 1;  // plain key-value tree, no references in values

struct FormatOptions {
  uint32_t block_size = 4096;
  std::array<uint8_t, 16> uuid{};  // all zero: random
  std::string label;
  uint64_t size_bytes = 0;         // 0: the whole device
  uint64_t time_ns = 0;            // 0: now
  // A multi-device volume (format.md#multi-device), formatted on a
  // DeviceSet laid out by plan_devices(): the class names, the fastest
  // first, and each member's class, in the set's order. Empty: one device.
  std::vector<std::string> classes;
  std::vector<uint8_t> device_classes;
  uint32_t meta_class = 0;  // the class metadata goes to (format.md#placement)
};

// The free-space geometry a superblock describes: for a multi-device volume
// also the blocks no device backs and each device's class
// (format.md#placement).
SpaceGeometry space_geometry(const SuperInfo& s);

// Deliberate bugs for the crash harness's self-test (tests/crash): each must
// be caught. Never set outside tests.
enum class PlantedBug : uint8_t {
  None,
  NoFlushBeforeSuper,  // breaks C1: the superblock may land before its nodes
  ReuseFreedBlock,     // breaks A2/C3: freed blocks are handed out at once
  TrustTornSuper,      // breaks recovery: a torn superblock is accepted
  DiscardEarly,        // breaks A6: what a generation frees is discarded before it is durable
};

// What one commit cost, for VolumeOptions::on_commit (the daemon's
// `-o commit_stats`, docs/benchmarks.md "What a commit costs").
struct CommitStats {
  enum class Cause : uint8_t {
    Request,   // commit() called: fsync, sync, unmount, a snapshot...
    Periodic,  // the commit interval passed
    Dirty,     // dirty_limit_bytes of metadata were dirty
    Budget,    // the generation's space changes reached their budget (A5)
  };
  Generation gen;
  Cause cause = Cause::Request;
  uint64_t wait_us = 0;    // closing the gate: the Txns in flight finish
  uint64_t frozen_us = 0;  // the gate closed: no Txn can begin
  uint64_t write_us = 0;   // nodes, flush, superblock, flush (Txns run again)
  uint64_t blocks = 0;     // metadata blocks written
};

struct VolumeOptions {
  bool read_only = false;
  uint64_t cache_bytes = 256ull << 20;
  uint32_t commit_interval_ms = 0;  // periodic commits; 0: none
  uint64_t dirty_limit_bytes = 0;   // commit when this much metadata is dirty; 0: none
  std::map<uint8_t, ValueRefs> kinds;  // what the values of each tree kind reference
  // How to move those references (shrinking, format.md#relocation); a kind
  // without one keeps its extents where they are, so a shrink that would
  // move one of them is refused.
  std::map<uint8_t, ValueMove> movers = {};
  PlantedBug planted_bug = PlantedBug::None;
  // Commit at the end of every transaction that changed something, on the
  // caller's thread, so that each operation of the layers above is its own
  // generation. For single-threaded callers only (the crash tests use it to
  // make a crash land between any two steps of a multi-step operation): a
  // commit waits for every other transaction to end.
  bool commit_each_txn = false;
  // Discard what each generation frees once it is durable (A6,
  // format.md#discard): the daemon's `-o discard`.
  bool discard = false;
  // Called after every successful commit, on the committing thread.
  std::function<void(const CommitStats&)> on_commit = nullptr;
};


struct TreeInfo {
  TreeId id;
  uint8_t kind = 0;
  RootPtr root;
  Generation created, last_shared;
  TreeId cloned_from;
};

// Root records (format.md#root-record). decode refuses a record that does not
// fit the superblock `sb` or names a generation newer than `newest`.
std::vector<std::byte> encode_root_record(const TreeInfo& t);
Result<TreeInfo> decode_root_record(TreeId id, std::span<const std::byte> v, const SuperInfo& sb,
                                    Generation newest);

// Writes a whole generation outside a Volume (mkfs, fsck repairs): seals
// every dirty node in `cache`, writes them, flushes, writes `sb` into slot
// sb.generation % 2, flushes (C1, C2, C4).
Result<void> write_generation(BlockDevice& dev, BlockCache& cache, const SuperInfo& sb);

class Volume {
 public:
  // The superblock mkfs would write, without writing (mkfs -n).
  static Result<SuperInfo> plan(const BlockDevice& dev, const FormatOptions& opts);
  // The space reserve (format.md#space-reserve) of a volume of `usable` blocks.
  static uint64_t reserve_for(uint64_t usable);
  // Writes an empty filesystem: root and space trees, both superblocks.
  static Result<SuperInfo> format(BlockDevice& dev, const FormatOptions& opts);
  static Result<std::unique_ptr<Volume>> open(BlockDevice& dev, VolumeOptions opts = {});
  // Stops the committer. Does not commit: what was not committed is lost, as
  // in a crash. Call close() to keep it.
  ~Volume();
  // Commits (read-write) and stops the committer.
  Result<void> close();

  class Txn;
  struct TxnOptions {
    bool for_delete = false;      // may dig into half of the reserve (A5)
    uint64_t reserve_blocks = 0;  // blocks to reserve up front
  };
  Result<Txn> begin(TxnOptions o);
  Result<Txn> begin();

  // Makes the Txns this thread begins while it lives land in one
  // generation: no commit can come between them (a commit waits for the
  // group as for one Txn). For a higher-layer operation of several steps
  // that must commit as one: a union's copy-up with its hard links, a
  // rename across branches (format.md#fs-union, "Atomicity"). Keep it
  // bounded: inside a group no commit relieves the reserve (A5). Groups
  // nest (the inner ones do nothing). A commit asked for inside a group
  // is refused (EDEADLK) rather than waiting for itself.
  class Group {
   public:
    explicit Group(Volume& v);
    ~Group();
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;

   private:
    Volume* v_ = nullptr;  // null: nested, or another volume's group is open
  };

  // Makes every operation that ended before the call durable; returns the
  // generation that holds them. Concurrent callers are serialized.
  Result<Generation> commit() { return commit_for(CommitStats::Cause::Request); }
  // After an operation failed with ENOSPC: when blocks freed by the open
  // generation wait for its commit to become allocatable (A2), commits
  // (outside any Txn or group of this thread), so that one retry may find
  // them. Whether it committed.
  bool reclaim();

  Generation durable_generation() const;
  Generation open_generation() const;
  SuperInfo super() const;                       // the newest durable superblock
  const SuperChoice& recovery() const { return recovery_; }
  SpaceStats space_stats() const { return space_->stats(); }
  // The blocks in use on each device of a multi-device volume's table (one
  // entry for a volume of one device): what the space tree records, with
  // the open generation's changes to extents it holds (format.md#placement).
  struct DeviceUse {
    uint64_t used_blocks = 0, meta_blocks = 0, data_blocks = 0;
  };
  Result<std::vector<DeviceUse>> device_usage();
  // The class of the device block `b` lies on (format.md#placement); -1 on
  // a volume of one device.
  int class_of(BlockNo b) const;
  // The class new metadata goes to: the metadata class, or the next class
  // with a device once that class has none left (format.md#placement); -1
  // on a volume of one device.
  int metadata_class() const;
  // What the volume lives on: a DeviceSet for a multi-device volume.
  BlockDevice& device() const { return dev_; }
  // Discards every free range of at least min_bytes inside bytes
  // [start, start + len) of the device (fstrim's job, A6): the bytes
  // discarded. Runs beside operations and commits; EROFS on a read-only
  // volume. `progress` gets the bytes discarded so far and the share done.
  Result<uint64_t> trim(uint64_t start, uint64_t len, uint64_t min_bytes,
                        const std::function<void(uint64_t, double)>& progress = nullptr);
  // Grows the filesystem to `total_blocks` (the device must hold them:
  // BlockDevice::resize first) in one generation: the new blocks are free,
  // the reserve grows with the size as mkfs would make it (format.md#resize).
  // Returns the generation that holds the new size. Shrinking needs blocks
  // above the new end moved first, which is not built: EOPNOTSUPP.
  Result<Generation> grow(uint64_t total_blocks);
  // plyctl resize: to `bytes` (whole blocks), an image file extended to
  // it first; nullopt: to the device's size now (a device or file that grew).
  // A size below the filesystem's shrinks it (shrink()), and an image file
  // is then cut to it. `progress`: shrink()'s.
  Result<Generation> resize(std::optional<uint64_t> bytes,
                            const std::function<void(uint64_t, uint64_t)>& progress = nullptr);
  // Shrinks the filesystem to `total_blocks` (format.md#relocation): every
  // node and extent at or past the new end is moved below it, shared ones
  // staying shared (BTree::relocate), in batches of at most
  // kRelocateBatchBytes of data, each its own generation, with operations
  // held while a batch runs and going on between batches; then two
  // generations record the new end, so that both superblock slots describe
  // it before the caller cuts the device. Refused, changing nothing, when
  // what is used does not fit below the end with the reserve (ENOSPC) or
  // a tree kind's references cannot be moved (EOPNOTSUPP). `progress`
  // hears the blocks moved and the blocks to move. Interrupted (an error,
  // a crash), the filesystem keeps its size and every block it had, some
  // of them moved.
  static constexpr uint64_t kRelocateBatchBytes = 64ull << 20;
  Result<Generation> shrink(uint64_t total_blocks,
                            const std::function<void(uint64_t done, uint64_t total)>& progress = nullptr);
  uint64_t total_blocks() const { return total_blocks_.load(std::memory_order_acquire); }
  // Devices joining and leaving a multi-device volume while it is in use
  // (format.md#device-add, format.md#device-remove); the volume's device
  // is the DeviceSet that gains or loses the member. EOPNOTSUPP on a
  // volume of one device.
  //
  // add_device: `dev` becomes the last device, of class `cls`
  // (plan_device_add), its blocks free at once: the durable generation's
  // slots and the label written to it, then two generations with the new
  // table. Returns the second.
  // On a volume of one device held as a DeviceSet of it alone (a
  // mount's), make_multi_device(first_cls) comes first, once what the add
  // would refuse has been checked.
  Result<Generation> add_device(std::unique_ptr<BlockDevice> dev, const std::string& name, const std::string& cls,
                                bool force, const std::string& first_cls = "main");
  // remove_device: every node and extent on device `index` moved to the
  // others (as shrink() moves them, each batch its own generation), then
  // two generations with the table without it, written to the others only;
  // then its reserved area is wiped (wipe_device). ENOSPC, changing
  // nothing, when what is used does not fit on the others with the
  // reserve; EINVAL for the only device. Interrupted, the device stays, some
  // of its blocks moved. `progress` hears the blocks moved and to move.
  Result<Generation> remove_device(size_t index,
                                   const std::function<void(uint64_t done, uint64_t total)>& progress = nullptr);
  // make_multi_device: a volume of one device becomes a volume of one
  // device of class `cls` (format.md#device-convert): the device gets a
  // label (flushed), then two generations, one in each slot, with
  // MULTI_DEVICE and the table of that device at block 0, spanning
  // total_blocks. Nothing else changes. The volume's device is that device,
  // or a DeviceSet of it alone (a mount's). EINVAL: MULTI_DEVICE already,
  // a bad class name.
  Result<Generation> make_multi_device(const std::string& cls);
  // Bytes discarded since open, by commits (-o discard) and trim().
  uint64_t discarded_bytes() const { return discarded_bytes_.load(); }
  CacheStats cache_stats() const { return cache_->stats(); }
  bool read_only() const { return opts_.read_only; }
  // The error that failed a commit and turned the volume read-only (C5).
  std::optional<Error> failure() const;
  uint32_t block_size() const { return info_.block_size; }
  // The incompat feature bits the next superblock carries: the durable
  // ones and those a Txn added since (format.md#features).
  uint64_t incompat() const;
  uint64_t ro_compat() const;  // the same for the ro_compat bits

  // File data (format.md#fs-data): whole blocks of extents that tree values
  // reference, read and written straight to the device, not through the
  // cache. Writes go only to blocks allocated in the open generation, which
  // no durable generation can reach (C3); the commit's first flush makes
  // them durable before the superblock that refers to them (C1). A failed
  // write turns the volume read-only (C5).
  Result<void> write_data(BlockNo start, std::span<const std::byte> data);
  Result<void> read_data(BlockNo start, std::span<std::byte> out);
  // The same from the medium, past any cache of the device's
  // (BlockDevice::read_uncached): a scrub's reads.
  Result<void> read_data_uncached(BlockNo start, std::span<std::byte> out);
  // Reads node `b` from the device, not the cache, and verifies it as a
  // read would (checksum, magic, its own address, fs_id, the generation
  // and level its parent records): a scrub's check (format.md#scrub).
  Result<void> verify_node_on_device(BlockNo b, Generation gen, int level);
  // Turns the volume read-only because of an error a higher layer found
  // (a data checksum mismatch): later changes fail with EROFS.
  void fail(const Error& e);

  // Counts changes to the set of trees or to which root a tree has
  // (create, clone, drop, reset), so that a higher layer's cache of
  // per-tree facts (the filesystem layer's branch names) knows when it may
  // have missed one. Txn::tree_change() says which count a Txn's own last
  // change made.
  uint64_t tree_epoch() const { return tree_epoch_.load(std::memory_order_acquire); }
  // Blocks handed out (nodes and extents), and references dropped (node
  // and extent counts decremented, freeing or not), since the volume was
  // opened. Both only grow: a higher layer that knew a tree's size at one
  // count bounds its growth since by the blocks allocated, and knows that
  // nothing can have shrunk while nothing was released (quotas,
  // lib/fs/quota.h).
  uint64_t blocks_allocated() const { return allocated_.load(std::memory_order_relaxed); }
  // Changes made to any tree through a Txn (an item put, inserted or
  // erased, a graft, a tree cloned, dropped or reset, a reference count
  // changed), counted after each is made: a higher layer's cache of what a
  // tree held is still true while this stands still (the union's
  // resolutions, union.h).
  uint64_t mutations() const { return mutations_.load(std::memory_order_acquire); }
  uint64_t refs_released() const { return released_.load(std::memory_order_relaxed); }
  // State a higher layer keeps per volume (a cache it maintains itself),
  // made on first use and destroyed with the volume.
  template <class T>
  T& extension() {
    std::lock_guard lk(ext_mu_);
    auto& p = ext_[std::type_index(typeid(T))];
    if (!p) p = std::make_shared<T>();
    return *static_cast<T*>(p.get());
  }

 private:
  struct Slot {
    uint64_t id = 0;
    std::shared_mutex mu;
    std::unique_ptr<BTree> tree;
    TreeInfo info;
    bool dirty = false;    // the root record must be written at the next freeze
    bool dropped = false;
  };
  // Lets a commit wait for the Txns of the generation it freezes, and new
  // Txns wait for the freeze. Entering and leaving an open gate is one atomic
  // operation; the mutex is only for waiting.
  class Gate {
   public:
    void enter();
    void leave();
    void close();
    void open();
   private:
    static constexpr uint64_t kClosed = 1ull << 63;
    std::atomic<uint64_t> state_{0};  // kClosed | number of Txns inside
    std::mutex mu_;
    std::condition_variable cv_;
  };

  Volume(BlockDevice& dev, VolumeOptions opts);
  Result<Slot*> slot(TreeId id);
  Result<void> freeze(Generation g, std::vector<BlockCache::Ref>& dirty, SuperInfo& sb);
  Result<void> write_generation(const std::vector<BlockCache::Ref>& dirty, const SuperInfo& sb);
  Result<void> data_range(BlockNo start, size_t bytes) const;
  Result<void> writable() const;
  TreeConfig config_for(const TreeInfo& info) const;
  void committer_loop();
  Result<Generation> commit_for(CommitStats::Cause cause);
  // Two commits, the second forced: what changed goes to both superblock
  // slots (a table or size change that the older slot must not contradict).
  Result<Generation> commit_twice();
  Result<Generation> make_multi_device_locked(const std::string& cls);  // resize_mu_ held
  // One batch of shrink(): with the gate closed, moves up to a batch of what
  // lies at or past `end`; false when nothing is left there.
  Result<bool> relocate_batch(uint64_t lo, uint64_t hi, uint64_t& moved_blocks);
  Result<void> check_movable();
  // Moves every node and extent in [lo, hi) out of it, with the range
  // excluded from allocation (SpaceManager::exclude), one relocate_batch()
  // and commit after another; the range stays excluded for the caller to
  // drop, or is lifted on a failure. Returns {moved, to move} in blocks.
  Result<std::pair<uint64_t, uint64_t>> vacate(uint64_t lo, uint64_t hi,
                                               const std::function<void(uint64_t, uint64_t)>& progress);
  static uint64_t change_budget(uint64_t reserve_blocks);
  std::mutex resize_mu_;  // one resize or device change at a time

  BlockDevice& dev_;
  VolumeOptions opts_;
  SuperInfo info_;  // the newest durable superblock (guarded by state_mu_)
  SuperChoice recovery_;
  std::unique_ptr<BlockCache> cache_;
  std::unique_ptr<SpaceManager> space_;
  std::unique_ptr<BTree> root_tree_;

  Gate gate_;
  std::mutex commit_mu_;  // one commit at a time
  mutable std::mutex state_mu_;
  std::atomic<uint64_t> open_gen_{0};  // changes only while the gate is closed
  Generation durable_gen_;
  std::optional<Error> failure_;
  std::atomic<bool> changed_{false};  // the open generation has something to commit
  std::atomic<uint64_t> discarded_bytes_{0};
  std::atomic<uint64_t> total_blocks_{0};  // the open generation's; set under commit_mu_ (grow)
  void discard_released();
  std::atomic<uint64_t> next_tree_id_{0}, next_inode_{0};
  std::atomic<uint64_t> incompat_added_{0};  // Txn::add_incompat, folded in at each freeze
  std::atomic<uint64_t> ro_compat_added_{0};  // Txn::add_ro_compat, the same
  std::atomic<uint64_t> tree_epoch_{1};      // tree_epoch()
  std::atomic<uint64_t> allocated_{0}, released_{0};  // blocks_allocated(), refs_released()
  std::atomic<uint64_t> mutations_{0};                 // mutations()
  std::mutex shared_nodes_mu_;               // NodeSpace::shared_nodes_mutex
  std::mutex ext_mu_;
  std::map<std::type_index, std::shared_ptr<void>> ext_;

  std::shared_mutex trees_mu_;  // shared to find a slot, exclusive to add or remove one
  // Hashed: every tree operation finds its slot here, and a volume with
  // thousands of snapshots holds thousands of slots. Nothing walks it in order.
  std::unordered_map<uint64_t, std::unique_ptr<Slot>> trees_;
  // The trees whose slot turned dirty in the open generation: a freeze visits
  // these, not every tree the volume has opened (10,000 snapshots are 10,000
  // slots, and the freeze runs with the gate closed).
  std::mutex touched_mu_;
  std::vector<uint64_t> touched_;
  void touch(Slot& s);

  std::thread committer_;
  std::mutex cmt_mu_;
  std::condition_variable cmt_cv_;
  bool cmt_stop_ = false, cmt_kick_ = false;

  friend class Txn;
};

// One operation's context: a generation, the blocks reserved for it, and the
// tree operations. Ends when destroyed. Keep it short: a commit waits for it.
// One thread uses a Txn at a time, and a thread holds one Txn at a time.
class Volume::Txn {
 public:
  Txn(Txn&&) noexcept;
  Txn& operator=(Txn&&) = delete;
  ~Txn();

  Generation gen() const;
  Volume& volume() const { return *s_.v; }
  // Reserve blocks now so that later steps cannot fail with ENOSPC halfway.
  Result<void> reserve(uint64_t nblocks);

  Result<TreeId> create_tree(uint8_t kind);
  Result<TreeId> clone_tree(TreeId src);  // O(1), shares every block (Rodeh)
  // Frees what no other tree shares; `progress`: BTree::drop's.
  Result<void> drop_tree(TreeId id, const BTree::DropProgress& progress = {});
  // Tree `dst` takes the content of `src`, as a clone of it would, and keeps
  // its id and root record otherwise (created, cloned_from): O(1) but for
  // freeing what only dst's old content held (drop_tree's cost, `progress`
  // its report). A rollback to a snapshot (format.md#snapshots), so that
  // views, mounts and snapshots keep naming the branch by its id.
  Result<void> reset_tree(TreeId dst, TreeId src, const BTree::DropProgress& progress = {});
  // The Volume::tree_epoch() value this Txn's last create, clone, drop or
  // reset made: the epoch just before it was this minus one.
  uint64_t tree_change() const { return s_.epoch; }
  Result<TreeInfo> tree_info(TreeId id);
  Result<std::vector<TreeInfo>> list_trees();

  Result<std::optional<std::vector<std::byte>>> get(TreeId t, Key k);
  Result<void> put(TreeId t, Key k, std::span<const std::byte> v);
  Result<bool> insert(TreeId t, Key k, std::span<const std::byte> v);
  Result<bool> erase(TreeId t, Key k);
  Result<void> scan(TreeId t, Key from, Key to,
                    const std::function<bool(Key, std::span<const std::byte>)>& fn);
  // Copies src's items with lo <= key <= hi into dst, which holds none there
  // (EEXIST), sharing src's leaves that lie wholly in the range
  // (BTree::graft, format.md#btree-graft): the cost follows the leaves at
  // the two ends and the number of shared leaves, not the items. Extents the
  // copied and shared items reference gain their references. Returns the
  // number of leaves shared.
  Result<uint64_t> graft(TreeId dst, TreeId src, Key lo, Key hi);
  // The keys whose values differ between trees a and b, in order, skipping
  // the subtrees they share (BTree::diff). Both trees are locked for reading
  // meanwhile: fn must not change either of them. `progress`: the share
  // compared so far (BTree::diff).
  Result<void> diff(TreeId a, TreeId b, const BTree::DiffFn& fn, uint64_t* nodes_read = nullptr,
                    const BTree::DiffProgress& progress = {});

  // What drop_tree(id) would free now (its DropStats), by the same walk
  // over a copy of the counts: nothing changes (BTree::exclusive,
  // format.md#accounting). The tree is locked for reading meanwhile.
  Result<BTree::DropStats> exclusive(TreeId id);
  // Every node of tree `id` and every extent reference of its values
  // (BTree::reach), the tree locked for reading meanwhile.
  Result<void> reach(TreeId id, const BTree::ReachFn& fn);
  // The number of nodes of tree `id` (BTree::count_nodes, with `memo`).
  Result<uint64_t> count_nodes(TreeId id, BTree::CountMemo& memo);
  // Scrubbing (format.md#scrub): every node of tree `id` (BTree::walk_nodes,
  // `seen` shared across calls), the tree locked for reading meanwhile;
  // walk_system_nodes: the same for the root and space trees.
  Result<void> walk_nodes(TreeId id, std::unordered_set<uint64_t>& seen, const BTree::NodeFn& fn);
  Result<void> walk_system_nodes(std::unordered_set<uint64_t>& seen, const BTree::NodeFn& fn);
  // Extents that tree values reference (file data). Length in blocks. On a
  // multi-device volume they go where place() said last (a placement
  // rule's classes, format.md#placement-rules), by default the default order.
  Result<BlockNo> alloc_extent(uint64_t nblocks);
  void place(const Placement& p) { s_.place = p; }
  Result<void> inc_extent(BlockNo start);
  Result<void> dec_extent(BlockNo start);
  // The references an extent has now (format.md#space-item): a leaf that
  // trees share counts once, so an extent two different leaves map has at
  // least 2 (send: only such an extent can be found in a parent).
  Result<uint32_t> extent_refs(BlockNo start);

  uint64_t take_inode_number();
  // The next number handed out is at least `n` (fsck: a tree holds a number
  // the counter had not reached).
  void advance_inode_numbers(uint64_t n);
  uint64_t next_inode_number() const;

  // Sets incompat feature bits (format.md#features) from this generation
  // on: the superblock that makes this Txn's changes durable carries them,
  // so an older build refuses the image before it could misread them. A
  // bit is never cleared.
  void add_incompat(uint64_t bits);
  // The same for ro_compat bits: an older build then opens read-only only.
  void add_ro_compat(uint64_t bits);

 private:
  friend class Volume;
  // The Txn's view of space, held inline (no allocation per operation).
  struct State final : NodeSpace {
    Volume* v = nullptr;  // null: moved from
    Generation gen;
    bool for_delete = false;
    bool grouped = false;  // inside this thread's Group: it holds the gate
    uint64_t reserved = 0;
    uint64_t epoch = 0;    // tree_change()
    Placement place{};     // place()
    Result<BlockNo> alloc_node() override;
    Result<uint32_t> refcount(BlockNo b) override;
    Result<void> inc_ref(BlockNo b) override;
    Result<Freed> dec_ref(BlockNo b) override;
    std::mutex* shared_nodes_mutex() override { return &v->shared_nodes_mu_; }
  };
  Txn(Volume* v, Generation gen, bool for_delete, bool grouped);
  Result<void> top_up(uint64_t nblocks);
  Result<void> mutated(const Result<void>& r, Slot* s);
  State s_;
};

inline Result<Volume::Txn> Volume::begin() { return begin(TxnOptions{}); }

}  // namespace plyfs
