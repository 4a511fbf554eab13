// Keys damaged where they lie in their leaves, with the leaf's checksum
// recomputed (issue 21): the B-tree walk meets the items out of order, and
// the filesystem pass (fed by the walk, or scanning a tree on its own) must
// report, never crash. The reproducer was a leaf's last key raised far past
// every inode (0x10000000000001fb): the checker's table of inodes, kept
// sorted on the promise of an ordered scan, was searched for a number it
// held out of place and a null entry was dereferenced.
#include <sys/stat.h>

#include <set>

#include "../lib/test_util.h"
#include "fs/check.h"
#include "fs/corrupt_fs.h"
#include "fs/fs.h"
#include "fsck/fsck.h"
#include "union/view.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

struct Image {
  std::unique_ptr<MemDevice> dev;
  TreeId base;
  std::vector<uint64_t> inos;  // every object of the tree, root included
};

// Enough objects for a tree of a dozen leaves: directories, small and large
// files, a hard link, a symlink, xattrs (one out of line), committed twice so
// that the older generation holds the same leaves (fsck -y cannot fall back
// to it and rebuilds the tree, as on the reproducer).
const Image& image() {
  static Image img = [] {
    Image im;
    im.dev = std::make_unique<MemDevice>(32 << 20);
    must(format_filesystem(*im.dev, FormatOptions{}, FsCreateOptions{}));
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    auto vol = must(Volume::open(*im.dev, vo));
    im.base = must(Filesystem::default_tree(*vol));
    {
      auto fs = must(Filesystem::open(*vol, im.base));
      const uint64_t root = fs->root();
      im.inos.push_back(root);
      const uint64_t dir = must(fs->mkdir(root, "dir", 0755, 0, 0)).ino;
      im.inos.push_back(dir);
      for (int i = 0; i < 150; i++) {
        auto f = must(fs->mknod(dir, "f" + std::to_string(i), S_IFREG | 0644, 0, 0, 0));
        must(fs->write(f.ino, 0, bytes("file " + std::to_string(i))));
        im.inos.push_back(f.ino);
      }
      auto big = must(fs->mknod(root, "big", S_IFREG | 0644, 0, 0, 0));
      must(fs->write(big.ino, 0, std::vector<std::byte>(20000, std::byte{7})));
      must(fs->setxattr(big.ino, "user.large", std::vector<std::byte>(3000, std::byte{'a'}), 0));
      must(fs->setxattr(im.inos[5], "user.small", bytes("hello"), 0));
      must(fs->link(im.inos[3], root, "hard"));
      im.inos.push_back(big.ino);
      im.inos.push_back(must(fs->symlink(root, "sym", "dir/f1", 0, 0)).ino);
    }
    must(vol->commit());
    {
      auto fs = must(Filesystem::open(*vol, im.base));
      must(fs->mknod(fs->root(), "late", S_IFREG | 0644, 0, 0, 0));
    }
    must(vol->close());
    return im;
  }();
  return img;
}

FsckReport fsck(BlockDevice& dev, FsckMode mode, bool fed = true) {
  FsckOptions fo;
  set_object_passes(fo, false);
  if (!fed) fo.object_feed = nullptr;
  fo.mode = mode;
  return must(fsck_run(dev, fo));
}

bool has(const FsckReport& r, const std::string& code) {
  for (const auto& p : r.problems)
    if (p.code == code) return true;
  return false;
}

std::string describe(const FsckReport& r) {
  std::string s;
  for (const auto& p : r.problems) s += p.code + " tree " + std::to_string(p.tree) + ": " + p.message + "\n";
  for (const auto& a : r.actions) s += "action: " + a + "\n";
  return s;
}

// Damages `field` of the leaf holding `ino`'s inode item; false when the
// damage changed nothing.
bool damage(MemDevice& dev, TreeId tree, uint64_t ino, const std::string& field, const CorruptAction& a,
            std::string* what) {
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  auto vol = must(Volume::open(dev, vo));
  FsTarget t;
  t.what = FsStruct::Inode;
  t.tree = tree;
  t.ino = ino;
  t.field = field;
  t.dev = &dev;
  auto r = corrupt_fs(*vol, t, a);
  if (!r && r.error().code == EINVAL) return false;  // a bit past a 4-byte field
  *what = must(std::move(r));
  // "...: BEFORE -> AFTER"
  const size_t arrow = what->rfind(" -> "), colon = what->rfind(": ", arrow);
  REQUIRE((arrow != std::string::npos && colon != std::string::npos));
  return what->substr(colon + 2, arrow - colon - 2) != what->substr(arrow + 4);
}

}  // namespace

TEST_CASE("fsck keys: a leaf's last key far past every inode (the reproducer of issue 21)", "[fsck][keys]") {
  const Image& im = image();
  std::set<std::string> leaves;  // one damage per leaf: the leaf the description names
  size_t runs = 0, out_of_order = 0;
  for (uint64_t ino : im.inos) {
    auto dev = im.dev->clone();
    std::string what;
    REQUIRE(damage(*dev, im.base, ino, "leaf.last.key.hi", CorruptAction{Damage::Set, 0x10000000000001fbull, 0, true},
                   &what));
    const std::string leaf = what.substr(what.find(" of leaf "), what.find(',', what.find(" of leaf ")) -
                                                                   what.find(" of leaf "));
    if (!leaves.insert(leaf).second) continue;
    INFO(what);
    runs++;
    // The checker on its own, scanning the tree as the volume reads it (no
    // walk): the items come out of order.
    {
      auto ps = check_filesystems(*dev);
      CHECK(!ps.empty());
    }
    auto n = fsck(*dev, FsckMode::Check);
    INFO("-n:\n" << describe(n));
    CHECK(n.exit_code == kFsckUncorrected);
    // The last leaf's last key may grow: the tree stays ordered, and the
    // filesystem pass reports the number (F8-ino).
    if (has(n, "T1-key-order")) out_of_order++;
    else CHECK(has(n, "F8-ino"));
    CHECK(describe(fsck(*dev, FsckMode::Check, false)) == describe(n));
    auto y = fsck(*dev, FsckMode::Yes);
    INFO("-y:\n" << describe(y));
    CHECK(y.exit_code == kFsckCorrected);
    auto after = fsck(*dev, FsckMode::Check);
    INFO("after:\n" << describe(after));
    CHECK(after.exit_code == kFsckClean);
  }
  CHECK(out_of_order >= 5);  // a tree of several leaves
}

TEST_CASE("fsck keys: every key field of a leaf's first, middle and last item", "[fsck][keys]") {
  const Image& im = image();
  const std::vector<CorruptAction> damages{
      {Damage::Set, 0x10000000000001fbull, 0, true}, {Damage::Set, 0, 0, true},      {Damage::Set, ~0ull, 0, true},
      {Damage::Add, 1, 0, true},                     {Damage::Flip, 0, 62, true},    {Damage::Flip, 0, 56, true}};
  size_t runs = 0, reported = 0;
  for (const char* field : {"leaf.key.hi", "leaf.key.lo", "leaf.first.key.hi", "leaf.first.key.lo",
                            "leaf.last.key.hi", "leaf.last.key.lo", "leaf.value_offset", "leaf.value_len"})
    for (size_t at : {size_t(0), im.inos.size() / 3, im.inos.size() - 1})
      for (const auto& a : damages) {
        auto dev = im.dev->clone();
        std::string what;
        if (!damage(*dev, im.base, im.inos[at], field, a, &what)) continue;
        INFO(what);
        runs++;
        (void)check_filesystems(*dev);  // must not crash, whatever it finds
        auto n = fsck(*dev, FsckMode::Check);
        INFO("-n:\n" << describe(n));
        CHECK((n.exit_code == kFsckClean || n.exit_code == kFsckUncorrected));
        if (n.exit_code == kFsckUncorrected) reported++;
        auto y = fsck(*dev, FsckMode::Yes);
        INFO("-y:\n" << describe(y));
        CHECK((y.exit_code == kFsckClean || y.exit_code == kFsckCorrected || y.exit_code == kFsckUncorrected));
        auto after = fsck(*dev, FsckMode::Check);
        INFO("after:\n" << describe(after));
        if (y.exit_code != kFsckUncorrected) CHECK(after.exit_code == kFsckClean);
      }
  CHECK(runs > 100);
  CHECK(reported > runs / 2);
}
