// An nbdkit server on a Unix socket in a temporary directory, or on TCP on
// the loopback address (with TLS or without), for the tests of images on
// NBD (tests/lib/nbd_test.cpp, tests/fuse/nbd_test.cpp): nothing on the
// network. The server dies with the test (--exit-with-parent)
// and is stopped by the destructor.
#pragma once

#include <catch2/catch_test_macros.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
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

// A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick).
inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Where an NbdServer listens: a Unix socket in its directory, or TCP on
// 127.0.0.1 (never another address), then with TLS when `tls_psk` names a
// PSK file (nbdkit --tls=require: a client without TLS is refused).
struct NbdListen {
  bool tcp = false;
  std::string tls_psk;   // "username:hexkey" lines, as nbdkit --tls-psk takes
  std::string tls_user;  // the username the URI gives
};

class NbdServer {
 public:
  using Listen = NbdListen;
  // args: the plugin and its parameters, after nbdkit's own options, e.g.
  // {"memory", "1G"} or {"--filter=error", "memory", "1G", "error-pwrite=EIO"}.
  // dir: where the socket and the log go.
  NbdServer(const std::string& dir, std::vector<std::string> args, const std::string& name = "nbd",
            Listen listen = {})
      : sock_(dir + "/" + name + ".sock"), log_(dir + "/" + name + ".log"),
        pidfile_(dir + "/" + name + ".pid"), args_(std::move(args)), listen_(std::move(listen)) {
    if (listen_.tcp) port_ = free_loopback_port();
    start();
  }
  ~NbdServer() { stop(SIGTERM); }
  NbdServer(const NbdServer&) = delete;
  NbdServer& operator=(const NbdServer&) = delete;

  std::string uri() const {
    if (!listen_.tcp) return "nbd+unix:///?socket=" + sock_;
    if (listen_.tls_psk.empty()) return "nbd://127.0.0.1:" + std::to_string(port_) + "/";
    return "nbds://" + listen_.tls_user + "@127.0.0.1:" + std::to_string(port_) + "/?tls-psk-file=" + listen_.tls_psk;
  }
  int port() const { return port_; }
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
    std::vector<std::string> argv = {bin, "--foreground", "--exit-with-parent", "--pidfile", pidfile_};
    if (listen_.tcp) {
      argv.insert(argv.end(), {"--ipaddr", "127.0.0.1", "--port", std::to_string(port_)});
      if (!listen_.tls_psk.empty()) argv.insert(argv.end(), {"--tls=require", "--tls-psk=" + listen_.tls_psk});
    } else {
      argv.insert(argv.end(), {"--unix", sock_});
    }
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
  Listen listen_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace plyfs::test
