// zstd compression of file data (fs/compress.h, format.md#fs-compress): the
// frame codec and its refusals; the policy (file flags, branch default,
// mount option, inheritance); an fsx-style random test of compressed and
// plain files against a model, with remounts, overwrites inside frames,
// truncates, holes, preallocation and copies between compressed and plain
// files; sharing through snapshots, clones, copy-up, merge and rollback; and
// damage in a frame found by scrub (every path named), fsck -c and reads.
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>

#include <map>
#include <random>
#include <set>

#include "commit/superblock.h"
#include "fs/check.h"
#include "fs/compress.h"
#include "fs/items.h"
#include "fs/scrub.h"
#include "fs_image.h"
#include "snap/snap.h"
#include "union/union.h"
#include "union/view.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

// Text-like bytes: words from a small vocabulary, about 4:1 under zstd -1.
std::vector<std::byte> text(size_t n, uint64_t seed) {
  static const char* words[] = {"plyfs ", "frame ", "extent ", "branch ", "snapshot ", "copy-on-write ",
                                "generation ", "zstd ", "block\n", "the ", "of ", "and "};
  std::mt19937_64 r(seed);
  std::vector<std::byte> v;
  v.reserve(n + 16);
  while (v.size() < n)
    for (const char* c = words[r() % 12]; *c; c++) v.push_back(std::byte(*c));
  v.resize(n);
  return v;
}

std::vector<std::byte> noise(size_t n, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(r());
  return v;
}

std::vector<std::byte> read_all(Filesystem& fs, uint64_t ino) {
  Attr a = must(fs.getattr(ino));
  std::vector<std::byte> out(a.size);
  REQUIRE(must(fs.read(ino, 0, out)) == a.size);
  return out;
}

// The extent items of a file in one tree.
std::vector<fsitems::Ext> extents_of(Volume& v, TreeId tree, uint64_t ino) {
  std::vector<fsitems::Ext> out;
  auto t = must(v.begin());
  must(t.scan(tree, Key{ino, 0}, Key{ino, ~0ull}, [&](Key k, std::span<const std::byte> val) {
    if (fsitems::type_of(k) == disk::ItemType::Extent) out.push_back(must(fsitems::decode_extent(k, val)));
    return true;
  }));
  return out;
}

size_t compressed_items(Volume& v, TreeId tree, uint64_t ino) {
  size_t n = 0;
  for (const auto& e : extents_of(v, tree, ino)) n += e.compressed();
  return n;
}

void require_fs_clean(BlockDevice& dev, bool data = true) {
  VerifyOptions vo;
  vo.kinds = fs_kinds();
  require_clean(dev, vo);
  auto ps = check_filesystems(dev, data);
  for (const auto& p : ps) INFO(p.code << ": " << p.message);
  REQUIRE(ps.empty());
}

Compression zstd(int level, bool force = false) { return Compression{Compression::Mode::Zstd, level, force}; }

}  // namespace

TEST_CASE("compress: frames round-trip; what does not pay, is damaged or decodes to another length is refused",
          "[fs][compress]") {
  const uint32_t bs = 4096;
  const auto t = text(32 * bs, 1);
  auto z = compress_frame(t, 1, bs);
  REQUIRE(z);
  CHECK(z->size() < t.size() / 3);
  std::vector<std::byte> out(t.size());
  must(decompress_frame(*z, out));
  CHECK(out == t);
  // Noise does not compress: no frame, and the quick test says so first.
  CHECK(!compress_frame(noise(32 * bs, 2), 1, bs));
  CHECK(!looks_compressible(noise(32 * bs, 3)));
  CHECK(looks_compressible(t));
  // One block never saves a block.
  CHECK(!compress_frame(std::span(t).first(bs), 19, bs));
  // A frame that decodes to more or fewer bytes than the item says is EIO,
  // never an overflow.
  std::vector<std::byte> small(t.size() - bs), big(t.size() + bs);
  CHECK(decompress_frame(*z, small).error().code == EIO);
  CHECK(decompress_frame(*z, big).error().code == EIO);
  // Truncated or damaged frames: EIO (or, for a flip zstd cannot see, other
  // bytes of the right length), never a crash.
  CHECK(decompress_frame(std::span(*z).first(z->size() / 2), out).error().code == EIO);
  std::mt19937_64 r(5);
  for (int i = 0; i < 2000; i++) {
    auto d = *z;
    for (int k = 0; k < 1 + int(r() % 4); k++) d[r() % d.size()] ^= std::byte(1 + r() % 255);
    auto res = decompress_frame(d, out);
    if (!res) CHECK(res.error().code == EIO);
  }
  // The text form of the policy, as the options and plyctl take it.
  CHECK(must(parse_compression("zstd")) == zstd(0));
  CHECK(must(parse_compression("zstd:7")) == zstd(7));
  CHECK(must(parse_compression("none")).mode == Compression::Mode::None);
  for (const char* bad : {"zstd:0", "zstd:20", "zstd:", "zstd:-1", "lz4", "zlib:3", ""})
    CHECK(parse_compression(bad).error().code == EINVAL);
  CHECK(compression_name(zstd(0)) == "zstd:3");
  CHECK(compression_name(zstd(9)) == "zstd:9");
}

TEST_CASE("compress: the most specific setting wins, and directories pass their flags on", "[fs][compress]") {
  using M = Compression::Mode;
  const Compression none{M::None}, unset;
  // effective_compression(inode flags, branch, mount)
  CHECK(effective_compression(0, unset, unset) == unset);
  CHECK(effective_compression(0, unset, zstd(1, true)) == zstd(1, true));
  CHECK(effective_compression(0, none, zstd(1)).mode == M::None);
  CHECK(effective_compression(0, zstd(5), unset) == zstd(5));
  CHECK(effective_compression(0, zstd(5), zstd(1, true)) == zstd(5, true));
  CHECK(effective_compression(disk::kInodeCompress, none, unset) == zstd(0));
  CHECK(effective_compression(disk::kInodeCompress, unset, zstd(9)) == zstd(9));
  CHECK(effective_compression(disk::kInodeNoCompress, zstd(5), zstd(1, true)).mode == M::None);

  FsImage im;
  auto fs = must(Filesystem::open(*im.vol, im.main));
  auto d = must(fs->mkdir(fs->root(), "d", 0755, 0, 0));
  CHECK(must(fs->get_fsflags(d.ino)) == 0u);
  CHECK(fs->set_fsflags(d.ino, FS_IMMUTABLE_FL).error().code == EOPNOTSUPP);
  CHECK(fs->set_fsflags(d.ino, FS_COMPR_FL | FS_NOCOMP_FL).error().code == EINVAL);
  must(fs->set_fsflags(d.ino, FS_COMPR_FL));
  CHECK(must(fs->get_fsflags(d.ino)) == uint32_t(FS_COMPR_FL));
  auto f = must(fs->mknod(d.ino, "f", S_IFREG | 0644, 0, 0, 0));
  auto sub = must(fs->mkdir(d.ino, "sub", 0755, 0, 0));
  auto g = must(fs->mknod(sub.ino, "g", S_IFREG | 0644, 0, 0, 0));
  auto l = must(fs->symlink(d.ino, "l", "f", 0, 0));
  CHECK(must(fs->get_fsflags(f.ino)) == uint32_t(FS_COMPR_FL));
  CHECK(must(fs->get_fsflags(g.ino)) == uint32_t(FS_COMPR_FL));
  CHECK(fs->set_fsflags(l.ino, FS_COMPR_FL).error().code == ENOTTY);
  auto plain = must(fs->mknod(fs->root(), "plain", S_IFREG | 0644, 0, 0, 0));
  const auto data = text(1 << 20, 7);
  REQUIRE(must(fs->write(g.ino, 0, data)) == data.size());
  REQUIRE(must(fs->write(plain.ino, 0, data)) == data.size());
  CHECK(compressed_items(*im.vol, im.main, g.ino) == 8);  // 1 MiB: eight 128 KiB frames
  CHECK(compressed_items(*im.vol, im.main, plain.ino) == 0);
  // +m beats a branch default; the branch default applies to plain.
  BranchMeta b = must(Filesystem::branch(*im.vol, im.main));
  b.compress = zstd(3);
  must(Filesystem::set_branch(*im.vol, b));
  must(fs->set_fsflags(g.ino, FS_NOCOMP_FL));
  REQUIRE(must(fs->write(g.ino, 0, data)) == data.size());
  REQUIRE(must(fs->write(plain.ino, 0, data)) == data.size());
  CHECK(compressed_items(*im.vol, im.main, g.ino) == 0);
  CHECK(compressed_items(*im.vol, im.main, plain.ino) == 8);
  CHECK(must(Filesystem::branch(*im.vol, im.main)).compress == zstd(3));
  // A mount's none loses to the branch; the branch's none to +c.
  im.vol->extension<MountCompression>().set(Compression{M::None});
  REQUIRE(must(fs->write(plain.ino, 0, data)) == data.size());
  CHECK(compressed_items(*im.vol, im.main, plain.ino) == 8);
  b.compress = none;
  must(Filesystem::set_branch(*im.vol, b));
  must(fs->set_fsflags(g.ino, FS_COMPR_FL));
  REQUIRE(must(fs->write(g.ino, 0, data)) == data.size());
  REQUIRE(must(fs->write(plain.ino, 0, data)) == data.size());
  CHECK(compressed_items(*im.vol, im.main, g.ino) == 8);
  CHECK(compressed_items(*im.vol, im.main, plain.ino) == 0);
  // The image says so: an older build must not open it.
  fs.reset();
  im.reopen();
  CHECK(im.vol->incompat() & kIncompatCompress);
  CHECK(must(Filesystem::branch(*im.vol, im.main)).compress == none);
  im.reopen();
  require_fs_clean(*im.dev);
}

// fsx in the spirit of xfstests' fsx: random writes (text, noise, mixed;
// aligned to frames or not), truncates, punched holes, zeroed ranges,
// preallocation and copies (reflinks where aligned) between a compressed
// file, a file under compress-force and a plain one, each checked against a
// byte model, with reopens (an unmount and a mount) along the way.
TEST_CASE("compress: fsx-style random I/O on compressed and plain files agrees with a model", "[fs][compress]") {
  const uint64_t seed = test::seed("compress-fsx");
  std::mt19937_64 rng(seed);
  FsImage im(512ull << 20);
  auto fs = must(Filesystem::open(*im.vol, im.main));
  const char* names[] = {"c", "plain", "mixed"};
  std::map<std::string, std::vector<std::byte>> model;
  std::map<std::string, uint64_t> ino;
  auto c = must(fs->mknod(fs->root(), "c", S_IFREG | 0644, 0, 0, 0));
  must(fs->set_fsflags(c.ino, FS_COMPR_FL));
  auto p = must(fs->mknod(fs->root(), "plain", S_IFREG | 0644, 0, 0, 0));
  must(fs->set_fsflags(p.ino, FS_NOCOMP_FL));
  auto x = must(fs->mknod(fs->root(), "mixed", S_IFREG | 0644, 0, 0, 0));
  ino = {{"c", c.ino}, {"plain", p.ino}, {"mixed", x.ino}};
  for (auto n : names) model[n];
  auto setup = [&] { im.vol->extension<MountCompression>().set(zstd(1, true)); };  // "mixed": compress-force
  setup();
  const uint32_t bs = 4096;
  auto compare = [&] {
    for (auto n : names) {
      INFO("file " << n << ", seed " << seed);
      REQUIRE(must(fs->getattr(ino[n])).size == model[n].size());
      REQUIRE(read_all(*fs, ino[n]) == model[n]);
    }
  };
  auto data = [&](size_t len) {
    switch (rng() % 4) {
      case 0: return noise(len, rng());
      case 1: {  // half and half, at a random point
        auto v = text(len, rng());
        auto z = noise(len / 2, rng());
        std::copy(z.begin(), z.end(), v.begin() + long(rng() % (len - len / 2 + 1)));
        return v;
      }
      default: return text(len, rng());
    }
  };
  const int ops = int(1500 * scale());
  size_t checks = 0, frames = 0, partial = 0;
  // What the files hold at each check: frames, and frames an item maps
  // only in part (split by overwrites, truncates and holes).
  auto census = [&] {
    for (auto n : {"c", "mixed"})
      for (const auto& e : extents_of(*im.vol, im.main, ino[n]))
        frames += e.compressed(), partial += e.compressed() && e.nblocks < e.ram_blocks;
  };
  for (int i = 0; i < ops; i++) {
    const std::string n = names[rng() % 3];
    auto& m = model[n];
    const uint64_t limit = 3ull << 20;
    switch (rng() % 12) {
      case 0: case 1: case 2: case 3: {  // write: frame-aligned, block-aligned or anywhere
        uint64_t off, len;
        const int kind = int(rng() % 3);
        if (kind == 0) off = (rng() % 20) * 32 * bs, len = (rng() % 3 + 1) * 32 * bs;
        else if (kind == 1) off = (rng() % 700) * bs, len = (rng() % 80 + 1) * bs;
        else off = rng() % limit, len = rng() % 300000 + 1;
        auto d = data(len);
        REQUIRE(must(fs->write(ino[n], off, d)) == len);
        if (m.size() < off + len) m.resize(off + len);
        std::copy(d.begin(), d.end(), m.begin() + long(off));
        break;
      }
      case 4: {  // a small overwrite inside a frame
        if (m.empty()) break;
        const uint64_t off = rng() % m.size(), len = rng() % 5000 + 1;
        auto d = data(len);
        REQUIRE(must(fs->write(ino[n], off, d)) == len);
        if (m.size() < off + len) m.resize(off + len);
        std::copy(d.begin(), d.end(), m.begin() + long(off));
        break;
      }
      case 5: {  // truncate, down into a frame or up past the end
        SetAttr s;
        s.size = rng() % 2 ? rng() % (m.size() + 1) : rng() % limit;
        must(fs->setattr(ino[n], s));
        m.resize(*s.size);
        break;
      }
      case 6: {  // punch a hole or zero a range
        if (m.empty()) break;
        const uint64_t off = rng() % m.size(), len = rng() % 200000 + 1;
        const bool punch = rng() % 2;
        must(fs->fallocate(ino[n], punch ? FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE : FALLOC_FL_ZERO_RANGE, off,
                           len));
        const uint64_t end = std::min<uint64_t>(off + len, punch ? m.size() : off + len);
        if (m.size() < end) m.resize(end);
        std::fill(m.begin() + long(off), m.begin() + long(end), std::byte{0});
        break;
      }
      case 7: {  // preallocate, inside or past the end
        const uint64_t off = rng() % limit, len = rng() % 300000 + 1;
        const bool keep = rng() % 2;
        must(fs->fallocate(ino[n], keep ? FALLOC_FL_KEEP_SIZE : 0, off, len));
        if (!keep && m.size() < off + len) m.resize(off + len);
        break;
      }
      case 8: case 9: {  // copy to another file: shares where aligned
        const std::string to = names[rng() % 3];
        if (to == n || m.empty()) break;
        auto& dm = model[to];
        const bool aligned = rng() % 2;
        const uint64_t oi = aligned ? (rng() % (m.size() / bs + 1)) * bs : rng() % m.size();
        const uint64_t oo = aligned ? (rng() % 600) * bs : rng() % limit;
        const uint64_t len = aligned ? (rng() % 100 + 1) * bs : rng() % 300000 + 1;
        const uint64_t got = must(fs->copy_range(ino[n], oi, ino[to], oo, len));
        const uint64_t want = oi >= m.size() ? 0 : std::min<uint64_t>(len, m.size() - oi);
        REQUIRE(got == want);
        if (want) {
          if (dm.size() < oo + want) dm.resize(oo + want);
          std::copy(m.begin() + long(oi), m.begin() + long(oi + want), dm.begin() + long(oo));
        }
        break;
      }
      case 10:
        if (rng() % 6 == 0) {  // unmount and mount
          fs.reset();
          im.reopen();
          setup();
          fs = must(Filesystem::open(*im.vol, im.main));
        }
        break;
      default:
        compare();
        census();
        checks++;
        break;
    }
  }
  compare();
  CHECK(checks > 0);
  CHECK(frames > 0);
  CHECK(partial > 0);
  fs.reset();
  im.reopen();
  fs = must(Filesystem::open(*im.vol, im.main));
  setup();
  compare();
  fs.reset();
  must(im.vol->close());
  im.vol.reset();
  require_fs_clean(*im.dev);  // with -c: every frame decodes to its length
}

TEST_CASE("compress: compressed data takes less room, and incompressible data is written plain", "[fs][compress]") {
  FsImage im(256ull << 20);
  auto fs = must(Filesystem::open(*im.vol, im.main));
  im.vol->extension<MountCompression>().set(zstd(1));
  auto a = must(fs->mknod(fs->root(), "text", S_IFREG | 0644, 0, 0, 0));
  auto b = must(fs->mknod(fs->root(), "noise", S_IFREG | 0644, 0, 0, 0));
  must(fs->sync());
  const uint64_t d0 = im.vol->space_stats().data_blocks;
  const auto t = text(8 << 20, 3);
  REQUIRE(must(fs->write(a.ino, 0, t)) == t.size());
  must(fs->sync());
  const uint64_t d1 = im.vol->space_stats().data_blocks;
  CHECK(d1 - d0 < t.size() / 4096 / 3);  // text: better than 3:1
  const auto z = noise(8 << 20, 4);
  REQUIRE(must(fs->write(b.ino, 0, z)) == z.size());
  must(fs->sync());
  CHECK(im.vol->space_stats().data_blocks - d1 == z.size() / 4096);
  CHECK(compressed_items(*im.vol, im.main, b.ino) == 0);
  // st_blocks counts what the file maps, as btrfs's does: du shows the
  // size before compression.
  CHECK(must(fs->getattr(a.ino)).blocks == t.size() / 512);
  CHECK(read_all(*fs, a.ino) == t);
  CHECK(read_all(*fs, b.ino) == z);
  // A file's partial last block goes into its last frame (zeros after the
  // end): small files of two or more blocks compress too. 100 files of
  // 6,000 bytes take 100 blocks, not 200.
  must(fs->sync());
  const uint64_t d2 = im.vol->space_stats().data_blocks;
  std::vector<std::pair<uint64_t, std::vector<std::byte>>> small;
  for (int i = 0; i < 100; i++) {
    auto f = must(fs->mknod(fs->root(), "s" + std::to_string(i), S_IFREG | 0644, 0, 0, 0));
    small.emplace_back(f.ino, text(6000, 100 + i));
    REQUIRE(must(fs->write(f.ino, 0, small.back().second)) == 6000);
  }
  must(fs->sync());
  CHECK(im.vol->space_stats().data_blocks - d2 == 100);
  // A write ending inside a block whose rest holds data (not zeros) keeps
  // those bytes: its tail frame is not used.
  const auto head = text(3 * 4096 + 100, 9);
  REQUIRE(must(fs->write(small[0].first, 0, head)) == head.size());
  auto want = small[0].second;
  want.resize(std::max(want.size(), head.size()));
  std::copy(head.begin(), head.end(), want.begin());
  for (const auto& [ino, d] : small) CHECK(read_all(*fs, ino) == (ino == small[0].first ? want : d));
  auto g = must(fs->mknod(fs->root(), "g", S_IFREG | 0644, 0, 0, 0));
  const auto long_text = text(5 * 4096, 10);
  REQUIRE(must(fs->write(g.ino, 0, long_text)) == long_text.size());
  const auto over = text(2 * 4096 + 10, 11);  // ends inside block 2, whose rest is text
  REQUIRE(must(fs->write(g.ino, 0, over)) == over.size());
  auto gw = long_text;
  std::copy(over.begin(), over.end(), gw.begin());
  CHECK(read_all(*fs, g.ino) == gw);
  fs.reset();
  im.reopen();
  require_fs_clean(*im.dev);
}

TEST_CASE("compress: snapshots, clones, copy-up, merge and rollback share compressed extents", "[fs][compress]") {
  FsImage im(256ull << 20);
  im.vol->extension<MountCompression>().set(zstd(3));
  const auto t = text(4 << 20, 11);
  uint64_t ino;
  {
    auto fs = must(Filesystem::open(*im.vol, im.main));
    ino = must(fs->mknod(fs->root(), "f", S_IFREG | 0644, 0, 0, 0)).ino;
    REQUIRE(must(fs->write(ino, 0, t)) == t.size());
    must(fs->sync());
  }
  REQUIRE(compressed_items(*im.vol, im.main, ino) == 32);
  const uint64_t d0 = im.vol->space_stats().data_blocks;
  const Snapshot s = must(snapshot(*im.vol, im.main, "s"));
  const BranchMeta cl = must(clone_branch(*im.vol, im.main, "cl", false));
  must(im.vol->commit());
  CHECK(im.vol->space_stats().data_blocks == d0);  // O(1): nothing copied
  // Overwrite a part in main: the snapshot and the clone keep the old bytes.
  auto t2 = t;
  {
    auto fs = must(Filesystem::open(*im.vol, im.main));
    const auto patch = text(200000, 12);
    REQUIRE(must(fs->write(ino, 77777, patch)) == patch.size());
    std::copy(patch.begin(), patch.end(), t2.begin() + 77777);
    CHECK(read_all(*fs, ino) == t2);
    auto sfs = must(Filesystem::open(*im.vol, s.frozen.tree, true));
    CHECK(read_all(*sfs, ino) == t);
    auto cfs = must(Filesystem::open(*im.vol, cl.tree, true));
    CHECK(read_all(*cfs, ino) == t);
  }
  // A layer on the clone copies the file up sharing its frames.
  const BranchMeta layer = must(create_layer(*im.vol, "up", cl.tree, false));
  must(im.vol->commit());
  const uint64_t d1 = im.vol->space_stats().data_blocks;
  {
    auto ou = must(open_union(*im.vol, must(layer_stack(*im.vol, "up")), false, false));
    Union& u = *ou.u;
    const Attr a = must(u.lookup(u.root(), "f"));
    Caller me;
    SetAttr chmod;
    chmod.mode = 0600;
    (void)must(u.setattr(a.ino, chmod, me));  // copy-up without data
    must(u.sync());
  }
  CHECK(compressed_items(*im.vol, layer.tree, ino) == 32);
  CHECK(im.vol->space_stats().data_blocks == d1);
  {  // then written there inside a frame
    auto ou = must(open_union(*im.vol, must(layer_stack(*im.vol, "up")), false, false));
    Union& u = *ou.u;
    const Attr a = must(u.lookup(u.root(), "f"));
    Caller me;
    const auto patch = text(5000, 13);
    REQUIRE(must(u.write(a.ino, 4096 * 40 + 100, patch, me)) == patch.size());
    auto want = t;
    std::copy(patch.begin(), patch.end(), want.begin() + 4096 * 40 + 100);
    std::vector<std::byte> got(want.size());
    REQUIRE(must(u.read(a.ino, 0, got)) == got.size());
    CHECK(got == want);
    must(u.sync());
  }
  // Merged down into the clone, then the clone rolled back to nothing
  // else: main rolled back to its snapshot gets the old bytes back.
  const Merge mg = must(merge(*im.vol, layer.tree));
  must(im.vol->commit());
  {
    auto mfs = must(Filesystem::open(*im.vol, mg.merged.tree, true));
    auto want = t;
    const auto patch = text(5000, 13);
    std::copy(patch.begin(), patch.end(), want.begin() + 4096 * 40 + 100);
    CHECK(read_all(*mfs, ino) == want);
  }
  (void)must(rollback(*im.vol, im.main, s.frozen.tree));
  must(im.vol->commit());
  {
    auto fs = must(Filesystem::open(*im.vol, im.main, true));
    CHECK(read_all(*fs, ino) == t);
    CHECK(compressed_items(*im.vol, im.main, ino) == 32);
  }
  im.reopen();
  require_fs_clean(*im.dev);
}

TEST_CASE("compress: a damaged frame is found by scrub with every path, by fsck -c, and reads as EIO",
          "[fs][compress][scrub]") {
  FsImage im(128ull << 20);
  im.vol->extension<MountCompression>().set(zstd(1));
  const auto t = text(1 << 20, 21);
  uint64_t ino;
  {
    auto fs = must(Filesystem::open(*im.vol, im.main));
    auto d = must(fs->mkdir(fs->root(), "dir", 0755, 0, 0));
    ino = must(fs->mknod(d.ino, "f", S_IFREG | 0644, 0, 0, 0)).ino;
    REQUIRE(must(fs->write(ino, 0, t)) == t.size());
    // Another name of the same frames: a reflink.
    auto g = must(fs->mknod(fs->root(), "g", S_IFREG | 0644, 0, 0, 0));
    REQUIRE(must(fs->copy_range(ino, 0, g.ino, 0, t.size())) == t.size());
    must(fs->sync());
  }
  (void)must(snapshot(*im.vol, im.main, "s1"));
  must(im.vol->commit());
  CHECK(must(scrub(*im.vol)).damage.empty());
  const auto es = extents_of(*im.vol, im.main, ino);
  REQUIRE(es.size() == 8);
  REQUIRE(es[2].compressed());
  const uint64_t blk = es[2].disk_start;
  std::vector<std::byte> b(4096);
  must(im.dev->read(blk * 4096, b));
  b[10] ^= std::byte{0x40};
  must(im.dev->write(blk * 4096, b));
  const ScrubReport r = must(scrub(*im.vol));
  REQUIRE(r.damage.size() == 1);
  CHECK(r.damage[0].block == blk);
  CHECK(r.damage[0].reason == ScrubDamage::Reason::Checksum);
  std::set<std::string> refs;
  for (const auto& x : r.damage[0].refs) refs.insert(x.branch + ":" + x.path);
  CHECK(refs == std::set<std::string>{"main:/dir/f", "main:/g", "s1:/dir/f", "s1:/g"});
  {
    auto fs = must(Filesystem::open(*im.vol, im.main, true));
    std::vector<std::byte> got(4096);
    // Outside the damaged frame: fine. Inside: EIO.
    CHECK(must(fs->read(ino, 0, got)) == 4096);
    CHECK(fs->read(ino, 2 * 32 * 4096 + 5, got).error().code == EIO);
  }
  // The damage turned the volume read-only (C5): nothing more to write.
  CHECK(im.vol->failure());
  im.vol.reset();
  auto ps = check_filesystems(*im.dev, true);
  bool f7 = false;
  for (const auto& p : ps) f7 |= p.code == "F7-data";
  CHECK(f7);
  CHECK(check_filesystems(*im.dev, false).empty());  // the metadata alone is consistent
}

// Shrinking (format.md#relocation) moves frames as it moves plain extents:
// the stored blocks verbatim, so their checksums stay true; what a snapshot
// shares stays shared.
TEST_CASE("compress: a shrink moves compressed extents, shared ones once", "[fs][compress][relocate]") {
  FsImage im(128ull << 20);
  im.vol->extension<MountCompression>().set(zstd(1));
  std::vector<std::vector<std::byte>> files;
  {
    auto fs = must(Filesystem::open(*im.vol, im.main));
    // Filler first, deleted later, so that the files lie high on the device.
    auto filler = must(fs->mknod(fs->root(), "filler", S_IFREG | 0644, 0, 0, 0));
    REQUIRE(must(fs->write(filler.ino, 0, noise(48 << 20, 1))) == 48u << 20);
    for (int i = 0; i < 6; i++) {
      files.push_back(text((1 << 20) + 4096 * i + 77, 40 + i));
      auto f = must(fs->mknod(fs->root(), "f" + std::to_string(i), S_IFREG | 0644, 0, 0, 0));
      REQUIRE(must(fs->write(f.ino, 0, files.back())) == files.back().size());
    }
    must(fs->unlink(fs->root(), "filler"));
    must(fs->sync());
  }
  (void)must(snapshot(*im.vol, im.main, "s"));
  must(im.vol->commit());
  must(im.vol->commit());
  const SpaceStats before = im.vol->space_stats();
  (void)must(im.vol->resize(40ull << 20));
  const SpaceStats after = im.vol->space_stats();
  CHECK(after.data_blocks == before.data_blocks);  // moved, not copied twice
  im.reopen();
  for (const char* b : {"main", "s"}) {
    auto br = must(Filesystem::find(*im.vol, b));
    REQUIRE(br);
    auto fs = must(Filesystem::open(*im.vol, br->tree, true));
    for (int i = 0; i < 6; i++) {
      const Attr a = must(fs->lookup(fs->root(), "f" + std::to_string(i)));
      CHECK(read_all(*fs, a.ino) == files[size_t(i)]);
      CHECK(compressed_items(*im.vol, br->tree, a.ino) > 0);
    }
  }
  must(im.vol->close());
  im.vol.reset();
  require_fs_clean(*im.dev);
}
