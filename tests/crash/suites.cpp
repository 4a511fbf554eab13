#include "suites.h"

#include <random>

namespace plyfs::crash {

namespace {

Op put(uint32_t tree, uint64_t key, uint64_t size = 40) { return Op{OpKind::Put, tree, key, size}; }
Op commit() { return Op{OpKind::Commit}; }

}  // namespace

// Slots: 0 plain (200 keys, two levels), 1 clone of 0 with changes, 2 data
// extents (20 values), 3 small plain (5 keys).
std::vector<Op> ace_setup() {
  std::vector<Op> s;
  s.push_back(Op{OpKind::Create, 0, 0, kKindPlain});
  for (uint64_t k = 0; k < 200; k++) s.push_back(put(0, k));
  s.push_back(Op{OpKind::Clone, 0});
  for (uint64_t k = 0; k < 200; k += 40) s.push_back(put(1, k, 30));
  s.push_back(Op{OpKind::Create, 0, 0, kKindExtents});
  for (uint64_t k = 0; k < 20; k++) s.push_back(Op{OpKind::PutExtent, 2, k, 1 + k % 3});
  s.push_back(Op{OpKind::Create, 0, 0, kKindPlain});
  for (uint64_t k = 0; k < 5; k++) s.push_back(put(3, k, 200));
  return s;
}

std::vector<Op> ace_instances() {
  return {
      put(0, 1000),                          // insert into a tree whose nodes a clone shares
      put(0, 50, 60),                        // replace: a shared leaf is copied (lazy refcounts)
      Op{OpKind::Erase, 0, 51},              // erase from the shared side
      Op{OpKind::Erase, 1, 52},              // erase from the clone
      put(3, 2, 900),                        // a large value: the leaf splits
      Op{OpKind::Erase, 3, 0},               // a small leaf shrinks
      Op{OpKind::Create, 0, 0, kKindPlain},  // a new, empty tree
      Op{OpKind::Clone, 0},                  // clone a tree that is already shared
      Op{OpKind::Drop, 1},                   // drop a clone: only its own nodes go
      Op{OpKind::Drop, 3},                   // drop an unshared tree
      Op{OpKind::PutExtent, 2, 100, 3},      // a new data extent
      Op{OpKind::PutExtent, 2, 5, 2},        // replace a value: the old extent is freed
      Op{OpKind::Erase, 2, 6},               // erase a value: its extent is freed
      put(1, 199, 900),                      // grow the clone
  };
}

std::vector<Workload> ace(size_t length, uint64_t seed, size_t sample) {
  const auto inst = ace_instances();
  const size_t n = inst.size();
  std::vector<Workload> out;
  auto make = [&](const std::vector<size_t>& ops, const std::vector<bool>& persist) {
    Workload w;
    w.id = "ace" + std::to_string(length) + "/";
    for (size_t i = 0; i < ops.size(); i++) {
      if (i) w.id += '.';
      w.id += std::to_string(ops[i]);
      if (persist[i]) w.id += 'c';
      w.ops.push_back(inst[ops[i]]);
      if (persist[i]) w.ops.push_back(commit());
    }
    w.setup = ace_setup();
    out.push_back(std::move(w));
  };
  // Dependencies: an operation on a dropped slot is skipped by the generator.
  auto legal = [&](const std::vector<size_t>& ops) {
    std::vector<bool> dropped(8, false);
    for (size_t i : ops) {
      const Op& op = inst[i];
      if (op.kind == OpKind::Drop) {
        if (dropped[op.tree]) return false;
        dropped[op.tree] = true;
      } else if (op.kind != OpKind::Create && dropped[op.tree]) {
        return false;
      }
    }
    return true;
  };
  if (length == 1) {
    for (size_t a = 0; a < n; a++) make({a}, {true});
  } else if (length == 2) {
    for (size_t a = 0; a < n; a++)
      for (size_t b = 0; b < n; b++)
        for (bool p : {false, true})
          if (legal({a, b})) make({a, b}, {p, true});
  } else {
    std::mt19937_64 rng(seed);
    while (out.size() < sample) {
      std::vector<size_t> ops(length);
      std::vector<bool> persist(length);
      for (size_t i = 0; i < length; i++) ops[i] = rng() % n, persist[i] = rng() & 1;
      persist.back() = true;
      if (legal(ops)) make(ops, persist);
    }
  }
  return out;
}

std::vector<Workload> scenarios() {
  std::vector<Workload> out;
  {  // Many generations: slots alternate, fallback reaches exactly g - 1.
    Workload w;
    w.id = "scenario/many-generations";
    w.setup = {Op{OpKind::Create, 0, 0, kKindPlain}};
    for (uint64_t g = 0; g < 20; g++) w.ops.push_back(put(0, g)), w.ops.push_back(commit());
    out.push_back(w);
  }
  {  // Splits and merges across levels inside one commit.
    Workload w;
    w.id = "scenario/split-merge";
    w.setup = {Op{OpKind::Create, 0, 0, kKindPlain}};
    for (uint64_t k = 0; k < 1500; k++) w.ops.push_back(put(0, k * 7 % 1500, 60));
    w.ops.push_back(commit());
    for (uint64_t k = 0; k < 1500; k += 2) w.ops.push_back(Op{OpKind::Erase, 0, k});
    for (uint64_t k = 1; k < 1500; k += 4) w.ops.push_back(Op{OpKind::Erase, 0, k});
    w.ops.push_back(commit());
    out.push_back(w);
  }
  {  // Drop a large tree that shares most of its nodes with a clone.
    Workload w;
    w.id = "scenario/drop-shared";
    w.setup = {Op{OpKind::Create, 0, 0, kKindPlain}};
    for (uint64_t k = 0; k < 2000; k++) w.setup.push_back(put(0, k, 50));
    w.setup.push_back(Op{OpKind::Clone, 0});
    for (uint64_t k = 0; k < 2000; k += 100) w.ops.push_back(put(1, k, 70));
    w.ops.push_back(commit());
    w.ops.push_back(Op{OpKind::Drop, 0});
    w.ops.push_back(commit());
    w.ops.push_back(Op{OpKind::Drop, 1});
    w.ops.push_back(commit());
    out.push_back(w);
  }
  {  // Near a full device: fill, delete, commit, write again.
    Workload w;
    w.id = "scenario/near-full";
    w.image_bytes = 3ull << 20;
    w.setup = {Op{OpKind::Create, 0, 0, kKindPlain}, Op{OpKind::Fill, 0, 0}};
    for (uint64_t k = 0; k < 60; k++) w.ops.push_back(Op{OpKind::Erase, 0, k});
    w.ops.push_back(commit());
    for (uint64_t k = 0; k < 30; k++) w.ops.push_back(put(0, 5000 + k, 900));
    w.ops.push_back(commit());
    out.push_back(w);
  }
  {  // Data extents shared by clones, then freed from every side.
    Workload w;
    w.id = "scenario/extents";
    w.setup = {Op{OpKind::Create, 0, 0, kKindExtents}};
    for (uint64_t k = 0; k < 300; k++) w.setup.push_back(Op{OpKind::PutExtent, 0, k, 1 + k % 4});
    w.ops.push_back(Op{OpKind::Clone, 0});
    for (uint64_t k = 0; k < 300; k += 3) w.ops.push_back(Op{OpKind::PutExtent, 1, k, 2});
    w.ops.push_back(commit());
    for (uint64_t k = 1; k < 300; k += 3) w.ops.push_back(Op{OpKind::Erase, 0, k});
    w.ops.push_back(Op{OpKind::Drop, 1});
    w.ops.push_back(commit());
    out.push_back(w);
  }
  {  // A full filesystem grows into the rest of its device (plyctl resize
     // max after the image file grew), then fills the new space.
    Workload w;
    w.id = "scenario/grow";
    w.format_bytes = 3ull << 20;
    w.setup = {Op{OpKind::Create, 0, 0, kKindPlain}, Op{OpKind::Fill, 0, 0}};
    w.ops.push_back(Op{OpKind::Grow});
    for (uint64_t k = 0; k < 200; k++) w.ops.push_back(put(0, 9000 + k, 900));
    w.ops.push_back(commit());
    for (uint64_t k = 0; k < 60; k++) w.ops.push_back(Op{OpKind::Erase, 0, k});
    w.ops.push_back(commit());
    out.push_back(w);
  }
  {  // A filesystem shrinks to half its size (plyctl resize SIZE): the
     // extents and nodes past the new end, some shared by a clone, move
     // below it over several generations, then the end moves; work goes on.
    Workload w;
    w.id = "scenario/shrink";
    w.setup = {Op{OpKind::Create, 0, 0, kKindPlain}, Op{OpKind::Create, 0, 0, kKindExtents}};
    for (uint64_t k = 0; k < 300; k++) w.setup.push_back(put(0, k, 900));
    for (uint64_t k = 0; k < 120; k++) w.setup.push_back(Op{OpKind::PutExtent, 1, k, 1 + k % 5});
    w.setup.push_back(Op{OpKind::Clone, 1});                           // slot 2
    w.setup.push_back(Op{OpKind::Create, 0, 0, kKindExtents});         // slot 3, dropped below
    for (uint64_t k = 0; k < 150; k++) w.setup.push_back(Op{OpKind::PutExtent, 3, k, 4});
    // Past 5 MiB: extents written last, then shared with a clone.
    for (uint64_t k = 2000; k < 2100; k++) w.setup.push_back(Op{OpKind::PutExtent, 2, k, 4});
    w.setup.push_back(Op{OpKind::Clone, 2});                           // slot 4
    w.setup.push_back(Op{OpKind::Drop, 3});
    for (uint64_t k = 2000; k < 2100; k += 3) w.setup.push_back(Op{OpKind::Erase, 4, k});
    for (uint64_t k = 0; k < 120; k += 2) w.setup.push_back(Op{OpKind::Erase, 1, k});
    for (uint64_t k = 0; k < 300; k += 3) w.setup.push_back(Op{OpKind::Erase, 0, k});
    w.ops.push_back(Op{OpKind::Shrink, 0, 0, 5ull << 20});
    for (uint64_t k = 0; k < 30; k++) w.ops.push_back(Op{OpKind::PutExtent, 1, 1000 + k, 2});
    w.ops.push_back(commit());
    for (uint64_t k = 3; k < 120; k += 4) w.ops.push_back(Op{OpKind::Erase, 2, k});
    for (uint64_t k = 2000; k < 2100; k += 2) w.ops.push_back(Op{OpKind::Erase, 2, k});
    w.ops.push_back(commit());
    out.push_back(w);
  }
  // The same freeing scenarios with discard on (A6, P7): what each
  // generation frees is discarded once it is durable, and the crash
  // states read discarded blocks as zeros.
  for (size_t i = 0, n = out.size(); i < n; i++) {
    if (out[i].id == "scenario/many-generations" || out[i].id == "scenario/split-merge") continue;
    Workload w = out[i];
    w.id = "scenario/discard-" + w.id.substr(9);
    w.discard = true;
    out.push_back(std::move(w));
  }
  return out;
}

std::vector<Workload> multidev_workloads() {
  using D = Workload::Device;
  std::vector<Workload> out;
  {  // Two devices: the ACE setup's trees, then changes on every side.
    Workload w;
    w.id = "multidev/two";
    w.classes = {"fast", "slow"};
    w.devices = {D{4ull << 20, 0}, D{8ull << 20, 1}};
    w.setup = ace_setup();
    w.ops = {put(0, 1000), Op{OpKind::Erase, 1, 52}, commit(),
             Op{OpKind::PutExtent, 2, 100, 3}, Op{OpKind::Erase, 2, 6}, put(3, 2, 900), commit(),
             Op{OpKind::Clone, 0}, put(4, 7, 60), Op{OpKind::Drop, 1}, commit(),
             Op{OpKind::Erase, 4, 8}, put(0, 1001), Op{OpKind::PutExtent, 2, 5, 2}, commit(),
             Op{OpKind::Drop, 3}, Op{OpKind::Create, 0, 0, kKindPlain}, put(5, 1, 300), commit()};
    out.push_back(w);
  }
  {  // Three devices, one fast and two slow, with discard on (A6).
    Workload w;
    w.id = "multidev/three";
    w.classes = {"fast", "slow"};
    w.devices = {D{4ull << 20, 0}, D{6ull << 20, 1}, D{6ull << 20, 1}};
    w.discard = true;
    w.setup = ace_setup();
    w.ops = {put(0, 50, 60), Op{OpKind::Create, 0, 0, kKindPlain}, put(4, 1), commit(),
             Op{OpKind::PutExtent, 2, 5, 2}, Op{OpKind::Drop, 3}, commit(),
             Op{OpKind::Erase, 0, 51}, put(1, 199, 900), commit()};
    out.push_back(w);
  }
  {  // The metadata device holds 80 blocks: the nodes spill onto the others
     // (format.md#placement), so one generation's nodes lie on every device.
    Workload w;
    w.id = "multidev/tiny-meta";
    w.classes = {"fast", "slow"};
    w.devices = {D{512ull << 10, 0}, D{4ull << 20, 1}, D{4ull << 20, 1}};
    w.setup = {Op{OpKind::Create, 0, 0, kKindPlain}};
    for (uint64_t k = 0; k < 300; k++) w.setup.push_back(put(0, k, 900));
    for (uint64_t k = 0; k < 300; k += 37) w.ops.push_back(put(0, k, 800));
    w.ops.push_back(commit());
    w.ops.push_back(Op{OpKind::Clone, 0});
    for (uint64_t k = 5; k < 300; k += 53) w.ops.push_back(Op{OpKind::Erase, 0, k});
    w.ops.push_back(commit());
    for (uint64_t k = 11; k < 300; k += 41) w.ops.push_back(put(1, k, 700));
    w.ops.push_back(Op{OpKind::Drop, 0});
    w.ops.push_back(commit());
    out.push_back(w);
  }
  {  // Data extents from the slowest class, shared by a clone, freed from
     // both sides.
    Workload w;
    w.id = "multidev/extents";
    w.classes = {"fast", "mid", "slow"};
    w.devices = {D{4ull << 20, 0}, D{4ull << 20, 1}, D{6ull << 20, 2}};
    w.setup = {Op{OpKind::Create, 0, 0, kKindExtents}};
    for (uint64_t k = 0; k < 60; k++) w.setup.push_back(Op{OpKind::PutExtent, 0, k, 1 + k % 4});
    w.ops.push_back(Op{OpKind::Clone, 0});
    for (uint64_t k = 0; k < 60; k += 7) w.ops.push_back(Op{OpKind::PutExtent, 1, k, 2});
    w.ops.push_back(commit());
    for (uint64_t k = 1; k < 60; k += 9) w.ops.push_back(Op{OpKind::Erase, 0, k});
    w.ops.push_back(Op{OpKind::PutExtent, 0, 500, 8});
    w.ops.push_back(commit());
    out.push_back(w);
  }
  {  // Many small generations: the slots alternate on every device.
    Workload w;
    w.id = "multidev/many-generations";
    w.classes = {"fast", "slow"};
    w.devices = {D{4ull << 20, 0}, D{4ull << 20, 1}};
    w.setup = {Op{OpKind::Create, 0, 0, kKindPlain}};
    for (uint64_t g = 0; g < 12; g++) w.ops.push_back(put(0, g)), w.ops.push_back(commit());
    out.push_back(w);
  }
  {  // A fixed random history (random_workload's) on a small metadata device
     // and two slow ones: puts, erases, clones, drops, creates, extents.
    Workload w = random_workload(7, 120);
    w.id = "multidev/random";
    w.classes = {"fast", "slow"};
    w.devices = {D{1ull << 20, 0}, D{4ull << 20, 1}, D{4ull << 20, 1}};
    out.push_back(w);
  }
  return out;
}

Workload random_workload(uint64_t seed, size_t nops) {
  std::mt19937_64 rng(seed);
  Workload w;
  w.id = "random/" + std::to_string(seed);
  w.discard = seed % 2;  // every other seed with discard on (A6)
  w.setup = ace_setup();
  std::vector<uint32_t> live = {0, 1, 2, 3};  // slots that exist
  uint32_t next_slot = 4;
  size_t since_commit = 0, commit_every = 1 + rng() % 20;
  for (size_t i = 0; i < nops; i++) {
    const uint32_t t = live[rng() % live.size()];
    const uint32_t r = rng() % 100;
    // Slot 2 holds the extents kind; the others are plain.
    if (t == 2 && r < 60) w.ops.push_back(Op{OpKind::PutExtent, 2, rng() % 400, 1 + rng() % 4});
    else if (r < 55) w.ops.push_back(put(t, rng() % 3000, rng() % 4 ? 40 : 600));
    else if (r < 85) w.ops.push_back(Op{OpKind::Erase, t, rng() % 3000});
    else if (r < 90 && live.size() < 10) {
      w.ops.push_back(Op{OpKind::Clone, t == 2 ? 0u : t});
      live.push_back(next_slot++);
    } else if (r < 93 && live.size() > 4 && t >= 4) {
      w.ops.push_back(Op{OpKind::Drop, t});
      live.erase(std::find(live.begin(), live.end(), t));
    } else if (r < 95) {
      w.ops.push_back(Op{OpKind::Create, 0, 0, kKindPlain});
      live.push_back(next_slot++);
    }
    if (++since_commit >= commit_every) {
      w.ops.push_back(commit());
      since_commit = 0;
      commit_every = 1 + rng() % 20;
    }
  }
  w.ops.push_back(commit());
  return w;
}

}  // namespace plyfs::crash
