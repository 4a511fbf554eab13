// The daemon's command line (plyfs.8): every bad value is refused with one
// line "plyfs: bad ...", exit status 1 and nothing mounted; sizes take
// mkfs.plyfs's units; a mount point that is not a directory is refused as
// mount(8) refuses it (exit 32); a damaged image says to run fsck.plyfs.
#include <sys/mount.h>
#include <sys/sysmacros.h>

#include <cstdlib>

#include "fuse_util.h"
#include "util/mountinfo.h"

using namespace plyfs::fusetest;

namespace {

struct Outcome {
  int rc;
  std::string out;
};

// Runs plyfs IMAGE MNT with `args` (in the foreground unless `daemon`);
// the mount point must not change.
Outcome plyfs_run(const TempDir& tmp, const std::string& img, const std::string& mnt,
                  std::vector<std::string> args, bool daemon = false) {
  const std::string log = tmp / "plyfs.log";
  ::unlink(log.c_str());
  std::vector<std::string> argv{plyfs_bin(), img, mnt};
  if (!daemon) argv.push_back("-f");
  argv.insert(argv.end(), args.begin(), args.end());
  const int rc = run(argv, log, 60);
  return {rc, slurp(log)};
}

size_t lines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

// One line, "plyfs: ...", no strerror text after plyfs's own reason.
void check_one_line(const Outcome& o, const std::string& begins) {
  INFO("output: " << o.out);
  CHECK(lines(o.out) == 1);
  CHECK(o.out.rfind(begins, 0) == 0);
  CHECK(o.out.find(": Invalid argument") == std::string::npos);
  CHECK(o.out.find(": Structure needs cleaning") == std::string::npos);
}

}  // namespace

TEST_CASE("options: bad values give one line, exit 1, and mount nothing", "[options]") {
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "64M", tmp / "mkfs.log");
  const std::string mnt = tmp / "mnt";
  ::mkdir(mnt.c_str(), 0755);
  const dev_t before = dev_of(mnt);
  std::vector<std::string> bad = {
      "commit=-1", "commit=5s", "commit=", "commit=86401", "commit=0x10", "commit=+5",
      "cache=1x", "cache=-1M", "cache=512K", "cache=17T", "cache=", "cache=1.5.5G",
      "spin=-1", "spin=100001", "max_threads=0", "max_threads=-1", "max_threads=1025",
      "max_idle_threads=-2", "max_idle_threads=1e3", "snapshot_interval=-5",
      "snapshot_interval=31536001", "snapshot_keep=abc", "snapshot_keep=-1",
      "copyup=const:-1:0:644", "copyup=const:0:0:999", "copyup=const:0:0", "copyup=const:0:0:",
      "copyup=const:x:0:644", "copyup=const:4294967295:0:644", "copyup=const:0:0:17777",
      "copyup=bogus", "delete=some", "view=a,branches=b", "timeout=-1", "timeout=86401",
      "timeout=1.5", "timeout=", "compress=lz4", "compress=zstd:0", "compress=zstd:20", "compress=zstd:x",
      "compress-force=none", "compress-force=zlib",
      "nbd_cache=1x", "nbd_cache=17T", "nbd_cache=", "nbd_cache=-1",
      "stage_delay=-1", "stage_delay=86401", "stage_delay=1.5", "stage_delay="};
  if (std::string(std::getenv("PLYFS_HAVE_URING") ? std::getenv("PLYFS_HAVE_URING") : "1") == "0")
    bad.push_back("uring");
  for (const auto& b : bad) {
    for (bool daemon : {false, true}) {
      INFO("-o " << b << (daemon ? " (daemonizing)" : ""));
      const Outcome o = plyfs_run(tmp, img, mnt, {"-o", b}, daemon);
      CHECK(o.rc == 1);
      check_one_line(o, "plyfs: bad ");
      CHECK(dev_of(mnt) == before);
      if (!daemon && b.rfind("commit=", 0) == 0) CHECK(o.out.find("'" + b.substr(7) + "'") != std::string::npos);
    }
  }
  // libfuse's refusals read the same way.
  const Outcome u = plyfs_run(tmp, img, mnt, {"-o", "nosuchoption"});
  CHECK(u.rc == 1);
  check_one_line(u, "plyfs: unknown option");
  CHECK(dev_of(mnt) == before);
}

TEST_CASE("options: without io_uring support -o uring is refused, saying so", "[options]") {
  if (std::string(std::getenv("PLYFS_HAVE_URING") ? std::getenv("PLYFS_HAVE_URING") : "1") != "0") {
    std::printf("[options] this build has io_uring support: fuse-uring tests -o uring\n");
    return;
  }
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "64M", tmp / "mkfs.log");
  ::mkdir((tmp / "mnt").c_str(), 0755);
  const Outcome o = plyfs_run(tmp, img, tmp / "mnt", {"-o", "uring"});
  CHECK(o.rc == 1);
  check_one_line(o, "plyfs: bad option uring: this build of plyfs has no io_uring support");
}

TEST_CASE("options: sizes as mkfs.plyfs takes them, and the ends of every range", "[options]") {
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "64M", tmp / "mkfs.log");
  int n = 0;
  for (const char* o : {"cache=1g", "cache=1GiB", "cache=512M", "cache=1.5G", "cache=1M", "cache=16T",
                        "cache=4000000KB", "commit=0", "commit=86400,snapshot_interval=31536000",
                        "max_threads=1024,max_idle_threads=0,spin=0", "max_threads=1,spin=100000",
                        "copyup=const:4294967294:0:7777", "copyup=const:1:2:0", "snapshot_keep=1000000",
                        "timeout=0", "timeout=86400", "nbd_cache=0", "nbd_cache=16T", "stage_delay=0",
                        "stage_delay=86400"}) {
    INFO("-o " << o);
    Mount m(img, tmp / "mnt", {o});
    m.start();
    const std::string f = m / ("f" + std::to_string(n++));
    write_file(f, "data");
    CHECK(read_file(f) == "data");
    REQUIRE(m.unmount() == 0);
  }
  require_fsck_clean(img, tmp / "fsck.log");
}

TEST_CASE("options: a mount point that is not a directory is refused as mount(8) does", "[options]") {
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "64M", tmp / "mkfs.log");
  write_file(tmp / "file", "a regular file");
  for (bool daemon : {false, true}) {
    const Outcome o = plyfs_run(tmp, img, tmp / "file", {}, daemon);
    INFO(o.out);
    CHECK(o.rc == 32);
    CHECK(o.out == "plyfs: mount point " + (tmp / "file") + " is not a directory\n");
    const Outcome g = plyfs_run(tmp, img, tmp / "nowhere", {}, daemon);
    INFO(g.out);
    CHECK(g.rc == 32);
    CHECK(g.out == "plyfs: mount point " + (tmp / "nowhere") + " does not exist\n");
  }
  CHECK(read_file(tmp / "file") == "a regular file");
  // The image was not claimed: it mounts.
  Mount m(img, tmp / "mnt");
  m.start();
  REQUIRE(m.unmount() == 0);
}

TEST_CASE("options: a damaged image says to run fsck.plyfs", "[options]") {
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "64M", tmp / "mkfs.log");
  ino_t f;
  {
    Mount m(img, tmp / "mnt");
    m.start();
    write_file(m / "f", std::string(65536, 'x'));  // in extents, not inline
    f = lstat_of(m / "f").st_ino;
    REQUIRE(m.unmount() == 0);
  }
  const std::string pristine = tmp / "pristine";
  REQUIRE(run({"/bin/cp", "--sparse=always", img, pristine}, tmp / "cp.log") == 0);
  // Refused at mount: the branch's info item is damaged.
  REQUIRE(run({plyctl_bin(), "debug", "corrupt", img, "fsinfo", "main", "magic", "--zero"},
              tmp / "corrupt.log") == 0);
  ::mkdir((tmp / "mnt").c_str(), 0755);
  const Outcome o = plyfs_run(tmp, img, tmp / "mnt", {});
  INFO(o.out);
  CHECK(o.rc == 32);
  check_one_line(o, "plyfs: ");
  CHECK(o.out.find("; the image is damaged: run fsck.plyfs " + img) != std::string::npos);
  // Found while serving: the caller gets EIO, the log says what to do.
  REQUIRE(run({"/bin/cp", "--sparse=always", pristine, img}, tmp / "cp.log") == 0);
  REQUIRE(run({plyctl_bin(), "debug", "corrupt", img, "extent", "main", std::to_string(f), "0", "nblocks",
               "--set", "4000000000"},
              tmp / "corrupt.log") == 0);
  Mount m(img, tmp / "mnt");
  m.start();
  const int fd = ::open((m / "f").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  char buf[4096];
  REQUIRE_ERRNO(::read(fd, buf, sizeof buf), EIO);
  ::close(fd);
  m.unmount();
  INFO(m.log());
  CHECK(m.log().find("; the image is damaged: run fsck.plyfs " + img) != std::string::npos);
  CHECK(m.log().find(": Structure needs cleaning") == std::string::npos);
}

TEST_CASE("options: the mount reads ahead 1 MiB, not the kernel's 128 KiB default", "[options]") {
  // The kernel caps a FUSE mount's readahead at its bdi's read_ahead_kb; the
  // daemon (root here) raises it to its max_readahead for this mount only.
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "64M", tmp / "mkfs.log");
  Mount m(img, tmp / "mnt");
  m.start();
  struct stat st{};
  REQUIRE(::stat(m.path().c_str(), &st) == 0);
  const std::string ra = "/sys/class/bdi/" + std::to_string(major(st.st_dev)) + ":" +
                         std::to_string(minor(st.st_dev)) + "/read_ahead_kb";
  INFO(ra);
  REQUIRE(slurp(ra) == "1024\n");
  // Set lower by hand, it stays until the next mount (which raises it again).
  write_file(ra, "256\n");
  REQUIRE(slurp(ra) == "256\n");
  REQUIRE(m.unmount() == 0);
  Mount again(img, tmp / "mnt");
  again.start();
  REQUIRE(::stat(again.path().c_str(), &st) == 0);
  REQUIRE(slurp("/sys/class/bdi/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev)) +
                "/read_ahead_kb") == "1024\n");
  REQUIRE(again.unmount() == 0);
}

TEST_CASE("options: a mount by another user than root keeps the kernel's readahead and says so once",
          "[options]") {
  // Only root may write a bdi's read_ahead_kb: a user's mount (through the
  // setuid fusermount3) works with the kernel's value, and the daemon says
  // in one notice why large reads arrive in small pieces.
  struct stat fm{};
  if (::stat("/usr/bin/fusermount3", &fm) != 0 || !(fm.st_mode & S_ISUID) || ::access("/usr/bin/setpriv", X_OK) != 0) {
    WARN("skipped: no setuid fusermount3 or no setpriv here");
    return;
  }
  constexpr uid_t kNobody = 65534;
  TempDir tmp;
  const std::string img = tmp / "image", mnt = tmp / "mnt";
  mkfs(img, "64M", tmp / "mkfs.log");
  REQUIRE(::mkdir(mnt.c_str(), 0755) == 0);
  REQUIRE(::chmod(tmp.path().c_str(), 0755) == 0);
  REQUIRE(::chown(img.c_str(), kNobody, kNobody) == 0);
  REQUIRE(::chown(mnt.c_str(), kNobody, kNobody) == 0);
  const std::string log = tmp / "mount.log";
  const int rc = run({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", plyfs_bin(), img, mnt},
                     log);
  INFO(slurp(log));
  REQUIRE(rc == 0);  // in the background once mounted
  struct Detach {  // a failed check leaves no mount under tmp
    std::string at;
    bool done = false;
    ~Detach() {
      if (!done) ::umount2(at.c_str(), MNT_DETACH);
    }
  } detach{mnt};
  // Without allow_other the mount is the user's alone (root's stat of it is
  // EACCES): its device from mountinfo, its files through the user.
  std::string majmin;
  for (const plyfs::MountEntry& m : plyfs::read_mountinfo())
    if (m.mountpoint == mnt) majmin = m.majmin;
  REQUIRE(!majmin.empty());
  const std::string ra = "/sys/class/bdi/" + majmin + "/read_ahead_kb";
  const std::string kernel = slurp(ra);
  const std::string text = slurp(log);
  CHECK(kernel != "1024\n");
  CHECK(text.find("cannot raise " + ra) != std::string::npos);
  CHECK(text.find("Permission denied") != std::string::npos);
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  CHECK(lines == 1);
  const std::string as_user = "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups /bin/sh -c ";
  CHECK(std::system((as_user + "'echo readable > " + mnt + "/f && grep -qx readable " + mnt + "/f'").c_str()) == 0);
  REQUIRE(::umount(mnt.c_str()) == 0);
  detach.done = true;
  // The daemon commits and lets the image go (until then fsck finds it
  // locked); then fsck finds it clean.
  const std::string fsck_log = tmp / "fsck.log";
  int fsck_rc = -1;
  for (int i = 0; i < 200; i++) {
    ::unlink(fsck_log.c_str());
    fsck_rc = run({fsck_bin(), "-fn", img}, fsck_log);
    if (slurp(fsck_log).find("is in use") == std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  INFO(slurp(fsck_log));
  CHECK(fsck_rc == 0);
}
