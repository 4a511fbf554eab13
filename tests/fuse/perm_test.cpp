// Permissions when other users reach the mount (-o allow_other): the
// daemon checks none itself, so it turns default_permissions on and the
// kernel checks them (plyfs.8, "Permissions"). An unprivileged user
// (nobody, 65534, no supplementary groups) runs one sequence of operations
// on a plyfs mount and on a tmpfs holding the same tree; every result
// (success, the errno, the mode a change left) must be the same. Without
// default_permissions the opens, renames and unlinks that tmpfs refuses
// succeed on plyfs.
#include <sys/mount.h>
#include <sys/time.h>
#include <sys/xattr.h>
#include <grp.h>

#include <map>

#include "fuse_util.h"

using namespace plyfs::fusetest;

namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kNogroup = 65534;

// A tmpfs mounted for one test, unmounted at the end of the scope.
struct Tmpfs {
  std::string path;
  explicit Tmpfs(std::string p) : path(std::move(p)) {
    REQUIRE(::mkdir(path.c_str(), 0755) == 0);
    INFO("mount tmpfs on " << path << ": " << std::strerror(errno));
    REQUIRE(::mount("tmpfs", path.c_str(), "tmpfs", 0, "mode=0755,size=16m") == 0);
  }
  ~Tmpfs() { umount2(path.c_str(), MNT_DETACH); }
};

// The tree both filesystems start from: directories and files of several
// owners and modes, a sticky and a setgid directory.
void build_tree(const std::string& root) {
  REQUIRE(::chmod(root.c_str(), 0755) == 0);
  auto dir = [&](const std::string& p, mode_t mode, uid_t uid = 0, gid_t gid = 0) {
    INFO("mkdir " << p);
    const std::string at = root + "/" + p;
    REQUIRE_OK(::mkdir(at.c_str(), 0700));
    REQUIRE_OK(::chown(at.c_str(), uid, gid));
    REQUIRE_OK(::chmod(at.c_str(), mode));
  };
  auto file = [&](const std::string& p, mode_t mode, uid_t uid = 0, gid_t gid = 0) {
    const std::string at = root + "/" + p;
    write_file(at, "content of " + p, O_TRUNC, 0600);
    REQUIRE_OK(::chown(at.c_str(), uid, gid));
    REQUIRE_OK(::chmod(at.c_str(), mode));
  };
  dir("d755", 0755);
  file("d755/f644", 0644);
  file("d755/f600", 0600);
  file("d755/f666", 0666);
  file("d755/f444", 0444);
  file("d755/suid", 04755);
  dir("d755/sub", 0755);
  dir("d777", 0777);
  file("d777/r644", 0644);
  file("d777/n644", 0644, kNobody, kNogroup);
  dir("sticky", 01777);
  file("sticky/r666", 0666);
  file("sticky/n644", 0644, kNobody, kNogroup);
  dir("dn", 0755, kNobody, kNogroup);
  file("dn/own600", 0600, kNobody, kNogroup);
  file("dn/r644", 0644);
  dir("d700", 0700);
  file("d700/x", 0644);
  dir("sgid", 02777, 0, 0);
}

// One operation of the sequence: its paths relative to the root.
struct Op {
  enum Kind { Open, Creat, Mkdir, Rmdir, Unlink, Rename, Chmod, Chown, Truncate, Setxattr, Utimes,
              UtimesNow, Link, Symlink, Opendir, Stat, Mode, Write } kind;
  std::string a;
  std::string b = "";
  long x = 0, y = 0;  // flags, mode, uid/gid, size
};

const std::vector<Op>& sequence() {
  static const std::vector<Op> ops = {
      {Op::Open, "d755/f644", "", O_RDONLY},
      {Op::Open, "d755/f644", "", O_WRONLY},
      {Op::Open, "d755/f644", "", O_RDWR},
      {Op::Open, "d755/f644", "", O_RDONLY | O_TRUNC},
      {Op::Open, "d755/f600", "", O_RDONLY},
      {Op::Open, "d755/f666", "", O_RDWR},
      {Op::Write, "d755/f666", "", O_WRONLY | O_APPEND},
      {Op::Open, "d755/f444", "", O_WRONLY},
      {Op::Write, "d755/suid", ""},
      {Op::Creat, "d755/new", "", 0644},
      {Op::Mkdir, "d755/newdir", "", 0755},
      {Op::Unlink, "d755/f644"},
      {Op::Rename, "d755/f644", "d755/g"},
      {Op::Rename, "d755/f666", "d777/moved"},
      {Op::Rmdir, "d755/sub"},
      {Op::Chmod, "d755/f644", "", 0666},
      {Op::Chown, "d755/f666", "", kNobody, kNogroup},
      {Op::Truncate, "d755/f644", "", 0},
      {Op::Truncate, "d755/f666", "", 3},
      {Op::Setxattr, "d755/f644", "user.k"},
      {Op::Setxattr, "d755/f666", "user.k"},
      {Op::Setxattr, "d755/f666", "trusted.k"},
      {Op::Utimes, "d755/f644"},
      {Op::UtimesNow, "d755/f644"},
      {Op::UtimesNow, "d755/f666"},
      {Op::Utimes, "d755/f666"},
      {Op::Link, "d755/f644", "d777/hl"},
      {Op::Link, "d755/f666", "d777/hl2"},
      {Op::Creat, "d777/mine", "", 0666},
      {Op::Mode, "d777/mine"},
      {Op::Rename, "d777/r644", "d777/r644b"},
      {Op::Unlink, "d777/n644"},
      {Op::Symlink, "d777/link", "f"},
      {Op::Symlink, "d755/link", "f"},
      {Op::Unlink, "sticky/r666"},
      {Op::Rename, "sticky/r666", "sticky/mine"},
      {Op::Open, "sticky/r666", "", O_WRONLY},
      {Op::Unlink, "sticky/n644"},
      {Op::Chmod, "dn/own600", "", 0640},
      {Op::Mode, "dn/own600"},
      {Op::Chown, "dn/own600", "", 0, 0},
      {Op::Chown, "dn/own600", "", kNobody, 0},
      {Op::Chown, "dn/own600", "", kNobody, kNogroup},
      {Op::Chmod, "dn/own600", "", 02640},
      {Op::Mode, "dn/own600"},
      {Op::Setxattr, "dn/own600", "user.k"},
      {Op::Truncate, "dn/own600", "", 1},
      {Op::Utimes, "dn/own600"},
      {Op::Open, "dn/r644", "", O_WRONLY},
      {Op::Rename, "dn/r644", "dn/r644b"},
      {Op::Unlink, "dn/r644b"},
      {Op::Mkdir, "dn/sub", "", 0777},
      {Op::Mode, "dn/sub"},
      {Op::Rmdir, "dn/sub"},
      {Op::Rename, "dn/own600", "d777/own600"},
      {Op::Open, "d700/x", "", O_RDONLY},
      {Op::Stat, "d700/x"},
      {Op::Opendir, "d700"},
      {Op::Unlink, "d700/x"},
      {Op::Creat, "sgid/f", "", 0666},
      {Op::Mode, "sgid/f"},
      {Op::Mkdir, "sgid/d", "", 0777},
      {Op::Mode, "sgid/d"},
      {Op::Chmod, "d777/mine", "", 02755},
      {Op::Mode, "d777/mine"},
  };
  return ops;
}

// Runs the sequence as nobody under `root`: each result is 0 (done), the
// errno, or for Mode the permission bits it found (plus 1 << 20).
std::vector<int> run_as_nobody(const std::string& root) {
  const auto& ops = sequence();
  // Everything the child needs is made before the fork: it makes system
  // calls only (fuse_util.h, spawn).
  std::vector<std::string> a, b;
  for (const auto& op : ops) {
    a.push_back(root + "/" + op.a);
    b.push_back(op.kind == Op::Symlink ? op.a : root + "/" + op.b);
  }
  std::vector<int> out(ops.size(), -1);
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(p[0]);
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kNogroup, kNogroup, kNogroup) != 0 ||
        ::setresuid(kNobody, kNobody, kNobody) != 0)
      _exit(2);
    ::umask(022);
    for (size_t i = 0; i < ops.size(); i++) {
      const Op& op = ops[i];
      const char* pa = a[i].c_str();
      const char* pb = b[i].c_str();
      int r = 0;
      struct stat st;
      const timeval tv[2] = {{1000, 0}, {2000, 0}};
      switch (op.kind) {
        case Op::Open: r = ::open(pa, int(op.x)); if (r >= 0) r = ::close(r); break;
        case Op::Write:
          r = ::open(pa, op.x ? int(op.x) : O_WRONLY);
          if (r >= 0) {
            const int fd = r;
            r = ::write(fd, "w", 1) == 1 ? 0 : -1;
            ::close(fd);
          }
          break;
        case Op::Creat: r = ::open(pa, O_WRONLY | O_CREAT | O_EXCL, mode_t(op.x)); if (r >= 0) r = ::close(r); break;
        case Op::Mkdir: r = ::mkdir(pa, mode_t(op.x)); break;
        case Op::Rmdir: r = ::rmdir(pa); break;
        case Op::Unlink: r = ::unlink(pa); break;
        case Op::Rename: r = ::rename(pa, pb); break;
        case Op::Chmod: r = ::chmod(pa, mode_t(op.x)); break;
        case Op::Chown: r = ::chown(pa, uid_t(op.x), gid_t(op.y)); break;
        case Op::Truncate: r = ::truncate(pa, off_t(op.x)); break;
        case Op::Setxattr: r = ::setxattr(pa, op.b.c_str(), "v", 1, 0); break;
        case Op::Utimes: r = ::utimes(pa, tv); break;
        case Op::UtimesNow: r = ::utimes(pa, nullptr); break;
        case Op::Link: r = ::link(pa, pb); break;
        case Op::Symlink: r = ::symlink(pb, pa); break;
        case Op::Opendir: {
          DIR* d = ::opendir(pa);
          r = d ? ::closedir(d) : -1;
          break;
        }
        case Op::Stat: r = ::stat(pa, &st); break;
        case Op::Mode: r = ::stat(pa, &st); break;
      }
      int res = r < 0 ? errno : 0;
      if (op.kind == Op::Mode && r == 0) res = int(st.st_mode & 07777) | (1 << 20);
      if (::write(p[1], &res, sizeof res) != sizeof res) _exit(3);
    }
    _exit(0);
  }
  ::close(p[1]);
  size_t got = 0;
  for (; got < out.size(); got++) {
    int v;
    if (::read(p[0], &v, sizeof v) != sizeof v) break;
    out[got] = v;
  }
  ::close(p[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  INFO("the child running as nobody: status " << st << ", " << got << " results");
  REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  return out;
}

std::string describe(const Op& op) {
  static const char* const kNames[] = {"open", "creat", "mkdir", "rmdir", "unlink", "rename",
                                       "chmod", "chown", "truncate", "setxattr", "utimes",
                                       "utimes(now)", "link", "symlink", "opendir", "stat", "mode",
                                       "write"};
  std::string s = kNames[op.kind];
  s += " " + op.a;
  if (!op.b.empty()) s += " " + op.b;
  if (op.x || op.y) s += " " + std::to_string(op.x) + " " + std::to_string(op.y);
  return s;
}

std::string result(int r) {
  if (r == 0) return "ok";
  if (r & (1 << 20)) {
    char b[16];
    std::snprintf(b, sizeof b, "mode %04o", r & 07777);
    return b;
  }
  return errstr(r);
}

// The sequence's results on plyfs and on tmpfs: the lines that differ.
std::vector<std::string> differences(const std::vector<int>& ply, const std::vector<int>& tmp) {
  std::vector<std::string> out;
  for (size_t i = 0; i < sequence().size(); i++)
    if (ply[i] != tmp[i])
      out.push_back(describe(sequence()[i]) + ": plyfs " + result(ply[i]) + ", tmpfs " + result(tmp[i]));
  return out;
}

}  // namespace

TEST_CASE("permissions: with allow_other an unprivileged user gets what tmpfs gives it", "[perm]") {
  TempDir tmp;
  REQUIRE(::chmod(tmp.path().c_str(), 0755) == 0);  // nobody must reach both roots
  const std::string img = tmp / "image";
  mkfs(img, "64M", tmp / "mkfs.log");
  Mount m(img, tmp / "mnt", {"allow_other"});
  m.start();
  CHECK(m.log().find("allow_other: other users reach the mount: default_permissions is on") !=
        std::string::npos);
  Tmpfs t(tmp / "tmpfs");
  build_tree(m.path());
  build_tree(t.path);
  const auto ply = run_as_nobody(m.path());
  const auto ref = run_as_nobody(t.path);
  const auto diff = differences(ply, ref);
  for (const auto& d : diff) UNSCOPED_INFO(d);
  CHECK(diff.empty());
  // The sequence is worth something: tmpfs refused many of its steps.
  size_t refused = 0;
  for (int r : ref) refused += r == EACCES || r == EPERM;
  CHECK(refused >= 25);
  REQUIRE(m.unmount() == 0);
  require_fsck_clean(img, tmp / "fsck.log");
}

TEST_CASE("permissions: default_permissions given with allow_other is not added twice", "[perm]") {
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "64M", tmp / "mkfs.log");
  Mount m(img, tmp / "mnt", {"allow_other,default_permissions"});
  m.start();
  CHECK(m.log().find("default_permissions is on") == std::string::npos);
  REQUIRE(m.unmount() == 0);
}

// The control folder's nodes (.plyfs) are the mount owner's (root here),
// directories 0755: anyone may list them and read info.json; only the
// owner changes the layers (mkdir, rmdir, rename); a view's data/ shows the
// branch's own owners and modes, which the kernel checks like the mount's.
TEST_CASE("permissions: the control folder under allow_other", "[perm]") {
  TempDir tmp;
  REQUIRE(::chmod(tmp.path().c_str(), 0755) == 0);
  const std::string img = tmp / "image";
  mkfs(img, "64M", tmp / "mkfs.log");
  Mount m(img, tmp / "mnt", {"allow_other"});
  m.start();
  build_tree(m.path());
  const std::string data = m / ".plyfs/layers/main/data";
  REQUIRE(::mkdir((m / ".plyfs/layers/spare").c_str(), 0755) == 0);  // the owner may
  const std::vector<std::pair<std::string, int>> expect = {
      {"list layers", 0},
      {"read info.json", 0},
      {"mkdir layers/x", EACCES},
      {"rmdir layers/spare", EACCES},
      {"rename layers/spare", EACCES},
      {"write data/d755/f644", EACCES},
      {"write data/d755/f666", 0},
      {"creat data/new", EACCES},
      {"creat data/d777/new", 0},
      {"unlink data/d755/f600", EACCES},
      {"read data/d755/f600", EACCES},
  };
  const std::string layers = m / ".plyfs/layers";
  const std::vector<std::string> paths = {layers,
                                          layers + "/main/info.json",
                                          layers + "/x",
                                          layers + "/spare",
                                          layers + "/renamed",
                                          data + "/d755/f644",
                                          data + "/d755/f666",
                                          data + "/new",
                                          data + "/d777/new",
                                          data + "/d755/f600"};
  std::vector<int> got(expect.size(), -1);
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(p[0]);
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kNogroup, kNogroup, kNogroup) != 0 ||
        ::setresuid(kNobody, kNobody, kNobody) != 0)
      _exit(2);
    auto res = [](int r) { return r < 0 ? errno : 0; };
    auto open_close = [&](const std::string& s, int flags) {
      const int fd = ::open(s.c_str(), flags, 0644);
      if (fd < 0) return errno;
      ::close(fd);
      return 0;
    };
    int r[11];
    DIR* d = ::opendir(paths[0].c_str());
    r[0] = d ? 0 : errno;
    if (d) ::closedir(d);
    r[1] = open_close(paths[1], O_RDONLY);
    r[2] = res(::mkdir(paths[2].c_str(), 0755));
    r[3] = res(::rmdir(paths[3].c_str()));
    r[4] = res(::rename(paths[3].c_str(), paths[4].c_str()));
    r[5] = open_close(paths[5], O_WRONLY);
    r[6] = open_close(paths[6], O_WRONLY);
    r[7] = open_close(paths[7], O_WRONLY | O_CREAT | O_EXCL);
    r[8] = open_close(paths[8], O_WRONLY | O_CREAT | O_EXCL);
    r[9] = res(::unlink(paths[9].c_str()));
    r[10] = open_close(paths[9], O_RDONLY);
    if (::write(p[1], r, sizeof r) != sizeof r) _exit(3);
    _exit(0);
  }
  ::close(p[1]);
  REQUIRE(::read(p[0], got.data(), sizeof(int) * got.size()) == ssize_t(sizeof(int) * got.size()));
  ::close(p[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  for (size_t i = 0; i < expect.size(); i++) {
    INFO(expect[i].first << ": " << (got[i] ? errstr(got[i]) : "ok"));
    CHECK(got[i] == expect[i].second);
  }
  // Nothing changed in the folder: spare is still there, x was not made.
  CHECK(::access((m / ".plyfs/layers/spare").c_str(), F_OK) == 0);
  CHECK(::access((m / ".plyfs/layers/x").c_str(), F_OK) != 0);
  REQUIRE(::rmdir((m / ".plyfs/layers/spare").c_str()) == 0);
  REQUIRE(m.unmount() == 0);
  require_fsck_clean(img, tmp / "fsck.log");
}
