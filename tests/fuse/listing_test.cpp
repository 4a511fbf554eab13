// Listings of a 16-branch union through a real mount, read as programs
// read them: telldir, seekdir and rewinddir in the middle of a listing, two
// listings of one directory at once, and names created and unlinked during
// one (lib/union/union_readdir.cpp: the union continues a listing the kernel
// continues, and starts afresh from any other offset).
#include <dirent.h>

#include <map>
#include <set>

#include "fuse_util.h"

using namespace plyfs::fusetest;

namespace {

// Names read from `d` until the end, or `n` of them; "." and ".." left out.
std::vector<std::string> read_names(DIR* d, size_t n = SIZE_MAX) {
  std::vector<std::string> out;
  while (out.size() < n) {
    errno = 0;
    dirent* e = readdir(d);
    if (!e) {
      REQUIRE(errno == 0);
      break;
    }
    std::string s = e->d_name;
    if (s != "." && s != "..") out.push_back(s);
  }
  return out;
}

}  // namespace

TEST_CASE("union mount: telldir, seekdir and rewinddir in a listing of 16 branches", "[union-fuse]") {
  std::mt19937_64 rng(seed("union-listing-fuse"));
  Fixture fx("512M");
  fx.unmount();
  const int kBranches = 16, kNames = 3000;
  std::vector<std::string> br{"main"};
  for (int k = 1; k < kBranches; k++) {
    br.push_back("b" + std::to_string(k));
    plyctl(fx, {"branch", "create", fx.img, br.back()});
  }
  // Each branch a random share of the names (some in every branch), as
  // files or directories.
  std::set<std::string> want;
  for (int k = 0; k < kBranches; k++) {
    fx.opts = {"branches=" + br[size_t(k)] + "=rw"};
    fx.mount();
    REQUIRE(::mkdir((fx / "d").c_str(), 0755) == 0);
    for (int i = 0; i < kNames; i++) {
      if (i % 7 != 0 && rng() % kBranches != 0) continue;
      const std::string name = "name-" + std::to_string(i);
      if (rng() % 5 == 0) REQUIRE(::mkdir((fx / ("d/" + name)).c_str(), 0755) == 0);
      else write_file(fx / ("d/" + name), name);
      want.insert(name);
    }
    fx.unmount();
  }
  std::string stack;
  for (int k = 0; k < kBranches; k++) stack += (k ? ":" : "") + br[size_t(k)] + (k ? "=ro" : "=rw");
  fx.opts = {"branches=" + stack};
  fx.mount();
  // Names of the read-only branches unlinked through the union: whiteouts.
  for (int i = 0; i < 40; i++) {
    auto it = std::next(want.begin(), long(rng() % want.size()));
    struct stat st;
    REQUIRE(::lstat((fx / ("d/" + *it)).c_str(), &st) == 0);
    if (S_ISDIR(st.st_mode)) continue;  // may be merged with a non-empty lower one
    REQUIRE(::unlink((fx / ("d/" + *it)).c_str()) == 0);
    want.erase(it);
  }
  const std::string dir = fx / "d";

  // The whole listing: every name once.
  DIR* d = opendir(dir.c_str());
  REQUIRE(d);
  const std::vector<std::string> all = read_names(d);
  CHECK(std::set<std::string>(all.begin(), all.end()) == want);
  CHECK(all.size() == want.size());
  // rewinddir: the same listing, in the same order.
  rewinddir(d);
  CHECK(read_names(d) == all);
  // The kernel keeps a listing read to its end (no opendir: FOPEN_CACHE_DIR)
  // until the directory changes; a change makes the next listing from the
  // start ask the daemon again, and so every seek before its end.
  auto forget_listing = [&] {
    write_file(dir + "/scratch", "");
    REQUIRE(::unlink((dir + "/scratch").c_str()) == 0);
  };
  // telldir at random points; seekdir back, in the middle of a listing the
  // daemon is reading ahead, gives the rest as it was.
  for (int t = 0; t < 20; t++) {
    forget_listing();
    rewinddir(d);
    const size_t k = rng() % (all.size() + 1);
    auto head = read_names(d, k);
    REQUIRE(head.size() == k);
    const long pos = telldir(d);
    auto rest = read_names(d, rng() % 1000);
    const long pos2 = telldir(d);
    INFO("after " << k << " names, then " << rest.size());
    seekdir(d, pos);
    CHECK(read_names(d, rest.size()) == rest);
    const std::vector<std::string> more(all.begin() + long(k + rest.size()), all.end());
    const size_t j = rng() % (more.size() + 1);
    CHECK(read_names(d, j) == std::vector<std::string>(more.begin(), more.begin() + long(j)));
    seekdir(d, pos2);
    CHECK(read_names(d) == more);
    std::vector<std::string> tail = rest;
    tail.insert(tail.end(), more.begin(), more.end());
    seekdir(d, pos);
    CHECK(read_names(d) == tail);
    // rewinddir in the middle of a listing.
    forget_listing();
    rewinddir(d);
    (void)read_names(d, rng() % all.size());
    rewinddir(d);
    CHECK(read_names(d) == all);
  }
  closedir(d);

  // Two listings of the directory at once, read in turns.
  {
    forget_listing();
    DIR* a = opendir(dir.c_str());
    DIR* b = opendir(dir.c_str());
    REQUIRE((a && b));
    std::vector<std::string> la, lb;
    for (;;) {
      auto x = read_names(a, 1 + rng() % 150), y = read_names(b, 1 + rng() % 150);
      la.insert(la.end(), x.begin(), x.end());
      lb.insert(lb.end(), y.begin(), y.end());
      if (x.empty() && y.empty()) break;
    }
    CHECK(la == all);
    CHECK(lb == all);
    closedir(a);
    closedir(b);
  }

  // Names created and unlinked during a listing: every other name exactly once.
  {
    std::set<std::string> touched;
    std::map<std::string, int> seen;
    DIR* l = opendir(dir.c_str());
    REQUIRE(l);
    int made = 0;
    for (;;) {
      auto x = read_names(l, 1 + rng() % 60);
      for (auto& n : x) seen[n]++;
      if (x.empty()) break;
      for (int c = 0; c < 3; c++) {
        if (rng() % 2) {
          const std::string n = "new-" + std::to_string(made++);
          write_file(dir + "/" + n, n);
          touched.insert(n);
        } else {
          auto it = std::next(want.begin(), long(rng() % want.size()));
          struct stat st;
          if (touched.count(*it) || ::lstat((dir + "/" + *it).c_str(), &st) != 0 || S_ISDIR(st.st_mode))
            continue;
          REQUIRE(::unlink((dir + "/" + *it).c_str()) == 0);
          touched.insert(*it);
        }
      }
    }
    closedir(l);
    for (auto& [n, c] : seen) {
      INFO(n);
      CHECK(c == 1);
    }
    for (auto& n : want) {
      if (touched.count(n)) continue;
      INFO(n << " was there throughout");
      CHECK(seen[n] == 1);
    }
  }
  fx.unmount();
}
