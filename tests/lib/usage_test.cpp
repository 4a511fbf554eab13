// Space accounting (snap/usage.h, format.md#accounting): referenced and
// exclusive bytes of branches through a known history, each figure checked
// against what the image's free space does when the branch goes.
#include "fs/fs.h"
#include "snap/snap.h"
#include "snap/usage.h"
#include "usage_check.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

constexpr uint64_t kMiB = 1 << 20;

std::vector<std::byte> pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i++) v[i] = std::byte(uint8_t(i * 131 + seed + i / 4096));
  return v;
}

// Free blocks once everything freed so far is allocatable again (A2).
uint64_t settled_free(Volume& v) {
  must(v.commit());
  must(v.commit());
  return v.space_stats().free_blocks;
}

// A new filesystem on `dev`, opened.
std::unique_ptr<Volume> fresh_fs(MemDevice& dev) {
  must(format_filesystem(dev, FormatOptions{}, FsCreateOptions{}));
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  return must(Volume::open(dev, vo));
}

}  // namespace

TEST_CASE("usage: referenced and exclusive bytes follow snapshots, overwrites and deletes", "[snap][usage]") {
  MemDevice dev(256 * kMiB);
  auto vol = fresh_fs(dev);
  const TreeId main = must(Filesystem::default_tree(*vol));
  auto fs = must(Filesystem::open(*vol, main));
  const uint64_t f = must(fs->mknod(fs->root(), "f", S_IFREG | 0644, 0, 0, 0)).ino;
  must(fs->write(f, 0, pattern(4 * kMiB, 1)));
  must(vol->commit());

  BranchSpace m = must(branch_space(*vol, main));
  CHECK(m.referenced.data == 4 * kMiB);  // one extent of 1024 blocks
  CHECK(m.exclusive.data == 4 * kMiB);
  CHECK(m.referenced.metadata > 0);
  CHECK(m.exclusive.metadata == m.referenced.metadata);

  // A snapshot shares all data. Each branch holds alone only the path to
  // its own FsInfo (the snapshot's name and flags are its own): a root and
  // a leaf each.
  const TreeId s1 = must(snapshot(*vol, main, "s1")).frozen.tree;
  m = must(branch_space(*vol, main));
  BranchSpace s = must(branch_space(*vol, s1));
  CHECK(m.referenced.data == 4 * kMiB);
  CHECK(s.referenced == m.referenced);
  CHECK(m.exclusive.data == 0);
  CHECK(s.exclusive.data == 0);
  CHECK(m.exclusive.metadata <= 2 * 4096);
  CHECK(s.exclusive.metadata <= 2 * 4096);

  // 1 MiB overwritten in main: main holds the new MiB alone; the old
  // extent is still main's too (three quarters of it are mapped), so the
  // snapshot holds nothing alone but the tree nodes main copied.
  must(fs->write(f, kMiB, pattern(kMiB, 2)));
  m = must(branch_space(*vol, main));
  s = must(branch_space(*vol, s1));
  CHECK(m.referenced.data == 5 * kMiB);
  CHECK(m.exclusive.data == kMiB);
  CHECK(s.referenced.data == 4 * kMiB);
  CHECK(s.exclusive.data == 0);
  CHECK(s.exclusive.metadata > 0);

  // The file deleted in main: the snapshot alone holds the old extent.
  must(fs->unlink(fs->root(), "f"));
  must(vol->commit());
  m = must(branch_space(*vol, main));
  s = must(branch_space(*vol, s1));
  CHECK(m.referenced.data == 0);
  CHECK(s.exclusive.data == 4 * kMiB);
  check_accounting(*vol);

  // Deleting the snapshot gives back exactly its exclusive bytes: the free
  // space grows by them, give or take the catalog's and root tree's
  // own nodes (a few blocks), and the drop reports them exactly.
  const uint64_t free_before = settled_free(*vol);
  delete_checked(*vol, s1, [&](auto progress) { must(delete_branch(*vol, s1, progress)); });
  const uint64_t gained = (settled_free(*vol) - free_before) * vol->block_size();
  CHECK(gained >= s.exclusive.total() - 8 * 4096);
  CHECK(gained <= s.exclusive.total() + 8 * 4096);
  fs.reset();
  must(vol->close());
}

TEST_CASE("usage: a clone's exclusive bytes match a brute-force count and its delete", "[snap][usage]") {
  MemDevice dev(256 * kMiB);
  auto vol = fresh_fs(dev);
  const TreeId main = must(Filesystem::default_tree(*vol));
  const uint64_t s = seed("usage");
  std::mt19937_64 rng(s);
  INFO("seed " << s);
  std::vector<TreeId> clones;
  auto fs = must(Filesystem::open(*vol, main));
  for (int round = 0; round < 12; round++) {
    INFO("round " << round);
    for (int i = 0; i < 20; i++) {
      const std::string name = "f" + std::to_string(rng() % 30);
      auto a = fs->lookup(fs->root(), name);
      if (a && rng() % 4 == 0) {
        must(fs->unlink(fs->root(), name));
        continue;
      }
      const uint64_t ino = a ? a->ino : must(fs->mknod(fs->root(), name, S_IFREG | 0644, 0, 0, 0)).ino;
      must(fs->write(ino, (rng() % 64) * 4096, pattern((1 + rng() % 80) * 1000, uint8_t(rng()))));
    }
    if (rng() % 3) must(vol->commit());
    if (rng() % 2) clones.push_back(must(clone_branch(*vol, main, "c" + std::to_string(round), rng() % 2)).tree);
    check_accounting(*vol);
    if (!clones.empty() && rng() % 3 == 0) {
      const size_t k = rng() % clones.size();
      const TreeId c = clones[k];
      delete_checked(*vol, c, [&](auto progress) { must(delete_branch(*vol, c, progress)); });
      clones.erase(clones.begin() + long(k));
    }
  }
  fs.reset();
  must(vol->close());
}
