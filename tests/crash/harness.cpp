#include "harness.h"

#include <algorithm>
#include <unordered_set>

#include "btree/disk_node.h"
#include "fsck/fsck.h"

namespace plyfs::crash {

void Totals::add_failure(const std::string& cls, const std::string& line) {
  failed++;
  failure_classes.insert(cls);
  if (reproducers.size() < 20) reproducers.push_back(line);
}

std::string fsck_after_crash(StateDevice& dev) {
  return fsck_clean(dev, dev.spec().lost == Lost::Unreadable, [&] { return dev.overlay_writes(); });
}

std::string fsck_clean(BlockDevice& dev, bool unreadable_tear,
                       const std::function<uint64_t()>& overlay_writes) {
  FsckOptions fo;
  fo.kinds = kinds();
  const uint64_t writes = overlay_writes();
  auto f = fsck_run(dev, fo);
  if (!f) return "FSCK_FAILED: " + f.error().message();
  if (overlay_writes() != writes) return "FSCK_WROTE: fsck -n wrote to the image";
  bool unreadable_copy = false;
  for (const auto& p : f->problems) {
    if (p.fix == FixClass::Info) continue;
    // A superblock write torn into unreadable sectors (the EIO variant)
    // leaves a copy that must be rewritten before the filesystem is writable.
    if (p.code == "S-unreadable" && unreadable_tear) {
      unreadable_copy = true;
      continue;
    }
    return "FSCK_ERRORS: " + p.code + ": " + p.message;
  }
  if (!unreadable_copy) return "";
  fo.mode = FsckMode::Yes;
  auto y = fsck_run(dev, fo);
  if (!y || y->exit_code != kFsckCorrected) return "FSCK_REPAIR: fsck -y did not rewrite the unreadable copy";
  fo.mode = FsckMode::Check;
  auto again = fsck_run(dev, fo);
  if (!again || again->errors()) return "FSCK_REPAIR: still not clean after fsck -y";
  return "";
}

std::string check_state(const Run& run, const Spec& spec, bool write_check, PlantedBug bug) {
  StateDevice dev(run.log, spec, std::hash<std::string>{}(spec.id()));
  return check_image(run, dev, run.log.gen_lo(spec.crash_at, run.base_gen),
                     run.log.gen_hi(spec.crash_at, run.base_gen), spec.lost == Lost::Unreadable,
                     [&] { return dev.overlay_writes(); }, write_check, bug);
}

std::string check_image(const Run& run, BlockDevice& dev, uint64_t lo, uint64_t hi, bool unreadable_tear,
                        const std::function<uint64_t()>& overlay_writes, bool write_check,
                        PlantedBug bug) {
  VolumeOptions ro;
  ro.read_only = true;
  ro.kinds = kinds();
  ro.cache_bytes = 2 << 20;
  ro.planted_bug = bug == PlantedBug::TrustTornSuper ? bug : PlantedBug::None;
  uint64_t got_gen = 0;
  std::vector<uint64_t> ids;
  std::map<uint64_t, uint8_t> kinds_of;
  {
    auto vol = Volume::open(dev, ro);
    if (!vol) return "UNMOUNTABLE: " + vol.error().message();
    got_gen = (*vol)->durable_generation().v;
    if (got_gen < lo)
      return "GEN_TOO_OLD: recovered generation " + std::to_string(got_gen) +
             ", but generation " + std::to_string(lo) + " was durable";
    if (got_gen > hi)
      return "GEN_IMPOSSIBLE: recovered generation " + std::to_string(got_gen) +
             ", whose superblock was never written (newest " + std::to_string(hi) + ")";
    auto want = run.model_at.find(got_gen);
    if (want == run.model_at.end())
      return "GEN_UNKNOWN: generation " + std::to_string(got_gen) + " has no model";
    const std::string diff = compare(**vol, want->second, ids, kinds_of);
    if (diff.rfind("unreadable", 0) == 0 || diff.rfind("cannot", 0) == 0)
      return "CONTENT_UNREADABLE: " + diff;
    if (!diff.empty())
      return "CONTENT_MISMATCH at generation " + std::to_string(got_gen) + ": " + diff;
  }
  if (overlay_writes()) return "RECOVERY_WROTE: opening a crash state wrote to it (C6)";
  if (auto err = fsck_clean(dev, unreadable_tear, overlay_writes); !err.empty()) return err;
  FsckOptions fo;
  fo.kinds = kinds();
  if (!write_check) return "";

  // The write checks (CrashMonkey's sanity checks, extended): the recovered
  // image takes new work, commits it, stays consistent, and never hands out
  // a tree id that is already in use.
  VolumeOptions rw;
  rw.kinds = kinds();
  rw.cache_bytes = 2 << 20;
  auto vol = Volume::open(dev, rw);
  if (!vol) return "WRITE_CHECK: reopen read-write: " + vol.error().message();
  {
    auto txn = (*vol)->begin(Volume::TxnOptions{true, 0});
    if (!txn) return "WRITE_CHECK: begin: " + txn.error().message();
    auto t = txn->create_tree(kKindPlain);
    if (!t) return "WRITE_CHECK: create: " + t.error().message();
    for (uint64_t id : ids)
      if (t->v <= id) return "WRITE_CHECK: new tree id " + std::to_string(t->v) + " reuses " + std::to_string(id);
    for (uint64_t k = 0; k < 40; k++) {
      std::vector<std::byte> v(24, std::byte{7});
      if (auto r = txn->put(*t, Key{k, 0}, v); !r) return "WRITE_CHECK: put: " + r.error().message();
    }
    // Clone, change and drop a plain tree (changing a tree of another kind
    // would need that kind's reference protocol).
    const auto plain = std::find_if(ids.begin(), ids.end(), [&](uint64_t id) {
      return kinds_of.count(id) && kinds_of[id] == kKindPlain;
    });
    if (plain != ids.end()) {
      auto c = txn->clone_tree(TreeId{*plain});
      if (!c) return "WRITE_CHECK: clone: " + c.error().message();
      if (auto r = txn->erase(*c, Key{0, 0}); !r) return "WRITE_CHECK: erase: " + r.error().message();
      if (auto r = txn->drop_tree(*c); !r) return "WRITE_CHECK: drop: " + r.error().message();
    }
  }
  if (auto r = (*vol)->close(); !r) return "WRITE_CHECK: commit: " + r.error().message();
  vol->reset();
  auto f2 = fsck_run(dev, fo);
  if (!f2 || f2->errors()) return "WRITE_CHECK: fsck after new work reports errors";
  return "";
}

// Block classes, from the first block a write carries: superblock, root-tree
// node, space-tree node, inner node of a user tree, user leaf, anything else.
int block_class(const Log& log, size_t pos) {
  const Entry& e = log.entries[pos];
  for (const auto& s : log.supers)
    if (s.pos == pos) return 0;
  if (!e.data || e.data->size() < 64) return 5;
  const auto* h = reinterpret_cast<const disk::NodeHeader*>(e.data->data());
  if (h->magic.get() != disk::kNodeMagic) return 5;
  if (h->owner.get() == 1) return 1;
  if (h->owner.get() == 2) return 2;
  return h->level > 0 ? 3 : 4;
}

namespace {

// The open sets: runs of writes between two successful flushes.
struct Epoch {
  size_t start, end;           // positions [start, end); end is the closing flush or the log end
  std::vector<size_t> writes;  // write positions in it
};

std::vector<Epoch> epochs_of(const Log& log) {
  std::vector<Epoch> out;
  size_t start = 0;
  auto close = [&](size_t end) {
    Epoch e{start, end, {}};
    for (size_t p : log.writes)
      if (p >= start && p < end) e.writes.push_back(p);
    out.push_back(std::move(e));
  };
  for (size_t f : log.flushes) {
    close(f);
    start = f + 1;
  }
  close(log.entries.size());
  return out;
}

}  // namespace

void check_run(const Workload& w, const Run& run, const Sampling& s, uint64_t seed, Totals& t,
               const std::string& only, bool verbose, Oracle oracle, bool protocol) {
  t.workloads++;
  if (!oracle)
    oracle = [&](const Spec& spec, bool wc) { return check_state(run, spec, wc, w.bug); };
  std::mt19937_64 rng(seed);
  auto chance = [&](double p) { return p >= 1.0 || std::uniform_real_distribution<>(0, 1)(rng) < p; };

  if (only.empty() && protocol) {
    t.logs_checked++;
    for (const auto& v : check_protocol(run)) {
      t.violations++;
      t.add_failure("PROTOCOL " + v.check, w.id + " " + v.check + " at log entry " +
                                                std::to_string(v.pos) + ": " + v.what);
    }
  }

  std::unordered_set<std::string> seen;
  auto state = [&](Spec spec, int tier) {
    if (s.faults) {  // T4: states around an injected I/O failure
      spec.tier = "T4" + spec.tier;
      tier = 4;
    }
    const std::string id = spec.id();
    if (!seen.insert(id).second) return;  // the same state reached another way
    if (!only.empty() && id != only) return;
    t.states++;
    t.by_tier[tier]++;
    const bool wc = chance(s.write_checks) || !only.empty();
    const std::string err = oracle(spec, wc);
    if (verbose || !only.empty())
      std::printf("  %s %s\n", id.c_str(), err.empty() ? "ok" : err.c_str());
    if (!err.empty())
      t.add_failure(err.substr(0, err.find_first_of(": ")),
                    "crash_tests --only '" + w.id + "/" + id + "'   # " + err);
  };

  const auto epochs = epochs_of(run.log);
  for (size_t ei = 0; ei < epochs.size(); ei++) {
    const Epoch& e = epochs[ei];
    const size_t n = e.writes.size();
    // T0: right after the flush that opened this epoch, nothing of it kept.
    state(Spec{e.start, {}, std::nullopt, Lost::Old, "T0"}, 0);
    // T1 and T3: every prefix; the last write of a prefix may also be torn.
    for (size_t i = 0; i < n; i++) {
      std::vector<size_t> kept(e.writes.begin(), e.writes.begin() + i + 1);
      if (chance(s.t1) || i + 1 == n) state(Spec{e.writes[i] + 1, kept, std::nullopt, Lost::Old, "T1"}, 1);
      if (!chance(s.t3)) continue;
      const size_t sectors = run.log.entries[e.writes[i]].length / run.log.sector;
      if (sectors < 2) continue;
      for (size_t k = 0; k < s.tears_per_write; k++) {
        std::vector<bool> mask(sectors);
        if (k == 0) for (size_t j = 0; j < sectors / 2; j++) mask[j] = true;       // first half new
        else if (k == 1) for (size_t j = 0; j + 1 < sectors; j++) mask[j] = true;  // all but the last
        else for (auto&& b : mask) b = rng() & 1;                                   // any mix
        if (std::all_of(mask.begin(), mask.end(), [](bool b) { return b; })) mask[0] = false;
        const Lost lost = static_cast<Lost>(k % 3);
        state(Spec{e.writes[i] + 1, kept, mask, lost, "T3"}, 3);
      }
    }
    // T2: subsets of the whole epoch, at its end (before its flush).
    if (n < 2) continue;
    auto subset = [&](const std::vector<bool>& keep) {
      std::vector<size_t> kept;
      for (size_t i = 0; i < n; i++)
        if (keep[i]) kept.push_back(e.writes[i]);
      state(Spec{e.end, kept, std::nullopt, Lost::Old, "T2"}, 2);
    };
    if (n <= s.exhaustive_k) {
      for (uint64_t m = 1; m + 1 < (1ull << n); m++) {
        std::vector<bool> keep(n);
        for (size_t i = 0; i < n; i++) keep[i] = (m >> i) & 1;
        subset(keep);
      }
    } else {
      for (size_t d = 0; d < n; d++) {  // drop one, keep one
        std::vector<bool> drop(n, true), one(n, false);
        drop[d] = false;
        one[d] = true;
        subset(drop);
        subset(one);
      }
      for (size_t r = 0; r < s.random_subsets; r++) {
        std::vector<bool> keep(n);
        for (auto&& b : keep) b = rng() & 1;
        subset(keep);
      }
      // Per block class: keep, or drop, every write of one class at once.
      std::vector<int> cls(n);
      for (size_t i = 0; i < n; i++) cls[i] = block_class(run.log, e.writes[i]);
      for (int c = 0; c < kClasses; c++) {
        std::vector<bool> only(n), all_but(n);
        for (size_t i = 0; i < n; i++) only[i] = cls[i] == c, all_but[i] = cls[i] != c;
        if (std::count(only.begin(), only.end(), true) == 0) continue;
        subset(only);
        subset(all_but);
      }
    }
  }
}

}  // namespace plyfs::crash
