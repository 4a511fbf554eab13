// A clone stacked over its source (format.md#fs-union, "Inode numbers"):
// the two hold the same objects under the same numbers, each under its own
// names. st_ino must name one object in a mount: the clone's names show,
// and the source's name for an object the clone holds elsewhere does not.
#include <functional>
#include <map>
#include <set>

#include "fuse_util.h"

using namespace plyfs::fusetest;

namespace {

// Every name under `dir` (recursively) by st_ino, with each object's nlink.
void names_by_ino(const std::string& dir, const std::string& rel,
                  std::map<ino_t, std::vector<std::string>>& names, std::map<ino_t, nlink_t>& nlink) {
  for (const auto& n : list_dir(dir)) {
    const std::string p = dir + "/" + n;
    const struct stat st = lstat_of(p);
    names[st.st_ino].push_back(rel + n);
    nlink[st.st_ino] = st.st_nlink;
    if (S_ISDIR(st.st_mode)) names_by_ino(p, rel + n + "/", names, nlink);
  }
}

// One number, one object: a directory has one name, a file as many names
// as its link count says.
void require_one_object_per_number(const std::string& root) {
  std::map<ino_t, std::vector<std::string>> names;
  std::map<ino_t, nlink_t> nlink;
  names_by_ino(root, "", names, nlink);
  for (const auto& [ino, ns] : names) {
    std::string all;
    for (const auto& n : ns) all += n + " ";
    INFO("st_ino " << ino << ": " << all << "(nlink " << nlink[ino] << ")");
    const struct stat st = lstat_of(root + "/" + ns[0]);
    if (S_ISDIR(st.st_mode)) CHECK(ns.size() == 1);
    else CHECK(ns.size() == nlink[ino]);
  }
}

// main with `setup` done, cloned as c, `in_clone` done in c alone, then
// c=rw:main=ro mounted.
void clone_stack(Fixture& fx, const std::function<void()>& setup, const std::function<void()>& in_clone) {
  setup();
  fx.unmount();
  plyctl(fx, {"clone", fx.img, "main", "c"});
  fx.opts = {"branches=c"};
  fx.mount();
  in_clone();
  fx.unmount();
  fx.opts = {"branches=c=rw:main=ro"};
  fx.mount();
}

}  // namespace

TEST_CASE("lineage: a file renamed in a clone shows once over its source", "[lineage]") {
  Fixture fx;
  clone_stack(fx, [&] { write_file(fx / "a", "one"); },
              [&] { REQUIRE(::rename((fx / "a").c_str(), (fx / "b").c_str()) == 0); });
  CHECK(list_dir(fx.root()) == std::vector<std::string>{"b"});
  struct stat st;
  REQUIRE_ERRNO(::lstat((fx / "a").c_str(), &st), ENOENT);
  CHECK(lstat_of(fx / "b").st_nlink == 1);
  require_one_object_per_number(fx.root());
  write_file(fx / "b", "two");
  CHECK(read_file(fx / "b") == "two");
  // The name stays free for a new file, which is another object.
  write_file(fx / "a", "new a");
  CHECK(lstat_of(fx / "a").st_ino != lstat_of(fx / "b").st_ino);
  require_one_object_per_number(fx.root());
  fx.remount();
  CHECK(read_file(fx / "a") == "new a");
  CHECK(read_file(fx / "b") == "two");
  fx.unmount();
  // main is as it was.
  fx.opts = {"branches=main=ro"};
  fx.mount();
  CHECK(list_dir(fx.root()) == std::vector<std::string>{"a"});
  CHECK(read_file(fx / "a") == "one");
  fx.unmount();
}

TEST_CASE("lineage: hard links renamed or dropped in a clone keep the clone's names and count",
          "[lineage]") {
  Fixture fx;
  clone_stack(fx,
              [&] {
                write_file(fx / "a", "linked");
                REQUIRE(::link((fx / "a").c_str(), (fx / "h").c_str()) == 0);
                REQUIRE(::link((fx / "a").c_str(), (fx / "gone").c_str()) == 0);
              },
              [&] {
                REQUIRE(::rename((fx / "a").c_str(), (fx / "b").c_str()) == 0);
                REQUIRE(::unlink((fx / "gone").c_str()) == 0);
              });
  CHECK(list_dir(fx.root()) == std::vector<std::string>({"b", "h"}));
  CHECK(lstat_of(fx / "b").st_ino == lstat_of(fx / "h").st_ino);
  CHECK(lstat_of(fx / "b").st_nlink == 2);
  require_one_object_per_number(fx.root());
  write_file(fx / "h", "through h");
  CHECK(read_file(fx / "b") == "through h");
  REQUIRE(::unlink((fx / "h").c_str()) == 0);
  CHECK(lstat_of(fx / "b").st_nlink == 1);
  CHECK(list_dir(fx.root()) == std::vector<std::string>{"b"});
  fx.unmount();
}

TEST_CASE("lineage: a directory renamed in a clone shows once, with its files", "[lineage]") {
  Fixture fx;
  clone_stack(fx,
              [&] {
                REQUIRE(::mkdir((fx / "d").c_str(), 0755) == 0);
                write_file(fx / "d/x", "in d");
                REQUIRE(::mkdir((fx / "keep").c_str(), 0755) == 0);
                write_file(fx / "keep/y", "kept");
              },
              [&] {
                REQUIRE(::rename((fx / "d").c_str(), (fx / "e").c_str()) == 0);
                REQUIRE(::rename((fx / "keep/y").c_str(), (fx / "e/y").c_str()) == 0);
              });
  CHECK(list_dir(fx.root()) == std::vector<std::string>({"e", "keep"}));
  CHECK(list_dir(fx / "e") == std::vector<std::string>({"x", "y"}));
  CHECK(list_dir(fx / "keep").empty());
  CHECK(read_file(fx / "e/y") == "kept");
  require_one_object_per_number(fx.root());
  // keep is empty in the union (its y moved): it can go, a whiteout hiding main's.
  REQUIRE(::rmdir((fx / "keep").c_str()) == 0);
  CHECK(list_dir(fx.root()) == std::vector<std::string>({"e"}));
  fx.unmount();
}
