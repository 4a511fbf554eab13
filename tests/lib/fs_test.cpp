// The filesystem-object layer (lib/fs) on an in-memory device: objects,
// inline and extent data, reflinks, orphans across crashes, checksums, and a
// model-based random test with power cuts at random points.
#include <dirent.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include <set>

#include <catch2/generators/catch_generators.hpp>

#include "commit/superblock.h"
#include "fs/check.h"
#include "fs/disk_fs.h"
#include "fs/fs.h"
#include "fs/items.h"
#include "fsck/fsck.h"
#include "test_util.h"
#include "util/checksum.h"

namespace plyfs::test {
namespace {

struct Mounted {
  std::unique_ptr<Volume> vol;
  std::unique_ptr<Filesystem> fs;
};

VerifyOptions fs_verify() {
  VerifyOptions vo;
  vo.kinds = fs_kinds();
  return vo;
}

// B-trees and space (verify_image), then the filesystem objects (F1-F6).
void require_fs_clean(BlockDevice& dev) {
  require_clean(dev, fs_verify());
  auto ps = check_filesystems(dev);
  for (const auto& p : ps) INFO(p.code << ": " << p.message);
  REQUIRE(ps.empty());
}

std::unique_ptr<MemDevice> fs_device(uint64_t size = 256ull << 20) {
  auto dev = std::make_unique<MemDevice>(size);
  FormatOptions fo;
  must(format_filesystem(*dev, fo, FsCreateOptions{}));
  return dev;
}

// What mount() sets as the mount's compression: the model test runs once
// plain and once with compress-force (format.md#fs-compress).
Compression g_compress;
struct CompressAll {
  explicit CompressAll(bool on) {
    if (on) g_compress = Compression{Compression::Mode::Zstd, 1, true};
  }
  ~CompressAll() { g_compress = Compression{}; }
};

Mounted mount(BlockDevice& dev, bool ro = false) {
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.read_only = ro;
  Mounted m;
  m.vol = must(Volume::open(dev, vo));
  m.vol->extension<MountCompression>().set(g_compress);
  m.fs = must(Filesystem::open(*m.vol, must(Filesystem::default_tree(*m.vol))));
  return m;
}

void unmount(Mounted& m) {
  must(m.fs->release_all());
  m.fs.reset();
  must(m.vol->close());
  m.vol.reset();
}

// The blocks in use on an unmounted filesystem, as a mount sees them.
uint64_t used_blocks(BlockDevice& dev) {
  auto m = mount(dev);
  const uint64_t n = m.vol->space_stats().used_blocks;
  unmount(m);
  return n;
}

std::vector<std::byte> pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 r(seed);
  for (auto& b : v) b = std::byte(r());
  return v;
}

// Bytes zstd compresses (a few letters in runs), for the compressed runs.
std::vector<std::byte> compressible(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 r(seed);
  for (size_t i = 0; i < n;) {
    const size_t run = std::min<size_t>(n - i, 1 + r() % 64);
    std::fill_n(v.begin() + long(i), run, std::byte('a' + r() % 4));
    i += run;
  }
  return v;
}

std::vector<std::byte> read_all(Filesystem& fs, uint64_t ino) {
  Attr a = must(fs.getattr(ino));
  std::vector<std::byte> out(a.size);
  size_t n = must(fs.read(ino, 0, out));
  REQUIRE(n == a.size);
  return out;
}

TEST_CASE("fs: a new filesystem has an empty root directory", "[fs]") {
  auto dev = fs_device();
  auto m = mount(*dev);
  Attr root = must(m.fs->getattr(m.fs->root()));
  CHECK(S_ISDIR(root.mode));
  CHECK(root.nlink == 2);
  std::vector<std::string> names;
  must(m.fs->readdir(m.fs->root(), 0, [&](const DirEntry& d) {
    names.emplace_back(d.name);
    return true;
  }));
  CHECK(names == std::vector<std::string>{".", ".."});
  unmount(m);
  require_fs_clean(*dev);
}

// kill_setid: what the FUSE daemon asks for on chown, and on writes and
// truncates by callers without CAP_FSETID (fuse/kernel_io.h).
TEST_CASE("fs: kill_setid clears setuid, and setgid only when group-executable", "[fs]") {
  auto dev = fs_device();
  auto m = mount(*dev);
  const uint64_t r = m.fs->root();
  auto mode_after = [&](const char* name, uint32_t mode, SetAttr s) {
    Attr a = must(m.fs->mknod(r, name, S_IFREG | mode, 0, 0, 0));
    s.kill_setid = true;
    return must(m.fs->setattr(a.ino, s)).mode & 07777;
  };
  CHECK(mode_after("a", 06755, {}) == 0755);
  CHECK(mode_after("b", 02745, {}) == 02745);  // setgid without g+x marks locking
  CHECK(mode_after("c", 04644, {}) == 0644);
  SetAttr explicit_mode;
  explicit_mode.mode = 06711;  // a mode in the same request wins
  CHECK(mode_after("d", 0755, explicit_mode) == 06711);
  SetAttr trunc;
  trunc.size = 0;
  CHECK(mode_after("e", 06755, trunc) == 0755);
  Attr d = must(m.fs->mkdir(r, "dir", 02775, 0, 0));
  SetAttr k;
  k.kill_setid = true;
  CHECK((must(m.fs->setattr(d.ino, k)).mode & 07777) == 02775);  // directories keep setgid
  unmount(m);
  require_fs_clean(*dev);
}

TEST_CASE("fs: files grow from inline to extents and shrink back with zeroed tails", "[fs]") {
  auto dev = fs_device();
  auto m = mount(*dev);
  Filesystem& fs = *m.fs;
  const uint64_t root = fs.root();
  Attr f = must(fs.mknod(root, "f", S_IFREG | 0644, 0, 1, 2));
  CHECK(f.uid == 1);
  CHECK(f.gid == 2);
  std::vector<std::byte> model;
  auto write = [&](uint64_t off, size_t n, uint64_t seed) {
    auto d = pattern(n, seed);
    CHECK(must(fs.write(f.ino, off, d)) == n);
    if (model.size() < off + n) model.resize(off + n);
    std::copy(d.begin(), d.end(), model.begin() + long(off));
    REQUIRE(read_all(fs, f.ino) == model);
  };
  auto truncate = [&](uint64_t size) {
    SetAttr s;
    s.size = size;
    must(fs.setattr(f.ino, s));
    model.resize(size);
    REQUIRE(read_all(fs, f.ino) == model);
  };
  write(0, 100, 1);               // inline
  write(1000, 500, 2);            // still inline (1500 <= 2048)
  CHECK(must(fs.getattr(f.ino)).blocks == 0);
  write(3000, 10, 3);             // converts to extents
  CHECK(must(fs.getattr(f.ino)).blocks > 0);
  write(4090, 9000, 4);           // spans blocks, partial at both ends
  truncate(5000);                 // unaligned: the tail of block 1 must become zeros
  truncate(20000);                // grow: [5000, 20000) reads as zeros
  write(100000, 1, 5);            // a hole in between
  truncate(0);
  write(0, 300000, 6);            // more than one extent item
  must(fs.sync());
  unmount(m);
  require_fs_clean(*dev);
  auto m2 = mount(*dev);
  CHECK(read_all(*m2.fs, must(m2.fs->lookup(m2.fs->root(), "f")).ino) == model);
  unmount(m2);
}

TEST_CASE("fs: names, links, renames and the errors POSIX gives", "[fs]") {
  auto dev = fs_device();
  auto m = mount(*dev);
  Filesystem& fs = *m.fs;
  const uint64_t r = fs.root();
  Attr d = must(fs.mkdir(r, "d", 0755, 0, 0));
  Attr e = must(fs.mkdir(d.ino, "e", 0755, 0, 0));
  Attr f = must(fs.mknod(r, "f", S_IFREG | 0600, 0, 0, 0));
  CHECK(must(fs.getattr(r)).nlink == 3);
  CHECK(must(fs.getattr(d.ino)).nlink == 3);
  CHECK(fs.mkdir(r, "d", 0755, 0, 0).error().code == EEXIST);
  CHECK(fs.mkdir(r, std::string(256, 'x'), 0755, 0, 0).error().code == ENAMETOOLONG);
  must(fs.mkdir(r, std::string(255, 'x'), 0755, 0, 0));
  CHECK(fs.rmdir(r, "d").error().code == ENOTEMPTY);
  CHECK(fs.rmdir(r, "f").error().code == ENOTDIR);
  CHECK(fs.unlink(r, "d").error().code == EISDIR);
  CHECK(fs.link(d.ino, r, "dlink").error().code == EPERM);
  must(fs.link(f.ino, d.ino, "f2"));
  CHECK(must(fs.getattr(f.ino)).nlink == 2);
  CHECK(fs.rename(r, "d", e.ino, "x", 0).error().code == EINVAL);  // below itself
  CHECK(fs.rename(r, "f", r, "d", 0).error().code == EISDIR);
  CHECK(fs.rename(r, "d", r, "f", 0).error().code == ENOTDIR);
  CHECK(fs.rename(r, "f", d.ino, "e", RENAME_NOREPLACE).error().code == EEXIST);
  must(fs.rename(r, "f", d.ino, "e", RENAME_EXCHANGE));  // swap a file and a directory
  CHECK(must(fs.lookup(r, "f")).ino == e.ino);
  CHECK(must(fs.lookup(d.ino, "e")).ino == f.ino);
  CHECK(must(fs.lookup(e.ino, "..")).ino == r);
  CHECK(must(fs.getattr(r)).nlink == 5);        // d, f (a directory now), the long name
  CHECK(must(fs.getattr(d.ino)).nlink == 2);
  must(fs.rename(d.ino, "e", r, "g", 0));
  must(fs.rename(r, "g", d.ino, "f2", 0));      // two names of one inode: nothing happens
  CHECK(must(fs.getattr(f.ino)).nlink == 2);
  Attr s = must(fs.symlink(r, "s", std::string(4000, 'a'), 0, 0));
  CHECK(must(fs.readlink(s.ino)) == std::string(4000, 'a'));
  CHECK(fs.symlink(r, "s2", std::string(4096, 'a'), 0, 0).error().code == ENAMETOOLONG);
  Attr fifo = must(fs.mknod(r, "p", S_IFIFO | 0644, 0, 0, 0));
  Attr chr = must(fs.mknod(r, "c", S_IFCHR | 0644, makedev(1, 3), 0, 0));
  CHECK(S_ISFIFO(fifo.mode));
  CHECK(must(fs.getattr(chr.ino)).rdev == makedev(1, 3));
  // xattrs
  auto v = bytes("value");
  must(fs.setxattr(f.ino, "user.a", v, 0));
  CHECK(fs.setxattr(f.ino, "user.a", v, XATTR_CREATE).error().code == EEXIST);
  CHECK(fs.setxattr(f.ino, "user.b", v, XATTR_REPLACE).error().code == ENODATA);
  CHECK(fs.setxattr(f.ino, "bogus.b", v, 0).error().code == EOPNOTSUPP);
  must(fs.setxattr(f.ino, "system.posix_acl_access", v, 0));
  CHECK(must(fs.getxattr(f.ino, "user.a")) == v);
  CHECK(must(fs.listxattr(f.ino)).size() == 2);
  must(fs.removexattr(f.ino, "user.a"));
  CHECK(fs.getxattr(f.ino, "user.a").error().code == ENODATA);
  unmount(m);
  require_fs_clean(*dev);
}

// A default ACL: u::rwx, u:1000:rwx, g::r-x, m::rwx, o::--- (kernel xattr encoding).
std::vector<std::byte> default_acl() {
  std::vector<std::byte> v;
  auto put16 = [&](uint16_t x) { v.push_back(std::byte(x)); v.push_back(std::byte(x >> 8)); };
  auto put32 = [&](uint32_t x) { put16(uint16_t(x)); put16(uint16_t(x >> 16)); };
  put32(2);
  struct { uint16_t tag, perm; uint32_t id; } es[] = {
      {0x01, 7, ~0u}, {0x02, 7, 1000}, {0x04, 5, ~0u}, {0x10, 7, ~0u}, {0x20, 0, ~0u}};
  for (auto& e : es) { put16(e.tag); put16(e.perm); put32(e.id); }
  return v;
}

TEST_CASE("fs: a default ACL is inherited and narrows the mode instead of the umask", "[fs]") {
  auto dev = fs_device();
  auto m = mount(*dev);
  Filesystem& fs = *m.fs;
  Attr d = must(fs.mkdir(fs.root(), "d", 0755, 0, 0));
  must(fs.setxattr(d.ino, "system.posix_acl_default", default_acl(), 0));
  Attr f = must(fs.mknod(d.ino, "f", S_IFREG | 0666, 0, 0, 0, 022));
  CHECK((f.mode & 07777) == 0660);  // group bits from the mask (rw-), not the umask
  auto acc = must(fs.getxattr(f.ino, "system.posix_acl_access"));
  CHECK(acc.size() == 4 + 5 * 8);
  CHECK(fs.getxattr(f.ino, "system.posix_acl_default").error().code == ENODATA);
  Attr sub = must(fs.mkdir(d.ino, "sub", 0777, 0, 0, 022));
  CHECK((sub.mode & 07777) == 0770);
  CHECK(must(fs.getxattr(sub.ino, "system.posix_acl_default")) == default_acl());
  Attr plain = must(fs.mknod(fs.root(), "p", S_IFREG | 0666, 0, 0, 0, 022));
  CHECK((plain.mode & 07777) == 0644);
  CHECK(fs.getxattr(plain.ino, "system.posix_acl_access").error().code == ENODATA);
  unmount(m);
}

// --- large xattrs (format.md#fs-xattr) -----------------------------------------

std::unique_ptr<MemDevice> fs_device_bs(uint32_t bs) {
  auto dev = std::make_unique<MemDevice>(256ull << 20);
  FormatOptions fo;
  fo.block_size = bs;
  must(format_filesystem(*dev, fo, FsCreateOptions{}));
  return dev;
}

// The items of object `ino` of type `type` (format.md#fs-keys).
size_t items_of(Mounted& m, uint64_t ino, disk::ItemType type) {
  size_t n = 0;
  for (const auto& [k, v] : dump(*m.vol, m.fs->tree()))
    n += k.hi == ino && disk::ItemType(k.lo >> 56) == type;
  return n;
}
size_t chunks_of(Mounted& m, uint64_t ino) { return items_of(m, ino, disk::ItemType::XattrValue); }

// An Xattr item as the format stored it before large xattrs existed: one
// record, flags byte 0, the value inline.
std::vector<std::byte> legacy_record(const std::string& name, const std::vector<std::byte>& value) {
  std::vector<std::byte> v{std::byte(name.size()), std::byte{0}, std::byte(value.size() & 0xff),
                           std::byte(value.size() >> 8)};
  for (char c : name) v.push_back(std::byte(c));
  v.insert(v.end(), value.begin(), value.end());
  return v;
}
std::optional<std::vector<std::byte>> xattr_item(Mounted& m, uint64_t ino, const std::string& name) {
  uint64_t h = xxh3(name.data(), name.size()) & disk::kOffMask;
  auto t = must(m.vol->begin());
  return must(t.get(m.fs->tree(), Key{ino, uint64_t(disk::ItemType::Xattr) << 56 | (h ? h : 1)}));
}

// Two names whose 56-bit name hashes collide, so that they share one Xattr
// item (found offline by Brent's cycle finding over the hash of
// "user.c" + 14 hex digits; both hash to 0x7b40f2a9875735).
constexpr const char* kCollideA = "user.c686d7fc93c05fc";
constexpr const char* kCollideB = "user.c4021611ef787d5";

TEST_CASE("fs: xattr values of any size up to 64 KiB, inline while they fit, out of line beyond", "[fs][xattr]") {
  for (uint32_t bs : {4096u, 16384u}) {
    INFO("block size " << bs);
    auto dev = fs_device_bs(bs);
    const uint64_t used0 = used_blocks(*dev);
    auto m = mount(*dev);
    Filesystem& fs = *m.fs;
    const uint32_t chunk = BTree::max_value_len(bs);
    Attr f = must(fs.mknod(fs.root(), "f", S_IFREG | 0644, 0, 0, 0));
    // Names of 11 bytes: the item of a value of chunk - 15 bytes is full.
    const std::vector<size_t> sizes{0, 1, 900, 901, chunk - 4 - 11, chunk - 4 - 10, 4096, 16384, 65536};
    std::map<std::string, std::vector<std::byte>> want;
    size_t expect = 0;  // chunks: whole B-tree values
    for (size_t n : sizes) {
      char name_buf[16];
      std::snprintf(name_buf, sizeof name_buf, "user.s%05zu", n);
      const std::string name = name_buf;
      INFO(name);
      want[name] = pattern(n, n + bs);
      must(fs.setxattr(f.ino, name, want[name], XATTR_CREATE));
      REQUIRE(must(fs.getxattr(f.ino, name)) == want[name]);
      // What fits an item is stored exactly as before: one inline record.
      const bool fits = 4 + name.size() + n <= chunk;
      if (fits) CHECK(*xattr_item(m, f.ino, name) == legacy_record(name, want[name]));
      else CHECK(xattr_item(m, f.ino, name)->size() == 4 + name.size() + sizeof(disk::XattrOutline));
      if (!fits) expect += (n + chunk - 1) / chunk;
      CHECK(chunks_of(m, f.ino) == expect);
      // The feature flag comes with the first out-of-line value.
      CHECK(bool(m.vol->incompat() & kIncompatLargeXattr) == (expect > 0));
    }
    CHECK((m.vol->incompat() & kIncompatLargeXattr));
    // Linux's limit: a value over XATTR_SIZE_MAX is E2BIG, and nothing changes.
    CHECK(fs.setxattr(f.ino, "user.toobig", pattern(65537, 1), 0).error().code == E2BIG);
    CHECK(fs.getxattr(f.ino, "user.toobig").error().code == ENODATA);
    auto names = must(fs.listxattr(f.ino));
    CHECK(std::set<std::string>(names.begin(), names.end()).size() == sizes.size());

    // Replace large by small and back, with the flags' rules.
    Attr g = must(fs.mknod(fs.root(), "g", S_IFREG | 0644, 0, 0, 0));
    must(fs.setxattr(g.ino, "user.v", pattern(65536, 1), 0));
    CHECK(chunks_of(m, g.ino) == (65536 + chunk - 1) / chunk);
    CHECK(fs.setxattr(g.ino, "user.v", pattern(5, 2), XATTR_CREATE).error().code == EEXIST);
    CHECK(must(fs.getxattr(g.ino, "user.v")) == pattern(65536, 1));
    must(fs.setxattr(g.ino, "user.v", pattern(10, 3), XATTR_REPLACE));
    CHECK(must(fs.getxattr(g.ino, "user.v")) == pattern(10, 3));
    CHECK(chunks_of(m, g.ino) == 0);
    CHECK(*xattr_item(m, g.ino, "user.v") == legacy_record("user.v", pattern(10, 3)));
    must(fs.setxattr(g.ino, "user.v", pattern(20000, 4), XATTR_REPLACE));
    CHECK(chunks_of(m, g.ino) == (20000 + chunk - 1) / chunk);
    must(fs.setxattr(g.ino, "user.v", pattern(30000, 5), 0));  // large over large
    CHECK(chunks_of(m, g.ino) == (30000 + chunk - 1) / chunk);
    CHECK(must(fs.getxattr(g.ino, "user.v")) == pattern(30000, 5));
    CHECK(fs.setxattr(g.ino, "user.w", pattern(70000, 6), XATTR_REPLACE).error().code == E2BIG);
    CHECK(fs.setxattr(g.ino, "user.w", pattern(7000, 6), XATTR_REPLACE).error().code == ENODATA);
    must(fs.removexattr(g.ino, "user.v"));
    CHECK(fs.getxattr(g.ino, "user.v").error().code == ENODATA);
    CHECK(chunks_of(m, g.ino) == 0);
    CHECK(items_of(m, g.ino, disk::ItemType::Xattr) == 0);
    must(fs.setxattr(g.ino, "user.v", pattern(40000, 7), 0));

    // Persistence across a remount; the durable superblock carries the flag.
    unmount(m);
    require_fs_clean(*dev);
    CHECK((must(read_superblocks(*dev)).info.incompat & kIncompatLargeXattr));
    m = mount(*dev);
    for (const auto& [name, v] : want) {
      INFO(name);
      CHECK(must(m.fs->getxattr(f.ino, name)) == v);
    }
    CHECK(must(m.fs->getxattr(g.ino, "user.v")) == pattern(40000, 7));
    // Deleting the files frees every chunk and block: one by unlink, one by
    // a rename over it.
    Attr h = must(m.fs->mknod(m.fs->root(), "h", S_IFREG | 0644, 0, 0, 0));
    must(m.fs->unlink(m.fs->root(), "f"));
    must(m.fs->rename(m.fs->root(), "h", m.fs->root(), "g", 0));
    must(m.fs->unlink(m.fs->root(), "g"));
    for (const auto& [k, v] : dump(*m.vol, m.fs->tree())) CHECK((k.hi != f.ino && k.hi != g.ino && k.hi != h.ino));
    must(m.fs->sync());
    must(m.fs->sync());  // what the deletions freed is free once durable
    CHECK(m.vol->space_stats().used_blocks <= used0 + 4);
    unmount(m);
    require_fs_clean(*dev);
  }
}

TEST_CASE("fs: xattrs whose names share a hash share an item, large or small", "[fs][xattr]") {
  REQUIRE((xxh3(kCollideA, 20) & disk::kOffMask) == (xxh3(kCollideB, 20) & disk::kOffMask));
  auto dev = fs_device();
  auto m = mount(*dev);
  Filesystem& fs = *m.fs;
  Attr f = must(fs.mknod(fs.root(), "f", S_IFREG | 0644, 0, 0, 0));
  auto both = [&](const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
    CHECK(must(fs.getxattr(f.ino, kCollideA)) == a);
    CHECK(must(fs.getxattr(f.ino, kCollideB)) == b);
    CHECK(items_of(m, f.ino, disk::ItemType::Xattr) == 1);
    CHECK(must(fs.listxattr(f.ino)).size() == 2);
  };
  must(fs.setxattr(f.ino, kCollideA, pattern(10, 1), 0));
  must(fs.setxattr(f.ino, kCollideB, pattern(10, 2), 0));
  both(pattern(10, 1), pattern(10, 2));
  CHECK(*xattr_item(m, f.ino, kCollideA) ==
        [&] {
          auto v = legacy_record(kCollideA, pattern(10, 1));
          auto w = legacy_record(kCollideB, pattern(10, 2));
          v.insert(v.end(), w.begin(), w.end());
          return v;
        }());
  // Both large: each its own chunks (the second value id probes past the first).
  must(fs.setxattr(f.ino, kCollideA, pattern(65536, 3), 0));
  both(pattern(65536, 3), pattern(10, 2));
  must(fs.setxattr(f.ino, kCollideB, pattern(65536, 4), 0));
  both(pattern(65536, 3), pattern(65536, 4));
  CHECK(chunks_of(m, f.ino) == 2 * 67);
  // One shrinks: the other's chunks stay.
  must(fs.setxattr(f.ino, kCollideA, pattern(5, 5), 0));
  both(pattern(5, 5), pattern(65536, 4));
  CHECK(chunks_of(m, f.ino) == 67);
  // Two values that fit alone but not together: the larger goes out of line.
  must(fs.setxattr(f.ino, kCollideB, pattern(800, 6), 0));
  both(pattern(5, 5), pattern(800, 6));
  CHECK(chunks_of(m, f.ino) == 0);
  must(fs.setxattr(f.ino, kCollideA, pattern(900, 7), 0));
  both(pattern(900, 7), pattern(800, 6));
  CHECK(chunks_of(m, f.ino) == 1);
  unmount(m);
  require_fs_clean(*dev);
  m = mount(*dev);
  Filesystem& fs2 = *m.fs;
  CHECK(must(fs2.getxattr(f.ino, kCollideA)) == pattern(900, 7));
  CHECK(must(fs2.getxattr(f.ino, kCollideB)) == pattern(800, 6));
  must(fs2.removexattr(f.ino, kCollideA));
  CHECK(must(fs2.getxattr(f.ino, kCollideB)) == pattern(800, 6));
  CHECK(fs2.getxattr(f.ino, kCollideA).error().code == ENODATA);
  must(fs2.removexattr(f.ino, kCollideB));
  CHECK(items_of(m, f.ino, disk::ItemType::Xattr) + chunks_of(m, f.ino) == 0);
  unmount(m);
  require_fs_clean(*dev);
}

TEST_CASE("fs: a large default ACL is inherited out of line", "[fs][xattr]") {
  auto dev = fs_device();
  auto m = mount(*dev);
  Filesystem& fs = *m.fs;
  // default_acl() with 300 named-user entries more: 2444 bytes.
  auto acl = default_acl();
  std::vector<std::byte> users;
  for (uint32_t u = 0; u < 300; u++)
    for (uint32_t x : {0x02u | 5u << 16, 2000 + u})
      for (int i = 0; i < 4; i++) users.push_back(std::byte(x >> (8 * i)));
  acl.insert(acl.begin() + 4 + 8, users.begin(), users.end());  // after u::, in tag order
  Attr d = must(fs.mkdir(fs.root(), "d", 0755, 0, 0));
  must(fs.setxattr(d.ino, "system.posix_acl_default", acl, 0));
  Attr sub = must(fs.mkdir(d.ino, "sub", 0777, 0, 0, 022));
  CHECK(must(fs.getxattr(sub.ino, "system.posix_acl_default")) == acl);
  CHECK(must(fs.getxattr(sub.ino, "system.posix_acl_access")).size() == acl.size());
  CHECK(chunks_of(m, sub.ino) == 2 * ((acl.size() + 983) / 984));
  unmount(m);
  require_fs_clean(*dev);
}

TEST_CASE("fs: readdir cookies are stable across insertions, deletions and remounts", "[fs]") {
  auto dev = fs_device();
  auto m = mount(*dev);
  const uint64_t r = m.fs->root();
  for (int i = 0; i < 3000; i++) must(m.fs->mknod(r, "n" + std::to_string(i), S_IFREG | 0644, 0, 0, 0));
  std::vector<std::pair<std::string, uint64_t>> first;
  must(m.fs->readdir(r, 0, [&](const DirEntry& d) {
    first.emplace_back(std::string(d.name), d.next);
    return true;
  }));
  REQUIRE(first.size() == 3002);
  // Stop in the middle, change the directory, remount, and resume.
  const size_t mid = 1500;
  for (int i = 0; i < 3000; i += 7)
    if (size_t(i) != mid) {
      std::string n = "n" + std::to_string(i);
      bool before_mid = false;
      for (size_t j = 0; j <= mid; j++) before_mid |= first[j].first == n;
      if (!before_mid) continue;  // removing later entries is allowed, but keep the check simple
      must(m.fs->unlink(r, n));
    }
  for (int i = 0; i < 200; i++) must(m.fs->mknod(r, "new" + std::to_string(i), S_IFREG | 0644, 0, 0, 0));
  unmount(m);
  auto m2 = mount(*dev);
  std::vector<std::string> rest;
  must(m2.fs->readdir(r, first[mid].second, [&](const DirEntry& d) {
    rest.emplace_back(d.name);
    return true;
  }));
  // Every entry that was after the cookie and still exists comes back, once.
  std::set<std::string> got(rest.begin(), rest.end());
  CHECK(got.size() == rest.size());
  for (size_t j = mid + 1; j < first.size(); j++) CHECK(got.count(first[j].first));
  for (size_t j = 0; j <= mid; j++) CHECK(!got.count(first[j].first));
  unmount(m2);
}

TEST_CASE("fs: an unlinked open file lives until unpinned, or until the next mount after a crash", "[fs]") {
  auto dev = fs_device();
  const uint64_t used_before = used_blocks(*dev);
  auto m = mount(*dev);
  Filesystem& fs = *m.fs;
  Attr f = must(fs.mknod(fs.root(), "f", S_IFREG | 0644, 0, 0, 0));
  auto data = pattern(1 << 20, 7);
  must(fs.write(f.ino, 0, data));
  fs.pin(f.ino);
  must(fs.unlink(fs.root(), "f"));
  CHECK(fs.lookup(fs.root(), "f").error().code == ENOENT);
  CHECK(read_all(fs, f.ino) == data);  // still readable
  CHECK(fs.orphan_count() == 1);
  must(fs.sync());
  // Crash: the volume goes away without close; the orphan item is durable.
  m.fs.reset();
  m.vol.reset();
  auto m2 = mount(*dev);
  CHECK(m2.fs->orphan_count() == 0);
  CHECK(m2.fs->getattr(f.ino).error().code == ENOENT);
  must(m2.fs->sync());
  must(m2.fs->sync());  // the freed blocks are free once their generation is durable
  CHECK(m2.vol->space_stats().used_blocks <= used_before + 4);
  unmount(m2);
  require_fs_clean(*dev);
}

TEST_CASE("fs: copy_range shares extents; overwriting one copy leaves the other intact", "[fs]") {
  auto dev = fs_device();
  auto m = mount(*dev);
  Filesystem& fs = *m.fs;
  Attr a = must(fs.mknod(fs.root(), "a", S_IFREG | 0644, 0, 0, 0));
  Attr b = must(fs.mknod(fs.root(), "b", S_IFREG | 0644, 0, 0, 0));
  auto data = pattern((8 << 20) + 123, 9);
  must(fs.write(a.ino, 0, data));
  must(fs.sync());
  const uint64_t used = m.vol->space_stats().used_blocks;
  CHECK(must(fs.copy_range(a.ino, 0, b.ino, 0, data.size())) == data.size());
  must(fs.sync());
  // Shared: the copy cost metadata only (a few blocks, not 2048).
  CHECK(m.vol->space_stats().used_blocks < used + 64);
  CHECK(read_all(fs, b.ino) == data);
  auto patch = pattern(10000, 10);
  must(fs.write(a.ino, 5000, patch));
  CHECK(read_all(fs, b.ino) == data);
  std::copy(patch.begin(), patch.end(), data.begin() + 5000);
  CHECK(read_all(fs, a.ino) == data);
  // Unaligned: copied through a buffer, same result.
  CHECK(must(fs.copy_range(a.ino, 3, b.ino, 1, 10000)) == 10000);
  unmount(m);
  require_fs_clean(*dev);
}

// A large write takes one space extent (up to 8 MiB) mapped by items of at
// most 64 blocks, each holding a reference on it (format.md#fs-extent): a
// partial overwrite keeps the rest of the extent readable and allocated,
// and the extent goes with its last item.
TEST_CASE("fs: a large write is one space extent that its items share", "[fs]") {
  auto dev = fs_device();
  auto m = mount(*dev);
  Filesystem& fs = *m.fs;
  const uint32_t bs = m.vol->block_size();
  Attr a = must(fs.mknod(fs.root(), "a", S_IFREG | 0644, 0, 0, 0));
  auto data = pattern(3 << 20, 21);
  must(fs.sync());
  const SpaceStats s0 = m.vol->space_stats();
  must(fs.write(a.ino, 0, data));  // aligned: straight from the buffer
  must(fs.sync());
  const SpaceStats s1 = m.vol->space_stats();
  CHECK(s1.data_blocks - s0.data_blocks == data.size() / bs);
  CHECK(read_all(fs, a.ino) == data);
  // The middle MiB rewritten: the old extent stays (its other items use
  // it), and a new one holds the new bytes.
  auto mid = pattern(1 << 20, 22);
  must(fs.write(a.ino, 1 << 20, mid));
  must(fs.sync());
  CHECK(m.vol->space_stats().data_blocks - s0.data_blocks == (data.size() + mid.size()) / bs);
  std::copy(mid.begin(), mid.end(), data.begin() + (1 << 20));
  CHECK(read_all(fs, a.ino) == data);
  // Unaligned writes across the items' seams read back too.
  auto odd = pattern(300000, 23);
  must(fs.write(a.ino, (1 << 20) - 77, odd));
  std::copy(odd.begin(), odd.end(), data.begin() + (1 << 20) - 77);
  CHECK(read_all(fs, a.ino) == data);
  unmount(m);
  require_fs_clean(*dev);
  m = mount(*dev);
  CHECK(read_all(*m.fs, a.ino) == data);
  // Every item gone: every extent goes.
  must(m.fs->unlink(m.fs->root(), "a"));
  must(m.fs->sync());
  must(m.fs->sync());
  CHECK(m.vol->space_stats().data_blocks == s0.data_blocks);
  unmount(m);
  require_fs_clean(*dev);
}

TEST_CASE("fs: fallocate, holes and SEEK_DATA/SEEK_HOLE", "[fs]") {
  auto dev = fs_device();
  auto m = mount(*dev);
  Filesystem& fs = *m.fs;
  Attr f = must(fs.mknod(fs.root(), "f", S_IFREG | 0644, 0, 0, 0));
  auto data = pattern(64 << 10, 11);
  must(fs.write(f.ino, 0, data));
  must(fs.write(f.ino, 1 << 20, data));
  CHECK(must(fs.lseek(f.ino, 0, SEEK_HOLE)) == 64u << 10);
  CHECK(must(fs.lseek(f.ino, 70000, SEEK_DATA)) == 1u << 20);
  CHECK(fs.lseek(f.ino, (1 << 20) + (64 << 10), SEEK_DATA).error().code == ENXIO);
  must(fs.fallocate(f.ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1000, 20000));
  std::fill(data.begin() + 1000, data.begin() + 21000, std::byte{0});
  std::vector<std::byte> got(64 << 10);
  must(fs.read(f.ino, 0, got));
  CHECK(got == data);
  must(fs.fallocate(f.ino, FALLOC_FL_KEEP_SIZE, 4 << 20, 1 << 20));
  CHECK(must(fs.getattr(f.ino)).size == (1u << 20) + (64u << 10));
  must(fs.fallocate(f.ino, 0, 4 << 20, 1 << 20));
  CHECK(must(fs.getattr(f.ino)).size == 5u << 20);
  must(fs.fallocate(f.ino, FALLOC_FL_ZERO_RANGE, (1 << 20) + 10, 100));
  must(fs.read(f.ino, 1 << 20, got));
  for (int i = 10; i < 110; i++) CHECK(got[size_t(i)] == std::byte{0});
  CHECK(got[5] == data[5]);
  CHECK(fs.fallocate(f.ino, FALLOC_FL_COLLAPSE_RANGE, 0, 4096).error().code == EOPNOTSUPP);
  unmount(m);
  require_fs_clean(*dev);
}

TEST_CASE("fs: a corrupt data block reads as EIO and turns the filesystem read-only", "[fs]") {
  auto dev = fs_device();
  auto m = mount(*dev);
  Attr f = must(m.fs->mknod(m.fs->root(), "f", S_IFREG | 0644, 0, 0, 0));
  std::vector<std::byte> data(64 << 10, std::byte{0x5a});
  must(m.fs->write(f.ino, 0, data));
  unmount(m);
  // Find the data on the device and flip a byte.
  bool hit = false;
  for (uint64_t off = 0; off < dev->size_bytes() && !hit; off += 4096) {
    auto blk = dev->peek(off, 4096);
    if (std::all_of(blk.begin(), blk.end(), [](std::byte b) { return b == std::byte{0x5a}; })) {
      dev->poke(off + 17, std::vector<std::byte>{std::byte{0x5b}});
      hit = true;
    }
  }
  REQUIRE(hit);
  // fsck -c finds it; without -c the metadata alone is consistent.
  CHECK(check_filesystems(*dev).empty());
  auto ps = check_filesystems(*dev, true);
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].code == "F7-data");
  auto m2 = mount(*dev);
  std::vector<std::byte> got(data.size());
  CHECK(m2.fs->read(f.ino, 0, got).error().code == EIO);
  CHECK(m2.fs->read_only());
  CHECK(m2.fs->mknod(m2.fs->root(), "g", S_IFREG | 0644, 0, 0, 0).error().code == EROFS);
}

// Random operations on the filesystem and on a model (name -> content) in
// one directory level below the root; at random points a commit (the model
// is saved) or a power cut (the filesystem must come back as the saved model).
TEST_CASE("fs: random operations against a model, with power cuts", "[fs][fsmodel]") {
  const bool z = GENERATE(false, true);
  CompressAll compress_all(z);
  const uint64_t seed = test::seed("fs-model");
  std::mt19937_64 rng(seed);
  INFO("compression " << (z ? "forced" : "off"));
  auto dev = std::make_unique<MemDevice>(512ull << 20);
  must(format_filesystem(*dev, FormatOptions{}, FsCreateOptions{}));
  dev->track_unflushed(true);
  using Files = std::map<std::string, std::vector<std::byte>>;
  Files model, durable;
  auto m = mount(*dev);
  const int ops = int(3000 * scale());
  const char* names[] = {"a", "b", "c", "d", "e", "f", "g", "h"};
  auto pick = [&] { return std::string(names[rng() % 8]); };
  auto ino_of = [&](const std::string& n) { return must(m.fs->lookup(m.fs->root(), n)).ino; };
  size_t frames = 0;  // compressed extent items seen at the checks
  auto compare = [&](const Files& want) {
    if (z) {
      auto t = must(m.vol->begin());
      must(t.scan(m.fs->tree(), Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
        if (fsitems::type_of(k) == disk::ItemType::Extent) frames += must(fsitems::decode_extent(k, v)).compressed();
        return true;
      }));
    }
    std::set<std::string> seen;
    must(m.fs->readdir(m.fs->root(), 0, [&](const DirEntry& d) {
      if (d.name != "." && d.name != "..") seen.insert(std::string(d.name));
      return true;
    }));
    std::set<std::string> expect;
    for (auto& [k, v] : want) expect.insert(k);
    REQUIRE(seen == expect);
    for (auto& [k, v] : want) {
      INFO("file " << k);
      REQUIRE(read_all(*m.fs, ino_of(k)) == v);
    }
  };
  for (int i = 0; i < ops; i++) {
    const std::string n = pick();
    const bool exists = model.count(n);
    switch (rng() % 10) {
      case 0:
      case 1: {  // write at a random offset; sizes cross the inline limit and block edges
        if (!exists) {
          must(m.fs->mknod(m.fs->root(), n, S_IFREG | 0644, 0, 0, 0));
          model[n];
        }
        uint64_t off = rng() % 3 == 0 ? rng() % 3000 : rng() % (600 << 10);
        size_t len = rng() % 2 ? rng() % 5000 + 1 : rng() % (200 << 10) + 1;
        auto d = z && rng() % 3 ? compressible(len, rng()) : pattern(len, rng());
        must(m.fs->write(ino_of(n), off, d));
        auto& c = model[n];
        if (c.size() < off + len) c.resize(off + len);
        std::copy(d.begin(), d.end(), c.begin() + long(off));
        break;
      }
      case 2:
        if (exists) {
          SetAttr s;
          s.size = rng() % 2 ? rng() % 4000 : rng() % (700 << 10);
          must(m.fs->setattr(ino_of(n), s));
          model[n].resize(*s.size);
        }
        break;
      case 3:
        if (exists) {
          must(m.fs->unlink(m.fs->root(), n));
          model.erase(n);
        }
        break;
      case 4: {
        const std::string to = pick();
        if (exists && to != n) {
          must(m.fs->rename(m.fs->root(), n, m.fs->root(), to, 0));
          model[to] = model[n];
          model.erase(n);
        }
        break;
      }
      case 5: {
        const std::string to = pick();
        if (exists && to != n) {
          if (!model.count(to)) {
            must(m.fs->mknod(m.fs->root(), to, S_IFREG | 0644, 0, 0, 0));
            model[to];
          }
          auto& src = model[n];
          uint64_t blk = 4096;
          uint64_t oi = rng() % 2 ? (rng() % 64) * blk : rng() % 100000;
          uint64_t oo = rng() % 2 ? (rng() % 64) * blk : rng() % 100000;
          uint64_t len = rng() % 2 ? (rng() % 32 + 1) * blk : rng() % 70000 + 1;
          uint64_t got = must(m.fs->copy_range(ino_of(n), oi, ino_of(to), oo, len));
          uint64_t want = oi >= src.size() ? 0 : std::min<uint64_t>(len, src.size() - oi);
          REQUIRE(got == want);
          if (want) {
            std::vector<std::byte> part(src.begin() + long(oi), src.begin() + long(oi + want));
            auto& dst = model[to];
            if (dst.size() < oo + want) dst.resize(oo + want);
            std::copy(part.begin(), part.end(), dst.begin() + long(oo));
          }
        }
        break;
      }
      case 6:
        if (exists && !model[n].empty()) {
          auto& c = model[n];
          uint64_t off = rng() % c.size(), len = rng() % 40000 + 1;
          must(m.fs->fallocate(ino_of(n), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, len));
          for (uint64_t p = off; p < std::min<uint64_t>(c.size(), off + len); p++) c[p] = std::byte{0};
        }
        break;
      case 7:
        must(m.fs->sync());
        durable = model;
        break;
      case 8:
        if (rng() % 8 == 0) {  // power cut: back to the last commit
          m.fs.reset();
          m.vol.reset();
          dev->crash(rng);
          require_fs_clean(*dev);
          m = mount(*dev);
          model = durable;
          compare(model);
        }
        break;
      default:
        if (rng() % 4 == 0) compare(model);
        break;
    }
  }
  compare(model);
  if (z) CHECK(frames > 0);  // the run did write frames (format.md#fs-compress)
  unmount(m);
  require_fs_clean(*dev);
  CHECK(check_filesystems(*dev, true).empty());  // every frame decodes
}

// Each invariant broken on purpose, through the volume below the
// filesystem layer, is reported by the object checks (fsck pass 5).
TEST_CASE("fs: the object checks report broken invariants", "[fs]") {
  struct Case { const char* code; std::function<void(Volume&, TreeId, const Attr&, const Attr&)> brk; };
  auto key = [](uint64_t obj, uint8_t type, uint64_t off) { return Key{obj, uint64_t(type) << 56 | off}; };
  const Case cases[] = {
      {"F2-nlink", [&](Volume& v, TreeId t, const Attr& f, const Attr&) {
         auto txn = must(v.begin());
         auto val = *must(txn.get(t, key(f.ino, 1, 0)));
         val[12] = std::byte{7};  // nlink
         must(txn.put(t, key(f.ino, 1, 0), val));
       }},
      {"F2-dirent", [&](Volume& v, TreeId t, const Attr&, const Attr& d) {
         auto txn = must(v.begin());
         // An entry (hash 5) naming an inode that does not exist.
         std::vector<std::byte> e(12 + 1);
         e[0] = std::byte{0x77};
         e[1] = std::byte{0x77};
         e[8] = std::byte{DT_REG};
         e[10] = std::byte{1};
         e[12] = std::byte{'z'};
         must(txn.put(t, key(d.ino, 2, 5), e));
       }},
      {"F6-orphan-item", [&](Volume& v, TreeId t, const Attr&, const Attr&) {
         auto txn = must(v.begin());
         must(txn.put(t, key(999999, 4, 0), bytes("stray")));
       }},
      {"F4-blocks", [&](Volume& v, TreeId t, const Attr& f, const Attr&) {
         auto txn = must(v.begin());
         auto val = *must(txn.get(t, key(f.ino, 1, 0)));
         val[24] = std::byte{1};  // blocks
         must(txn.put(t, key(f.ino, 1, 0), val));
       }},
      {"F3-parent", [&](Volume& v, TreeId t, const Attr&, const Attr& d) {
         auto txn = must(v.begin());
         auto val = *must(txn.get(t, key(d.ino, 1, 0)));
         val[40] = std::byte{0x55};  // parent
         must(txn.put(t, key(d.ino, 1, 0), val));
       }},
  };
  for (const auto& c : cases) {
    INFO(c.code);
    auto dev = fs_device();
    Attr f, d;
    {
      auto m = mount(*dev);
      d = must(m.fs->mkdir(m.fs->root(), "d", 0755, 0, 0));
      f = must(m.fs->mknod(d.ino, "f", S_IFREG | 0644, 0, 0, 0));
      unmount(m);
    }
    REQUIRE(check_filesystems(*dev).empty());
    {
      VolumeOptions vo;
      vo.kinds = fs_kinds();
      auto v = must(Volume::open(*dev, vo));
      c.brk(*v, must(Filesystem::default_tree(*v)), f, d);
      must(v->close());
    }
    auto ps = check_filesystems(*dev);
    bool found = false;
    for (const auto& p : ps) found |= p.code == c.code;
    CHECK(found);
    FsckOptions fo;
    fo.kinds = fs_kinds();
    fo.object_checks = [](BlockDevice& x) { return check_filesystems(x); };
    auto rep = must(fsck_run(*dev, fo));
    CHECK(rep.exit_code == kFsckUncorrected);
  }
}

// Power cuts in the middle of commits: the device stops taking changes at
// its Nth write or flush (everything later is lost), the writes not yet
// flushed land, vanish or tear at random, and the filesystem must come back
// as exactly the model of one generation: the last acknowledged one, or a
// later one whose superblock made it. Every file reads back with valid data
// checksums: the data a generation refers to was on the device before its
// superblock (format.md#fs-extent), never stale or foreign blocks.
TEST_CASE("fs: power cuts during commits recover a committed generation", "[fs][fscrash]") {
  const uint64_t seed = test::seed("fs-crash");
  std::mt19937_64 rng(seed);
  using Files = std::map<std::string, std::vector<std::byte>>;
  const int runs = int(60 * scale());
  int cut_mid_run = 0;
  for (int run = 0; run < runs; run++) {
    MemDevice mem(64ull << 20);
    must(format_filesystem(mem, FormatOptions{}, FsCreateOptions{}));
    mem.track_unflushed(true);
    FaultDevice dev(mem);
    FaultDevice::Rule rule;
    rule.op = FaultDevice::Op::Modify;
    rule.nth = rng() % 60 + 1;
    rule.sticky = true;
    rule.kind = rng() % 2 ? FaultDevice::Kind::Eio : FaultDevice::Kind::Torn;
    rule.seed = rng();
    std::map<uint64_t, Files> model_at;  // generation -> content it holds
    uint64_t acked = 0;
    Files model;
    {
      VolumeOptions vo;
      vo.kinds = fs_kinds();
      auto vol = must(Volume::open(dev, vo));
      auto fs = must(Filesystem::open(*vol, must(Filesystem::default_tree(*vol))));
      model_at[vol->durable_generation().v] = model;
      acked = vol->durable_generation().v;
      dev.add(rule);
      const char* names[] = {"a", "b", "c", "d"};
      auto body = [&]() -> Result<void> {
        for (int i = 0; i < 60; i++) {
          const std::string n = names[rng() % 4];
          const bool exists = model.count(n);
          auto ino = [&](const std::string& x) -> Result<uint64_t> {
            return PLY_TRY(fs->lookup(fs->root(), x)).ino;
          };
          switch (rng() % 6) {
            case 0:
            case 1: {
              if (!exists) {
                (void)PLY_TRY(fs->mknod(fs->root(), n, S_IFREG | 0644, 0, 0, 0));
                model[n];
              }
              uint64_t off = rng() % (300 << 10);
              auto d = pattern(rng() % 2 ? rng() % 3000 + 1 : rng() % (100 << 10) + 1, rng());
              (void)PLY_TRY(fs->write(PLY_TRY(ino(n)), off, d));
              auto& c = model[n];
              if (c.size() < off + d.size()) c.resize(off + d.size());
              std::copy(d.begin(), d.end(), c.begin() + long(off));
              break;
            }
            case 2:
              if (exists) {
                SetAttr sa;
                sa.size = rng() % (200 << 10);
                (void)PLY_TRY(fs->setattr(PLY_TRY(ino(n)), sa));
                model[n].resize(*sa.size);
              }
              break;
            case 3:
              if (exists) {
                PLY_CHECK(fs->unlink(fs->root(), n));
                model.erase(n);
              }
              break;
            case 4: {
              const std::string to = names[rng() % 4];
              if (exists && to != n && !model.count(to)) {
                (void)PLY_TRY(fs->mknod(fs->root(), to, S_IFREG | 0644, 0, 0, 0));
                model[to];
                uint64_t len = model[n].size();
                (void)PLY_TRY(fs->copy_range(PLY_TRY(ino(n)), 0, PLY_TRY(ino(to)), 0, len));
                model[to] = model[n];
              }
              break;
            }
            default: {
              // If the commit fails after its superblock landed, the
              // generation it was writing may be the one recovered.
              model_at[vol->open_generation().v] = model;
              const Generation g = PLY_TRY(vol->commit());
              model_at[g.v] = model;  // the same state (nothing changed if g is older)
              acked = g.v;
              break;
            }
          }
        }
        return ok();
      };
      auto r = body();
      if (!r) cut_mid_run++;
      // The power is off: nothing reaches the device any more. Drop the
      // volume without closing it.
      fs.reset();
      vol.reset();
    }
    mem.crash(rng);
    INFO("run " << run << ", cut at change " << rule.nth);
    {
      // fsck -n finds nothing but information (a superblock copy the cut
      // left torn is expected, and is not an error).
      FsckOptions fo;
      fo.kinds = fs_kinds();
      auto rep = must(fsck_run(mem, fo));
      for (const auto& p : rep.problems) {
        INFO(p.code << ": " << p.message);
        CHECK(p.fix == FixClass::Info);
      }
    }
    {
      auto ps = check_filesystems(mem);
      for (const auto& p : ps) INFO(p.code << ": " << p.message);
      REQUIRE(ps.empty());
    }
    auto m = mount(mem, true);
    const uint64_t g = m.vol->durable_generation().v;
    INFO("recovered generation " << g << ", last acknowledged " << acked);
    CHECK(g >= acked);
    auto want = model_at.find(g);
    REQUIRE(want != model_at.end());
    std::set<std::string> seen;
    must(m.fs->readdir(m.fs->root(), 0, [&](const DirEntry& d) {
      if (d.name != "." && d.name != "..") seen.insert(std::string(d.name));
      return true;
    }));
    std::set<std::string> expect;
    for (auto& [k, v] : want->second) expect.insert(k);
    REQUIRE(seen == expect);
    for (auto& [k, v] : want->second) {
      INFO("file " << k);
      REQUIRE(read_all(*m.fs, must(m.fs->lookup(m.fs->root(), k)).ino) == v);
    }
  }
  // The cuts must land inside the workloads, not only after them.
  INFO(cut_mid_run << " of " << runs << " runs were cut mid-way");
  CHECK(cut_mid_run > runs / 2);
}

}  // namespace
}  // namespace plyfs::test
