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

namespace {

// `runs` images of `base`, each with 1-3 structured patches: read as a mount
// would, then fsck -n, -y, -n.
void struct_runs(const MemDevice& base, uint64_t seed, uint64_t runs, const char* tag, size_t min_nodes) {
  const fuzz::NodeMap map = fuzz::map_nodes(base);
  REQUIRE(map.nodes.size() >= min_nodes);
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
  std::printf("[%s] %llu images: %llu reported (%llu repaired, %llu refused), %llu not plyfs any more\n",
              tag, (unsigned long long)runs, (unsigned long long)reported, (unsigned long long)repaired,
              (unsigned long long)refused, (unsigned long long)refusals);
  CHECK(reported > runs / 2);  // the mutations reach the checks
}

uint64_t struct_seed() {
  // Deterministic in the default suite (the same images every run); any
  // other seed with PLYFS_SEED.
  const uint64_t seed = std::getenv("PLYFS_SEED") ? test::seed("struct-fuzz") : 21;
  if (!std::getenv("PLYFS_SEED")) std::printf("[struct-fuzz] PLYFS_SEED=%llu\n", (unsigned long long)seed);
  return seed;
}

uint64_t struct_runs_env(uint64_t fallback) {
  const char* env = std::getenv("PLYFS_STRUCT_FUZZ_RUNS");
  return (env ? std::strtoull(env, nullptr, 0) : fallback) * test::scale();
}

}  // namespace

TEST_CASE("structured mutations: keys, offsets and fields with re-sealed checksums", "[fuzz][struct]") {
  // Root, space, catalog and filesystem trees with inner nodes.
  struct_runs(fuzz::fs_base(), struct_seed(), struct_runs_env(2000), "struct-fuzz", 10);
}

// The same on the image with compressed extents (fs_base_z): a fifth of the
// patches damage a frame (its stored bytes with the item's checksums
// re-sealed, its frame_bytes, its ram_blocks), the rest anything else.
TEST_CASE("structured mutations of an image with compressed extents", "[fuzz][struct][compress]") {
  const fuzz::NodeMap map = fuzz::map_nodes(fuzz::fs_base_z());
  REQUIRE(map.frames.size() >= 5);
  struct_runs(fuzz::fs_base_z(), struct_seed() + 4, struct_runs_env(2000) / 4, "struct-fuzz-z", 4);
}

namespace {

// A patched copy of the compressed image.
std::unique_ptr<MemDevice> patched_z(const std::vector<uint8_t>& input) {
  auto dev = fuzz::fs_base_z().clone();
  fuzz::apply_patches(*dev, input.data(), input.size());
  return dev;
}

// Reads `len` bytes at `off` of the default branch's file `name`: the
// error's code, 0 on success.
int read_code(MemDevice& dev, const char* name, uint64_t off, uint64_t len) {
  VolumeOptions ro;
  ro.read_only = true;
  ro.kinds = fs_kinds();
  auto vol = Volume::open(dev, ro);
  REQUIRE(vol.ok());
  auto tree = Filesystem::default_tree(**vol);
  REQUIRE(tree.ok());
  auto fs = Filesystem::open(**vol, *tree, true);
  REQUIRE(fs.ok());
  auto a = (*fs)->lookup((*fs)->root(), name);
  REQUIRE(a.ok());
  std::vector<std::byte> buf(len);
  auto r = (*fs)->read(a->ino, off, buf);
  return r ? 0 : r.error().code;
}

bool reports(const std::vector<Problem>& ps, const std::string& code) {
  for (const auto& p : ps)
    if (p.code == code) return true;
  return false;
}

std::string codes(const std::vector<Problem>& ps) {
  std::string s;
  for (const auto& p : ps) s += p.code + ": " + p.message + "\n";
  return s;
}

// The frame of file z's blocks 0-31 in the map.
size_t z_first_frame(const fuzz::NodeMap& map) {
  auto dev = fuzz::fs_base_z().clone();
  VolumeOptions ro;
  ro.read_only = true;
  ro.kinds = fs_kinds();
  auto vol = Volume::open(*dev, ro);
  REQUIRE(vol.ok());
  auto fs = Filesystem::open(**vol, *Filesystem::default_tree(**vol), true);
  REQUIRE(fs.ok());
  const uint64_t z = (*fs)->lookup((*fs)->root(), "z")->ino;
  for (size_t i = 0; i < map.frames.size(); i++)
    if (map.frames[i].ino == z && map.frames[i].file_blk == 0) return i;
  FAIL("no compressed frame at block 0 of z");
  return 0;
}

}  // namespace

// A frame damaged behind matching checksums (issue 25): the decoder must
// answer EIO, never crash, overflow or hand out the damage; fsck -c must
// report F7-data. The frame's stored bytes are damaged and the item's
// checksums of them recomputed, or the item's frame_bytes cut short, or its
// ram_blocks made larger than what the frame decodes to.
TEST_CASE("a damaged compressed frame whose checksums match reads as EIO and fsck -c reports F7-data",
          "[fuzz][compress]") {
  const fuzz::NodeMap map = fuzz::map_nodes(fuzz::fs_base_z());
  // z's two frames, split's two items of one frame, shared's, zdir/in's.
  REQUIRE(map.frames.size() >= 5);
  const size_t z = z_first_frame(map);
  const auto& f = map.frames[z];
  REQUIRE(f.ram_blocks == 32);
  REQUIRE(f.frame_bytes < f.disk_nblocks * 4096);
  {
    // The undamaged image reads and checks clean.
    auto dev = patched_z({});
    CHECK(read_code(*dev, "z", 0, 40 * 4096 + 300) == 0);
    const auto ps = check_filesystems(*dev, true);
    INFO(codes(ps));
    CHECK(ps.empty());
  }
  REQUIRE(f.disk_nblocks >= 2);  // so that a frame cut to its first stored blocks is short of its last
  struct Case {
    fuzz::FrameDamage kind;
    uint64_t variant;
    const char* what;
    const char* code;  // what fsck -c reports
  };
  const Case cases[] = {
      {fuzz::FrameDamage::Magic, 0, "the frame magic, checksum recomputed", "F7-data"},
      {fuzz::FrameDamage::Magic, 3, "the frame magic's last byte, checksum recomputed", "F7-data"},
      {fuzz::FrameDamage::ContentSize, 0, "the frame's content size, checksum recomputed", "F7-data"},
      {fuzz::FrameDamage::Tail, 0, "the frame's last byte, checksum recomputed", "F7-data"},
      {fuzz::FrameDamage::FrameBytes, 1, "frame_bytes one short: a truncated frame", "F7-data"},
      {fuzz::FrameDamage::FrameBytes, 2, "frame_bytes cut to one byte of its last block", "F7-data"},
      // Cut by half it no longer fits its stored blocks: the item is
      // malformed (decode_extent and fsck check the bounds before decoding).
      {fuzz::FrameDamage::FrameBytes, 0, "frame_bytes halved", "F4-extent"},
      {fuzz::FrameDamage::RamBlocks, 0, "ram_blocks one more than the frame decodes to", "F7-data"},
      {fuzz::FrameDamage::RamBlocks, 1, "ram_blocks the largest an item may say", "F7-data"},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> input;
    const std::string what = fuzz::append_frame_patch(input, map, z, c.kind, c.variant);
    INFO(c.what << ": " << what);
    auto dev = patched_z(input);
    // Every read that touches the frame, whole or a block of it; the
    // second frame of z and its plain tail still read.
    CHECK(read_code(*dev, "z", 0, 4096) == EIO);
    CHECK(read_code(*dev, "z", 31 * 4096 + 10, 100) == EIO);
    CHECK(read_code(*dev, "z", 32 * 4096, 8 * 4096 + 300) == 0);
    const auto ps = check_filesystems(*dev, true);
    INFO(codes(ps));
    CHECK(reports(ps, c.code));
    // Without -c the frame is not read: only an item the damage made
    // malformed is reported.
    CHECK(!reports(check_filesystems(*dev, false), "F7-data"));
  }
}

// Every kind of frame damage on every frame of the image, with several
// values each: the reads answer or fail with EIO (a malformed item:
// EUCLEAN), fsck -n, -y, -n behave as the fuzzer requires; nothing crashes
// (under ASan in tests/run: nothing reads or writes out of bounds).
TEST_CASE("every kind of frame damage, on every frame: EIO or data, never a crash", "[fuzz][compress]") {
  const fuzz::NodeMap map = fuzz::map_nodes(fuzz::fs_base_z());
  REQUIRE(!map.frames.empty());
  uint64_t eio = 0, runs = 0;
  for (int kind = 0; kind <= int(fuzz::FrameDamage::RamBlocks); kind++)
    for (uint64_t variant = 0; variant < 9; variant++) {
      std::vector<uint8_t> input;
      const size_t frame = size_t(variant + uint64_t(kind)) % map.frames.size();
      const std::string what = fuzz::append_frame_patch(input, map, frame, fuzz::FrameDamage(kind),
                                                        variant * 0x0101010101010101ull + variant);
      INFO(what << "\ninput (hex):\n" << hex(input));
      auto dev = patched_z(input);
      for (const char* name : {"z", "split", "shared"}) {
        const int code = read_code(*dev, name, 0, 256 << 10);
        CHECK((code == 0 || code == EIO || code == EUCLEAN));
        eio += code == EIO;
      }
      fuzz::run_one_fs(input.data(), input.size());  // traps on a broken repair
      runs++;
    }
  std::printf("[frame-damage] %llu images, %llu reads failed with EIO\n", (unsigned long long)runs,
              (unsigned long long)eio);
  CHECK(eio > runs / 2);
}

// Writes the compressed-image seeds of tests/fuzz/corpus-fs/ (hidden: run
// with PLYFS_CORPUS_OUT=dir struct_fuzz_tests "[.corpus]").
TEST_CASE("write the compressed-image seed corpus", "[.corpus]") {
  const char* out = std::getenv("PLYFS_CORPUS_OUT");
  REQUIRE(out);
  const fuzz::NodeMap map = fuzz::map_nodes(fuzz::fs_base_z());
  const size_t z = z_first_frame(map);
  const uint8_t select[8] = {0, 0, 0, 0, 0, 0, 0, fuzz::kUseZBase};
  auto write = [&](const char* name, const std::string& note, const std::vector<uint8_t>& in) {
    FILE* f = std::fopen((std::string(out) + "/" + name).c_str(), "w");
    REQUIRE(f);
    std::fprintf(f, "# %s\n%s", note.c_str(), hex(in).c_str());
    if (in.size() % 32) std::fprintf(f, "\n");
    std::fclose(f);
  };
  const std::vector<uint8_t> sel(select, select + 8);
  write("compressed.hex", "seed: the image with compressed extents (first patch's flags bit 2), undamaged", sel);
  const std::pair<const char*, fuzz::FrameDamage> seeds[] = {
      {"compressed-frame-magic.hex", fuzz::FrameDamage::Magic},
      {"compressed-frame-content-size.hex", fuzz::FrameDamage::ContentSize},
      {"compressed-frame-bytes.hex", fuzz::FrameDamage::FrameBytes},
      {"compressed-ram-blocks.hex", fuzz::FrameDamage::RamBlocks},
  };
  for (const auto& [name, kind] : seeds) {
    std::vector<uint8_t> in = sel;
    // frame_bytes one short (variant 1): a truncated frame that still fits.
    const std::string what = fuzz::append_frame_patch(in, map, z, kind, kind == fuzz::FrameDamage::FrameBytes);
    write(name, "seed (struct_fuzz_test.cpp, [.corpus]): " + what, in);
  }
}

// Writes the receive fuzzer's seeds (tests/fuzz/corpus-recv/; hidden: run
// with PLYFS_CORPUS_OUT=dir struct_fuzz_tests "[.corpus-recv]"). base.hex is
// what fuzz_receive's image holds: the seeds apply to it only together.
TEST_CASE("write the receive seed corpus", "[.corpus-recv]") {
  const char* out = std::getenv("PLYFS_CORPUS_OUT");
  REQUIRE(out);
  for (const auto& s : fuzz::recv_corpus()) {
    FILE* f = std::fopen((std::string(out) + "/" + s.name).c_str(), "w");
    REQUIRE(f);
    std::fprintf(f, "# %s\n%s", s.note.c_str(), hex(s.bytes).c_str());
    if (s.bytes.size() % 32) std::fprintf(f, "\n");
    std::fclose(f);
  }
}
