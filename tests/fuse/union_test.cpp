// Branches and union mounts through the real tools: plyctl makes a layer,
// plyfs mounts a stack of branches, and what the user does in the union
// (writes, deletes, mkdir over a deleted directory, renames of lower
// directories) lands in the top branch only, with st_ino kept.
#include <sys/statvfs.h>
#include <sys/xattr.h>

#include <filesystem>
#include <map>

#include "fuse_util.h"

using namespace plyfs::fusetest;

TEST_CASE("union mount: a layer over a read-only branch", "[union-fuse]") {
  Fixture fx;
  REQUIRE(::mkdir((fx / "d").c_str(), 0755) == 0);
  REQUIRE(::mkdir((fx / "d/sub").c_str(), 0700) == 0);
  write_file(fx / "d/f", "base");
  write_file(fx / "d/g", "gone soon");
  write_file(fx / "d/sub/h", "deep");
  std::mt19937_64 rng(seed("union-fuse"));
  const std::string big = random_bytes(rng, 32 << 20);
  write_file(fx / "big", big);
  REQUIRE(::setxattr((fx / "big").c_str(), "user.k", "v", 1, 0) == 0);
  const ino_t f_ino = lstat_of(fx / "d/f").st_ino, sub_ino = lstat_of(fx / "d/sub").st_ino,
              big_ino = lstat_of(fx / "big").st_ino;
  fx.unmount();
  plyctl(fx, {"branch", "create", fx.img, "top", "--parent", "main"});
  plyctl(fx, {"view", "create", fx.img, "work", "top=rw:main=ro", "--default"});
  fx.mount();  // the default view now

  // The union shows the base.
  REQUIRE(read_file(fx / "d/f") == "base");
  REQUIRE(list_dir(fx / "d") == std::vector<std::string>({"f", "g", "sub"}));
  // Copy-up of a 32 MiB file: no data copied, inode number and xattrs kept.
  const uint64_t before = free_blocks(fx.root());
  {
    int fd = ::open((fx / "big").c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    pwrite_all(fd, "HEAD", 4, 0);
    ::close(fd);
  }
  CHECK(before - free_blocks(fx.root()) < 64);  // 32 MiB would be 8192 blocks
  CHECK(lstat_of(fx / "big").st_ino == big_ino);
  char v[4] = {};
  CHECK(::getxattr((fx / "big").c_str(), "user.k", v, sizeof v) == 1);
  // Changes: a write, a delete, a whole directory removed and made again
  // (opaque: empty), a lower directory renamed (no EXDEV).
  write_file(fx / "d/f", "changed");
  REQUIRE(::unlink((fx / "d/g").c_str()) == 0);
  REQUIRE(::unlink((fx / "d/sub/h").c_str()) == 0);
  REQUIRE(::rmdir((fx / "d/sub").c_str()) == 0);
  REQUIRE(::mkdir((fx / "d/sub").c_str(), 0755) == 0);
  REQUIRE(list_dir(fx / "d/sub").empty());
  write_file(fx / "d/sub/new", "n");
  REQUIRE(::rename((fx / "d").c_str(), (fx / "e").c_str()) == 0);
  auto check_union = [&] {
    INFO("the union view");
    CHECK(::access((fx / "d").c_str(), F_OK) != 0);
    CHECK(read_file(fx / "e/f") == "changed");
    CHECK(lstat_of(fx / "e/f").st_ino == f_ino);
    CHECK(list_dir(fx / "e") == std::vector<std::string>({"f", "sub"}));
    CHECK(list_dir(fx / "e/sub") == std::vector<std::string>({"new"}));
    CHECK(read_file(fx / "big").substr(0, 4) == "HEAD");
    CHECK(read_file(fx / "big").substr(4) == big.substr(4));
  };
  check_union();
  fx.remount();
  check_union();
  fx.unmount();
  // The base branch alone is as it was.
  fx.opts = {"branches=main=ro"};
  fx.mount();
  CHECK(read_file(fx / "d/f") == "base");
  CHECK(list_dir(fx / "d") == std::vector<std::string>({"f", "g", "sub"}));
  CHECK(read_file(fx / "d/sub/h") == "deep");
  CHECK(lstat_of(fx / "d/sub").st_ino == sub_ino);
  CHECK(read_file(fx / "big") == big);
  CHECK(::mkdir((fx / "x").c_str(), 0755) != 0);
  CHECK(errno == EROFS);
  fx.unmount();

  // plyctl refuses what would break a view, and a clone is a full, separate copy.
  auto plyctl_rc = [&](std::vector<std::string> args) {
    args.insert(args.begin(), plyctl_bin());
    return run(args, fx.tmp / "plyctl.log");
  };
  CHECK(plyctl_rc({"branch", "remove", fx.img, "main"}) == 1);       // the view shows it
  CHECK(plyctl_rc({"branch", "set", fx.img, "top", "--ro"}) == 1);   // the view writes it
  CHECK(plyctl_rc({"branch", "create", fx.img, "top"}) == 1);        // the name is taken
  CHECK(plyctl_rc({"branch", "create", fx.img}) == 2);               // usage
  plyctl(fx, {"branch", "create", fx.img, "copy", "--clone", "top"});
  fx.opts = {"branches=copy=rw:main=ro"};
  fx.mount();
  CHECK(read_file(fx / "e/f") == "changed");
  write_file(fx / "e/f", "only in the clone");
  fx.unmount();
  fx.opts = {"view=work"};
  fx.mount();
  CHECK(read_file(fx / "e/f") == "changed");
  fx.unmount();
  plyctl(fx, {"view", "delete", fx.img, "work"});
  plyctl(fx, {"branch", "remove", fx.img, "copy"});
  CHECK(plyctl_rc({"branch", "remove", fx.img, "main"}) == 1);  // top is layered on it
}

TEST_CASE("union mount: bad stacks are refused with exit 32", "[union-fuse]") {
  Fixture fx;
  fx.unmount();
  for (std::string bad : {"branches=nope", "branches=main:main", "view=none", "branches=main=xx"}) {
    const std::string log = fx.tmp / "bad.log";
    int rc = run({plyfs_bin(), fx.img, fx.tmp / "mnt", "-f", "-o", bad}, log);
    INFO(bad << ": " << slurp(log));
    CHECK(rc == 32);
  }
}

TEST_CASE("union mount: delete=all empties the writable branches, whiteouts only over read-only ones",
          "[union-fuse]") {
  Fixture fx;
  write_file(fx / "both", "main's");
  write_file(fx / "ro-only", "main's");
  fx.unmount();
  plyctl(fx, {"branch", "create", fx.img, "mid"});
  plyctl(fx, {"branch", "create", fx.img, "ro"});
  fx.opts = {"branches=mid=rw"};
  fx.mount();
  write_file(fx / "both", "mid's");
  fx.unmount();
  fx.opts = {"branches=ro=rw"};
  fx.mount();
  write_file(fx / "ro-only", "ro's");
  fx.unmount();
  // main over mid, both writable, over ro, read-only.
  fx.opts = {"branches=main=rw:mid=rw:ro=ro", "delete=all"};
  fx.mount();
  CHECK(read_file(fx / "both") == "main's");
  REQUIRE(::unlink((fx / "both").c_str()) == 0);
  REQUIRE(::unlink((fx / "ro-only").c_str()) == 0);
  CHECK(::access((fx / "both").c_str(), F_OK) != 0);
  CHECK(::access((fx / "ro-only").c_str(), F_OK) != 0);
  fx.unmount();
  // mid lost its copy: nothing hides, nothing shows.
  fx.opts = {"branches=mid=ro"};
  fx.mount();
  CHECK(list_dir(fx.root()).empty());
  fx.unmount();
  // The default mode would have left mid's copy, hidden by a whiteout in main.
  fx.opts = {"branches=ro=ro"};
  fx.mount();
  CHECK(read_file(fx / "ro-only") == "ro's");  // read-only: kept
  fx.unmount();
  const std::string log = fx.tmp / "bad.log";
  CHECK(run({plyfs_bin(), fx.img, fx.tmp / "mnt", "-f", "-o", "delete=some"}, log) == 1);
  CHECK(slurp(log).find("bad delete mode") != std::string::npos);
}

TEST_CASE("union mount: branches change while mounted (plyctl on the mount point)", "[union-fuse]") {
  Fixture fx;
  write_file(fx / "f", "main's f");
  fx.unmount();
  for (const char* b : {"top", "extra", "w"}) plyctl(fx, {"branch", "create", fx.img, b});
  fx.opts = {"branches=extra=rw"};
  fx.mount();
  write_file(fx / "x", "extra's x");
  write_file(fx / "f", "extra's f");
  fx.unmount();
  fx.opts = {"branches=top=rw:main=ro", "allow_other"};
  fx.mount();
  const std::string mnt = fx.root();
  auto ctl = [&](std::vector<std::string> args, std::string* out = nullptr) {
    args.insert(args.begin(), "branch");
    args.insert(args.begin(), plyctl_bin());
    const std::string log = fx.tmp / "ctl.log";
    ::unlink(log.c_str());
    const int rc = run(args, log);
    if (out) *out = slurp(log);
    return rc;
  };
  std::string out;
  REQUIRE(ctl({"list", mnt}, &out) == 0);
  CHECK(out == "top=rw:main=ro\n");
  write_file(fx / "g", "top's g");
  CHECK(read_file(fx / "f") == "main's f");
  const ino_t f_ino = lstat_of(fx / "f").st_ino;
  struct stat st;
  CHECK(::lstat((fx / "x").c_str(), &st) != 0);  // the kernel may keep this negative entry

  // A file opened for writing before its branch turns read-only does not
  // change it: the write copies it up into the new writable branch.
  int wfd = ::open((fx / "g").c_str(), O_WRONLY);
  REQUIRE(wfd >= 0);
  REQUIRE(ctl({"add", mnt, "w"}) == 0);           // leftmost, read-write
  REQUIRE(ctl({"set", mnt, "top", "--ro"}) == 0);
  REQUIRE(ctl({"list", mnt, "--json"}, &out) == 0);
  // The stack: StackEntry objects of plyctl(8), leftmost first.
  CHECK(out == R"([{"branch":"w","id":259,"writable":true},{"branch":"top","id":257,"writable":false},)"
               R"({"branch":"main","id":256,"writable":false}])" "\n");
  REQUIRE(::pwrite(wfd, "W", 1, 0) == 1);
  REQUIRE(::fsync(wfd) == 0);
  REQUIRE(::close(wfd) == 0);
  CHECK(read_file(fx / "g") == "Wop's g");

  // A branch added below shows its names at once (negative entries dropped).
  REQUIRE(ctl({"add", mnt, "extra", "--at", "2", "--ro"}) == 0);  // w, top, extra, main
  CHECK(read_file(fx / "x") == "extra's x");
  CHECK(read_file(fx / "f") == "extra's f");
  CHECK(lstat_of(fx / "f").st_ino != f_ino);  // extra's own file: a number of its own
  REQUIRE(ctl({"move", mnt, "extra", "3"}) == 0);  // w, top, main, extra
  CHECK(read_file(fx / "f") == "main's f");
  CHECK(lstat_of(fx / "f").st_ino == f_ino);

  // An open file whose branch leaves the stack answers ESTALE.
  int rfd = ::open((fx / "x").c_str(), O_RDONLY);
  REQUIRE(rfd >= 0);
  REQUIRE(ctl({"remove", mnt, "extra"}) == 0);
  char c;
  REQUIRE_ERRNO(::pread(rfd, &c, 1, 0), ESTALE);
  ::close(rfd);
  CHECK(::lstat((fx / "x").c_str(), &st) != 0);
  REQUIRE(ctl({"list", mnt}, &out) == 0);
  CHECK(out == "w=rw:top=ro:main=ro\n");

  // Refusals: clear errors, nothing changed.
  CHECK(ctl({"remove", mnt, "extra"}) == 1);          // not in the stack
  CHECK(ctl({"add", mnt, "nope"}) == 1);              // no such branch
  CHECK(ctl({"add", mnt, "main"}) == 1);              // already there
  CHECK(ctl({"move", mnt, "w", "9"}) == 1);           // no such place
  CHECK(ctl({"set", mnt, "w"}) == 2);                 // usage
  {
    const std::string log = fx.tmp / "ctl.log";
    ::unlink(log.c_str());
    REQUIRE(::chmod(fx.tmp.path().c_str(), 0755) == 0);  // let the other user reach the mount
    CHECK(run({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", plyctl_bin(), "branch",
               "set", mnt, "top", "--rw"}, log) == 1);
    CHECK(slurp(log).find("only root or the mount's owner") != std::string::npos);
  }
  REQUIRE(ctl({"list", mnt}, &out) == 0);
  CHECK(out == "w=rw:top=ro:main=ro\n");
  fx.unmount();  // fsck clean

  // The branches kept what landed in them; the changes lasted until unmount.
  fx.opts = {"branches=top=ro"};
  fx.mount();
  CHECK(read_file(fx / "g") == "top's g");
  fx.unmount();
  fx.opts = {"branches=w=ro"};
  fx.mount();
  CHECK(read_file(fx / "g") == "Wop's g");
  fx.unmount();
}

// With the writeback cache the kernel keeps its own size and times of a file
// for as long as it keeps the inode, whatever the daemon answers later. A file
// held open across a live change (or whose release is still on its way, as
// after any close) keeps its inode: the new stack's version of the file,
// another instance of the same number with another size, must still show
// whole, not cut or padded to the old size.
TEST_CASE("union mount: a live change shows another instance's size while the file is open",
          "[union-fuse]") {
  Fixture fx;
  write_file(fx / "f", "short");
  fx.unmount();
  plyctl(fx, {"branch", "create", fx.img, "top", "--parent", "main"});
  plyctl(fx, {"branch", "create", fx.img, "w"});
  fx.opts = {"branches=top=rw:main=ro"};
  fx.mount();
  const std::string longer = "a much longer content";
  write_file(fx / "f", longer);  // a copy-up: the same number in top
  const ino_t ino = lstat_of(fx / "f").st_ino;
  auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "branch");
    plyctl(fx, std::move(args));
  };
  int fd = ::open((fx / "f").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  ctl({"remove", fx.root(), "top"});  // main's instance: 5 bytes
  CHECK(lstat_of(fx / "f").st_ino == ino);
  CHECK(lstat_of(fx / "f").st_size == 5);
  CHECK(read_file(fx / "f") == "short");
  ::close(fd);
  fd = ::open((fx / "f").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  ctl({"add", fx.root(), "top", "--at", "0"});  // top's again: 21 bytes
  CHECK(lstat_of(fx / "f").st_ino == ino);
  CHECK(lstat_of(fx / "f").st_size == off_t(longer.size()));
  CHECK(read_file(fx / "f") == longer);
  ::close(fd);
  // Changes that keep the instance keep the kernel's inode, looked up again
  // or not: a file open for writing writes on (into w, a copy-up).
  fd = ::open((fx / "f").c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  ctl({"set", fx.root(), "top", "--ro"});
  ctl({"add", fx.root(), "w", "--at", "0"});
  CHECK(lstat_of(fx / "f").st_size == off_t(longer.size()));
  REQUIRE(::pwrite(fd, "A", 1, 0) == 1);
  REQUIRE(::fsync(fd) == 0);
  REQUIRE(::close(fd) == 0);
  CHECK(read_file(fx / "f") == "A" + longer.substr(1));
  CHECK(lstat_of(fx / "f").st_ino == ino);
  fx.unmount();
}

TEST_CASE("union mount: layer trees (plyctl layer, -o layer=)", "[union-fuse]") {
  Fixture fx;
  write_file(fx / "m", "main");
  fx.unmount();
  plyctl(fx, {"layer", "create", fx.img, "a", "--on", "main"});
  plyctl(fx, {"layer", "create", fx.img, "b", "--on", "a"});
  plyctl(fx, {"layer", "create", fx.img, "c", "--on", "main"});
  plyctl(fx, {"branch", "create", fx.img, "copy", "--clone", "main"});
  const std::string log = fx.tmp / "layer.log";
  ::unlink(log.c_str());
  REQUIRE(run({plyctl_bin(), "layer", "list", fx.img}, log) == 0);
  // Layers hang under their parents; a clone is a tree of its own.
  CHECK(slurp(log) ==
        "NAME   ID KIND          MODE\n"
        "main  256 base          rw\n"
        "\u251c\u2500a   257 layer         rw\n"
        "\u2502 \u2514\u2500b 258 layer         rw\n"
        "\u2514\u2500c   259 layer         rw\n"
        "copy  260 clone of main rw\n");
  ::unlink(log.c_str());
  REQUIRE(run({plyctl_bin(), "layer", "list", fx.img, "--json"}, log) == 0);
  CHECK(slurp(log).find(R"({"name":"b","id":258,"parent":{"branch":"a","id":257},"layer":true,"writable":true,)")
        != std::string::npos);
  CHECK(slurp(log).find(R"({"name":"copy","id":260,"parent":{"branch":"main","id":256},"layer":false,)")
        != std::string::npos);
  // Mounting layer b shows b over a over main; changes land in b.
  fx.opts = {"layer=a"};
  fx.mount();
  write_file(fx / "in-a", "a");
  fx.unmount();
  fx.opts = {"layer=b"};
  fx.mount();
  CHECK(read_file(fx / "m") == "main");
  CHECK(read_file(fx / "in-a") == "a");
  write_file(fx / "m", "changed in b");
  REQUIRE(::unlink((fx / "in-a").c_str()) == 0);
  fx.unmount();
  fx.opts = {"layer=a"};
  fx.mount();
  CHECK(read_file(fx / "m") == "main");  // a and main unchanged
  CHECK(read_file(fx / "in-a") == "a");
  fx.unmount();
  fx.opts = {"layer=c"};  // a sibling: main's files, none of a's
  fx.mount();
  CHECK(list_dir(fx.root()) == std::vector<std::string>{"m"});
  fx.unmount();
  // A layer with children cannot go; usage errors are errors.
  CHECK(run({plyctl_bin(), "layer", "delete", fx.img, "a"}, log) == 1);
  CHECK(run({plyctl_bin(), "layer", "create", fx.img, "d"}, log) == 2);
  plyctl(fx, {"layer", "delete", fx.img, "b"});
  plyctl(fx, {"layer", "delete", fx.img, "a"});
  CHECK(run({plyfs_bin(), fx.img, fx.tmp / "mnt", "-f", "-o", "layer=b"}, log) == 32);
}

namespace {

// What a mount shows: every path with its type, content (a symlink's
// target) and st_ino, read through the mount point.
std::map<std::string, std::string> view_of(const std::string& root) {
  std::map<std::string, std::string> out;
  std::vector<std::string> todo{""};
  while (!todo.empty()) {
    const std::string rel = todo.back();
    todo.pop_back();
    for (const auto& n : list_dir(root + rel)) {
      const std::string p = rel + "/" + n;
      const struct stat st = lstat_of(root + p);
      std::string v = std::to_string(st.st_ino) + " ";
      if (S_ISDIR(st.st_mode)) {
        v += "dir";
        todo.push_back(p);
      } else if (S_ISLNK(st.st_mode)) {
        char buf[256];
        const ssize_t k = ::readlink((root + p).c_str(), buf, sizeof buf);
        v += "link " + std::string(buf, size_t(std::max<ssize_t>(k, 0)));
      } else {
        v += "file " + read_file(root + p);
      }
      out[p] = v;
    }
  }
  return out;
}

}  // namespace

// Live changes that change the view (branches with content added anywhere,
// removed, moved, switched ro/rw) must show exactly what a fresh mount of the
// new stack shows: the daemon finds every known object again and the
// kernel's caches (entries, attributes, negative entries, pages) are dropped.
TEST_CASE("union mount: any live stack change shows what a fresh mount of the new stack shows",
          "[union-fuse]") {
  const uint64_t seed = plyfs::test::seed("union-restack");
  std::mt19937_64 rng(seed);
  Fixture fx;
  fx.unmount();
  const std::vector<std::string> names{"a", "b", "c"};
  const int nb = 5;
  for (int i = 0; i < nb; i++) plyctl(fx, {"branch", "create", fx.img, "b" + std::to_string(i)});
  // Each branch: overlapping names, a file in one where another has a
  // directory, and (through a union over the previous branch) whiteouts and
  // opaque directories.
  for (int i = 0; i < nb; i++) {
    const std::string bi = "b" + std::to_string(i);
    fx.opts = {i ? "branches=" + bi + "=rw:b" + std::to_string(i - 1) + "=ro" : "branches=" + bi + "=rw"};
    fx.mount();
    for (int k = 0; k < 6; k++) {
      const std::string d = names[rng() % names.size()], f = names[rng() % names.size()];
      struct stat st;
      if (::lstat((fx / d).c_str(), &st) != 0) ::mkdir((fx / d).c_str(), 0755);
      if (::lstat((fx / d).c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        write_file(fx / (d + "/" + f), bi + ":" + d + "/" + f);
    }
    if (i && rng() % 2) {
      const auto top = list_dir(fx.root());
      if (!top.empty()) {
        const std::string victim = fx / top[rng() % top.size()];
        if (std::filesystem::is_directory(victim)) {
          std::filesystem::remove_all(victim);
          if (rng() % 2) ::mkdir(victim.c_str(), 0755);  // opaque
        } else {
          ::unlink(victim.c_str());
        }
      }
    }
    if (rng() % 2) REQUIRE(::symlink(("to-" + bi).c_str(), (fx / ("l" + bi)).c_str()) == 0);
    fx.unmount();
  }

  // The stack: (branch, writable), leftmost first; at least one branch.
  std::vector<std::pair<int, bool>> stack{{0, true}, {1, false}};
  auto spec = [&] {
    std::string s = "branches=";
    for (size_t i = 0; i < stack.size(); i++)
      s += (i ? ":b" : "b") + std::to_string(stack[i].first) + (stack[i].second ? "=rw" : "=ro");
    return s;
  };
  auto ctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "branch");
    plyctl(fx, std::move(args));
  };
  fx.opts = {spec()};
  fx.mount();
  const int steps = int(20 * plyfs::test::scale());
  for (int step = 0; step < steps; step++) {
    (void)view_of(fx.root());  // the kernel caches what it saw
    std::vector<int> out;
    for (int i = 0; i < nb; i++)
      if (std::none_of(stack.begin(), stack.end(), [&](auto& l) { return l.first == i; })) out.push_back(i);
    const std::string mnt = fx.root();
    std::string what;
    switch (rng() % 4) {
      case 0:
        if (!out.empty()) {  // add a branch with content anywhere
          const int b = out[rng() % out.size()];
          const size_t at = rng() % (stack.size() + 1);
          const bool rw = rng() % 3 == 0;
          std::vector<std::string> args{"add", mnt, "b" + std::to_string(b), "--at", std::to_string(at)};
          if (!rw) args.push_back("--ro");
          ctl(args);
          stack.insert(stack.begin() + long(at), {b, rw});
          what = "add b" + std::to_string(b);
          break;
        }
        [[fallthrough]];
      case 1:
        if (stack.size() > 1) {  // remove one
          const size_t at = rng() % stack.size();
          ctl({"remove", mnt, "b" + std::to_string(stack[at].first)});
          what = "remove b" + std::to_string(stack[at].first);
          stack.erase(stack.begin() + long(at));
          break;
        }
        [[fallthrough]];
      case 2: {  // move one
        const size_t from = rng() % stack.size(), to = rng() % stack.size();
        ctl({"move", mnt, "b" + std::to_string(stack[from].first), std::to_string(to)});
        what = "move b" + std::to_string(stack[from].first) + " to " + std::to_string(to);
        auto l = stack[from];
        stack.erase(stack.begin() + long(from));
        stack.insert(stack.begin() + long(to), l);
        break;
      }
      default: {  // switch one between ro and rw
        const size_t at = rng() % stack.size();
        stack[at].second = !stack[at].second;
        ctl({"set", mnt, "b" + std::to_string(stack[at].first), stack[at].second ? "--rw" : "--ro"});
        what = "set b" + std::to_string(stack[at].first);
      }
    }
    INFO("step " << step << ": " << what << ", stack " << spec() << "; seed " << seed);
    // Sometimes a change through the new stack (a copy-up or a new file).
    // Only with a writable leftmost branch: a file of a read-only branch
    // with no writable one to its left cannot change (EROFS).
    if (stack[0].second && rng() % 2) {
      const auto top = list_dir(mnt);
      for (const auto& n : top)
        if (std::filesystem::is_regular_file(mnt + "/" + n)) {
          write_file(mnt + "/" + n, "changed at step " + std::to_string(step));
          break;
        }
      write_file(mnt + "/new" + std::to_string(step), "new");
    }
    const auto live = view_of(mnt);
    fx.unmount();  // fsck clean too
    fx.opts = {spec()};
    fx.mount();
    const auto fresh = view_of(fx.root());
    CHECK(live == fresh);
    if (live != fresh)
      for (const auto& [p, v] : fresh)
        if (!live.count(p) || live.at(p) != v)
          FAIL_CHECK(p << ": live " << (live.count(p) ? live.at(p) : "(none)") << ", fresh " << v);
  }
  fx.unmount();
}
