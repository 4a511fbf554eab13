// Helpers for the end-to-end FUSE tests: temporary directories, the tools
// (mkfs.plyfs, fsck.plyfs, plyfs) run as child processes, and a Mount guard
// that always unmounts, even when a test fails halfway.
//
// The paths of the tools come from the environment (tests/fuse/meson.build):
// PLYFS_BIN, PLYFS_MKFS, PLYFS_FSCK.
#pragma once

#include "../random_seed.h"

#include <catch2/catch_test_macros.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace plyfs::fusetest {

using Clock = std::chrono::steady_clock;

using plyfs::test::scale;
using plyfs::test::seed;

inline std::string tool(const char* env) {
  const char* p = std::getenv(env);
  if (!p || !*p) FAIL(env << " is not set (run the tests through meson test)");
  return p;
}
inline std::string plyfs_bin() { return tool("PLYFS_BIN"); }
inline std::string mkfs_bin() { return tool("PLYFS_MKFS"); }
inline std::string fsck_bin() { return tool("PLYFS_FSCK"); }
inline std::string plyctl_bin() { return tool("PLYFS_PLYCTL"); }

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Starts argv with stdout and stderr into `log` (appended); returns its pid.
// The child only makes system calls: the test may have other threads, and
// one of them may hold the allocator's lock (ASan's spins for ever) at the
// fork, so everything the child needs is built before it.
inline pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> av;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  const char* path = log.c_str();
  pid_t pid = fork();
  if (pid < 0) FAIL("fork: " << std::strerror(errno));
  if (pid == 0) {
    int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(av[0], av.data());
    _exit(127);
  }
  return pid;
}

// Runs argv with stdout and stderr into `log` (appended); returns the exit
// status, or 128 + the signal. Kills it after `timeout_s`.
inline int run(const std::vector<std::string>& argv, const std::string& log,
               int timeout_s = 300) {
  const pid_t pid = spawn(argv, log);
  auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  int st = 0;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) FAIL("waitpid: " << std::strerror(errno));
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      FAIL(argv[0] << " did not finish in " << timeout_s << " s; output:\n" << slurp(log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// A fresh directory (mkdtemp) removed with everything in it at the end:
// on tmpfs (/dev/shm) unless `base` names another place.
class TempDir {
 public:
  explicit TempDir(const char* base = nullptr) {
    if (!base) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string t = std::string(base) + "/plyfs-fuse-XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) FAIL("mkdtemp: " << std::strerror(errno));
    path_ = buf.data();
  }
  ~TempDir() {
    // Mounts below it are gone by now (Mount guards go first); detach any
    // that a failure left, so that removing cannot wander into them.
    std::string cmd = "rm -rf --one-file-system '" + path_ + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "cannot remove %s\n", path_.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& s) const { return path_ + "/" + s; }

 private:
  std::string path_;
};

// An NBD URI (tests/nbd_test.cpp) rather than an image file.
inline bool is_uri(const std::string& img) { return img.rfind("nbd", 0) == 0 && img.find("://") != std::string::npos; }

inline void mkfs(const std::string& img, const std::string& size, const std::string& log) {
  // mkfs.plyfs never creates files under /dev (a mistyped device name), so
  // an image in /dev/shm must exist first.
  if (!is_uri(img)) {
    int fd = ::open(img.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    INFO("create " << img << ": " << std::strerror(errno));
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  int rc = run({mkfs_bin(), "-s", size, img}, log);
  INFO(slurp(log));
  REQUIRE(rc == 0);
}

// fsck -fn: exit 0 is a clean image.
inline void require_fsck_clean(const std::string& img, const std::string& log) {
  std::string out = log + ".fsck";
  ::unlink(out.c_str());
  int rc = run({fsck_bin(), "-fn", img}, out);
  INFO("fsck.plyfs -fn " << img << ":\n" << slurp(out));
  REQUIRE(rc == 0);
}

// Free blocks of the filesystem holding `p` (statfs).
inline uint64_t free_blocks(const std::string& p) {
  struct statvfs v{};
  REQUIRE(::statvfs(p.c_str(), &v) == 0);
  return v.f_bfree;
}

inline dev_t dev_of(const std::string& p) {
  struct stat st;
  if (::stat(p.c_str(), &st) != 0) return dev_t(-1);
  return st.st_dev;
}

// One plyfs daemon serving an image, run in the foreground (-f) as a child.
// The destructor unmounts and reaps it whatever happened; unmount() does it
// in a test and returns the daemon's exit status.
class Mount {
 public:
  Mount(std::string img, std::string mnt, std::vector<std::string> opts = {})
      : img_(std::move(img)), mnt_(std::move(mnt)), opts_(std::move(opts)) {
    log_ = mnt_ + ".log";
    ::mkdir(mnt_.c_str(), 0755);
  }
  ~Mount() {
    if (pid_ > 0) {
      if (mounted_ && umount2(mnt_.c_str(), 0) != 0) umount2(mnt_.c_str(), MNT_DETACH);
      mounted_ = false;
      if (!reap(15)) {
        kill(pid_, SIGKILL);
        int st;
        waitpid(pid_, &st, 0);
      }
      pid_ = -1;
    }
    if (mounted_) umount2(mnt_.c_str(), MNT_DETACH);
  }
  Mount(const Mount&) = delete;
  Mount& operator=(const Mount&) = delete;

  const std::string& path() const { return mnt_; }
  const std::string& image() const { return img_; }
  std::string operator/(const std::string& s) const { return mnt_ + "/" + s; }
  std::string log() const { return slurp(log_); }
  std::string log_path() const { return log_; }
  pid_t pid() const { return pid_; }
  bool mounted() const { return mounted_; }

  // Starts the daemon and waits until the mountpoint is a different device.
  void start(int timeout_s = 60) {
    REQUIRE(pid_ < 0);
    const std::string parent = mnt_.substr(0, mnt_.rfind('/'));
    const dev_t before = dev_of(parent);
    std::vector<std::string> argv = {plyfs_bin(), img_, mnt_, "-f"};
    for (const auto& o : opts_) {
      argv.push_back("-o");
      argv.push_back(o);
    }
    // PLYFS_TEST_OPTS=opt[,opt...]: every mount of the suite gets these
    // (e.g. nowriteback, to run the suite without the writeback cache).
    if (const char* x = std::getenv("PLYFS_TEST_OPTS"); x && *x) {
      argv.push_back("-o");
      argv.push_back(x);
    }
    pid_ = spawn(argv, log_);
    auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
    for (;;) {
      int st;
      pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        FAIL("plyfs exited before mounting (status " << st << "); log:\n" << log());
      }
      dev_t d = dev_of(mnt_);
      if (d != dev_t(-1) && d != before) break;
      if (Clock::now() > deadline) FAIL("plyfs did not mount in " << timeout_s << " s; log:\n" << log());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    mounted_ = true;
  }

  // Unmounts and waits for the daemon (it commits on the way out). Returns
  // its exit status (128 + signal when killed).
  int unmount(int timeout_s = 120) {
    REQUIRE(pid_ > 0);
    if (mounted_) {
      auto deadline = Clock::now() + std::chrono::seconds(30);
      while (umount2(mnt_.c_str(), 0) != 0) {
        if (errno != EBUSY || Clock::now() > deadline) {
          int e = errno;
          umount2(mnt_.c_str(), MNT_DETACH);
          mounted_ = false;
          FAIL("umount " << mnt_ << ": " << std::strerror(e));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      mounted_ = false;
    }
    int st = 0;
    if (!reap(timeout_s, &st)) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &st, 0);
      pid_ = -1;
      FAIL("plyfs did not exit " << timeout_s << " s after the unmount; log:\n" << log());
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

  // Waits for a daemon that unmounts by itself (after SIGTERM or SIGINT)
  // to exit; returns its exit status as unmount() does.
  int wait_exit(int timeout_s = 60) {
    REQUIRE(pid_ > 0);
    int st = 0;
    if (!reap(timeout_s, &st)) FAIL("plyfs did not exit in " << timeout_s << " s; log:\n" << log());
    mounted_ = false;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

  // SIGKILLs the daemon and clears the dead mount (umount -l).
  void kill9() {
    REQUIRE(pid_ > 0);
    kill(pid_, SIGKILL);
    int st;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    if (mounted_) {
      REQUIRE(umount2(mnt_.c_str(), MNT_DETACH) == 0);
      mounted_ = false;
    }
  }

 private:
  bool reap(int timeout_s, int* status = nullptr) {
    auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
    for (;;) {
      int st;
      pid_t r = waitpid(pid_, &st, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {
        if (status) *status = st;
        pid_ = -1;
        return true;
      }
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  std::string img_, mnt_;
  std::vector<std::string> opts_;
  std::string log_;
  pid_t pid_ = -1;
  bool mounted_ = false;
};

// A temporary directory with an image and its mount. finish() / remount()
// check the daemon's exit status and run fsck on the image.
struct Fixture {
  TempDir tmp;
  std::string img;
  std::unique_ptr<Mount> m;
  std::vector<std::string> opts;

  explicit Fixture(const std::string& size = "256M", std::vector<std::string> o = {})
      : img(tmp / "image"), opts(std::move(o)) {
    ::umask(022);  // the modes the tests expect
    mkfs(img, size, tmp / "mkfs.log");
    mount();
  }
  void mount() {
    m = std::make_unique<Mount>(img, tmp / "mnt", opts);
    m->start();
  }
  // Unmounts, requires a clean exit and a clean image.
  void unmount() {
    int rc = m->unmount();
    INFO("plyfs log:\n" << m->log());
    REQUIRE(rc == 0);
    m.reset();
    require_fsck_clean(img, tmp / "fsck.log");
  }
  void remount() {
    unmount();
    mount();
  }
  std::string operator/(const std::string& s) const { return *m / s; }
  const std::string& root() const { return m->path(); }
};

// Runs plyctl with `args`; its exit status. Its output goes to `out` if
// given, and is shown with the next check (which fails when it should not).
inline int plyctl_status(const Fixture& fx, std::vector<std::string> args, std::string* out = nullptr) {
  args.insert(args.begin(), plyctl_bin());
  const std::string log = fx.tmp / "plyctl.log";
  ::unlink(log.c_str());  // the output of this call alone
  const int rc = run(args, log);
  if (out) *out = slurp(log);
  UNSCOPED_INFO("plyctl " << (args.size() > 1 ? args[1] : "") << ": " << slurp(log));
  return rc;
}

// Runs plyctl, which must succeed.
inline void plyctl(const Fixture& fx, std::vector<std::string> args, std::string* out = nullptr) {
  REQUIRE(plyctl_status(fx, std::move(args), out) == 0);
}

// plyctl's exit status, stdout and stderr apart (plyctl_status merges them):
// for checks that JSON is alone on stdout and errors are one line on stderr.
struct CtlOut {
  int rc;
  std::string out, err;
};
inline CtlOut ctl(const TempDir& tmp, std::vector<std::string> args) {
  args.insert(args.begin(), plyctl_bin());
  const std::string o = tmp / "ctl.out", e = tmp / "ctl.err";
  ::unlink(o.c_str());
  ::unlink(e.c_str());
  std::vector<char*> av;
  for (auto& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int fo = ::open(o.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int fe = ::open(e.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fo < 0 || fe < 0) _exit(126);
    dup2(fo, 1);
    dup2(fe, 2);
    execv(av[0], av.data());
    _exit(127);
  }
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  CtlOut r{WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), slurp(o), slurp(e)};
  std::string line;
  for (size_t i = 1; i < args.size(); i++) line += " " + args[i];
  UNSCOPED_INFO("plyctl" << line << " -> " << r.rc << "\nstdout: " << r.out << "\nstderr: " << r.err);
  return r;
}

// --- file helpers ------------------------------------------------------------

// Threads that are told to stop and joined when the scope ends, also when a
// REQUIRE fails on the way.
struct JoinOnExit {
  std::vector<std::thread>& ts;
  std::atomic<bool>& stop;
  ~JoinOnExit() {
    stop = true;
    for (auto& t : ts)
      if (t.joinable()) t.join();
  }
};

inline std::string errstr(int e) { return std::string(strerrorname_np(e) ? strerrorname_np(e) : "?"); }

// The errno of a call that returned -1, or 0.
#define ERRNO_OF(expr) ((expr) < 0 ? errno : 0)
#define REQUIRE_ERRNO(expr, e)                                              \
  do {                                                                      \
    errno = 0;                                                              \
    auto _r = (expr);                                                       \
    int _e = errno;                                                         \
    INFO(#expr << " returned " << _r << ", errno " << ::plyfs::fusetest::errstr(_e)); \
    REQUIRE(_r == -1);                                                      \
    REQUIRE(::plyfs::fusetest::errstr(_e) == ::plyfs::fusetest::errstr(e)); \
  } while (0)
#define REQUIRE_OK(expr)                                                    \
  do {                                                                      \
    errno = 0;                                                              \
    auto _r = (expr);                                                       \
    int _e = errno;                                                         \
    INFO(#expr << " failed: " << std::strerror(_e));                        \
    REQUIRE(_r >= 0);                                                       \
  } while (0)

// Byte strings compared without printing them whole: where they first
// differ, and their sizes.
inline std::string first_difference(const std::string& a, const std::string& b) {
  if (a == b) return "";
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) i++;
  std::ostringstream s;
  s << "sizes " << a.size() << " and " << b.size() << ", first difference at byte " << i;
  if (i < a.size() && i < b.size())
    s << " (" << int(static_cast<unsigned char>(a[i])) << " vs " << int(static_cast<unsigned char>(b[i])) << ")";
  return s.str();
}
#define REQUIRE_SAME(a, b)                                                              \
  do {                                                                                  \
    const std::string _d = ::plyfs::fusetest::first_difference(std::string(a), std::string(b)); \
    INFO(#a " vs " #b ": " << _d);                                                      \
    REQUIRE(_d.empty());                                                                \
  } while (0)

inline void write_file(const std::string& p, const std::string& data, int flags = O_TRUNC,
                       mode_t mode = 0644) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | flags, mode);
  INFO("open " << p << ": " << std::strerror(errno));
  REQUIRE(fd >= 0);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    INFO("write " << p << ": " << std::strerror(errno));
    REQUIRE(n > 0);
    done += size_t(n);
  }
  REQUIRE(::close(fd) == 0);
}

// For threads other than the test's own, which must not use Catch2's
// assertions (not thread-safe in v3.7: two threads asserting at once
// corrupt its state): false, or nothing, on any error.
inline bool put_file(const std::string& p, const std::string& data) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  bool ok = true;
  for (size_t done = 0; ok && done < data.size();) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    ok = n > 0;
    if (ok) done += size_t(n);
  }
  return ::close(fd) == 0 && ok;
}
inline std::optional<std::string> get_file(const std::string& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      ::close(fd);
      return std::nullopt;
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

inline std::string read_file(const std::string& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  INFO("open " << p << ": " << std::strerror(errno));
  REQUIRE(fd >= 0);
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    INFO("read " << p << ": " << std::strerror(errno));
    REQUIRE(n >= 0);
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

inline void pwrite_all(int fd, const void* p, size_t n, off_t off) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t w = ::pwrite(fd, c, n, off);
    INFO("pwrite at " << off << ": " << std::strerror(errno));
    REQUIRE(w > 0);
    c += w;
    n -= size_t(w);
    off += w;
  }
}
inline std::string pread_n(int fd, size_t n, off_t off) {
  std::string s(n, '\0');
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, s.data() + done, n - done, off + off_t(done));
    INFO("pread at " << off + off_t(done) << ": " << std::strerror(errno));
    REQUIRE(r >= 0);
    if (r == 0) break;
    done += size_t(r);
  }
  s.resize(done);
  return s;
}

inline struct stat lstat_of(const std::string& p) {
  struct stat st;
  INFO("lstat " << p << ": " << std::strerror(errno));
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st;
}

inline std::string random_bytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(s.data() + i, &v, 8);
  }
  for (; i < n; i++) s[i] = char(rng());
  return s;
}

// Names in a directory, without . and ..
inline std::vector<std::string> list_dir(const std::string& p) {
  std::vector<std::string> out;
  DIR* d = opendir(p.c_str());
  INFO("opendir " << p << ": " << std::strerror(errno));
  REQUIRE(d);
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace plyfs::fusetest
