// Send and receive (fs/send.h, format.md#send-stream): random histories of
// snapshots sent whole and then incrementally into a second image, each
// received branch equal to its source item for item (inode numbers, modes,
// owners, the four times, xattrs, hard links, holes, preallocated ranges,
// inline data, compressed extents) and byte for byte; the space a chain of
// incrementals takes; streams truncated, corrupted, reordered, forged
// (checksums made right around bad content) or aimed at the wrong parent,
// each refused with nothing left behind (S1, S2); layers.
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/sysmacros.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <random>
#include <set>

#include "commit/superblock.h"
#include "fs/check.h"
#include "fs/items.h"
#include "fs/send.h"
#include "../received_items.h"
#include "fs_image.h"
#include "snap/snap.h"
#include "util/checksum.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

// A stream in memory, as a file descriptor to write and read back.
struct MemFile {
  int fd;
  MemFile() : fd(memfd_create("stream", 0)) { REQUIRE(fd >= 0); }
  ~MemFile() { ::close(fd); }
  std::vector<std::byte> bytes() const {
    struct stat st;
    REQUIRE(fstat(fd, &st) == 0);
    std::vector<std::byte> b(size_t(st.st_size));
    REQUIRE(pread(fd, b.data(), b.size(), 0) == ssize_t(b.size()));
    return b;
  }
  void set(const std::vector<std::byte>& b) {
    REQUIRE(ftruncate(fd, 0) == 0);
    REQUIRE(pwrite(fd, b.data(), b.size(), 0) == ssize_t(b.size()));
    rewind();
  }
  void rewind() { REQUIRE(lseek(fd, 0, SEEK_SET) == 0); }
};

std::vector<std::byte> text(size_t n, std::mt19937_64& r) {
  static const char* words[] = {"plyfs ", "stream ", "extent ", "branch ", "snapshot ", "receive ",
                                "generation ", "zstd ", "block\n", "the ", "of ", "and "};
  std::vector<std::byte> v;
  v.reserve(n + 16);
  while (v.size() < n)
    for (const char* c = words[r() % 12]; *c; c++) v.push_back(std::byte(*c));
  v.resize(n);
  return v;
}

std::vector<std::byte> noise(size_t n, std::mt19937_64& r) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(r());
  return v;
}

std::map<Key, std::vector<std::byte>> items_of(Volume& v, TreeId tree) { return must(test::received_items(v, tree)); }

// Every object's bytes and xattrs as the filesystem reads them.
void require_same_reads(Volume& a, TreeId ta, Volume& b, TreeId tb) {
  auto fa = must(Filesystem::open(a, ta, true));
  auto fb = must(Filesystem::open(b, tb, true));
  std::vector<uint64_t> dirs{fa->root()};
  size_t objects = 0;
  while (!dirs.empty()) {
    const uint64_t d = dirs.back();
    dirs.pop_back();
    std::vector<std::pair<std::string, uint64_t>> ents;
    must(fa->readdir(d, 0, [&](const DirEntry& e) {
      if (e.name != "." && e.name != ".." && e.ino) ents.emplace_back(std::string(e.name), e.ino);
      return true;
    }));
    for (const auto& [name, ino] : ents) {
      INFO("object " << ino << " (" << name << ")");
      objects++;
      Attr x = must(fa->getattr(ino));
      Attr y = must(fb->getattr(ino));
      REQUIRE(x.mode == y.mode);
      REQUIRE(x.size == y.size);
      REQUIRE(x.nlink == y.nlink);
      REQUIRE(x.blocks == y.blocks);
      if (S_ISDIR(x.mode)) dirs.push_back(ino);
      if (S_ISREG(x.mode)) {
        std::vector<std::byte> p(x.size), q(y.size);
        REQUIRE(must(fa->read(ino, 0, p)) == x.size);
        REQUIRE(must(fb->read(ino, 0, q)) == y.size);
        REQUIRE(p == q);
      }
      if (S_ISLNK(x.mode)) REQUIRE(must(fa->readlink(ino)) == must(fb->readlink(ino)));
      auto xs = must(fa->listxattr(ino));
      REQUIRE(xs == must(fb->listxattr(ino)));
      for (const auto& n : xs) REQUIRE(must(fa->getxattr(ino, n)) == must(fb->getxattr(ino, n)));
    }
  }
  (void)objects;
}

void require_equal(Volume& a, TreeId ta, Volume& b, TreeId tb) {
  auto x = items_of(a, ta), y = items_of(b, tb);
  REQUIRE(x.size() == y.size());
  for (auto i = x.begin(), j = y.begin(); i != x.end(); ++i, ++j) {
    INFO("item " << i->first.hi << "/" << std::hex << i->first.lo);
    REQUIRE(i->first == j->first);
    REQUIRE(i->second == j->second);
  }
  require_same_reads(a, ta, b, tb);
}

void require_fs_clean(BlockDevice& dev) {
  VerifyOptions vo;
  vo.kinds = fs_kinds();
  require_clean(dev, vo);
  auto ps = check_filesystems(dev, true);
  for (const auto& p : ps) INFO(p.code << ": " << p.message);
  REQUIRE(ps.empty());
}

// Random changes to a branch: files of text and noise written at random
// places, overwrites inside them, truncates, holes punched, preallocation,
// reflinked copies, hard links, renames, unlinks, directories, symlinks,
// device nodes and FIFOs, xattrs (some out of line), modes, owners, times.
struct Mutator {
  Filesystem& fs;
  std::mt19937_64& r;
  std::vector<uint64_t> files, dirs;
  int names = 0;

  std::string fresh() { return "n" + std::to_string(names++); }
  uint64_t dir() { return dirs[r() % dirs.size()]; }

  void scan() {
    files.clear();
    dirs.clear();
    std::vector<uint64_t> todo{fs.root()};
    while (!todo.empty()) {
      const uint64_t d = todo.back();
      todo.pop_back();
      dirs.push_back(d);
      must(fs.readdir(d, 0, [&](const DirEntry& e) {
        if (e.name == "." || e.name == "..") return true;
        if (e.type == DT_DIR) todo.push_back(e.ino);
        if (e.type == DT_REG) files.push_back(e.ino);
        return true;
      }));
    }
  }

  // A name in some directory, or nullopt.
  std::optional<std::pair<uint64_t, std::string>> some_name() {
    for (int tries = 0; tries < 4; tries++) {
      const uint64_t d = dir();
      std::vector<std::string> ns;
      must(fs.readdir(d, 0, [&](const DirEntry& e) {
        if (e.name != "." && e.name != "..") ns.emplace_back(e.name);
        return true;
      }));
      if (!ns.empty()) return std::make_pair(d, ns[r() % ns.size()]);
    }
    return std::nullopt;
  }

  void step() {
    scan();
    const uint32_t bs = fs.block_size();
    switch (r() % 16) {
      case 0:
      case 1: {  // a new file
        Attr a = must(fs.mknod(dir(), fresh(), S_IFREG | 0644, 0, uint32_t(r() % 3), uint32_t(r() % 3)));
        const size_t n = r() % 3 == 0 ? r() % 3000 : r() % (600 << 10);
        auto data = r() % 2 ? text(n, r) : noise(n, r);
        must(fs.write(a.ino, r() % 4 == 0 ? (r() % 64) * bs : 0, data));
        break;
      }
      case 2:
      case 3: {  // an overwrite inside or past a file
        if (files.empty()) break;
        const uint64_t f = files[r() % files.size()];
        Attr a = must(fs.getattr(f));
        const uint64_t off = a.size ? r() % (a.size + bs) : 0;
        auto data = r() % 2 ? text(1 + r() % (40 << 10), r) : noise(1 + r() % 9000, r);
        must(fs.write(f, off, data));
        break;
      }
      case 4: {  // truncate
        if (files.empty()) break;
        const uint64_t f = files[r() % files.size()];
        Attr a = must(fs.getattr(f));
        SetAttr s;
        s.size = a.size ? r() % (a.size * 2) : r() % 100000;
        (void)must(fs.setattr(f, s));
        break;
      }
      case 5: {  // punch a hole, or preallocate
        if (files.empty()) break;
        const uint64_t f = files[r() % files.size()];
        Attr a = must(fs.getattr(f));
        if (r() % 2 && a.size > bs)
          must(fs.fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, r() % a.size, 1 + r() % (a.size / 2)));
        else
          must(fs.fallocate(f, r() % 2 ? FALLOC_FL_KEEP_SIZE : 0, a.size + (r() % 4) * bs, (1 + r() % 8) * bs));
        break;
      }
      case 6: {  // a reflinked copy into a new file
        if (files.empty()) break;
        const uint64_t f = files[r() % files.size()];
        Attr a = must(fs.getattr(f));
        Attr b = must(fs.mknod(dir(), fresh(), S_IFREG | 0600, 0, 0, 0));
        (void)must(fs.copy_range(f, 0, b.ino, 0, a.size));
        break;
      }
      case 7: {  // a hard link
        if (files.empty()) break;
        (void)fs.link(files[r() % files.size()], dir(), fresh());
        break;
      }
      case 8: {  // rename
        auto n = some_name();
        if (!n) break;
        (void)fs.rename(n->first, n->second, dir(), r() % 4 ? fresh() : "n0", 0);
        break;
      }
      case 9: {  // unlink or rmdir
        auto n = some_name();
        if (!n) break;
        auto e = must(fs.lookup(n->first, n->second));
        if (S_ISDIR(e.mode)) (void)fs.rmdir(n->first, n->second);
        else must(fs.unlink(n->first, n->second));
        break;
      }
      case 10: (void)must(fs.mkdir(dir(), fresh(), 0755, 0, 0)); break;
      case 11: {  // symlinks, a device, a FIFO
        const int k = int(r() % 3);
        if (k == 0) (void)must(fs.symlink(dir(), fresh(), std::string(1 + r() % 300, 'x'), 0, 0));
        if (k == 1) (void)must(fs.mknod(dir(), fresh(), S_IFCHR | 0600, makedev(1, 3), 0, 0));
        if (k == 2) (void)must(fs.mknod(dir(), fresh(), S_IFIFO | 0600, 0, 0, 0));
        break;
      }
      case 12:
      case 13: {  // xattrs, some out of line
        std::vector<uint64_t> objs = files;
        objs.insert(objs.end(), dirs.begin(), dirs.end());
        const uint64_t o = objs[r() % objs.size()];
        const std::string n = "user.x" + std::to_string(r() % 4);
        if (r() % 4 == 0) (void)fs.removexattr(o, n);
        else must(fs.setxattr(o, n, noise(r() % 3 == 0 ? 5000 + r() % 20000 : r() % 100, r), 0));
        break;
      }
      case 14: {  // mode, owner, times
        std::vector<uint64_t> objs = files;
        objs.insert(objs.end(), dirs.begin(), dirs.end());
        SetAttr s;
        s.mode = uint32_t(r() % 07777);
        s.uid = uint32_t(r() % 5);
        s.mtime = timespec{time_t(r() % 2000000000), long(r() % 1000000000)};
        (void)must(fs.setattr(objs[r() % objs.size()], s));
        break;
      }
      case 15: {  // compression flags on a file
        if (files.empty()) break;
        (void)fs.set_fsflags(files[r() % files.size()], r() % 2 ? FS_COMPR_FL : 0);
        break;
      }
    }
  }
};

ReceiveOptions named(std::string n) {
  ReceiveOptions o;
  o.name = std::move(n);
  return o;
}

uint64_t data_blocks(Volume& v) { return v.space_stats().data_blocks; }

}  // namespace

TEST_CASE("send: random histories of snapshots, sent whole and then incrementally, arrive equal", "[send]") {
  const uint64_t seed = test::seed("send-model");
  std::mt19937_64 r(seed);
  INFO("seed " << seed);
  const int rounds = int(5 * test::scale());
  for (int pass = 0; pass < 2; pass++) {
    const bool compress = pass == 1;
    INFO("compression " << compress);
    FsImage src(256ull << 20), dst(256ull << 20);
    if (compress) {
      BranchMeta m = must(Filesystem::branch(*src.vol, src.main));
      m.compress = Compression{Compression::Mode::Zstd, 1, true};
      must(Filesystem::set_branch(*src.vol, m));
    }
    std::optional<TreeId> prev_src;
    std::string prev_name;
    bool later_full = false;  // a full stream after the first: a copy, shared with nothing
    for (int round = 0; round < rounds; round++) {
      INFO("round " << round);
      {
        auto fs = must(Filesystem::open(*src.vol, src.main));
        Mutator mu{*fs, r, {}, {}, round * 1000};
        const int steps = 20 + int(r() % 60);
        for (int i = 0; i < steps; i++) mu.step();
      }
      const std::string name = "s" + std::to_string(round);
      auto snap = must(snapshot(*src.vol, src.main, name));
      must(src.vol->commit());
      MemFile f;
      SendOptions so;
      const bool full = !prev_src || r() % 4 == 0;
      later_full |= full && prev_src;
      if (!full) so.parent = prev_src;
      so.zstd_level = r() % 2 ? 1 + int(r() % 5) : 0;
      SendStats ss = must(send_branch(*src.vol, snap.frozen.tree, f.fd, so));
      REQUIRE(ss.stream_bytes == f.bytes().size());
      f.rewind();
      const uint64_t before = data_blocks(*dst.vol);
      Received got = must(receive_branch(*dst.vol, f.fd, named(name)));
      REQUIRE(got.branch.name == name);
      REQUIRE(got.branch.read_only);
      REQUIRE(got.branch.received_uuid == snap.frozen.uuid);
      REQUIRE(got.branch.uuid != snap.frozen.uuid);
      REQUIRE(bool(got.parent) == !full);
      if (!full) REQUIRE(got.parent->name == prev_name);
      REQUIRE(got.stats.items == ss.items);
      REQUIRE(got.stats.deleted == ss.deleted);
      REQUIRE(got.stats.data_bytes == ss.data_bytes);
      require_equal(*src.vol, snap.frozen.tree, *dst.vol, got.branch.tree);
      // An incremental stream carries the change, not the branch.
      REQUIRE(got.stats.prealloc_bytes == ss.prealloc_bytes);
      if (!full) REQUIRE(data_blocks(*dst.vol) - before <= (ss.data_bytes + ss.prealloc_bytes) / 4096 + 1);
      prev_src = snap.frozen.tree;
      prev_name = name;
    }
    // Everything survives a remount and is clean; the receiver holds about
    // what the sender does (its dead parts of split extents aside), the
    // reflinked copies of the parent's data included (S3).
    dst.reopen();
    require_fs_clean(*dst.dev);
    require_fs_clean(*src.dev);
    INFO("sender " << data_blocks(*src.vol) << " receiver " << data_blocks(*dst.vol));
    if (!later_full) REQUIRE(data_blocks(*dst.vol) <= data_blocks(*src.vol) * 5 / 4 + 64);
    if (compress) {
      // Compressed extents travelled compressed.
      size_t z = 0;
      auto t = must(dst.vol->begin());
      for (auto& b : must(Filesystem::branches(*dst.vol)))
        must(t.scan(b.tree, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
          if (k.hi && fsitems::type_of(k) == disk::ItemType::Extent && must(fsitems::decode_extent(k, v)).compressed())
            z++;
          return true;
        }));
      REQUIRE(z > 0);
    }
  }
}

TEST_CASE("send: a chain of incrementals takes the space of the changes, partial overwrites shared", "[send]") {
  FsImage src(256ull << 20), dst(256ull << 20);
  std::mt19937_64 r(7);
  uint64_t ino;
  {
    auto fs = must(Filesystem::open(*src.vol, src.main));
    ino = must(fs->mknod(fs->root(), "big", S_IFREG | 0644, 0, 0, 0)).ino;
    must(fs->write(ino, 0, noise(16 << 20, r)));
  }
  std::optional<TreeId> prev;
  for (int i = 0; i < 8; i++) {
    if (i) {
      auto fs = must(Filesystem::open(*src.vol, src.main));
      for (int k = 0; k < 4; k++) must(fs->write(ino, (r() % 4096) * 4096, noise(16 << 10, r)));
    }
    auto snap = must(snapshot(*src.vol, src.main, "c" + std::to_string(i)));
    MemFile f;
    SendOptions so;
    so.parent = prev;
    SendStats ss = must(send_branch(*src.vol, snap.frozen.tree, f.fd, so));
    if (i) {
      REQUIRE(ss.data_bytes <= 4 * (16 << 10) + 4 * 8192);  // only what changed travels
      REQUIRE(ss.shared > 0);                               // split items refer to the parent
    }
    f.rewind();
    Received got = must(receive_branch(*dst.vol, f.fd, ReceiveOptions{}));
    REQUIRE(got.branch.name == "c" + std::to_string(i));
    require_equal(*src.vol, snap.frozen.tree, *dst.vol, got.branch.tree);
    prev = snap.frozen.tree;
  }
  // 16 MiB and 7 x 64 KiB of changes, not 8 copies.
  const uint64_t blocks = data_blocks(*dst.vol);
  REQUIRE(blocks <= (16 << 20) / 4096 + 7 * 16 + 32);
  require_fs_clean(*dst.dev);
}

namespace {

// A stream taken apart: its header and its records (type, payload), and
// put back together with fresh sequence numbers, checksums and END, so
// that a test can forge a stream whose every checksum is right.
struct Parsed {
  std::vector<std::byte> header;
  std::vector<std::pair<uint32_t, std::vector<std::byte>>> recs;  // END excluded

  explicit Parsed(const std::vector<std::byte>& s) {
    header.assign(s.begin(), s.begin() + 64);
    size_t at = 64;
    while (at < s.size()) {
      uint32_t type, len;
      std::memcpy(&type, s.data() + at, 4);
      std::memcpy(&len, s.data() + at + 4, 4);
      std::vector<std::byte> p(s.begin() + at + 16, s.begin() + at + 16 + len);
      at += 16 + len + 8;
      if (type != 6) recs.emplace_back(type, std::move(p));
    }
  }

  static uint64_t chain(uint64_t acc, uint64_t sum) {
    const uint64_t both[2] = {acc, sum};
    return xxh3(both, sizeof both);
  }

  std::vector<std::byte> build() const {
    std::vector<std::byte> out = header;
    uint64_t seq = 0, digest = 0, items = 0, deleted = 0, data = 0;
    auto put = [&](uint32_t type, const std::vector<std::byte>& p) {
      std::vector<std::byte> rec(16 + p.size());
      const uint32_t len = uint32_t(p.size());
      std::memcpy(rec.data(), &type, 4);
      std::memcpy(rec.data() + 4, &len, 4);
      std::memcpy(rec.data() + 8, &seq, 8);
      std::memcpy(rec.data() + 16, p.data(), p.size());
      const uint64_t sum = xxh3(std::span<const std::byte>(rec));
      out.insert(out.end(), rec.begin(), rec.end());
      out.insert(out.end(), reinterpret_cast<const std::byte*>(&sum), reinterpret_cast<const std::byte*>(&sum) + 8);
      seq++;
      return sum;
    };
    for (const auto& [type, p] : recs) {
      digest = chain(digest, put(type, p));
      if (type == 2 || type == 4 || type == 5) items++;
      if (type == 3) deleted++;
      if (type == 4) {
        uint32_t vlen;
        std::memcpy(&vlen, p.data() + 32, 4);
        data += p.size() - 40 - vlen;
      }
    }
    std::vector<std::byte> end(40);
    const uint64_t f[5] = {seq, items, deleted, data, digest};
    std::memcpy(end.data(), f, 40);
    put(6, end);
    return out;
  }
};

struct Pair {
  FsImage src{128ull << 20}, dst{128ull << 20};
  TreeId s1{0}, s2{0};
  MemFile full, inc;
  uint64_t ino = 0;

  Pair() {
    std::mt19937_64 r(11);
    {
      auto fs = must(Filesystem::open(*src.vol, src.main));
      for (int i = 0; i < 6; i++) {
        Attr a = must(fs->mknod(fs->root(), "f" + std::to_string(i), S_IFREG | 0644, 0, 0, 0));
        must(fs->write(a.ino, 0, noise(100 << 10, r)));
        must(fs->setxattr(a.ino, "user.k", noise(50, r), 0));
        ino = a.ino;
      }
    }
    s1 = must(snapshot(*src.vol, src.main, "s1")).frozen.tree;
    {
      auto fs = must(Filesystem::open(*src.vol, src.main));
      must(fs->write(ino, 8192, noise(20000, r)));
      must(fs->unlink(fs->root(), "f0"));
      (void)must(fs->mkdir(fs->root(), "d", 0755, 0, 0));
    }
    s2 = must(snapshot(*src.vol, src.main, "s2")).frozen.tree;
    (void)must(send_branch(*src.vol, s1, full.fd, SendOptions{}));
    SendOptions so;
    so.parent = s1;
    (void)must(send_branch(*src.vol, s2, inc.fd, so));
    full.rewind();
    (void)must(receive_branch(*dst.vol, full.fd, ReceiveOptions{}));
    must(dst.vol->commit());
  }
};

// The receiver after a refused stream: the same branches, the same space,
// and clean.
void require_nothing_left(FsImage& im, size_t branches, uint64_t used) {
  must(im.vol->commit());
  REQUIRE(must(Filesystem::branches(*im.vol)).size() == branches);
  REQUIRE(im.vol->space_stats().used_blocks == used);
  im.reopen();
  REQUIRE(must(Filesystem::branches(*im.vol)).size() == branches);
  require_fs_clean(*im.dev);
}

}  // namespace

TEST_CASE("send: data the parent holds, reflinked to another file or place, travels as a reference", "[send]") {
  // cp and copy_file_range reflink what they copy (Filesystem::copy_range):
  // a copy of an old file must not arrive as a second copy of its data.
  FsImage src(128ull << 20), dst(128ull << 20);
  std::mt19937_64 r(17);
  uint64_t a, z;
  {
    auto fs = must(Filesystem::open(*src.vol, src.main));
    a = must(fs->mknod(fs->root(), "a", S_IFREG | 0644, 0, 0, 0)).ino;
    must(fs->write(a, 0, noise(4 << 20, r)));
    z = must(fs->mknod(fs->root(), "z", S_IFREG | 0644, 0, 0, 0)).ino;
    must(fs->set_fsflags(z, FS_COMPR_FL));
    must(fs->write(z, 0, text(1 << 20, r)));
  }
  const TreeId s1 = must(snapshot(*src.vol, src.main, "s1")).frozen.tree;
  {
    auto fs = must(Filesystem::open(*src.vol, src.main));
    const uint64_t d = must(fs->mkdir(fs->root(), "d", 0755, 0, 0)).ino;
    const uint64_t b = must(fs->mknod(d, "b", S_IFREG | 0644, 0, 0, 0)).ino;
    REQUIRE(must(fs->copy_range(a, 0, b, 0, 4 << 20)) == 4u << 20);            // another file, whole
    const uint64_t c = must(fs->mknod(fs->root(), "c", S_IFREG | 0644, 0, 0, 0)).ino;
    REQUIRE(must(fs->copy_range(a, 1 << 20, c, 3 << 20, 1 << 20)) == 1u << 20);  // a part, elsewhere
    REQUIRE(must(fs->copy_range(a, 0, a, 8 << 20, 64 << 10)) == 64u << 10);      // the same file, elsewhere
    const uint64_t y = must(fs->mknod(d, "y", S_IFREG | 0644, 0, 0, 0)).ino;
    REQUIRE(must(fs->copy_range(z, 0, y, 0, 1 << 20)) == 1u << 20);             // compressed frames
    must(fs->write(c, 0, noise(8192, r)));                                        // and new data
  }
  const TreeId s2 = must(snapshot(*src.vol, src.main, "s2")).frozen.tree;
  MemFile full, inc;
  (void)must(send_branch(*src.vol, s1, full.fd, SendOptions{}));
  SendOptions so;
  so.parent = s1;
  const SendStats ss = must(send_branch(*src.vol, s2, inc.fd, so));
  INFO("shared " << ss.shared << ", elsewhere " << ss.shared_elsewhere << ", data " << ss.data_bytes);
  REQUIRE(ss.data_bytes <= 3 * 4096);     // the 8 KiB written, not the 6 MiB copied
  REQUIRE(ss.shared_elsewhere >= 4);      // b, c, a's new tail, y
  full.rewind();
  (void)must(receive_branch(*dst.vol, full.fd, ReceiveOptions{}));
  must(dst.vol->commit());
  const uint64_t before = data_blocks(*dst.vol);
  const uint64_t used = dst.vol->space_stats().used_blocks;
  const size_t nb = must(Filesystem::branches(*dst.vol)).size();
  const auto stream = inc.bytes();

  SECTION("received: equal, and sharing the parent's blocks") {
    inc.rewind();
    Received got = must(receive_branch(*dst.vol, inc.fd, ReceiveOptions{}));
    REQUIRE(got.stats.shared == ss.shared);
    require_equal(*src.vol, s2, *dst.vol, got.branch.tree);
    must(dst.vol->commit());
    REQUIRE(data_blocks(*dst.vol) - before <= 3);
    dst.reopen();
    require_fs_clean(*dst.dev);
  }
  // Forged references to the parent are refused with nothing left (S1, S2).
  SECTION("forged") {
    Parsed ps(stream);
    size_t at = 0;
    for (size_t i = 0; i < ps.recs.size() && !at; i++)
      if (ps.recs[i].first == 5 && ps.recs[i].second[36] == std::byte(2)) {
        Key k, pk;
        std::memcpy(&k.hi, ps.recs[i].second.data(), 8);
        std::memcpy(&pk.hi, ps.recs[i].second.data() + 40, 8);
        if (k.hi != pk.hi) at = i;
      }
    REQUIRE(at);
    auto& pl = ps.recs[at].second;
    int want = EBADMSG;
    SECTION("source 1 (the same file) naming another file's extent") { pl[36] = std::byte(1); }
    SECTION("another extent of the parent, holding other data") {
      const Key other = fsitems::ikey(z, disk::ItemType::Extent, 0);
      std::memcpy(pl.data() + 40, &other.hi, 8);
      std::memcpy(pl.data() + 48, &other.lo, 8);
      want = ESTALE;
    }
    SECTION("a key the parent does not hold") {
      const Key none = fsitems::ikey(a, disk::ItemType::Extent, 123457);
      std::memcpy(pl.data() + 40, &none.hi, 8);
      std::memcpy(pl.data() + 48, &none.lo, 8);
      want = ESTALE;
    }
    SECTION("a delta past the parent's extent") {
      const uint64_t far = 1 << 20;
      std::memcpy(pl.data() + 56, &far, 8);
    }
    SECTION("an unknown source") { pl[36] = std::byte(3); }
    MemFile f;
    f.set(ps.build());
    auto res = receive_branch(*dst.vol, f.fd, ReceiveOptions{});
    REQUIRE(!res);
    INFO(res.error().message());
    CHECK(res.error().code == want);
    REQUIRE(!dst.vol->failure());
    require_nothing_left(dst, nb, used);
  }
}

TEST_CASE("send: truncated, corrupt, reordered and forged streams are refused with nothing left", "[send]") {
  Pair p;
  const auto good = p.inc.bytes();
  const size_t nb = must(Filesystem::branches(*p.dst.vol)).size();
  must(p.dst.vol->commit());
  const uint64_t used = p.dst.vol->space_stats().used_blocks;
  MemFile f;
  auto refused = [&](const std::vector<std::byte>& s, int code) {
    f.set(s);
    auto r = receive_branch(*p.dst.vol, f.fd, ReceiveOptions{});
    REQUIRE(!r);
    INFO(r.error().message());
    CHECK(r.error().code == code);
    require_nothing_left(p.dst, nb, used);
  };
  SECTION("truncated anywhere") {
    std::mt19937_64 r(3);
    for (size_t cut : {size_t(0), size_t(10), size_t(64), size_t(70), good.size() / 2, good.size() - 1,
                       good.size() - 48, size_t(64 + r() % (good.size() - 64))})
      refused(std::vector<std::byte>(good.begin(), good.begin() + cut), EBADMSG);
  }
  SECTION("a byte flipped anywhere") {
    std::mt19937_64 r(5);
    for (int i = 0; i < 12; i++) {
      auto s = good;
      s[r() % s.size()] ^= std::byte(1 + r() % 255);
      f.set(s);
      auto res = receive_branch(*p.dst.vol, f.fd, ReceiveOptions{});
      REQUIRE(!res);
      require_nothing_left(p.dst, nb, used);
    }
  }
  SECTION("records reordered") {
    const std::vector<std::byte>& s = good;
    // Swap the second and third records, each with its own checksum intact.
    size_t at = 64;
    std::vector<std::pair<size_t, size_t>> spans;
    while (at < s.size()) {
      uint32_t len;
      std::memcpy(&len, s.data() + at + 4, 4);
      spans.emplace_back(at, 16 + len + 8);
      at += 16 + len + 8;
    }
    REQUIRE(spans.size() > 4);
    std::vector<std::byte> t(s.begin(), s.begin() + spans[1].first);
    t.insert(t.end(), s.begin() + spans[2].first, s.begin() + spans[2].first + spans[2].second);
    t.insert(t.end(), s.begin() + spans[1].first, s.begin() + spans[1].first + spans[1].second);
    t.insert(t.end(), s.begin() + spans[3].first, s.end());
    refused(t, EBADMSG);
  }
  SECTION("bytes after END") {
    auto s = good;
    s.push_back(std::byte(0));
    refused(s, EBADMSG);
  }
  SECTION("forged: extent data that is not what its checksums say") {
    Parsed ps(good);
    bool done = false;
    for (auto& [type, pl] : ps.recs)
      if (type == 4 && !done) {
        pl.back() ^= std::byte(0x40);
        done = true;
      }
    REQUIRE(done);
    refused(ps.build(), EBADMSG);
  }
  SECTION("forged: an inode dropped, its name left pointing at nothing") {
    // The full stream, into an image without it: a Dirent of the root
    // stays, the Inode it names goes.
    FsImage other(64ull << 20);
    must(other.vol->commit());
    const uint64_t used0 = other.vol->space_stats().used_blocks;
    Parsed ps(p.full.bytes());
    for (size_t i = 0; i < ps.recs.size(); i++) {
      auto& [type, pl] = ps.recs[i];
      uint64_t lo;
      std::memcpy(&lo, pl.data() + 8, 8);
      if (type == 2 && (lo >> 56) == uint64_t(disk::ItemType::Inode) && i > 2) {
        ps.recs.erase(ps.recs.begin() + long(i));
        break;
      }
    }
    f.set(ps.build());
    auto r = receive_branch(*other.vol, f.fd, ReceiveOptions{});
    REQUIRE(!r);
    CHECK(r.error().code == EUCLEAN);
    require_nothing_left(other, 1, used0);
    // The untouched stream is received there; on the image that holds it
    // already, it is refused by its identity.
    f.set(p.full.bytes());
    (void)must(receive_branch(*other.vol, f.fd, ReceiveOptions{}));
    f.set(p.full.bytes());
    auto again = receive_branch(*p.dst.vol, f.fd, named("again"));
    REQUIRE(!again);
    CHECK(again.error().code == EEXIST);
  }
  SECTION("forged: a SHARED reference to data never sent") {
    Parsed ps(good);
    for (auto& [type, pl] : ps.recs)
      if (type == 4) {
        // Turn the EXTENT into a SHARED from the stream, its data dropped.
        uint32_t vlen;
        std::memcpy(&vlen, pl.data() + 32, 4);
        std::vector<std::byte> n(pl.begin(), pl.begin() + 32);
        std::vector<std::byte> sr(32);
        std::memcpy(sr.data(), &vlen, 4);
        n.insert(n.end(), sr.begin(), sr.end());
        n.insert(n.end(), pl.begin() + 40, pl.begin() + 40 + vlen);
        pl = n;
        type = 5;
        break;
      }
    refused(ps.build(), EBADMSG);
  }
}

// A parent's hash of an extent item as ItemHead.old_hash carries it (send.cpp's
// item_hash): what is the image's own left out.
uint64_t old_hash_of(Key k, std::span<const std::byte> v) {
  auto e = must(fsitems::decode_extent(k, v));
  e.disk_start = 0;
  if (!e.compressed()) {
    e.disk_nblocks = 0;
    e.offset = 0;
  }
  const auto n = fsitems::encode_extent(e);
  return xxh3(std::span<const std::byte>(n));
}

// Found by fuzz_receive (tests/fuzz/corpus-recv/): records whose checksums
// are right around content only a forger writes.
TEST_CASE("send: forged SHARED deltas and keys sent twice are refused, the volume stays writable", "[send]") {
  Pair p;
  MemFile f;
  SECTION("a SHARED delta that wraps past its parent's extent (S2)") {
    const size_t nb = must(Filesystem::branches(*p.dst.vol)).size();
    must(p.dst.vol->commit());
    const uint64_t used = p.dst.vol->space_stats().used_blocks;
    Parsed ps(p.inc.bytes());
    bool done = false;
    for (auto& [type, pl] : ps.recs)
      if (type == 5 && pl[36] == std::byte(1) && !done) {
        const uint64_t wrap = ~uint64_t(0);  // delta + nblocks wraps to below the parent's length
        std::memcpy(pl.data() + 56, &wrap, 8);
        done = true;
      }
    REQUIRE(done);
    f.set(ps.build());
    auto r = receive_branch(*p.dst.vol, f.fd, ReceiveOptions{});
    REQUIRE(!r);
    CHECK(r.error().code == EBADMSG);
    REQUIRE(!p.dst.vol->failure());
    require_nothing_left(p.dst, nb, used);
  }
  SECTION("an inode range up to the counter's limit: the superblock stays valid (S1)") {
    // max_ino 2^63 - 1 made the counter 2^63, which no superblock holds.
    FsImage other(64ull << 20);
    must(other.vol->commit());
    const uint64_t used0 = other.vol->space_stats().used_blocks;
    Parsed ps(p.full.bytes());
    REQUIRE(ps.recs[0].first == 1);
    for (uint64_t max_ino : {uint64_t(1) << 63, (uint64_t(1) << 63) - 1}) {
      std::memcpy(ps.recs[0].second.data() + 144, &max_ino, 8);
      f.set(ps.build());
      auto r = receive_branch(*other.vol, f.fd, ReceiveOptions{});
      REQUIRE(!r);
      CHECK(r.error().code == EBADMSG);
      require_nothing_left(other, 1, used0);
      require_fs_clean(*other.dev);  // both superblock slots
    }
  }
  SECTION("a SHARED record of a frame the stream sent, with another frame length or size (S2)") {
    // A compressed file whose frame a partial overwrite split: a full
    // stream carries the frame once and shares it with the second item.
    FsImage src(64ull << 20);
    std::mt19937_64 r(13);
    {
      auto fs = must(Filesystem::open(*src.vol, src.main));
      Attr a = must(fs->mknod(fs->root(), "z", S_IFREG | 0644, 0, 0, 0));
      must(fs->set_fsflags(a.ino, FS_COMPR_FL));
      must(fs->write(a.ino, 0, text(16 * 4096, r)));
      must(fs->write(a.ino, 5 * 4096, noise(4096, r)));
    }
    must(src.vol->commit());
    MemFile full;
    (void)must(send_branch(*src.vol, src.main, full.fd, SendOptions{}));
    for (int field = 0; field < 3; field++) {
      INFO("field " << field);
      FsImage other(64ull << 20);
      must(other.vol->commit());
      const uint64_t used0 = other.vol->space_stats().used_blocks;
      Parsed ps(full.bytes());
      bool done = false;
      for (auto& [type, pl] : ps.recs)
        if (type == 5 && pl[36] == std::byte(0) && pl.size() >= 64 + 40 && pl[64 + 28] != std::byte(0) && !done) {
          // The value after ItemHead and SharedRec: disk::Extent, then
          // ExtentFrame {frame_bytes, ram_blocks}.
          uint32_t frame_bytes, ram_blocks, nblocks;
          std::memcpy(&nblocks, pl.data() + 64 + 24, 4);
          std::memcpy(&frame_bytes, pl.data() + 64 + 32, 4);
          std::memcpy(&ram_blocks, pl.data() + 64 + 36, 4);
          if (field == 0) frame_bytes--;
          if (field == 1) ram_blocks++;
          if (field == 2) frame_bytes = 1;
          std::memcpy(pl.data() + 64 + 32, &frame_bytes, 4);
          std::memcpy(pl.data() + 64 + 36, &ram_blocks, 4);
          done = true;
        }
      REQUIRE(done);
      f.set(ps.build());
      auto res = receive_branch(*other.vol, f.fd, named("z"));
      if (res) require_fs_clean(*other.dev);  // with data: every frame decoded
      REQUIRE(!res);
      CHECK(res.error().code == EBADMSG);
      require_nothing_left(other, 1, used0);
    }
  }
  SECTION("a key sent twice: its extent deleted, then shared from the stream (S1)") {
    FsImage other(64ull << 20);
    must(other.vol->commit());
    const uint64_t used0 = other.vol->space_stats().used_blocks;
    Parsed ps(p.full.bytes());
    size_t at = 0;
    for (size_t i = 0; i < ps.recs.size() && !at; i++)
      if (ps.recs[i].first == 4) at = i;
    REQUIRE(at);
    const auto ext = ps.recs[at].second;
    uint32_t vlen;
    std::memcpy(&vlen, ext.data() + 32, 4);
    const std::span<const std::byte> value(ext.data() + 40, vlen);
    Key k;
    std::memcpy(&k.hi, ext.data(), 8);
    std::memcpy(&k.lo, ext.data() + 8, 8);
    // DELETE of the key just put, with the hash of what it put.
    std::vector<std::byte> del(ext.begin(), ext.begin() + 32);
    const uint64_t h = old_hash_of(k, value);
    std::memcpy(del.data() + 16, &h, 8);
    del[24] = std::byte(1);
    // SHARED from the stream: the data the EXTENT carried, freed by then.
    std::vector<std::byte> sh(ext.begin(), ext.begin() + 32);
    std::vector<std::byte> sr(32);
    std::memcpy(sr.data(), &vlen, 4);
    sh.insert(sh.end(), sr.begin(), sr.end());
    sh.insert(sh.end(), value.begin(), value.end());
    ps.recs.insert(ps.recs.begin() + long(at) + 1, {uint32_t(3), del});
    ps.recs.insert(ps.recs.begin() + long(at) + 2, {uint32_t(5), sh});
    f.set(ps.build());
    auto r = receive_branch(*other.vol, f.fd, ReceiveOptions{});
    REQUIRE(!r);
    INFO(r.error().message());
    CHECK(r.error().code == EBADMSG);
    REQUIRE(!other.vol->failure());
    require_nothing_left(other, 1, used0);
  }
}

TEST_CASE("send: an incremental stream needs its parent, unchanged", "[send]") {
  Pair p;
  const size_t nb = must(Filesystem::branches(*p.dst.vol)).size();
  const uint64_t used = p.dst.vol->space_stats().used_blocks;
  SECTION("the parent is not on the image") {
    FsImage other(64ull << 20);
    p.inc.rewind();
    auto r = receive_branch(*other.vol, p.inc.fd, ReceiveOptions{});
    REQUIRE(!r);
    CHECK(r.error().code == ENOENT);
    REQUIRE(must(Filesystem::branches(*other.vol)).size() == 1);
  }
  SECTION("the parent here was changed where the stream changes it") {
    auto s1 = must(Filesystem::find(*p.dst.vol, "s1"));
    REQUIRE(s1);
    {
      auto fs = must(Filesystem::open(*p.dst.vol, s1->tree));
      must(fs->write(p.ino, 8192, std::vector<std::byte>(100, std::byte(1))));
    }
    must(p.dst.vol->commit());
    const uint64_t used2 = p.dst.vol->space_stats().used_blocks;
    p.inc.rewind();
    auto r = receive_branch(*p.dst.vol, p.inc.fd, ReceiveOptions{});
    REQUIRE(!r);
    CHECK(r.error().code == ESTALE);
    require_nothing_left(p.dst, nb, used2);
  }
  SECTION("applied, it finds the parent by its received uuid") {
    p.inc.rewind();
    Received got = must(receive_branch(*p.dst.vol, p.inc.fd, ReceiveOptions{}));
    REQUIRE(got.parent);
    REQUIRE(got.parent->name == "s1");
    require_equal(*p.src.vol, p.s2, *p.dst.vol, got.branch.tree);
    (void)used;
  }
}

TEST_CASE("send: a layer arrives as a layer on the received branch below it", "[send]") {
  FsImage src(64ull << 20), dst(64ull << 20);
  {
    auto fs = must(Filesystem::open(*src.vol, src.main));
    Attr a = must(fs->mknod(fs->root(), "base-file", S_IFREG | 0644, 0, 0, 0));
    must(fs->write(a.ino, 0, bytes("below")));
  }
  FsCreateOptions lo;
  lo.name = "top";
  lo.parent = src.main;
  TreeId top = must(Filesystem::create(*src.vol, lo));
  {
    auto fs = must(Filesystem::open(*src.vol, top));
    Attr a = must(fs->mknod(fs->root(), "top-file", S_IFREG | 0644, 0, 0, 0));
    must(fs->write(a.ino, 0, bytes("above")));
    must(fs->whiteout(fs->root(), "base-file"));
  }
  must(src.vol->commit());
  MemFile layer, base;
  (void)must(send_branch(*src.vol, top, layer.fd, SendOptions{}));
  (void)must(send_branch(*src.vol, src.main, base.fd, SendOptions{}));
  // The layer before the branch it lies on: refused, nothing left.
  layer.rewind();
  auto r = receive_branch(*dst.vol, layer.fd, ReceiveOptions{});
  REQUIRE(!r);
  CHECK(r.error().code == ENOENT);
  base.rewind();
  Received b = must(receive_branch(*dst.vol, base.fd, named("base")));
  layer.rewind();
  Received l = must(receive_branch(*dst.vol, layer.fd, ReceiveOptions{}));
  REQUIRE(l.branch.name == "top");
  REQUIRE(l.branch.parent == b.branch.tree);
  require_equal(*src.vol, top, *dst.vol, l.branch.tree);
  require_fs_clean(*dst.dev);
}

TEST_CASE("send: a branch larger than one batch of items is sent whole", "[send]") {
  FsImage src(128ull << 20), dst(128ull << 20);
  {
    auto fs = must(Filesystem::open(*src.vol, src.main));
    uint64_t d = fs->root();
    for (int i = 0; i < 3000; i++) {
      if (i % 500 == 0) d = must(fs->mkdir(fs->root(), "d" + std::to_string(i), 0755, 0, 0)).ino;
      Attr a = must(fs->mknod(d, "f" + std::to_string(i), S_IFREG | 0644, 0, 0, 0));
      must(fs->write(a.ino, 0, bytes("content " + std::to_string(i))));
      must(fs->setxattr(a.ino, "user.i", bytes(std::to_string(i)), 0));
    }
  }
  must(src.vol->commit());
  REQUIRE(items_of(*src.vol, src.main).size() > 2 * 4096);
  MemFile f;
  SendStats ss = must(send_branch(*src.vol, src.main, f.fd, SendOptions{}));
  REQUIRE(ss.items + 1 == items_of(*src.vol, src.main).size());
  f.rewind();
  Received got = must(receive_branch(*dst.vol, f.fd, named("copy")));
  require_equal(*src.vol, src.main, *dst.vol, got.branch.tree);
  require_fs_clean(*dst.dev);
}
