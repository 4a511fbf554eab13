// Snapshots under load, in the library (issue 22): a PostMark-like
// workload (N small files in 100 directories, then transactions that
// create, delete, read or append) on an in-memory device, with a snapshot
// every S transactions and a commit every C, as a mount with
// snapshot_interval and its commit interval runs it. So that no FUSE and no
// disk enter the figures, and so that `valgrind --tool=callgrind` can count
// the instructions each setting costs (repeatable on a noisy machine).
//
//   snap_load_bench [--files N] [--tx T] [--snap-every S] [--commit-every C]
//                   [--keep K]
//
// S = 0: no snapshots. K > 0: delete the oldest snapshot beyond K (what
// -o snapshot_keep does). Prints the time, the commits, and the metadata
// blocks the commits wrote. Not a test: nothing is asserted.
#include <sys/stat.h>

#include <cstring>
#include <deque>
#include <random>
#include <string>

#define BENCH_NAME "snap_load_bench"
#include "lib_bench.h"
#include "snap/snap.h"

using namespace plyfs;
using namespace bench;

int main(int argc, char** argv) {
  uint64_t files = 20000, txs = 100000, snap_every = 0, commit_every = 30000, keep = 0;
  for (int i = 1; i < argc; i++) {
    auto arg = [&](const char* name, uint64_t& v) {
      if (std::strcmp(argv[i], name) || i + 1 >= argc) return false;
      v = std::strtoull(argv[++i], nullptr, 10);
      return true;
    };
    if (!arg("--files", files) && !arg("--tx", txs) && !arg("--snap-every", snap_every) &&
        !arg("--commit-every", commit_every) && !arg("--keep", keep)) {
      std::fprintf(stderr, "usage: snap_load_bench [--files N] [--tx T] [--snap-every S] [--commit-every C] [--keep K]\n");
      return 2;
    }
  }
  MemDevice dev(4ull << 30);
  auto vol = memory_volume(dev);
  uint64_t commits = 0, blocks = 0;
  const TreeId base = must(Filesystem::default_tree(*vol), "tree");
  auto fs = must(Filesystem::open(*vol, base), "open");
  std::mt19937_64 rng(42);
  std::vector<uint64_t> dirs;
  for (int d = 0; d < 100; d++)
    dirs.push_back(must(fs->mkdir(fs->root(), "d" + std::to_string(d), 0755, 0, 0), "mkdir").ino);
  std::vector<std::byte> buf(10000, std::byte{0x5a});
  struct F { uint64_t dir, ino; std::string name; };
  std::vector<F> live;
  uint64_t next = 0;
  auto create = [&] {
    F f{dirs[rng() % dirs.size()], 0, "f" + std::to_string(next++)};
    f.ino = must(fs->mknod(f.dir, f.name, S_IFREG | 0644, 0, 0, 0), "create").ino;
    (void)must(fs->write(f.ino, 0, std::span(buf).first(500 + rng() % 9500)), "write");
    live.push_back(f);
  };
  for (uint64_t i = 0; i < files; i++) create();
  must(vol->commit(), "commit");
  std::deque<TreeId> snaps;
  const auto t0 = Clock::now();
  auto commit = [&] {
    const uint64_t before = vol->space_stats().used_blocks;
    (void)before;
    must(vol->commit(), "commit");
    commits++;
  };
  std::vector<std::byte> rd(10000);
  for (uint64_t t = 1; t <= txs; t++) {
    const uint32_t r = rng() % 4;
    if (r == 0) {
      create();
    } else if (r == 1 && !live.empty()) {
      const size_t k = rng() % live.size();
      must(fs->unlink(live[k].dir, live[k].name), "unlink");
      live[k] = live.back();
      live.pop_back();
    } else if (r == 2 && !live.empty()) {
      (void)must(fs->read(live[rng() % live.size()].ino, 0, rd), "read");
    } else if (!live.empty()) {
      const F& f = live[rng() % live.size()];
      const uint64_t size = must(fs->getattr(f.ino), "getattr").size;
      (void)must(fs->write(f.ino, size, std::span(buf).first(1 + rng() % 1000)), "append");
    }
    if (snap_every && t % snap_every == 0) {
      snaps.push_back(must(snapshot(*vol, base, "s" + std::to_string(t)), "snapshot").frozen.tree);
      commit();
      if (keep && snaps.size() > keep) {
        must(delete_branch(*vol, snaps.front()), "delete");
        snaps.pop_front();
      }
    }
    if (t % commit_every == 0) commit();
  }
  commit();
  const auto t1 = Clock::now();
  blocks = vol->space_stats().meta_blocks;
  std::printf("%llu files, %llu transactions, snapshot every %llu, commit every %llu, keep %llu\n",
              (unsigned long long)files, (unsigned long long)txs, (unsigned long long)snap_every,
              (unsigned long long)commit_every, (unsigned long long)keep);
  std::printf("%.0f ms, %.0f tx/s, %llu commits, %llu snapshots kept, %llu metadata blocks in use\n", ms(t0, t1),
              double(txs) / (ms(t0, t1) / 1000), (unsigned long long)commits, (unsigned long long)snaps.size(),
              (unsigned long long)blocks);
  must(fs->release_all(), "release");
  return 0;
}
