// Placement rules (format.md#placement-rules, #migration): the rule text,
// its evaluation against an independent reading of the rules, fallback and
// strict allocation, every extent of random files where its rule says, and
// migration when a file grows past a bound, is renamed or changes owner.
#include <fnmatch.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "fs/policy.h"
#include "multidev_util.h"
#include "union/view.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

PlacementRule random_rule(std::mt19937_64& rng, const std::vector<std::string>& classes) {
  static const char* kExts[] = {"mp4", "txt", "db", "jpg", "o"};
  static const char* kGlobs[] = {"*.log", "core*", "a?c", "[ab]*", "data"};
  static const char* kDirs[] = {"/db", "/home/dave", "/home", "/x/y/z"};
  PlacementRule r;
  if (rng() % 3 == 0) r.name_glob = kGlobs[rng() % 5];
  if (rng() % 3 == 0)
    for (int i = 0, n = 1 + int(rng() % 2); i < n; i++) {
      std::string e = kExts[rng() % 5];
      if (std::find(r.exts.begin(), r.exts.end(), e) == r.exts.end()) r.exts.push_back(e);
    }
  if (rng() % 3 == 0) r.size_min = (1 + rng() % 64) * 1024;
  if (rng() % 3 == 0) r.size_below = r.size_min + (1 + rng() % 256) * 1024;
  if (rng() % 4 == 0) r.uid = uint32_t(rng() % 3) * 500;
  if (rng() % 5 == 0) r.gid = uint32_t(rng() % 2) * 100;
  if (rng() % 3 == 0) r.under = kDirs[rng() % 4];
  if (rng() % 4 == 0) r.access = rng() % 2 ? PlacementRule::Access::ReadOnly : PlacementRule::Access::Written;
  std::vector<std::string> cs = classes;
  std::shuffle(cs.begin(), cs.end(), rng);
  r.to.assign(cs.begin(), cs.begin() + 1 + long(rng() % cs.size()));
  r.strict = rng() % 4 == 0;
  // A stage is a class other than the first, and never strict.
  if (!r.strict && rng() % 4 == 0)
    for (const auto& c : classes)
      if (c != r.to[0]) {
        r.stage = c;
        break;
      }
  return r;
}

// The rules read directly, one file at a time: the first whose every
// condition holds. Written apart from PlacementPolicy (string search,
// no masks) so that the two can disagree.
int reference(const std::vector<PlacementRule>& rules, const std::string& path, uint64_t size, uint32_t uid,
              uint32_t gid, uint32_t mode) {
  const std::string name = path.substr(path.find_last_of('/') + 1);
  std::string ext;
  if (auto d = name.find_last_of('.'); d != std::string::npos && d > 0)
    for (char c : name.substr(d + 1)) ext += char(std::tolower(static_cast<unsigned char>(c)));
  for (size_t i = 0; i < rules.size(); i++) {
    const auto& r = rules[i];
    bool ok = true;
    if (!r.name_glob.empty()) ok &= ::fnmatch(r.name_glob.c_str(), name.c_str(), FNM_PERIOD) == 0;
    if (!r.exts.empty()) ok &= std::count(r.exts.begin(), r.exts.end(), ext) > 0;
    ok &= size >= r.size_min && (!r.size_below || size < *r.size_below);
    if (r.uid) ok &= *r.uid == uid;
    if (r.gid) ok &= *r.gid == gid;
    if (!r.under.empty()) ok &= path.rfind(r.under + "/", 0) == 0;
    if (r.access == PlacementRule::Access::ReadOnly) ok &= (mode & 0222) == 0;
    if (r.access == PlacementRule::Access::Written) ok &= (mode & 0222) != 0;
    if (ok) return int(i);
  }
  return -1;
}

std::string random_path(std::mt19937_64& rng) {
  static const char* kDirs[] = {"", "/db", "/db/sub", "/home/dave", "/home", "/dbx", "/x/y/z"};
  static const char* kNames[] = {"a.MP4", "b.txt", "x.log", "core.1", "abc", "data", ".hidden.db", "v.jpg", "m.o", "bb"};
  return std::string(kDirs[rng() % 7]) + "/" + kNames[rng() % 10];
}

// Closes the volume and checks the whole set of devices: fsck-clean.
void close_and_check(MultiFsImage& im) {
  must(im.vol->close());
  im.vol.reset();
  VerifyOptions vo;
  vo.kinds = fs_kinds();
  require_clean(*im.set, vo);
}

}  // namespace

TEST_CASE("policy: rule text reads back to the same rule", "[policy]") {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; i++) {
    const PlacementRule r = random_rule(rng, {"fast", "mid", "slow"});
    if (r.size_below && *r.size_below <= r.size_min) continue;
    const std::string text = format_rule(r);
    auto back = must(parse_rule(text));
    REQUIRE(format_rule(back) == text);
    REQUIRE(back.exts == r.exts);
    REQUIRE(back.size_min == r.size_min);
    REQUIRE(back.size_below == r.size_below);
    REQUIRE(back.to == r.to);
    REQUIRE(back.strict == r.strict);
    REQUIRE(back.stage == r.stage);
  }
  CHECK(format_rule(must(parse_rule("stage=fast  size>=64K to=slow"))) == "size>=64K to=slow stage=fast");
  // What a user writes: operators, units, aliases, spaces.
  auto r = must(parse_rule("  ext=MP4,mkv  size>1M size<=2G uid=1000 access=read-only to=slow,fast strict "));
  CHECK(format_rule(r) == "ext=mp4,mkv size>=1048577 size<2147483649 uid=1000 access=ro to=slow,fast strict");
}

TEST_CASE("policy: a bad rule is refused, naming what is wrong", "[policy]") {
  for (const char* bad : {"", "ext=mp4", "to=", "to=a,,b", "to=a,a", "size=5 to=a", "size<0 to=a", "size<1K size>=2K to=a",
                          "size<1K size<2K to=a", "uid=-1 to=a", "uid=x to=a", "under=db to=a", "under=/a/../b to=a",
                          "name=a/b to=a", "ext=.mp4 to=a", "access=sometimes to=a", "colour=red to=a", "to=a to=b",
                          "to=a,b,c,d,e,f,g,h,i", "strictly to=a", "to=a stage=a", "to=a,b stage=a",
                          "to=a stage=b strict", "to=a stage=b,c", "to=a stage=b stage=c", "to=a stage="}) {
    auto r = parse_rule(bad);
    INFO(bad);
    REQUIRE(!r);
    CHECK(r.error().code == EINVAL);
  }
  CHECK(!parse_rule(std::string(2000, 'x')));
  // Classes are checked against the volume's.
  auto ok = must(parse_rule("to=fast"));
  auto c = PlacementPolicy::compile({ok}, {"slow"});
  REQUIRE(!c);
  CHECK(c.error().message().find("fast") != std::string::npos);
  CHECK(PlacementPolicy::compile({ok}, {}).error().code == EOPNOTSUPP);
  auto st = PlacementPolicy::compile({must(parse_rule("to=slow stage=ssd"))}, {"fast", "slow"});
  REQUIRE(!st);
  CHECK(st.error().message().find("ssd") != std::string::npos);
  // A staged rule writes to its stage, then its classes (the stage not twice),
  // and keeps its data on its first class.
  auto pol = must(PlacementPolicy::compile({must(parse_rule("to=slow,fast,mid stage=fast"))}, {"fast", "mid", "slow"}));
  CHECK(pol.write_placement(0) == (Placement{3, false, {0, 2, 1}}));
  CHECK(pol.placement(0) == (Placement{3, false, {2, 0, 1}}));
  CHECK(pol.staged(0));
  CHECK(pol.stage_classes() == 1u);
  CHECK(!PlacementPolicy::compile(std::vector<PlacementRule>(65, ok), {"fast"}));
}

TEST_CASE("policy: evaluation agrees with a direct reading of the rules", "[policy]") {
  const std::vector<std::string> classes{"fast", "mid", "slow"};
  std::mt19937_64 rng(11);
  for (int round = 0; round < 200; round++) {
    std::vector<PlacementRule> rules;
    for (int i = 0, n = 1 + int(rng() % 12); i < n; i++) {
      auto r = random_rule(rng, classes);
      if (!r.size_below || *r.size_below > r.size_min) rules.push_back(r);
    }
    auto pol = must(PlacementPolicy::compile(rules, classes));
    for (int f = 0; f < 200; f++) {
      const std::string path = random_path(rng);
      const uint64_t size = rng() % 3 == 0 ? rng() % (512 << 10) : rng() % 8192;
      const uint32_t uid = uint32_t(rng() % 3) * 500, gid = uint32_t(rng() % 2) * 100;
      const uint32_t mode = S_IFREG | (rng() % 2 ? 0644 : 0444);
      const int want = reference(rules, path, size, uid, gid, mode);
      const int got = pol.choose(pol.candidates(path, uid, gid, mode), size);
      INFO(path << " size " << size << " uid " << uid);
      REQUIRE(got == want);
      const Placement p = pol.placement(got);
      if (want < 0) {
        REQUIRE(p.n == 0);
      } else {
        REQUIRE(p.n == rules[size_t(want)].to.size());
        REQUIRE(p.strict == rules[size_t(want)].strict);
        for (size_t i = 0; i < p.n; i++) REQUIRE(classes[p.classes[i]] == rules[size_t(want)].to[i]);
      }
    }
  }
}

TEST_CASE("policy: a rule's classes in order, the others after, or strictly the first", "[policy]") {
  MultiFsImage im({48 << 20, 48 << 20, 48 << 20}, {"fast", "mid", "slow"}, {0, 1, 2});
  const SuperInfo sb = im.vol->super();
  auto fill = [&](const Placement& p) {
    std::vector<int> where;
    for (;;) {
      auto txn = must(im.vol->begin());
      txn.place(p);
      auto b = txn.alloc_extent(256);
      if (!b) {
        REQUIRE(b.error().code == ENOSPC);
        return where;
      }
      where.push_back(device_of(sb, b->v));
    }
  };
  // Strict to mid: only mid, then ENOSPC while fast and slow have room.
  const auto strict = fill(Placement{1, true, {1}});
  REQUIRE(strict.size() > 10);
  REQUIRE(std::all_of(strict.begin(), strict.end(), [](int d) { return d == 1; }));
  auto use = must(im.vol->device_usage());
  CHECK(use[0].data_blocks == 0);
  CHECK(use[2].data_blocks == 0);
  // mid, fast (not strict): mid is full, so fast, then slow (the rest in
  // the default order), then ENOSPC.
  const auto rest = fill(Placement{2, false, {1, 0}});
  const auto first_slow = std::find(rest.begin(), rest.end(), 2);
  REQUIRE(first_slow != rest.begin());
  REQUIRE(first_slow != rest.end());
  CHECK(std::all_of(rest.begin(), first_slow, [](int d) { return d == 0; }));
  CHECK(std::all_of(first_slow, rest.end(), [](int d) { return d == 2; }));
  use = must(im.vol->device_usage());
  CHECK(use[0].data_blocks > 0);
}

TEST_CASE("policy: random files land where their rules say and move when they cross one", "[policy]") {
  MultiFsImage im({96 << 20, 96 << 20}, {"fast", "slow"}, {0, 1});
  std::vector<PlacementRule> rules;
  for (const char* t : {"under=/db to=fast strict", "ext=mp4,mkv to=slow", "size<64K to=fast", "uid=1000 to=fast"})
    rules.push_back(must(parse_rule(t)));
  must(set_placement_rules(*im.vol, rules));
  auto pol = must(PlacementPolicy::compile(rules, {"fast", "slow"}));
  auto fs = must(Filesystem::open(*im.vol, im.main));
  const uint64_t db = must(fs->mkdir(fs->root(), "db", 0755, 0, 0)).ino;
  const uint64_t top = fs->root();
  struct File {
    uint64_t dir;
    std::string name;
    uint32_t uid = 0;
    std::vector<std::byte> data;
  };
  std::map<uint64_t, File> files;
  std::mt19937_64 rng(3);
  auto path_of = [&](const File& f) { return (f.dir == db ? "/db/" : "/") + f.name; };
  // Every extent of every file on the first class of its rule (or, with no
  // rule, the slowest class), and its bytes as written.
  auto check = [&] {
    fs->settle_placement();
    for (auto& [ino, f] : files) {
      const int rule = pol.choose(pol.candidates(path_of(f), f.uid, 0, S_IFREG | 0644), f.data.size());
      const Placement p = pol.placement(rule);
      const int want = p.n ? p.classes[0] : 1;
      INFO(path_of(f) << " size " << f.data.size() << " uid " << f.uid << " rule " << rule);
      for (const auto& e : must(fs->placement(ino))) REQUIRE(im.vol->class_of(BlockNo{e.block}) == want);
      std::vector<std::byte> back(f.data.size());
      REQUIRE(must(fs->read(ino, 0, back)) == back.size());
      REQUIRE(back == f.data);
    }
  };
  static const char* kExts[] = {".mp4", ".txt", ".mkv", ".bin"};
  for (int i = 0; i < 40; i++) {
    File f;
    f.dir = rng() % 3 == 0 ? db : top;
    f.name = "f" + std::to_string(i) + kExts[rng() % 4];
    const uint64_t ino = must(fs->mknod(f.dir, f.name, S_IFREG | 0644, 0, 0, 0)).ino;
    f.data.resize(rng() % 2 ? 4096 + rng() % (60 << 10) : (64 << 10) + rng() % (400 << 10));
    for (auto& b : f.data) b = std::byte(rng());
    REQUIRE(must(fs->write(ino, 0, f.data)) == f.data.size());
    files[ino] = std::move(f);
  }
  check();
  auto before = fs->migration_stats();
  for (int step = 0; step < 60; step++) {
    auto it = files.begin();
    std::advance(it, long(rng() % files.size()));
    auto& [ino, f] = *it;
    switch (rng() % 4) {
      case 0: {  // grow, perhaps past 64 KiB
        std::vector<std::byte> more(8192 + rng() % (80 << 10));
        for (auto& b : more) b = std::byte(rng());
        must(fs->write(ino, f.data.size(), more));
        f.data.insert(f.data.end(), more.begin(), more.end());
        break;
      }
      case 1: {  // shrink, perhaps below it
        SetAttr s;
        s.size = f.data.size() / 3;
        must(fs->setattr(ino, s));
        f.data.resize(*s.size);
        break;
      }
      case 2: {  // rename to another extension or directory
        const uint64_t nd = rng() % 2 ? db : top;
        const std::string nn = "r" + std::to_string(step) + kExts[rng() % 4];
        must(fs->rename(f.dir, f.name, nd, nn, 0));
        f.dir = nd;
        f.name = nn;
        break;
      }
      default: {  // chown
        SetAttr s;
        s.uid = f.uid == 1000 ? 0 : 1000;
        must(fs->setattr(ino, s));
        f.uid = *s.uid;
      }
    }
    if (step % 10 == 9) check();
  }
  check();
  CHECK(fs->migration_stats().files > before.files);
  CHECK(fs->migration_stats().failed == 0);
  // The rules and the placement survive a remount.
  fs.reset();
  im.reopen();
  must(load_placement_rules(*im.vol));
  CHECK(must(list_placement_rules(*im.vol)).size() == 4);
  fs = must(Filesystem::open(*im.vol, im.main));
  check();
  fs.reset();
  close_and_check(im);
}

// A filesystem closed while its migration worker is moving files: the
// worker finishes the file it is on and stops, and nothing it does then
// finds the placer gone (it once did: ~Filesystem cleared placer_ before the
// worker stopped, and a migration's place_for read it null; UBSan reported
// it from plyctl import). Sixty rounds, each closing with migrations
// queued; each remount reads every byte back.
TEST_CASE("policy: closing a filesystem while migrations run stops them cleanly", "[policy]") {
  MultiFsImage im({64 << 20, 64 << 20}, {"fast", "slow"}, {0, 1});
  must(set_placement_rules(*im.vol, {must(parse_rule("size<64K to=fast"))}));
  std::map<std::string, std::vector<std::byte>> files;
  std::mt19937_64 rng(seed("policy close"));
  for (int round = 0; round < 60; round++) {
    auto fs = must(Filesystem::open(*im.vol, im.main));
    for (int i = 0; i < 6; i++) {
      const std::string name = "r" + std::to_string(round) + "f" + std::to_string(i);
      const uint64_t ino = must(fs->mknod(fs->root(), name, S_IFREG | 0644, 0, 0, 0)).ino;
      std::vector<std::byte> d(8192 + rng() % (40 << 10));
      for (auto& b : d) b = std::byte(rng());
      REQUIRE(must(fs->write(ino, 0, d)) == d.size());
      // Past 64 KiB: the file crosses its rule and is queued to move to slow.
      std::vector<std::byte> more(96 << 10);
      for (auto& b : more) b = std::byte(rng());
      REQUIRE(must(fs->write(ino, d.size(), more)) == more.size());
      d.insert(d.end(), more.begin(), more.end());
      files[name] = std::move(d);
    }
    fs.reset();  // with migrations queued or running
  }
  auto fs = must(Filesystem::open(*im.vol, im.main));
  for (const auto& [name, d] : files) {
    const uint64_t ino = must(fs->lookup(fs->root(), name)).ino;
    std::vector<std::byte> back(d.size());
    REQUIRE(must(fs->read(ino, 0, back)) == back.size());
    REQUIRE(back == d);
  }
  fs.reset();
  close_and_check(im);
}

TEST_CASE("policy: fsck reports a damaged rule and -y removes just it", "[policy]") {
  MultiFsImage im({48 << 20, 48 << 20}, {"fast", "slow"}, {0, 1});
  must(set_placement_rules(*im.vol, {must(parse_rule("ext=a to=fast")), must(parse_rule("ext=b to=slow"))}));
  REQUIRE(check_views(*im.vol).empty());
  // Rule 2's text damaged in place (a class the volume lacks).
  {
    auto t = must(im.vol->begin());
    for (const auto& ti : must(t.list_trees())) {
      if (ti.kind != kKindPlain) continue;
      const std::string bad = "ext=b to=nowhere";
      must(t.put(ti.id, Key{2, 2}, std::span(reinterpret_cast<const std::byte*>(bad.data()), bad.size())));
    }
  }
  must(im.vol->commit());
  auto probs = check_views(*im.vol);
  REQUIRE(probs.size() == 1);
  CHECK(probs[0].code == "U6-rule");
  CHECK(!load_placement_rules(*im.vol));
  auto done = must(repair_views(*im.vol));
  REQUIRE(done.size() == 1);
  CHECK(check_views(*im.vol).empty());
  auto left = must(list_placement_rules(*im.vol));
  REQUIRE(left.size() == 1);
  CHECK(format_rule(left[0]) == "ext=a to=fast");
}

namespace {

// The classes a file's extents lie on, as a set (bit c: class c).
uint32_t classes_of(Filesystem& fs, Volume& vol, uint64_t ino) {
  uint32_t m = 0;
  for (const auto& e : must(fs.placement(ino))) m |= uint32_t{1} << vol.class_of(BlockNo{e.block});
  return m;
}

}  // namespace

namespace {

// A power-cut run over a migration, shared by the two tests below. Five files
// are written on a fresh volume of a fast (class 0) and a slow (class 1)
// device under `write_rules`, and must lie wholly on class `written_on`;
// `later_rules` (when given) are set after. The workload `work` then runs on
// a new mount and the migration is settled; device j's calls are cut at call
// k during it and its commits, and each device drops or tears what it had not
// flushed. Every file must read back whole, and the image verify clean; some
// crash states must have every file on `moved_to`, and some not.
struct MoveCut {
  const char* name;
  std::vector<std::string> write_rules, later_rules;
  int written_on, moved_to;
  std::function<bool(Filesystem&, const std::map<uint64_t, std::vector<std::byte>>&)> work;
};

void move_power_cuts(const MoveCut& mc) {
  const uint64_t s0 = seed(mc.name);
  auto rules = [](const std::vector<std::string>& txt) {
    std::vector<PlacementRule> r;
    for (const auto& t : txt) r.push_back(must(parse_rule(t)));
    return r;
  };
  std::vector<std::unique_ptr<MemDevice>> base;
  for (uint64_t s : {6ull << 20, 10ull << 20}) base.push_back(std::make_unique<MemDevice>(s));
  std::map<uint64_t, std::vector<std::byte>> content;
  TreeId main;
  {
    auto set = assemble(ptrs(base));
    FormatOptions fo;
    fo.classes = {"fast", "slow"};
    fo.device_classes = {0, 1};
    must(format_filesystem(*set, fo, FsCreateOptions{}));
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    auto vol = must(Volume::open(*set, vo));
    main = must(Filesystem::default_tree(*vol));
    if (!mc.write_rules.empty()) must(set_placement_rules(*vol, rules(mc.write_rules)));
    auto fs = must(Filesystem::open(*vol, main));
    fs->set_stage_delay(std::chrono::hours(1));  // nothing staged moves before the cut run
    std::mt19937_64 rng(s0);
    for (int i = 0; i < 5; i++) {
      const uint64_t ino = must(fs->mknod(fs->root(), "f" + std::to_string(i), S_IFREG | 0644, 0, 0, 0)).ino;
      std::vector<std::byte> d(20000 + rng() % 150000);
      for (auto& b : d) b = std::byte(rng());
      must(fs->write(ino, 0, d));
      REQUIRE(classes_of(*fs, *vol, ino) == uint32_t{1} << mc.written_on);
      content[ino] = std::move(d);
    }
    if (!mc.later_rules.empty()) must(set_placement_rules(*vol, rules(mc.later_rules)));
    fs.reset();
    must(vol->close());
  }
  uint64_t moved_states = 0;
  const uint64_t states = power_cuts(
      base, s0, 1000, 4,
      [&](const std::vector<BlockDevice*>& members) {
        auto set = assemble(members);
        VolumeOptions vo;
        vo.kinds = fs_kinds();
        auto vol = must(Volume::open(*set, vo));
        must(load_placement_rules(*vol));
        auto fs = must(Filesystem::open(*vol, main));
        bool ok = mc.work(*fs, content);
        if (ok) {
          fs->settle_placement();
          auto st = fs->migration_stats();
          ok = st.failed == 0 && st.files == content.size();
        }
        fs.reset();
        return ok && vol->commit().ok();
      },
      [&](std::vector<std::unique_ptr<MemDevice>>& crashed, size_t j, uint64_t k, uint64_t tear) {
        auto set = assemble(ptrs(crashed));
        VolumeOptions vo;
        vo.kinds = fs_kinds();
        INFO("device " << j << " cut at call " << k << " tear " << tear);
        {
          auto vol = must(Volume::open(*set, vo));
          auto fs = must(Filesystem::open(*vol, main));
          bool moved = true;
          for (const auto& [ino, d] : content) {
            std::vector<std::byte> back(d.size());
            REQUIRE(must(fs->getattr(ino)).size == d.size());
            REQUIRE(must(fs->read(ino, 0, back)) == d.size());
            REQUIRE(back == d);
            moved = moved && classes_of(*fs, *vol, ino) == uint32_t{1} << mc.moved_to;
          }
          moved_states += moved;
        }
        VerifyOptions vfo;
        vfo.kinds = fs_kinds();
        auto rep = must(verify_image(*set, vfo));
        for (const auto& p : rep.problems) REQUIRE(p.code == "S-slot");
      });
  std::printf("[%s] %llu crash states, %llu with every file moved\n", mc.name, (unsigned long long)states,
              (unsigned long long)moved_states);
  CHECK(moved_states > 0);
  CHECK(moved_states < states);
}

}  // namespace

TEST_CASE("policy: a power cut during a migration, each device torn on its own, loses no byte", "[policy]") {
  // Files written with no rule lie on the slow device; a rule then sends
  // *.hot to the fast one and a rename moves them there: every file must
  // read back under its old name or its new one.
  move_power_cuts({"policy-power-cut", {}, {"name=*.hot to=fast"}, 1, 0,
                   [](Filesystem& fs, const std::map<uint64_t, std::vector<std::byte>>& content) {
                     for (size_t i = 0; i < content.size(); i++) {
                       const std::string n = "f" + std::to_string(i);
                       if (!fs.rename(fs.root(), n, fs.root(), n + ".hot", 0).ok()) return false;
                     }
                     return true;
                   }});
}

TEST_CASE("policy: a power cut while a mount moves staged data, each device torn on its own, loses no byte",
          "[policy]") {
  // Files written under a staged rule by a mount that ended before they
  // moved; the next mount's look at every file moves them to slow.
  move_power_cuts({"policy-stage-power-cut", {"to=slow stage=fast"}, {}, 0, 1,
                   [](Filesystem& fs, const std::map<uint64_t, std::vector<std::byte>>&) {
                     return fs.lookup(fs.root(), "f0").ok();
                   }});
}


TEST_CASE("policy: a staged rule writes to its stage and moves the file once it is quiet", "[policy]") {
  MultiFsImage im({64 << 20, 96 << 20}, {"fast", "slow"}, {0, 1});
  must(set_placement_rules(*im.vol, {must(parse_rule("size>=64K to=slow stage=fast")), must(parse_rule("to=fast"))}));
  auto fs = must(Filesystem::open(*im.vol, im.main));
  fs->set_stage_delay(std::chrono::milliseconds(3000));
  std::mt19937_64 rng(seed("policy stage"));
  std::map<uint64_t, std::vector<std::byte>> files;
  for (int i = 0; i < 12; i++) {
    const uint64_t ino = must(fs->mknod(fs->root(), "s" + std::to_string(i), S_IFREG | 0644, 0, 0, 0)).ino;
    std::vector<std::byte> d((64 << 10) + rng() % (400 << 10));
    for (auto& b : d) b = std::byte(rng());
    REQUIRE(must(fs->write(ino, 0, d)) == d.size());
    files[ino] = std::move(d);
  }
  // Written: all on the stage (fast), all waiting.
  for (const auto& [ino, d] : files) CHECK(classes_of(*fs, *im.vol, ino) == 1u);
  CHECK(fs->migration_stats().queued == files.size());
  // A staged file deleted before it is due frees its blocks and no longer
  // waits: nothing of it is moved.
  {
    const uint64_t ino = must(fs->mknod(fs->root(), "gone", S_IFREG | 0644, 0, 0, 0)).ino;
    std::vector<std::byte> d(200 << 10, std::byte{9});
    REQUIRE(must(fs->write(ino, 0, d)) == d.size());
    CHECK(fs->migration_stats().queued == files.size() + 1);
    must(fs->unlink(fs->root(), "gone"));
    CHECK(fs->migration_stats().queued == files.size());
  }
  // A file written again within the delay waits for its last write: after
  // three writes a second apart it is still on fast (its first write 3 s
  // ago, its last 1 s), while the others, quiet for 3 s, have moved.
  const uint64_t busy = files.begin()->first;
  for (int i = 0; i < 3; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    std::vector<std::byte> more(8192);
    for (auto& b : more) b = std::byte(rng());
    auto& d = files[busy];
    REQUIRE(must(fs->write(busy, d.size(), more)) == more.size());
    d.insert(d.end(), more.begin(), more.end());
  }
  CHECK(classes_of(*fs, *im.vol, busy) & 1u);
  // Without a settle: the worker moves each file once it is due.
  for (int i = 0; i < 200 && fs->migration_stats().queued > 0; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(fs->migration_stats().queued == 0);
  for (const auto& [ino, d] : files) {
    CHECK(classes_of(*fs, *im.vol, ino) == 2u);
    std::vector<std::byte> back(d.size());
    REQUIRE(must(fs->read(ino, 0, back)) == back.size());
    REQUIRE(back == d);
  }
  CHECK(fs->migration_stats().files >= files.size());
  CHECK(fs->migration_stats().failed == 0);
  // A small file: the second rule, straight to fast, never queued.
  const uint64_t small = must(fs->mknod(fs->root(), "small", S_IFREG | 0644, 0, 0, 0)).ino;
  std::vector<std::byte> d(20000, std::byte{7});
  must(fs->write(small, 0, d));
  CHECK(fs->migration_stats().queued == 0);
  CHECK(classes_of(*fs, *im.vol, small) == 1u);
  fs.reset();
  close_and_check(im);
}

TEST_CASE("policy: a file growing into a staged rule waits to be quiet, then moves once", "[policy]") {
  // size<64K to=fast, then a staged rule to slow: a file written in 16 KiB
  // pieces crosses 64 KiB on its fifth write. It must not move then (the
  // immediate move of a crossing), but wait with the staged files.
  MultiFsImage im({64 << 20, 96 << 20}, {"fast", "slow"}, {0, 1});
  must(set_placement_rules(*im.vol, {must(parse_rule("size<64K to=fast")), must(parse_rule("to=slow stage=fast"))}));
  auto fs = must(Filesystem::open(*im.vol, im.main));
  fs->set_stage_delay(std::chrono::hours(1));
  std::mt19937_64 rng(seed("policy stage growth"));
  const uint64_t ino = must(fs->mknod(fs->root(), "grows", S_IFREG | 0644, 0, 0, 0)).ino;
  std::vector<std::byte> d;
  for (int i = 0; i < 16; i++) {
    std::vector<std::byte> piece(16 << 10);
    for (auto& b : piece) b = std::byte(rng());
    REQUIRE(must(fs->write(ino, d.size(), piece)) == piece.size());
    d.insert(d.end(), piece.begin(), piece.end());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a crossing's move would be done
  CHECK(classes_of(*fs, *im.vol, ino) == 1u);
  CHECK(fs->migration_stats().files == 0);
  CHECK(fs->migration_stats().queued == 1);
  fs->settle_placement();
  CHECK(classes_of(*fs, *im.vol, ino) == 2u);
  CHECK(fs->migration_stats().files == 1);
  std::vector<std::byte> back(d.size());
  REQUIRE(must(fs->read(ino, 0, back)) == back.size());
  REQUIRE(back == d);
  fs.reset();
  close_and_check(im);
}

TEST_CASE("policy: a rename or chown into a staged rule moves the file at once; only writes stage", "[policy]") {
  // A staged rule for .mp4 files and for uid 1000, everything else on fast.
  // A file renamed or given to uid 1000 is not being written: it crosses
  // into the rule and moves to the rule's first class (slow) straight away,
  // with the stage delay at an hour (format.md#staged-writes).
  MultiFsImage im({64 << 20, 96 << 20}, {"fast", "slow"}, {0, 1});
  must(set_placement_rules(*im.vol, {must(parse_rule("ext=mp4 to=slow stage=fast")),
                                     must(parse_rule("uid=1000 to=slow stage=fast")), must(parse_rule("to=fast"))}));
  auto fs = must(Filesystem::open(*im.vol, im.main));
  fs->set_stage_delay(std::chrono::hours(1));
  std::mt19937_64 rng(seed("policy stage rename"));
  std::map<std::string, std::vector<std::byte>> files;
  for (const char* n : {"movie.tmp", "owned", "stays"}) {
    const uint64_t ino = must(fs->mknod(fs->root(), n, S_IFREG | 0644, 0, 0, 0)).ino;
    std::vector<std::byte> d((100 << 10) + rng() % (300 << 10));
    for (auto& b : d) b = std::byte(rng());
    REQUIRE(must(fs->write(ino, 0, d)) == d.size());
    files[n] = std::move(d);
    CHECK(classes_of(*fs, *im.vol, ino) == 1u);
  }
  CHECK(fs->migration_stats().queued == 0);  // the last rule: not staged
  must(fs->rename(fs->root(), "movie.tmp", fs->root(), "movie.mp4", 0));
  files["movie.mp4"] = std::move(files["movie.tmp"]);
  files.erase("movie.tmp");
  {
    SetAttr s;
    s.uid = 1000;
    must(fs->setattr(must(fs->lookup(fs->root(), "owned")).ino, s));
  }
  // No settle and no policy apply: the worker moves both long before the
  // hour is up (it fails with a crossing into a staged rule that stages).
  auto moved = [&] {
    return classes_of(*fs, *im.vol, must(fs->lookup(fs->root(), "movie.mp4")).ino) == 2u &&
           classes_of(*fs, *im.vol, must(fs->lookup(fs->root(), "owned")).ino) == 2u;
  };
  for (int i = 0; i < 200 && !moved(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(moved());
  CHECK(fs->migration_stats().queued == 0);
  CHECK(fs->migration_stats().files == 2);
  CHECK(classes_of(*fs, *im.vol, must(fs->lookup(fs->root(), "stays")).ino) == 1u);
  // A write to a file the rule now holds stages it again: it waits.
  {
    const uint64_t ino = must(fs->lookup(fs->root(), "movie.mp4")).ino;
    std::vector<std::byte> more(64 << 10);
    for (auto& b : more) b = std::byte(rng());
    auto& d = files["movie.mp4"];
    REQUIRE(must(fs->write(ino, d.size(), more)) == more.size());
    d.insert(d.end(), more.begin(), more.end());
    CHECK(classes_of(*fs, *im.vol, ino) == 3u);
    CHECK(fs->migration_stats().queued == 1);
  }
  for (const auto& [n, d] : files) {
    std::vector<std::byte> back(d.size());
    REQUIRE(must(fs->read(must(fs->lookup(fs->root(), n)).ino, 0, back)) == back.size());
    REQUIRE(back == d);
  }
  fs.reset();
  close_and_check(im);
}

TEST_CASE("policy: a file written while the remount's look for staged data runs waits for its own delay",
          "[policy]") {
  MultiFsImage im({64 << 20, 128 << 20}, {"fast", "slow"}, {0, 1});
  must(set_placement_rules(*im.vol, {must(parse_rule("to=slow stage=fast"))}));
  std::vector<std::string> names;
  {
    auto fs = must(Filesystem::open(*im.vol, im.main));
    fs->set_stage_delay(std::chrono::hours(1));
    for (int i = 0; i < 8; i++) {
      names.push_back("f" + std::to_string(i));
      const uint64_t ino = must(fs->mknod(fs->root(), names.back(), S_IFREG | 0644, 0, 0, 0)).ino;
      std::vector<std::byte> d(256 << 10, std::byte(i + 1));
      REQUIRE(must(fs->write(ino, 0, d)) == d.size());
    }
  }
  im.reopen();
  must(load_placement_rules(*im.vol));
  auto fs = must(Filesystem::open(*im.vol, im.main));
  fs->set_stage_delay(std::chrono::hours(1));
  // At the first file the look comes to, another file (one it has yet to
  // look at) is written, as a program may the moment the mount is up: that
  // file is staged by this mount, and due an hour from now, not moved by
  // the look (4dd22ce).
  // The hook runs on the mount's worker thread: it only writes and
  // records; the checks come after.
  std::mutex mu;
  std::condition_variable cv;
  uint64_t written = 0;
  bool done = false, write_ok = false;
  fs->set_scan_hook([&](uint64_t ino) {
    std::lock_guard lk(mu);
    if (ino == 0) {
      done = true;
      cv.notify_all();
      return;
    }
    if (written) return;
    auto a = fs->lookup(fs->root(), names[0]);
    auto b = fs->lookup(fs->root(), names[1]);
    if (!a || !b) return;
    written = a->ino == ino ? b->ino : a->ino;
    std::vector<std::byte> more(8192, std::byte{0x5a});
    auto w = fs->write(written, 256 << 10, more);
    write_ok = w && *w == more.size();
  });
  // The first use of the filesystem starts the look (a lookup names a file
  // for the rules). A file this mount makes meanwhile is passed over too.
  std::vector<uint64_t> inos;
  for (const auto& n : names) inos.push_back(must(fs->lookup(fs->root(), n)).ino);
  const uint64_t fresh = must(fs->mknod(fs->root(), "new", S_IFREG | 0644, 0, 0, 0)).ino;
  std::vector<std::byte> d(128 << 10, std::byte{7});
  REQUIRE(must(fs->write(fresh, 0, d)) == d.size());
  {
    std::unique_lock lk(mu);
    REQUIRE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return done; }));
  }
  REQUIRE(write_ok);
  REQUIRE(written != 0);
  // Every file the mount found staged moved; the one written meanwhile
  // and the new one did not.
  for (uint64_t ino : inos) {
    INFO("ino " << ino);
    CHECK(classes_of(*fs, *im.vol, ino) == (ino == written ? 1u : 2u));
  }
  CHECK(classes_of(*fs, *im.vol, fresh) == 1u);
  CHECK(fs->migration_stats().files == inos.size() - 1);
  CHECK(fs->migration_stats().queued == 2);
  fs->set_scan_hook(nullptr);
  // Settled, they move too, and every byte reads back.
  fs->settle_placement();
  CHECK(classes_of(*fs, *im.vol, written) == 2u);
  CHECK(classes_of(*fs, *im.vol, fresh) == 2u);
  std::vector<std::byte> back(8192);
  REQUIRE(must(fs->read(written, 256 << 10, back)) == back.size());
  CHECK(back == std::vector<std::byte>(8192, std::byte{0x5a}));
  fs.reset();
  close_and_check(im);
}

TEST_CASE("policy: a full stage falls back to the rule's classes; a remount moves what was left staged", "[policy]") {
  MultiFsImage im({16 << 20, 128 << 20}, {"fast", "slow"}, {0, 1});
  must(set_placement_rules(*im.vol, {must(parse_rule("to=slow stage=fast"))}));
  std::mt19937_64 rng(seed("policy stage full"));
  std::map<std::string, std::vector<std::byte>> files;
  {
    auto fs = must(Filesystem::open(*im.vol, im.main));
    fs->set_stage_delay(std::chrono::hours(1));  // nothing moves while it is open
    // 40 MiB through a 16 MiB stage: no ENOSPC, the rest on slow.
    uint32_t seen = 0;
    for (int i = 0; i < 20; i++) {
      const std::string name = "f" + std::to_string(i);
      const uint64_t ino = must(fs->mknod(fs->root(), name, S_IFREG | 0644, 0, 0, 0)).ino;
      std::vector<std::byte> dd(2 << 20);
      for (auto& b : dd) b = std::byte(rng());
      REQUIRE(must(fs->write(ino, 0, dd)) == dd.size());
      seen |= classes_of(*fs, *im.vol, ino);
      files[name] = std::move(dd);
    }
    CHECK(seen == 3u);
    CHECK(fs->migration_stats().queued == files.size());
    CHECK(must(im.vol->device_usage())[0].data_blocks > 0);
    // Closed with every file still waiting: the data stays on fast.
  }
  im.reopen();
  must(load_placement_rules(*im.vol));
  CHECK(must(im.vol->device_usage())[0].data_blocks > 0);
  {
    // The next mount looks at every file once and moves what lies on the
    // stage; settle waits for that look.
    auto fs = must(Filesystem::open(*im.vol, im.main));
    (void)must(fs->lookup(fs->root(), "f0"));
    fs->settle_placement();
    CHECK(fs->migration_stats().files > 0);
    CHECK(fs->migration_stats().failed == 0);
    for (const auto& [name, d] : files) {
      const uint64_t ino = must(fs->lookup(fs->root(), name)).ino;
      CHECK(classes_of(*fs, *im.vol, ino) == 2u);
      std::vector<std::byte> back(d.size());
      REQUIRE(must(fs->read(ino, 0, back)) == back.size());
      REQUIRE(back == d);
    }
  }
  must(im.vol->commit());
  CHECK(must(im.vol->device_usage())[0].data_blocks == 0);
  close_and_check(im);
}

