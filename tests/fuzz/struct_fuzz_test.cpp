// Structure-aware mutation in the default suite (issue 21): thousands of
// random key and field mutations of the fuzzers' filesystem image, each with
// its checksum re-sealed (struct_mutate.h), so that they get past the
// checksums to the checks behind them, where the byte fuzzers rarely go.
// Each damaged image is read the way a mount reads it, then checked with
// fsck -n, repaired with -y and checked again, in process, with the object
// passes: nothing may crash, every exit code must be one fsck(8) knows, and
// a repair must leave the image clean (or, refused, only what no repair can
// mend). A failure prints the input as a hex dump for tests/fuzz/corpus-fs/.
// The seed is fixed (21) unless PLYFS_SEED gives another;
// PLYFS_STRUCT_FUZZ_RUNS sets the number of images (2000).
#include <catch2/catch_test_macros.hpp>

#include <cstdio>
#include <cstdlib>

#include "../random_seed.h"
#include "blockdev/test_devices.h"
#include "fs/check.h"
#include "fs/fs.h"
#include "fsck/fsck.h"
#include "fuzz_image.h"
#include "struct_mutate.h"
#include "union/view.h"

using namespace plyfs;

namespace {

std::string hex(const std::vector<uint8_t>& in) {
  std::string s;
  char b[4];
  for (size_t i = 0; i < in.size(); i++) {
    std::snprintf(b, sizeof b, "%02x", in[i]);
    s += b;
    if (i % 32 == 31) s += '\n';
  }
  return s;
}

std::string describe(const FsckReport& r) {
  std::string s = "exit " + std::to_string(r.exit_code) + "\n";
  for (const auto& p : r.problems)
    s += "  " + p.code + " [" + fix_class_name(p.fix) + (p.fixed ? ", fixed" : "") + "] " + p.message + "\n";
  for (const auto& a : r.actions) s += "  action: " + a + "\n";
  return s;
}

}  // namespace

TEST_CASE("structured mutations: keys, offsets and fields with re-sealed checksums", "[fuzz][struct]") {
  // Deterministic in the default suite (the same images every run); any
  // other seed with PLYFS_SEED.
  const uint64_t seed = std::getenv("PLYFS_SEED") ? test::seed("struct-fuzz") : 21;
  if (!std::getenv("PLYFS_SEED")) std::printf("[struct-fuzz] PLYFS_SEED=%llu\n", (unsigned long long)seed);
  const char* env = std::getenv("PLYFS_STRUCT_FUZZ_RUNS");
  const uint64_t runs = (env ? std::strtoull(env, nullptr, 0) : 2000) * test::scale();
  const MemDevice& base = fuzz::fs_base();
  const fuzz::NodeMap map = fuzz::map_nodes(base);
  REQUIRE(map.nodes.size() >= 10);  // root, space, catalog and filesystem trees with inner nodes
  std::mt19937_64 rng(seed);
  uint64_t reported = 0, repaired = 0, refused = 0, refusals = 0;
  for (uint64_t run = 0; run < runs; run++) {
    std::vector<uint8_t> input;
    std::string what;
    const int patches = 1 + int(rng() % 3);
    for (int i = 0; i < patches; i++) what += fuzz::append_struct_patch(input, map, rng) + "\n";
    INFO("PLYFS_SEED=" << seed << ", image " << run << ":\n" << what << "input (hex):\n" << hex(input));
    auto dev = base.clone();
    fuzz::apply_patches(*dev, input.data(), input.size());
    {
      VolumeOptions ro;
      ro.read_only = true;
      ro.kinds = fs_kinds();
      ro.cache_bytes = 1 << 20;
      if (auto vol = Volume::open(*dev, ro)) fuzz::read_all_fs(**vol);
    }
    FsckOptions fo;
    set_object_passes(fo, true);  // with -c: the data blocks too
    fo.mode = FsckMode::Check;
    auto n = fsck_run(*dev, fo);
    if (!n) {  // no plyfs any more, an unknown feature: a clean refusal (exit 8)
      refusals++;
      continue;
    }
    INFO("-n: " << describe(*n));
    REQUIRE((n->exit_code == kFsckClean || n->exit_code == kFsckUncorrected));
    fo.mode = FsckMode::Yes;
    auto y = fsck_run(*dev, fo);
    REQUIRE(y.ok());
    INFO("-y: " << describe(*y));
    fo.mode = FsckMode::Check;
    auto after = fsck_run(*dev, fo);
    REQUIRE(after.ok());
    INFO("after: " << describe(*after));
    if (n->exit_code == kFsckClean) {
      REQUIRE(y->exit_code == kFsckClean);
      continue;
    }
    reported++;
    REQUIRE((y->exit_code == kFsckCorrected || y->exit_code == kFsckUncorrected));
    if (y->exit_code == kFsckCorrected) {
      repaired++;
      REQUIRE(after->exit_code == kFsckClean);
    } else {
      // Refused: something no repair can mend is left (fsck.h: -y stops at
      // a structural problem no rebuild mends, A-double-use, R-kind; an
      // object it cannot mend stays while the others are repaired).
      refused++;
      REQUIRE(after->exit_code == kFsckUncorrected);
      bool unmendable = false;
      for (const auto& p : after->problems) unmendable |= p.fix == FixClass::None;
      REQUIRE(unmendable);
    }
  }
  std::printf("[struct-fuzz] %llu images: %llu reported (%llu repaired, %llu refused), %llu not plyfs any more\n",
              (unsigned long long)runs, (unsigned long long)reported, (unsigned long long)repaired,
              (unsigned long long)refused, (unsigned long long)refusals);
  CHECK(reported > runs / 2);  // the mutations reach the checks
}
