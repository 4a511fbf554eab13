#include "btree/btree.h"
#include <algorithm>

#include "btree/node.h"
#include "util/checksum.h"

namespace plyfs {

using namespace btree_internal;
using Ref = BlockCache::Ref;

namespace {

NodeView view(const Ref& r) { return NodeView(r->bytes()); }

struct ReadCtx {
  uint64_t fs_id;
  Generation gen;
  int level;
};

Result<void> verify_cb(const void* ctx, BlockNo b, std::span<const std::byte> bytes) {
  auto* c = static_cast<const ReadCtx*>(ctx);
  return verify_node(bytes, b, c->fs_id, c->gen, c->level);
}

// Splits `items` (which overflow one node) between `left` (already holding the
// header) and a fresh right node. Both halves fit and hold at least a quarter
// of a node, because no item is larger than a quarter (max_value_len).
size_t split_point(const std::vector<Item>& items, bool leaf) {
  uint64_t total = 0;
  for (const auto& it : items) total += it.size(leaf);
  uint64_t acc = 0;
  size_t s = 0;
  while (s < items.size() && acc < total / 2) acc += items[s++].size(leaf);
  return std::clamp<size_t>(s, 1, items.size() - 1);
}

uint32_t total_size(const std::vector<Item>& items, bool leaf) {
  uint32_t t = 0;
  for (const auto& it : items) t += it.size(leaf);
  return t;
}

}  // namespace

uint32_t BTree::max_value_len(uint32_t block_size) {
  return (block_size - kHeader) / 4 - kLeafItem;
}

BTree::BTree(BlockCache& cache, uint64_t fs_id, TreeConfig cfg, RootPtr root)
    : cache_(cache), fs_id_(fs_id), cfg_(std::move(cfg)), root_(root) {}

Result<Ref> BTree::read(BlockNo b, Generation g, int level) const {
  ReadCtx ctx{fs_id_, g, level};
  Ref ref = PLY_TRY(cache_.get(b, BlockCache::Verifier{verify_cb, &ctx}));
  // A cached block was verified when it was read; a pointer that disagrees
  // with it now is a stale or misdirected pointer (T5).
  NodeView v = view(ref);
  if (v.gen() != g || v.level() != level)
    return Error::corrupt(b.v, "node generation " + std::to_string(v.gen().v) + " level " +
                                   std::to_string(v.level()) + " does not match its parent (" +
                                   std::to_string(g.v) + ", " + std::to_string(level) + ")");
  return ref;
}

Result<Ref> BTree::new_node(MutCtx& m, int level) {
  BlockNo b = PLY_TRY(m.space.alloc_node());
  Ref ref = cache_.create(b, m.gen);
  view(ref).init(level, cfg_.id, m.gen, b, fs_id_);
  return ref;
}

Result<void> BTree::free_node(MutCtx& m, const Ref& node) {
  auto f = PLY_TRY(m.space.dec_ref(node->blockno));
  if (f == NodeSpace::Freed::Now) cache_.discard(node->blockno);
  else if (f == NodeSpace::Freed::Deferred) cache_.drop_clean(node->blockno);
  return ok();
}

Result<RootPtr> BTree::create(BlockCache& cache, uint64_t fs_id, TreeId owner, MutCtx& m) {
  BTree t(cache, fs_id, TreeConfig{owner, false, Generation{0}, {}}, RootPtr{});
  Ref r = PLY_TRY(t.new_node(m, 0));
  return RootPtr{r->blockno, m.gen, 0};
}

// Shadowing (format.md#btree-cow). In place only when the node was written in
// this generation and no other tree references it; otherwise a copy in a new
// block. Copying a shared node is where lazy refcounting happens: the copy is
// a new parent of every child, and the original loses this tree's reference.
Result<Ref> BTree::cow(MutCtx& m, Ref node) {
  NodeView v = view(node);
  const Generation g = v.gen();
  if (g > m.gen) return Error::corrupt(node->blockno.v, "node generation is in the future");
  uint32_t refs = 1;
  std::unique_lock<std::mutex> shared_lk;  // to the end: the count and its change
  if (cfg_.shareable && g <= cfg_.last_shared) {
    if (std::mutex* mu = m.space.shared_nodes_mutex()) shared_lk = std::unique_lock(*mu);
    refs = PLY_TRY(m.space.refcount(node->blockno));
  }
  if (refs == 0) return Error::corrupt(node->blockno.v, "reachable node has refcount zero");
  if (g == m.gen && refs == 1) return node;

  BlockNo nb = PLY_TRY(m.space.alloc_node());
  Ref copy = cache_.create(nb, m.gen);
  std::memcpy(copy->data(), node->data(), node->size);
  NodeView cv = view(copy);
  cv.h().generation.set(m.gen.v);
  cv.h().blockno.set(nb.v);
  cv.h().owner.set(cfg_.id.v);

  if (refs > 1) {
    if (!v.leaf()) {
      for (uint32_t i = 0; i < v.n(); i++) PLY_CHECK(m.space.inc_ref(v.child(i)));
    } else if (cfg_.value_refs) {
      std::vector<ExtentRef> ext;
      for (uint32_t i = 0; i < v.n(); i++) cfg_.value_refs(v.key(i), v.value(i), ext);
      for (const ExtentRef& e : ext) PLY_CHECK(m.space.inc_ref(e.start));
    }
    auto f = PLY_TRY(m.space.dec_ref(node->blockno));
    if (f != NodeSpace::Freed::No)
      return Error::corrupt(node->blockno.v, "shared node lost its last reference on copy");
  } else {
    PLY_CHECK(free_node(m, node));
  }
  return copy;
}

Result<Ref> BTree::cow_root(MutCtx& m) {
  Ref root = PLY_TRY(read(root_.block, root_.gen, root_.level));
  Ref r = PLY_TRY(cow(m, root));
  root_ = RootPtr{r->blockno, m.gen, root_.level};
  return r;
}

Result<Ref> BTree::cow_child(MutCtx& m, const Ref& parent, uint32_t slot) {
  NodeView pv = view(parent);
  Ref child = PLY_TRY(read(pv.child(slot), pv.child_gen(slot), pv.level() - 1));
  Ref c = PLY_TRY(cow(m, child));
  if (c != child || pv.child_gen(slot) != m.gen) pv.set_child(slot, c->blockno, m.gen);
  return c;
}

// ------------------------------------------------------------------ reads

Result<std::optional<std::vector<std::byte>>> BTree::get(Key k) const {
  // Fast path: every node cached. The descent holds the cache's shared lock
  // instead of a reference per node (see BlockCache::Pin).
  {
    auto pin = cache_.pin();
    const CachedBlock* blk = pin.find(root_.block);
    Generation g = root_.gen;
    int level = root_.level;
    while (blk) {
      NodeView v(std::span<std::byte>(const_cast<std::byte*>(blk->data()), blk->size));
      if (v.gen() != g || v.level() != level) break;  // the slow path reports it
      v.prefetch_items();
      if (v.leaf()) {
        uint32_t i = v.lower_bound(k);
        if (i < v.n() && v.key(i) == k) {
          auto val = v.value(i);
          return std::optional<std::vector<std::byte>>(std::in_place, val.begin(), val.end());
        }
        return std::optional<std::vector<std::byte>>();
      }
      uint32_t i = v.child_index(k);
      g = v.child_gen(i);
      level = v.level() - 1;
      blk = pin.find(v.child(i));
    }
  }
  Ref node = PLY_TRY(read(root_.block, root_.gen, root_.level));
  for (;;) {
    NodeView v = view(node);
    v.prefetch_items();
    if (v.leaf()) {
      uint32_t i = v.lower_bound(k);
      if (i < v.n() && v.key(i) == k) {
        auto val = v.value(i);
        return std::optional<std::vector<std::byte>>(std::in_place, val.begin(), val.end());
      }
      return std::optional<std::vector<std::byte>>();
    }
    uint32_t i = v.child_index(k);
    node = PLY_TRY(read(v.child(i), v.child_gen(i), v.level() - 1));
  }
}

Result<bool> BTree::contains(Key k) const {
  auto v = PLY_TRY(get(k));
  return v.has_value();
}

Result<BTree::Cursor> BTree::lower_bound(Key k) const {
  Cursor c;
  c.tree_ = this;
  Ref node = PLY_TRY(read(root_.block, root_.gen, root_.level));
  for (;;) {
    NodeView v = view(node);
    if (v.leaf()) {
      uint32_t i = v.lower_bound(k);
      c.path_.push_back({node, i});
      if (i == v.n()) {
        c.path_.back().slot = v.n() - (v.n() > 0 ? 1 : 0);
        if (v.n() == 0) c.path_.clear();
        else PLY_CHECK(c.next());
      }
      return c;
    }
    uint32_t i = v.child_index(k);
    c.path_.push_back({node, i});
    node = PLY_TRY(read(v.child(i), v.child_gen(i), v.level() - 1));
  }
}

Key BTree::Cursor::key() const {
  const auto& s = path_.back();
  return NodeView(s.node->bytes()).key(s.slot);
}

std::span<const std::byte> BTree::Cursor::value() const {
  const auto& s = path_.back();
  return NodeView(s.node->bytes()).value(s.slot);
}

Result<void> BTree::Cursor::next() {
  path_.back().slot++;
  if (path_.back().slot < NodeView(path_.back().node->bytes()).n()) return ok();
  path_.pop_back();
  while (!path_.empty()) {
    auto& top = path_.back();
    NodeView tv(top.node->bytes());
    if (++top.slot < tv.n()) {
      Ref node = PLY_TRY(tree_->read(tv.child(top.slot), tv.child_gen(top.slot), tv.level() - 1));
      for (;;) {
        NodeView v(node->bytes());
        path_.push_back({node, 0});
        if (v.leaf()) {
          if (v.n() == 0) return Error::corrupt(node->blockno.v, "empty non-root leaf");
          return ok();
        }
        node = PLY_TRY(tree_->read(v.child(0), v.child_gen(0), v.level() - 1));
      }
    }
    path_.pop_back();
  }
  return ok();
}

Result<void> BTree::scan(Key from, Key to,
                         const std::function<bool(Key, std::span<const std::byte>)>& fn) const {
  Cursor c = PLY_TRY(lower_bound(from));
  while (c.valid() && c.key() <= to) {
    if (!fn(c.key(), c.value())) break;
    PLY_CHECK(c.next());
  }
  return ok();
}

// ------------------------------------------------------------------ diff

namespace {

// One tree's side of a diff: what is left to compare, as the path of nodes
// from the root, each with the slot where its rest begins. The front is the
// top node's slot: a leaf item, or, in an inner node, the child's whole
// subtree, which is read only when it has to be. Leaving subtrees unread
// until the other side is known not to share them is what skips them.
struct DiffSide {
  struct Step { Ref node; uint32_t slot; };
  std::vector<Step> path;

  bool done() const { return path.empty(); }
  NodeView top() const { return view(path.back().node); }
  uint32_t slot() const { return path.back().slot; }
  // The front's lowest key: an inner slot's key is its subtree's lowest (T2).
  Key key() const { return top().key(slot()); }
  // The front's level: the child's for a subtree, -1 for a leaf item.
  int level() const { return top().level() - 1; }
  // The share of the tree before the front (BTree::diff's progress): each
  // slot of a node weighs the node's share over its slot count. An empty
  // path is a tree done.
  double done_share() const {
    double done = 0, share = 1;
    for (const Step& s : path) {
      const double each = share / view(s.node).n();
      done += each * s.slot;
      share = each;
    }
    return path.empty() ? 1.0 : done;
  }
  // Moves past the front, leaving the nodes it used up.
  void advance() {
    path.back().slot++;
    while (path.back().slot >= top().n()) {
      path.pop_back();
      if (path.empty()) return;
      path.back().slot++;
    }
  }
};

}  // namespace

// Walks both trees at once, each side a stream of items and unread subtrees
// ordered by key (DiffSide). Everything below the smaller front key has been
// compared. At each step:
//   - fronts with different keys: the smaller one is an item the other tree
//     lacks, or a subtree to read (the other tree has nothing at its first
//     key, so does not share it);
//   - equal keys, both subtrees of the same block and generation: the same
//     items on both sides, skipped unread. A node reachable from two trees
//     is never changed in place (a change shadows it first, format.md#btree-cow)
//     and is not freed while a tree reaches it (T6), so its number names its
//     content;
//   - equal keys otherwise: read the subtree of the higher level, where the
//     other side's may lie (both when the levels are equal too: a key lies in
//     one node per level, so these two are not shared), until two subtrees
//     meet or both fronts are items, which merge.
// Trees of different heights or with different split points thus still meet
// at the subtrees they share, and a clone with a few changes costs about the
// paths to those changes on each side.
Result<void> BTree::diff(const BTree& a, const BTree& b, const DiffFn& fn, uint64_t* nodes_read,
                         const DiffProgress& progress) {
  uint64_t unused = 0;
  uint64_t& reads = nodes_read ? *nodes_read : unused;
  reads = 0;
  DiffSide sa, sb;
  // Rounding may make a share dip by an ulp: what was said stays said.
  double said = 0;
  auto report = [&] {
    if (!progress) return;
    said = std::max(said, std::min(sa.done_share(), sb.done_share()));
    progress(said);
  };
  auto done = [&]() -> Result<void> {  // the walk ended, or fn ended it
    if (progress) progress(1.0);
    return ok();
  };
  if (a.root_ == b.root_) return done();  // the same tree: a clone neither side changed

  auto start = [&](const BTree& t, DiffSide& s) -> Result<void> {
    Ref r = PLY_TRY(t.read(t.root_.block, t.root_.gen, t.root_.level));
    reads++;
    if (view(r).n() > 0) s.path.push_back({r, 0});  // else an empty tree: nothing left
    return ok();
  };
  // Opens the front subtree: the slots of its top node become the front.
  auto descend = [&](const BTree& t, DiffSide& s) -> Result<void> {
    NodeView v = s.top();
    const uint32_t i = s.slot();
    Ref c = PLY_TRY(t.read(v.child(i), v.child_gen(i), v.level() - 1));
    reads++;
    if (view(c).n() == 0) return Error::corrupt(c->blockno.v, "empty non-root node");
    s.path.push_back({c, 0});
    return ok();
  };

  PLY_CHECK(start(a, sa));
  PLY_CHECK(start(b, sb));
  while (!sa.done() || !sb.done()) {
    bool take_a = !sa.done(), take_b = !sb.done();
    if (take_a && take_b) {
      const Key ka = sa.key(), kb = sb.key();
      take_a = ka <= kb;
      take_b = kb <= ka;
    }
    if (take_a && take_b) {  // equal keys
      const int la = sa.level(), lb = sb.level();
      if (la >= 0 && la == lb) {
        const NodeView va = sa.top(), vb = sb.top();
        if (va.child(sa.slot()) == vb.child(sb.slot()) &&
            va.child_gen(sa.slot()) == vb.child_gen(sb.slot())) {
          sa.advance();
          sb.advance();
          report();
          continue;
        }
      }
      if (la >= 0 && la >= lb) PLY_CHECK(descend(a, sa));
      if (lb >= 0 && lb >= la) PLY_CHECK(descend(b, sb));
      if (la >= 0 || lb >= 0) {
        report();
        continue;
      }
      // Two items of the same key.
      const auto va = sa.top().value(sa.slot()), vb = sb.top().value(sb.slot());
      if (!std::equal(va.begin(), va.end(), vb.begin(), vb.end()) && !fn(sa.key(), va, vb))
        return done();
      sa.advance();
      sb.advance();
      continue;
    }
    DiffSide& s = take_a ? sa : sb;
    if (s.level() >= 0) {
      PLY_CHECK(descend(take_a ? a : b, s));
      report();
      continue;
    }
    // An item only this side has.
    const auto v = s.top().value(s.slot());
    if (!(take_a ? fn(s.key(), v, std::nullopt) : fn(s.key(), std::nullopt, v))) return done();
    s.advance();
  }
  return done();
}

// ------------------------------------------------------------------ writes

Result<void> BTree::put(MutCtx& m, Key k, std::span<const std::byte> value) {
  if (value.size() > max_value_len(cache_.block_size()))
    return Error::invalid("value of " + std::to_string(value.size()) + " bytes exceeds the " +
                          std::to_string(max_value_len(cache_.block_size())) + "-byte limit");
  Ref root = PLY_TRY(cow_root(m));
  auto r = PLY_TRY(put_rec(m, root, k, value));
  if (r.split) {
    NodeView rv = view(root);
    Ref nr = PLY_TRY(new_node(m, rv.level() + 1));
    NodeView nv = view(nr);
    nv.inner_insert(0, rv.key(0), root->blockno, m.gen);
    nv.inner_insert(1, r.split->key, r.split->right->blockno, m.gen);
    root_ = RootPtr{nr->blockno, m.gen, static_cast<uint8_t>(rv.level() + 1)};
  } else {
    PLY_CHECK(collapse_root(m, root));
  }
  return ok();
}

Result<bool> BTree::insert(MutCtx& m, Key k, std::span<const std::byte> value) {
  if (PLY_TRY(contains(k))) return false;
  PLY_CHECK(put(m, k, value));
  return true;
}

Result<BTree::PutResult> BTree::put_rec(MutCtx& m, Ref node, Key k,
                                        std::span<const std::byte> v) {
  NodeView nv = view(node);
  std::vector<Item> items;
  const uint32_t min_fill = nv.capacity() / 4;
  if (nv.leaf()) {
    uint32_t i = nv.lower_bound(k);
    if (i < nv.n() && nv.key(i) == k) {
      if (nv.leaf_replace(i, v)) return PutResult{std::nullopt, nv.used() < min_fill};
      items = nv.items();
      items[i].value.assign(v.begin(), v.end());
    } else {
      if (nv.leaf_insert(i, k, v)) return PutResult{};
      items = nv.items();
      items.insert(items.begin() + i, Item{k, std::vector<std::byte>(v.begin(), v.end()), 0, 0});
    }
  } else {
    uint32_t i = nv.child_index(k);
    Ref child = PLY_TRY(cow_child(m, node, i));
    auto r = PLY_TRY(put_rec(m, child, k, v));
    nv.set_key_at(i, view(child).key(0));  // T2: k may now be the child's lowest key
    if (r.under) {
      PLY_CHECK(rebalance(m, node, i));
      return PutResult{std::nullopt, nv.used() < min_fill};
    }
    if (!r.split) return PutResult{};
    if (nv.inner_insert(i + 1, r.split->key, r.split->right->blockno, m.gen)) return PutResult{};
    items = nv.items();
    items.insert(items.begin() + i + 1, Item{r.split->key, {}, r.split->right->blockno.v, m.gen.v});
  }
  size_t s = split_point(items, nv.leaf());
  Ref right = PLY_TRY(new_node(m, nv.level()));
  if (total_size(items, nv.leaf()) > 2 * nv.capacity())
    return Error::corrupt(node->blockno.v, "split overflow");  // cannot happen: T4 sizing
  nv.rebuild(items.data(), s);
  view(right).rebuild(items.data() + s, items.size() - s);
  return PutResult{Split{items[s].key, right}, false};
}

// T4: an inner root keeps at least two children; with one left, its child
// becomes the root.
Result<void> BTree::collapse_root(MutCtx& m, Ref root) {
  for (;;) {
    NodeView rv = view(root);
    if (rv.leaf() || rv.n() != 1) return ok();
    RootPtr child{rv.child(0), rv.child_gen(0), static_cast<uint8_t>(rv.level() - 1)};
    Ref c = PLY_TRY(read(child.block, child.gen, child.level));
    PLY_CHECK(free_node(m, root));
    root_ = child;
    root = c;
  }
}

Result<bool> BTree::erase(MutCtx& m, Key k) {
  if (!PLY_TRY(contains(k))) return false;
  Ref root = PLY_TRY(cow_root(m));
  (void)PLY_TRY(erase_rec(m, root, k));
  PLY_CHECK(collapse_root(m, root));
  return true;
}

Result<bool> BTree::erase_rec(MutCtx& m, Ref node, Key k) {
  NodeView nv = view(node);
  if (nv.leaf()) {
    uint32_t i = nv.lower_bound(k);
    if (i >= nv.n() || nv.key(i) != k)
      return Error::corrupt(node->blockno.v, "key vanished during erase");
    nv.leaf_erase(i);
    return nv.used() < nv.capacity() / 4;
  }
  uint32_t i = nv.child_index(k);
  Ref child = PLY_TRY(cow_child(m, node, i));
  bool under = PLY_TRY(erase_rec(m, child, k));
  if (view(child).n() > 0) nv.set_key_at(i, view(child).key(0));
  if (under) PLY_CHECK(rebalance(m, node, i));
  return nv.used() < nv.capacity() / 4;
}

// Child `slot` of `parent` is underfull (T4): merge it with a neighbour when
// both fit in one node, else share items so that both are at least a quarter
// full. Both children are shadowed first; the parent already is.
Result<void> BTree::rebalance(MutCtx& m, Ref parent, uint32_t slot) {
  NodeView pv = view(parent);
  if (pv.n() < 2) return ok();  // the root's only child: erase() collapses it
  uint32_t li = slot > 0 ? slot - 1 : slot;
  uint32_t ri = li + 1;
  Ref left = PLY_TRY(cow_child(m, parent, li));
  Ref right = PLY_TRY(cow_child(m, parent, ri));
  NodeView lv = view(left), rv = view(right);
  std::vector<Item> items = lv.items();
  std::vector<Item> more = rv.items();
  items.insert(items.end(), std::make_move_iterator(more.begin()),
               std::make_move_iterator(more.end()));
  const bool leaf = lv.leaf();
  if (total_size(items, leaf) <= lv.capacity()) {
    lv.rebuild(items.data(), items.size());
    pv.inner_erase(ri);
    PLY_CHECK(free_node(m, right));
    if (lv.n() > 0) pv.set_key_at(li, lv.key(0));
    return ok();
  }
  size_t s = split_point(items, leaf);
  lv.rebuild(items.data(), s);
  rv.rebuild(items.data() + s, items.size() - s);
  pv.set_key_at(li, lv.key(0));
  pv.set_key_at(ri, rv.key(0));
  return ok();
}

// ------------------------------------------------------------------ grafts

// Plans a graft (format.md#btree-graft): walks the source over [lo, hi] only.
// A leaf whose separator bounds put it wholly inside the range is shared and
// not read; the leaves at the two ends are read and their items in the range
// copied. The order is head items, shared leaves, tail items; a whole leaf
// met after tail items began (cannot happen in a valid tree) is copied too.
Result<BTree::GraftPlan> BTree::plan_graft(const BTree& src, Key lo, Key hi) {
  GraftPlan p;
  p.lo = lo;
  p.hi = hi;
  if (hi < lo) return p;
  Ref root = PLY_TRY(src.read(src.root_.block, src.root_.gen, src.root_.level));
  PLY_CHECK(src.plan_rec(root, std::nullopt, p));
  return p;
}

// `upper`: the lowest key past this node's subtree (its right neighbour's
// separator), if any.
Result<void> BTree::plan_rec(const Ref& node, std::optional<Key> upper, GraftPlan& p) const {
  NodeView v = view(node);
  if (v.leaf()) {
    for (uint32_t i = v.lower_bound(p.lo); i < v.n() && v.key(i) <= p.hi; i++) {
      auto val = v.value(i);
      (p.leaves.empty() ? p.head : p.tail).emplace_back(v.key(i), std::vector<std::byte>(val.begin(), val.end()));
    }
    return ok();
  }
  for (uint32_t i = v.child_index(p.lo); i < v.n() && v.key(i) <= p.hi; i++) {
    // Child i holds keys in [key(i), next) (T1, T2).
    const std::optional<Key> next = i + 1 < v.n() ? std::optional<Key>(v.key(i + 1)) : upper;
    const bool whole = v.level() == 1 && v.key(i) >= p.lo && next && *next <= p.hi && p.tail.empty();
    if (whole) {
      p.leaves.push_back(GraftLeaf{v.key(i), v.child(i), v.child_gen(i)});
      p.newest = std::max(p.newest, v.child_gen(i));
      continue;
    }
    Ref c = PLY_TRY(read(v.child(i), v.child_gen(i), v.level() - 1));
    PLY_CHECK(plan_rec(c, next, p));
  }
  return ok();
}

uint64_t BTree::GraftPlan::max_new_nodes(const BTree& dst) const {
  // The leaves go in as children of level-1 nodes, each split node at
  // least 3/8 full: new inner nodes per level are at most a quarter-node
  // of children's worth each, up every level; the seam fixes and the copied
  // items are ordinary puts.
  const uint64_t per_node = (dst.cache_.block_size() - kHeader) / kInnerItem / 4;
  const uint64_t levels = dst.root_.level + 3ull;
  return (leaves.size() / per_node + 2) * levels * 2 + (head.size() + tail.size() + 6) * dst.max_new_nodes();
}

// Replaces an inner node's children with `items`, splitting it into as many
// nodes as needed, each between 3/8 and 3/4 full (T4): a graft may add more
// children than one split can take.
Result<std::vector<BTree::Split>> BTree::spread(MutCtx& m, Ref node, std::vector<Item>& items) {
  NodeView nv = view(node);
  const size_t cap = nv.capacity() / kInnerItem;
  if (items.size() <= cap) {
    nv.rebuild(items.data(), items.size());
    return std::vector<Split>{};
  }
  const size_t per = cap * 3 / 4;
  const size_t k = (items.size() + per - 1) / per;
  std::vector<Split> out;
  size_t at = 0;
  for (size_t c = 0; c < k; c++) {
    const size_t end = items.size() * (c + 1) / k;
    if (c == 0) {
      nv.rebuild(items.data(), end);
    } else {
      Ref r = PLY_TRY(new_node(m, nv.level()));
      view(r).rebuild(items.data() + at, end - at);
      out.push_back(Split{items[at].key, r});
    }
    at = end;
  }
  return out;
}

// Descends to the level-1 node whose child P holds the keys just below lo,
// splits P at lo (what P holds above hi goes to a new leaf Q) and links the
// shared leaves, then Q, right after P. New nodes from splits go up.
Result<std::vector<BTree::Split>> BTree::link_rec(MutCtx& m, Ref node, const GraftPlan& p) {
  NodeView nv = view(node);
  const uint32_t i = nv.child_index(p.lo);
  std::vector<Item> kids;
  if (nv.level() == 1) {
    Ref leaf = PLY_TRY(cow_child(m, node, i));
    NodeView lv = view(leaf);
    const uint32_t s = lv.lower_bound(p.lo);
    if (s == 0) return Error::corrupt(leaf->blockno.v, "graft seam has no key below it");
    for (const GraftLeaf& g : p.leaves) kids.push_back(Item{g.key, {}, g.block.v, g.gen.v});
    if (s < lv.n()) {
      std::vector<Item> items = lv.items();
      Ref q = PLY_TRY(new_node(m, 0));
      view(q).rebuild(items.data() + s, items.size() - s);
      lv.rebuild(items.data(), s);
      kids.push_back(Item{items[s].key, {}, q->blockno.v, m.gen.v});
    }
  } else {
    Ref child = PLY_TRY(cow_child(m, node, i));
    for (Split& sp : PLY_TRY(link_rec(m, child, p)))
      kids.push_back(Item{sp.key, {}, sp.right->blockno.v, m.gen.v});
  }
  if (kids.empty()) return std::vector<Split>{};
  std::vector<Item> items = nv.items();
  items.insert(items.begin() + i + 1, std::make_move_iterator(kids.begin()),
               std::make_move_iterator(kids.end()));
  return spread(m, node, items);
}

// Restores T4 along the path to the leaf holding k, as an erase does.
Result<bool> BTree::fix_rec(MutCtx& m, Ref node, Key k) {
  NodeView nv = view(node);
  if (nv.leaf()) return nv.n() == 0 || nv.used() < nv.capacity() / 4;
  const uint32_t i = nv.child_index(k);
  Ref child = PLY_TRY(cow_child(m, node, i));
  const bool under = PLY_TRY(fix_rec(m, child, k));
  if (view(child).n() > 0) nv.set_key_at(i, view(child).key(0));
  if (under) PLY_CHECK(rebalance(m, node, i));
  return nv.used() < nv.capacity() / 4;
}

Result<uint64_t> BTree::graft(MutCtx& m, const GraftPlan& p) {
  {
    Cursor c = PLY_TRY(lower_bound(p.lo));
    if (c.valid() && c.key() <= p.hi) return Error::io(EEXIST, "graft target range is not empty");
  }
  Cursor first = PLY_TRY(lower_bound(Key::min()));
  const bool below = first.valid() && first.key() < p.lo;
  std::vector<std::pair<Key, std::vector<std::byte>>> copies = p.head;
  if (!below) {
    // No seam to link at: copy the shared leaves' items as well.
    for (const GraftLeaf& g : p.leaves) {
      Ref l = PLY_TRY(read(g.block, g.gen, 0));
      NodeView lv = view(l);
      for (uint32_t i = 0; i < lv.n(); i++) {
        auto val = lv.value(i);
        copies.emplace_back(lv.key(i), std::vector<std::byte>(val.begin(), val.end()));
      }
    }
  } else if (!p.leaves.empty()) {
    // From now on this tree reaches nodes another one does: changes to them
    // must look their counts up (format.md#btree-cow).
    cfg_.last_shared = std::max(cfg_.last_shared, p.newest);
    Ref root = PLY_TRY(cow_root(m));
    if (view(root).leaf()) {
      Ref nr = PLY_TRY(new_node(m, 1));
      view(nr).inner_insert(0, view(root).key(0), root->blockno, m.gen);
      root_ = RootPtr{nr->blockno, m.gen, 1};
      root = nr;
    }
    std::vector<Split> splits = PLY_TRY(link_rec(m, root, p));
    while (!splits.empty()) {
      const int level = view(root).level();
      Ref nr = PLY_TRY(new_node(m, level + 1));
      std::vector<Item> items{Item{view(root).key(0), {}, root->blockno.v, m.gen.v}};
      for (Split& sp : splits) items.push_back(Item{sp.key, {}, sp.right->blockno.v, m.gen.v});
      splits = PLY_TRY(spread(m, nr, items));
      root_ = RootPtr{nr->blockno, m.gen, static_cast<uint8_t>(level + 1)};
      root = nr;
    }
    for (const GraftLeaf& g : p.leaves) PLY_CHECK(m.space.inc_ref(g.block));
    // The seams: P (keys below lo) and Q (the first key above hi) may be
    // under a quarter full now. Each merges with or borrows from a
    // neighbour, which may be a shared leaf (then copied, as any change to
    // a shared node is).
    std::vector<Key> seams{p.lo.lo ? Key{p.lo.hi, p.lo.lo - 1} : Key{p.lo.hi - 1, ~0ull}};
    {
      Cursor c = PLY_TRY(lower_bound(p.hi));
      if (c.valid() && c.key() == p.hi) PLY_CHECK(c.next());
      if (c.valid()) seams.push_back(c.key());
    }
    for (Key k : seams) {
      Ref r = PLY_TRY(cow_root(m));
      (void)PLY_TRY(fix_rec(m, r, k));
      PLY_CHECK(collapse_root(m, r));
    }
  }
  copies.insert(copies.end(), p.tail.begin(), p.tail.end());
  for (const auto& [k, v] : copies) {
    PLY_CHECK(put(m, k, v));
    if (cfg_.value_refs) {
      std::vector<ExtentRef> ext;
      cfg_.value_refs(k, v, ext);
      for (const ExtentRef& e : ext) PLY_CHECK(m.space.inc_ref(e.start));
    }
  }
  return below ? p.leaves.size() : 0;
}

// ------------------------------------------------------------ clone, drop

Result<void> BTree::clone_root(NodeSpace& space, const RootPtr& root) {
  std::unique_lock<std::mutex> lk;
  if (std::mutex* mu = space.shared_nodes_mutex()) lk = std::unique_lock(*mu);
  return space.inc_ref(root.block);
}

namespace {
struct Dropper {
  BlockCache& cache;
  uint64_t fs_id;
  const TreeConfig& cfg;
  MutCtx& m;
  const BTree::DropProgress& progress;
  // A dry run (BTree::exclusive): m.space only counts, and the cache keeps
  // what a real drop would evict.
  bool dry = false;
  BTree::DropStats st{};
  uint64_t next_report = BTree::kDropProgressEvery;

  void freed(uint64_t& counter) {
    counter++;
    if (progress && st.nodes + st.extents >= next_report) {
      next_report += BTree::kDropProgressEvery;
      progress(st);
    }
  }
  // `share`: this subtree's part of the whole tree (DropStats::fraction).
  Result<void> node(BlockNo b, Generation g, int level, double share) {
    ReadCtx ctx{fs_id, g, level};
    // Read before releasing: a block freed "Now" may be handed out again at once.
    Ref node = PLY_TRY(cache.get(b, BlockCache::Verifier{verify_cb, &ctx}));
    NodeView v = view(node);
    if (v.gen() != g || v.level() != level)
      return Error::corrupt(b.v, "node does not match its parent during drop");
    NodeSpace::Freed f;
    {
      // Against a writer of another tree copying this node (BTree::cow).
      std::unique_lock<std::mutex> lk;
      if (std::mutex* mu = m.space.shared_nodes_mutex()) lk = std::unique_lock(*mu);
      f = PLY_TRY(m.space.dec_ref(b));
    }
    if (f == NodeSpace::Freed::No) {  // still shared: its subtree stays
      st.fraction += share;
      return ok();
    }
    if (!v.leaf()) {
      for (uint32_t i = 0; i < v.n(); i++)
        PLY_CHECK(this->node(v.child(i), v.child_gen(i), level - 1, share / v.n()));
    } else {
      st.fraction += share;
      if (cfg.value_refs) {
        std::vector<ExtentRef> ext;
        for (uint32_t i = 0; i < v.n(); i++) cfg.value_refs(v.key(i), v.value(i), ext);
        for (const ExtentRef& e : ext)
          if (PLY_TRY(m.space.dec_ref(e.start)) != NodeSpace::Freed::No) {
            st.extent_blocks += e.nblocks;
            freed(st.extents);
          }
      }
    }
    if (!dry) {
      if (f == NodeSpace::Freed::Now) cache.discard(b);
      else cache.drop_clean(b);
    }
    freed(st.nodes);
    return ok();
  }
};

// Visits every node once and every extent reference of its leaves.
struct Walker {
  BlockCache& cache;
  uint64_t fs_id;
  const TreeConfig& cfg;
  const BTree::ReachFn& fn;

  Result<void> node(BlockNo b, Generation g, int level) {
    ReadCtx ctx{fs_id, g, level};
    Ref node = PLY_TRY(cache.get(b, BlockCache::Verifier{verify_cb, &ctx}));
    NodeView v = view(node);
    if (v.gen() != g || v.level() != level)
      return Error::corrupt(b.v, "node does not match its parent");
    fn(b, 1, true);
    if (!v.leaf()) {
      for (uint32_t i = 0; i < v.n(); i++) PLY_CHECK(this->node(v.child(i), v.child_gen(i), level - 1));
    } else if (cfg.value_refs) {
      std::vector<ExtentRef> ext;
      for (uint32_t i = 0; i < v.n(); i++) cfg.value_refs(v.key(i), v.value(i), ext);
      for (const ExtentRef& e : ext) fn(e.start, e.nblocks, false);
    }
    return ok();
  }
};

}  // namespace

Result<void> BTree::drop(BlockCache& cache, uint64_t fs_id, const TreeConfig& cfg,
                         const RootPtr& root, MutCtx& m, const DropProgress& progress) {
  Dropper d{cache, fs_id, cfg, m, progress};
  PLY_CHECK(d.node(root.block, root.gen, root.level, 1.0));
  d.st.fraction = 1;
  if (progress) progress(d.st);
  return ok();
}

Result<BTree::DropStats> BTree::exclusive(BlockCache& cache, uint64_t fs_id, const TreeConfig& cfg,
                                          const RootPtr& root, NodeSpace& counts) {
  MutCtx m{Generation{0}, counts};
  DropProgress none;
  Dropper d{cache, fs_id, cfg, m, none, true};
  PLY_CHECK(d.node(root.block, root.gen, root.level, 1.0));
  d.st.fraction = 1;
  return d.st;
}

Result<void> BTree::reach(BlockCache& cache, uint64_t fs_id, const TreeConfig& cfg, const RootPtr& root,
                          const ReachFn& fn) {
  Walker w{cache, fs_id, cfg, fn};
  return w.node(root.block, root.gen, root.level);
}

namespace {
Result<uint64_t> count_rec(BlockCache& cache, uint64_t fs_id, BlockNo b, Generation g, int level, Generation open,
                           BTree::CountMemo& memo) {
  const bool fixed = g < open;
  if (fixed)
    if (auto it = memo.by_block.find(b.v); it != memo.by_block.end() && it->second.gen == g.v) return it->second.nodes;
  ReadCtx ctx{fs_id, g, level};
  Ref node = PLY_TRY(cache.get(b, BlockCache::Verifier{verify_cb, &ctx}));
  NodeView v = view(node);
  if (v.gen() != g || v.level() != level) return Error::corrupt(b.v, "node does not match its parent");
  uint64_t n = 1;
  if (!v.leaf())
    for (uint32_t i = 0; i < v.n(); i++)
      n += PLY_TRY(count_rec(cache, fs_id, v.child(i), v.child_gen(i), level - 1, open, memo));
  if (fixed) memo.by_block[b.v] = {g.v, n};
  return n;
}
}  // namespace

Result<uint64_t> BTree::count_nodes(BlockCache& cache, uint64_t fs_id, const RootPtr& root, Generation open,
                                    CountMemo& memo) {
  return count_rec(cache, fs_id, root.block, root.gen, root.level, open, memo);
}

namespace {
Result<void> walk_rec(BlockCache& cache, uint64_t fs_id, BlockNo b, Generation g, int level,
                      std::unordered_set<uint64_t>& seen, const BTree::NodeFn& fn) {
  if (!seen.insert(b.v).second) return ok();
  if (level == 0) {
    fn(b, g, level, nullptr);
    return ok();
  }
  ReadCtx ctx{fs_id, g, level};
  auto node = cache.get(b, BlockCache::Verifier{verify_cb, &ctx});
  if (node && (view(*node).gen() != g || view(*node).level() != level))
    node = Error::corrupt(b.v, "node generation or level does not match its parent");
  if (!node) {
    fn(b, g, level, &node.error());
    return ok();
  }
  fn(b, g, level, nullptr);
  NodeView v = view(*node);
  for (uint32_t i = 0; i < v.n(); i++) PLY_CHECK(walk_rec(cache, fs_id, v.child(i), v.child_gen(i), level - 1, seen, fn));
  return ok();
}
}  // namespace

Result<void> BTree::walk_nodes(BlockCache& cache, uint64_t fs_id, const RootPtr& root,
                               std::unordered_set<uint64_t>& seen, const NodeFn& fn) {
  return walk_rec(cache, fs_id, root.block, root.gen, root.level, seen, fn);
}

// Moving blocks (format.md#relocation): a post-order walk over the node
// graph, each node visited once per move thanks to the memo.
namespace {
struct Relocator {
  BlockCache& cache;
  uint64_t fs_id;
  const TreeConfig& cfg;
  MutCtx& m;
  const BTree::MovesNode& moves;
  const BTree::MoveValue& move_value;
  BTree::RelocMemo& memo;

  Result<std::optional<BTree::RelocMemo::Copy>> node(BlockNo b, Generation g, int level) {
    if (auto it = memo.nodes.find(b.v); it != memo.nodes.end()) return it->second;
    ReadCtx ctx{fs_id, g, level};
    Ref old = PLY_TRY(cache.get(b, BlockCache::Verifier{verify_cb, &ctx}));
    NodeView v = view(old);
    if (v.gen() != g || v.level() != level)
      return Error::corrupt(b.v, "node generation or level does not match its parent");
    std::vector<std::pair<uint32_t, BTree::RelocMemo::Copy>> kids;
    std::vector<std::pair<uint32_t, std::vector<std::byte>>> vals;
    if (!v.leaf()) {
      for (uint32_t i = 0; i < v.n(); i++) {
        auto c = PLY_TRY(node(v.child(i), v.child_gen(i), level - 1));
        if (c) kids.emplace_back(i, *c);
      }
    } else if (move_value) {
      for (uint32_t i = 0; i < v.n(); i++) {
        std::vector<std::byte> val(v.value(i).begin(), v.value(i).end());
        if (move_value(v.key(i), val)) vals.emplace_back(i, std::move(val));
      }
    }
    if (kids.empty() && vals.empty() && !moves(b)) {
      memo.nodes.emplace(b.v, std::nullopt);
      return std::optional<BTree::RelocMemo::Copy>();
    }
    const uint32_t refs = cfg.shareable ? PLY_TRY(m.space.refcount(b)) : 1u;
    if (refs == 0) return Error::corrupt(b.v, "reachable node has refcount zero");
    const BlockNo nb = PLY_TRY(m.space.alloc_node());
    Ref copy = cache.create(nb, m.gen);
    std::memcpy(copy->data(), old->data(), old->size);
    NodeView cv = view(copy);
    cv.h().generation.set(m.gen.v);
    cv.h().blockno.set(nb.v);
    for (const auto& [i, c] : kids) cv.set_child(i, c.block, c.gen);
    for (const auto& [i, val] : vals) std::memcpy(copy->data() + cv.litem(i).value_offset.get(), val.data(), val.size());
    // The copy takes every reference of the original (a new node has one).
    for (uint32_t r = 1; r < refs; r++) PLY_CHECK(m.space.inc_ref(nb));
    for (uint32_t r = 0; r < refs; r++) {
      auto f = PLY_TRY(m.space.dec_ref(b));
      if ((f != NodeSpace::Freed::No) != (r + 1 == refs))
        return Error::corrupt(b.v, "node's reference count changed while it moved");
      if (f == NodeSpace::Freed::Now) cache.discard(b);
      else if (f == NodeSpace::Freed::Deferred) cache.drop_clean(b);
    }
    const BTree::RelocMemo::Copy c{nb, m.gen};
    memo.nodes.emplace(b.v, c);
    memo.nodes.emplace(nb.v, std::nullopt);  // a copy never moves again in this walk
    memo.copied++;
    return std::optional<BTree::RelocMemo::Copy>(c);
  }
};
}  // namespace

Result<std::optional<RootPtr>> BTree::relocate(BlockCache& cache, uint64_t fs_id, const TreeConfig& cfg,
                                               const RootPtr& root, MutCtx& m, const MovesNode& moves,
                                               const MoveValue& move_value, RelocMemo& memo) {
  Relocator r{cache, fs_id, cfg, m, moves, move_value, memo};
  auto c = PLY_TRY(r.node(root.block, root.gen, root.level));
  if (!c) return std::optional<RootPtr>();
  return std::optional<RootPtr>(RootPtr{c->block, c->gen, root.level});
}

}  // namespace plyfs
