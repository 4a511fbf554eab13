#include "workload.h"

#include <cstring>

#include "fs/disk_fs.h"
#include "fs/fs.h"

namespace plyfs::crash {

namespace {

void extent_refs(Key, std::span<const std::byte> v, std::vector<ExtentRef>& out) {
  if (v.size() < 16) return;
  uint64_t start, len;
  std::memcpy(&start, v.data(), 8);
  std::memcpy(&len, v.data() + 8, 8);
  out.push_back(ExtentRef{BlockNo{start}, len});
}

bool extent_move(Key, std::span<std::byte> v, const std::function<std::optional<BlockNo>(BlockNo)>& moved) {
  if (v.size() < 16) return false;
  uint64_t start;
  std::memcpy(&start, v.data(), 8);
  const auto to = moved(BlockNo{start});
  if (!to) return false;
  std::memcpy(v.data(), &to->v, 8);
  return true;
}

// A value that names where it came from (ztest's payload rule).
std::vector<std::byte> payload(size_t op_index, uint64_t gen, uint64_t size) {
  std::vector<std::byte> v(std::max<uint64_t>(size, 16));
  std::memcpy(v.data(), &op_index, 8);
  std::memcpy(v.data() + 8, &gen, 8);
  for (size_t i = 16; i < v.size(); i++) v[i] = static_cast<std::byte>(op_index * 31 + i);
  return v;
}

// Executes one operation on the volume and the model. Returns false when
// the volume refused it in an allowed way (ENOSPC); an unexpected error sets
// `error`.
struct Executor {
  Volume& vol;
  Model& model;
  std::vector<uint64_t>& slots;  // tree slot -> id
  std::string& error;
  int& error_code;

  bool fail(const std::string& what, const Error& e) {
    if (error.empty()) error = what + ": " + e.message(), error_code = e.code;
    return false;
  }

  bool run(size_t index, const Op& op) {
    if (op.kind == OpKind::Commit) return true;  // the caller commits
    if (op.kind == OpKind::Fill) return fill(index, op);
    if (op.kind == OpKind::Grow) {
      auto g = vol.resize(std::nullopt);
      return g ? true : fail(op.str(), g.error());
    }
    if (op.kind == OpKind::Shrink) return shrink(op);
    const bool deletes = op.kind == OpKind::Erase || op.kind == OpKind::Drop;
    auto txn = vol.begin(Volume::TxnOptions{deletes, 0});
    if (!txn) return fail("begin", txn.error());
    const uint64_t gen = txn->gen().v;
    auto tree = [&](uint32_t slot) { return TreeId{slots.at(slot)}; };
    switch (op.kind) {
      case OpKind::Put: {
        auto v = payload(index, gen, op.arg);
        auto r = txn->put(tree(op.tree), Key{op.key, 0}, v);
        if (!r) return r.error().code == ENOSPC ? false : fail(op.str(), r.error());
        model.trees[slots[op.tree]][Key{op.key, 0}] = v;
        return true;
      }
      case OpKind::PutExtent: {
        auto e = txn->alloc_extent(op.arg);
        if (!e) return e.error().code == ENOSPC ? false : fail(op.str(), e.error());
        std::vector<std::byte> v(16);
        std::memcpy(v.data(), &e->v, 8);
        std::memcpy(v.data() + 8, &op.arg, 8);
        auto& items = model.trees[slots[op.tree]];
        auto old = items.find(Key{op.key, 0});
        auto r = txn->put(tree(op.tree), Key{op.key, 0}, v);
        if (!r) return fail(op.str(), r.error());
        if (old != items.end()) {
          BlockNo prev;
          std::memcpy(&prev.v, old->second.data(), 8);
          auto d = txn->dec_extent(prev);
          if (!d) return fail(op.str(), d.error());
        }
        items[Key{op.key, 0}] = v;
        return true;
      }
      case OpKind::Erase: {
        auto& items = model.trees[slots[op.tree]];
        auto old = items.find(Key{op.key, 0});
        auto r = txn->erase(tree(op.tree), Key{op.key, 0});
        if (!r) return r.error().code == ENOSPC ? false : fail(op.str(), r.error());
        if (*r != (old != items.end())) return fail(op.str(), Error::invalid("erase disagrees with the model"));
        if (old != items.end()) {
          if (model.kind[slots[op.tree]] == kKindExtents) {
            BlockNo prev;
            std::memcpy(&prev.v, old->second.data(), 8);
            auto d = txn->dec_extent(prev);
            if (!d) return fail(op.str(), d.error());
          }
          items.erase(old);
        }
        return true;
      }
      case OpKind::Create: {
        auto t = txn->create_tree(static_cast<uint8_t>(op.arg));
        if (!t) return t.error().code == ENOSPC ? false : fail(op.str(), t.error());
        slots.push_back(t->v);
        model.trees[t->v];
        model.kind[t->v] = static_cast<uint8_t>(op.arg);
        return true;
      }
      case OpKind::Clone: {
        auto t = txn->clone_tree(tree(op.tree));
        if (!t) return fail(op.str(), t.error());
        slots.push_back(t->v);
        model.trees[t->v] = model.trees[slots[op.tree]];
        model.kind[t->v] = model.kind[slots[op.tree]];
        return true;
      }
      case OpKind::Drop: {
        auto r = txn->drop_tree(tree(op.tree));
        if (!r) return fail(op.str(), r.error());
        model.trees.erase(slots[op.tree]);
        model.kind.erase(slots[op.tree]);
        return true;
      }
      default:
        return true;
    }
  }

  // Shrinks, then takes the extent values' new starts into the model after
  // checking them: every key kept its length, and one old extent maps to
  // one new one, below the new end (what was shared is still shared).
  bool shrink(const Op& op) {
    model.moved = true;
    // The workloads are sized to fit: a refusal is a failure here.
    auto g = vol.resize(op.arg);
    if (!g) return fail(op.str(), g.error());
    auto txn = vol.begin();
    if (!txn) return fail("begin", txn.error());
    std::map<uint64_t, uint64_t> to, from;
    for (auto& [id, items] : model.trees) {
      if (model.kind[id] != kKindExtents) continue;
      std::string bad;
      auto it = items.begin();
      auto r = txn->scan(TreeId{id}, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
        if (it == items.end() || it->first != k || v.size() != it->second.size() ||
            std::memcmp(v.data() + 8, it->second.data() + 8, 8) != 0) {
          bad = "tree " + std::to_string(id) + " key " + std::to_string(k.hi) + " changed in the shrink";
          return false;
        }
        uint64_t was, now;
        std::memcpy(&was, it->second.data(), 8);
        std::memcpy(&now, v.data(), 8);
        if (to.emplace(was, now).first->second != now || from.emplace(now, was).first->second != was ||
            now * vol.block_size() >= op.arg) {
          bad = "extent " + std::to_string(was) + " moved inconsistently (to " + std::to_string(now) + ")";
          return false;
        }
        it->second.assign(v.begin(), v.end());
        ++it;
        return true;
      });
      if (!r) return fail(op.str(), r.error());
      if (bad.empty() && it != items.end()) bad = "tree " + std::to_string(id) + " lost keys in the shrink";
      if (!bad.empty()) return fail(op.str(), Error::invalid(bad));
    }
    return true;
  }

  bool fill(size_t index, const Op& op) {
    for (uint64_t k = 0; k < 100000; k++) {
      if (!run(index, Op{OpKind::Put, op.tree, op.key + k, 900})) return error.empty();
    }
    return true;
  }
};

}  // namespace

// The engine workloads' extents kind, and the filesystem trees of the
// filesystem workloads (fs_workload.h).
std::map<uint8_t, ValueRefs> kinds() {
  return {{kKindExtents, extent_refs}, {disk::kKindFs, fs_value_refs()}};
}
std::map<uint8_t, ValueMove> movers() {
  auto m = fs_movers();
  m[kKindExtents] = extent_move;
  return m;
}

std::string Op::str() const {
  static const char* names[] = {"put",  "put-extent", "erase", "create", "clone",
                                "drop", "commit",     "fill",  "grow",   "shrink"};
  return std::string(names[static_cast<int>(kind)]) + "(tree " + std::to_string(tree) + ", key " +
         std::to_string(key) + ", " + std::to_string(arg) + ")";
}

std::string describe_difference(const Model& want, const Model& got) {
  for (const auto& [id, items] : want.trees) {
    auto g = got.trees.find(id);
    if (g == got.trees.end()) return "tree " + std::to_string(id) + " is missing";
    if (g->second.size() != items.size())
      return "tree " + std::to_string(id) + " holds " + std::to_string(g->second.size()) +
             " items, the model " + std::to_string(items.size());
    for (const auto& [k, v] : items) {
      auto it = g->second.find(k);
      if (it == g->second.end()) return "tree " + std::to_string(id) + " lacks key " + std::to_string(k.hi);
      if (it->second != v) return "tree " + std::to_string(id) + " key " + std::to_string(k.hi) + " has other content";
    }
  }
  for (const auto& [id, items] : got.trees)
    if (!want.trees.count(id)) return "tree " + std::to_string(id) + " should not exist";
  return "kinds differ";
}

Result<Model> dump(Volume& vol) {
  Model m;
  auto txn = PLY_TRY(vol.begin());
  auto trees = PLY_TRY(txn.list_trees());
  for (const auto& t : trees) {
    auto& items = m.trees[t.id.v];
    m.kind[t.id.v] = t.kind;
    PLY_CHECK(txn.scan(t.id, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
      items.emplace(k, std::vector<std::byte>(v.begin(), v.end()));
      return true;
    }));
  }
  return m;
}

std::string compare(Volume& vol, const Model& want, std::vector<uint64_t>& ids,
                    std::map<uint64_t, uint8_t>& kinds_of) {
  auto txn = vol.begin();
  if (!txn) return "cannot begin: " + txn.error().message();
  auto trees = txn->list_trees();
  if (!trees) return "cannot list the trees: " + trees.error().message();
  for (const auto& t : *trees) {
    ids.push_back(t.id.v);
    kinds_of[t.id.v] = t.kind;
  }
  if (trees->size() != want.trees.size())
    return std::to_string(trees->size()) + " trees, the model has " + std::to_string(want.trees.size());
  for (const auto& t : *trees) {
    auto w = want.trees.find(t.id.v);
    if (w == want.trees.end()) return "tree " + std::to_string(t.id.v) + " should not exist";
    auto k = want.kind.find(t.id.v);
    if (k == want.kind.end() || k->second != t.kind) return "tree " + std::to_string(t.id.v) + " has another kind";
    auto it = w->second.begin();
    std::string diff;
    auto r = txn->scan(t.id, Key::min(), Key::max(), [&](Key key, std::span<const std::byte> v) {
      if (it == w->second.end() || it->first != key) {
        diff = "tree " + std::to_string(t.id.v) + " has key " + std::to_string(key.hi) +
               (it == w->second.end() ? " beyond the model's" : ", the model " + std::to_string(it->first.hi));
        return false;
      }
      // After a shrink an extent value's start (its first 8 bytes) may differ.
      const size_t skip = want.moved && t.kind == kKindExtents && v.size() >= 16 ? 8 : 0;
      if (v.size() != it->second.size() || !std::equal(v.begin() + skip, v.end(), it->second.begin() + skip)) {
        diff = "tree " + std::to_string(t.id.v) + " key " + std::to_string(key.hi) + " has other content";
        return false;
      }
      ++it;
      return true;
    });
    if (!r) return "unreadable: " + r.error().message();
    if (!diff.empty()) return diff;
    if (it != w->second.end())
      return "tree " + std::to_string(t.id.v) + " lacks key " + std::to_string(it->first.hi);
  }
  return "";
}

namespace {

VolumeOptions volume_options(const Workload& w) {
  VolumeOptions vo;
  vo.cache_bytes = 4 << 20;
  vo.kinds = kinds();
  vo.movers = movers();
  vo.planted_bug = w.bug;
  vo.discard = w.discard;
  return vo;
}

FormatOptions format_options(const Workload& w) {
  FormatOptions fo;
  fo.uuid = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};  // runs are reproducible
  fo.time_ns = 1;
  fo.size_bytes = w.format_bytes;
  fo.classes = w.classes;
  for (const auto& d : w.devices) fo.device_classes.push_back(d.class_id);
  return fo;
}

// Formats `dev`, applies the workload's setup and commits it; the model and
// slots get what the setup made. Empty on success.
std::string set_up(const Workload& w, BlockDevice& dev, Model& model, std::vector<uint64_t>& slots) {
  if (auto r = Volume::format(dev, format_options(w)); !r) return "format: " + r.error().message();
  auto vol = Volume::open(dev, volume_options(w));
  if (!vol) return "open: " + vol.error().message();
  std::string error;
  int code = 0;
  Executor ex{**vol, model, slots, error, code};
  for (size_t i = 0; i < w.setup.size(); i++) ex.run(i, w.setup[i]);
  if (auto r = (*vol)->close(); !r && error.empty()) error = "setup commit: " + r.error().message();
  return error;
}

// The recorded part: every operation between marks, an ack mark for every
// commit acknowledged, the model of every generation written.
template <class Mark>
void drive(const Workload& w, Volume& vol, Model& model, std::vector<uint64_t>& slots, Run& run,
           Mark mark) {
  run.base_gen = vol.durable_generation().v;
  run.model_at[run.base_gen] = model;
  Executor ex{vol, model, slots, run.error, run.error_code};
  for (size_t i = 0; i < w.ops.size() && run.error.empty(); i++) {
    const Op& op = w.ops[i];
    const Model before = model;
    const uint64_t durable = vol.durable_generation().v;
    mark("op-begin", i);
    const bool done = ex.run(w.setup.size() + i, op);
    mark("op-end", i);
    // A commit begin() made by itself (the change budget) holds what came
    // before this operation.
    if (vol.durable_generation().v != durable) run.model_at[vol.durable_generation().v] = before;
    // A shrink commits many generations, each holding the same content
    // (extents moved or not, which the model's `moved` allows), and the
    // one it was writing when it failed may be durable anyway (D4).
    if (op.kind == OpKind::Shrink)
      for (uint64_t g = durable + 1; g <= vol.open_generation().v; g++) run.model_at[g] = model;
    if (!done && !run.error.empty()) break;
    if (op.kind == OpKind::Commit) {
      // The model of the generation this commit tries to write: after a
      // failed flush it may be durable anyway (D4).
      run.model_at[vol.open_generation().v] = model;
      auto g = vol.commit();
      if (!g) {  // a failed commit (fault runs): the volume must be read-only now
        if (!vol.failure()) run.failed_writable = true;
        break;
      }
      run.model_at[g->v] = model;
      run.acked.push_back(g->v);
      mark("ack", g->v);
    }
    if (vol.failure()) break;
  }
}

// A workload of several devices: each member recorded on its own, in one
// global order (crashlog.h, MultiLog).
Run record_set(const Workload& w) {
  Run run;
  std::vector<std::unique_ptr<MemDevice>> mem;
  std::vector<BlockDevice*> ptrs;
  std::vector<uint64_t> sizes;
  for (const auto& d : w.devices) {
    mem.push_back(std::make_unique<MemDevice>(d.bytes));
    ptrs.push_back(mem.back().get());
    sizes.push_back(d.bytes);
  }
  Model model;
  std::vector<uint64_t> slots;
  {
    auto set = assemble(ptrs, sizes);
    if (!set) {
      run.error = "assemble: " + set.error().message();
      return run;
    }
    run.error = set_up(w, **set, model, slots);
    if (!run.error.empty()) return run;
  }
  std::vector<std::unique_ptr<MemDevice>> bases;
  for (const auto& m : mem) bases.push_back(m->clone());
  SetRecorder rec;
  std::vector<std::unique_ptr<BlockDevice>> wrapped;
  std::vector<BlockDevice*> wptrs;
  for (size_t d = 0; d < mem.size(); d++) {
    wrapped.push_back(rec.member(d, *mem[d]));
    wptrs.push_back(wrapped.back().get());
  }
  auto set = assemble(wptrs, sizes);
  if (!set) {
    run.error = "assemble: " + set.error().message();
    return run;
  }
  if (auto ch = read_superblocks(**set)) run.base_gen = ch->info.generation.v;
  run.model_at[run.base_gen] = model;
  run.log.sector = (*set)->logical_sector_size();
  {
    auto vol = Volume::open(**set, volume_options(w));
    if (!vol) {
      run.error = "open: " + vol.error().message();
      run.error_code = vol.error().code;
    } else {
      drive(w, **vol, model, slots, run, [&](const char* l, uint64_t a) { rec.mark(l, a); });
      vol->reset();  // the power goes out: nothing more is written
    }
  }
  run.multi = rec.take(std::move(bases), sizes);
  return run;
}

}  // namespace

Run record(const Workload& w, const FaultDevice::Rule* fault) {
  if (!w.devices.empty()) return record_set(w);
  Run run;
  auto dev = std::make_unique<MemDevice>(w.image_bytes);
  Model model;
  std::vector<uint64_t> slots;
  run.error = set_up(w, *dev, model, slots);
  if (!run.error.empty()) return run;
  run.log.base = dev->clone();
  run.log.sector = dev->logical_sector_size();
  if (auto ch = read_superblocks(*dev)) run.base_gen = ch->info.generation.v;
  run.model_at[run.base_gen] = model;  // also when the faulted open fails
  run.log.block_size = 4096;

  RecordingDevice rec(*dev);
  std::unique_ptr<FaultDevice> faulty;
  BlockDevice* target = &rec;
  if (fault) {
    faulty = std::make_unique<FaultDevice>(rec);
    faulty->add(*fault);
    target = faulty.get();
  }
  auto vol = Volume::open(*target, volume_options(w));
  if (!vol) {
    run.error = "open: " + vol.error().message();
    run.error_code = vol.error().code;
    run.log.entries = rec.log();
    run.log.index();
    if (faulty) run.fault_fired = faulty->fired() > 0;
    return run;
  }
  drive(w, **vol, model, slots, run, [&](const char* l, uint64_t a) { rec.mark(l, a); });
  if (faulty) run.fault_fired = faulty->fired() > 0;
  vol->reset();  // the power goes out: nothing more is written
  run.log.entries = rec.log();
  run.log.index();
  return run;
}

}  // namespace plyfs::crash
