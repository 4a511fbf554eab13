// Copy-up and merge cost benchmark (issues 6 and 7): the library's steps on
// an in-memory device, so that no FUSE and no disk enter the figures.
//
//   merge_bench [--gib G] [--changed 0.25,1] [--files N] [--copy-in]
//
// A base branch holds N small files and one file of G GiB. For each changed
// size C: a layer made on the base; the big file is copied up through the union (the
// copy-up is timed alone: Union::open for writing); C GiB of it and every
// small file are overwritten; then the merge (snap::merge) and the drop of
// what it replaced (drop_doomed) are timed, as `plyctl merge` runs
// them on a mount. Issue 7's target is a merge time that does not follow C.
// --copy-in times Filesystem::copy_in alone first (into a second name of
// the file in the upper branch; the union's copy-up then only links it).
// Not a test: nothing is asserted.
#include <fcntl.h>
#include <sys/stat.h>

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

#define BENCH_NAME "merge_bench"
#include "lib_bench.h"

using namespace plyfs;
using namespace bench;

namespace {
std::vector<double> list(const char* s) {
  std::vector<double> v;
  for (char* e; *s; s = *e ? e + 1 : e) v.push_back(std::strtod(s, &e));
  return v;
}
}  // namespace

int main(int argc, char** argv) {
  double gib = 1;
  std::vector<double> changed{0.25, 1};
  uint64_t files = 10000;
  bool copy_in = false;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--gib") && i + 1 < argc) gib = std::strtod(argv[++i], nullptr);
    else if (!std::strcmp(argv[i], "--changed") && i + 1 < argc) changed = list(argv[++i]);
    else if (!std::strcmp(argv[i], "--files") && i + 1 < argc) files = std::strtoull(argv[++i], nullptr, 0);
    else if (!std::strcmp(argv[i], "--copy-in")) copy_in = true;
    else {
      std::fprintf(stderr, "usage: merge_bench [--gib G] [--changed C,...] [--files N] [--copy-in]\n");
      return 2;
    }
  }
  const uint64_t big = uint64_t(gib * (1 << 30)) & ~uint64_t(4095);
  std::vector<std::byte> chunk(1 << 20, std::byte{0xa5});
  const Caller root{0, 0, 022};
  std::printf("%-10s %12s %12s %12s %12s\n", "changed", "copy-up ms", "merge ms", "drop ms", "merge+drop");
  std::fflush(stdout);
  for (double c : changed) {
    MemDevice dev(2 * big + (2ull << 30));
      auto vol = memory_volume(dev);
    const TreeId base = must(Filesystem::default_tree(*vol), "tree");
    auto bfs = must(Filesystem::open(*vol, base), "fs");
    const uint64_t dirs = std::max<uint64_t>(1, files / 1000);
    std::vector<uint64_t> dino;
    for (uint64_t d = 0; d < dirs; d++)
      dino.push_back(must(bfs->mkdir(bfs->root(), std::string("d") + std::to_string(d), 0755, 0, 0), "mkdir").ino);
    std::vector<uint64_t> small;
    for (uint64_t i = 0; i < files; i++) {
      small.push_back(must(bfs->mknod(dino[i % dirs], std::string("f") + std::to_string(i), S_IFREG | 0644, 0, 0, 0), "create").ino);
      must(bfs->write(small.back(), 0, std::span(chunk).first(4096)), "write");
    }
    const uint64_t bino = must(bfs->mknod(bfs->root(), "big", S_IFREG | 0644, 0, 0, 0), "create").ino;
    for (uint64_t off = 0; off < big; off += chunk.size())
      must(bfs->write(bino, off, std::span(chunk).first(std::min<uint64_t>(chunk.size(), big - off))), "write");
    must(vol->commit(), "commit");

    // The change goes into a layer on the base (OLFS), merged down after.
    auto layer = must(create_layer(*vol, "work", base, false), "layer");
    auto live = must(Filesystem::open(*vol, layer.tree), "fs");
    Union u({{live.get(), true}, {bfs.get(), false}});
    // Through the union, as the kernel reaches them.
    (void)must(u.lookup(u.root(), "big"), "lookup");
    for (uint64_t d = 0; d < dirs; d++) (void)must(u.lookup(u.root(), std::string("d") + std::to_string(d)), "lookup");
    if (copy_in) {
      auto a = Clock::now();
      (void)must(live->copy_in(*bfs, bino, live->root(), "big.copy"), "copy_in");
      auto b = Clock::now();
      std::printf("copy_in alone: %.2f ms\n", ms(a, b));
    }
    auto t0 = Clock::now();
    must(u.open(bino, true, root), "copy-up");
    auto t1 = Clock::now();
    std::fill(chunk.begin(), chunk.end(), std::byte{0x79});
    const uint64_t cbytes = std::min<uint64_t>(big, uint64_t(c * (1 << 30)));
    for (uint64_t off = 0; off < cbytes; off += chunk.size())
      (void)must(u.write(bino, off, std::span(chunk).first(std::min<uint64_t>(chunk.size(), cbytes - off)), root), "write");
    for (uint64_t i = 0; i < files; i++) {
      (void)must(u.lookup(dino[i % dirs], std::string("f") + std::to_string(i)), "lookup");
      (void)must(u.write(small[i], 0, std::span(chunk).first(4096), root), "write");
    }
    must(vol->commit(), "commit");
    auto t2 = Clock::now();
    auto m = must(merge(*vol, layer.tree, live.get()), "merge");
    auto t3 = Clock::now();
    must(u.release_all(), "release");
    live.reset();
    bfs.reset();
    (void)must(drop_doomed(*vol), "drop");
    must(vol->commit(), "commit");
    auto t4 = Clock::now();
    std::printf("%-10g %12.2f %12.2f %12.2f %12.2f   (%llu objects)\n", c, ms(t0, t1), ms(t2, t3), ms(t3, t4),
                ms(t2, t4), (unsigned long long)m.stats.objects);
  }
  return 0;
}
