// Holds (snap/snap.h set_held; format.md#snapshots, "Holds"): a held
// branch is not deleted, consumed by a merge or pruned by the automatic
// retention; the hold survives a reopen, a rename and a rollback; the
// HELD_BRANCHES ro_compat bit is set with the first hold; fsck accepts the
// flag, and still reports an unknown one.
#include <unistd.h>

#include "commit/superblock.h"
#include "fs/check.h"
#include "fs/corrupt_fs.h"
#include "fs/disk_fs.h"
#include "fs/fs.h"
#include "fsck/corrupt.h"
#include "fsck/fsck.h"
#include "snap/retention.h"
#include "snap/snap.h"
#include "union/view.h"
#include "fs_image.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

struct Img : FsImage {
  // A file "f" holding `text` in branch `tree`.
  void put_file(TreeId tree, const std::string& text) {
    auto fs = must(Filesystem::open(*vol, tree));
    const uint64_t ino = must(fs->mknod(fs->root(), "f", S_IFREG | 0644, 0, 0, 0)).ino;
    (void)must(fs->write(ino, 0, bytes(text)));
  }
  BranchMeta named(const std::string& n) { return must(find_branch(*vol, n)); }
  // Every live branch's fields and every tree's items: what a refused
  // operation must leave as it was.
  std::string state() {
    std::string s;
    for (const auto& b : must(Filesystem::branches(*vol))) {
      s += b.name + (b.held ? " held" : "") + (b.doomed ? " doomed" : "") + " " + std::to_string(b.tree.v) +
           " parent " + std::to_string(b.parent.v) + " items " + std::to_string(dump(*vol, b.tree).size()) + "\n";
      for (const auto& [k, v] : dump(*vol, b.tree)) s += std::to_string(k.hi) + "/" + std::to_string(k.lo) + ":" + std::to_string(v.size()) + ";";
      s += "\n";
    }
    for (const auto& w : must(list_views(*vol))) {
      s += "view " + w.name;
      for (const auto& l : w.layers) s += " " + std::to_string(l.tree.v) + (l.writable ? "rw" : "ro");
      s += "\n";
    }
    return s;
  }
  void check_clean() {
    FsckOptions fo;
    fo.kinds = fs_kinds();
    auto rep = must(fsck_run(*dev, fo));
    for (const auto& p : rep.problems) {
      INFO(p.code << ": " << p.message);
      CHECK(p.fix == FixClass::Info);
    }
    auto ps = check_filesystems(*dev);
    for (const auto& p : ps) UNSCOPED_INFO(p.code << ": " << p.message);
    CHECK(ps.empty());
  }
};

std::string codes(const std::vector<Problem>& ps) {
  std::string s;
  for (const auto& p : ps) s += p.code + " ";
  return s;
}

}  // namespace

TEST_CASE("holds: a held branch is not deleted; released, it is", "[snap][holds]") {
  Img im;
  im.put_file(im.main, "hello");
  auto s1 = must(snapshot(*im.vol, im.main, "s1")).frozen;
  must(im.vol->commit());
  CHECK(!(im.vol->ro_compat() & kRoCompatHeldBranches));  // no hold yet: older builds may write

  auto h = must(set_held(*im.vol, s1.tree, true));
  CHECK(h.held);
  CHECK(must(set_held(*im.vol, s1.tree, true)).held);  // idempotent
  must(im.vol->commit());
  CHECK((must(read_superblocks(*im.dev)).info.ro_compat & kRoCompatHeldBranches));

  const std::string before = im.state();
  auto d = delete_branch(*im.vol, s1.tree);
  REQUIRE(!d);
  CHECK(d.error().code == EBUSY);
  CHECK(d.error().message() == "\"s1\" is held: release it first (plyctl release)");
  must(im.vol->commit());
  CHECK(im.state() == before);

  // A snapshot or clone of a held branch is not held (ZFS's holds are per
  // snapshot); the hold survives a rename and a reopen, and fsck is clean.
  CHECK(!must(snapshot(*im.vol, s1.tree, "s1-again")).frozen.held);
  CHECK(!must(clone_branch(*im.vol, s1.tree, "c1", false)).held);
  CHECK(must(rename_branch(*im.vol, s1.tree, "kept")).held);
  im.reopen();
  CHECK(im.named("kept").held);
  CHECK(!im.named("main").held);
  CHECK(!(delete_branch(*im.vol, s1.tree)));
  im.reopen();
  im.check_clean();

  // Released (twice: idempotent), it goes like any other.
  CHECK(!must(set_held(*im.vol, s1.tree, false)).held);
  CHECK(!must(set_held(*im.vol, s1.tree, false)).held);
  must(delete_branch(*im.vol, s1.tree));
  im.reopen();
  CHECK(!must(find_branch(*im.vol, "c1")).held);
  CHECK(!find_branch(*im.vol, "kept"));
  // The feature bit is never cleared (format.md#features).
  CHECK((must(read_superblocks(*im.dev)).info.ro_compat & kRoCompatHeldBranches));
  im.check_clean();
}

TEST_CASE("holds: a merge that would consume a held branch is refused", "[snap][holds]") {
  Img im;
  im.put_file(im.main, "lower");
  auto work = must(create_layer(*im.vol, "work", im.main, false));
  must(put_view(*im.vol, View{"stack", true, {{work.tree, true}, {im.main, false}}}));
  must(set_held(*im.vol, im.main, true));
  must(im.vol->commit());
  const std::string before = im.state();
  auto m = merge(*im.vol, work.tree);
  REQUIRE(!m);
  CHECK(m.error().code == EBUSY);
  CHECK(m.error().message() == "\"main\" is held: release it first (plyctl release)");
  must(im.vol->commit());
  must(drop_doomed(*im.vol));  // nothing half-done is left behind
  must(im.vol->commit());
  CHECK(im.state() == before);

  // The upper branch held instead: the merge goes, and the hold with it.
  must(set_held(*im.vol, im.main, false));
  must(set_held(*im.vol, work.tree, true));
  auto done = must(merge(*im.vol, work.tree));
  CHECK(done.lower_doomed);
  CHECK(done.merged.held);
  im.reopen();
  CHECK(im.named("work").held);
  im.check_clean();
}

TEST_CASE("holds: a rollback keeps the hold", "[snap][holds]") {
  Img im;
  im.put_file(im.main, "old");
  must(snapshot(*im.vol, im.main, "s1"));
  must(set_held(*im.vol, im.main, true));
  auto r = must(rollback(*im.vol, im.main));
  CHECK(r.branch.held);
  CHECK(r.branch.tree == im.main);
  im.reopen();
  CHECK(im.named("main").held);
  im.check_clean();
}

TEST_CASE("holds: the automatic retention neither deletes nor counts a held snapshot", "[snap][holds]") {
  Img im;
  std::vector<BranchMeta> s;
  for (int i = 0; i < 4; i++) {
    usleep(20000);  // distinct creation times, even on a coarse clock
    s.push_back(must(snapshot(*im.vol, im.main, "main@2611" + std::to_string(10 + i))).frozen);
  }
  // Each has its own creation time, which the classes go by, not main's
  // (a clone once copied its source's: hourly=N then kept one snapshot).
  const uint64_t main_ns = must(Filesystem::branch(*im.vol, im.main)).created_ns;
  CHECK(s[0].created_ns > main_ns);
  for (size_t i = 1; i < s.size(); i++) CHECK(s[i].created_ns > s[i - 1].created_ns);
  // One that is no automatic snapshot (its name): never pruned.
  must(snapshot(*im.vol, im.main, "manual"));
  Retention keep2;
  keep2.last = 2;
  auto names = [&](const std::vector<BranchMeta>& bs) {
    std::string n;
    for (const auto& b : bs) n += b.name + " ";
    return n;
  };
  CHECK(names(must(expired_snapshots(*im.vol, im.main, keep2))) == "main@261110 main@261111 ");
  // The newest held: the two newest others stay, so only the oldest goes
  // (counted, the held one would have taken a place: 261111 would go too).
  must(set_held(*im.vol, s[3].tree, true));
  CHECK(names(must(expired_snapshots(*im.vol, im.main, keep2))) == "main@261110 ");
  // The oldest held as well: none goes.
  must(set_held(*im.vol, s[0].tree, true));
  CHECK(names(must(expired_snapshots(*im.vol, im.main, keep2))) == "");
  Retention hourly;
  hourly.hourly = 1;  // the newest one not held stays, whatever the hour
  CHECK(names(must(expired_snapshots(*im.vol, im.main, hourly))) == "main@261111 ");
}

TEST_CASE("holds: fsck accepts HELD, reports an unknown branch flag and a hold without its feature bit",
          "[snap][holds]") {
  Img im;
  auto s1 = must(snapshot(*im.vol, im.main, "s1")).frozen;
  must(set_held(*im.vol, s1.tree, true));
  must(im.vol->commit());
  CHECK(codes(check_filesystems(*im.vol)) == "");

  SECTION("an unknown flag bit is still a problem, and -p clears it (not HELD)") {
    FsTarget t;
    t.what = FsStruct::FsInfo;
    t.tree = s1.tree;
    t.field = "branch_flags";
    const uint32_t flags = disk::kBranchReadOnly | disk::kBranchSnapshot | disk::kBranchHeld;
    must(corrupt_fs(*im.vol, t, CorruptAction{Damage::Set, flags | 0x10, 0, true}));
    CHECK(codes(check_filesystems(*im.vol)) == "F1-info ");
    must(repair_filesystems(*im.vol, false));
    must(im.vol->commit());
    CHECK(codes(check_filesystems(*im.vol)) == "");
    im.reopen();
    CHECK(im.named("s1").held);
  }
  SECTION("a held branch on an image without HELD_BRANCHES: the bit is set") {
    im.vol.reset();
    must(corrupt(*im.dev, CorruptTarget{CorruptStruct::Superblock, -1, 0, "ro_compat"},
                 CorruptAction{Damage::Zero, 0, 0, true}));
    im.open();
    REQUIRE(!(im.vol->ro_compat() & kRoCompatHeldBranches));
    CHECK(codes(check_filesystems(*im.vol)) == "F-held-feature ");
    must(repair_filesystems(*im.vol, false));
    must(im.vol->commit());
    CHECK((im.vol->ro_compat() & kRoCompatHeldBranches));
    CHECK(codes(check_filesystems(*im.vol)) == "");
  }
  im.reopen();
  im.check_clean();
}

TEST_CASE("holds: of two snapshots with one creation time, the retention keeps the later", "[snap][holds]") {
  // A coarse clock gives snapshots taken within a tick one time; the
  // callers list them oldest first (snapshots_of).
  Retention r;
  r.last = 1;
  CHECK(prune({5, 5, 5}, r) == std::vector<size_t>{0, 1});
  CHECK(prune({7, 5, 7}, r) == std::vector<size_t>{1, 0});
}
