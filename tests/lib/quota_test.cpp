// Branch quotas (fs/quota.h, snap/snap.h set_quota; format.md#quotas).
// The model: before every operation the test computes the branch's exact
// figures itself (snap/usage.h, which the accounting tests check against a
// brute force) and predicts whether the operation fits; a single writer
// must get EDQUOT exactly when it does not, never a change past the limit,
// and never a refusal of anything that only removes.
#include <fcntl.h>
#include <linux/falloc.h>

#include <random>

#include <catch2/generators/catch_generators.hpp>

#include "commit/superblock.h"
#include "fs/check.h"
#include "fsck/corrupt.h"
#include "fs/fs.h"
#include "fs/quota.h"
#include "snap/snap.h"
#include "snap/usage.h"
#include "union/view.h"
#include "fs_image.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;
// What quota.cpp charges an operation besides its data (kOpNodes blocks).
constexpr uint64_t kAllowance = 4 * 4096;

struct Img : FsImage {
  Img() : FsImage(128ull << 20) {}
  BranchSpace space(TreeId t) { return must(branch_space(*vol, t)); }
};

std::vector<std::byte> noise(std::mt19937_64& rng, size_t n) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = std::byte(rng());
  return v;
}

// The bytes a write of [off, off + n) charges: every block it touches.
uint64_t span_bytes(uint64_t off, uint64_t n) { return ((off + n - 1) / 4096 + 1 - off / 4096) * 4096; }

}  // namespace

TEST_CASE("quota: a single writer gets EDQUOT exactly when a write would pass the limit", "[snap][quota]") {
  Img im;
  const uint64_t limit = 3 * kMiB + 300 * kKiB;
  (void)must(set_quota(*im.vol, im.main, QuotaChange{limit, std::nullopt}));
  auto fs = must(Filesystem::open(*im.vol, im.main));
  std::mt19937_64 rng(GENERATE(1, 2, 3));
  std::vector<uint64_t> files;
  size_t refused = 0, done = 0, removed_over = 0;
  for (int step = 0; step < 400; step++) {
    const uint64_t ref = im.space(im.main).referenced.total();
    REQUIRE(ref <= limit);  // never past it
    const int op = int(rng() % 10);
    if (op < 6 && !files.empty()) {  // a write into a file, growing or overwriting
      const uint64_t ino = files[rng() % files.size()];
      const uint64_t off = rng() % (2 * kMiB), n = 1 + rng() % (512 * kKiB);
      const bool fits = ref + span_bytes(off, n) + kAllowance <= limit;
      auto r = fs->write(ino, off, noise(rng, n));
      INFO("step " << step << ": write " << n << " at " << off << ", referenced " << ref);
      if (fits) {
        REQUIRE(r);
        done++;
      } else {
        REQUIRE(!r);
        CHECK(r.error().code == EDQUOT);
        refused++;
      }
    } else if (op < 8) {  // a new file
      const bool fits = ref + 4096 + kAllowance <= limit;
      auto r = fs->mknod(fs->root(), "f" + std::to_string(step), S_IFREG | 0644, 0, 0, 0);
      if (fits) {
        REQUIRE(r);
        files.push_back(r->ino);
      } else {
        REQUIRE(!r);
        CHECK(r.error().code == EDQUOT);
      }
    } else if (!files.empty()) {  // what only removes always works, over the limit or not
      const size_t i = rng() % files.size();
      if (op == 8) {
        SetAttr sa;
        sa.size = rng() % kMiB;
        (void)must(fs->setattr(files[i], sa));
      } else {
        auto es = must(fs->names_of(files[i], 1));
        REQUIRE(es.size() == 1);
        const std::string name = es[0].second.substr(es[0].second.rfind('/') + 1);
        must(fs->unlink(fs->root(), name));
        files.erase(files.begin() + long(i));
      }
      if (ref + kAllowance > limit) removed_over++;
    }
    if (step % 50 == 0) must(im.vol->commit());
  }
  INFO(done << " writes, " << refused << " refused, " << removed_over << " removals near the limit");
  CHECK(done > 20);
  CHECK(refused > 20);
}

TEST_CASE("quota: an exclusive limit counts what snapshots share out, and what deleting them brings back",
          "[snap][quota]") {
  Img im;
  std::mt19937_64 rng(7);
  auto fs = must(Filesystem::open(*im.vol, im.main));
  const uint64_t a = must(fs->mknod(fs->root(), "a", S_IFREG | 0644, 0, 0, 0)).ino;
  (void)must(fs->write(a, 0, noise(rng, 3 * kMiB)));
  const uint64_t b = must(fs->mknod(fs->root(), "b", S_IFREG | 0644, 0, 0, 0)).ino;
  (void)must(set_quota(*im.vol, im.main, QuotaChange{std::nullopt, 2 * kMiB}));
  // 3 MiB are the branch's alone: no room, not even for a new file.
  auto r = fs->write(b, 0, noise(rng, kMiB));
  REQUIRE(!r);
  CHECK(r.error().code == EDQUOT);
  auto n = fs->mknod(fs->root(), "c", S_IFREG | 0644, 0, 0, 0);
  REQUIRE(!n);
  CHECK(n.error().code == EDQUOT);
  // A snapshot shares them: 1 MiB more fits, as exclusive bytes.
  const TreeId s1 = must(snapshot(*im.vol, im.main, "s1")).frozen.tree;
  fs = must(Filesystem::open(*im.vol, im.main));
  REQUIRE(must(fs->write(b, 0, noise(rng, kMiB))) == kMiB);
  CHECK(im.space(im.main).exclusive.total() <= 2 * kMiB);
  CHECK(im.space(im.main).referenced.total() > 4 * kMiB);  // referenced is not limited
  // Deleting the snapshot gives main its 3 MiB back: over, every write is
  // refused, removing still works and makes room.
  must(delete_branch(*im.vol, s1));
  fs = must(Filesystem::open(*im.vol, im.main));
  r = fs->write(b, kMiB, noise(rng, 64 * kKiB));
  REQUIRE(!r);
  CHECK(r.error().code == EDQUOT);
  must(fs->unlink(fs->root(), "a"));
  REQUIRE(must(fs->write(b, kMiB, noise(rng, 64 * kKiB))) == 64 * kKiB);
}

TEST_CASE("quota: copy-ups, reflinks and fallocate are charged; punching a hole never is", "[snap][quota]") {
  Img im;
  std::mt19937_64 rng(8);
  const TreeId low = im.main;
  {
    auto fs = must(Filesystem::open(*im.vol, low));
    const uint64_t f = must(fs->mknod(fs->root(), "big", S_IFREG | 0644, 0, 0, 0)).ino;
    (void)must(fs->write(f, 0, noise(rng, 2 * kMiB)));
  }
  const TreeId up = must(create_branch(*im.vol, "up", false)).tree;
  (void)must(set_quota(*im.vol, up, QuotaChange{kMiB, std::nullopt}));
  auto lfs = must(Filesystem::open(*im.vol, low));
  auto ufs = must(Filesystem::open(*im.vol, up));
  const uint64_t big = must(lfs->lookup(lfs->root(), "big")).ino;
  // A copy-up takes 2 MiB by reference: past 1 MiB.
  auto c = ufs->copy_in(*lfs, big, ufs->root(), "big");
  REQUIRE(!c);
  CHECK(c.error().code == EDQUOT);
  CHECK(!must(ufs->entry(ufs->root(), "big")));  // nothing changed
  (void)must(set_quota(*im.vol, up, QuotaChange{4 * kMiB, std::nullopt}));
  const uint64_t copy = must(ufs->copy_in(*lfs, big, ufs->root(), "big")).ino;
  CHECK(im.space(up).referenced.total() >= 2 * kMiB);
  // A reflink inside the branch reaches nothing new: it fits.
  const uint64_t twin = must(ufs->mknod(ufs->root(), "twin", S_IFREG | 0644, 0, 0, 0)).ino;
  CHECK(must(ufs->copy_range(copy, 0, twin, 0, 2 * kMiB)) == 2 * kMiB);
  // Preallocating 3 MiB does not fit in the 2 MiB left.
  auto fa = ufs->fallocate(twin, 0, 0, 5 * kMiB);
  REQUIRE(!fa);
  CHECK(fa.error().code == EDQUOT);
  must(ufs->fallocate(twin, 0, 2 * kMiB, kMiB));
  // Over the limit (lowered below the figure): holes can still be punched.
  (void)must(set_quota(*im.vol, up, QuotaChange{kMiB, std::nullopt}));
  must(ufs->fallocate(twin, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 3 * kMiB));
  auto w = ufs->write(twin, 0, noise(rng, 4096));
  REQUIRE(!w);
  CHECK(w.error().code == EDQUOT);
  // Removing the limit: anything goes again.
  (void)must(set_quota(*im.vol, up, QuotaChange{0, std::nullopt}));
  REQUIRE(must(ufs->write(twin, 0, noise(rng, 4 * kMiB))) == 4 * kMiB);
}

TEST_CASE("quota: limits persist, are the branch's own, set BRANCH_QUOTAS, and fsck checks it", "[snap][quota]") {
  Img im;
  CHECK(!(im.vol->ro_compat() & kRoCompatBranchQuotas));
  (void)must(set_quota(*im.vol, im.main, QuotaChange{5 * kMiB, 7 * kMiB}));
  const TreeId s1 = must(snapshot(*im.vol, im.main, "s1")).frozen.tree;
  const TreeId c1 = must(clone_branch(*im.vol, im.main, "c1", false)).tree;
  im.reopen();
  auto m = must(Filesystem::branch(*im.vol, im.main));
  CHECK(m.quota_referenced == 5 * kMiB);
  CHECK(m.quota_exclusive == 7 * kMiB);
  CHECK(must(Filesystem::branch(*im.vol, s1)).quota_referenced == 0);
  CHECK(must(Filesystem::branch(*im.vol, c1)).quota_exclusive == 0);
  CHECK((im.vol->ro_compat() & kRoCompatBranchQuotas));
  // Changing one limit keeps the other; 0 removes it.
  (void)must(set_quota(*im.vol, im.main, QuotaChange{0, std::nullopt}));
  m = must(Filesystem::branch(*im.vol, im.main));
  CHECK(m.quota_referenced == 0);
  CHECK(m.quota_exclusive == 7 * kMiB);
  must(im.vol->commit());
  CHECK(check_filesystems(*im.vol).empty());
  // A quota on an image without the bit (an older build's fsck cleared it).
  im.vol.reset();
  must(corrupt(*im.dev, CorruptTarget{CorruptStruct::Superblock, -1, 0, "ro_compat"},
               CorruptAction{Damage::Zero, 0, 0, true}));
  im.open();
  REQUIRE(!(im.vol->ro_compat() & kRoCompatBranchQuotas));
  auto ps = check_filesystems(*im.vol);
  REQUIRE(ps.size() == 1);
  CHECK(ps[0].code == "F-quota-feature");
  must(repair_filesystems(*im.vol, false));
  must(im.vol->commit());
  CHECK((im.vol->ro_compat() & kRoCompatBranchQuotas));
  CHECK(check_filesystems(*im.vol).empty());
}
