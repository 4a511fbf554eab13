// The filesystem image fuzzer (issue 5): the same patches as fuzz_image.cpp,
// applied to an image of filesystem trees (directories, inline and extent
// files, hard links, a symlink, xattrs, one of them out of line, a layer
// with a whiteout and an opaque directory, a clone, a view), so that
// mutations reach the filesystem layer, the union's readers and fsck's
// passes 5-6 with their repairs (the walk-fed object checks, their worker
// threads, lost+found, holes for bad data).
// Nothing may crash, hang or leak; an image fsck -y says it corrected must
// check clean after, with the object passes.
#include <sys/stat.h>

#include <cstring>
#include <set>

#include "blockdev/test_devices.h"
#include "fs/check.h"
#include "fs/fs.h"
#include "fsck/fsck.h"
#include "fuzz_image.h"
#include "snap/snap.h"
#include "union/view.h"

namespace plyfs::fuzz {

namespace {

std::vector<std::byte> fill(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i++) v[i] = std::byte((i * 13 + seed) & 0xff);
  return v;
}

std::unique_ptr<MemDevice> build_fs_base() {
  auto dev = std::make_unique<MemDevice>(8ull << 20);
  FormatOptions fo;
  fo.uuid = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
  fo.time_ns = 1;
  if (!format_filesystem(*dev, fo, FsCreateOptions{})) __builtin_trap();
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  auto vol = Volume::open(*dev, vo);
  if (!vol) __builtin_trap();
  auto base = Filesystem::default_tree(**vol);
  if (!base) __builtin_trap();
  {
    auto fs = Filesystem::open(**vol, *base);
    if (!fs) __builtin_trap();
    auto& f = **fs;
    const uint64_t root = f.root();
    auto dir = f.mkdir(root, "dir", 0755, 0, 0);
    if (!dir) __builtin_trap();
    for (int i = 0; i < 60; i++) (void)f.mknod(dir->ino, "f" + std::to_string(i), S_IFREG | 0644, 0, 0, 0);
    auto small = f.mknod(root, "small", S_IFREG | 0644, 0, 0, 0);
    auto big = f.mknod(dir->ino, "big", S_IFREG | 0644, 0, 0, 0);
    if (!small || !big) __builtin_trap();
    (void)f.write(small->ino, 0, fill(700, 1));
    (void)f.write(big->ino, 0, fill(3 * 4096 + 10, 2));
    (void)f.link(small->ino, dir->ino, "hard");
    (void)f.setxattr(small->ino, "user.k", fill(40, 3), 0);
    // Out of line (format.md#fs-xattr): 5 chunks, so that mutations reach
    // the chunk decoding and fsck's F9 checks.
    (void)f.setxattr(big->ino, "user.big", fill(4500, 5), 0);
    (void)f.symlink(root, "sym", "dir/big", 0, 0);
  }
  FsCreateOptions lo;
  lo.name = "top";
  lo.parent = *base;
  auto layer = Filesystem::create(**vol, lo);
  if (!layer) __builtin_trap();
  {
    auto fs = Filesystem::open(**vol, *layer);
    if (!fs) __builtin_trap();
    (void)(*fs)->whiteout((*fs)->root(), "small");
    auto o = (*fs)->mkdir((*fs)->root(), "dir", 0755, 0, 0);
    if (!o) __builtin_trap();
    SetAttr s;
    s.opaque = true;
    (void)(*fs)->setattr(o->ino, s);
    auto n = (*fs)->mknod(o->ino, "new", S_IFREG | 0644, 0, 0, 0);
    if (n) (void)(*fs)->write(n->ino, 0, fill(5000, 4));
  }
  (void)clone_branch(**vol, *base, "copy", false);
  (void)put_view(**vol, View{"v", true, {{*layer, true}, {*base, false}}});
  if (!(*vol)->close()) __builtin_trap();
  return dev;
}

}  // namespace

// Reads everything a mount could: every name, attribute, xattr, link and
// byte of every branch (bounded, a damaged tree may hold cycles).
void read_all_fs(Volume& vol) {
  auto bs = Filesystem::branches(vol);
  if (!bs) return;
  for (const auto& b : *bs) {
    auto fs = Filesystem::open(vol, b.tree, true);
    if (!fs) continue;
    std::set<uint64_t> seen;
    std::vector<uint64_t> todo{(*fs)->root()};
    while (!todo.empty() && seen.size() < 500) {
      const uint64_t dir = todo.back();
      todo.pop_back();
      if (!seen.insert(dir).second) continue;
      std::vector<std::string> names;
      (void)(*fs)->readdir(dir, 0, [&](const DirEntry& e) {
        if (e.name != "." && e.name != "..") names.emplace_back(e.name);
        return names.size() < 500;
      });
      for (const auto& name : names) {
        auto a = (*fs)->lookup(dir, name);
        if (!a) continue;
        (void)(*fs)->listxattr(a->ino);
        (void)(*fs)->getxattr(a->ino, "user.k");
        (void)(*fs)->getxattr(a->ino, "user.big");
        if (S_ISDIR(a->mode)) todo.push_back(a->ino);
        else if (S_ISLNK(a->mode)) (void)(*fs)->readlink(a->ino);
        else if (S_ISREG(a->mode)) {
          std::vector<std::byte> buf(std::min<uint64_t>(a->size, 64 << 10));
          (void)(*fs)->read(a->ino, 0, buf);
          (void)(*fs)->lseek(a->ino, 0, SEEK_DATA);
        }
      }
    }
  }
  (void)list_views(vol);
}

const MemDevice& fs_base() {
  static const std::unique_ptr<MemDevice> base = build_fs_base();
  return *base;
}

void run_one_fs(const uint8_t* data, size_t size) {
  auto dev = fs_base().clone();
  apply_patches(*dev, data, size);
  VolumeOptions ro;
  ro.read_only = true;
  ro.kinds = fs_kinds();
  ro.cache_bytes = 1 << 20;
  if (auto vol = Volume::open(*dev, ro)) read_all_fs(**vol);
  FsckOptions fo;
  set_object_passes(fo, true);
  fsck_cycle(*dev, fo);
}

}  // namespace plyfs::fuzz

#ifdef PLYFS_LIBFUZZER_FS
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  plyfs::fuzz::run_one_fs(data, size);
  return 0;
}
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return plyfs::fuzz::custom_mutate(plyfs::fuzz::fs_base(), data, size, max_size, seed, LLVMFuzzerMutate);
}
#endif
