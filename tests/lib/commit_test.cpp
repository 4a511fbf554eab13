// lib/commit: the generation protocol (C1-C6) under crashes, faults and load.
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "test_util.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

// Deterministic changes for a given seed: puts, erases, a new tree, a clone.
struct Workload {
  uint64_t seed;

  void apply(Volume& vol, std::map<uint64_t, Model>& trees) {
    std::mt19937_64 rng(seed);
    auto txn = must(vol.begin());
    for (auto& [id, m] : trees) {
      for (int i = 0; i < 300; i++) {
        Key k{rng() % 3000, 0};
        if (rng() % 3 == 0) {
          (void)must(txn.erase(TreeId{id}, k));
          m.erase(k);
        } else {
          std::string text = std::to_string(rng() % 100000);
          text.insert(text.begin(), 'v');
          auto v = bytes(text);
          must(txn.put(TreeId{id}, k, v));
          m[k] = v;
        }
      }
    }
    TreeId c = must(txn.clone_tree(TreeId{trees.begin()->first}));
    trees[c.v] = trees.begin()->second;
    TreeId n = must(txn.create_tree(kKindPlain));
    must(txn.put(n, Key{1, 1}, bytes("new tree")));
    trees[n.v][Key{1, 1}] = bytes("new tree");
  }
};

std::map<uint64_t, Model> dump_all(Volume& vol) {
  std::map<uint64_t, Model> out;
  auto txn = must(vol.begin());
  for (const auto& t : must(txn.list_trees())) {
    Model& m = out[t.id.v];
    must(txn.scan(t.id, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
      m.emplace(k, std::vector<std::byte>(v.begin(), v.end()));
      return true;
    }));
  }
  return out;
}

// A committed base image with two trees; returns the trees' content.
std::map<uint64_t, Model> make_base(MemDevice& dev) {
  std::map<uint64_t, Model> trees;
  auto vol = must(Volume::open(dev));
  auto txn = must(vol->begin());
  for (int t = 0; t < 2; t++) {
    TreeId id = must(txn.create_tree(kKindPlain));
    for (uint64_t i = 0; i < 3000; i += 2) {
      must(txn.put(id, Key{i, 0}, bytes("base" + std::to_string(i))));
      trees[id.v][Key{i, 0}] = bytes("base" + std::to_string(i));
    }
  }
  { auto d = std::move(txn); }
  must(vol->close());
  return trees;
}

}  // namespace

TEST_CASE("commit: uncommitted work vanishes at a crash, committed work is all there",
          "[commit]") {
  auto dev = fresh_device(128 << 20);
  auto committed = make_base(*dev);
  std::mt19937_64 rng(seed("commit-crash-reopen"));
  for (int round = 0; round < 20; round++) {
    auto vol = must(Volume::open(*dev));
    REQUIRE(dump_all(*vol) == committed);
    auto trees = committed;
    Workload w{rng()};
    w.apply(*vol, trees);
    if (rng() % 2) {
      must(vol->commit());
      committed = trees;
    }
    REQUIRE(dump_all(*vol) == trees);  // the running volume sees its own changes
    vol.reset();                        // crash: no close
    require_clean(*dev);
  }
}

TEST_CASE("commit: a power cut at any point of a commit leaves the old or the new generation",
          "[commit]") {
  // The commit's device calls are cut at call k (every later write and flush
  // fails, as after a power loss), then the device drops or tears whatever
  // was not flushed (D1, D2). The image must open to exactly the state before
  // or after the commit, and be consistent.
  const uint64_t s0 = seed("commit-power-cut");
  uint64_t saw_old = 0, saw_new = 0, states = 0;
  for (uint64_t round = 0; round < 4; round++) {
    auto base = fresh_device(64 << 20);
    const auto before = make_base(*base);
    Workload w{s0 + round};
    auto after = before;
    {
      auto probe = base->clone();
      auto vol = must(Volume::open(*probe));
      w.apply(*vol, after);
      must(vol->commit());
    }
    for (uint64_t k = 1;; k++) {
      auto dev = base->clone();
      dev->track_unflushed(true);
      FaultDevice cut(*dev);
      cut.add({FaultDevice::Op::Modify, k, true, FaultDevice::Kind::Eio, 0});
      bool done;
      {
        auto vol = must(Volume::open(cut));
        auto trees = before;
        w.apply(*vol, trees);
        done = vol->commit().ok();
      }
      for (uint64_t tear = 0; tear < 4; tear++) {
        auto crashed = dev->clone();
        std::mt19937_64 rng(s0 ^ (k * 131 + tear));
        crashed->crash(rng);
        states++;
        auto vol = must(Volume::open(*crashed));
        auto got = dump_all(*vol);
        const bool is_old = got == before, is_new = got == after;
        INFO("round " << round << " cut at call " << k << " tear " << tear);
        REQUIRE((is_old || is_new));
        saw_old += is_old;
        saw_new += is_new;
        auto rep = must(verify_image(*crashed));
        for (const auto& p : rep.problems) REQUIRE(p.code == "S-slot");  // a torn slot at most
      }
      if (done) break;
    }
  }
  std::printf("[commit-power-cut] %llu crash states: %llu old, %llu new\n",
              (unsigned long long)states, (unsigned long long)saw_old,
              (unsigned long long)saw_new);
  REQUIRE(saw_old > 0);
  REQUIRE(saw_new > 0);
}

TEST_CASE("commit: no write ever touches a block of the durable generation (C3)", "[commit]") {
  auto mem = fresh_device(256 << 20);
  ReachCheckDevice dev(*mem);
  std::mt19937_64 rng(seed("commit-reach"));
  auto vol = must(Volume::open(dev, VolumeOptions{false, 2 << 20, 0, 0, {}}));
  std::map<uint64_t, Model> trees;
  for (int round = 0; round < 60; round++) {
    auto txn = must(vol->begin(Volume::TxnOptions{true, 0}));
    const uint32_t what = rng() % 10;
    if (trees.empty() || what == 0) {
      TreeId t = must(txn.create_tree(kKindPlain));
      trees[t.v];
    } else if (what == 1) {
      auto it = trees.begin();
      std::advance(it, rng() % trees.size());
      TreeId c = must(txn.clone_tree(TreeId{it->first}));
      trees[c.v] = it->second;
    } else if (what == 2 && trees.size() > 1) {
      auto it = trees.begin();
      std::advance(it, rng() % trees.size());
      must(txn.drop_tree(TreeId{it->first}));
      trees.erase(it);
    } else {
      for (auto& [id, m] : trees)
        for (int i = 0; i < 400; i++) {
          Key k{rng() % 20000, 0};
          if (rng() % 4 == 0) {
            (void)must(txn.erase(TreeId{id}, k));
            m.erase(k);
          } else {
            must(txn.put(TreeId{id}, k, bytes(std::to_string(rng()))));
            m[k] = *must(txn.get(TreeId{id}, k));
          }
        }
    }
    { auto d = std::move(txn); }
    if (round % 3 == 2) must(vol->commit());
  }
  must(vol->close());
  INFO((dev.violations.empty() ? "" : dev.violations.front()));
  REQUIRE(dev.violations.empty());
  REQUIRE(dev.refreshes >= 20);  // every commit was checked
  REQUIRE(dump_all(*must(Volume::open(*mem))) == trees);

  // The checker itself: a write into the durable generation is caught.
  auto rep = must(verify_image(*mem, VerifyOptions{{}, 64 << 20, std::nullopt, true}));
  REQUIRE_FALSE(rep.reachable.empty());
  std::vector<std::byte> junk(4096);
  must(dev.write(rep.reachable.back().first * 4096, junk));
  REQUIRE(dev.violations.size() == 1);
}

TEST_CASE("commit: an I/O error fails the commit cleanly and keeps the previous generation",
          "[commit]") {
  // For k = 1, 2, ... fail the k-th write, or the k-th flush, once or from
  // then on, until the commit gets through (C5).
  auto base = fresh_device(64 << 20);
  const auto before = make_base(*base);
  Workload w{seed("commit-faults")};
  auto after = before;
  {
    auto probe = base->clone();
    auto vol = must(Volume::open(*probe));
    w.apply(*vol, after);
    must(vol->commit());
  }
  struct Mode { FaultDevice::Op op; bool sticky; FaultDevice::Kind kind; };
  const Mode modes[] = {
      {FaultDevice::Op::Write, false, FaultDevice::Kind::Eio},
      {FaultDevice::Op::Write, true, FaultDevice::Kind::Eio},
      {FaultDevice::Op::Write, false, FaultDevice::Kind::Torn},
      {FaultDevice::Op::Write, false, FaultDevice::Kind::Short},
      {FaultDevice::Op::Flush, false, FaultDevice::Kind::Eio},
      {FaultDevice::Op::Flush, true, FaultDevice::Kind::Eio},
  };
  uint64_t runs = 0;
  for (const Mode& mode : modes) {
    for (uint64_t k = 1;; k++) {
      auto dev = base->clone();
      FaultDevice f(*dev);
      f.add({mode.op, k, mode.sticky, mode.kind, k});
      auto vol = must(Volume::open(f));
      auto trees = before;
      w.apply(*vol, trees);
      auto r = vol->commit();
      runs++;
      if (r) {
        REQUIRE(f.fired() == 0);
        vol.reset();
        REQUIRE(dump_all(*must(Volume::open(*dev))) == after);
        break;
      }
      INFO("op " << int(mode.op) << " k " << k << ": " << r.error().message());
      REQUIRE(f.fired() > 0);
      // C5: the volume is read-only now, and says why.
      REQUIRE(vol->failure().has_value());
      {
        auto txn = must(vol->begin());
        auto p = txn.put(TreeId{before.begin()->first}, Key{1, 1}, bytes("x"));
        REQUIRE_FALSE(p);
        REQUIRE(p.error().code == EROFS);
      }
      REQUIRE_FALSE(vol->commit());
      vol.reset();
      // Reopened without the fault: the old generation, or (a failed flush
      // after the superblock write) the new one; never a mix.
      auto got = dump_all(*must(Volume::open(*dev)));
      if (mode.op == FaultDevice::Op::Flush) REQUIRE((got == before || got == after));
      else REQUIRE(got == before);
      auto rep = must(verify_image(*dev));
      for (const auto& p : rep.problems) REQUIRE(p.code == "S-slot");
    }
  }
  REQUIRE(runs > 20);
}

TEST_CASE("commit: a read error fails the operation; a failed change turns the volume read-only",
          "[commit]") {
  auto dev = fresh_device(64 << 20);
  const auto before = make_base(*dev);
  const TreeId t{before.begin()->first};
  for (uint64_t k = 1; k < 8; k++) {
    FaultDevice f(*dev);
    VolumeOptions vo;
    vo.cache_bytes = 64 * 1024;  // cold cache: operations read
    auto vol = must(Volume::open(f, vo));
    f.add({FaultDevice::Op::Read, k, false, FaultDevice::Kind::Eio, 0});
    auto txn = must(vol->begin());
    auto g = txn.get(t, Key{1500, 0});
    if (!g) {
      REQUIRE(g.error().code == EIO);
      REQUIRE_FALSE(vol->failure());  // a failed read changes nothing
    }
    auto p = txn.put(t, Key{1501, 0}, bytes("x"));
    if (!p) {
      REQUIRE(p.error().code == EIO);
      REQUIRE(vol->failure().has_value());
    }
  }
  auto vol = must(Volume::open(*dev));
  REQUIRE(dump_all(*vol) == before);
}

namespace {

// Holds every write while armed, so a commit can be caught in the middle.
class BlockingDevice final : public BlockDevice {
 public:
  explicit BlockingDevice(BlockDevice& inner) : inner_(inner) {}
  Result<void> read(uint64_t o, std::span<std::byte> out) override { return inner_.read(o, out); }
  Result<void> write(uint64_t o, std::span<const std::byte> in) override {
    std::unique_lock lk(mu_);
    if (armed_) {
      blocked_ = true;
      cv_.notify_all();
      cv_.wait(lk, [&] { return !armed_; });
    }
    lk.unlock();
    return inner_.write(o, in);
  }
  Result<void> flush() override { return inner_.flush(); }
  Result<void> discard(uint64_t o, uint64_t l) override { return inner_.discard(o, l); }
  uint64_t size_bytes() const override { return inner_.size_bytes(); }
  uint32_t logical_sector_size() const override { return inner_.logical_sector_size(); }
  uint32_t physical_sector_size() const override { return inner_.physical_sector_size(); }
  void arm() { std::lock_guard lk(mu_); armed_ = true; blocked_ = false; }
  void wait_blocked() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return blocked_; });
  }
  void release() {
    std::lock_guard lk(mu_);
    armed_ = false;
    cv_.notify_all();
  }

 private:
  BlockDevice& inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, blocked_ = false;
};

}  // namespace

TEST_CASE("commit: operations go on in the next generation while a commit writes",
          "[commit]") {
  auto mem = fresh_device(64 << 20);
  BlockingDevice dev(*mem);
  auto vol = must(Volume::open(dev));
  TreeId t;
  {
    auto txn = must(vol->begin());
    t = must(txn.create_tree(kKindPlain));
    must(txn.put(t, Key{0, 0}, bytes("first")));
  }
  const Generation g = vol->open_generation();
  dev.arm();
  Result<Generation> committed = Generation{0};
  std::thread committer([&] { committed = vol->commit(); });
  dev.wait_blocked();  // the commit of g is stuck in its first write
  REQUIRE(vol->open_generation() == next(g));
  REQUIRE(vol->durable_generation() < g);
  for (uint64_t i = 1; i <= 2000; i++) {
    auto txn = must(vol->begin());
    REQUIRE(txn.gen() == next(g));
    must(txn.put(t, Key{i, 0}, bytes("during")));
    if (i == 1) REQUIRE(*must(txn.get(t, Key{0, 0})) == bytes("first"));
  }
  REQUIRE(vol->durable_generation() < g);  // all of that ran while g was being written
  dev.release();
  committer.join();
  REQUIRE(committed);
  REQUIRE(*committed == g);
  {
    // The generation g on disk has only what came before the freeze.
    auto only_g = mem->clone();
    auto v2 = must(Volume::open(*only_g));
    auto m = dump(*v2, t);
    REQUIRE(m.size() == 1);
  }
  REQUIRE(must(vol->commit()) == next(g));
  vol.reset();
  auto again = must(Volume::open(*mem));
  REQUIRE(dump(*again, t).size() == 2001);
  require_clean(*mem);
}

// What on_commit saw, from the committing threads.
struct Seen {
  std::mutex mu;
  std::vector<CommitStats> v;
  std::function<void(const CommitStats&)> hook() {
    return [this](const CommitStats& st) {
      std::lock_guard lk(mu);
      v.push_back(st);
    };
  }
  std::vector<CommitStats> get() {
    std::lock_guard lk(mu);
    return v;
  }
};

TEST_CASE("commit: the timer and the dirty limit trigger commits by themselves", "[commit]") {
  using Cause = CommitStats::Cause;
  Seen seen;
  SECTION("timer") {
    auto dev = fresh_device(64 << 20);
    VolumeOptions vo;
    vo.commit_interval_ms = 20;
    vo.on_commit = seen.hook();
    auto vol = must(Volume::open(*dev, vo));
    const Generation g0 = vol->durable_generation();
    TreeId t;
    {
      auto txn = must(vol->begin());
      t = must(txn.create_tree(kKindPlain));
      must(txn.put(t, Key{1, 0}, bytes("timed")));
    }
    for (int i = 0; i < 500 && vol->durable_generation() == g0; i++)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    REQUIRE(vol->durable_generation() > g0);
    // The hook runs after the commit is durable: wait for it, then it names
    // the periodic commit, its generation and the blocks it wrote.
    for (int i = 0; i < 500 && seen.get().empty(); i++)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto st = seen.get();
    REQUIRE(st.size() == 1);
    REQUIRE(st[0].cause == Cause::Periodic);
    REQUIRE(st[0].gen == next(g0));
    REQUIRE(st[0].blocks >= 2);  // the new tree's root and the root tree's
    {
      auto txn = must(vol->begin());
      must(txn.put(t, Key{2, 0}, bytes("asked")));
    }
    const Generation asked = must(vol->commit());
    const size_t n = seen.get().size();
    (void)must(vol->commit());  // nothing changed since: no commit, no call
    st = seen.get();
    REQUIRE(st.size() == n);
    REQUIRE(st.back().gen == asked);
    // Ours, unless the timer came first and left ours nothing to do.
    REQUIRE((st.back().cause == Cause::Request || st.back().cause == Cause::Periodic));
    vol.reset();  // a crash right after: the timed commit kept the change
    auto again = must(Volume::open(*dev));
    REQUIRE(*must(must(again->begin()).get(t, Key{1, 0})) == bytes("timed"));
  }
  SECTION("dirty limit") {
    auto dev = fresh_device(64 << 20);
    VolumeOptions vo;
    vo.dirty_limit_bytes = 256 * 1024;
    vo.on_commit = seen.hook();
    auto vol = must(Volume::open(*dev, vo));
    const Generation g0 = vol->durable_generation();
    TreeId t;
    {
      auto txn = must(vol->begin());
      t = must(txn.create_tree(kKindPlain));
    }
    uint64_t i = 0;
    for (; i < 200000 && vol->durable_generation() == g0; i++) {
      auto txn = must(vol->begin());
      must(txn.put(t, Key{i * 7919 % 100003, i}, bytes("dirty")));
      if (i % 1000 == 999) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    REQUIRE(vol->durable_generation() > g0);
    REQUIRE(i < 200000);
    for (int k = 0; k < 500 && seen.get().empty(); k++)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto st = seen.get();
    REQUIRE_FALSE(st.empty());
    REQUIRE(st[0].cause == Cause::Dirty);
    REQUIRE(st[0].blocks * vol->block_size() >= 256 * 1024);  // at least the limit's worth went out
    must(vol->close());
  }
}

TEST_CASE("commit: opening and reading never write (C6)", "[commit]") {
  auto mem = fresh_device(64 << 20);
  make_base(*mem);
  RecordingDevice rec(*mem);
  auto count_writes = [&] {
    uint64_t n = 0;
    for (const auto& e : rec.log()) n += e.kind != RecordingDevice::Kind::Mark;
    return n;
  };
  {
    auto vol = must(Volume::open(rec));
    dump_all(*vol);
  }  // a crash after reading
  {
    auto vol = must(Volume::open(rec));
    dump_all(*vol);
    must(vol->close());  // nothing changed: nothing to commit
  }
  {
    VolumeOptions ro;
    ro.read_only = true;
    auto vol = must(Volume::open(rec, ro));
    dump_all(*vol);
    auto txn = must(vol->begin());
    auto p = txn.put(TreeId{256}, Key{1, 1}, bytes("x"));
    REQUIRE_FALSE(p);
    REQUIRE(p.error().code == EROFS);
    { auto d = std::move(txn); }
    must(vol->close());
  }
  REQUIRE(count_writes() == 0);
}

TEST_CASE("commit: threads on different trees, with commits running meanwhile", "[commit]") {
  auto dev = fresh_device(256 << 20);
  auto vol = must(Volume::open(*dev, VolumeOptions{false, 8 << 20, 0, 0, {}}));
  constexpr int kThreads = 4;
  std::vector<TreeId> ids;
  {
    auto txn = must(vol->begin());
    for (int i = 0; i < kThreads; i++) ids.push_back(must(txn.create_tree(kKindPlain)));
  }
  std::vector<Model> models(kThreads);
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::thread committer([&] {
    while (!stop) {
      if (!vol->commit()) errors++;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  const uint64_t s = seed("commit-threads");
  std::vector<std::thread> workers;
  for (int w = 0; w < kThreads; w++)
    workers.emplace_back([&, w] {
      std::mt19937_64 rng(s + w);
      for (int i = 0; i < 20000; i++) {
        auto txn = vol->begin();
        if (!txn) { errors++; return; }
        Key k{rng() % 5000, 0};
        if (rng() % 4 == 0) {
          auto r = txn->erase(ids[w], k);
          if (!r || *r != (models[w].erase(k) == 1)) errors++;
        } else if (rng() % 3 == 0) {
          auto r = txn->get(ids[w], k);
          auto it = models[w].find(k);
          if (!r || r->has_value() != (it != models[w].end()) || (*r && **r != it->second)) errors++;
        } else {
          auto v = bytes(std::to_string(rng()));
          if (!txn->put(ids[w], k, v)) errors++;
          models[w][k] = v;
        }
      }
    });
  for (auto& t : workers) t.join();
  stop = true;
  committer.join();
  REQUIRE(errors == 0);
  must(vol->close());
  require_clean(*dev);
  auto again = must(Volume::open(*dev));
  for (int w = 0; w < kThreads; w++) REQUIRE(dump(*again, ids[w]) == models[w]);
}
