// An import is atomic (lib/io/io.h, I1): under the fault device
// (lib/blockdev/test_devices.h), an I/O error at the Nth write of an import
// that commits as it goes, from N = 1 up (doubling) until the import
// completes: after each failure the next open drops what it built, no branch
// of its name is left, and fsck is clean with every block accounted for.
// Also a directory source larger than the device: ENOSPC, and the free
// space the same afterwards.
#include <catch2/catch_test_macros.hpp>

#include "../random_seed.h"
#include "blockdev/test_devices.h"
#include "fsck/fsck.h"
#include "io/io.h"
#include "snap/snap.h"
#include "tree.h"
#include "union/view.h"

namespace plyfs::iotest {
namespace {

template <class T>
T must(Result<T> r) {
  INFO((r ? "" : r.error().message()));
  REQUIRE(r);
  return std::move(*r);
}
void must(Result<void> r) {
  INFO((r ? "" : r.error().message()));
  REQUIRE(r);
}

VolumeOptions opts() {
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.cache_bytes = 16u << 20;
  // Commits in the middle of the import: the doomed tree is on the device
  // when the fault comes.
  vo.dirty_limit_bytes = 256u << 10;
  return vo;
}

void check_clean(BlockDevice& dev) {
  FsckOptions fo;
  set_object_passes(fo, true);
  auto rep = must(fsck_run(dev, fo));
  for (const auto& p : rep.problems) {
    INFO(p.code << ": " << p.message);
    CHECK(p.fix == FixClass::Info);
  }
  CHECK(rep.exit_code == kFsckClean);
}

struct Src {
  std::string dir;
  explicit Src(uint64_t s) {
    char t[] = "/dev/shm/plyfs-io-atomic-XXXXXX";
    if (!::mkdtemp(t)) FAIL("mkdtemp");
    dir = t;
    TreeGen(dir + "/t", s, {.entries = 60, .big_bytes = 256u << 10}).make();
  }
  ~Src() { (void)std::system(("rm -rf '" + dir + "'").c_str()); }
};

TEST_CASE("import under I/O faults leaves no branch and a clean image", "[io-fault]") {
  const uint64_t s = plyfs::test::seed("io-fault");
  Src src(s);
  MemDevice base(128u << 20);
  must(format_filesystem(base, FormatOptions{}, FsCreateOptions{}));
  bool completed = false;
  for (uint64_t nth = 1; !completed; nth = nth < 8 ? nth + 1 : nth * 2) {
    INFO("EIO from write " << nth << " on");
    auto dev = base.clone();
    {
      FaultDevice f(*dev);
      f.add({.op = FaultDevice::Op::Write, .nth = nth, .sticky = true, .kind = FaultDevice::Kind::Eio});
      auto v = must(Volume::open(f, opts()));
      io::ImportOptions o;
      o.name = "imported";
      o.format = io::Format::Dir;
      auto r = io::import(*v, src.dir + "/t", o);
      completed = bool(r);
      if (!r) CHECK((r.error().code == EIO || r.error().code == EROFS));
    }
    // The next open: what the import built is gone (or whole).
    auto v = must(Volume::open(*dev, opts()));
    must(drop_doomed(*v));
    auto b = find_branch(*v, "imported");
    CHECK(bool(b) == completed);
    must(v->close());
    v.reset();
    check_clean(*dev);
    REQUIRE(nth < 1000000);
    if (completed) std::printf("import completed with a fault from write %llu on\n", (unsigned long long)nth);
  }
}

TEST_CASE("import of more than the device holds: ENOSPC, and every block back", "[io-fault]") {
  const uint64_t s = plyfs::test::seed("io-enospc-lib");
  Src src(s);
  MemDevice dev(16u << 20);
  must(format_filesystem(dev, FormatOptions{}, FsCreateOptions{}));
  auto v = must(Volume::open(dev, opts()));
  const uint64_t free_before = v->space_stats().free_blocks;
  // The source: 24 MiB of one file beside the tree.
  {
    std::string data(24u << 20, 'x');
    FILE* f = std::fopen((src.dir + "/t/big").c_str(), "w");
    REQUIRE(f);
    REQUIRE(std::fwrite(data.data(), 1, data.size(), f) == data.size());
    std::fclose(f);
  }
  io::ImportOptions o;
  o.name = "imported";
  auto r = io::import(*v, src.dir + "/t", o);
  REQUIRE(!r);
  CHECK(r.error().code == ENOSPC);
  CHECK(!find_branch(*v, "imported"));
  (void)must(v->commit());
  (void)must(v->commit());  // what the drop freed is reusable once durable
  CHECK(v->space_stats().free_blocks == free_before);
  must(v->close());
  v.reset();
  check_clean(dev);
}

}  // namespace
}  // namespace plyfs::iotest

namespace plyfs::iotest {
namespace {

// mkfs -d's replace (ImportOptions::replace) must not doom a held branch:
// a hold protects a branch from every deletion (format.md#snapshots,
// "Holds"). Refused with EBUSY; the branch keeps its tree and its content,
// nothing the import built is left; released, the same import replaces it.
TEST_CASE("an import that would replace a held branch is refused, and the branch kept", "[io-fault]") {
  Src src(plyfs::test::seed("io-replace-held"));
  MemDevice dev(64u << 20);
  must(format_filesystem(dev, FormatOptions{}, FsCreateOptions{}));
  auto v = must(Volume::open(dev, opts()));
  const TreeId main = must(find_branch(*v, "main")).tree;
  (void)must(set_held(*v, main, true));
  io::ImportOptions o;
  o.name = "main";
  o.format = io::Format::Dir;
  o.replace = true;
  auto r = io::import(*v, src.dir + "/t", o);
  REQUIRE(!r);
  CHECK(r.error().code == EBUSY);
  must(drop_doomed(*v));
  const BranchMeta kept = must(find_branch(*v, "main"));
  CHECK(kept.tree == main);
  CHECK(kept.held);
  CHECK(must(Filesystem::branches(*v)).size() == 1);  // nothing the import built is left
  (void)must(set_held(*v, main, false));
  auto again = must(io::import(*v, src.dir + "/t", o));
  CHECK(must(find_branch(*v, "main")).tree != main);
  must(v->close());
  v.reset();
  check_clean(dev);
}

}  // namespace
}  // namespace plyfs::iotest
