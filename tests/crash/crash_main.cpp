// The crash-injection and fault-injection harness (issue 4, docs/testing.md).
//
//   crash_tests [--budget-s S] [--max-s S] [--states N] [--min-states N]
//               [--seed S] [--fs-share F] [--fs-only] [--min-fs-states N]
//               [--only 'WORKLOAD/STATE'] [--self-test] [--verbose]
//
// Runs the suites in order (bounded ACE sequences, targeted scenarios,
// volumes of several devices (multidev.h), crashes
// during fsck repair and mkfs, fault-injection loops, long random workloads;
// then the filesystem-level suites: seq-1 of filesystem, union and snapshot
// operations, near-full devices, sampled seq-2 and seq-3, long random
// filesystem workloads) until every suite is done or the budget is spent.
// The engine's open-ended suites stop at 1 - F of the budget (and of
// --states), leaving F (default 0.5) to the filesystem ones. Checks every
// recorded log with the protocol checkers and every enumerated crash state
// with the oracle, and prints the counts per suite. Fails when any check
// fails or fewer than --min-states states (--min-fs-states filesystem-level
// ones) were checked. The budget is a target, not a limit: while a floor is
// not met the filesystem suites go on past it, up to --max-s (default 1.5
// times the budget), so that a slow machine checks as many states as a fast
// one rather than failing for its speed. --only 'WORKLOAD/' checks every state
// of a workload; for a filesystem one it also names every fault run of it
// ('fs-fault/compress/': fs-fault/compress/fault-...); for engine ones any
// prefix ending in a slash names every workload under it ('multidev/').
// --self-test instead runs with each planted bug and fails unless every one
// is caught.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fsck/corrupt.h"
#include "fs_workload.h"
#include "fsck/fsck.h"
#include "harness.h"
#include "multidev.h"
#include "suites.h"

using namespace plyfs;
using namespace plyfs::crash;

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  double budget_s = 300;
  double max_s = 0;  // 0: 1.5 times the budget
  uint64_t states = ~0ull;
  uint64_t min_states = 0;
  uint64_t min_fs_states = 0;
  uint64_t seed = 0;
  bool seed_given = false;
  double fs_share = 0.5;  // of the budget and of --states, for the filesystem suites
  std::string only;
  bool self_test = false, verbose = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i++) {
    std::string s = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "crash_tests: %s needs a value\n", s.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (s == "--budget-s") a.budget_s = std::stod(val());
    else if (s == "--max-s") a.max_s = std::stod(val());
    else if (s == "--states") a.states = std::stoull(val());
    else if (s == "--min-states") a.min_states = std::stoull(val());
    else if (s == "--seed") a.seed = std::stoull(val()), a.seed_given = true;
    else if (s == "--only") a.only = val();
    else if (s == "--fs-share") a.fs_share = std::stod(val());
    else if (s == "--min-fs-states") a.min_fs_states = std::stoull(val());
    else if (s == "--fs-only") a.fs_share = 1;
    else if (s == "--self-test") a.self_test = true;
    else if (s == "--verbose") a.verbose = true;
    else {
      std::fprintf(stderr, "crash_tests: unknown option %s\n", s.c_str());
      std::exit(2);
    }
  }
  if (!a.seed_given) a.seed = std::random_device{}();
  if (a.max_s <= 0) a.max_s = a.budget_s * 1.5;
  if (a.max_s < a.budget_s) a.max_s = a.budget_s;
  return a;
}

struct Driver {
  Args args;
  Totals t;
  Clock::time_point start = Clock::now();
  std::map<std::string, uint64_t> per_suite;

  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start).count(); }
  bool floors_met() const {
    return t.states >= args.min_states && fs_states >= args.min_fs_states;
  }
  // Past the budget the run goes on only while a floor is unmet, and never
  // past --max-s.
  bool spent() const {
    const double e = elapsed();
    return t.states >= args.states || e > args.max_s || (e > args.budget_s && floors_met());
  }
  // The engine suites' share is spent: the rest is the filesystem suites'.
  bool engine_spent() const {
    const double share = 1 - args.fs_share;
    return spent() || elapsed() > args.budget_s * share ||
           (args.states != ~0ull && t.states >= args.states * share);
  }

  // The same for a filesystem workload (fs_workload.h).
  // With a fault rule, returns whether the injected fault fired.
  bool run_fs(const FsWorkload& w, const Sampling& s, const std::string& suite,
              const FaultDevice::Rule* fault = nullptr) {
    std::string only_state;
    if (!args.only.empty()) {
      const auto slash = args.only.rfind('/', args.only.find(':'));
      // 'WORKLOAD/': every state of it, and of its fault runs (WORKLOAD/fault-...).
      const bool runs_of = fault && args.only.back() == '/' && w.id.rfind(args.only, 0) == 0;
      if (args.only.substr(0, slash) != w.id && !runs_of) return fault != nullptr;
      if (!runs_of) only_state = args.only.substr(slash + 1);
    }
    const FsRun fr = record_fs(w, fault);
    const uint64_t before = t.states;
    if (args.verbose) {
      std::printf("%s: %zu writes, generations", w.id.c_str(), fr.run.log.writes.size());
      for (const auto& [g, m] : fr.run.model_at)
        std::printf(" %llu%s", (unsigned long long)g, fr.inner_gen.count(g) ? "(inner)" : "");
      std::printf("\n");
      if (fr.compressed_items)
        std::printf("  compressed extent items over the generations: %zu (%zu mapping part of their frame)\n",
                    fr.compressed_items, fr.partial_frames);
      for (size_t i = 0; i < w.ops.size() && i < fr.results.size(); i++)
        std::printf("  %s: %s\n", w.ops[i].str().c_str(), fr.results[i].c_str());
    }
    // Under a fault, every failing operation or commit must have returned
    // EIO, ENOSPC or EROFS (record_fs puts anything else in run.error).
    if (!fr.run.error.empty())
      t.add_failure(fault && fr.run.fault_fired ? "FAULT_ERROR" : "WORKLOAD", w.id + ": " + fr.run.error);
    if (fr.run.failed_writable)
      t.add_failure("C5", w.id + ": a commit failed and the volume stayed writable");
    if (fault && args.verbose && !fr.fault_error.empty())
      std::printf("%s: the fault surfaced as %s\n", w.id.c_str(), fr.fault_error.c_str());
    Workload shell;
    shell.id = w.id;
    shell.bug = w.bug;
    FsOracleCache cache;
    check_run(shell, fr.run, s, args.seed ^ std::hash<std::string>{}(w.id), t, only_state,
              args.verbose,
              [&](const Spec& spec, bool wc) { return check_fs_state(w, fr, spec, wc, cache); });
    per_suite[suite] += t.states - before;
    fs_states += t.states - before;
    refused_ops += fr.failed_ops;
    fault_refusals += fr.fault_ops;
    return fr.run.fault_fired;
  }
  uint64_t fault_refusals = 0;
  uint64_t fs_states = 0, refused_ops = 0;

  // Records and checks one workload; with --only, just the named state.
  // Returns whether an injected fault fired.
  bool run(const Workload& w, const Sampling& s, const std::string& suite,
           const FaultDevice::Rule* fault = nullptr, bool require_clean_run = true) {
    std::string only_state;
    // 'PREFIX/' (ending in a slash): every state of every workload under it.
    if (!args.only.empty() && !(args.only.back() == '/' && w.id.rfind(args.only, 0) == 0)) {
      const auto slash = args.only.rfind('/', args.only.find(':'));
      if (args.only.substr(0, slash) != w.id) return fault != nullptr;
      only_state = args.only.substr(slash + 1);
    }
    Run run = record(w, fault);
    const uint64_t before = t.states;
    if (!run.error.empty() && require_clean_run && !(fault && run.fault_fired))
      t.add_failure("WORKLOAD", w.id + ": " + run.error);
    // An injected fault reaches the caller as a clean error: the device's own
    // EIO or ENOSPC, or EROFS once a failed commit turned the volume read-only.
    if (fault && run.fault_fired && !run.error.empty() && run.error_code != EIO &&
        run.error_code != ENOSPC && run.error_code != EROFS)
      t.add_failure("FAULT_ERROR", w.id + ": an injected fault surfaced as " + run.error);
    if (run.failed_writable)
      t.add_failure("C5", w.id + ": a commit failed and the volume stayed writable");
    // The scenarios made for discard free blocks in every commit: a run of
    // one that issued no discard would check nothing about A6.
    if (w.discard && w.id.rfind("scenario/discard-", 0) == 0 && run.log.discards.empty())
      t.add_failure("WORKLOAD", w.id + ": discard is on, but no discard was issued");
    if (!w.devices.empty()) {  // several devices: each member torn and reordered on its own
      if (run.error.empty())
        if (auto err = check_multi_placement(w, run); !err.empty()) t.add_failure("WORKLOAD", w.id + ": " + err);
      check_multi_run(w, run, s, args.seed ^ std::hash<std::string>{}(w.id), t, only_state, args.verbose);
    } else {
      check_run(w, run, s, args.seed ^ std::hash<std::string>{}(w.id), t, only_state, args.verbose);
    }
    per_suite[suite] += t.states - before;
    return run.fault_fired;
  }
};

// A crash during fsck -y: every state is the damaged image, still reported
// as damaged, or the repaired one, clean; never anything else.
void fsck_repair_suite(Driver& d, const Sampling& s) {
  for (int variant = 0; variant < 3; variant++) {
    Workload base_w;
    base_w.id = "fsck-repair/" + std::to_string(variant);
    base_w.setup = ace_setup();
    Run base = record(base_w);
    auto dev = base.log.base->clone();
    auto ch = read_superblocks(*dev);
    if (!ch) {
      d.t.add_failure("SETUP", "fsck-repair: " + ch.error().message());
      return;
    }
    // Three kinds of damage: a leak, a wrong owner, an unreadable leaf.
    CorruptTarget target;
    CorruptAction act;
    if (variant == 0) target = {CorruptStruct::SpaceItem, -1, ch->info.root_tree.block.v, "refs"},
                      act = {Damage::Add, 1, 0, true};
    if (variant == 1) target = {CorruptStruct::Node, -1, ch->info.root_tree.block.v, "owner"},
                      act = {Damage::Set, 2, 0, true};
    if (variant == 2) {
      VerifyOptions vo;
      vo.kinds = kinds();
      vo.collect_reachable = true;
      auto rep = verify_image(*dev, vo);
      uint64_t leaf = rep ? rep->reachable.back().first : 0;
      target = {CorruptStruct::Node, -1, leaf, "nitems"};
      act = {Damage::Set, 9999, 0, true};
    }
    if (!corrupt(*dev, target, act)) continue;
    const uint64_t damaged_gen = ch->info.generation.v;
    Run run;
    run.log.base = dev->clone();
    run.log.sector = 512;
    run.base_gen = damaged_gen;
    RecordingDevice rec(*dev);
    FsckOptions fo;
    fo.mode = FsckMode::Yes;
    fo.kinds = kinds();
    auto fixed = fsck_run(rec, fo);
    run.log.entries = rec.log();
    run.log.index();
    if (!fixed || fixed->exit_code != kFsckCorrected) {
      d.t.add_failure("FSCK", base_w.id + ": the repair itself did not succeed");
      continue;
    }
    const uint64_t repaired_gen = fixed->written->v;
    auto oracle = [&](const Spec& spec, bool) -> std::string {
      StateDevice sd(run.log, spec, 7);
      FsckOptions check;
      check.kinds = kinds();
      auto r = fsck_run(sd, check);
      if (!r) return "UNMOUNTABLE: " + r.error().message();
      const uint64_t g = r->checked.v;
      if (g == damaged_gen && r->exit_code == kFsckUncorrected) return "";
      if (g == repaired_gen && r->exit_code == kFsckClean) return "";
      return "FSCK_REPAIR_STATE: generation " + std::to_string(g) + " with fsck exit " +
             std::to_string(r->exit_code) + " is neither the damage nor the repair";
    };
    const uint64_t before = d.t.states;
    check_run(base_w, run, s, d.args.seed, d.t, "", d.args.verbose, oracle, false);
    d.per_suite["fsck-repair"] += d.t.states - before;
  }
}

// A crash during mkfs over an older plyfs filesystem: every state is the old
// filesystem, whole, or no filesystem, or the new empty one; never a mix.
void mkfs_suite(Driver& d, const Sampling& s) {
  Workload old_w;
  old_w.id = "mkfs/over-old";
  old_w.setup = ace_setup();
  Run old = record(old_w);
  auto dev = old.log.base->clone();
  const auto old_uuid = read_superblocks(*dev)->info.uuid;
  const Model old_model = old.model_at.at(old.base_gen);
  Run run;
  run.log.base = dev->clone();
  run.log.sector = 512;
  RecordingDevice rec(*dev);
  FormatOptions fo;
  fo.uuid = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
  if (!Volume::format(rec, fo)) {
    d.t.add_failure("MKFS", "mkfs failed");
    return;
  }
  run.log.entries = rec.log();
  run.log.index();
  auto oracle = [&](const Spec& spec, bool) -> std::string {
    StateDevice sd(run.log, spec, 3);
    VolumeOptions vo;
    vo.read_only = true;
    vo.kinds = kinds();
    auto vol = Volume::open(sd, vo);
    if (!vol) {
      if (vol.error().code == EINVAL) return "";  // no filesystem at all
      return "MKFS_STATE: " + vol.error().message();
    }
    const SuperInfo sb = (*vol)->super();
    auto got = dump(**vol);
    if (!got) return "MKFS_STATE: unreadable: " + got.error().message();
    vol->reset();
    if (auto err = fsck_after_crash(sd); !err.empty()) return "MKFS_STATE: " + err;
    // The wipe of both superblock slots may land in part: the old
    // filesystem then shows an older generation of its own (mkfs's empty
    // one), whole; never anything in between.
    if (sb.uuid == old_uuid)
      return *got == old_model || got->trees.empty() ? "" : "MKFS_STATE: the old filesystem changed";
    if (sb.uuid == fo.uuid) return got->trees.empty() ? "" : "MKFS_STATE: the new filesystem is not empty";
    return "MKFS_STATE: a filesystem that is neither old nor new";
  };
  const uint64_t before = d.t.states;
  check_run(old_w, run, s, d.args.seed, d.t, "", d.args.verbose, oracle, false);
  d.per_suite["mkfs"] += d.t.states - before;
}

// The fault modes of both fault suites: EIO once or from then on, a torn,
// short or ENOSPC write, a failed flush once or from then on, a failed read.
const FaultDevice::Rule kFaultModes[] = {
    {FaultDevice::Op::Write, 1, false, FaultDevice::Kind::Eio, 1},
    {FaultDevice::Op::Write, 1, true, FaultDevice::Kind::Eio, 1},
    {FaultDevice::Op::Write, 1, false, FaultDevice::Kind::Torn, 7},
    {FaultDevice::Op::Write, 1, false, FaultDevice::Kind::Short, 0},
    {FaultDevice::Op::Write, 1, false, FaultDevice::Kind::Enospc, 0},
    {FaultDevice::Op::Flush, 1, false, FaultDevice::Kind::Eio, 0},
    {FaultDevice::Op::Flush, 1, true, FaultDevice::Kind::Eio, 0},
    {FaultDevice::Op::Read, 1, false, FaultDevice::Kind::Eio, 0},
};

// SQLite-style fault loops: fail the k-th read, write or flush, once or from
// then on, or with ENOSPC or a short write, for k = 1, 2, ... until the run
// no longer meets the fault; every run's crash states go through the oracle.
void fault_suite(Driver& d, const std::vector<Workload>& ws, Sampling s) {
  s.faults = true;
  using F = FaultDevice;
  for (const Workload& w : ws)
    for (F::Rule m : kFaultModes)
      for (uint64_t k = 1; k < 64 && !d.spent(); k++) {
        m.nth = k;
        Workload fw = w;
        fw.id = w.id + "/fault-" + std::to_string(int(m.op)) + "-" + std::to_string(int(m.kind)) +
                (m.sticky ? "s" : "") + "-" + std::to_string(k);
        const uint64_t failed = d.t.failed;
        const bool fired = d.run(fw, s, "faults", &m, false);
        if (d.t.failed != failed) break;
        // The loop ends once the k-th matching call is beyond the workload.
        if (!fired) break;
      }
}

// The same fault loops over filesystem workloads (fs_fault_workloads): the
// k-th read, write or flush of the workload's operations and commits fails,
// k = 1..16, then sampled (k grows by an eighth) until the workload no longer
// reaches the k-th call or `deadline` (seconds from the start) passes.
void fs_fault_suite(Driver& d, Sampling s, double deadline) {
  s.faults = true;
  using F = FaultDevice;
  // Each workload gets an equal share of the time left, so that a long one
  // (a shrink's relocation writes much) cannot starve those after it.
  const std::vector<FsWorkload> ws = fs_fault_workloads();
  const double start = d.elapsed();
  double until = deadline;
  const auto over = [&] { return d.spent() || d.elapsed() > until; };
  for (size_t i = 0; i < ws.size(); i++) {
    const FsWorkload& w = ws[i];
    until = start + (deadline - start) * double(i + 1) / double(ws.size());
    for (F::Rule m : kFaultModes)
      for (uint64_t k = 1; k < 100000 && !over(); k += k < 16 ? 1 : k / 8) {
        m.nth = k;
        FsWorkload fw = w;
        char tag[96];
        std::snprintf(tag, sizeof tag, "/fault-%d-%d%s-%llu", int(m.op), int(m.kind), m.sticky ? "s" : "",
                      (unsigned long long)k);
        fw.id += tag;
        const uint64_t failed = d.t.failed;
        const bool fired = d.run_fs(fw, s, "fs-faults", &m);
        if (d.t.failed != failed) break;
        if (!fired) break;
      }
  }
}

int self_test(Driver& d) {
  // Each planted bug must be caught by something: a protocol checker or the
  // oracle on some crash state. A bug's run stops at the end of the first
  // workload that caught it: what is asked is that something catches it,
  // and checking every later workload too took 519 s of the CI run's
  // 600 s timeout on 2026-12-02 (all states of every workload, thirteen times).
  const std::pair<PlantedBug, const char*> bugs[] = {
      {PlantedBug::NoFlushBeforeSuper, "no flush before the superblock"},
      {PlantedBug::ReuseFreedBlock, "reuse of a block freed in the current generation"},
      {PlantedBug::TrustTornSuper, "acceptance of a torn superblock"},
      {PlantedBug::DiscardEarly, "discard of blocks freed by a generation not yet durable"},
  };
  Sampling s;
  int missed = 0, total = 0;
  auto report = [&](const std::string& name, const Totals& t) {
    total++;
    std::printf("planted bug: %-60s %s (%llu of %llu states failed; %s)\n", name.c_str(),
                t.failed ? "CAUGHT" : "MISSED", (unsigned long long)t.failed,
                (unsigned long long)t.states,
                t.failure_classes.empty() ? "-" : [&] {
                  std::string c;
                  for (const auto& x : t.failure_classes) c += (c.empty() ? "" : ", ") + x;
                  return c;
                }().c_str());
    if (!t.failed) missed++;
  };
  auto fs_runs = [&](const std::vector<FsWorkload>& ws, Totals& t) {
    for (const FsWorkload& w : ws) {
      if (t.failed) break;
      const FsRun fr = record_fs(w);
      if (!fr.run.error.empty()) t.add_failure("WORKLOAD", w.id + ": " + fr.run.error);
      Workload shell;
      shell.id = w.id;
      shell.bug = w.bug;
      FsOracleCache cache;
      check_run(shell, fr.run, s, d.args.seed, t, "", false,
                [&](const Spec& spec, bool wc) { return check_fs_state(w, fr, spec, wc, cache); });
    }
  };
  for (const auto& [bug, name] : bugs) {
    Totals t;
    std::vector<Workload> ws = ace(1, d.args.seed, 0);
    for (auto& extra : scenarios()) ws.push_back(extra);
    for (Workload w : ws) {
      if (t.failed) break;
      w.bug = bug;
      Run run = record(w);
      check_run(w, run, s, d.args.seed, t);
    }
    report(name, t);
    // The same bug on volumes of several devices.
    Totals mt;
    Sampling ms = s;
    ms.exhaustive_k = 6;
    for (Workload w : multidev_workloads()) {
      if (mt.failed) break;
      w.bug = bug;
      Run run = record(w);
      check_multi_run(w, run, ms, d.args.seed, mt);
    }
    report(std::string(name) + ", several devices", mt);
    // The same bug under the filesystem workloads (seq-1).
    Totals ft;
    std::vector<FsWorkload> fws = fs_ace(1, d.args.seed, 0);
    for (auto& w : fws) w.bug = bug;
    fs_runs(fws, ft);
    report(std::string(name) + ", filesystem seq-1", ft);
  }
  {
    // A filesystem operation that is not atomic: a rename made of a link, a
    // commit and an unlink (done by the workload driver, as a rename with a
    // commit in its middle would be). Some crash states recover the
    // generation in between, which shows both names.
    Totals t;
    std::vector<FsWorkload> ws;
    for (auto [from, to] : {std::pair<const char*, const char*>{"up", "up2"}, {"dir/y", "y2"}, {"a", "dir/a"}}) {
      FsWorkload w;
      w.id = std::string("fs-split-rename/") + from;
      w.image = "base";
      w.ops = {{FsOpKind::SplitRename, from, to}, {FsOpKind::Commit}};
      ws.push_back(w);
    }
    fs_runs(ws, t);
    report("a filesystem rename with a commit in its middle", t);
  }
  std::printf("%d passed, %d failed\n", total - missed, missed);
  return missed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Driver d;
  d.args = parse(argc, argv);
  std::printf("crash_tests: seed %llu (rerun with --seed %llu), budget %.0f s\n",
              (unsigned long long)d.args.seed, (unsigned long long)d.args.seed, d.args.budget_s);
  if (d.args.self_test) return self_test(d);

  Sampling full;                    // exhaustive tiers
  Sampling light = full;            // sampled tiers for long logs
  light.t1 = 0.25;
  light.t3 = 0.1;
  light.tears_per_write = 2;
  light.random_subsets = 4;
  light.write_checks = 1.0 / 32;
  // Several devices: the members' open writes together are enumerated whole
  // up to 8 (each member's subset on its own), so that the cuts between one
  // member's flush and the next stay cheap.
  Sampling multi = full;
  multi.exhaustive_k = 8;
  multi.tears_per_write = 3;
  multi.random_subsets = 6;

  const bool engine = d.args.fs_share < 1;
  if (engine) for (const Workload& w : ace(1, d.args.seed, 0)) d.run(w, full, "ace1");
  if (engine) for (const Workload& w : scenarios()) d.run(w, light, "scenarios");
  if (engine) for (const Workload& w : multidev_workloads()) d.run(w, multi, "multidev");
  if (d.args.only.empty() && engine) {
    fsck_repair_suite(d, full);
    mkfs_suite(d, full);
  }
  if (engine && (d.args.only.empty() || d.args.only.find("/fault-") != std::string::npos)) {
    std::vector<Workload> faulty = ace(1, d.args.seed, 0);
    faulty.resize(4);
    fault_suite(d, faulty, light);
  }
  // The filesystem suites' fixed part: seq-1 whole and the full devices.
  if (d.args.only.empty() || d.args.only.rfind("fs-", 0) == 0) {
    for (const FsWorkload& w : fs_ace(1, d.args.seed, 0)) d.run_fs(w, full, "fs-ace1");
    for (const FsWorkload& w : fs_scenarios()) d.run_fs(w, full, "fs-scenarios");
  }
  // The engine's share of the rest.
  for (const Workload& w : ace(2, d.args.seed, 0)) {
    if (d.engine_spent()) break;
    d.run(w, full, "ace2");
  }
  for (uint64_t i = 0; !d.engine_spent() && (d.args.only.empty() || d.args.only.rfind("random/", 0) == 0); i++) {
    const uint64_t seed = d.args.seed + i;
    if (!d.args.only.empty() && d.args.only.rfind("random/" + std::to_string(seed) + "/", 0) != 0) {
      if (i > 100000) break;
      continue;
    }
    d.run(random_workload(seed, 200), light, "random");
    if (i % 4 == 3 && !d.engine_spent())
      for (const Workload& w : ace(3, seed, 8)) d.run(w, full, "ace3");
  }
  // The filesystem suites' share: fault loops (up to a third of what is
  // left), sampled seq-2 and seq-3, long random workloads. Under --only, the
  // workload is regenerated from its id.
  if (d.args.only.empty() || d.args.only.rfind("fs-fault/", 0) == 0)
    fs_fault_suite(d, light, d.elapsed() + (d.args.budget_s - d.elapsed()) / 3);
  const bool fs_only = !d.args.only.empty();
  if (!fs_only || d.args.only.rfind("fs-ace2/", 0) == 0)
    for (const FsWorkload& w : fs_ace(2, d.args.seed, 150)) {
      if (d.spent()) break;
      d.run_fs(w, full, "fs-ace2");
    }
  for (uint64_t i = 0; !d.spent(); i++) {
    const uint64_t seed = d.args.seed + i;
    if (fs_only) {
      if (d.args.only.rfind("fs-random/" + std::to_string(seed) + "/", 0) == 0)
        d.run_fs(fs_random_workload(seed, 60), light, "fs-random");
      else if (d.args.only.rfind("fs-ace3/", 0) == 0)
        for (const FsWorkload& w : fs_ace(3, seed, 6)) d.run_fs(w, full, "fs-ace3");
      if (i > 2000 || d.t.states) break;
      continue;
    }
    d.run_fs(fs_random_workload(seed, 60), light, "fs-random");
    if (!d.spent())
      for (const FsWorkload& w : fs_ace(3, seed, 6)) d.run_fs(w, full, "fs-ace3");
  }

  std::printf("crash_tests: %llu states (T0 %llu / T1 %llu / T2 %llu / T3 %llu / T4 %llu) from "
              "%llu workloads, %llu logs through the protocol checkers, %llu failed, %.0f s\n",
              (unsigned long long)d.t.states, (unsigned long long)d.t.by_tier[0],
              (unsigned long long)d.t.by_tier[1], (unsigned long long)d.t.by_tier[2],
              (unsigned long long)d.t.by_tier[3], (unsigned long long)d.t.by_tier[4],
              (unsigned long long)d.t.workloads,
              (unsigned long long)d.t.logs_checked, (unsigned long long)d.t.failed, d.elapsed());
  for (const auto& [suite, n] : d.per_suite)
    std::printf("  %-12s %llu states\n", suite.c_str(), (unsigned long long)n);
  std::printf("  engine %llu states, filesystem %llu states (%llu operations and commits refused cleanly, "
              "%llu of them after an injected fault)\n",
              (unsigned long long)(d.t.states - d.fs_states), (unsigned long long)d.fs_states,
              (unsigned long long)d.refused_ops, (unsigned long long)d.fault_refusals);
  if (d.elapsed() > d.args.budget_s + 1)
    std::printf("  the floors kept the run going %.0f s past its %.0f s budget (cap %.0f s)\n",
                d.elapsed() - d.args.budget_s, d.args.budget_s, d.args.max_s);
  for (const auto& r : d.t.reproducers) std::printf("FAIL %s\n", r.c_str());
  if (!d.args.only.empty() && d.t.states == 0) {
    std::printf("FAIL: no crash state matches --only '%s'\n", d.args.only.c_str());
    d.t.failed++;
  }
  bool enough = d.t.states >= d.args.min_states;
  if (!enough)
    std::printf("FAIL: %llu states is below the required %llu\n", (unsigned long long)d.t.states,
                (unsigned long long)d.args.min_states);
  if (d.fs_states < d.args.min_fs_states) {
    enough = false;
    std::printf("FAIL: %llu filesystem states is below the required %llu\n",
                (unsigned long long)d.fs_states, (unsigned long long)d.args.min_fs_states);
  }
  const bool pass = d.t.failed == 0 && enough;
  std::printf("%d passed, %d failed\n", pass ? 1 : 0, pass ? 0 : 1);
  return pass ? 0 : 1;
}
