// Filesystem-object checks and repairs: F1-F9 and U1-U3 (check.h,
// format.md#fs-invariants, #fs-repair).
//
// One ordered scan of a filesystem tree collects what each object is and
// what points at it; the checks then compare the two sides. Every problem
// the scan finds comes with its repair: a change of the tree's items made
// with the layer's own codecs (items.h), so that a repaired tree holds only
// what the layer itself could have written. Repairs go in rounds, each
// after a new scan, because each round's counts depend on the one before:
//   1 the tree's FsInfo item and its root directory;
//   2 items: malformed or misplaced records and items, dangling entries,
//     names given twice, items of objects that do not exist, numbers out of
//     range;
//   3 objects no entry names go to the branch's /lost+found as "#INO";
//   4 counts and back-pointers: nlink, size, blocks, a directory's parent.
//
// This file runs them: the scans of the trees (side by side, or fed by
// fsck's walk), the branch fields (U3) and the rounds of repairs. The
// checks of items are in check_scan.cpp, those of whole objects in
// check_objects.cpp, the repair steps in check_repair.cpp, and what they
// share in check_internal.h.
#include "fs/check.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "fs/check_internal.h"
#include "fs/disk_fs.h"
#include "fs/fs.h"

namespace plyfs {

using namespace fscheck;

namespace {

// Blocks reserved for one repair step: a few items of one tree (A5).
constexpr uint64_t kFixBlocks = 64;
constexpr int kMaxRounds = 12;  // scans of one tree during a repair

// One scan of one filesystem tree.
std::vector<Finding> scan_tree(Volume& vol, TreeId id, bool data, uint64_t* root = nullptr) {
  auto fail = [&](const Error& e, const std::string& what) {
    Finding f;
    f.p = Problem{"F-item", e.block, what + e.message(), id.v};
    return std::vector<Finding>{std::move(f)};
  };
  auto t = vol.begin();
  if (!t) return fail(t.error(), "cannot read: ");
  Checker c(id, vol.block_size(), data ? &vol : nullptr, t->next_inode_number(), vol.incompat(),
            vol.ro_compat());
  auto r = t->scan(id, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
    c.item(k, v);
    return true;
  });
  if (!r) return fail(r.error(), "cannot read the tree: ");
  c.finish();
  if (root) *root = c.root();
  return std::move(c.findings());
}

// The branch fields (U3): parents name filesystem trees, without cycles;
// names are unique. A repair renames the later of two branches with one
// name and forgets a parent that does not exist or makes a cycle.
std::vector<Finding> check_branches(Volume& vol) {
  std::vector<Finding> out;
  auto bs = Filesystem::branches(vol);
  if (!bs) return out;  // the per-tree checks report unreadable info items
  // A fix changes its own field of the branch as it is when it runs: one
  // branch may have two findings (a taken name and a cycle), and a fix that
  // wrote the whole record it saw would undo the other's.
  auto problem = [&](const BranchMeta& b, const std::string& what, std::string done,
                     std::function<void(BranchMeta&)> change) {
    Finding f;
    f.p = Problem{"U3-branch", Error::kNoBlock, what, b.tree.v, Repair::Lossy};
    f.round = 2;
    f.done = std::move(done);
    f.fix = [tree = b.tree, change](RepairCtx& c) -> Result<void> {
      BranchMeta m = PLY_TRY(Filesystem::branch(c.t, tree));
      change(m);
      return Filesystem::set_branch(c.t, m);
    };
    out.push_back(std::move(f));
  };
  std::map<uint64_t, const BranchMeta*> by_id;
  std::set<std::string> names;
  for (const auto& b : *bs) by_id[b.tree.v] = &b;
  for (const auto& b : *bs) {
    // A doomed tree's name is free (format.md#snapshots): a rollback's new
    // branch has it while the old one waits to be dropped.
    if (b.doomed || names.insert(b.name).second) continue;
    // NAME~TREEID, unique (tree ids are) unless another branch took that
    // very name too; at most 32 bytes (format.md#fs-info).
    std::string n = b.name.substr(0, 20) + "~" + std::to_string(b.tree.v);
    for (int i = 2; std::any_of(bs->begin(), bs->end(), [&](const BranchMeta& o) { return o.name == n; }); i++)
      n = "branch~" + std::to_string(b.tree.v) + "." + std::to_string(i);
    problem(b, "two branches are named \"" + b.name + "\"", "renamed branches whose names were taken",
            [n](BranchMeta& m) { m.name = n; });
  }
  for (const auto& b : *bs) {
    // A doomed tree's fields no longer matter: drop_doomed drops them one at
    // a time, so one may outlive the parent it names.
    if (b.doomed) continue;
    auto forget = [](BranchMeta& m) { m.parent = TreeId{0}; };
    if (b.parent.v && !by_id.count(b.parent.v)) {
      problem(b, "branch \"" + b.name + "\" names missing parent tree " + std::to_string(b.parent.v),
              "forgot branch parents that do not exist or form a cycle", forget);
      continue;
    }
    uint64_t p = b.parent.v;
    for (size_t steps = 0; p; steps++) {
      if (steps > by_id.size() || p == b.tree.v) {
        problem(b, "branch \"" + b.name + "\" is its own ancestor",
                "forgot branch parents that do not exist or form a cycle", forget);
        break;
      }
      auto it = by_id.find(p);
      p = it == by_id.end() ? 0 : it->second->parent.v;
    }
  }
  return out;
}

Result<std::vector<TreeId>> fs_trees(Volume& vol) {
  auto t = PLY_TRY(vol.begin());
  std::vector<TreeId> out;
  for (const auto& ti : PLY_TRY(t.list_trees()))
    if (ti.kind == disk::kKindFs) out.push_back(ti.id);
  return out;
}

// Applies the repairs of the lowest round found (only Safe ones unless
// `lossy`); returns how many were applied.
Result<size_t> apply_round(Volume& vol, TreeId tree, uint64_t root, const std::vector<Finding>& fs,
                           bool lossy, std::map<std::string, uint64_t>& done) {
  int round = 0;
  for (const auto& f : fs)
    if (f.round && (lossy || f.p.repair == Repair::Safe) && (!round || f.round < round)) round = f.round;
  if (!round) return 0;
  uint64_t lf = 0;
  size_t n = 0;
  for (const auto& f : fs) {
    if (f.round != round || !(lossy || f.p.repair == Repair::Safe)) continue;
    auto t = PLY_TRY(vol.begin({.for_delete = true, .reserve_blocks = kFixBlocks}));
    RepairCtx c{t, tree, root, lf};
    PLY_CHECK(f.fix(c));
    done[f.done]++;
    n++;
  }
  return n;
}

}  // namespace

std::vector<Problem> check_filesystem_tree(Volume& vol, TreeId tree) {
  std::vector<Problem> out;
  for (auto& f : scan_tree(vol, tree, false)) out.push_back(std::move(f.p));
  return out;
}

std::vector<Problem> check_filesystems(Volume& vol, bool data) {
  std::vector<Problem> out;
  for (auto& f : check_branches(vol)) out.push_back(std::move(f.p));
  auto trees = fs_trees(vol);
  if (!trees) {
    out.push_back(Problem{"F-item", Error::kNoBlock, "cannot list the trees: " + trees.error().message(), 0});
    return out;
  }
  // The trees are independent: they are checked side by side, one thread
  // per core (the volume serves concurrent readers), and reported in order.
  std::vector<std::vector<Finding>> per(trees->size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < per.size();) per[i] = scan_tree(vol, (*trees)[i], data);
  };
  const size_t n = std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), per.size());
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n; t++) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (auto& fs : per)
    for (auto& f : fs) out.push_back(std::move(f.p));
  return out;
}

namespace {

// Pass 5 fed by fsck's walk (check.h). The walk's thread only copies each
// tree's items into chunks; workers, one per core, run the Checker on them,
// a tree always on the same worker and in order, so the walk of passes 2-4
// and the objects' checks run side by side and no node is read twice.
class FedCheck : public ObjectChecker {
 public:
  FedCheck(std::unique_ptr<Volume> vol, bool data) : vol_(std::move(vol)), data_(data) {
    auto t = vol_->begin();
    next_inode_ = t ? t->next_inode_number() : 0;
    const size_t n = std::max(1u, std::thread::hardware_concurrency());
    workers_.resize(n);
    for (auto& w : workers_) w = std::make_unique<Worker>();
    for (auto& w : workers_) w->thread = std::thread([this, p = w.get()] { run(*p); });
  }
  ~FedCheck() override { stop(); }

  bool begin_tree(const TreeInfo& t) override {
    if (t.kind != disk::kKindFs) return false;
    trees_.push_back(Tree{t.id, {}, false});
    cur_ = Chunk{&trees_.back(), trees_.size() - 1, buffer(), false};
    return true;
  }
  void item(Key k, std::span<const std::byte> v) override {
    const uint32_t len = uint32_t(v.size());
    const size_t at = cur_.bytes.size();
    cur_.bytes.resize(at + sizeof k + sizeof len + len);
    std::memcpy(cur_.bytes.data() + at, &k, sizeof k);
    std::memcpy(cur_.bytes.data() + at + sizeof k, &len, sizeof len);
    if (len) std::memcpy(cur_.bytes.data() + at + sizeof k + sizeof len, v.data(), len);
    if (cur_.bytes.size() >= kChunkBytes) hand_over(false);
  }
  void end_tree(bool complete) override {
    cur_.tree->complete = complete;
    hand_over(true);
  }

  std::vector<Problem> finish() override {
    stop();
    std::vector<Problem> out;
    for (auto& f : check_branches(*vol_)) out.push_back(std::move(f.p));
    // A tree the walk did not hand over whole (a subtree shared with a clone
    // is walked once) is scanned again on its own.
    for (auto& t : trees_) {
      if (!t.complete) t.findings = scan_tree(*vol_, t.id, data_);
      for (auto& f : t.findings) out.push_back(std::move(f.p));
    }
    return out;
  }

 private:
  static constexpr size_t kChunkBytes = 256 << 10;
  static constexpr size_t kQueued = 8;  // chunks waiting per worker
  struct Tree;
  struct Chunk {
    Tree* tree;  // in trees_, whose elements never move
    size_t index;
    std::vector<std::byte> bytes;
    bool last;
  };
  struct Tree {
    TreeId id;
    std::vector<Finding> findings;
    bool complete;
  };
  struct Worker {
    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Chunk> queue;
    bool stop = false;
  };

  void hand_over(bool last) {
    cur_.last = last;
    Worker& w = *workers_[cur_.index % workers_.size()];
    Tree* tree = cur_.tree;
    const size_t index = cur_.index;
    {
      std::unique_lock l(w.mu);
      w.cv.wait(l, [&] { return w.queue.size() < kQueued; });
      w.queue.push_back(std::move(cur_));
    }
    w.cv.notify_all();
    cur_ = Chunk{tree, index, buffer(), false};
  }

  // Chunk buffers go round between the walk and the workers: a fresh one
  // each time would be a fresh mapping, faulted in page by page.
  std::vector<std::byte> buffer() {
    std::lock_guard l(free_mu_);
    if (free_.empty()) {
      std::vector<std::byte> b;
      b.reserve(kChunkBytes + 8192);
      return b;
    }
    auto b = std::move(free_.back());
    free_.pop_back();
    b.clear();
    return b;
  }

  void run(Worker& w) {
    std::unique_ptr<Checker> c;
    for (;;) {
      Chunk ch;
      {
        std::unique_lock l(w.mu);
        w.cv.wait(l, [&] { return w.stop || !w.queue.empty(); });
        if (w.queue.empty()) return;
        ch = std::move(w.queue.front());
        w.queue.pop_front();
      }
      w.cv.notify_all();
      Tree& t = *ch.tree;
      if (!c)
        c = std::make_unique<Checker>(t.id, vol_->block_size(), data_ ? vol_.get() : nullptr, next_inode_,
                                      vol_->incompat(), vol_->ro_compat());
      for (size_t p = 0; p < ch.bytes.size();) {
        Key k;
        uint32_t len;
        std::memcpy(&k, ch.bytes.data() + p, sizeof k);
        std::memcpy(&len, ch.bytes.data() + p + sizeof k, sizeof len);
        p += sizeof k + sizeof len;
        c->item(k, std::span<const std::byte>(ch.bytes.data() + p, len));
        p += len;
      }
      {
        std::lock_guard l(free_mu_);
        free_.push_back(std::move(ch.bytes));
      }
      if (ch.last) {
        // A tree the walk did not hand over whole is scanned again in
        // finish(), if the walk found the image sound at all: what it did
        // hand over is no basis for findings (end_tree set `complete`
        // before this chunk was queued).
        if (t.complete) {
          c->finish();
          t.findings = std::move(c->findings());
        }
        c.reset();
      }
    }
  }

  void stop() {
    for (auto& w : workers_) {
      {
        std::lock_guard l(w->mu);
        w->stop = true;
      }
      w->cv.notify_all();
    }
    for (auto& w : workers_)
      if (w->thread.joinable()) w->thread.join();
  }

  std::unique_ptr<Volume> vol_;
  bool data_;
  uint64_t next_inode_ = 0;
  std::deque<Tree> trees_;  // a deque: workers hold references while the walk appends
  Chunk cur_{nullptr, 0, {}, false};
  std::mutex free_mu_;
  std::vector<std::vector<std::byte>> free_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace

std::unique_ptr<ObjectChecker> feed_filesystems(BlockDevice& dev, bool data) {
  auto vol = open_to_check(dev);
  if (!vol) return nullptr;
  return std::make_unique<FedCheck>(std::move(*vol), data);
}

Result<std::vector<std::string>> repair_filesystems(Volume& vol, bool lossy, bool data) {
  std::vector<std::string> actions;
  // The branch fields (U3), before the trees and again after them: a tree
  // whose info item round 1 rewrites shows its fields only then.
  std::map<std::string, uint64_t> branch_done;
  auto fix_branches = [&]() -> Result<void> {
    uint64_t none = 0;
    for (const auto& f : check_branches(vol)) {
      if (!lossy) continue;
      auto t = PLY_TRY(vol.begin({.reserve_blocks = Filesystem::kSetBranchBlocks}));
      RepairCtx c{t, TreeId{f.p.tree}, 0, none};
      PLY_CHECK(f.fix(c));
      branch_done[f.done]++;
    }
    return ok();
  };
  PLY_CHECK(fix_branches());
  auto metas = Filesystem::branches(vol);  // names for the report; a damaged info item has none
  if (!metas) metas = std::vector<BranchMeta>{};
  for (TreeId id : PLY_TRY(fs_trees(vol))) {
    std::string name = "tree " + std::to_string(id.v);
    for (const auto& m : *metas)
      if (m.tree == id) name = "branch \"" + m.name + "\"";
    std::map<std::string, uint64_t> done;
    for (int i = 0; i < kMaxRounds; i++) {
      uint64_t root = 0;
      auto fs = scan_tree(vol, id, data, &root);
      if (!PLY_TRY(apply_round(vol, id, root, fs, lossy, done))) break;
    }
    for (const auto& [what, n] : done)
      actions.push_back(name + ": " + what + " (" + std::to_string(n) + ")");
  }
  PLY_CHECK(fix_branches());
  std::vector<std::string> first;
  for (const auto& [what, n] : branch_done) first.push_back(what + " (" + std::to_string(n) + ")");
  actions.insert(actions.begin(), first.begin(), first.end());
  return actions;
}

Result<std::unique_ptr<Volume>> open_to_check(BlockDevice& dev) {
  VolumeOptions vo;
  vo.read_only = true;
  vo.kinds = fs_kinds();
  vo.cache_bytes = 64ull << 20;
  return Volume::open(dev, vo);
}

std::vector<Problem> check_filesystems(BlockDevice& dev, bool data) {
  auto vol = open_to_check(dev);
  if (!vol) return {Problem{"F-item", Error::kNoBlock, "cannot open: " + vol.error().message(), 0}};
  return check_filesystems(**vol, data);
}

}  // namespace plyfs
