// An image with one filesystem branch in memory, opened read-write: what
// the library tests of branches, holds and quotas start from.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "fs/fs.h"
#include "test_util.h"

namespace plyfs::test {

// A volume with filesystem trees on `dev`, opened read-write.
inline std::unique_ptr<Volume> open_fs_volume(BlockDevice& dev) {
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.movers = fs_movers();
  return must(Volume::open(dev, vo));
}

struct FsImage {
  std::unique_ptr<MemDevice> dev;
  std::unique_ptr<Volume> vol;
  TreeId main;  // the branch mkfs makes

  explicit FsImage(uint64_t bytes = 64ull << 20) : dev(std::make_unique<MemDevice>(bytes)) {
    must(format_filesystem(*dev, FormatOptions{}, FsCreateOptions{}));
    open();
    main = must(Filesystem::default_tree(*vol));
  }
  void open() { vol = open_fs_volume(*dev); }
  // Commits, closes and opens again, as an unmount and a mount would.
  void reopen() {
    must(vol->close());
    vol.reset();
    open();
  }
};

// Files in a branch's root directory by name, with their content.
using Files = std::map<std::string, std::vector<std::byte>>;

// Each of `files` is in the root of `tree`, with exactly that content.
inline void check_files(Volume& vol, TreeId tree, const Files& files) {
  auto fs = must(Filesystem::open(vol, tree, true));
  for (const auto& [name, data] : files) {
    INFO(name);
    auto a = must(fs->lookup(fs->root(), name));
    REQUIRE(a.size == data.size());
    std::vector<std::byte> got(data.size());
    REQUIRE(must(fs->read(a.ino, 0, got)) == data.size());
    REQUIRE(got == data);
  }
}

}  // namespace plyfs::test
