// Merged listings of the union layer (lib/union/union_readdir.cpp) against a
// model: 1 to 16 branches with random names (files, directories,
// whiteouts, opaque directories, clones whose renamed names the lineage
// rule hides), listed whole, resumed from every cookie, and read in small
// replies as the kernel reads them, with creates and unlinks in between.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <set>

#include "fs/fs.h"
#include "fs/items.h"
#include "union/union.h"
#include "test_util.h"

namespace plyfs::test {
namespace {

const Caller kRoot{0, 0, 0};

struct Stack {
  std::unique_ptr<MemDevice> dev;
  std::unique_ptr<Volume> vol;
  std::vector<TreeId> trees;
  std::vector<std::unique_ptr<Filesystem>> fs;
  std::vector<int> lineage;  // per branch: the branch its tree was cloned from, or itself
  uint64_t sub = 0;          // the name of the merged subdirectory's test ("sub")

  void open() {
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    vol = must(Volume::open(*dev, vo));
    fs.clear();
    for (TreeId t : trees) fs.push_back(must(Filesystem::open(*vol, t)));
  }
  void close() {
    for (auto& f : fs) must(f->release_all());
    fs.clear();
    must(vol->close());
    vol.reset();
  }
};

const char* const kKinds = "fdwo";  // file, directory, whiteout, opaque directory

// Two names whose 56-bit name hashes collide (tests/lib/fs_test.cpp has
// the pair; both hash to 0x7b40f2a9875735), so that one hash group holds
// several names, in another seq order in each branch than in name order.
const char* const kCollide[] = {"user.c686d7fc93c05fc", "user.c4021611ef787d5"};

// A branch's random share of a pool of names in `dir`, and of the colliding ones.
void fill(Filesystem& f, uint64_t dir, std::mt19937_64& rng, size_t pool, unsigned density) {
  std::vector<std::string> names;
  for (size_t i = 0; i < pool; i++) names.push_back("n" + std::to_string(i));
  if (rng() % 2) names.insert(names.begin(), {kCollide[0], kCollide[1]});
  else names.insert(names.begin(), {kCollide[1], kCollide[0]});
  for (const auto& name : names) {
    if (rng() % 100 >= density) continue;
    switch (kKinds[rng() % 4]) {
      case 'f': (void)f.mknod(dir, name, S_IFREG | 0644, 0, 0, 0); break;
      case 'd': (void)f.mkdir(dir, name, 0755, 0, 0); break;
      case 'w': (void)f.whiteout(dir, name); break;
      default: {
        auto a = f.mkdir(dir, name, 0755, 0, 0);
        if (a) {
          SetAttr s;
          s.opaque = true;
          must(f.setattr(a->ino, s));
        }
      }
    }
  }
}

// n branches; some are clones of branch 0 (renamed names in them are
// hidden: branch 0, of their lineage and left of them, holds the object).
Stack make_stack(size_t n, std::mt19937_64& rng) {
  Stack s;
  s.dev = std::make_unique<MemDevice>(256ull << 20);
  must(format_filesystem(*s.dev, FormatOptions{}, FsCreateOptions{}));
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  s.vol = must(Volume::open(*s.dev, vo));
  s.trees.push_back(must(Filesystem::default_tree(*s.vol)));
  s.lineage.push_back(0);
  {
    auto f0 = must(Filesystem::open(*s.vol, s.trees[0]));
    fill(*f0, f0->root(), rng, 200, 40);
    auto sub = f0->mkdir(f0->root(), "sub", 0755, 0, 0);
    if (sub) fill(*f0, sub->ino, rng, 60, 50);
    must(f0->release_all());
  }
  for (size_t i = 1; i < n; i++) {
    if (rng() % 3 == 0) {
      auto t = must(s.vol->begin({.reserve_blocks = 64}));
      s.trees.push_back(must(t.clone_tree(s.trees[0])));
      s.lineage.push_back(0);
    } else {
      FsCreateOptions o;
      o.name = "b" + std::to_string(i);
      s.trees.push_back(must(Filesystem::create(*s.vol, o)));
      s.lineage.push_back(int(i));
    }
  }
  s.close();
  s.open();
  for (size_t i = 1; i < n; i++) {
    Filesystem& f = *s.fs[i];
    if (s.lineage[i] == 0) {  // a clone: rename a few of the source's names
      std::vector<std::string> names;
      must(f.readdir(f.root(), 0, [&](const DirEntry& e) {
        if (e.type != DT_WHT && e.name != "." && e.name != ".." && e.name != "sub")
          names.emplace_back(e.name);
        return true;
      }));
      for (const auto& nm : names)
        if (rng() % 4 == 0) (void)f.rename(f.root(), nm, f.root(), "r" + nm, 0);
    }
    fill(f, f.root(), rng, 200, 25);
    auto sub = f.lookup(f.root(), "sub");
    if (!sub) sub = f.mkdir(f.root(), "sub", 0755, 0, 0);
    if (sub && S_ISDIR(sub->mode)) fill(f, sub->ino, rng, 60, 50);
  }
  return s;
}

// One listed name: its cookie, number and type.
struct Ent {
  uint64_t cookie, ino;
  uint8_t type;
  bool operator==(const Ent&) const = default;
};
using Listing = std::map<std::string, Ent>;

// The model's listing of the union directory whose parts are `dirs`: the
// leftmost entry of a name decides; a whiteout, or an object that a branch
// of its lineage further left holds (nlink > 0), hides it; the cookie is
// hash << 7 | rank among the visible names of the hash in name order.
Listing model(Stack& s, const std::vector<std::pair<int, uint64_t>>& dirs) {
  std::map<std::string, std::pair<int, DirEntry>> first;
  std::map<std::string, std::string> keep;  // names outlive the readdir callback
  for (auto [b, dino] : dirs) {
    must(s.fs[size_t(b)]->readdir(dino, 3, [&](const DirEntry& e) {
      std::string n(e.name);
      if (!first.count(n)) first.emplace(n, std::pair{b, DirEntry{"", e.ino, e.type, 0}});
      return true;
    }));
  }
  std::map<uint64_t, std::vector<std::pair<std::string, Ent>>> groups;
  for (auto& [name, be] : first) {
    auto [b, e] = be;
    if (e.type == DT_WHT) continue;
    bool hidden = false;
    for (int j = 0; j < b && !hidden; j++) {
      if (s.lineage[size_t(j)] != s.lineage[size_t(b)]) continue;
      auto a = s.fs[size_t(j)]->getattr(e.ino);
      hidden = a && a->nlink > 0;
    }
    if (!hidden) groups[fsitems::name_hash(name)].push_back({name, Ent{0, e.ino, e.type}});
  }
  Listing out;
  for (auto& [h, names] : groups) {  // names: in byte order (from the map)
    uint64_t rank = 0;
    for (auto& [name, e] : names) {
      e.cookie = h << 7 | std::min<uint64_t>(rank++, 127);
      out[name] = e;
    }
  }
  return out;
}

// The union's listing from `cookie`, whole, in one call; checks cookie order.
std::vector<std::pair<std::string, Ent>> list_from(Union& u, uint64_t dir, uint64_t cookie) {
  std::vector<std::pair<std::string, Ent>> out;
  must(u.readdir(dir, cookie, [&](const DirEntry& e) {
    if (e.name == "." || e.name == "..") return true;
    out.push_back({std::string(e.name), Ent{e.next - 1, e.ino, e.type}});
    return true;
  }));
  for (size_t i = 1; i < out.size(); i++) REQUIRE(out[i - 1].second.cookie < out[i].second.cookie);
  return out;
}

// Reads the listing as the kernel does: replies of a few entries, each
// request continuing at the last entry's offset; `between` runs between
// replies. Returns every name handed out, in order (duplicates kept).
std::vector<std::pair<std::string, Ent>> list_in_replies(
    Union& u, uint64_t dir, std::mt19937_64& rng, bool plus,
    const std::function<void()>& between) {
  std::vector<std::pair<std::string, Ent>> out;
  uint64_t off = 0;
  for (int rounds = 0;; rounds++) {
    REQUIRE(rounds < 100000);
    const size_t room = 1 + rng() % 9;
    size_t took = 0;
    auto take = [&](const DirEntry& e) {
      if (took == room) return false;
      took++;
      off = e.next;
      if (e.name != "." && e.name != "..") out.push_back({std::string(e.name), Ent{e.next - 1, e.ino, e.type}});
      return true;
    };
    if (plus) {
      must(u.readdirplus(dir, off, [&](const DirEntry& e, const Attr* a) {
        const bool more = take(e);
        if (more && a) {
          CHECK(a->ino == e.ino);
          must(u.unpin(a->ino));  // readdirplus counted a reference, as the kernel's lookup
        }
        return more;
      }));
    } else {
      must(u.readdir(dir, off, take));
    }
    if (took == 0) return out;
    between();
  }
}

TEST_CASE("union listings: a k-way merge of 1-16 branches agrees with the model from every cookie",
          "[unionlist]") {
  std::mt19937_64 rng(seed("unionlist"));
  for (int round = 0; round < int(6 * scale()); round++) {
    const size_t n = round == 0 ? 16 : 1 + rng() % 16;
    INFO("round " << round << ", " << n << " branches");
    Stack s = make_stack(n, rng);
    std::vector<UnionBranch> br;
    for (size_t i = 0; i < n; i++) br.push_back({s.fs[i].get(), i == 0});
    Union u(br);
    // The root, and "sub" (merged down to the first opaque part, if a directory).
    std::vector<std::pair<uint64_t, std::vector<std::pair<int, uint64_t>>>> dirs;
    std::vector<std::pair<int, uint64_t>> roots;
    for (size_t i = 0; i < n; i++) roots.emplace_back(int(i), s.fs[i]->root());
    dirs.emplace_back(u.root(), roots);
    if (auto a = u.lookup(u.root(), "sub"); a && S_ISDIR(a->mode)) {
      std::vector<std::pair<int, uint64_t>> parts;
      for (size_t i = 0; i < n; i++) {
        auto e = must(s.fs[i]->entry(s.fs[i]->root(), "sub"));
        if (!e) continue;
        if (e->type != DT_DIR) break;
        parts.emplace_back(int(i), e->ino);
        if (must(s.fs[i]->getattr(e->ino)).opaque) break;
      }
      dirs.emplace_back(a->ino, parts);  // referenced: the union keeps knowing it
    }
    for (auto& [dir, parts] : dirs) {
      const Listing want = model(s, parts);
      // Whole, in cookie order, each name once, as the model says.
      auto got = list_from(u, dir, 0);
      Listing as_map;
      for (auto& [name, e] : got) {
        INFO(name);
        CHECK(as_map.emplace(name, e).second);
      }
      CHECK(as_map == want);
      // From every cookie (and the dots'): exactly the entries at or after it.
      std::vector<uint64_t> from{1, 2, 3};
      for (auto& [name, e] : want) from.push_back(e.cookie + 1), from.push_back(e.cookie);
      for (uint64_t c : from) {
        if (rng() % 3) continue;  // a third of them: the full set is quadratic
        std::vector<std::pair<std::string, Ent>> expect;
        for (auto& [name, e] : got)
          if (e.cookie >= std::max<uint64_t>(c, 3)) expect.push_back({name, e});
        INFO("from cookie " << c);
        CHECK(list_from(u, dir, c) == expect);
      }
      // In small replies, as the kernel reads: the same listing.
      CHECK(list_in_replies(u, dir, rng, rng() % 2, [] {}) == got);
    }
  }
}

TEST_CASE("union listings: names created and unlinked during a listing; every other name once",
          "[unionlist]") {
  std::mt19937_64 rng(seed("unionlist-changes"));
  for (int round = 0; round < int(6 * scale()); round++) {
    const size_t n = 1 + rng() % 16;
    INFO("round " << round << ", " << n << " branches");
    Stack s = make_stack(n, rng);
    std::vector<UnionBranch> br;
    for (size_t i = 0; i < n; i++) br.push_back({s.fs[i].get(), i == 0});
    Union u(br);
    const uint64_t root = u.root();
    auto before = list_from(u, root, 0);
    std::set<std::string> touched;  // created or unlinked during the listing
    std::vector<std::string> names;
    for (auto& [name, e] : before) names.push_back(name);
    int k = 0;
    auto between = [&] {
      if (rng() % 2) return;
      if (rng() % 2 && !names.empty()) {
        const std::string& victim = names[rng() % names.size()];
        auto a = u.lookup(root, victim);
        if (a) {
          must(u.unpin(a->ino));
          if (!S_ISDIR(a->mode) && u.unlink(root, victim)) touched.insert(victim);
        }
      } else {
        const std::string nm = "new" + std::to_string(k++);
        auto a = u.mknod(root, nm, S_IFREG | 0644, 0, kRoot);
        if (a) {
          must(u.unpin(a->ino));
          touched.insert(nm);
        }
      }
    };
    auto got = list_in_replies(u, root, rng, rng() % 2, between);
    std::map<std::string, int> count;
    for (auto& [name, e] : got) count[name]++;
    for (auto& [name, c] : count) {
      INFO(name);
      CHECK(c == 1);  // never twice, changed or not
    }
    for (auto& [name, e] : before) {
      if (touched.count(name)) continue;
      INFO(name << " was there throughout");
      CHECK(count[name] == 1);
    }
    // After the changes, a fresh listing is the model's.
    std::vector<std::pair<int, uint64_t>> roots;
    for (size_t i = 0; i < n; i++) roots.emplace_back(int(i), s.fs[i]->root());
    const Listing want = model(s, roots);
    Listing now;
    for (auto& [name, e] : list_from(u, root, 0)) now.emplace(name, e);
    CHECK(now == want);
  }
}

}  // namespace
}  // namespace plyfs::test
