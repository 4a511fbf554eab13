// An nbdkit server on a Unix socket in a temporary directory, for the tests
// of images on NBD (tests/lib/nbd_test.cpp, tests/fuse/nbd_test.cpp):
// nothing on the network. The server dies with the test (--exit-with-parent)
// and is stopped by the destructor.
#pragma once

#include <catch2/catch_test_macros.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace plyfs::test {

// nbdkit's path, or "" when it is not installed.
inline std::string nbdkit_path() {
  for (const char* d : {"/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/bin", "/usr/local/sbin"}) {
    std::string p = std::string(d) + "/nbdkit";
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

class NbdServer {
 public:
  // args: the plugin and its parameters, after nbdkit's own options, e.g.
  // {"memory", "1G"} or {"--filter=error", "memory", "1G", "error-pwrite=EIO"}.
  // dir: where the socket and the log go.
  NbdServer(const std::string& dir, std::vector<std::string> args, const std::string& name = "nbd")
      : sock_(dir + "/" + name + ".sock"), log_(dir + "/" + name + ".log"),
        pidfile_(dir + "/" + name + ".pid"), args_(std::move(args)) {
    start();
  }
  ~NbdServer() { stop(SIGTERM); }
  NbdServer(const NbdServer&) = delete;
  NbdServer& operator=(const NbdServer&) = delete;

  std::string uri() const { return "nbd+unix:///?socket=" + sock_; }
  const std::string& socket() const { return sock_; }
  pid_t pid() const { return pid_; }

  // Starts it again with other arguments (the same socket).
  void restart(std::vector<std::string> args) {
    stop(SIGTERM);
    args_ = std::move(args);
    start();
  }

  // Stops the server (SIGKILL: gone mid-request) and waits for it.
  void stop(int sig = SIGKILL) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int st;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    ::unlink(sock_.c_str());
  }

 private:
  void start() {
    const std::string bin = nbdkit_path();
    REQUIRE(!bin.empty());
    ::unlink(sock_.c_str());
    ::unlink(pidfile_.c_str());
    std::vector<std::string> argv = {bin, "--unix", sock_, "--foreground", "--exit-with-parent",
                                     "--pidfile", pidfile_};
    argv.insert(argv.end(), args_.begin(), args_.end());
    std::vector<char*> av;
    for (auto& a : argv) av.push_back(a.data());
    av.push_back(nullptr);
    const char* log = log_.c_str();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      const int fd = ::open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execv(av[0], av.data());
      ::_exit(127);
    }
    // nbdkit writes its pid file once it listens.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      struct stat st;
      if (::stat(pidfile_.c_str(), &st) == 0 && st.st_size > 0) break;
      int status;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL("nbdkit exited at start; its log: " << log_);
      }
      if (std::chrono::steady_clock::now() > deadline) FAIL("nbdkit did not start; its log: " << log_);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  std::string sock_, log_, pidfile_;
  std::vector<std::string> args_;
  pid_t pid_ = -1;
};

}  // namespace plyfs::test
