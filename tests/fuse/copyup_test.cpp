// Copy-up modes through a mount (plyfs.8, copyup=): the owner and mode a
// copy-up gives a file show in stat at once, though the request that
// copied it (an open for writing, an xattr change) replies with no
// attributes and the kernel caches them for 60 s; copyup=current applies
// the caller's umask, which FUSE sends only with creations.
#include <sys/xattr.h>
#include <grp.h>

#include "fuse_util.h"

using namespace plyfs::fusetest;

namespace {

// main holds the files (root's, with the given modes); a layer top over it
// is mounted with `opts` (branches=top=rw:main=ro added).
void layered(Fixture& fx, const std::vector<std::pair<std::string, mode_t>>& files,
             std::vector<std::string> opts) {
  for (const auto& [name, mode] : files) {
    write_file(fx / name, "lower " + name, O_TRUNC, mode);
    REQUIRE(::chmod((fx / name).c_str(), mode) == 0);
  }
  fx.unmount();
  plyctl(fx, {"branch", "create", fx.img, "top", "--parent", "main"});
  opts.insert(opts.begin(), "branches=top=rw:main=ro");
  fx.opts = opts;
  fx.mount();
}

struct Owner {
  uid_t uid;
  gid_t gid;
  mode_t mode;
};
Owner owner(const struct stat& st) { return {st.st_uid, st.st_gid, st.st_mode & 07777}; }
#define CHECK_OWNER(st, u, g, m)                                                          \
  do {                                                                                    \
    const Owner _o = owner(st);                                                           \
    INFO("uid " << _o.uid << " gid " << _o.gid << " mode 0" << std::oct << _o.mode);     \
    CHECK((_o.uid == (u) && _o.gid == (g) && _o.mode == (m)));                            \
  } while (0)

// In a child: optionally becomes uid:gid, sets the umask, opens `path` for
// appending, writes a byte and closes it. Its exit status: 0, or the errno.
int append_as(const std::string& path, mode_t mask, uid_t uid = 0, gid_t gid = 0) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (uid && (::setgroups(0, nullptr) != 0 || ::setresgid(gid, gid, gid) != 0 ||
                ::setresuid(uid, uid, uid) != 0))
      _exit(100);
    ::umask(mask);
    const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
    if (fd < 0) _exit(errno);
    if (::write(fd, "+", 1) != 1) _exit(errno);
    _exit(::close(fd) == 0 ? 0 : errno);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace

TEST_CASE("copyup=const: stat shows the copy's owner and mode at once", "[copyup]") {
  Fixture fx;
  layered(fx, {{"opened", 0644}, {"xattr", 0644}, {"untouched", 0644}}, {"copyup=const:1234:5678:0600"});
  // The kernel caches each file's attributes (60 s) before the copy-up.
  for (const char* f : {"opened", "xattr", "untouched"}) CHECK_OWNER(lstat_of(fx / f), 0u, 0u, 0644u);

  // An open for writing copies the file up; its reply carries no attributes.
  const int fd = ::open((fx / "opened").c_str(), O_WRONLY | O_APPEND);
  REQUIRE(fd >= 0);
  struct stat st;
  REQUIRE(::fstat(fd, &st) == 0);
  CHECK_OWNER(st, 1234u, 5678u, 0600u);
  CHECK_OWNER(lstat_of(fx / "opened"), 1234u, 5678u, 0600u);
  REQUIRE(::write(fd, "+", 1) == 1);
  REQUIRE(::close(fd) == 0);
  CHECK_OWNER(lstat_of(fx / "opened"), 1234u, 5678u, 0600u);
  CHECK(read_file(fx / "opened") == "lower opened+");

  // An xattr change copies it up too; with the writeback cache the kernel
  // keeps a regular file's ctime itself, so the ctime it drops after a
  // setxattr does not make it ask again.
  REQUIRE(::setxattr((fx / "xattr").c_str(), "user.k", "v", 1, 0) == 0);
  CHECK_OWNER(lstat_of(fx / "xattr"), 1234u, 5678u, 0600u);
  CHECK_OWNER(lstat_of(fx / "untouched"), 0u, 0u, 0644u);

  // The same after a remount (what the image holds).
  fx.remount();
  CHECK_OWNER(lstat_of(fx / "opened"), 1234u, 5678u, 0600u);
  CHECK_OWNER(lstat_of(fx / "xattr"), 1234u, 5678u, 0600u);
  CHECK_OWNER(lstat_of(fx / "untouched"), 0u, 0u, 0644u);
  fx.unmount();
}

TEST_CASE("copyup=current: the caller's umask applies to the copy's mode", "[copyup]") {
  Fixture fx;
  REQUIRE(::chmod(fx.tmp.path().c_str(), 0755) == 0);  // uid 1000 reaches the mount
  // allow_other: a user besides root copies a file up too.
  layered(fx, {{"m077", 0666}, {"m022", 0666}, {"m000", 0666}, {"user", 0666}},
          {"copyup=current", "allow_other"});
  for (const char* f : {"m077", "m022", "m000", "user"}) CHECK_OWNER(lstat_of(fx / f), 0u, 0u, 0666u);
  CHECK(append_as(fx / "m077", 077) == 0);
  CHECK(append_as(fx / "m022", 022) == 0);
  CHECK(append_as(fx / "m000", 0) == 0);
  // The copy is the caller's: owner and umask.
  CHECK(append_as(fx / "user", 027, 1000, 1000) == 0);
  CHECK_OWNER(lstat_of(fx / "m077"), 0u, 0u, 0600u);
  CHECK_OWNER(lstat_of(fx / "m022"), 0u, 0u, 0644u);
  CHECK_OWNER(lstat_of(fx / "m000"), 0u, 0u, 0666u);
  CHECK_OWNER(lstat_of(fx / "user"), 1000u, 1000u, 0640u);
  fx.remount();
  CHECK_OWNER(lstat_of(fx / "m077"), 0u, 0u, 0600u);
  CHECK_OWNER(lstat_of(fx / "user"), 1000u, 1000u, 0640u);
  fx.unmount();
}
