// U5 (format.md#catalog): fsck reports every branch and view name that
// breaks the name rule (check_branch_name, union/view.h) as U5-name, and
// -y gives each a valid name no other branch (view) has (issue 21).
// Branch names are damaged in their info items (corrupt_fs: fsinfo
// name.N); view names in their catalog records, whose name is the first 32
// bytes of the value (format.md#catalog).
#include <algorithm>
#include <cstring>
#include <set>

#include "../lib/test_util.h"
#include "fs/corrupt_fs.h"
#include "fs/fs.h"
#include "fsck/fsck.h"
#include "union/name_check.h"
#include "union/view.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

FsckReport fsck(BlockDevice& dev, FsckMode mode) {
  FsckOptions fo;
  set_object_passes(fo, false);
  fo.mode = mode;
  return must(fsck_run(dev, fo));
}

std::vector<std::string> u5(const FsckReport& r) {
  std::vector<std::string> out;
  for (const auto& p : r.problems)
    if (p.code == "U5-name") out.push_back(p.message);
  return out;
}

std::string describe(const FsckReport& r) {
  std::string s;
  for (const auto& p : r.problems) s += p.code + ": " + p.message + "\n";
  for (const auto& a : r.actions) s += "action: " + a + "\n";
  return s;
}

std::unique_ptr<Volume> open_rw(BlockDevice& dev) {
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  return must(Volume::open(dev, vo));
}

// Sets byte `at` of branch `tree`'s name.
void damage_branch(BlockDevice& dev, TreeId tree, unsigned at, uint8_t byte) {
  auto vol = open_rw(dev);
  FsTarget t;
  t.what = FsStruct::FsInfo;
  t.tree = tree;
  t.field = "name." + std::to_string(at);
  must(corrupt_fs(*vol, t, CorruptAction{Damage::Set, byte, 0, true}));
}

// Replaces the name of the view named `name` in its catalog record.
void damage_view(BlockDevice& dev, const std::string& name, const std::string& bad) {
  auto vol = open_rw(dev);
  {
    auto txn = must(vol->begin());
    bool done = false;
    for (const auto& ti : must(txn.list_trees())) {
      if (ti.kind != kKindPlain) continue;
      std::vector<std::pair<Key, std::vector<std::byte>>> recs;
      must(txn.scan(ti.id, Key{1, 0}, Key{1, ~0ull}, [&](Key k, std::span<const std::byte> v) {
        recs.emplace_back(k, std::vector<std::byte>(v.begin(), v.end()));
        return true;
      }));
      for (auto& [k, v] : recs) {
        if (std::string(reinterpret_cast<const char*>(v.data()), name.size()) != name || v[name.size()] != std::byte{0})
          continue;
        std::fill(v.begin(), v.begin() + 32, std::byte{0});
        std::memcpy(v.data(), bad.data(), bad.size());
        must(txn.put(ti.id, k, v));
        done = true;
      }
    }
    REQUIRE(done);
  }
  must(vol->commit());
}

}  // namespace

TEST_CASE("fsck names: branches and views that break the name rule", "[fsck][names]") {
  auto dev = std::make_unique<MemDevice>(32 << 20);
  must(format_filesystem(*dev, FormatOptions{}, FsCreateOptions{}));
  TreeId main, work, taken, ctl;
  {
    auto vol = open_rw(*dev);
    main = must(Filesystem::default_tree(*vol));
    work = must(create_layer(*vol, "work", main, false)).tree;
    taken = must(create_layer(*vol, "w_rk", main, false)).tree;
    ctl = must(create_layer(*vol, "ctl", main, false)).tree;
    must(put_view(*vol, View{"dev", true, {{work, true}, {main, false}}}));
    must(put_view(*vol, View{"v_w", false, {{taken, true}}}));
    must(put_view(*vol, View{"other", false, {{ctl, true}}}));
    must(vol->commit());
  }
  REQUIRE(fsck(*dev, FsckMode::Check).exit_code == kFsckClean);

  damage_branch(*dev, work, 1, '/');    // "w/rk": "w_rk" is taken
  damage_branch(*dev, main, 2, '\n');   // "ma\nn"
  damage_branch(*dev, ctl, 0, 0x7f);    // "\x7ftl"
  damage_view(*dev, "dev", "d:e=v");
  damage_view(*dev, "other", "v\x01w");  // "v_w" is taken

  auto n = fsck(*dev, FsckMode::Check);
  INFO(describe(n));
  CHECK(n.exit_code == kFsckUncorrected);
  const auto found = u5(n);
  CHECK(found.size() == 5);
  // Printed so that no name breaks a line.
  const std::set<std::string> want{
      "branch \"w/rk\" breaks the name rule", "branch \"ma\\x0an\" breaks the name rule",
      "branch \"\\x7ftl\" breaks the name rule", "view \"d:e=v\" breaks the name rule",
      "view \"v\\x01w\" breaks the name rule"};
  for (const auto& w : want)
    CHECK(std::any_of(found.begin(), found.end(), [&](const std::string& m) { return m.starts_with(w); }));
  for (const auto& m : found) CHECK(m.find('\n') == std::string::npos);

  // A rename gives something up (the name a user knew): not -p's.
  auto p = fsck(*dev, FsckMode::Preen);
  CHECK(p.exit_code == kFsckUncorrected);
  CHECK(u5(fsck(*dev, FsckMode::Check)).size() == 5);

  auto y = fsck(*dev, FsckMode::Yes);
  INFO("-y:\n" << describe(y));
  CHECK(y.exit_code == kFsckCorrected);
  // The report says which name each got.
  for (const char* a : {"renamed branch \"w/rk\" (tree 257) to \"w_rk~257\"", "renamed branch \"ma\\x0an\" (tree 256) to \"ma_n\"",
                        "renamed branch \"\\x7ftl\" (tree 259) to \"_tl\"", "renamed view \"d:e=v\" to \"d_e_v\"",
                        "renamed view \"v\\x01w\" to \"v_w~3\""})
    CHECK(std::find(y.actions.begin(), y.actions.end(), a) != y.actions.end());
  CHECK(fsck(*dev, FsckMode::Check).exit_code == kFsckClean);

  VolumeOptions ro;
  ro.read_only = true;
  ro.kinds = fs_kinds();
  auto vol = must(Volume::open(*dev, ro));
  std::set<std::string> names;
  for (const auto& b : must(Filesystem::branches(*vol))) {
    CHECK(check_branch_name(b.name).ok());
    CHECK(names.insert(b.name).second);
  }
  CHECK(names == std::set<std::string>{"ma_n", "w_rk~257", "w_rk", "_tl"});
  std::set<std::string> views;
  for (const auto& v : must(list_views(*vol))) views.insert(v.name);
  CHECK(views == std::set<std::string>{"d_e_v", "v_w", "v_w~3"});
  // The views still show what they showed: a rename changes no stack.
  CHECK(must(view_stack(*vol, "d_e_v")).size() == 2);
}

TEST_CASE("fsck names: the name a repair gives", "[fsck][names]") {
  std::set<std::string> taken{"a_b", "x"};
  auto is_taken = [&](const std::string& s) { return taken.count(s) > 0; };
  CHECK(repaired_name("a/b", "branch~7", 7, is_taken) == "a_b~7");
  CHECK(repaired_name("c:d", "branch~7", 7, is_taken) == "c_d");
  CHECK(repaired_name(std::string(32, '/'), "branch~7", 7, is_taken) == std::string(32, '_'));
  taken.insert(std::string(32, '_'));
  CHECK(repaired_name(std::string(32, '/'), "branch~7", 7, is_taken) == std::string(30, '_') + "~7");
  taken.insert("branch~7");
  taken.insert("x~7");
  CHECK(repaired_name("x", "branch~7", 7, is_taken) == "branch~7.2");
  CHECK(printable_name("a\tb\"\\") == "a\\x09b\\\"\\\\");
}
