#include "multidev.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "commit/devices.h"
#include "commit/disk_superblock.h"

namespace plyfs::crash {

std::vector<Violation> check_multi_protocol(const Run& run) {
  const MultiLog& ml = run.multi;
  std::vector<Violation> out;
  auto bad = [&](const char* check, size_t pos, std::string what) {
    out.push_back(Violation{check, pos, std::move(what)});
  };
  const size_t n = ml.entries.size();
  std::vector<uint64_t> super_gen(n, 0);  // global position -> the generation of a superblock write
  for (size_t d = 0; d < ml.members.size(); d++)
    for (const auto& s : ml.members[d].supers) super_gen[ml.global_of[d][s.pos]] = s.gen;

  // M1 on each member alone (P1) and M2 (P2).
  for (size_t d = 0; d < ml.members.size(); d++) {
    const Log& log = ml.members[d];
    uint64_t last = run.base_gen;
    for (const auto& s : log.supers) {
      const size_t g = ml.global_of[d][s.pos];
      const std::string of = "device " + std::to_string(d) + ": the superblock of generation " + std::to_string(s.gen);
      if (s.pos == 0 || log.entries[s.pos - 1].kind != Kind::Flush) bad("M1", g, of + " is not preceded by a flush");
      if (s.pos + 1 < log.entries.size() && log.entries[s.pos + 1].kind != Kind::Flush &&
          log.entries[s.pos + 1].kind != Kind::FlushFailed)
        bad("M1", g, of + " shares its epoch with a later write");
      if (static_cast<uint64_t>(s.slot) != s.gen % 2) bad("M2", g, of + " went to slot " + std::to_string(s.slot));
      if (s.gen != last + 1) bad("M2", g, of + " follows generation " + std::to_string(last));
      last = s.gen;
    }
  }

  // M1 across the members: every node write of generation G (the writes
  // before G's first superblock write and after G-1's last) is covered by a
  // successful flush of its own member before any member gets G's superblock.
  std::map<uint64_t, size_t> ready;  // generation -> global position its nodes are all flushed by
  uint64_t next_gen = 0;             // the generation of the next superblock write
  for (size_t i = n; i-- > 0;) {
    if (super_gen[i]) {
      next_gen = super_gen[i];
      continue;
    }
    if (ml.dev[i] < 0 || ml.entries[i].kind != Kind::Write || !next_gen) continue;
    if (ml.entries[i].offset < disk::kReservedBytes) continue;  // labels and mkfs's wipes
    const size_t d = size_t(ml.dev[i]);
    const Log& log = ml.members[d];
    auto f = std::upper_bound(log.flushes.begin(), log.flushes.end(), ml.local[i]);
    const size_t at = f == log.flushes.end() ? n : ml.global_of[d][*f];
    ready[next_gen] = std::max(ready[next_gen], at);
  }
  for (size_t i = 0; i < n; i++)
    if (super_gen[i] && ready.count(super_gen[i]) && ready[super_gen[i]] > i)
      bad("M1", i, "device " + std::to_string(ml.dev[i]) + " got the superblock of generation " +
                       std::to_string(super_gen[i]) + " before the generation's node writes on " +
                       "every device were flushed");

  // M5: an acknowledged commit's superblock was flushed on every member.
  for (size_t i = 0; i < n; i++) {
    const Entry& e = ml.entries[i];
    if (e.kind != Kind::Mark || e.label != "ack" || e.arg <= run.base_gen) continue;
    for (size_t d = 0; d < ml.members.size(); d++) {
      const Log& log = ml.members[d];
      bool durable = false;
      for (const auto& s : log.supers) {
        if (s.gen != e.arg || ml.global_of[d][s.pos] > i) continue;
        auto f = std::upper_bound(log.flushes.begin(), log.flushes.end(), s.pos);
        durable = durable || (f != log.flushes.end() && ml.global_of[d][*f] < i);
      }
      if (!durable)
        bad("M5", i, "generation " + std::to_string(e.arg) + " was acknowledged before device " +
                         std::to_string(d) + " flushed its superblock");
    }
  }
  return out;
}

std::string check_multi_state(const Run& run, const MultiSpec& spec, bool write_check, PlantedBug bug) {
  const MultiLog& ml = run.multi;
  const uint64_t seed = std::hash<std::string>{}(spec.id());
  std::vector<std::unique_ptr<StateDevice>> devs;
  std::vector<BlockDevice*> ptrs;
  bool unreadable = false;
  for (size_t d = 0; d < ml.members.size(); d++) {
    devs.push_back(std::make_unique<StateDevice>(ml.members[d], spec.members[d],
                                                 seed ^ ((d + 1) * 0x9e3779b97f4a7c15ull)));
    ptrs.push_back(devs.back().get());
    unreadable = unreadable || (spec.members[d].tear && spec.members[d].lost == Lost::Unreadable);
  }
  auto set = assemble(ptrs, ml.member_bytes);
  if (!set) return "UNMOUNTABLE: the members do not assemble: " + set.error().message();
  auto writes = [&] {
    uint64_t w = 0;
    for (const auto& d : devs) w += d->overlay_writes();
    return w;
  };
  return check_image(run, **set, ml.gen_lo(spec.cut, run.base_gen), ml.gen_hi(spec.cut, run.base_gen),
                     unreadable, writes, write_check, bug);
}

void check_multi_run(const Workload& w, const Run& run, const Sampling& s, uint64_t seed, Totals& t,
                     const std::string& only, bool verbose) {
  const MultiLog& ml = run.multi;
  const size_t nd = ml.members.size();
  t.workloads++;
  std::mt19937_64 rng(seed);
  auto chance = [&](double p) { return p >= 1.0 || std::uniform_real_distribution<>(0, 1)(rng) < p; };
  if (only.empty()) {
    t.logs_checked++;
    for (const auto& v : check_multi_protocol(run)) {
      t.violations++;
      t.add_failure("PROTOCOL " + v.check, w.id + " " + v.check + " at global log entry " +
                                                std::to_string(v.pos) + ": " + v.what);
    }
  }

  using Kept = std::vector<std::vector<size_t>>;  // per member: local write positions kept
  std::unordered_set<std::string> seen;
  auto state = [&](size_t cut, const Kept& kept, const char* tier, int tier_no,
                   const std::vector<std::optional<std::vector<bool>>>& tears = {}, Lost lost = Lost::Old) {
    MultiSpec spec;
    spec.cut = cut;
    spec.tier = tier;
    for (size_t d = 0; d < nd; d++) {
      Spec m{ml.local_cut(d, cut), kept[d], std::nullopt, Lost::Old, tier};
      if (d < tears.size() && tears[d] && !kept[d].empty()) m.tear = tears[d], m.lost = lost;
      spec.members.push_back(std::move(m));
    }
    const std::string id = spec.id();
    if (!seen.insert(id).second) return;
    if (!only.empty() && id != only) return;
    t.states++;
    t.by_tier[tier_no]++;
    const bool wc = chance(s.write_checks) || !only.empty();
    const std::string err = check_multi_state(run, spec, wc, w.bug);
    if (verbose || !only.empty()) std::printf("  %s %s\n", id.c_str(), err.empty() ? "ok" : err.c_str());
    if (!err.empty())
      t.add_failure(err.substr(0, err.find_first_of(": ")), "crash_tests --only '" + w.id + "/" + id + "'   # " + err);
  };
  // Member d's open writes at `cut`: those since its own last successful flush.
  auto open_at = [&](size_t cut) {
    Kept open(nd);
    for (size_t d = 0; d < nd; d++) {
      const Log& log = ml.members[d];
      const size_t lc = ml.local_cut(d, cut);
      const long f = log.last_flush_before(lc);
      for (size_t p : log.writes)
        if (long(p) > f && p < lc) open[d].push_back(p);
    }
    return open;
  };
  auto is_super = [&](size_t d, size_t pos) {
    for (const auto& sw : ml.members[d].supers)
      if (sw.pos == pos) return true;
    return false;
  };
  auto mask_of = [&](size_t sectors, size_t k) {
    std::vector<bool> mask(sectors);
    if (k == 0) for (size_t j = 0; j < sectors / 2; j++) mask[j] = true;       // first half new
    else if (k == 1) for (size_t j = 0; j + 1 < sectors; j++) mask[j] = true;  // all but the last
    else for (auto&& b : mask) b = rng() & 1;                                   // any mix
    if (std::all_of(mask.begin(), mask.end(), [](bool b) { return b; })) mask[0] = false;
    return mask;
  };

  const Kept none(nd);
  state(0, none, "T0", 0);
  for (size_t i = 0; i < ml.entries.size(); i++) {
    const int d = ml.dev[i];
    if (d < 0) continue;
    const Kind k = ml.entries[i].kind;
    // T0: right after a member's flush, nothing open kept anywhere.
    if (k == Kind::Flush) state(i + 1, none, "T0", 0);
    if (k != Kind::Write && k != Kind::WriteFailed) continue;
    // T1: right after the write, every member keeping all it has open.
    const Kept open = open_at(i + 1);
    if (chance(s.t1)) state(i + 1, open, "T1", 1);
    if (!chance(s.t3)) continue;
    // T3: the write just made torn; and when every member's last open write
    // is the superblock just sent to all, every copy torn alike.
    const size_t sectors = ml.entries[i].length / ml.members[size_t(d)].sector;
    if (sectors < 2) continue;
    bool all_super = true;
    for (size_t m = 0; m < nd && all_super; m++) all_super = !open[m].empty() && is_super(m, open[m].back());
    for (size_t v = 0; v < s.tears_per_write; v++) {
      const auto mask = mask_of(sectors, v);
      const Lost lost = static_cast<Lost>(v % 3);
      std::vector<std::optional<std::vector<bool>>> tears(nd);
      tears[size_t(d)] = mask;
      state(i + 1, open, "T3", 3, tears, lost);
      if (all_super) {
        for (auto& tr : tears) tr = mask;
        state(i + 1, open, "T3", 3, tears, lost);
      }
    }
  }

  // T2: before every member's flush and at the end, subsets of the open
  // writes, each member's chosen on its own.
  std::vector<size_t> cuts;
  for (size_t i = 0; i < ml.entries.size(); i++)
    if (ml.dev[i] >= 0 && (ml.entries[i].kind == Kind::Flush || ml.entries[i].kind == Kind::FlushFailed))
      cuts.push_back(i);
  cuts.push_back(ml.entries.size());
  for (size_t cut : cuts) {
    const Kept open = open_at(cut);
    std::vector<std::pair<size_t, size_t>> all;  // member, local position
    for (size_t d = 0; d < nd; d++)
      for (size_t p : open[d]) all.emplace_back(d, p);
    const size_t n = all.size();
    if (n == 0) continue;
    if (n <= s.exhaustive_k) {
      for (uint64_t m = 0; m + 1 < (1ull << n); m++) {
        Kept kept(nd);
        for (size_t j = 0; j < n; j++)
          if ((m >> j) & 1) kept[all[j].first].push_back(all[j].second);
        state(cut, kept, "T2", 2);
      }
      continue;
    }
    for (size_t d = 0; d < nd; d++) {
      if (open[d].empty()) continue;
      auto with = [&](std::vector<size_t> mine) {  // member d keeps `mine`, the others all
        Kept kept = open;
        kept[d] = std::move(mine);
        state(cut, kept, "T2", 2);
      };
      with({});
      Kept only_d(nd);
      only_d[d] = open[d];
      state(cut, only_d, "T2", 2);
      // Drop one, keep one: every write of a short open set, 12 of a long one.
      std::vector<size_t> picks(open[d].size());
      for (size_t j = 0; j < picks.size(); j++) picks[j] = j;
      std::shuffle(picks.begin(), picks.end(), rng);
      if (picks.size() > 12) picks.resize(12);
      for (size_t j : picks) {
        std::vector<size_t> drop = open[d];
        drop.erase(drop.begin() + long(j));
        with(drop);
        with({open[d][j]});
      }
      for (int c = 0; c < kClasses; c++) {
        std::vector<size_t> of_c, but_c;
        for (size_t p : open[d]) (block_class(ml.members[d], p) == c ? of_c : but_c).push_back(p);
        if (of_c.empty()) continue;
        with(of_c);
        with(but_c);
      }
    }
    for (size_t r = 0; r < s.random_subsets; r++) {
      Kept kept(nd);
      for (size_t d = 0; d < nd; d++)
        for (size_t p : open[d])
          if (rng() & 1) kept[d].push_back(p);
      state(cut, kept, "T2", 2);
    }
  }
}

}  // namespace plyfs::crash

namespace plyfs::crash {

std::string check_multi_placement(const Workload& w, const Run& run) {
  const MultiLog& ml = run.multi;
  const auto layout = plan_devices(ml.member_bytes, 4096);
  // Data from the slowest class (format.md#placement): the workloads leave
  // it room, so every extent of every generation lies on a device of it.
  const uint8_t slowest = static_cast<uint8_t>(w.classes.size() - 1);
  for (const auto& [gen, model] : run.model_at)
    for (const auto& [id, items] : model.trees) {
      auto k = model.kind.find(id);
      if (k == model.kind.end() || k->second != kKindExtents) continue;
      for (const auto& [key, v] : items) {
        uint64_t start;
        std::memcpy(&start, v.data(), 8);
        size_t d = 0;
        while (d + 1 < layout.size() && start >= layout[d + 1].first) d++;
        if (w.devices[d].class_id != slowest)
          return "generation " + std::to_string(gen) + ": the extent at block " + std::to_string(start) +
                 " lies on device " + std::to_string(d) + ", not on the slowest class";
      }
    }
  // Nodes spill from a full metadata device onto the others: some recorded
  // node write must land on a device of another class.
  if (w.id.ends_with("/tiny-meta")) {
    size_t spilled = 0;
    for (size_t d = 0; d < ml.members.size(); d++) {
      if (w.devices[d].class_id == 0) continue;
      for (size_t p : ml.members[d].writes) spilled += block_class(ml.members[d], p) >= 1 &&
                                                      block_class(ml.members[d], p) <= 4;
    }
    if (!spilled) return "no node of the recorded generations spilled off the metadata device";
  }
  return "";
}

}  // namespace plyfs::crash
