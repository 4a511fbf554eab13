// fsck's passes 5-6 (filesystem objects, branches, views) and their repairs
// (issue 5): crafted damage to the items of filesystem trees and to the
// catalog, each on a fresh copy of one image that holds every kind of
// object: directories, inline and extent files, hard links, a symlink, a
// device node, xattrs (one of them 64 KiB, out of line), and a layer with a
// whiteout and an opaque directory,
// shown by a view. Every case checks what `fsck -n` reports, that `-p`
// repairs exactly the repairs that lose nothing, that `-y` repairs the rest,
// that a repaired image checks clean, and what the repaired tree holds.
#include "fsck/fsck.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <dirent.h>

#include <cstring>
#include <set>

#include "../lib/test_util.h"
#include "fs/check.h"
#include "fs/corrupt_fs.h"
#include "commit/superblock.h"
#include "fsck/corrupt.h"
#include "snap/snap.h"
#include "fs/disk_fs.h"
#include "fs/fs.h"
#include "fs/items.h"
#include "union/union.h"
#include "union/view.h"
#include "util/checksum.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

using disk::ItemType;

Key ikey(uint64_t obj, ItemType t, uint64_t off = 0) {
  return Key{obj, (uint64_t(t) << 56) | (off & disk::kOffMask)};
}
uint64_t name_hash(std::string_view n) {
  uint64_t h = xxh3(n.data(), n.size()) & disk::kOffMask;
  return h ? h : 1;
}

struct Image {
  std::unique_ptr<MemDevice> dev;
  TreeId base, layer;
  uint64_t root = 0, dir = 0, sub = 0, small = 0, big = 0, linked = 0, sym = 0, node = 0, opq = 0;
};

std::vector<std::byte> pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i++) v[i] = std::byte((i * 7 + seed) & 0xff);
  return v;
}

const Image& base_image() {
  static Image img = [] {
    Image im;
    im.dev = std::make_unique<MemDevice>(64 << 20);
    must(format_filesystem(*im.dev, FormatOptions{}, FsCreateOptions{}));
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    auto vol = must(Volume::open(*im.dev, vo));
    im.base = must(Filesystem::default_tree(*vol));
    {
      auto fs = must(Filesystem::open(*vol, im.base));
      im.root = fs->root();
      im.dir = must(fs->mkdir(im.root, "dir", 0755, 0, 0)).ino;
      im.sub = must(fs->mkdir(im.dir, "sub", 0755, 0, 0)).ino;
      im.small = must(fs->mknod(im.dir, "small", S_IFREG | 0644, 0, 0, 0)).ino;
      must(fs->write(im.small, 0, pattern(300, 1)));
      im.big = must(fs->mknod(im.sub, "big", S_IFREG | 0644, 0, 0, 0)).ino;
      must(fs->write(im.big, 0, pattern(5 * 4096 + 100, 2)));
      im.linked = must(fs->mknod(im.root, "linked", S_IFREG | 0600, 0, 0, 0)).ino;
      must(fs->write(im.linked, 0, pattern(9000, 3)));
      must(fs->link(im.linked, im.dir, "link2"));
      must(fs->setxattr(im.linked, "user.colour", bytes("blue"), 0));
      must(fs->setxattr(im.linked, "user.big", pattern(65536, 5), 0));  // out of line
      im.sym = must(fs->symlink(im.root, "sym", "dir/small", 0, 0)).ino;
      im.node = must(fs->mknod(im.root, "fifo", S_IFIFO | 0644, 0, 0, 0)).ino;
      for (int i = 0; i < 40; i++) must(fs->mknod(im.sub, "f" + std::to_string(i), S_IFREG | 0644, 0, 0, 0));
    }
    FsCreateOptions lo;
    lo.name = "top";
    lo.parent = im.base;
    im.layer = must(Filesystem::create(*vol, lo));
    {
      auto fs = must(Filesystem::open(*vol, im.layer));
      must(fs->whiteout(fs->root(), "fifo"));
      im.opq = must(fs->mkdir(fs->root(), "dir", 0755, 0, 0)).ino;
      SetAttr s;
      s.opaque = true;
      must(fs->setattr(im.opq, s));
      auto f = must(fs->mknod(im.opq, "new", S_IFREG | 0644, 0, 0, 0));
      must(fs->write(f.ino, 0, pattern(100, 4)));
    }
    must(put_view(*vol, View{"v", true, {{im.layer, true}, {im.base, false}}}));
    must(vol->commit());
    return im;
  }();
  return img;
}

FsckReport fsck(BlockDevice& dev, FsckMode mode) {
  FsckOptions fo;
  set_object_passes(fo, false);
  fo.mode = mode;
  return must(fsck_run(dev, fo));
}

std::set<std::string> codes(const FsckReport& r) {
  std::set<std::string> out;
  for (const auto& p : r.problems)
    if (p.fix != FixClass::Info) out.insert(p.code);
  return out;
}

std::string describe(const FsckReport& r) {
  std::string s;
  for (const auto& p : r.problems)
    s += "pass " + std::to_string(p.pass) + " " + p.code + " [" + fix_class_name(p.fix) + (p.fixed ? ", fixed" : "") +
         "] tree " + std::to_string(p.tree) + ": " + p.message + "\n";
  for (const auto& a : r.actions) s += "action: " + a + "\n";
  return s;
}

// Raw changes to the items of a committed image, as a broken program or a
// damaged (but checksummed) node would leave them.
struct Edit {
  std::unique_ptr<MemDevice> dev;
  std::unique_ptr<Volume> vol;
  explicit Edit(const Image& im) : dev(im.dev->clone()) {
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    vol = must(Volume::open(*dev, vo));
  }
  std::vector<std::byte> get(TreeId t, Key k) {
    auto txn = must(vol->begin());
    auto v = must(txn.get(t, k));
    REQUIRE(v);
    return *v;
  }
  void put(TreeId t, Key k, std::span<const std::byte> v) {
    auto txn = must(vol->begin({.reserve_blocks = 20}));
    must(txn.put(t, k, v));
  }
  void erase(TreeId t, Key k) {
    auto txn = must(vol->begin({.reserve_blocks = 20}));
    REQUIRE(must(txn.erase(t, k)));
  }
  template <class F>
  void inode(TreeId t, uint64_t ino, F fn) {
    auto v = get(t, ikey(ino, ItemType::Inode));
    fn(*view_as<disk::Inode>(std::span(v)));
    put(t, ikey(ino, ItemType::Inode), v);
  }
  // Edits the records of the item holding `name` in directory `dir`.
  template <class F>
  void dirent(TreeId t, uint64_t dir, std::string_view name, F fn) {
    const Key k = ikey(dir, ItemType::Dirent, name_hash(name));
    auto v = get(t, k);
    size_t p = 0;
    bool found = false;
    while (p < v.size()) {
      auto* d = view_as<disk::Dirent>(std::span(v), p);
      std::string_view n(reinterpret_cast<const char*>(v.data() + p + sizeof(disk::Dirent)), d->name_len);
      if (n == name) {
        fn(*d);
        found = true;
      }
      p += sizeof(disk::Dirent) + n.size();
    }
    REQUIRE(found);
    put(t, k, v);
  }
  void remove_name(TreeId t, uint64_t dir, std::string_view name) {
    const Key k = ikey(dir, ItemType::Dirent, name_hash(name));
    auto v = get(t, k);
    REQUIRE(v.size() == sizeof(disk::Dirent) + name.size());  // alone in its item
    erase(t, k);
  }
  std::unique_ptr<MemDevice> done() {
    must(vol->commit());
    vol.reset();
    return std::move(dev);
  }
};

// The repaired tree, read through the layer.
struct Reader {
  std::unique_ptr<Volume> vol;
  std::unique_ptr<Filesystem> fs;
  Reader(BlockDevice& dev, TreeId t) {
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    vo.read_only = true;
    vol = must(Volume::open(dev, vo));
    fs = must(Filesystem::open(*vol, t, true));
  }
  std::vector<std::byte> content(uint64_t ino) {
    auto a = must(fs->getattr(ino));
    std::vector<std::byte> out(a.size);
    REQUIRE(must(fs->read(ino, 0, out)) == a.size);
    return out;
  }
};

// The whole cycle for one damage: -n reports `code` (exit 4); -p repairs it
// (exit 1) when every problem is Safe, or refuses and changes nothing
// (exit 4); -y repairs (exit 1); the result checks clean. Returns the image
// -y repaired.
std::unique_ptr<MemDevice> cycle(std::unique_ptr<MemDevice> dev, const std::string& code, bool safe) {
  auto n = fsck(*dev, FsckMode::Check);
  INFO(describe(n));
  REQUIRE(n.exit_code == kFsckUncorrected);
  REQUIRE(codes(n).count(code));
  for (const auto& p : n.problems)
    if (p.code == code) CHECK(p.fix == (safe ? FixClass::Preen : FixClass::Yes));

  auto preen = dev->clone();
  auto p = fsck(*preen, FsckMode::Preen);
  INFO("preen:\n" << describe(p));
  if (safe) {
    REQUIRE(p.exit_code == kFsckCorrected);
    REQUIRE(fsck(*preen, FsckMode::Check).exit_code == kFsckClean);
  } else {
    REQUIRE(p.exit_code == kFsckUncorrected);
    REQUIRE(!p.written);
    REQUIRE(codes(fsck(*preen, FsckMode::Check)) == codes(n));  // nothing changed
  }

  auto y = fsck(*dev, FsckMode::Yes);
  INFO("yes:\n" << describe(y));
  REQUIRE(y.exit_code == kFsckCorrected);
  REQUIRE(y.remaining() == 0);
  REQUIRE(!y.actions.empty());
  auto again = fsck(*dev, FsckMode::Check);
  INFO("after:\n" << describe(again));
  REQUIRE(again.exit_code == kFsckClean);
  return dev;
}

}  // namespace

TEST_CASE("fsck objects: the image is clean", "[fsck][objects]") {
  const Image& im = base_image();
  auto dev = im.dev->clone();
  auto r = fsck(*dev, FsckMode::Check);
  INFO(describe(r));
  REQUIRE(r.exit_code == kFsckClean);
}

// Pass 5 takes its items from the walk of passes 2-4, which reads a subtree
// two clones share once: the clone walked second must still be checked whole.
TEST_CASE("fsck objects: trees sharing nodes with a clone are each checked whole", "[fsck][objects]") {
  const Image& im = base_image();
  Edit d(im);
  TreeId copy;
  {
    auto c = must(clone_branch(*d.vol, im.base, "copy", false));
    copy = c.tree;
  }
  must(d.vol->commit());
  // One damage in each tree, in leaves the other no longer shares; the rest
  // of the two trees is still shared.
  d.inode(im.base, im.linked, [](disk::Inode& i) { i.nlink.set(5); });
  d.inode(copy, im.small, [](disk::Inode& i) { i.nlink.set(9); });
  auto dev = d.done();
  FsckOptions fo;
  set_object_passes(fo, false);
  auto fed = must(fsck_run(*dev, fo));
  INFO(describe(fed));
  std::set<std::pair<uint64_t, std::string>> found;
  for (const auto& p : fed.problems)
    if (p.code == "F2-nlink") found.emplace(p.tree, p.message.substr(0, p.message.find(':')));
  CHECK(found == std::set<std::pair<uint64_t, std::string>>{
                     {im.base.v, "inode " + std::to_string(im.linked)},
                     {copy.v, "inode " + std::to_string(im.small)}});
  FsckOptions scan = fo;
  scan.object_feed = nullptr;
  CHECK(describe(must(fsck_run(*dev, scan))) == describe(fed));
  auto y = fsck(*dev, FsckMode::Preen);
  CHECK(y.exit_code == kFsckCorrected);
  CHECK(fsck(*dev, FsckMode::Check).exit_code == kFsckClean);
}

TEST_CASE("fsck objects: counts and back-pointers are preen repairs", "[fsck][objects]") {
  const Image& im = base_image();
  Edit d(im);
  SECTION("a file's link count") {
    d.inode(im.base, im.linked, [](disk::Inode& i) { i.nlink.set(7); });
    auto dev = cycle(d.done(), "F2-nlink", true);
    Reader r(*dev, im.base);
    CHECK(must(r.fs->getattr(im.linked)).nlink == 2);
    CHECK(r.content(im.linked) == pattern(9000, 3));
  }
  SECTION("a directory's link count and size") {
    d.inode(im.base, im.dir, [](disk::Inode& i) {
      i.nlink.set(9);
      i.size.set(1);
    });
    auto dev = cycle(d.done(), "F2-dirsize", true);
    Reader r(*dev, im.base);
    auto a = must(r.fs->getattr(im.dir));
    CHECK(a.nlink == 3);  // . and .. and sub
    CHECK(a.size == 3);   // sub, small, link2
  }
  SECTION("a file's block count") {
    d.inode(im.base, im.big, [](disk::Inode& i) { i.blocks.set(1); });
    auto dev = cycle(d.done(), "F4-blocks", true);
    CHECK(must(Reader(*dev, im.base).fs->getattr(im.big)).blocks == 6 * 8);
  }
  SECTION("a directory's parent field") {
    d.inode(im.base, im.sub, [&](disk::Inode& i) { i.parent.set(im.root); });
    auto dev = cycle(d.done(), "F3-parent", true);
    Reader r(*dev, im.base);
    CHECK(must(r.fs->path(im.big)) == std::optional<std::string>("/dir/sub/big"));
  }
  SECTION("an entry's type") {
    d.dirent(im.base, im.root, "sym", [](disk::Dirent& e) { e.type = DT_REG; });
    auto dev = cycle(d.done(), "F2-dirent", true);
    Reader r(*dev, im.base);
    CHECK(must(r.fs->entry(im.root, "sym"))->type == DT_LNK);
    CHECK(must(r.fs->readlink(im.sym)) == "dir/small");
  }
  SECTION("the opaque flag on a file") {
    d.inode(im.base, im.small, [](disk::Inode& i) { i.flags.set(i.flags.get() | disk::kInodeOpaque); });
    cycle(d.done(), "U2-opaque", true);
  }
  SECTION("a whiteout that names an inode") {
    d.dirent(im.layer, must(Filesystem::open(*d.vol, im.layer, true))->root(), "fifo",
             [&](disk::Dirent& e) { e.ino.set(im.node); });
    auto dev = cycle(d.done(), "U1-whiteout", true);
    Reader r(*dev, im.layer);
    auto e = must(r.fs->entry(r.fs->root(), "fifo"));
    REQUIRE(e);
    CHECK(e->type == disk::kDtWhiteout);
    CHECK(e->ino == 0);
  }
  SECTION("an orphan entry for a named file (the next mount would free it)") {
    d.put(im.base, ikey(0, ItemType::Orphan, im.small), {});
    auto dev = cycle(d.done(), "F6-orphan-named", true);
    CHECK(Reader(*dev, im.base).content(im.small) == pattern(300, 1));
  }
  SECTION("an entry filed under the wrong hash") {
    auto v = d.get(im.base, ikey(im.dir, ItemType::Dirent, name_hash("small")));
    d.erase(im.base, ikey(im.dir, ItemType::Dirent, name_hash("small")));
    d.put(im.base, ikey(im.dir, ItemType::Dirent, 12345), v);
    auto dev = cycle(d.done(), "F2-hash", true);
    Reader r(*dev, im.base);
    CHECK(must(r.fs->lookup(im.dir, "small")).ino == im.small);
  }
  SECTION("the inode counter behind the numbers in use") {
    // A tree holding a number the counter has not reached: the next create
    // would hand it out again.
    auto v = d.get(im.base, ikey(im.small, ItemType::Inode));
    d.put(im.base, ikey(1u << 20, ItemType::Inode), v);
    d.dirent(im.base, im.dir, "small", [](disk::Dirent& e) { e.ino.set(1u << 20); });
    auto dev = d.done();
    auto n = fsck(*dev, FsckMode::Check);
    INFO(describe(n));
    REQUIRE(codes(n).count("F8-ino"));
    REQUIRE(fsck(*dev, FsckMode::Yes).exit_code == kFsckCorrected);  // and the old inode goes to lost+found
    REQUIRE(fsck(*dev, FsckMode::Check).exit_code == kFsckClean);
    REQUIRE(must(read_superblocks(*dev)).info.next_inode > (1u << 20));
  }
}

TEST_CASE("fsck objects: repairs that give something up need -y", "[fsck][objects]") {
  const Image& im = base_image();
  Edit d(im);
  SECTION("a file no entry names goes to /lost+found") {
    d.remove_name(im.base, im.sub, "big");
    auto dev = cycle(d.done(), "F2-unattached", false);
    Reader r(*dev, im.base);
    auto lf = must(r.fs->lookup(im.root, "lost+found"));
    CHECK((lf.mode & 0777) == 0700);
    CHECK(must(r.fs->lookup(lf.ino, "#" + std::to_string(im.big))).ino == im.big);
    CHECK(r.content(im.big) == pattern(5 * 4096 + 100, 2));
    CHECK(must(r.fs->getattr(im.big)).nlink == 1);
  }
  SECTION("a directory no entry names goes to /lost+found with what it holds") {
    d.remove_name(im.base, im.dir, "sub");
    auto dev = cycle(d.done(), "F3-unattached", false);
    Reader r(*dev, im.base);
    auto lf = must(r.fs->lookup(im.root, "lost+found"));
    CHECK(must(r.fs->lookup(lf.ino, "#" + std::to_string(im.sub))).ino == im.sub);
    CHECK(must(r.fs->lookup(im.sub, "big")).ino == im.big);
    CHECK(must(r.fs->path(im.big)) == "/lost+found/#" + std::to_string(im.sub) + "/big");
    CHECK(must(r.fs->getattr(im.dir)).nlink == 2);
    CHECK(must(r.fs->getattr(lf.ino)).nlink == 3);
  }
  SECTION("an entry whose inode is gone, and the items left of that inode") {
    d.erase(im.base, ikey(im.big, ItemType::Inode));
    auto dev = cycle(d.done(), "F2-dirent", false);
    Reader r(*dev, im.base);
    CHECK(!r.fs->lookup(im.sub, "big"));
    // Its extents went back to free space: pass 4 counted every reference.
    CHECK(must(r.fs->getattr(im.sub)).size == 40);
  }
  SECTION("a name that is both an entry and a whiteout: the entry wins") {
    auto layer_root = must(Filesystem::open(*d.vol, im.layer, true))->root();
    const Key k = ikey(layer_root, ItemType::Dirent, name_hash("fifo"));
    auto v = d.get(im.layer, k);
    // Append a record of the same name naming a file of the layer.
    const uint64_t file = must(Filesystem::open(*d.vol, im.layer, true))->lookup(im.opq, "new")->ino;
    std::vector<std::byte> rec(sizeof(disk::Dirent) + 4);
    auto* e = view_as<disk::Dirent>(std::span(rec));
    e->ino.set(file);
    e->type = DT_REG;
    e->seq = 5;
    e->name_len = 4;
    std::memcpy(rec.data() + sizeof(disk::Dirent), "fifo", 4);
    v.insert(v.end(), rec.begin(), rec.end());
    d.put(im.layer, k, v);
    auto dev = cycle(d.done(), "U1-conflict", false);
    Reader r(*dev, im.layer);
    auto got = must(r.fs->entry(r.fs->root(), "fifo"));
    REQUIRE(got);
    CHECK(got->ino == file);
    CHECK(must(r.fs->getattr(file)).nlink == 2);
  }
  SECTION("a directory item cut short keeps its readable entries") {
    auto v = d.get(im.base, ikey(im.root, ItemType::Dirent, name_hash("linked")));
    v.resize(v.size() - 2);
    d.put(im.base, ikey(im.root, ItemType::Dirent, name_hash("linked")), v);
    auto dev = cycle(d.done(), "F-item", false);
    Reader r(*dev, im.base);
    // "linked" lost its name there; its other name keeps it.
    CHECK(!r.fs->lookup(im.root, "linked"));
    CHECK(must(r.fs->lookup(im.dir, "link2")).ino == im.linked);
    CHECK(must(r.fs->getattr(im.linked)).nlink == 1);
  }
  SECTION("two branches with one name, and a view naming a branch that is gone") {
    auto b = must(Filesystem::branch(*d.vol, im.layer));
    b.name = "main";
    must(Filesystem::set_branch(*d.vol, b));
    {
      // put_view(Volume&) refuses such a stack; the raw one does not check.
      auto txn = must(d.vol->begin({.reserve_blocks = kViewBlocks}));
      must(put_view(txn, View{"w", false, {{TreeId{im.layer.v + 100}, false}, {im.base, false}}}));
    }
    auto dev = d.done();
    auto n = fsck(*dev, FsckMode::Check);
    INFO(describe(n));
    REQUIRE(codes(n) == std::set<std::string>{"U3-branch", "U4-view"});
    REQUIRE(fsck(*dev, FsckMode::Yes).exit_code == kFsckCorrected);
    REQUIRE(fsck(*dev, FsckMode::Check).exit_code == kFsckClean);
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    auto vol = must(Volume::open(*dev, vo));
    std::set<std::string> names;
    for (auto& br : must(Filesystem::branches(*vol))) names.insert(br.name);
    CHECK(names.size() == 2);
    CHECK(must(view_stack(*vol, "w")).size() == 1);
  }
}

TEST_CASE("fsck objects: roots, inline flags, damaged data and view records", "[fsck][objects]") {
  const Image& im = base_image();
  Edit d(im);
  auto info = [&](auto fn) {
    auto v = d.get(im.base, ikey(0, ItemType::FsInfo));
    fn(*view_as<disk::FsInfo>(std::span(v)));
    d.put(im.base, ikey(0, ItemType::FsInfo), v);
  };
  SECTION("the info item names a file and the root's parent field is damaged: the only nameless directory") {
    info([&](disk::FsInfo& i) { i.root_ino.set(im.small); });
    d.inode(im.base, im.root, [&](disk::Inode& i) { i.parent.set(im.dir); });
    auto dev = cycle(d.done(), "F1-info", false);
    Reader r(*dev, im.base);
    CHECK(r.fs->root() == im.root);
    CHECK(must(r.fs->lookup(im.sub, "big")).ino == im.big);
    CHECK(!r.fs->lookup(im.root, "lost+found"));
  }
  SECTION("no directory can be the root: a new one, with everything in /lost+found") {
    info([&](disk::FsInfo& i) { i.root_ino.set(im.small); });
    d.erase(im.base, ikey(im.root, ItemType::Inode));
    auto dev = d.done();
    auto n = fsck(*dev, FsckMode::Check);
    INFO(describe(n));
    REQUIRE(describe(n).find("no directory can be the root") != std::string::npos);
    dev = cycle(std::move(dev), "F1-info", false);
    Reader r(*dev, im.base);
    CHECK(r.fs->root() != im.root);
    auto lf = must(r.fs->lookup(r.fs->root(), "lost+found"));
    // The old root came back as a directory of its own, with its entries.
    auto old = must(r.fs->lookup(lf.ino, "#" + std::to_string(im.root)));
    CHECK(old.ino == im.root);
    CHECK(must(r.fs->lookup(im.root, "linked")).ino == im.linked);
    CHECK(r.content(im.big) == pattern(5 * 4096 + 100, 2));
    CHECK(r.content(im.small) == pattern(300, 1));
  }
  SECTION("the inline flag on a file whose data is in extents: cleared, nothing lost") {
    d.inode(im.base, im.big, [](disk::Inode& i) { i.flags.set(i.flags.get() | disk::kInodeInline); });
    auto dev = cycle(d.done(), "F5-inline", true);
    Reader r(*dev, im.base);
    CHECK(r.content(im.big) == pattern(5 * 4096 + 100, 2));
  }
  SECTION("inline data without the inline flag: set again, nothing lost") {
    d.inode(im.base, im.small, [](disk::Inode& i) { i.flags.set(i.flags.get() & ~disk::kInodeInline); });
    auto dev = cycle(d.done(), "F5-inline", true);
    Reader r(*dev, im.base);
    CHECK(r.content(im.small) == pattern(300, 1));
  }
  SECTION("an inline file that also has extent items: the extents go") {
    {
      // An extent of another file, referenced properly: only the objects
      // are wrong.
      auto v = d.get(im.base, ikey(im.big, ItemType::Extent, 0));
      auto txn = must(d.vol->begin({.reserve_blocks = 20}));
      must(txn.put(im.base, ikey(im.small, ItemType::Extent, 0), v));
      must(txn.inc_extent(BlockNo{view_as<disk::Extent>(std::span<const std::byte>(v))->disk_start.get()}));
    }
    auto dev = d.done();
    auto n = fsck(*dev, FsckMode::Check);
    INFO(describe(n));
    REQUIRE(describe(n).find("inline file with extent items") != std::string::npos);
    dev = cycle(std::move(dev), "F5-inline", false);
    Reader r(*dev, im.base);
    CHECK(r.content(im.small) == pattern(300, 1));
    CHECK(r.content(im.big) == pattern(5 * 4096 + 100, 2));
    CHECK(must(r.fs->getattr(im.small)).blocks == 0);
  }
  SECTION("a data block that fails its checksum becomes a hole with fsck -c -y") {
    auto v = d.get(im.base, ikey(im.big, ItemType::Extent, 0));
    const auto* e = view_as<disk::Extent>(std::span<const std::byte>(v));
    const uint64_t blk = e->disk_start.get() + e->offset.get() + 2;  // file block 2
    auto dev = d.done();
    dev->poke(blk * 4096 + 100, bytes("x"));
    FsckOptions fo;
    set_object_passes(fo, true);
    fo.mode = FsckMode::Check;
    CHECK(fsck(*dev, FsckMode::Check).exit_code == kFsckClean);  // only -c reads data
    auto n = must(fsck_run(*dev, fo));
    INFO(describe(n));
    REQUIRE(codes(n) == std::set<std::string>{"F7-data"});
    for (const auto& p : n.problems)
      if (p.code == "F7-data") CHECK(p.fix == FixClass::Yes);
    fo.mode = FsckMode::Preen;
    CHECK(must(fsck_run(*dev, fo)).exit_code == kFsckUncorrected);
    fo.mode = FsckMode::Yes;
    auto y = must(fsck_run(*dev, fo));
    INFO(describe(y));
    CHECK(y.exit_code == kFsckCorrected);
    fo.mode = FsckMode::Check;
    CHECK(must(fsck_run(*dev, fo)).exit_code == kFsckClean);
    Reader r(*dev, im.base);
    auto want = pattern(5 * 4096 + 100, 2);
    std::fill(want.begin() + 2 * 4096, want.begin() + 3 * 4096, std::byte{0});
    CHECK(r.content(im.big) == want);
    CHECK(must(r.fs->getattr(im.big)).blocks == 5 * 8);
  }
  SECTION("a mode with no file type, and entries that disagree: the object's items decide") {
    d.inode(im.base, im.linked, [](disk::Inode& i) { i.mode.set(i.mode.get() & 07777); });
    d.dirent(im.base, im.dir, "link2", [](disk::Dirent& e) { e.type = DT_DIR; });
    auto dev = cycle(d.done(), "F-mode", false);
    Reader r(*dev, im.base);
    CHECK(S_ISREG(must(r.fs->getattr(im.linked)).mode));
    CHECK(r.content(im.linked) == pattern(9000, 3));
    CHECK(must(r.fs->entry(im.dir, "link2"))->type == DT_REG);
  }
  SECTION("a view record that does not decode goes; the other views stay") {
    must(put_view(*d.vol, View{"w", false, {{im.base, false}}}));
    must(d.vol->commit());
    {
      auto txn = must(d.vol->begin({.reserve_blocks = 20}));
      for (const auto& t : must(txn.list_trees())) {
        if (t.kind != kKindPlain) continue;
        std::optional<Key> first;
        must(txn.scan(t.id, Key{1, 0}, Key{1, ~0ull}, [&](Key k, std::span<const std::byte>) {
          first = k;
          return false;
        }));
        REQUIRE(first);
        auto v = must(txn.get(t.id, *first));
        v->resize(v->size() - 3);
        must(txn.put(t.id, *first, *v));
      }
    }
    auto dev = cycle(d.done(), "U4-view", false);
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    auto vol = must(Volume::open(*dev, vo));
    auto views = must(list_views(*vol));
    REQUIRE(views.size() == 1);
    CHECK(views[0].name == "w");
  }
}

namespace {

// The out-of-line record of xattr `name` of `ino` (format.md#fs-xattr).
fsitems::XattrRec outline_of(Edit& d, TreeId t, uint64_t ino, const std::string& name) {
  const Key k = ikey(ino, ItemType::Xattr, name_hash(name));
  for (auto& x : must(fsitems::decode_xattrs(k, d.get(t, k))))
    if (x.name == name) {
      REQUIRE(x.outline);
      return x;
    }
  FAIL("no xattr " << name);
  return {};
}
Key chunk(uint64_t ino, uint64_t id, uint64_t off) { return fsitems::xattr_chunk_key(ino, id, off); }

}  // namespace

TEST_CASE("fsck objects: out-of-line xattr values and their chunks (F9)", "[fsck][objects]") {
  const Image& im = base_image();
  Edit d(im);
  const auto x = outline_of(d, im.base, im.linked, "user.big");
  REQUIRE(x.length == 65536);
  const uint64_t last = 66 * 984;  // 67 chunks of 984 bytes at 4 KiB blocks, the last 592
  auto lost = [&](std::unique_ptr<MemDevice> dev) {
    Reader r(*dev, im.base);
    CHECK(r.fs->getxattr(im.linked, "user.big").error().code == ENODATA);
    CHECK(must(r.fs->getxattr(im.linked, "user.colour")) == bytes("blue"));
    CHECK(r.content(im.linked) == pattern(9000, 3));
  };
  SECTION("chunks no record names go") {
    d.put(im.base, chunk(im.linked, 12345, 0), pattern(984, 1));
    d.put(im.base, chunk(im.linked, 12345, 984), pattern(10, 1));
    auto dev = cycle(d.done(), "F-xattr-chunk", false);
    Reader r(*dev, im.base);
    CHECK(must(r.fs->getxattr(im.linked, "user.big")) == pattern(65536, 5));
    auto t = must(r.vol->begin());
    CHECK(!must(t.get(im.base, chunk(im.linked, 12345, 0))));
  }
  SECTION("a value whose chunks are all missing goes") {
    for (uint64_t o = 0; o <= last; o += 984) d.erase(im.base, chunk(im.linked, x.value_id, o));
    lost(cycle(d.done(), "F-xattr-value", false));
  }
  SECTION("a value cut short goes") {
    d.erase(im.base, chunk(im.linked, x.value_id, last));
    lost(cycle(d.done(), "F-xattr-value", false));
  }
  SECTION("a value with a gap goes, with its other chunks") {
    d.erase(im.base, chunk(im.linked, x.value_id, 984 * 10));
    auto dev = cycle(d.done(), "F-xattr-value", false);
    Reader r(*dev, im.base);
    auto t = must(r.vol->begin());
    CHECK(!must(t.get(im.base, chunk(im.linked, x.value_id, 0))));
    lost(std::move(dev));
  }
  SECTION("a chunk numbered out of sequence") {
    auto v = d.get(im.base, chunk(im.linked, x.value_id, 984));
    d.erase(im.base, chunk(im.linked, x.value_id, 984));
    d.put(im.base, chunk(im.linked, x.value_id, 985), v);
    lost(cycle(d.done(), "F-xattr-value", false));
  }
  SECTION("chunk bytes past the value's length are cut; the value stays") {
    auto v = d.get(im.base, chunk(im.linked, x.value_id, last));
    REQUIRE(v.size() == 592);
    v.resize(700);
    d.put(im.base, chunk(im.linked, x.value_id, last), v);
    d.put(im.base, chunk(im.linked, x.value_id, 65000), pattern(100, 9));
    auto dev = cycle(d.done(), "F-xattr-value", false);
    Reader r(*dev, im.base);
    CHECK(must(r.fs->getxattr(im.linked, "user.big")) == pattern(65536, 5));
  }
  SECTION("two records with one value id: the later goes") {
    {
      auto fs = must(Filesystem::open(*d.vol, im.base));
      must(fs->setxattr(im.linked, "user.two", pattern(20000, 6), 0));
    }
    const Key k = ikey(im.linked, ItemType::Xattr, name_hash("user.two"));
    auto xs = must(fsitems::decode_xattrs(k, d.get(im.base, k)));
    REQUIRE(xs.size() == 1);
    const uint64_t own = xs[0].value_id;
    xs[0].value_id = x.value_id;
    d.put(im.base, k, fsitems::encode_xattrs(xs));
    auto dev = cycle(d.done(), "F-xattr-value", false);
    Reader r(*dev, im.base);
    // Its own chunks, which nothing named any more, went too (F-xattr-chunk).
    auto t = must(r.vol->begin());
    CHECK(!must(t.get(im.base, chunk(im.linked, own, 0))));
    const bool kept_big = bool(r.fs->getxattr(im.linked, "user.big"));
    const bool kept_two = bool(r.fs->getxattr(im.linked, "user.two"));
    CHECK(kept_big != kept_two);  // one record stays, reading the shared chunks
    if (kept_big) CHECK(must(r.fs->getxattr(im.linked, "user.big")) == pattern(65536, 5));
  }
  SECTION("the OUTLINE flag on an inline record") {
    const Key k = ikey(im.linked, ItemType::Xattr, name_hash("user.colour"));
    auto v = d.get(im.base, k);
    v[1] = std::byte{disk::kXattrOutline};
    d.put(im.base, k, v);
    auto dev = cycle(d.done(), "F-item", false);
    Reader r(*dev, im.base);
    CHECK(r.fs->getxattr(im.linked, "user.colour").error().code == ENODATA);
    CHECK(must(r.fs->getxattr(im.linked, "user.big")) == pattern(65536, 5));
  }
  SECTION("unknown flag bits and a reserved field are cleared") {
    const Key k = ikey(im.linked, ItemType::Xattr, name_hash("user.big"));
    auto v = d.get(im.base, k);
    v[1] = std::byte{disk::kXattrOutline | 0x40};
    v[v.size() - 1] = std::byte{1};  // XattrOutline.reserved
    d.put(im.base, k, v);
    auto dev = cycle(d.done(), "F-reserved", true);
    CHECK(must(Reader(*dev, im.base).fs->getxattr(im.linked, "user.big")) == pattern(65536, 5));
  }
  SECTION("an out-of-line value on an image without LARGE_XATTR") {
    auto dev = d.done();
    REQUIRE((must(read_superblocks(*dev)).info.incompat & kIncompatLargeXattr));
    must(corrupt(*dev, CorruptTarget{CorruptStruct::Superblock, -1, 0, "incompat"},
                 CorruptAction{Damage::Zero, 0, 0, true}));
    dev = cycle(std::move(dev), "F-xattr-feature", true);
    CHECK((must(read_superblocks(*dev)).info.incompat & kIncompatLargeXattr));
    CHECK(must(Reader(*dev, im.base).fs->getxattr(im.linked, "user.big")) == pattern(65536, 5));
  }
}

TEST_CASE("fsck objects: a structural repair is followed by the object repairs", "[fsck][objects]") {
  // A leaf of the base tree becomes unreadable: -y rebuilds the tree from
  // what is readable, then (R4) checks again and mends the objects the lost
  // leaf leaves behind (dangling entries, unnamed objects, counts).
  const Image& im = base_image();
  Edit d(im);
  {
    auto fs = must(Filesystem::open(*d.vol, im.base));
    for (int i = 0; i < 300; i++) must(fs->mknod(im.sub, "g" + std::to_string(i), S_IFREG | 0644, 0, 0, 0));
  }
  // One more generation that leaves the base tree alone, so that both
  // superblocks reach the leaf damaged below (no older generation to fall
  // back to).
  must(d.vol->commit());
  {
    auto top = must(Filesystem::open(*d.vol, im.layer));
    must(top->mkdir(top->root(), "x", 0755, 0, 0));
  }
  auto dev = d.done();
  // A leaf in the middle of the base tree becomes unreadable.
  auto ch = must(read_superblocks(*dev));
  std::vector<uint64_t> leaves;
  {
    VolumeOptions o;
    o.kinds = fs_kinds();
    o.read_only = true;
    auto vol = must(Volume::open(*dev, o));
    auto txn = must(vol->begin());
    BlockCache cache(*dev, ch.info.block_size, 16 << 20);
    WalkMemo memo;
    std::vector<Problem> ps;
    WalkHooks h;
    h.on_node = [&](BlockNo b, int level, Generation, uint64_t, bool) {
      if (level == 0) leaves.push_back(b.v);
    };
    check_tree(cache, ch.info.fs_id, must(txn.tree_info(im.base)).root, ch.info.generation, h, memo, ps);
    REQUIRE(ps.empty());
  }
  REQUIRE(leaves.size() >= 3);
  must(corrupt(*dev, CorruptTarget{CorruptStruct::Node, -1, leaves[leaves.size() / 2], "nitems"},
               CorruptAction{Damage::Set, 9999, 0, true}));
  auto n = fsck(*dev, FsckMode::Check);
  INFO(describe(n));
  REQUIRE(n.exit_code == kFsckUncorrected);
  auto y = fsck(*dev, FsckMode::Yes);
  INFO("yes:\n" << describe(y));
  REQUIRE(y.exit_code == kFsckCorrected);
  auto after = fsck(*dev, FsckMode::Check);
  INFO("after:\n" << describe(after));
  REQUIRE(after.exit_code == kFsckClean);
  // Both kinds of repair happened.
  bool structural = false, objects = false;
  for (const auto& p : y.problems) {
    structural |= p.pass <= 4 && p.fixed;
    objects |= p.pass >= 5 && p.fixed;
  }
  CHECK(structural);
  CHECK(objects);
}

namespace {

// Reads everything a tree holds through the filesystem layer, as a mount
// would: every call may fail, none may crash. Returns the errors seen.
int walk_all(Volume& vol, TreeId tree) {
  auto fs = Filesystem::open(vol, tree, true);
  if (!fs) return 1;
  int errors = 0;
  std::set<uint64_t> seen;
  std::vector<uint64_t> todo{(*fs)->root()};
  while (!todo.empty() && seen.size() < 10000) {
    const uint64_t dir = todo.back();
    todo.pop_back();
    if (!seen.insert(dir).second) continue;
    std::vector<std::pair<std::string, uint64_t>> names;
    auto r = (*fs)->readdir(dir, 0, [&](const DirEntry& e) {
      if (e.name != "." && e.name != "..") names.emplace_back(std::string(e.name), e.ino);
      return names.size() < 10000;
    });
    errors += !r;
    for (const auto& [name, ino] : names) {
      auto a = (*fs)->lookup(dir, name);
      if (!a) {
        errors++;
        continue;
      }
      errors += !(*fs)->listxattr(a->ino);
      errors += !(*fs)->getxattr(a->ino, "user.colour") && true;
      errors += !(*fs)->getxattr(a->ino, "user.big") && true;
      if (S_ISDIR(a->mode)) todo.push_back(a->ino);
      else if (S_ISLNK(a->mode)) errors += !(*fs)->readlink(a->ino);
      else if (S_ISREG(a->mode)) {
        std::vector<std::byte> buf(std::min<uint64_t>(a->size, 1 << 20));
        errors += !(*fs)->read(a->ino, 0, buf);
        errors += !(*fs)->lseek(a->ino, 0, SEEK_HOLE);
      }
    }
  }
  return errors;
}

struct Target {
  FsTarget t;
  std::string label;
};

std::vector<Target> every_structure(const Image& im, Volume& vol) {
  const uint64_t layer_root = must(Filesystem::open(vol, im.layer, true))->root();
  auto tg = [](FsStruct s, TreeId tree, uint64_t ino, std::string name, uint64_t off, std::string label) {
    return Target{FsTarget{s, tree, ino, std::move(name), off, {}}, std::move(label)};
  };
  return {
      tg(FsStruct::FsInfo, im.base, 0, "", 0, "base branch"),
      tg(FsStruct::FsInfo, im.layer, 0, "", 0, "layer"),
      tg(FsStruct::Inode, im.base, im.root, "", 0, "root directory"),
      tg(FsStruct::Inode, im.base, im.dir, "", 0, "directory"),
      tg(FsStruct::Inode, im.base, im.linked, "", 0, "hard-linked extent file with an xattr"),
      tg(FsStruct::Inode, im.base, im.small, "", 0, "inline file"),
      tg(FsStruct::Inode, im.base, im.sym, "", 0, "symlink"),
      tg(FsStruct::Inode, im.base, im.node, "", 0, "fifo"),
      tg(FsStruct::Inode, im.layer, im.opq, "", 0, "opaque directory"),
      tg(FsStruct::Dirent, im.base, im.root, "linked", 0, "entry of a file"),
      tg(FsStruct::Dirent, im.base, im.dir, "sub", 0, "entry of a directory"),
      tg(FsStruct::Dirent, im.base, im.root, "sym", 0, "entry of a symlink"),
      tg(FsStruct::Whiteout, im.layer, layer_root, "fifo", 0, "whiteout"),
      tg(FsStruct::Xattr, im.base, im.linked, "user.colour", 0, "xattr"),
      tg(FsStruct::Xattr, im.base, im.linked, "user.big", 0, "out-of-line xattr"),
      tg(FsStruct::XattrChunk, im.base, im.linked, "user.big", 0, "first chunk of an xattr value"),
      tg(FsStruct::XattrChunk, im.base, im.linked, "user.big", 66 * 984, "last chunk of an xattr value"),
      tg(FsStruct::Extent, im.base, im.big, "", 0, "extent"),
      tg(FsStruct::Inline, im.base, im.small, "", 0, "inline data"),
      tg(FsStruct::Inline, im.base, im.sym, "", 0, "symlink target"),
  };
}

}  // namespace

TEST_CASE("fsck objects: every field of every filesystem structure, damaged in turn", "[fsck][objects]") {
  const Image& im = base_image();
  std::vector<Target> targets;
  {
    auto dev = im.dev->clone();
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    vo.read_only = true;
    auto vol = must(Volume::open(*dev, vo));
    targets = every_structure(im, *vol);
  }
  const std::vector<std::pair<CorruptAction, std::string>> damages{
      {CorruptAction{Damage::Flip, 0, 0, true}, "flip bit 0"},
      {CorruptAction{Damage::Flip, 0, 63, true}, "flip the top bit"},
      {CorruptAction{Damage::Zero, 0, 0, true}, "zero"},
      {CorruptAction{Damage::Set, ~0ull, 0, true}, "all ones"},
  };
  size_t runs = 0, detected = 0, repaired = 0, refused = 0;
  std::map<std::string, int> undetected;
  for (const auto& target : targets)
    for (const auto& field : fs_corrupt_fields(target.t.what))
      for (const auto& [act, how] : damages) {
        auto dev = im.dev->clone();
        FsTarget t = target.t;
        t.field = field;
        const std::string label = target.label + " (" + fs_struct_name(t.what) + "." + field + "), " + how;
        INFO(label);
        std::string what;
        {
          VolumeOptions vo;
          vo.kinds = fs_kinds();
          auto vol = must(Volume::open(*dev, vo));
          auto r = corrupt_fs(*vol, t, act);
          if (!r) {
            INFO(r.error().message());
            REQUIRE(r.error().code == EINVAL);  // a field this item does not have (e.g. a short name)
            continue;
          }
          what = *r;
        }
        INFO(what);
        if (what.find("(unchanged)") != std::string::npos) continue;  // zero of a zero
        runs++;
        FsckOptions fo;
        set_object_passes(fo, true);
        fo.mode = FsckMode::Check;
        auto n = must(fsck_run(*dev, fo));
        INFO(describe(n));
        CHECK((n.exit_code == kFsckClean || n.exit_code == kFsckUncorrected));
        {
          // Pass 5 fed by the walk of passes 2-4 finds exactly what its own
          // scan of every tree finds.
          FsckOptions scan = fo;
          scan.object_feed = nullptr;
          auto s = must(fsck_run(*dev, scan));
          CHECK(describe(s) == describe(n));
        }
        if (n.exit_code == kFsckUncorrected) detected++;
        else {
          undetected[std::string(fs_struct_name(t.what)) + "." + field]++;
          UNSCOPED_INFO("not reported: " << label << ": " << what);
        }
        {
          // A mount of the damaged image reads what it can and never crashes.
          VolumeOptions vo;
          vo.kinds = fs_kinds();
          vo.read_only = true;
          auto vol = Volume::open(*dev, vo);
          if (vol) {
            walk_all(**vol, im.base);
            walk_all(**vol, im.layer);
          }
        }
        fo.mode = FsckMode::Yes;
        auto y = must(fsck_run(*dev, fo));
        INFO("yes:\n" << describe(y));
        fo.mode = FsckMode::Check;
        auto after = must(fsck_run(*dev, fo));
        INFO("after:\n" << describe(after));
        if (n.exit_code == kFsckClean) {
          CHECK(y.exit_code == kFsckClean);
          continue;
        }
        CHECK((y.exit_code == kFsckCorrected || y.exit_code == kFsckUncorrected));
        if (y.exit_code == kFsckCorrected) {
          repaired++;
          CHECK(after.exit_code == kFsckClean);
        } else {
          // Cleanly refused: what is left is what no repair can mend.
          refused++;
          CHECK(after.exit_code == kFsckUncorrected);
          for (const auto& p : after.problems)
            if (p.fix != FixClass::Info) CHECK(p.fix == FixClass::None);
        }
      }
  // Damage no check can tell from a change a program could have made: times,
  // owners, permission bits, sizes, names, a sequence number, a flag a
  // program may set, an item moved to another object that has none, the
  // bytes of an xattr value.
  const std::set<std::string> free_fields{
      "dirent.seq",     "fsinfo.branch_flags", "fsinfo.created_ns", "fsinfo.name",    "fsinfo.parent",
      "fsinfo.version", "inline.data",         "inode.atime.sec",   "inode.ctime.sec", "inode.flags",
      "inode.generation", "inode.gid",         "inode.mode",        "inode.mtime.nsec", "inode.parent",
      "inode.rdev",     "inode.size",          "inode.uid",         "whiteout.key.hi", "whiteout.seq",
      "xattr.key.hi",   "xattr-chunk.data"};
  std::string list;
  for (const auto& [f, c] : undetected) {
    list += f + " x" + std::to_string(c) + "\n";
    CHECK(free_fields.count(f));
  }
  WARN(runs << " damaged images: " << detected << " reported, " << repaired << " repaired, " << refused
            << " refused; not reported (fields any value may take):\n"
            << list);
  CHECK(runs > 300);
}
