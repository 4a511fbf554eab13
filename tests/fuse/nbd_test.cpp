// The tools on an image on an NBD server (nbdkit on a Unix socket, nothing
// on the network): mkfs.plyfs, plyfs (in the foreground and daemonized),
// plyctl and fsck.plyfs given an nbd+unix:// URI; write errors injected by
// nbdkit's error filter turn the mount read-only with nothing committed
// lost; a server killed under a mount leaves a recoverable image; nbd:// and
// nbds:// (TLS) on the loopback address; qemu-nbd serving a qcow2 file;
// the daemon's read cache (never stale, scrubbed past, shrunk when the
// daemon's memory cgroup runs short).
// tests/fuse/meson.build runs these only with libnbd and nbdkit.
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <numeric>
#include <nlohmann/json.hpp>
#include <thread>

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

// A memory cgroup of the test's own under the host's hierarchy, cgroup v1's
// memory controller or v2's; ok() false where none can be made (not root,
// no memory controller).
class MemCgroup {
 public:
  explicit MemCgroup(const std::string& name) {
    struct stat st;
    if (::stat("/sys/fs/cgroup/memory/memory.limit_in_bytes", &st) == 0) {
      dir_ = "/sys/fs/cgroup/memory/" + name;
    } else if (slurp("/sys/fs/cgroup/cgroup.controllers").find("memory") != std::string::npos) {
      v2_ = true;
      std::ofstream("/sys/fs/cgroup/cgroup.subtree_control") << "+memory";
      dir_ = "/sys/fs/cgroup/" + name;
    } else {
      return;
    }
    if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
      dir_.clear();
    } else if (::stat((dir_ + (v2_ ? "/memory.max" : "/memory.limit_in_bytes")).c_str(), &st) != 0) {
      // v2 without the controller for it (a parent that holds processes
      // cannot pass it on): a plain cgroup, of no use here.
      ::rmdir(dir_.c_str());
      dir_.clear();
    }
  }
  ~MemCgroup() {
    if (dir_.empty()) return;
    // Whatever is left in it (the daemon exits at its unmount) first.
    for (int i = 0; i < 100 && ::rmdir(dir_.c_str()) != 0 && errno == EBUSY; i++)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  MemCgroup(const MemCgroup&) = delete;
  MemCgroup& operator=(const MemCgroup&) = delete;
  bool ok() const { return !dir_.empty(); }
  bool put(const std::string& file, const std::string& value) const {
    std::ofstream o(dir_ + "/" + file);
    o << value;
    o.flush();
    return bool(o);
  }
  bool set_limit(uint64_t bytes) const { return put(v2_ ? "memory.max" : "memory.limit_in_bytes", std::to_string(bytes)); }
  bool add(pid_t pid) const { return put("cgroup.procs", std::to_string(pid)); }
  uint64_t usage() const {
    return std::stoull("0" + slurp(dir_ + (v2_ ? "/memory.current" : "/memory.usage_in_bytes")));
  }

 private:
  std::string dir_;
  bool v2_ = false;
};

// How many read requests nbdkit's log filter has logged.
size_t logged_reads(const std::string& log) {
  const std::string text = slurp(log);
  size_t n = 0;
  for (size_t at = 0; (at = text.find(" Read id=", at)) != std::string::npos; at++) n++;
  return n;
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

namespace {

// A PSK file for nbdkit and libnbd (TLS-PSK, RFC 4279): one user, a random
// 256-bit key in hex.
std::string psk_file(const TempDir& tmp, const std::string& name, const std::string& user, std::mt19937_64& rng) {
  static const char* hex = "0123456789abcdef";
  std::string key;
  for (int i = 0; i < 64; i++) key += hex[rng() % 16];
  const std::string path = tmp / name;
  write_file(path, user + ":" + key + "\n");
  REQUIRE(::chmod(path.c_str(), 0600) == 0);
  return path;
}

// Files written through a mount of `uri`, read back after a remount; fsck
// clean in between. The files it wrote, by name.
std::map<std::string, std::string> files_round_trip(const TempDir& tmp, const std::string& uri, std::mt19937_64& rng) {
  std::map<std::string, std::string> files;
  {
    Mount m(uri, tmp / "mnt");
    m.start();
    files["big"] = random_bytes(rng, 12 << 20);
    for (int i = 0; i < 60; i++) files["f" + std::to_string(i)] = random_bytes(rng, 1 + rng() % 30000);
    for (const auto& [name, data] : files) write_file(m / name, data);
    REQUIRE(m.unmount() == 0);
  }
  require_fsck_clean(uri, tmp / "fsck.log");
  Mount m(uri, tmp / "mnt");
  m.start();
  for (const auto& [name, data] : files) REQUIRE_SAME(read_file(m / name), data);
  REQUIRE(m.unmount() == 0);
  return files;
}

}  // namespace

// nbd:// and nbds:// on the loopback address (nothing else on the network):
// plain TCP, then TLS with a pre-shared key (nbdkit --tls=require). The tools
// take the URI as they take any image; a client without TLS, or with
// another key, is refused in one line and changes nothing.
TEST_CASE("NBD: over TCP on the loopback, plain and with TLS (PSK); no TLS or a wrong key refused",
          "[nbd-fuse]") {
  std::mt19937_64 rng(seed("nbd-tcp"));
  TempDir tmp;
  ::umask(022);
  {
    NbdServer srv(tmp.path(), {"memory", "512M"}, "tcp", NbdServer::Listen{true, "", ""});
    REQUIRE(srv.uri().rfind("nbd://127.0.0.1:", 0) == 0);
    mkfs(srv.uri(), "256M", tmp / "mkfs.log");
    files_round_trip(tmp, srv.uri(), rng);
  }
  const std::string psk = psk_file(tmp, "keys.psk", "alice", rng);
  NbdServer srv(tmp.path(), {"memory", "512M"}, "tls", NbdServer::Listen{true, psk, "alice"});
  const std::string uri = srv.uri();
  REQUIRE(uri.rfind("nbds://alice@127.0.0.1:", 0) == 0);
  mkfs(uri, "256M", tmp / "mkfs.log");
  const auto files = files_round_trip(tmp, uri, rng);
  // Without TLS, and with another key: refused, in one line, by each tool.
  const std::string plain = "nbd://127.0.0.1:" + std::to_string(srv.port()) + "/";
  const std::string wrong = "nbds://alice@127.0.0.1:" + std::to_string(srv.port()) +
                            "/?tls-psk-file=" + psk_file(tmp, "other.psk", "alice", rng);
  for (const std::string& bad : {plain, wrong}) {
    INFO(bad);
    REQUIRE(run({fsck_bin(), "-n", bad}, tmp / "bad.log") != 0);
    const std::string out = slurp(tmp / "bad.log");
    INFO(out);
    REQUIRE(out.find("cannot connect") != std::string::npos);
    REQUIRE(std::count(out.begin(), out.end(), '\n') <= 2);
    REQUIRE(ctl(tmp, {"show", bad}).rc == 1);
  }
  // The image is as it was.
  require_fsck_clean(uri, tmp / "fsck.log");
  Mount m(uri, tmp / "mnt");
  m.start();
  for (const auto& [name, data] : files) REQUIRE_SAME(read_file(m / name), data);
  REQUIRE(m.unmount() == 0);
}

// qemu-nbd serving a qcow2 file (the way to Ceph RBD, README): mkfs, a mount,
// files, a trim that qemu-nbd passes to the qcow2 as unmapped clusters,
// fsck; the qcow2 itself checks clean, and the data outlives the server.
TEST_CASE("NBD: qemu-nbd serving a qcow2 file; trim unmaps its clusters; the qcow2 checks clean", "[nbd-fuse]") {
  const std::string qemu_nbd = "/usr/bin/qemu-nbd", qemu_img = "/usr/bin/qemu-img";
  INFO("qemu-nbd and qemu-img come with qemu-utils (scripts/install-deps)");
  REQUIRE(::access(qemu_nbd.c_str(), X_OK) == 0);
  REQUIRE(::access(qemu_img.c_str(), X_OK) == 0);
  std::mt19937_64 rng(seed("nbd-qemu"));
  TempDir tmp;
  ::umask(022);
  const std::string img = tmp / "disk.qcow2", sock = tmp / "qemu.sock", pidfile = tmp / "qemu.pid";
  REQUIRE(run({qemu_img, "create", "-q", "-f", "qcow2", img, "512M"}, tmp / "qemu-img.log") == 0);
  auto start = [&] {
    ::unlink(pidfile.c_str());
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = ::open((tmp / "qemu-nbd.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) ::dup2(fd, 1), ::dup2(fd, 2);
      ::execl(qemu_nbd.c_str(), qemu_nbd.c_str(), "--persistent", ("--socket=" + sock).c_str(), "--format=qcow2",
              "--cache=writeback", "--discard=unmap", ("--pid-file=" + pidfile).c_str(), img.c_str(), nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 2000; i++) {
      struct stat st{};
      if (::stat(pidfile.c_str(), &st) == 0 && st.st_size > 0 && ::stat(sock.c_str(), &st) == 0) return pid;
      int status;
      if (::waitpid(pid, &status, WNOHANG) == pid) FAIL("qemu-nbd exited: " << slurp(tmp / "qemu-nbd.log"));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL("qemu-nbd did not start: " << slurp(tmp / "qemu-nbd.log"));
    return pid_t(-1);
  };
  auto stop = [&](pid_t pid) {
    ::kill(pid, SIGTERM);
    int status;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
  };
  const std::string uri = "nbd+unix:///?socket=" + sock;
  pid_t pid = start();
  mkfs(uri, "512M", tmp / "mkfs.log");
  auto allocated = [&] {  // bytes the qcow2 maps to data (qemu-img map --output=json)
    const std::string log = tmp / "map.log";
    ::unlink(log.c_str());  // run() appends
    REQUIRE(run({qemu_img, "map", "--force-share", "--output=json", img}, log) == 0);
    const auto j = nlohmann::json::parse(slurp(log));
    uint64_t n = 0;
    for (const auto& e : j)
      if (e["data"].get<bool>()) n += e["length"].get<uint64_t>();
    return n;
  };
  std::map<std::string, std::string> files;
  uint64_t before_trim = 0;
  {
    Mount m(uri, tmp / "mnt");
    m.start();
    files["big"] = random_bytes(rng, 64 << 20);
    for (int i = 0; i < 40; i++) files["f" + std::to_string(i)] = random_bytes(rng, 1 + rng() % 50000);
    for (const auto& [name, data] : files) write_file(m / name, data);
    write_file(m / "gone", random_bytes(rng, 96 << 20));
    REQUIRE(ctl(tmp, {"sync", m.path()}).rc == 0);
    REQUIRE(::unlink((m / "gone").c_str()) == 0);
    REQUIRE(ctl(tmp, {"sync", m.path()}).rc == 0);
    before_trim = allocated();
    REQUIRE(before_trim >= (150ull << 20));
    CtlOut t = ctl(tmp, {"trim", m.path()});
    INFO(t.err);
    REQUIRE(t.rc == 0);
    REQUIRE(m.unmount() == 0);
  }
  require_fsck_clean(uri, tmp / "fsck.log");
  // qemu-nbd writes the qcow2's cluster tables back at its next flush or
  // when it stops (a discard needs no flush: D7): the map is read after.
  stop(pid);
  const uint64_t after_trim = allocated();
  INFO("qcow2 data: " << before_trim << " bytes before the trim, " << after_trim << " after");
  REQUIRE(after_trim + (64ull << 20) < before_trim);  // the deleted 96 MiB (most of it) unmapped
  REQUIRE(after_trim >= (64ull << 20));                // the files' data stays
  REQUIRE(run({qemu_img, "check", img}, tmp / "check.log") == 0);
  pid = start();
  {
    Mount m(uri, tmp / "mnt");
    m.start();
    for (const auto& [name, data] : files) REQUIRE_SAME(read_file(m / name), data);
    REQUIRE(m.unmount() == 0);
  }
  stop(pid);
}

// A volume of two devices whose slow one is an NBD export
// (format.md#multi-device): mkfs.plyfs -C with the URI, a mount naming it
// with -o device=, data on it (plyctl where), fsck with both, and a device
// added through the mount from another export, which then takes data.
TEST_CASE("NBD: one device of a volume on several is an NBD export", "[nbd-fuse]") {
  std::mt19937_64 rng(seed("nbd-multi"));
  TempDir tmp;
  ::umask(022);
  NbdServer slow(tmp.path(), {"memory", "256M"}, "slow");
  NbdServer more(tmp.path(), {"memory", "256M"}, "more");
  const std::string fast = tmp / "fast.img";
  {
    const int fd = ::open(fast.c_str(), O_CREAT | O_WRONLY, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 64 << 20) == 0);
    ::close(fd);
  }
  REQUIRE(run({mkfs_bin(), "-q", "-C", "fast=" + fast, "-C", "slow=" + slow.uri()}, tmp / "mkfs.log") == 0);
  // A second mkfs finds it (M2) without -f.
  REQUIRE(run({mkfs_bin(), "-q", "-C", "fast=" + fast, "-C", "slow=" + slow.uri()}, tmp / "mkfs2.log") != 0);
  std::map<std::string, std::string> files;
  {
    Mount m(fast, tmp / "mnt", {"device=" + slow.uri()});
    m.start();
    for (int i = 0; i < 6; i++) files["f" + std::to_string(i)] = random_bytes(rng, 8 << 20);
    for (const auto& [name, data] : files) write_file(m / name, data);
    CtlOut w = ctl(tmp, {"where", m / "f0", "--json"});
    REQUIRE(w.rc == 0);
    REQUIRE(w.out.find("\"slow\"") != std::string::npos);
    CtlOut a = ctl(tmp, {"device", "add", m.path(), more.uri(), "--class", "slow"});
    INFO(a.err);
    REQUIRE(a.rc == 0);
    for (int i = 6; i < 40; i++) files["f" + std::to_string(i)] = random_bytes(rng, 8 << 20);
    for (int i = 6; i < 40; i++) write_file(m / ("f" + std::to_string(i)), files["f" + std::to_string(i)]);
    CtlOut l = ctl(tmp, {"device", "list", m.path(), "--json"});
    REQUIRE(l.rc == 0);
    const auto j = nlohmann::json::parse(l.out);
    REQUIRE(j["devices"].size() == 3);
    REQUIRE(j["devices"][2]["used_bytes"].get<uint64_t>() > 0);  // past what the first export holds
    REQUIRE(m.unmount() == 0);
  }
  REQUIRE(run({fsck_bin(), "-fn", fast, slow.uri(), more.uri()}, tmp / "fsck.log") == 0);
  Mount m(fast, tmp / "mnt", {"device=" + slow.uri(), "device=" + more.uri()});
  m.start();
  for (const auto& [name, data] : files) REQUIRE_SAME(read_file(m / name), data);
  REQUIRE(m.unmount() == 0);
}

TEST_CASE("NBD: the daemon's read cache never serves bytes older than the last write", "[nbd-fuse]") {
  // O_DIRECT both ways, so that every read and write reaches the daemon
  // (not the kernel's page cache): a line of the read cache
  // (lib/blockdev/read_cache.h) kept past a write of its blocks, or of
  // blocks freed and then reused for other data, would read back wrong. A
  // small image and a commit a second make the allocator reuse blocks.
  const uint64_t s = seed("nbd-cache");
  std::mt19937_64 rng(s);
  TempDir tmp;
  NbdServer srv(tmp.path(), {"memory", "256M"});
  const std::string uri = srv.uri();
  mkfs(uri, "64M", tmp / "mkfs.log");
  constexpr size_t kFile = 4 << 20, kFiles = 4;
  // Large enough to hold every block of the image (lines kept until reused),
  // small enough to evict all the time, and none.
  for (const char* cache : {"nbd_cache=128M", "nbd_cache=1M", "nbd_cache=0"}) {
    INFO("-o " << cache);
    Mount m(uri, tmp / "mnt", {cache, "commit=1"});
    m.start();
    std::vector<std::string> model(kFiles);
    std::vector<int> fds;
    for (size_t f = 0; f < kFiles; f++) {
      model[f] = random_bytes(rng, kFile);
      write_file(m / ("f" + std::to_string(f)), model[f]);
      const int fd = ::open((m / ("f" + std::to_string(f))).c_str(), O_RDWR | O_DIRECT);
      REQUIRE(fd >= 0);
      fds.push_back(fd);
    }
    void* mem = nullptr;
    REQUIRE(::posix_memalign(&mem, 4096, 64 << 10) == 0);
    std::unique_ptr<void, decltype(&std::free)> buf(mem, std::free);
    auto* b = static_cast<char*>(mem);
    int reads = 0, writes = 0;
    for (int i = 0; i < 4000; i++) {
      const size_t f = rng() % kFiles, len = 4096 * (1 + rng() % 16);
      const size_t off = 4096 * (rng() % ((kFile - len) / 4096 + 1));
      if (rng() % 3 == 0) {
        const std::string data = random_bytes(rng, len);
        std::memcpy(b, data.data(), len);
        REQUIRE(::pwrite(fds[f], b, len, off_t(off)) == ssize_t(len));
        model[f].replace(off, len, data);
        if (rng() % 8 == 0) REQUIRE(::fsync(fds[f]) == 0);
        writes++;
      } else {
        REQUIRE(::pread(fds[f], b, len, off_t(off)) == ssize_t(len));
        INFO("file " << f << " bytes " << off << "+" << len << " after " << reads << " reads, " << writes << " writes");
        REQUIRE(std::memcmp(b, model[f].data() + off, len) == 0);
        reads++;
      }
    }
    for (int fd : fds) ::close(fd);
    for (size_t f = 0; f < kFiles; f++) REQUIRE_SAME(read_file(m / ("f" + std::to_string(f))), model[f]);
    REQUIRE(m.unmount() == 0);
    // And after a remount (a cold cache): what the last writes left.
    Mount again(uri, tmp / "mnt", {cache});
    again.start();
    for (size_t f = 0; f < kFiles; f++) REQUIRE_SAME(read_file(again / ("f" + std::to_string(f))), model[f]);
    REQUIRE(again.unmount() == 0);
  }
  require_fsck_clean(uri, tmp / "fsck.log");
}

TEST_CASE("NBD: scrub of a mount checks the server's bytes, not the daemon's read cache", "[nbd-fuse]") {
  // Blocks damaged on the server after the daemon cached them (rot on its
  // disk): O_DIRECT reads served from the read cache still see the old
  // bytes, but a scrub must read past the cache (read_uncached, C7) and
  // find every damaged block. nbdkit's file plugin, so that the test can
  // damage the export's file.
  const uint64_t s = seed("nbd-scrub");
  std::mt19937_64 rng(s);
  TempDir tmp;
  const std::string img = tmp / "export.img";
  constexpr off_t kImage = 256 << 20;
  {
    const int fd = ::open(img.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, kImage) == 0);
    ::close(fd);
  }
  NbdServer srv(tmp.path(), {"file", img});
  const std::string uri = srv.uri();
  mkfs(uri, "256M", tmp / "mkfs.log");
  // Small files (each one read of 16 KiB, which the cache keeps), 2 MiB of
  // other data between any two (so that no read of one is near another's,
  // which the cache takes for a stream and does not keep, C3). Each block
  // starts with a tag that finds it in the export's file.
  constexpr int kTargets = 24;
  constexpr size_t kBlock = 4096, kBlocks = 4;
  auto tag = [](int t, size_t b) { return "plyfs-scrub-target-" + std::to_string(t) + "-block-" + std::to_string(b) + ";"; };
  std::vector<std::string> targets;
  {
    Mount m(uri, tmp / "mnt", {"commit=1"});
    m.start();
    for (int t = 0; t < kTargets; t++) {
      std::string data;
      for (size_t b = 0; b < kBlocks; b++) {
        std::string blk = tag(t, b) + random_bytes(rng, kBlock);
        blk.resize(kBlock);
        data += blk;
      }
      targets.push_back(data);
      write_file(m / ("t" + std::to_string(t)), data);
      write_file(m / ("fill" + std::to_string(t)), random_bytes(rng, 2 << 20));
    }
    REQUIRE(m.unmount() == 0);
  }
  Mount m(uri, tmp / "mnt", {"nbd_cache=64M"});
  m.start();
  void* mem = nullptr;
  REQUIRE(::posix_memalign(&mem, kBlock, kBlocks * kBlock) == 0);
  std::unique_ptr<void, decltype(&std::free)> buf(mem, std::free);
  auto read_direct = [&](int t) {
    const int fd = ::open((m / ("t" + std::to_string(t))).c_str(), O_RDONLY | O_DIRECT);
    REQUIRE(fd >= 0);
    const ssize_t n = ::pread(fd, mem, kBlocks * kBlock, 0);
    ::close(fd);
    return n == ssize_t(kBlocks * kBlock) && std::memcmp(mem, targets[size_t(t)].data(), kBlocks * kBlock) == 0;
  };
  std::vector<int> order(kTargets);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int t : order) REQUIRE(read_direct(t));
  CtlOut clean = ctl(tmp, {"scrub", m.path()});
  INFO(clean.out << clean.err);
  REQUIRE(clean.rc == 0);

  // Block 1 of every target, one byte flipped in the export's file.
  int damaged = 0;
  {
    const int fd = ::open(img.c_str(), O_RDWR | O_CLOEXEC);
    REQUIRE(fd >= 0);
    std::vector<char> chunk(1 << 20);
    for (off_t at = 0; at < kImage; at += off_t(chunk.size())) {
      REQUIRE(::pread(fd, chunk.data(), chunk.size(), at) == ssize_t(chunk.size()));
      for (size_t o = 0; o < chunk.size(); o += kBlock)
        for (int t = 0; t < kTargets; t++) {
          const std::string want = tag(t, 1);
          if (std::memcmp(chunk.data() + o, want.data(), want.size()) != 0) continue;
          const char c = char(chunk[o + 100] ^ 0x40);
          REQUIRE(::pwrite(fd, &c, 1, at + off_t(o) + 100) == 1);
          damaged++;
        }
    }
    ::close(fd);
  }
  REQUIRE(damaged == kTargets);
  // The scrub first: a read that fails its checksum turns the mount
  // read-only (format.md#fs-extent, "Checksums"), which a scrub does not.
  CtlOut dirty = ctl(tmp, {"scrub", m.path(), "--json"});
  INFO(dirty.out << dirty.err);
  REQUIRE(dirty.rc == 4);
  const auto j = nlohmann::json::parse(dirty.out);
  REQUIRE(j["damage"].size() == size_t(kTargets));
  for (const auto& d : j["damage"]) {
    CHECK(d["type"] == "data");
    CHECK(d["reason"] == "checksum");
  }
  // What the reads see now: the old bytes where the cache keeps the line,
  // EIO (a checksum that fails) where it does not. Some must come from the
  // cache, or this test would not tell a scrub through it from one past it.
  int cached = 0;
  for (int t = 0; t < kTargets; t++) cached += read_direct(t);
  INFO(cached << " of " << kTargets << " targets read from the cache");
  REQUIRE(cached > 0);
  // A read that met the damage turned the mount read-only: its last commit
  // fails, and the daemon says so in its exit status.
  const int rc = m.unmount();
  INFO(m.log());
  REQUIRE(rc == (cached == kTargets ? 0 : 1));
}

TEST_CASE("NBD: the read cache gives its memory back when the daemon's cgroup runs short, and takes it again",
          "[nbd-fuse]") {
  // read_cache.h C8 with the kernel's own accounting: the daemon in a memory
  // cgroup of 256 MiB, its cache filled by small O_DIRECT reads (each a hit
  // the second time: no read reaches the server, as nbdkit's log filter
  // counts); then a process in the same cgroup takes all but a few MiB of
  // it, and the cache must let its lines go (every read to the server
  // again); once that process is gone, the cache must fill and hit again.
  MemCgroup cg("plyfs-test-" + std::to_string(::getpid()));
  if (!cg.ok()) {
    WARN("skipped: no memory cgroup can be made here");
    return;
  }
  constexpr uint64_t M = 1ull << 20, kLimit = 256 * M;
  REQUIRE(cg.set_limit(kLimit));
  const uint64_t s = seed("nbd-cache-pressure");
  std::mt19937_64 rng(s);
  TempDir tmp;
  const std::string img = tmp / "export.img", log = tmp / "reads.log";
  {
    const int fd = ::open(img.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, off_t(256 * M)) == 0);
    ::close(fd);
  }
  NbdServer srv(tmp.path(), {"--filter=log", "file", img, "logfile=" + log});
  const std::string uri = srv.uri();
  mkfs(uri, "256M", tmp / "mkfs.log");
  constexpr size_t kReads = 64, kBlock = 4096;
  const std::string data = random_bytes(rng, kReads * M);
  {
    Mount w(uri, tmp / "mnt", {"commit=1"});
    w.start();
    write_file(w / "big", data);
    REQUIRE(w.unmount() == 0);
  }
  Mount m(uri, tmp / "mnt", {"nbd_cache=64M"});
  m.start();
  // What it allocates from now on is charged to the cgroup (cgroup v1 and
  // v2 leave what it had where it was).
  REQUIRE(cg.add(m.pid()));
  void* mem = nullptr;
  REQUIRE(::posix_memalign(&mem, kBlock, kBlock) == 0);
  std::unique_ptr<void, decltype(&std::free)> buf(mem, std::free);
  // One 4 KiB read in each MiB of the file, each checked; how many reached
  // the server. The file's blocks lie where the allocator put them, a few
  // of them near another one read just before: such a read is taken for
  // part of a stream and not kept the first time (C3), so the pass after a
  // cold one fills those, and the one after that reads nothing.
  auto pass = [&] {
    const size_t before = logged_reads(log);
    const int fd = ::open((m / "big").c_str(), O_RDONLY | O_DIRECT);
    REQUIRE(fd >= 0);
    for (size_t k = 0; k < kReads; k++) {
      REQUIRE(::pread(fd, mem, kBlock, off_t(k * M)) == ssize_t(kBlock));
      REQUIRE(std::memcmp(mem, data.data() + k * M, kBlock) == 0);
    }
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the log written
    return logged_reads(log) - before;
  };
  const size_t cold = pass();
  const uint64_t used_cold = cg.usage();
  pass();
  const size_t warm = pass();
  INFO("server reads: cold " << cold << ", warm " << warm << "; cgroup usage " << used_cold / M << " MiB, then "
                             << cg.usage() / M << " MiB");
  REQUIRE(cold >= kReads);
  REQUIRE(warm <= kReads / 8);

  // Pressure: a process in the cgroup takes all but 8 MiB of it (below a
  // sixteenth, 16 MiB: the cache must halve each second, down to nothing;
  // what it frees may stay the daemon's, in its heap or ASan's quarantine).
  const uint64_t used = cg.usage();
  REQUIRE(used + 32 * M < kLimit);
  const size_t hog_bytes = size_t(kLimit - used - 8 * M);
  int go[2], ready[2];
  REQUIRE(::pipe(go) == 0);
  REQUIRE(::pipe(ready) == 0);
  const pid_t hog = ::fork();
  REQUIRE(hog >= 0);
  if (hog == 0) {  // in the cgroup once `go` says so; nothing but system calls
    ::close(go[1]);
    ::close(ready[0]);
    char c = 0;
    if (::read(go[0], &c, 1) != 1) ::_exit(2);
    void* p = ::mmap(nullptr, hog_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) ::_exit(3);
    std::memset(p, 0x5a, hog_bytes);
    if (::write(ready[1], &c, 1) != 1) ::_exit(4);
    for (;;) ::pause();
  }
  ::close(go[0]);
  ::close(ready[1]);
  const bool moved = cg.add(hog);
  char c = 1;
  const bool hogging = moved && ::write(go[1], &c, 1) == 1 && ::read(ready[0], &c, 1) == 1;
  ::close(go[1]);
  ::close(ready[0]);
  auto stop_hog = [&] {
    ::kill(hog, SIGKILL);
    int st;
    ::waitpid(hog, &st, 0);
  };
  if (!hogging) stop_hog();
  REQUIRE(hogging);
  std::this_thread::sleep_for(std::chrono::seconds(9));  // 64 lines: 7 halvings
  const size_t pressed = pass(), pressed_again = pass();
  INFO("cgroup usage " << cg.usage() / M << " MiB of " << kLimit / M << " MiB; server reads under pressure: "
                       << pressed << ", " << pressed_again);
  stop_hog();
  CHECK(pressed >= kReads);
  CHECK(pressed_again >= kReads);  // nor kept while it lasts

  // Memory back: the cache grows to its size again within a second or two.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  const size_t refill = pass();
  pass();
  const size_t rewarm = pass();
  INFO("after: refill " << refill << ", warm " << rewarm);
  CHECK(refill >= kReads / 2);
  CHECK(rewarm <= kReads / 8);
  REQUIRE(m.unmount() == 0);
}
