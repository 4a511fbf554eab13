// The tools on an image on an NBD server (nbdkit on a Unix socket, nothing
// on the network): mkfs.plyfs, plyfs (in the foreground and daemonized),
// plyctl and fsck.plyfs given an nbd+unix:// URI; write errors injected by
// nbdkit's error filter turn the mount read-only with nothing committed
// lost; a server killed under a mount leaves a recoverable image.
// tests/fuse/meson.build runs these only with libnbd and nbdkit.
#include <sys/prctl.h>

#include <dirent.h>

#include "../nbd_server.h"
#include "fuse_util.h"

using namespace plyfs::fusetest;
using plyfs::test::NbdServer;

namespace {

// The pid of our child process named `comm`, or -1.
pid_t child_named(const std::string& comm) {
  DIR* d = ::opendir("/proc");
  if (!d) return -1;
  pid_t found = -1;
  while (dirent* e = ::readdir(d)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::string stat = slurp("/proc/" + std::string(e->d_name) + "/stat");
    // PID (COMM) STATE PPID ...
    const size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == ::getpid() && stat.substr(open + 1, close - open - 1) == comm) found = pid;
  }
  ::closedir(d);
  return found;
}

void require_show(const std::string& tmp, const std::string& target, const std::string& want) {
  const std::string log = tmp + "/show.log";
  ::unlink(log.c_str());
  const int rc = run({plyctl_bin(), "show", target}, log);
  INFO("plyctl show " << target << ":\n" << slurp(log));
  REQUIRE(rc == 0);
  REQUIRE(slurp(log).find(want) != std::string::npos);
}

}  // namespace

TEST_CASE("NBD: mkfs, mount, files, plyctl and fsck on an nbd+unix:// URI", "[nbd-fuse]") {
  const uint64_t s = seed("nbd-fuse");
  std::mt19937_64 rng(s);
  TempDir tmp;
  NbdServer srv(tmp.path(), {"memory", "1G"});
  const std::string uri = srv.uri();
  ::umask(022);
  mkfs(uri, "512M", tmp / "mkfs.log");
  // A second mkfs finds the filesystem and leaves it (M2).
  REQUIRE(run({mkfs_bin(), uri}, tmp / "mkfs2.log") != 0);
  REQUIRE(slurp(tmp / "mkfs2.log").find("contains a plyfs file system") != std::string::npos);

  const std::string big = random_bytes(rng, 24 << 20);
  std::vector<std::string> small;
  {
    Mount m(uri, tmp / "mnt");
    m.start();
    write_file(m / "big", big);
    REQUIRE(::mkdir((m / "dir").c_str(), 0755) == 0);
    for (int i = 0; i < 200; i++) {
      small.push_back(random_bytes(rng, 1 + rng() % 20000));
      write_file(m / ("dir/f" + std::to_string(i)), small.back());
    }
    REQUIRE_SAME(read_file(m / "big"), big);
    // plyctl given the URI finds the mount serving it (no lock to find
    // it by): the daemon answers, nobody opens the export a second time.
    require_show(tmp.path(), uri, "Generation");
    // A command that runs on the image alone refuses it as it refuses a
    // mounted image file (the mount stands in for the lock)...
    CtlOut busy = ctl(tmp, {"snapshot", uri});
    REQUIRE(busy.rc == 1);
    REQUIRE(busy.err.find("it is mounted or in use") != std::string::npos);
    // ...and runs on the mount point.
    REQUIRE(ctl(tmp, {"snapshot", m.path()}).rc == 0);
    REQUIRE(run({fsck_bin(), "-fn", uri}, tmp / "fsck-busy.log") != 0);
    REQUIRE(slurp(tmp / "fsck-busy.log").find("is mounted at") != std::string::npos);
    REQUIRE(m.unmount() == 0);
  }
  require_fsck_clean(uri, tmp / "fsck.log");
  // Offline, plyctl opens the URI itself.
  require_show(tmp.path(), uri, "Generation");
  REQUIRE(ctl(tmp, {"branch", "create", uri, "b1", "--parent", "main"}).rc == 0);
  CtlOut list = ctl(tmp, {"branch", "list", uri});
  REQUIRE(list.rc == 0);
  REQUIRE(list.out.find("b1") != std::string::npos);
  REQUIRE(ctl(tmp, {"du", uri}).rc == 0);
  REQUIRE(ctl(tmp, {"scrub", uri}).rc == 0);
  REQUIRE(ctl(tmp, {"trim", uri}).rc == 0);
  require_fsck_clean(uri, tmp / "fsck.log");

  // Daemonized (no -f): the daemon makes its own connection after the
  // fork, and the parent's exit must not end it. Our subreaper status
  // makes the daemon our child, to wait for it.
  REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  const std::string mnt = tmp / "mnt2";
  REQUIRE(::mkdir(mnt.c_str(), 0755) == 0);
  REQUIRE(run({plyfs_bin(), uri, mnt}, tmp / "daemon.log") == 0);
  const pid_t daemon = child_named("plyfs");
  INFO("daemon log: " << slurp(tmp / "daemon.log"));
  REQUIRE(daemon > 0);
  REQUIRE_SAME(read_file(mnt + "/big"), big);
  for (int i = 0; i < 200; i += 37) REQUIRE_SAME(read_file(mnt + "/dir/f" + std::to_string(i)), small[i]);
  write_file(mnt + "/after", "written by the daemonized mount");
  REQUIRE(::umount2(mnt.c_str(), 0) == 0);
  int st = 0;
  REQUIRE(::waitpid(daemon, &st, 0) == daemon);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 0) == 0);
  require_fsck_clean(uri, tmp / "fsck.log");
  Mount again(uri, tmp / "mnt");
  again.start();
  REQUIRE(read_file(again / "after") == "written by the daemonized mount");
  REQUIRE(again.unmount() == 0);
}

TEST_CASE("NBD: bad URIs and a missing server are one clear line from every tool", "[nbd-fuse]") {
  TempDir tmp;
  const std::string uri = "nbd+unix:///?socket=" + tmp / "none.sock";
  const std::string mnt = tmp / "mnt";
  REQUIRE(::mkdir(mnt.c_str(), 0755) == 0);
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {mkfs_bin(), uri}, {fsck_bin(), "-fn", uri}, {plyctl_bin(), "show", uri},
           {plyctl_bin(), "branch", "list", uri}, {plyfs_bin(), uri, mnt, "-f"}}) {
    const std::string log = tmp / "out.log";
    ::unlink(log.c_str());
    const int rc = run(argv, log);
    const std::string out = slurp(log);
    INFO(argv[0] << ": exit " << rc << ": " << out);
    REQUIRE(rc != 0);
    REQUIRE(rc < 128);
    REQUIRE(out.find("cannot connect to " + uri) != std::string::npos);
  }
}

TEST_CASE("NBD: write errors from the server turn the mount read-only, nothing committed is lost",
          "[nbd-fuse]") {
  const uint64_t s = seed("nbd-eio");
  std::mt19937_64 rng(s);
  TempDir tmp;
  // The error filter fails every write while the trigger file exists.
  const std::string trigger = tmp / "fail-writes";
  NbdServer srv(tmp.path(), {"--filter=error", "memory", "1G", "error-pwrite=EIO",
                             "error-pwrite-rate=100%", "error-pwrite-file=" + trigger});
  const std::string uri = srv.uri();
  ::umask(022);
  mkfs(uri, "512M", tmp / "mkfs.log");

  std::vector<std::string> kept;
  Mount m(uri, tmp / "mnt");
  m.start();
  for (int i = 0; i < 20; i++) {
    kept.push_back(random_bytes(rng, 1 + rng() % 300000));
    write_file(m / ("kept" + std::to_string(i)), kept.back());
  }
  // fsync commits the generation (and every file in it).
  {
    int fd = ::open((m / "kept0").c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::fsync(fd) == 0);
    ::close(fd);
  }
  write_file(trigger, "");
  // The next commit fails at the device: its fsync reports it, and the
  // daemon turns the mount read-only.
  int failed_at = -1;
  for (int i = 0; i < 50 && failed_at < 0; i++) {
    const std::string p = m / ("lost" + std::to_string(i));
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
      failed_at = i;
      break;
    }
    const std::string data = random_bytes(rng, 100000);
    const bool wrote = ::write(fd, data.data(), data.size()) == ssize_t(data.size());
    const bool synced = ::fsync(fd) == 0;
    ::close(fd);
    if (!wrote || !synced) failed_at = i;
  }
  INFO("plyfs log:\n" << m.log());
  REQUIRE(failed_at >= 0);
  REQUIRE_ERRNO(::open((m / "new").c_str(), O_CREAT | O_WRONLY, 0644), EROFS);
  REQUIRE_ERRNO(::mkdir((m / "newdir").c_str(), 0755), EROFS);
  // What was committed reads back while the server still fails writes.
  for (size_t i = 0; i < kept.size(); i += 5) REQUIRE_SAME(read_file(m / ("kept" + std::to_string(i))), kept[i]);
  const int rc = m.unmount();
  const std::string log = m.log();
  INFO("plyfs exit " << rc << ", log:\n" << log);
  REQUIRE(rc < 128);
  REQUIRE(log.find("Sanitizer") == std::string::npos);
  REQUIRE(log.find("runtime error") == std::string::npos);

  // Without the failures: a clean image holding everything committed.
  REQUIRE(::unlink(trigger.c_str()) == 0);
  require_fsck_clean(uri, tmp / "fsck.log");
  Mount back(uri, tmp / "mnt");
  back.start();
  for (size_t i = 0; i < kept.size(); i++) REQUIRE_SAME(read_file(back / ("kept" + std::to_string(i))), kept[i]);
  write_file(back / "new", "writable again");
  REQUIRE(back.unmount() == 0);
  require_fsck_clean(uri, tmp / "fsck.log");
}

TEST_CASE("NBD: a server killed under a mount leaves a recoverable image", "[nbd-fuse]") {
  const uint64_t s = seed("nbd-kill");
  std::mt19937_64 rng(s);
  TempDir tmp;
  // nbdkit file: what it wrote survives its death (the host's page cache).
  const std::string file = tmp / "backing";
  {
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 512 << 20) == 0);
    ::close(fd);
  }
  NbdServer srv(tmp.path(), {"file", file});
  const std::string uri = srv.uri();
  ::umask(022);
  mkfs(uri, "512M", tmp / "mkfs.log");
  std::vector<std::string> kept;
  Mount m(uri, tmp / "mnt", {"commit=1"});
  m.start();
  for (int i = 0; i < 10; i++) {
    kept.push_back(random_bytes(rng, 1 + rng() % 200000));
    write_file(m / ("kept" + std::to_string(i)), kept.back());
  }
  int dfd = ::open(m.path().c_str(), O_RDONLY | O_DIRECTORY);
  REQUIRE(dfd >= 0);
  REQUIRE(::syncfs(dfd) == 0);
  ::close(dfd);

  // Writes and commits in flight when the server dies.
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::mt19937_64 r(s + 1);
    for (int i = 0; !stop; i++) {
      const std::string p = m / ("more" + std::to_string(i % 50));
      int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) break;
      const std::string data = random_bytes(r, 200000);
      const bool ok = ::write(fd, data.data(), data.size()) == ssize_t(data.size()) && ::fsync(fd) == 0;
      ::close(fd);
      if (!ok) break;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 700));
  srv.stop(SIGKILL);
  stop = true;
  writer.join();
  // The next commit fails (EIO), the mount turns read-only, and the
  // daemon exits at the unmount without crashing.
  {
    int fd = ::open((m / "after-kill").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      REQUIRE(::write(fd, "x", 1) == 1);
      REQUIRE(::fsync(fd) != 0);
      ::close(fd);
    }
  }
  REQUIRE_ERRNO(::mkdir((m / "after-kill-dir").c_str(), 0755), EROFS);
  const int rc = m.unmount();
  const std::string log = m.log();
  INFO("plyfs exit " << rc << ", log:\n" << log);
  REQUIRE(rc < 128);
  REQUIRE(log.find("Sanitizer") == std::string::npos);

  srv.restart({"file", file});
  require_fsck_clean(uri, tmp / "fsck.log");
  Mount back(uri, tmp / "mnt");
  back.start();
  for (size_t i = 0; i < kept.size(); i++) REQUIRE_SAME(read_file(back / ("kept" + std::to_string(i))), kept[i]);
  REQUIRE(back.unmount() == 0);
}
