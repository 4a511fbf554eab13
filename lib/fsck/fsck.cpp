#include "fsck/fsck.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "blockdev/device_set.h"
#include "commit/disk_superblock.h"
#include "fsck/rebuild.h"

namespace plyfs {

using fsck_internal::RebuildPlan;

const char* fix_class_name(FixClass f) {
  switch (f) {
    case FixClass::Info: return "info";
    case FixClass::Preen: return "preen";
    case FixClass::Yes: return "yes";
    case FixClass::None: return "none";
  }
  return "?";
}

size_t FsckReport::errors() const {
  return std::count_if(problems.begin(), problems.end(),
                       [](const FsckProblem& p) { return p.fix != FixClass::Info; });
}
size_t FsckReport::remaining() const {
  return std::count_if(problems.begin(), problems.end(), [](const FsckProblem& p) {
    return p.fix != FixClass::Info && !p.fixed;
  });
}

namespace {

bool starts(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// The pass a problem belongs to, and which mode may repair it (fsck.h R2):
// anything in the space tree is rebuilt (preen); a user tree rebuilt from
// readable items loses nothing when only its shape is wrong (preen), and
// loses the items under an unreadable node otherwise (yes); a block with two
// owners cannot be given to one of them without losing the other (none).
FsckProblem classify(const Problem& p) {
  FsckProblem f{p.code, 0, p.block, p.tree, p.message, FixClass::None, false};
  const std::string& c = p.code;
  if (starts(c, "B-") || starts(c, "T5") || starts(c, "R-")) f.pass = 2;
  else if (starts(c, "T")) f.pass = 3;
  else if (starts(c, "A")) f.pass = 4;
  else if (starts(c, "F")) f.pass = 5;
  else if (starts(c, "U")) f.pass = 6;
  else f.pass = 1;
  // The objects (passes 5-6): the layer that found it knows the cost.
  if (f.pass >= 5) {
    f.fix = p.repair == Problem::Repair::Safe    ? FixClass::Preen
            : p.repair == Problem::Repair::Lossy ? FixClass::Yes
                                                 : FixClass::None;
    return f;
  }

  // An unreadable node loses what is under it; a wrong owner loses nothing.
  const bool lossy = starts(c, "B-node") || c == "B-shared-kind" || starts(c, "T5") || starts(c, "T1") || starts(c, "T3");
  // Two claims on one block that disagree (a node and data, or two
  // lengths of one extent): a rebuild of the space tree cannot tell which
  // is right, and no repair picks one for the user.
  if (c == "A-double-use" || c == "A-double-length" || c == "R-kind") f.fix = FixClass::None;
  else if (c == "A3-ref-range") f.fix = FixClass::Yes;  // the value goes with its tree's rebuild
  else if (starts(c, "A")) f.fix = FixClass::Preen;
  else if (c == "R-id") f.fix = FixClass::Preen;
  else if (starts(c, "R-")) f.fix = FixClass::Yes;  // the record goes, and its tree with it
  else if (p.tree == 2) f.fix = FixClass::Preen;   // the space tree is rebuilt anyway
  else f.fix = lossy ? FixClass::Yes : FixClass::Preen;
  return f;
}

// Pass 1: the slots. The copy that was not chosen is where the next commit
// writes; a crash during a superblock write leaves it torn, or, on devices
// that write garbage or lose sectors when the power fails, with a bad
// checksum, no magic or unreadable sectors: information, not an error. Only
// a copy whose checksum is right but whose fields are wrong cannot come from
// a crash: it was damaged, or written by a broken program.
void check_slots(const SuperChoice& ch, FsckReport& rep) {
  for (int slot = 0; slot < 2; slot++) {
    if (slot == ch.slot) continue;
    const auto& r = ch.reports[slot];
    const std::string where = "superblock slot " + std::to_string(slot);
    switch (r.state) {
      case SlotState::Valid:
        break;
      case SlotState::Empty:
        rep.problems.push_back({"S-empty", 1, Error::kNoBlock, 0,
                                where + " was never written; the next commit writes it",
                                FixClass::Info, false});
        break;
      case SlotState::BadFields:
        rep.problems.push_back({"S-slot", 1, Error::kNoBlock, 0,
                                where + " has a right checksum but wrong fields: " + r.detail,
                                FixClass::Preen, false});
        break;
      case SlotState::Unreadable:
        // It may hold a newer generation than the one in use; rewriting it
        // gives that up, so only -y does (a read-write open refuses it).
        rep.problems.push_back({"S-unreadable", 1, Error::kNoBlock, 0,
                                where + " cannot be read (" + r.detail +
                                    "); a newer generation there would be lost; -y rewrites it",
                                FixClass::Yes, false});
        break;
      default:
        rep.problems.push_back({"S-cut-short", 1, Error::kNoBlock, 0,
                                where + " is " + slot_state_name(r.state) + " (" + r.detail +
                                    "), as a commit cut short leaves it; the next commit "
                                    "rewrites it",
                                FixClass::Info, false});
    }
  }
}

std::vector<FsckProblem> check_generation(BlockDevice& dev, const SuperInfo& sb,
                                          const FsckOptions& opts, VerifyReport* out,
                                          ItemFeed* feed = nullptr) {
  VerifyOptions vo;
  vo.kinds = opts.kinds;
  vo.super = sb;
  vo.feed = feed;
  // The walk reads each node once (shared subtrees: WalkMemo): a cache of
  // more than the path it is on would only be filled and faulted in.
  vo.cache_bytes = 8ull << 20;
  auto v = verify_image(dev, vo);
  std::vector<FsckProblem> ps;
  if (!v) {
    ps.push_back({"B-unreadable", 2, Error::kNoBlock, 0, v.error().message(), FixClass::None, false});
    return ps;
  }
  for (const Problem& p : v->problems)
    if (!starts(p.code, "S-")) ps.push_back(classify(p));
  if (out) *out = std::move(*v);
  return ps;
}

bool cancelled(const FsckOptions& o) { return o.cancel && o.cancel->load(); }

// Trees a repair must rebuild: user trees with damage to their nodes or shape.
RebuildPlan plan_for(const std::vector<FsckProblem>& ps) {
  RebuildPlan plan;
  for (const auto& p : ps)
    // A user tree: not the root or space tree (1, 2), whatever id its
    // record is filed under (R-id: the rebuild renumbers it).
    if (p.tree > 2 && (starts(p.code, "B-") || starts(p.code, "T") || p.code == "A3-ref-range"))
      plan.rebuild.insert(p.tree);
  return plan;
}

// A multi-device volume whose devices hold no superblock in common because
// some devices have no valid copy at all, while the others agree on a
// generation: what is wrong, and with `write` the agreed superblock
// written to those devices (its slot; the other slot stays as it is).
// Nothing when the volume is not like that.
std::optional<std::string> rewrite_lost_devices(BlockDevice& dev, bool write) {
  auto* set = dev.device_set();
  if (!set || set->member_count() < 2) return std::nullopt;
  std::vector<size_t> lost;
  std::optional<std::vector<std::byte>> agreed[2];
  bool disagree[2] = {false, false};
  for (size_t i = 0; i < set->member_count(); i++) {
    bool any = false;
    for (int slot = 0; slot < 2; slot++) {
      std::vector<std::byte> buf(disk::kSuperSize);
      if (!set->member(i).read(disk::kSuperOffset[slot], buf)) continue;
      if (decode_superblock(buf, slot, set->size_bytes()).state != SlotState::Valid) continue;
      any = true;
    }
    if (!any) lost.push_back(i);
  }
  if (lost.empty() || lost.size() == set->member_count()) return std::nullopt;
  for (size_t i = 0; i < set->member_count(); i++) {
    if (std::find(lost.begin(), lost.end(), i) != lost.end()) continue;
    for (int slot = 0; slot < 2; slot++) {
      std::vector<std::byte> buf(disk::kSuperSize);
      const bool valid = set->member(i).read(disk::kSuperOffset[slot], buf) &&
                         decode_superblock(buf, slot, set->size_bytes()).state == SlotState::Valid;
      if (!valid || (agreed[slot] && *agreed[slot] != buf)) disagree[slot] = true;
      else agreed[slot] = std::move(buf);
    }
  }
  int best = -1;
  uint64_t best_gen = 0;
  for (int slot = 0; slot < 2; slot++) {
    if (disagree[slot] || !agreed[slot]) continue;
    const uint64_t gen = decode_superblock(*agreed[slot], slot, set->size_bytes()).info->generation.v;
    if (best < 0 || gen > best_gen) best = slot, best_gen = gen;
  }
  if (best < 0) return std::nullopt;
  std::string which;
  for (size_t i : lost) which += (which.empty() ? "" : ", ") + std::to_string(i);
  std::string what = "device" + std::string(lost.size() > 1 ? "s " : " ") + which + " of the volume " +
                     (lost.size() > 1 ? "hold" : "holds") + " no valid superblock; the others agree on generation " +
                     std::to_string(best_gen);
  if (write) {
    for (size_t i : lost)
      if (!set->member(i).write(disk::kSuperOffset[best], *agreed[best]) || !set->member(i).flush())
        return std::nullopt;
    what += ", written to " + std::string(lost.size() > 1 ? "them" : "it");
  }
  return what;
}

// Repairs one run may write, each a generation (R4): structural rounds,
// then the objects'.
constexpr int kMaxRepairRounds = 8;

// Progress (FsckOptions::progress): the device counts the bytes read; the
// passes say where they are; a thread reports 5 times a second.
class Meter final : public BlockDevice {
 public:
  Meter(BlockDevice& inner, const FsckOptions& o)
      : in_(inner), cb_(o.progress), data_(o.progress_data), ticker_([this] { tick(); }) {}
  ~Meter() override {
    {
      std::lock_guard l(mu_);
      end_pass();
      stop_ = true;
    }
    cv_.notify_all();
    ticker_.join();
  }

  // A pass starts: `total` blocks of `bs` bytes to read, about (0: unknown).
  void pass(int pass, const std::string& what, uint64_t total, uint32_t bs) {
    std::lock_guard l(mu_);
    end_pass();
    pass_ = pass, what_ = what, total_ = total, bs_ = bs ? bs : 4096;
    start_ = read_.load();
    cb_(pass_, what_, 0, total_);
    last_ = 0;
  }
  bool counts_data() const { return data_; }

  Result<void> read(uint64_t off, std::span<std::byte> out) override {
    read_ += out.size();
    return in_.read(off, out);
  }
  Result<void> write(uint64_t off, std::span<const std::byte> in) override { return in_.write(off, in); }
  Result<void> flush() override { return in_.flush(); }
  Result<void> discard(uint64_t off, uint64_t len) override { return in_.discard(off, len); }
  uint64_t size_bytes() const override { return in_.size_bytes(); }
  uint32_t logical_sector_size() const override { return in_.logical_sector_size(); }
  uint32_t physical_sector_size() const override { return in_.physical_sector_size(); }
  DeviceSet* device_set() override { return in_.device_set(); }
  std::string display_name() const override { return in_.display_name(); }

 private:
  uint64_t done() const { return (read_.load() - start_) / bs_; }
  void end_pass() {  // under mu_
    if (pass_) cb_(pass_, what_, done(), total_);
    pass_ = 0;
  }
  void tick() {
    std::unique_lock l(mu_);
    while (!cv_.wait_for(l, std::chrono::milliseconds(200), [&] { return stop_; }))
      if (pass_ && done() != last_) cb_(pass_, what_, last_ = done(), total_);
  }

  BlockDevice& in_;
  const std::function<void(int, const std::string&, uint64_t, uint64_t)> cb_;
  const bool data_;
  std::atomic<uint64_t> read_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int pass_ = 0;
  std::string what_;
  uint64_t total_ = 0, start_ = 0, last_ = 0;
  uint32_t bs_ = 4096;
  std::thread ticker_;  // last: starts when everything else is ready
};

Result<FsckReport> run(BlockDevice& dev, const FsckOptions& opts, int depth, Meter* meter = nullptr);

}  // namespace

Result<FsckReport> fsck_run(BlockDevice& dev, const FsckOptions& opts) {
  if (!opts.progress) return run(dev, opts, 0);
  Meter meter(dev, opts);
  // A multi-device volume stays a set through the meter (device_set()):
  // recovery reads every device's superblocks (format.md#multi-device-recovery).
  return run(meter, opts, 0, &meter);
}

namespace {

Result<FsckReport> run(BlockDevice& dev, const FsckOptions& opts, int depth, Meter* meter) {
  FsckReport rep;
  auto progress = [&](int pass, const char* what, uint64_t total = 0, uint32_t bs = 0) {
    if (meter) meter->pass(pass, what, total, bs);
  };

  progress(1, "superblocks", 2, 4096);
  auto ch = read_superblocks(dev);
  if (!ch && ch.error().code == EUCLEAN && depth == 0) {
    // A multi-device volume some of whose devices lost both superblock
    // copies (a damaged device table among them): -y gives them the newest
    // generation the others agree on, then checks that generation whole
    // across every device (format.md#multi-device-recovery).
    if (auto fix = rewrite_lost_devices(dev, opts.mode == FsckMode::Yes); fix) {
      if (opts.mode != FsckMode::Yes) {
        rep.problems.push_back({"S-device", 1, Error::kNoBlock, 0, *fix + "; -y rewrites them", FixClass::Yes, false});
        rep.exit_code = kFsckUncorrected;
        return rep;
      }
      auto again = run(dev, opts, depth + 1, meter);
      if (again) again->problems.insert(again->problems.begin(), {"S-device", 1, Error::kNoBlock, 0, *fix, FixClass::Yes, true});
      if (again && again->exit_code == kFsckClean) again->exit_code = kFsckCorrected;
      return again;
    }
  }
  if (!ch) {
    if (ch.error().code != EUCLEAN) return ch.error();  // not plyfs, newer version, I/O
    rep.problems.push_back({"S-both", 1, Error::kNoBlock, 0, ch.error().reason, FixClass::None, false});
    rep.exit_code = kFsckUncorrected;
    return rep;
  }
  rep.choice = *ch;
  const SuperInfo& sb = ch->info;
  rep.checked = sb.generation;
  rep.total_blocks = sb.total_blocks;
  if (sb.incompat & ~kIncompatKnown)
    return Error::io(EOPNOTSUPP, "the filesystem uses incompatible features this fsck does not know");
  if ((sb.ro_compat & ~kRoCompatKnown) && opts.mode != FsckMode::Check)
    return Error::io(EROFS, "the filesystem uses features this fsck can only check (use -n)");
  check_slots(*ch, rep);
  if (sb.ro_compat & ~kRoCompatKnown)
    rep.problems.push_back({"S-features", 1, Error::kNoBlock, 0,
                            "the filesystem uses read-only-compatible features this fsck does "
                            "not know: it can check, not repair",
                            FixClass::Info, false});
  if (ch->fell_back)
    rep.problems.push_back({"S-recovered", 1, Error::kNoBlock, 0,
                            "generation " + std::to_string(sb.generation.v) +
                                " is the newest whole one: the last commit did not complete",
                            FixClass::Info, false});

  progress(2, "metadata blocks, B-trees and space",
           sb.meta_blocks + (meter && meter->counts_data() ? sb.data_blocks : 0), sb.block_size);
  VerifyReport vr;
  // Pass 5 reads the items as passes 2-4 walk the trees (one read of each node).
  std::unique_ptr<ObjectChecker> feed = opts.object_feed ? opts.object_feed(dev) : nullptr;
  auto found = check_generation(dev, sb, opts, &vr, feed.get());
  rep.trees = vr.trees;
  rep.nodes = vr.nodes;
  rep.items = vr.items;
  rep.extents = vr.extents;
  rep.used_blocks = sb.used_blocks;
  // Pass 5, the objects above the B-trees, on a structurally sound image.
  if (found.empty() && (feed || opts.object_checks)) {
    progress(5, "filesystem objects");
    for (const Problem& p : feed ? feed->finish() : opts.object_checks(dev)) found.push_back(classify(p));
  }
  feed.reset();
  rep.problems.insert(rep.problems.end(), found.begin(), found.end());
  std::stable_sort(rep.problems.begin(), rep.problems.end(),
                   [](const FsckProblem& a, const FsckProblem& b) { return a.pass < b.pass; });
  if (cancelled(opts)) {
    rep.cancelled = true;
    rep.exit_code = kFsckCancelled;
    return rep;
  }

  // R3: when this generation lost data, an older generation that is whole
  // is the better repair.
  // Only the B-trees count: an object repair gives up far less than the
  // newest generation (and the older one's objects are not checked here).
  const bool lossy = std::any_of(found.begin(), found.end(), [](const FsckProblem& p) {
    return p.pass <= 4 && (p.fix == FixClass::Yes || p.fix == FixClass::None);
  });
  std::optional<SuperInfo> fallback;
  const auto& other = ch->reports[1 - ch->slot];
  // Only a generation this fsck can write back: no feature it does not know.
  if (lossy && other.state == SlotState::Valid && other.info->generation < sb.generation &&
      !(other.info->incompat & ~kIncompatKnown) && !(other.info->ro_compat & ~kRoCompatKnown)) {
    progress(2, "the older generation", other.info->meta_blocks, sb.block_size);
    if (check_generation(dev, *other.info, opts, nullptr).empty()) {
      fallback = *other.info;
      rep.problems.push_back({"S-fallback", 1, Error::kNoBlock, 0,
                              "generation " + std::to_string(sb.generation.v) +
                                  " is damaged; generation " +
                                  std::to_string(fallback->generation.v) +
                                  " in the other superblock is whole and can replace it",
                              FixClass::Yes, false});
    }
  }

  if (rep.errors() == 0) {
    rep.exit_code = kFsckClean;
    return rep;
  }
  // Decide. Preen repairs only what loses nothing; -y everything that can be.
  bool repair = false;
  if (opts.mode == FsckMode::Preen)
    repair = std::all_of(rep.problems.begin(), rep.problems.end(), [](const FsckProblem& p) {
      return p.fix == FixClass::Info || p.fix == FixClass::Preen;
    });
  else if (opts.mode == FsckMode::Yes)
    // A structural problem no rebuild mends stops it; an object that cannot
    // be mended stays as it is while the others are.
    repair = fallback ||
             (std::none_of(rep.problems.begin(), rep.problems.end(),
                           [](const FsckProblem& p) { return p.fix == FixClass::None && p.pass <= 4; }) &&
              std::any_of(rep.problems.begin(), rep.problems.end(), [](const FsckProblem& p) {
                return p.fix == FixClass::Preen || p.fix == FixClass::Yes;
              }));
  if (!repair) {
    rep.exit_code = kFsckUncorrected;
    return rep;
  }
  if (cancelled(opts)) {
    rep.cancelled = true;
    rep.exit_code = kFsckCancelled;
    return rep;
  }

  progress(5, "repairing");
  const bool structural = std::any_of(rep.problems.begin(), rep.problems.end(), [](const FsckProblem& p) {
    return p.fix != FixClass::Info && p.pass <= 4;
  });
  if (!fallback && !structural) {
    // Only objects (R4): the hook repairs them in one generation.
    auto r = opts.object_repair ? opts.object_repair(dev, opts.mode == FsckMode::Yes)
                                : Result<FsckOptions::ObjectRepair>(Error::invalid("no object repairs"));
    if (!r) {
      rep.actions.push_back("repair refused: " + r.error().message());
      rep.exit_code = kFsckUncorrected;
      return rep;
    }
    rep.written = r->written;
    for (auto& a : r->actions) rep.actions.push_back(std::move(a));
  } else if (fallback) {
    // The older generation is whole: make it current again under the next
    // generation number, written over the damaged copy's slot.
    SuperInfo again = *fallback;
    again.generation = next(fallback->generation);
    BlockCache cache(dev, again.block_size, 1 << 20);
    PLY_CHECK(write_generation(dev, cache, again));
    rep.written = again.generation;
    rep.actions.push_back("made generation " + std::to_string(fallback->generation.v) +
                          " current again as generation " + std::to_string(again.generation.v) +
                          "; the changes of generation " + std::to_string(sb.generation.v) +
                          " are lost");
  } else {
    auto r = fsck_internal::rebuild_generation(dev, sb, plan_for(found), opts.kinds);
    if (!r) {
      rep.actions.push_back("repair refused: " + r.error().message());
      rep.exit_code = kFsckUncorrected;
      return rep;
    }
    rep.written = r->written;
    rep.actions.push_back("wrote generation " + std::to_string(r->written.v) +
                          ": root and space trees rebuilt, " + std::to_string(r->trees_kept) +
                          " trees kept, " + std::to_string(r->trees_rebuilt) + " rebuilt (" +
                          std::to_string(r->items_kept) + " items carried over, " +
                          std::to_string(r->items_dropped) + " referencing blocks outside dropped), " +
                          std::to_string(r->records_dropped) + " damaged root records dropped" +
                          (r->records_renumbered ? ", " + std::to_string(r->records_renumbered) +
                                                       " trees given new ids"
                                                 : std::string()) +
                          (r->space_released ? "; blocks only the damaged space tree listed were freed"
                                             : ""));
  }

  // The repaired image must check clean; whatever remains is reported. A
  // structural repair is checked in the same mode, so that the objects it
  // left wrong (or that pass 5 could not see before) are repaired next (R4),
  // and so is a structural repair that still finds some: a damaged node
  // that several trees share is reported once, under the first tree that
  // reaches it, and each round rebuilds the next tree that still does.
  progress(7, "checking the repair", sb.meta_blocks, sb.block_size);
  FsckOptions again = opts;
  if (!(structural && depth + 1 < kMaxRepairRounds)) again.mode = FsckMode::Check;
  auto after = run(dev, again, depth + 1);  // its reads count in pass 7
  if (!after) return after.error();
  if (after->cancelled) {
    rep.cancelled = true;
    rep.exit_code = kFsckCancelled;
    return rep;
  }
  // A problem is fixed when the check after the repair does not find it
  // again (or found it and repaired it in its own round).
  auto id = [](const FsckProblem& p) { return p.code + '\n' + std::to_string(p.tree) + '\n' + p.message; };
  std::map<std::string, const FsckProblem*> later;
  for (const auto& p : after->problems)
    if (p.fix != FixClass::Info) later.emplace(id(p), &p);
  for (auto& p : rep.problems) {
    if (p.fix == FixClass::Info) continue;
    auto it = later.find(id(p));
    p.fixed = it == later.end() || it->second->fixed;
    if (it != later.end()) later.erase(it);
  }
  for (const auto& p : after->problems)
    if (p.fix != FixClass::Info && later.count(id(p))) rep.problems.push_back(p);
  if (again.mode != FsckMode::Check) {
    for (auto& a : after->actions) rep.actions.push_back(a);
    if (after->written) rep.written = after->written;
  }
  const bool clean = after->remaining() == 0;
  rep.used_blocks = after->choice.info.used_blocks;
  rep.exit_code = clean ? kFsckCorrected : kFsckUncorrected;
  return rep;
}

}  // namespace
}  // namespace plyfs
