// Placement rules at work (format.md#placement-rules): which classes a
// file's new data goes to, and the background migration of a file whose
// rule changed (it grew past a size bound, was renamed, changed owner or
// mode).
//
// A rule looks at a file's path, owner, mode and size. The size comes with
// every write; the rest is cached per inode (the "candidates": the rules
// whose other conditions hold), computed once from the file's path. Paths
// come from the names this filesystem hands out and looks up (a file is
// looked up before the kernel opens it), else from the inode's parent hint
// (format.md#fs-inode), and directories' paths are cached until a directory
// is renamed. A write thus costs one hash lookup and a test of each
// candidate's size bounds.
#include <sys/stat.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "fs/fs.h"
#include "fs/fs_internal.h"
#include "fs/policy.h"

namespace plyfs {

namespace {
// Cached facts past this many files are dropped and found again.
constexpr size_t kMaxPlaceFacts = 1 << 18;
// Blocks one migration step moves in one generation at most.
constexpr uint64_t kMigrateBatchBlocks = 16384;
}  // namespace

class Filesystem::Placer {
 public:
  explicit Placer(Filesystem& fs) : fs_(fs) {}
  ~Placer() { shutdown(); }

  // Stops the worker: a migration it is running ends first (it may call
  // back into placer(), so the Filesystem calls this while placer_ still
  // points here, ~Filesystem).
  void shutdown() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  struct Facts {
    uint64_t dir = 0;
    std::string name;
    // Valid while the rules' version, the directories' epoch and the
    // owner and mode are what they were computed for.
    bool known = false;
    uint64_t version = 0, epoch = 0, cand = 0;
    uint32_t uid = 0, gid = 0, mode = 0;
  };

  void note(uint64_t ino, uint64_t dir, std::string_view name) {
    std::lock_guard lk(facts_mu_);
    if (facts_.size() >= kMaxPlaceFacts) facts_.clear();
    Facts& f = facts_[ino];
    if (f.dir == dir && f.name == name) return;
    f.dir = dir;
    f.name = name;
    f.known = false;
  }
  void dirs_changed() {
    std::lock_guard lk(facts_mu_);
    epoch_++;
    dir_paths_.clear();
  }
  // The cached candidates, when still valid for these rules, directories,
  // owner and mode: what a write asks (no copy of the name).
  std::optional<uint64_t> candidates(uint64_t ino, uint64_t version, const Attr& a) {
    std::lock_guard lk(facts_mu_);
    auto it = facts_.find(ino);
    if (it == facts_.end()) return std::nullopt;
    const Facts& f = it->second;
    if (!f.known || f.version != version || f.epoch != epoch_ || f.uid != a.uid || f.gid != a.gid || f.mode != a.mode)
      return std::nullopt;
    return f.cand;
  }
  std::optional<Facts> facts(uint64_t ino) {
    std::lock_guard lk(facts_mu_);
    auto it = facts_.find(ino);
    if (it == facts_.end()) return std::nullopt;
    return it->second;
  }
  uint64_t epoch() {
    std::lock_guard lk(facts_mu_);
    return epoch_;
  }
  void remember(uint64_t ino, const Facts& f) {
    std::lock_guard lk(facts_mu_);
    if (facts_.size() >= kMaxPlaceFacts) facts_.clear();
    facts_[ino] = f;
  }
  std::optional<std::string> dir_path(uint64_t dir) {
    std::lock_guard lk(facts_mu_);
    auto it = dir_paths_.find(dir);
    if (it == dir_paths_.end()) return std::nullopt;
    return it->second;
  }
  void remember_dir(uint64_t dir, uint64_t epoch, const std::string& path) {
    std::lock_guard lk(facts_mu_);
    if (epoch != epoch_) return;
    if (dir_paths_.size() >= kMaxPlaceFacts) dir_paths_.clear();
    dir_paths_[dir] = path;
  }

  // Migration queue: one worker, started on first use.
  void enqueue(uint64_t ino) {
    std::lock_guard lk(mu_);
    if (stop_) return;
    start_locked();
    if (!queued_.insert(ino).second) return;
    queue_.push_back(ino);
    cv_.notify_all();
  }
  // A file written under a staged rule: due `delay` after its last write,
  // or 4 delays after its first (a file written without pause still moves).
  // Each file is in `due_` once; its entry in `due_order_` may be early,
  // and is pushed back when it comes up before the file is due.
  void stage(uint64_t ino, std::chrono::milliseconds delay) {
    const auto now = Clock::now();
    std::lock_guard lk(mu_);
    if (stop_) return;
    start_locked();
    if (scanning_) staged_here_.insert(ino);
    auto [it, fresh] = due_.try_emplace(ino, Due{now, now + delay});
    if (fresh) {
      due_order_.push_back({now + delay, ino});
      cv_.notify_all();
    } else {
      it->second.at = std::min(now + delay, it->second.first + 4 * delay);
    }
  }
  // A file freed while staged: nothing left to move (format.md#staged-writes),
  // and `queued` should not count it. Its due_order_ entry goes when it
  // comes up.
  void forget(uint64_t ino) {
    std::lock_guard lk(mu_);
    due_.erase(ino);
  }
  // Staged files are due now, then the queue runs dry.
  void settle() {
    std::unique_lock lk(mu_);
    settling_++;
    cv_.notify_all();
    idle_cv_.wait(lk, [&] { return stop_ || (queue_.empty() && due_.empty() && !scanning_ && !busy_); });
    settling_--;
  }
  MigrationStats stats() {
    std::lock_guard lk(mu_);
    MigrationStats s = stats_;
    s.queued = queue_.size() + due_.size() + busy_;
    return s;
  }

  using Clock = std::chrono::steady_clock;
  struct Due {
    Clock::time_point first, at;
  };

  // At the first use (placer()): a filesystem whose rules stage starts the
  // worker for the scan at once.
  void start_if_staged() {
    auto pol = fs_.policy_->get();
    if (!pol || !pol->any_staged() || fs_.read_only()) return;
    std::lock_guard lk(mu_);
    if (!stop_) start_locked();
  }

 private:
  void start_locked() {
    if (worker_.joinable()) return;
    // Rules that stage: staged data an earlier mount left (it unmounted
    // before the data moved) is found by one look at every file first.
    auto pol = fs_.policy_->get();
    scanning_ = pol && pol->any_staged() && !fs_.read_only();
    worker_ = std::thread([this] { run(); });
  }

  // Staged files that are due (all of them while someone settles) go to
  // the queue; the time the next one is due otherwise.
  std::optional<Clock::time_point> take_due_locked() {
    const auto now = Clock::now();
    while (!due_order_.empty()) {
      auto [at, ino] = due_order_.front();
      auto it = due_.find(ino);
      if (it == due_.end()) {  // the file was freed (forget)
        due_order_.pop_front();
        continue;
      }
      if (settling_ == 0 && it->second.at > now) {
        if (at >= it->second.at) return it->second.at;
        due_order_.pop_front();  // written again since: back of the line
        due_order_.push_back({it->second.at, ino});
        continue;
      }
      due_order_.pop_front();
      due_.erase(it);
      if (queued_.insert(ino).second) queue_.push_back(ino);
    }
    return std::nullopt;
  }

  void record_locked(const Result<uint64_t>& r) {
    if (r) {
      stats_.files += *r > 0;
      stats_.blocks += *r;
    } else {
      stats_.failed++;
    }
  }

  void run() {
    std::unique_lock lk(mu_);
    if (scanning_) {
      lk.unlock();
      scan();
      if (fs_.scan_hook_) fs_.scan_hook_(0);
      lk.lock();
      scanning_ = false;
      staged_here_.clear();
    }
    for (;;) {
      const auto next = take_due_locked();
      if (stop_) break;
      if (queue_.empty()) {
        if (due_.empty() && !busy_) idle_cv_.notify_all();
        // Something to do: not a settle with nothing staged (that wait
        // would hold the lock, spinning).
        auto ready = [&] {
          return stop_ || !queue_.empty() || (settling_ > 0 && !due_.empty()) || (!next && !due_order_.empty());
        };
        if (next) cv_.wait_until(lk, *next, ready);
        else cv_.wait(lk, ready);
        continue;
      }
      const uint64_t ino = queue_.front();
      queue_.pop_front();
      queued_.erase(ino);
      busy_ = true;
      lk.unlock();
      auto r = fs_.migrate(ino);
      lk.lock();
      busy_ = false;
      record_locked(r);
    }
    idle_cv_.notify_all();
  }

  // Every regular file with blocks, once: what lies on a stage class moves
  // to its rule's class (format.md#staged-writes). A file this mount has
  // staged since the scan began is passed over: it is due on its own
  // clock, and moving it now would move it twice (and while it is written).
  void scan() {
    auto inos = fs_.files_with_blocks();
    if (!inos) return;
    for (uint64_t ino : *inos) {
      if (fs_.scan_hook_) fs_.scan_hook_(ino);
      {
        std::lock_guard lk(mu_);
        if (stop_) return;
        if (staged_here_.count(ino)) continue;
      }
      auto r = fs_.migrate(ino, true);
      std::lock_guard lk(mu_);
      record_locked(r);
    }
  }

  Filesystem& fs_;
  std::mutex facts_mu_;  // a leaf
  std::unordered_map<uint64_t, Facts> facts_;
  std::unordered_map<uint64_t, std::string> dir_paths_;
  uint64_t epoch_ = 0;

  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<uint64_t> queue_;
  std::unordered_set<uint64_t> queued_;
  std::unordered_map<uint64_t, Due> due_;                        // staged files, when due
  std::unordered_set<uint64_t> staged_here_;                     // staged while the scan runs
  std::deque<std::pair<Clock::time_point, uint64_t>> due_order_;  // by the time each was staged
  int settling_ = 0;
  bool stop_ = false, busy_ = false, scanning_ = false;
  MigrationStats stats_;
  std::thread worker_;
};

void Filesystem::PlacerGone::operator()(Placer* p) const { delete p; }

Filesystem::~Filesystem() {
  // The worker first, with placer_ still set: unique_ptr::reset clears the
  // pointer before it deletes, and a migration running meanwhile reaches
  // placer() (place_for) and would find it null.
  if (placer_) placer_->shutdown();
  placer_.reset();
}

Filesystem::Placer& Filesystem::placer() {
  std::call_once(placer_once_, [&] {
    if (stage_delay_ms_.load() < 0) stage_delay_ms_ = vol_.extension<MountStageDelay>().ms.load();
    placer_.reset(new Placer(*this));
    placer_->start_if_staged();
  });
  return *placer_;
}

void Filesystem::set_stage_delay(std::chrono::milliseconds d) { stage_delay_ms_ = d.count(); }
void Filesystem::set_scan_hook(std::function<void(uint64_t)> hook) { scan_hook_ = std::move(hook); }

void Filesystem::placing_staged(uint64_t ino) {
  if (placing() && !read_only()) placer().stage(ino, std::chrono::milliseconds(stage_delay_ms_.load()));
}

void Filesystem::placing_gone(uint64_t ino) {
  if (placing() && !read_only()) placer().forget(ino);
}

bool Filesystem::placing() const { return policy_->active(); }

void Filesystem::placing_named(const Attr& a, uint64_t dir, std::string_view name) {
  if (!placing()) return;
  if (S_ISDIR(a.mode)) return;
  if (S_ISREG(a.mode)) placer().note(a.ino, dir, name);
}

void Filesystem::placing_renamed(uint64_t ndir, std::string_view nname) {
  if (!placing() || read_only()) return;
  auto a = lookup(ndir, nname);
  if (!a) return;
  if (S_ISDIR(a->mode)) {
    placer().dirs_changed();
    return;
  }
  if (!S_ISREG(a->mode)) return;
  placer().note(a->ino, ndir, nname);
  if (a->blocks) placer().enqueue(a->ino);
}

void Filesystem::placing_changed(const Attr& a) {
  if (!placing() || read_only() || !S_ISREG(a.mode) || a.blocks == 0) return;
  placer().enqueue(a.ino);
}

void Filesystem::placing_queue(uint64_t ino) {
  if (placing() && !read_only()) placer().enqueue(ino);
}

void Filesystem::settle_placement() {
  if (placer_) placer_->settle();
}

Filesystem::MigrationStats Filesystem::migration_stats() {
  return placer_ ? placer_->stats() : MigrationStats{};
}

Result<std::string> Filesystem::place_path(uint64_t ino) {
  auto f = placer().facts(ino);
  if (f && f->dir) {
    const uint64_t epoch = placer().epoch();
    std::optional<std::string> dp = f->dir == root_ ? std::optional<std::string>("") : placer().dir_path(f->dir);
    if (!dp) {
      auto p = PLY_TRY(path(f->dir));
      if (p) {
        dp = *p == "/" ? "" : *p;
        placer().remember_dir(f->dir, epoch, *dp);
      }
    }
    if (dp) return *dp + "/" + f->name;
  }
  // Not named here yet (a file the kernel listed with readdirplus): the
  // parent hint, one scan of that directory.
  auto p = PLY_TRY(path(ino));
  return p ? *p : std::string();
}

Result<Placement> Filesystem::place_for(uint64_t ino, const Attr& a, uint64_t size, bool* crossed, bool* staged) {
  if (crossed) *crossed = false;
  if (staged) *staged = false;
  if (!placing()) return Placement{};
  // The version first: rules set in between are cached as older ones, and
  // found again at the next write.
  const uint64_t version = policy_->version();
  auto pol = policy_->get();
  if (!pol || pol->empty()) return Placement{};
  const uint64_t cand = PLY_TRY(place_candidates(ino, a, *pol, version));
  const int now = pol->choose(cand, size);
  if (crossed) *crossed = pol->choose(cand, a.size) != now;
  if (!staged) return pol->placement(now);
  *staged = pol->staged(now);
  return pol->write_placement(now);
}

// The rules whose conditions other than size hold for `ino`: cached, or
// found from its path (the file's header comment).
Result<uint64_t> Filesystem::place_candidates(uint64_t ino, const Attr& a, const PlacementPolicy& pol,
                                              uint64_t version) {
  Placer& pl = placer();
  std::optional<uint64_t> cand = pl.candidates(ino, version, a);
  if (!cand) {
    const uint64_t epoch = pl.epoch();
    auto f = pl.facts(ino);
    const std::string path = PLY_TRY(place_path(ino));
    Placer::Facts nf = f ? *f : Placer::Facts{};
    nf.known = true;
    nf.version = version;
    nf.epoch = epoch;
    nf.uid = a.uid;
    nf.gid = a.gid;
    nf.mode = a.mode;
    nf.cand = pol.candidates(path, a.uid, a.gid, a.mode);
    pl.remember(ino, nf);
    cand = nf.cand;
  }
  return *cand;
}

Result<Filesystem::PlacementAnswer> Filesystem::placement_rule(uint64_t ino) {
  PlacementAnswer out;
  Attr a = PLY_TRY(getattr(ino));
  auto pol = policy_->get();
  if (!pol || pol->empty()) return out;
  const std::string path = PLY_TRY(place_path(ino));
  out.rule = pol->choose(pol->candidates(path, a.uid, a.gid, a.mode), a.size);
  out.place = pol->placement(out.rule);
  return out;
}

// Moves the data of `ino` that lies off its rule's first class there: each
// space extent the file's items use is copied whole to a new extent of that
// class, the items are pointed at it and the old one loses their
// references, one generation per batch (format.md#migration). The bytes do
// not change, so neither do the checksums; a crash leaves either the old
// or the new extent referenced, never both or neither. An extent others
// share (a snapshot, a reflink) keeps them: the file gets its own copy.
Result<uint64_t> Filesystem::migrate(uint64_t ino, bool staged_only) {
  if (read_only() || retired_ || !placing()) return uint64_t{0};
  const auto& classes = vol_.super().classes;
  if (classes.empty()) return uint64_t{0};
  uint32_t stage_mask = 0;
  if (staged_only) {
    auto pol = policy_->get();
    stage_mask = pol ? pol->stage_classes() : 0;
    if (stage_mask == 0) return uint64_t{0};
  }
  std::lock_guard il(inode_lock(ino));
  auto a = getattr(ino);
  if (!a) return a.error().code == ENOENT ? Result<uint64_t>(uint64_t{0}) : Result<uint64_t>(a.error());
  if (!S_ISREG(a->mode) || a->nlink == 0) return uint64_t{0};
  // Where the data goes: the rule's first class; the default order puts
  // data on the slowest class first. Only looked for when an extent may
  // move: the scan at mount (staged_only) finds most files with nothing on
  // a stage class, and needs no path for them.
  std::optional<uint8_t> want;
  auto target = [&]() -> Result<uint8_t> {
    if (!want) {
      const Placement p = PLY_TRY(place_for(ino, *a, a->size, nullptr));
      want = p.n ? p.classes[0] : uint8_t(classes.size() - 1);
    }
    return *want;
  };
  uint64_t moved = 0, from = 0;
  for (;;) {
    auto t = PLY_TRY(vol_.begin());
    Ctx c{*this, std::move(t)};
    std::vector<Ext> es;
    {
      std::shared_lock lk(mu_);
      es = PLY_TRY(c.extents(ino, from, kOffMask, 4096));
    }
    if (es.empty()) break;
    // The space extents off their class, with the range of each that this
    // file's items read.
    struct Move {
      uint64_t lo = ~uint64_t{0}, hi = 0, to = 0;
    };
    std::map<uint64_t, Move> moves;
    uint64_t batch = 0, next_from = es.back().end();
    for (const Ext& e : es) {
      if (e.prealloc()) continue;
      const int cls = vol_.class_of(BlockNo{e.disk_start});
      if (staged_only && (cls < 0 || !(stage_mask >> cls & 1))) continue;
      if (cls == int(PLY_TRY(target()))) continue;
      auto [it, fresh] = moves.try_emplace(e.disk_start);
      const uint64_t lo = e.compressed() ? 0 : e.offset, hi = e.compressed() ? e.disk_nblocks : e.offset + e.nblocks;
      if (fresh && batch + (hi - lo) > kMigrateBatchBlocks && batch > 0) {
        moves.erase(it);
        next_from = e.file_blk;
        break;
      }
      const uint64_t old = it->second.hi > it->second.lo ? it->second.hi - it->second.lo : 0;
      it->second.lo = std::min(it->second.lo, lo);
      it->second.hi = std::max(it->second.hi, hi);
      batch += it->second.hi - it->second.lo - old;
    }
    if (!moves.empty()) {
      c.t.place(Placement{1, true, {*want}});
      // What the batch takes, reserved before anything changes (A5): the
      // copies, and the items' leaves.
      if (auto r = c.t.reserve(batch + (moves.size() / 32 + 4) * kOpBlocks); !r) {
        if (r.error().code == ENOSPC) break;  // no room to move: the data stays where it is
        return r.error();
      }
      std::vector<std::byte> buf;
      std::vector<uint64_t> taken;
      auto undo = [&](Error e) -> Error {
        for (uint64_t b : taken) (void)c.t.dec_extent(BlockNo{b});
        return e;
      };
      for (auto& [start, m] : moves) {
        auto b = c.t.alloc_extent(m.hi - m.lo);
        if (!b) {
          if (b.error().code == ENOSPC) {  // the class is full: what moved stays moved
            for (auto it = moves.find(start); it != moves.end(); ++it) it->second.to = 0;
            break;
          }
          return undo(b.error());
        }
        taken.push_back(b->v);
        buf.resize((m.hi - m.lo) * bs_);
        if (auto r = vol_.read_data(BlockNo{start + m.lo}, buf); !r) return undo(r.error());
        if (auto r = vol_.write_data(*b, buf); !r) return undo(r.error());
        m.to = b->v;
      }
      std::unique_lock lk(mu_);
      // A branch whose content was replaced meanwhile (a rollback or merge,
      // retire()) is changed no more: the copies go back.
      if (retired_) return undo(Error::io(ESTALE, "the branch was replaced while its file moved"));
      // The items again, under the tree's lock: anything that changed one
      // since (a merge replacing the file) keeps its own.
      auto now = c.extents(ino, es.front().file_blk, next_from);
      if (!now) return undo(now.error());
      std::unordered_map<uint64_t, uint64_t> used;  // new extent -> items pointed at it
      for (const Ext& e : *now) {
        auto it = moves.find(e.disk_start);
        if (it == moves.end() || it->second.to == 0 || e.prealloc()) continue;
        const Move& m = it->second;
        const uint64_t lo = e.compressed() ? 0 : e.offset, hi = e.compressed() ? e.disk_nblocks : e.offset + e.nblocks;
        if (lo < m.lo || hi > m.hi) continue;
        Ext n = e;
        n.disk_start = m.to;
        n.disk_nblocks = m.hi - m.lo;
        if (!e.compressed()) n.offset = e.offset - m.lo;
        if (used[m.to]++ > 0)
          if (auto r = c.t.inc_extent(BlockNo{m.to}); !r) return r.error();
        if (auto r = c.put_extent(ino, n); !r) return r.error();
        if (auto r = c.t.dec_extent(BlockNo{e.disk_start}); !r) return r.error();
      }
      for (const auto& [start, m] : moves)
        if (m.to && used.count(m.to)) moved += m.hi - m.lo;
      // A copy no item took (its items changed meanwhile) goes again.
      for (uint64_t b : taken)
        if (!used.count(b)) (void)c.t.dec_extent(BlockNo{b});
      if (std::any_of(moves.begin(), moves.end(), [](auto& kv) { return kv.second.to == 0; })) break;
    }
    if (next_from <= from) break;
    from = next_from;
  }
  return moved;
}

// The regular files with blocks, by one scan of the tree's inodes.
Result<std::vector<uint64_t>> Filesystem::files_with_blocks() {
  std::vector<uint64_t> inos;
  auto t = PLY_TRY(vol_.begin());
  std::shared_lock lk(mu_);
  std::optional<Error> err;
  PLY_CHECK(t.scan(tree_, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
    if (type_of(k) != ItemType::Inode) return true;
    auto r = decode_inode(k.hi, v);
    if (!r) return err = r.error(), false;
    if (S_ISREG(r->a.mode) && r->a.blocks > 0 && r->a.nlink > 0) inos.push_back(k.hi);
    return true;
  }));
  if (err) return *err;
  return inos;
}

Result<Filesystem::MigrationStats> Filesystem::migrate_all(const std::function<void(uint64_t, uint64_t)>& progress) {
  MigrationStats out;
  if (!placing()) return out;
  const std::vector<uint64_t> inos = PLY_TRY(files_with_blocks());
  for (size_t i = 0; i < inos.size(); i++) {
    auto r = migrate(inos[i]);
    if (!r) {
      out.failed++;
      if (r.error().is_corruption() || r.error().code == EIO) return r.error();
    } else {
      out.files += *r > 0;
      out.blocks += *r;
    }
    if (progress) progress(i + 1, inos.size());
  }
  return out;
}

}  // namespace plyfs
