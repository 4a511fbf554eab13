// The control requests `send` and `receive` (control.h; format.md#send-stream):
// a branch of the mounted image written as a stream, or a stream received as
// a new branch, by the daemon that holds the image. The stream is a file
// descriptor of the calling plyctl, taken with pidfd_getfd (or opened
// through /proc/PID/fd/N) by the caller's pid as the kernel gives it with the
// request (fuse_req_ctx), so a caller names only its own descriptors; and
// only root or the mount's owner may send or receive, as they alone change
// branches.
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <string>

#include "daemon.h"
#include "fs/send.h"
#include "snap/model.h"
#include "util/text.h"

namespace plyfs::daemon {

namespace {

using Json = nlohmann::ordered_json;

// The caller's descriptor "fd": the very open file (pidfd_getfd, Linux
// 5.6: its offset and flags shared, a socket or pipe as well as a file),
// else the same file opened anew through /proc with `flags`. The caller
// waits in its ioctl meanwhile, so its pid names it.
Result<int> caller_fd(const Json& req, pid_t caller, int flags) {
  if (!req.contains("fd") || !req["fd"].is_number_unsigned() || req["fd"].get<uint64_t>() > 1u << 30)
    return Error::invalid("\"fd\" must be the caller's file descriptor of the stream");
  if (caller <= 0) return Error::invalid("no caller to take the stream from");
  const int theirs = req["fd"].get<int>();
  const int pidfd = int(::syscall(SYS_pidfd_open, caller, 0));
  if (pidfd >= 0) {
    const int fd = int(::syscall(SYS_pidfd_getfd, pidfd, theirs, 0));
    const int e = errno;
    ::close(pidfd);
    if (fd >= 0) {
      // Its access mode must allow what the request does.
      const int acc = ::fcntl(fd, F_GETFL) & O_ACCMODE;
      if (acc == O_RDWR || acc == (flags & O_ACCMODE)) return fd;
      ::close(fd);
      return Error::io(EBADF, std::string("the caller's stream is not open for ") +
                                  ((flags & O_ACCMODE) == O_RDONLY ? "reading" : "writing"));
    }
    if (e == EBADF) return Error::io(EBADF, "the caller has no file descriptor " + std::to_string(theirs));
  }
  const std::string path = "/proc/" + std::to_string(caller) + "/fd/" + std::to_string(theirs);
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Error::sys(errno, "cannot open the caller's stream");
  return fd;
}

struct Fd {
  int fd;
  ~Fd() { ::close(fd); }
};

}  // namespace

Result<Json> send_online(const Json& req, pid_t caller) {
  const BranchMeta b = PLY_TRY(arg_branch(req, "branch"));
  SendOptions o;
  std::optional<BranchMeta> parent;
  if (req.contains("parent")) {
    parent = PLY_TRY(arg_branch(req, "parent"));
    o.parent = parent->tree;
  }
  if (req.contains("zstd")) {
    if (!req["zstd"].is_number_unsigned() || req["zstd"].get<uint64_t>() > 19)
      return Error::invalid("\"zstd\" must be a level from 0 to 19");
    o.zstd_level = req["zstd"].get<int>();
  }
  Fd out{PLY_TRY(caller_fd(req, caller, O_WRONLY))};
  RunningOp op("send", "sending " + shown(b.name), "bytes");
  o.progress = [&](const SendStats& s) { op.update(s.stream_bytes, s.fraction); };
  // A read-only branch (a snapshot) never changes, and ctl_mu keeps it from
  // being deleted meanwhile; a writable one is sent with every operation
  // of the mount held still, so that the stream is one state of it.
  auto run = [&]() -> Result<SendStats> { return send_branch(*g->vol, b.tree, out.fd, o); };
  Result<SendStats> st = Error::invalid("");
  if (b.read_only && (!parent || parent->read_only)) {
    st = run();
  } else {
    PLY_CHECK(g->u->hold_still([&]() -> Result<void> {
      st = run();
      return ok();
    }));
  }
  if (!st) return st.error();
  auto bs = PLY_TRY(model::Branches::read(*g->vol));
  return model::sent(bs, b, parent, *st, req.contains("output") ? PLY_TRY(model::get_name(req, "output")) : "-",
                     o.zstd_level);
}

Result<Json> receive_online(const Json& req, pid_t caller) {
  if (g->read_only) return Error::io(EROFS, "the mount is read-only");
  ReceiveOptions o;
  if (req.contains("name")) {
    o.name = PLY_TRY(model::get_name(req, "name"));
    PLY_CHECK(check_branch_name(o.name));
  }
  o.check_name = [](const std::string& n) { return check_branch_name(n); };
  Fd in{PLY_TRY(caller_fd(req, caller, O_RDONLY))};
  RunningOp op("receive", "receiving", "bytes");
  o.progress = [&](const ReceiveStats& s) { op.update(s.stream_bytes, 0); };
  Received r = PLY_TRY(receive_branch(*g->vol, in.fd, o));
  auto bs = PLY_TRY(model::Branches::read(*g->vol));
  return model::received(bs, r);
}

}  // namespace plyfs::daemon
