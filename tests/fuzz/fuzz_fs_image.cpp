// The filesystem image fuzzer (issue 5): the same patches as fuzz_image.cpp,
// applied to an image of filesystem trees (directories, inline and extent
// files, hard links, a symlink, xattrs, one of them out of line, a layer
// with a whiteout and an opaque directory, a clone, a view), so that
// mutations reach the filesystem layer, the union's readers and fsck's
// passes 5-6 with their repairs (the walk-fed object checks, their worker
// threads, lost+found, holes for bad data).
// Nothing may crash, hang or leak; an image fsck -y says it corrected must
// check clean after, with the object passes.
// An input whose first patch has flags bit 2 (kUseZBase) patches a second
// image instead, whose files hold compressed extents (fs_base_z), so that
// damaged items and frames reach the frame decoder (Filesystem::frame,
// decompress_frame) and fsck -c's decoding.
#include <linux/fs.h>
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

// Text that compresses (the incompressibility test lets it through).
std::vector<std::byte> words(size_t n, int seed) {
  static const char* const vocab[] = {"plyfs ", "frame ", "zstd ", "block ", "extent ", "the ", "of ", "a\n"};
  std::vector<std::byte> v;
  uint64_t x = uint64_t(seed) * 0x9e3779b97f4a7c15ull + 1;
  while (v.size() < n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    for (const char* c = vocab[x >> 61]; *c; c++) v.push_back(std::byte(*c));
  }
  v.resize(n);
  return v;
}

// Compressed extents of every shape (format.md#fs-compress): "z", two frames
// (file blocks 0-31 and 32-39) and a plain partial block; "split", one frame
// whose middle a plain block replaced (two items, one with an offset);
// "shared", a part of z's first frame (copy_range: an item at offset 4);
// "zdir", a +c directory with a compressed file in it; an empty layer over
// it all in a view.
std::unique_ptr<MemDevice> build_fs_base_z() {
  auto dev = std::make_unique<MemDevice>(8ull << 20);
  FormatOptions fo;
  fo.uuid = {0x5a, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
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
    auto file = [&](uint64_t dir, const char* name) {
      auto a = f.mknod(dir, name, S_IFREG | 0644, 0, 0, 0);
      if (!a || !f.set_fsflags(a->ino, FS_COMPR_FL)) __builtin_trap();
      return a->ino;
    };
    const uint64_t z = file(root, "z");
    if (!f.write(z, 0, words(40 * 4096 + 300, 1))) __builtin_trap();
    const uint64_t split = file(root, "split");
    if (!f.write(split, 0, words(16 * 4096, 2)) || !f.write(split, 6 * 4096 + 10, fill(100, 3))) __builtin_trap();
    const uint64_t shared = file(root, "shared");
    if (!f.copy_range(z, 4 * 4096, shared, 0, 8 * 4096)) __builtin_trap();
    auto dir = f.mkdir(root, "zdir", 0755, 0, 0);
    if (!dir || !f.set_fsflags(dir->ino, FS_COMPR_FL)) __builtin_trap();
    auto in = f.mknod(dir->ino, "in", S_IFREG | 0644, 0, 0, 0);
    if (!in || !f.write(in->ino, 0, words(5 * 4096, 4))) __builtin_trap();
  }
  FsCreateOptions lo;
  lo.name = "top";
  lo.parent = *base;
  auto layer = Filesystem::create(**vol, lo);
  if (!layer) __builtin_trap();
  (void)put_view(**vol, View{"v", true, {{*layer, true}, {*base, false}}});
  if (!(*vol)->close()) __builtin_trap();
  return dev;
}

}  // namespace

const MemDevice& fs_base_z() {
  static const std::unique_ptr<MemDevice> base = build_fs_base_z();
  return *base;
}

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
          // Up to 256 KiB: past the first frames of a compressed file
          // (32 blocks each); and a small read in the middle, through the
          // frame cache.
          std::vector<std::byte> buf(std::min<uint64_t>(a->size, 256 << 10));
          (void)(*fs)->read(a->ino, 0, buf);
          if (a->size > 8192) (void)(*fs)->read(a->ino, a->size / 2, std::span(buf).first(100));
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
  auto dev = (uses_z_base(data, size) ? fs_base_z() : fs_base()).clone();
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
  return plyfs::fuzz::custom_mutate(plyfs::fuzz::fs_base(), data, size, max_size, seed, LLVMFuzzerMutate,
                                    &plyfs::fuzz::fs_base_z());
}
#endif
