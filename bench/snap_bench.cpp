// Snapshot latency benchmark (issues 7 and 22): the steps of a mounted
// stack's snapshot as the daemon runs them (fuse/lifecycle.cpp,
// take_snapshot), through the library on an in-memory device, so that no
// FUSE and no disk enter the figures: the snapshot transaction (an O(1)
// clone), the pause of other work around it, and the commit. The union
// first looks up every file, as a warm mount's kernel holds them; neither
// step may follow that number, nor the number of snapshots taken before
// (format.md#snapshots, "Online").
//
//   snap_bench [--files N] [--snapshots K]
//
// Reports the median and the largest time of each step over K snapshots,
// each after a small write. Not a test: nothing is asserted.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "blockdev/test_devices.h"
#include "fs/fs.h"
#include "snap/snap.h"
#include "union/union.h"

#define BENCH_NAME "snap_bench"
#include "lib_bench.h"

using namespace plyfs;
using namespace bench;


int main(int argc, char** argv) {
  uint64_t files = 100000;
  int snaps = 7;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--files") && i + 1 < argc) files = std::strtoull(argv[++i], nullptr, 0);
    else if (!std::strcmp(argv[i], "--snapshots") && i + 1 < argc) snaps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: snap_bench [--files N] [--snapshots K]\n");
      return 2;
    }
  }
  if (snaps < 1) snaps = 1;
  MemDevice dev(4ull << 30);
  auto vol = memory_volume(dev);
  const TreeId base = must(Filesystem::default_tree(*vol), "tree");
  std::vector<std::unique_ptr<Filesystem>> fs;
  fs.push_back(must(Filesystem::open(*vol, base), "fs"));
  const uint64_t dirs = std::max<uint64_t>(1, files / 1000);
  std::vector<uint64_t> dino;
  for (uint64_t d = 0; d < dirs; d++)
    dino.push_back(must(fs[0]->mkdir(fs[0]->root(), "d" + std::to_string(d), 0755, 0, 0), "mkdir").ino);
  for (uint64_t i = 0; i < files; i++)
    (void)must(fs[0]->mknod(dino[i % dirs], "f" + std::to_string(i), S_IFREG | 0644, 0, 0, 0), "create");
  must(vol->commit(), "commit");

  Union u({{fs[0].get(), true}});
  const Caller root{0, 0, 022};
  auto t0 = Clock::now();
  for (uint64_t d = 0; d < dirs; d++) (void)must(u.lookup(u.root(), "d" + std::to_string(d)), "lookup");
  uint64_t first = 0;
  for (uint64_t i = 0; i < files; i++) {
    const uint64_t ino = must(u.lookup(dino[i % dirs], "f" + std::to_string(i)), "lookup").ino;
    if (!first) first = ino;
  }
  auto t1 = Clock::now();
  std::printf("%llu files in %llu directories; %.0f ms to look them all up through the union\n",
              (unsigned long long)files, (unsigned long long)dirs, ms(t0, t1));

  std::vector<double> tx, rs, cm, all;
  const std::byte byte[1] = {std::byte{42}};
  for (int k = 0; k < snaps; k++) {
    // A small write first, as a live mount has: the snapshot shares it,
    // and the next write copies the nodes it changes (copy-on-write).
    (void)must(u.write(first, uint64_t(k), byte, root), "write");
    auto a = Clock::now();
    Clock::time_point b, c;
    // As the daemon takes it (fuse/lifecycle.cpp): an O(1) clone while
    // nothing else runs; the stack does not change.
    must(u.hold_still([&]() -> Result<void> {
      (void)PLY_TRY(snapshot(*vol, base, "s" + std::to_string(k)));
      b = Clock::now();
      return ok();
    }), "snapshot");
    c = Clock::now();
    must(vol->commit(), "commit");
    auto d = Clock::now();
    tx.push_back(ms(a, b));
    rs.push_back(ms(b, c));
    cm.push_back(ms(c, d));
    all.push_back(ms(a, d));
  }
  std::printf("%-28s %10s %10s\n", "step (ms)", "median", "max");
  auto row = [](const char* name, const std::vector<double>& v) {
    std::printf("%-28s %10.3f %10.3f\n", name, median(v), *std::max_element(v.begin(), v.end()));
  };
  row("snapshot transaction", tx);
  row("hold_still (other work paused)", rs);
  row("commit (memory device)", cm);
  row("whole snapshot", all);
  return 0;
}
