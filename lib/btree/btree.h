// Copy-on-write B+trees with O(1) clones (format.md#btree).
//
// Keys are 16 bytes, values 0..max_value_len() bytes, nodes one block each.
// Every change shadows: a node is changed in place only if it was written in
// the open generation and belongs to this tree alone; otherwise it is copied
// to a new block and its parent updated, up to the root (the commit layer
// then makes the new root current atomically).
//
// Clones follow Rodeh, "B-trees, Shadowing, and Clones" (ACM TOS 2008): a
// clone takes one more reference on the root. Reference counts are kept per
// block by the space that hands out blocks (lib/alloc) and are lazy: copying
// a shared node adds a reference to each of its children and drops one from
// the original; dropping a tree frees only what reaches refcount zero.
//
// Invariants (checked by check_tree() and fsck, format.md#btree-invariants):
//   T1 keys strictly increase within a node and across a level, left to right
//   T2 an inner slot's key equals the lowest key of its child's subtree
//   T3 every leaf is at the same depth; a child's level is its parent's - 1
//   T4 a non-root node uses at least a quarter of its capacity; an inner root
//      has at least two children
//   T5 a parent records the child's block and generation; child gen <= parent gen
//   T6 a node's refcount equals the number of parents and roots pointing at it
//
// Concurrency: a BTree is not locked; the owner serializes writers of one tree
// and keeps readers out while a writer runs. Different trees may be used from
// different threads (the cache and the space are thread-safe).
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cache/cache.h"
#include "util/result.h"
#include "util/types.h"

namespace plyfs {

namespace btree_internal { struct Item; }

struct Key {
  uint64_t hi = 0, lo = 0;
  auto operator<=>(const Key&) const = default;
  static constexpr Key min() { return {0, 0}; }
  static constexpr Key max() { return {~0ull, ~0ull}; }
};

// Where a tree starts: what a root record or the superblock stores.
struct RootPtr {
  BlockNo block;
  Generation gen;  // the root node's header generation
  uint8_t level = 0;
  bool operator==(const RootPtr&) const = default;
};

// What a tree needs from the owner of space. The alloc layer implements it;
// it counts references per extent, keyed by the extent's first block.
class NodeSpace {
 public:
  enum class Freed { No, Deferred, Now };
  virtual ~NodeSpace() = default;
  virtual Result<BlockNo> alloc_node() = 0;           // a new block, refcount 1
  virtual Result<uint32_t> refcount(BlockNo b) = 0;
  virtual Result<void> inc_ref(BlockNo b) = 0;
  // Deferred: the count reached zero; the block stays untouchable until the
  // generation that freed it is durable. Now: the block was never written,
  // its number may be handed out again at once.
  virtual Result<Freed> dec_ref(BlockNo b) = 0;
  // A node two trees share may be copied by a writer of one while the other
  // is written, dropped or cloned: the look at its count and the change of
  // it must not interleave (two writers reading 2, both copying, both
  // decrementing, would free a node that one still reaches). Held around
  // them, for a node that may be shared; null where nothing is shared.
  virtual std::mutex* shared_nodes_mutex() { return nullptr; }
};

// An extent a leaf value references: its first block (the key of its space
// item) and its length.
struct ExtentRef {
  BlockNo start;
  uint64_t nblocks = 0;
};
// The extents a leaf value holds references to (file data). A tree kind whose
// values hold none leaves it empty. A tree owns one reference per value
// reference; a caller that removes or replaces a value drops its reference
// after the tree change, because the change may first copy a shared leaf,
// which takes references for the copy.
using ValueRefs = std::function<void(Key, std::span<const std::byte>, std::vector<ExtentRef>&)>;
// Moving extents (format.md#relocation): rewrites, in place, every extent
// reference a value holds whose extent moved (`moved` gives an extent's new
// first block, nullopt if it stays), and says whether it changed any. Each
// tree kind whose values reference extents has one, or its trees' extents
// cannot move.
using ValueMove = std::function<bool(Key, std::span<std::byte> value,
                                     const std::function<std::optional<BlockNo>(BlockNo start)>& moved)>;

struct TreeConfig {
  TreeId id;
  // False for trees that are never cloned (the root and space trees): their
  // nodes are always exclusive, so no refcount is ever looked up.
  bool shareable = true;
  // Nodes written after this generation cannot be shared (nothing cloned the
  // tree since), so changing them needs no refcount lookup (btrfs's trick).
  Generation last_shared{0};
  ValueRefs value_refs;
};

// A mutation's context: the open generation and where its blocks come from.
struct MutCtx {
  Generation gen;
  NodeSpace& space;
};

struct Problem {
  std::string code;     // stable identifier, e.g. "T1-key-order"
  uint64_t block = Error::kNoBlock;
  std::string message;  // one plain sentence
  uint64_t tree = 0;    // the tree it was found in (1 root, 2 space, >= 256 user), 0: none
  // What a repair of it costs, for the layers above the B-trees whose
  // checks come with repairs (fsck pass 5-6): Safe loses nothing (fsck -p),
  // Lossy gives something up (fsck -y), None cannot be repaired. fsck
  // classifies the B-tree and space problems itself.
  enum class Repair : uint8_t { None, Safe, Lossy };
  Repair repair = Repair::None;
};

class BTree {
 public:
  BTree(BlockCache& cache, uint64_t fs_id, TreeConfig cfg, RootPtr root);

  // Writes a new empty tree (one empty leaf) and returns its root.
  static Result<RootPtr> create(BlockCache& cache, uint64_t fs_id, TreeId owner, MutCtx& m);
  // Largest value a tree with this block size stores.
  static uint32_t max_value_len(uint32_t block_size);
  // Blocks one put/insert/erase may allocate at most, for reservations.
  uint32_t max_new_nodes() const { return 2u * (root_.level + 1u) + 2u; }

  const RootPtr& root() const { return root_; }
  const TreeConfig& config() const { return cfg_; }
  void set_last_shared(Generation g) { cfg_.last_shared = g; }

  Result<std::optional<std::vector<std::byte>>> get(Key k) const;
  Result<bool> contains(Key k) const;

  // Insert, or replace the value of an existing key.
  Result<void> put(MutCtx& m, Key k, std::span<const std::byte> value);
  // Insert only: false, with the tree unchanged, when the key exists.
  Result<bool> insert(MutCtx& m, Key k, std::span<const std::byte> value);
  // False, with the tree unchanged, when the key is absent.
  Result<bool> erase(MutCtx& m, Key k);

  // Ordered iteration. A cursor is invalidated by any change to its tree.
  class Cursor {
   public:
    bool valid() const { return !path_.empty(); }
    Key key() const;
    std::span<const std::byte> value() const;
    Result<void> next();

   private:
    friend class BTree;
    struct Step { BlockCache::Ref node; uint32_t slot; };
    const BTree* tree_ = nullptr;
    std::vector<Step> path_;
  };
  // The first item with key >= k.
  Result<Cursor> lower_bound(Key k) const;
  // Calls fn for each item with from <= key <= to, in order, while fn returns true.
  Result<void> scan(Key from, Key to,
                    const std::function<bool(Key, std::span<const std::byte>)>& fn) const;

  // Compares two trees (btrfs send's tree comparison). Calls fn for every key
  // whose value differs, in ascending key order, while fn returns true: with
  // the value in a and the value in b, an empty side meaning the key is absent
  // from that tree. The spans are valid during the call only. A subtree both
  // trees point to (same block and generation) holds the same items in both
  // and is skipped unread, so comparing a tree with a clone of it reads about
  // the paths to what changed since, not the whole tree. Both trees must use
  // one volume and stay unchanged during the call. nodes_read, if given,
  // is set to the number of nodes read (each root counts). `progress`, if
  // given, hears the share of the trees compared so far (0 to 1, rising)
  // after each node read or shared subtree skipped, and 1 at the end: as
  // DropStats::fraction, each child weighs its parent's share over the
  // parent's child count, a skipped subtree counts whole, and the share is
  // the lesser of the two trees' (the key range below both fronts is done).
  using DiffFn = std::function<bool(Key, std::optional<std::span<const std::byte>> in_a,
                                    std::optional<std::span<const std::byte>> in_b)>;
  using DiffProgress = std::function<void(double fraction)>;
  static Result<void> diff(const BTree& a, const BTree& b, const DiffFn& fn,
                           uint64_t* nodes_read = nullptr, const DiffProgress& progress = {});

  // Grafts (format.md#btree-graft): copies the items of another tree of the
  // same volume with lo <= key <= hi into this one, sharing the leaves that
  // lie wholly in that range instead of copying them, as a clone shares a
  // root. Planned first, without changes, so that the caller can reserve
  // space; then applied.
  struct GraftLeaf {
    Key key;  // its lowest key (its separator in the source, T2)
    BlockNo block;
    Generation gen;
  };
  struct GraftPlan {
    Key lo, hi;
    // Items copied one by one (of the boundary leaves), then the shared
    // leaves, then items again: in key order.
    std::vector<std::pair<Key, std::vector<std::byte>>> head, tail;
    std::vector<GraftLeaf> leaves;
    Generation newest;  // the newest shared leaf's generation
    // Blocks applying it to `dst` may allocate at most.
    uint64_t max_new_nodes(const BTree& dst) const;
  };
  static Result<GraftPlan> plan_graft(const BTree& src, Key lo, Key hi);
  // Applies a plan made from the source tree as it still is. This tree must
  // hold no key in [lo, hi] (EEXIST, nothing changed). A shared leaf gains
  // one reference (its values' extents keep theirs: they count leaves, not
  // trees); a copied item's extents gain one each. This tree's last_shared
  // rises to plan.newest; the caller raises the source's to it too (both
  // now reach those leaves, format.md#btree-cow). Returns the number of
  // leaves shared: 0 if this tree holds no key below lo, as then there is
  // no seam to link them at and every item is copied instead.
  Result<uint64_t> graft(MutCtx& m, const GraftPlan& plan);

  // Adds the reference a new clone holds on the root.
  static Result<void> clone_root(NodeSpace& space, const RootPtr& root);
  // Releases a tree's reference on its root, freeing every node, and every
  // extent its values reference, that no other tree shares. A large tree
  // takes long, in one transaction: `progress` hears what was freed so far
  // every kDropProgressEvery nodes and extents, and the totals at the end.
  struct DropStats {
    uint64_t nodes = 0;    // nodes freed (their refcount reached 0)
    uint64_t extents = 0;  // extents freed
    // The share of the tree walked, 0 to 1: each child of a node weighs
    // its parent's share over the parent's child count, so that a progress
    // line has a percentage and an ETA without a count of the nodes first.
    double fraction = 0;
    uint64_t extent_blocks = 0;  // the extents' length: nodes + extent_blocks blocks freed
  };
  using DropProgress = std::function<void(const DropStats&)>;
  static constexpr uint64_t kDropProgressEvery = 1024;
  static Result<void> drop(BlockCache& cache, uint64_t fs_id, const TreeConfig& cfg,
                           const RootPtr& root, MutCtx& m, const DropProgress& progress = {});
  // What drop() would free now, by the same walk with `counts` standing in
  // for the space (its dec_ref must only count, over the real counts):
  // nothing changes, the cache keeps every node. The basis of a branch's
  // exclusive bytes (format.md#accounting): exact by construction, and its
  // cost follows what would be freed, not the tree's size, since the walk
  // stops at the first node another tree still reaches.
  static Result<DropStats> exclusive(BlockCache& cache, uint64_t fs_id, const TreeConfig& cfg,
                                     const RootPtr& root, NodeSpace& counts);
  // Every node of a tree (once: a tree never reaches a node twice), then
  // every extent reference its leaves' values hold (as often as held), in
  // tree order. Reads the whole tree.
  using ReachFn = std::function<void(BlockNo start, uint64_t nblocks, bool node)>;
  static Result<void> reach(BlockCache& cache, uint64_t fs_id, const TreeConfig& cfg, const RootPtr& root,
                            const ReachFn& fn);
  // The number of nodes of a tree. `memo` keeps each subtree's count by its
  // root block, for nodes older than `open` (the open generation: its nodes
  // may still change in place, format.md#btree-cow), so that trees sharing
  // subtrees read each shared subtree once: counting a snapshot of a
  // counted tree reads about the nodes they do not share.
  struct CountMemo {
    struct Entry { uint64_t gen, nodes; };
    std::unordered_map<uint64_t, Entry> by_block;
  };
  static Result<uint64_t> count_nodes(BlockCache& cache, uint64_t fs_id, const RootPtr& root, Generation open,
                                      CountMemo& memo);

  // Every node of a tree with the generation and level its parent records
  // for it (what verify_node expects), read through the cache: the
  // structure a scrub then checks on the device (format.md#scrub). A node
  // in `seen` is skipped with its subtree, and every node visited is added,
  // so that trees sharing subtrees visit each once. An inner node that
  // cannot be read is visited with its error (not null) and its subtree
  // skipped: the walk goes on.
  using NodeFn = std::function<void(BlockNo, Generation, int level, const Error* unreadable)>;
  static Result<void> walk_nodes(BlockCache& cache, uint64_t fs_id, const RootPtr& root,
                                 std::unordered_set<uint64_t>& seen, const NodeFn& fn);

  // Moving blocks (format.md#relocation): rewrites a tree so that it reaches
  // no node `moves` names and no extent reference `move_value` changes. A
  // node that moves, or reaches something that does, is copied to a new
  // block once, whichever trees reach it: the copy takes the original's
  // reference count and the original loses all of it, so every parent that
  // pointed at the original points at the copy after its own rewrite, and
  // what was shared stays shared. Children and extents keep their counts
  // (the copy holds exactly the references the original held). `memo`
  // carries the copies across the trees of one move; `move_value` rewrites
  // a value's references in place (its length never changes) and says
  // whether it changed any. Returns the tree's new root, or nullopt when
  // nothing in it moved. The caller raises the last_shared generation of
  // every tree whose root changed to the open one (copies with several
  // references are new nodes that are shared, format.md#btree-cow).
  struct RelocMemo {
    struct Copy { BlockNo block; Generation gen; };
    std::unordered_map<uint64_t, std::optional<Copy>> nodes;  // nullopt: nothing below moves
    uint64_t copied = 0;
  };
  using MovesNode = std::function<bool(BlockNo)>;
  using MoveValue = std::function<bool(Key, std::span<std::byte>)>;
  static Result<std::optional<RootPtr>> relocate(BlockCache& cache, uint64_t fs_id, const TreeConfig& cfg,
                                                 const RootPtr& root, MutCtx& m, const MovesNode& moves,
                                                 const MoveValue& move_value, RelocMemo& memo);

 private:
  struct Split { Key key; BlockCache::Ref right; };
  // What a change left behind in a node: a new right sibling to link in, or
  // a node under a quarter full (a value replaced by a smaller one) to rebalance.
  struct PutResult { std::optional<Split> split; bool under = false; };
  Result<BlockCache::Ref> read(BlockNo b, Generation g, int level) const;
  Result<BlockCache::Ref> cow(MutCtx& m, BlockCache::Ref node);
  Result<BlockCache::Ref> cow_root(MutCtx& m);
  Result<BlockCache::Ref> cow_child(MutCtx& m, const BlockCache::Ref& parent, uint32_t slot);
  Result<PutResult> put_rec(MutCtx& m, BlockCache::Ref node, Key k,
                            std::span<const std::byte> v);
  Result<bool> erase_rec(MutCtx& m, BlockCache::Ref node, Key k);
  Result<void> collapse_root(MutCtx& m, BlockCache::Ref root);
  Result<void> rebalance(MutCtx& m, BlockCache::Ref parent, uint32_t slot);
  Result<void> plan_rec(const BlockCache::Ref& node, std::optional<Key> upper, GraftPlan& p) const;
  Result<std::vector<Split>> link_rec(MutCtx& m, BlockCache::Ref node, const GraftPlan& p);
  Result<std::vector<Split>> spread(MutCtx& m, BlockCache::Ref node, std::vector<btree_internal::Item>& items);
  Result<bool> fix_rec(MutCtx& m, BlockCache::Ref node, Key k);
  Result<BlockCache::Ref> new_node(MutCtx& m, int level);
  Result<void> free_node(MutCtx& m, const BlockCache::Ref& node);

  BlockCache& cache_;
  uint64_t fs_id_;
  TreeConfig cfg_;
  RootPtr root_;
};

// Verifies a node read from disk: checksum, magic, own address, fs_id,
// expected generation and level, field ranges, key order (format.md#btree-node).
Result<void> verify_node(std::span<const std::byte> block, BlockNo b, uint64_t fs_id,
                         Generation expect_gen, int expect_level);
// Stamps the checksum of a node about to be written.
void seal_node(std::span<std::byte> block);

// Walks a whole tree, checking T1-T5 and reporting every problem found rather
// than stopping at the first. The memo carries what was learned about each
// node across calls, so a subtree shared by several trees is read and checked
// once; later edges into it are still reported to on_node (for T6) and its
// key range is still checked against the new parent.
struct WalkMemo {
  // ok: the node itself verified; clean: neither it nor anything below it
  // had a problem (a tree reaching a shared subtree that is not clean is
  // damaged too, and is told so).
  struct Summary { Key min, max; int level; bool ok; bool clean = true; Generation gen{}; };
  std::unordered_map<uint64_t, Summary> nodes;
};
struct WalkHooks {
  // Every parent->child edge (and the root), first_visit on the first one.
  std::function<void(BlockNo b, int level, Generation gen, uint64_t owner, bool first_visit)>
      on_node;
  // Every item of every leaf, once.
  std::function<void(Key, std::span<const std::byte>)> on_item;
};
void check_tree(BlockCache& cache, uint64_t fs_id, const RootPtr& root, Generation max_gen,
                const WalkHooks& hooks, WalkMemo& memo, std::vector<Problem>& problems);

}  // namespace plyfs
