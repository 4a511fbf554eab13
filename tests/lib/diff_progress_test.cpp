// The progress a diff reports (snap.h DiffStats; BTree::diff's share of the
// trees compared): the fraction a progress line turns into a percentage and
// an ETA must rise from 0 to 1 as the diff goes, between clones (a B-tree
// walk that skips shared subtrees) and between a layer and the view below
// it (a walk of directories).
#include <sys/stat.h>

#include <algorithm>
#include <cmath>

#include "fs/fs.h"
#include "snap/snap.h"
#include "union/view.h"
#include "test_util.h"

namespace plyfs::test {
namespace {

struct Img {
  std::unique_ptr<MemDevice> dev = std::make_unique<MemDevice>(256ull << 20);
  std::unique_ptr<Volume> vol;
  Img() {
    must(format_filesystem(*dev, FormatOptions{}, FsCreateOptions{}));
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    vol = must(Volume::open(*dev, vo));
  }
};

// `dirs` directories of `files` files each, under the root of `fs`.
void fill(Filesystem& fs, int dirs, int files, const std::string& tag) {
  const std::vector<std::byte> data(100, std::byte('x'));
  for (int d = 0; d < dirs; d++) {
    const uint64_t dir = must(fs.mkdir(fs.root(), tag + std::to_string(d), 0755, 0, 0)).ino;
    for (int f = 0; f < files; f++) {
      const uint64_t ino = must(fs.mknod(dir, "f" + std::to_string(f), S_IFREG | 0644, 0, 0, 0)).ino;
      must(fs.write(ino, 0, data));
    }
  }
}

// What a diff said as it went: rising, and 1 with the whole count at the end.
void check_reports(const std::vector<DiffStats>& seen, size_t entries) {
  REQUIRE(seen.size() > 3);
  size_t between = 0;
  for (size_t i = 0; i < seen.size(); i++) {
    INFO("report " << i << " of " << seen.size() << ": fraction " << seen[i].fraction << ", "
                   << seen[i].entries << " entries");
    CHECK(seen[i].fraction >= 0.0);
    CHECK(seen[i].fraction <= 1.0);
    if (i) {
      CHECK(seen[i].fraction >= seen[i - 1].fraction);
      CHECK(seen[i].entries >= seen[i - 1].entries);
    }
    between += seen[i].fraction > 0.0 && seen[i].fraction < 1.0;
  }
  // Not a jump from 0 to 1 at the end: the share grows along the walk.
  CHECK(between >= 3);
  CHECK(seen.back().fraction == 1.0);
  CHECK(seen.back().entries == entries);
}

TEST_CASE("snap: a diff between clones reports a share of the trees rising to 1", "[snap]") {
  Img im;
  const TreeId main = must(Filesystem::default_tree(*im.vol));
  {
    auto fs = must(Filesystem::open(*im.vol, main));
    fill(*fs, 40, 100, "d");
    must(fs->release_all());
  }
  must(im.vol->commit());
  const BranchMeta c = must(clone_branch(*im.vol, main, "c", false));
  {
    // Changes spread over the tree: one file of every directory written,
    // one removed, and a directory of new files.
    auto fs = must(Filesystem::open(*im.vol, c.tree));
    const std::vector<std::byte> more(10, std::byte('y'));
    for (int d = 0; d < 40; d++) {
      const uint64_t dir = must(fs->lookup(fs->root(), "d" + std::to_string(d))).ino;
      must(fs->write(must(fs->lookup(dir, "f7")).ino, 100, more));
      must(fs->unlink(dir, "f9"));
    }
    fill(*fs, 1, 50, "new");
    must(fs->release_all());
  }
  must(im.vol->commit());
  std::vector<DiffStats> seen;
  auto d = must(diff(*im.vol, main, c.tree, [&](const DiffStats& st) { seen.push_back(st); }));
  // M f7, - f9 and M of each directory; M /, + new0 and its files.
  CHECK(d.size() == 3 * 40 + 1 + 1 + 50);
  check_reports(seen, d.size());
  // The walk is the first half: some reports come from it, before any
  // change was named.
  CHECK(std::any_of(seen.begin(), seen.end(), [](const DiffStats& s) { return s.fraction > 0 && s.fraction < 0.5; }));
  // Two clones with no change: nothing to walk, and still a last word.
  seen.clear();
  const BranchMeta same = must(clone_branch(*im.vol, main, "same", false));
  CHECK(must(diff(*im.vol, main, same.tree, [&](const DiffStats& st) { seen.push_back(st); })).empty());
  REQUIRE(!seen.empty());
  CHECK(seen.back().fraction == 1.0);
}

TEST_CASE("snap: a diff of a layer reports a share of its directories rising to 1", "[snap]") {
  Img im;
  const TreeId main = must(Filesystem::default_tree(*im.vol));
  {
    auto fs = must(Filesystem::open(*im.vol, main));
    fill(*fs, 4, 10, "base");
    must(fs->release_all());
  }
  const BranchMeta l = must(create_layer(*im.vol, "work", main, false));
  {
    auto fs = must(Filesystem::open(*im.vol, l.tree));
    fill(*fs, 30, 60, "w");
    must(fs->release_all());
  }
  must(im.vol->commit());
  std::vector<DiffStats> seen;
  auto d = must(diff(*im.vol, main, l.tree, [&](const DiffStats& st) { seen.push_back(st); }));
  CHECK(d.size() == 30 + 30 * 60);
  check_reports(seen, d.size());
  // Each of the 30 directories weighs a 30th: the share follows the walk.
  size_t near = 0;
  for (const auto& s : seen)
    if (s.entries > 0 && s.entries < d.size())
      near += std::abs(s.fraction - double(s.entries) / double(d.size())) < 0.1;
  CHECK(near > 0);
}

}  // namespace
}  // namespace plyfs::test
