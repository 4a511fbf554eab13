// Scrub (fs/scrub.h, format.md#scrub): a clean image reports nothing and
// its device is not written; a data block shared by a branch and two
// snapshots, damaged on the device, is found once and named with all three
// paths; a damaged tree node shared with a snapshot names both branches;
// each shared block is read once; a cancel stops it.
#include <atomic>
#include <random>
#include <set>
#include <unordered_set>

#include "fs/fs.h"
#include "fs/scrub.h"
#include "snap/snap.h"
#include "fs_image.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

std::vector<std::byte> noise(uint64_t seed, size_t n) {
  std::mt19937_64 r(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(r());
  return v;
}

std::vector<std::byte> whole(MemDevice& d) {
  std::vector<std::byte> v(d.size_bytes());
  must(d.read(0, v));
  return v;
}

// The device block holding exactly `content` (one block's bytes).
uint64_t find_block(MemDevice& d, std::span<const std::byte> content) {
  const auto all = whole(d);
  std::vector<uint64_t> at;
  for (uint64_t off = 0; off + 4096 <= all.size(); off += 4096)
    if (std::equal(content.begin(), content.end(), all.begin() + off)) at.push_back(off / 4096);
  REQUIRE(at.size() == 1);
  return at[0];
}

void flip(MemDevice& d, uint64_t block, uint64_t at = 100) {
  std::vector<std::byte> b(4096);
  must(d.read(block * 4096, b));
  b[at] ^= std::byte{0x5a};
  must(d.write(block * 4096, b));
}

struct Img : FsImage {
  std::vector<std::byte> data = noise(3, 10 * 4096);
  uint64_t ino = 0;
  Img() {
    auto fs = must(Filesystem::open(*vol, main));
    auto d = must(fs->mkdir(fs->root(), "dir", 0755, 0, 0));
    ino = must(fs->mknod(d.ino, "f", S_IFREG | 0644, 0, 0, 0)).ino;
    REQUIRE(must(fs->write(ino, 0, data)) == data.size());
    for (int i = 0; i < 40; i++) {  // more files: more nodes and blocks to check
      auto a = must(fs->mknod(fs->root(), "g" + std::to_string(i), S_IFREG | 0644, 0, 0, 0));
      (void)must(fs->write(a.ino, 0, noise(100 + i, 5000 + 997 * i)));
    }
  }
};

}  // namespace

TEST_CASE("scrub: a clean image with snapshots reports nothing, reads each shared block once, writes nothing",
          "[fs][scrub]") {
  Img im;
  const ScrubReport alone = must(scrub(*im.vol));
  CHECK(alone.damage.empty());
  (void)must(snapshot(*im.vol, im.main, "s1"));
  (void)must(snapshot(*im.vol, im.main, "s2"));
  must(im.vol->commit());
  const auto before = whole(*im.dev);
  uint64_t last_done = 0, calls = 0;
  ScrubOptions o;
  o.progress = [&](uint64_t done, uint64_t total) {
    CHECK(done >= last_done);
    CHECK(done <= total);
    last_done = done;
    calls++;
  };
  const ScrubReport r = must(scrub(*im.vol, o));
  CHECK(r.damage.empty());
  CHECK(!r.cancelled);
  CHECK(calls > 0);
  // The snapshots share every data block: none is read twice.
  CHECK(r.data_blocks == alone.data_blocks);
  CHECK(r.data_blocks >= im.data.size() / 4096);
  CHECK(r.metadata_blocks > 0);
  CHECK(r.bytes == (r.data_blocks + r.metadata_blocks) * 4096);
  CHECK(whole(*im.dev) == before);  // a scrub changes nothing
  // Cancelled before it starts: it stops at once and says so.
  std::atomic<bool> stop{true};
  ScrubOptions c;
  c.cancel = &stop;
  const ScrubReport rc = must(scrub(*im.vol, c));
  CHECK(rc.cancelled);
  CHECK(rc.data_blocks == 0);
}

TEST_CASE("scrub: a damaged data block shared by a branch and two snapshots is named with all three paths",
          "[fs][scrub]") {
  Img im;
  (void)must(snapshot(*im.vol, im.main, "s1"));
  (void)must(snapshot(*im.vol, im.main, "s2"));
  must(im.vol->commit());
  const uint64_t blk = find_block(*im.dev, std::span(im.data).subspan(3 * 4096, 4096));
  flip(*im.dev, blk);
  const ScrubReport r = must(scrub(*im.vol));
  REQUIRE(r.damage.size() == 1);
  const ScrubDamage& d = r.damage[0];
  CHECK(d.block == blk);
  CHECK(!d.metadata);
  CHECK(d.reason == ScrubDamage::Reason::Checksum);
  std::set<std::string> refs;
  for (const auto& x : d.refs) refs.insert(x.branch + ":" + x.path);
  CHECK(refs == std::set<std::string>{"main:/dir/f", "s1:/dir/f", "s2:/dir/f"});
  // Repaired on the device (the bytes put back), the next scrub is clean.
  flip(*im.dev, blk);
  CHECK(must(scrub(*im.vol)).damage.empty());
}

TEST_CASE("scrub: a damaged tree node shared with a snapshot names both branches", "[fs][scrub]") {
  Img im;
  const Snapshot s1 = must(snapshot(*im.vol, im.main, "s1"));
  must(im.vol->commit());
  // A leaf both trees reach.
  uint64_t leaf = 0;
  {
    auto t = must(im.vol->begin());
    std::unordered_set<uint64_t> a, b;
    std::set<uint64_t> leaves;
    must(t.walk_nodes(im.main, a, [&](BlockNo n, Generation, int level, const Error*) {
      if (level == 0) leaves.insert(n.v);
    }));
    must(t.walk_nodes(s1.frozen.tree, b, [&](BlockNo n, Generation, int level, const Error*) {
      if (level == 0 && leaves.count(n.v) && !leaf) leaf = n.v;
    }));
  }
  REQUIRE(leaf != 0);
  flip(*im.dev, leaf, 2000);
  const ScrubReport r = must(scrub(*im.vol));
  REQUIRE(r.damage.size() == 1);
  CHECK(r.damage[0].block == leaf);
  CHECK(r.damage[0].metadata);
  CHECK(r.damage[0].reason == ScrubDamage::Reason::Corrupt);
  std::set<std::string> names;
  for (const auto& x : r.damage[0].refs) names.insert(x.branch);
  CHECK(names == std::set<std::string>{"main", s1.frozen.name});
}
