// See kernel_io.h. The structures are the kernel's (<linux/fuse.h>); every
// field read is checked against the length the read returned.
#include "kernel_io.h"

#include <linux/fuse.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace plyfs {
namespace {

// The INIT exchange happens once, before any other request is read, on
// whichever thread reads it; the atomics order it for the others.
std::atomic<uint64_t> init_unique{0};     // 0: no INIT seen yet
std::atomic<bool> init_offered{false};    // the kernel offered KILLPRIV_V2
std::atomic<bool> negotiated{false};      // and the reply took it

thread_local bool tl_kill_setid = false;  // the request this thread handles

template <class T>
bool field(const void* buf, size_t len, size_t off, T& out) {
  if (len < off + sizeof(T)) return false;
  std::memcpy(&out, static_cast<const std::byte*>(buf) + off, sizeof(T));
  return true;
}

void note_request(const void* buf, size_t len) {
  tl_kill_setid = false;
  fuse_in_header h;
  if (!field(buf, len, 0, h)) return;
  const size_t arg = sizeof(fuse_in_header);
  switch (h.opcode) {
    case FUSE_INIT: {
      uint32_t flags = 0;
      if (field(buf, len, arg + offsetof(fuse_init_in, flags), flags))
        init_offered = (flags & FUSE_HANDLE_KILLPRIV_V2) != 0;
      init_unique = h.unique;
      break;
    }
    case FUSE_WRITE: {
      uint32_t wf = 0;
      if (field(buf, len, arg + offsetof(fuse_write_in, write_flags), wf))
        tl_kill_setid = (wf & FUSE_WRITE_KILL_SUIDGID) != 0;
      break;
    }
    case FUSE_SETATTR: {
      uint32_t valid = 0;
      if (field(buf, len, arg + offsetof(fuse_setattr_in, valid), valid))
        tl_kill_setid = (valid & FATTR_KILL_SUIDGID) != 0;
      break;
    }
    case FUSE_OPEN: {
      uint32_t of = 0;
      if (field(buf, len, arg + offsetof(fuse_open_in, open_flags), of))
        tl_kill_setid = (of & FUSE_OPEN_KILL_SUIDGID) != 0;
      break;
    }
    default:
      break;
  }
}

ssize_t kio_read(int fd, void* buf, size_t len, void*) {
  const ssize_t n = ::read(fd, buf, len);
  if (n > 0) note_request(buf, size_t(n));
  return n;
}

// libfuse sends a reply as [fuse_out_header, argument...]; the INIT reply's
// argument is one fuse_init_out. Only that reply is changed, in a copy.
ssize_t kio_writev(int fd, struct iovec* iov, int count, void*) {
  fuse_init_out out;
  const uint64_t want = init_unique.load();
  if (want && !negotiated.load() && init_offered.load() && count >= 2 &&
      iov[0].iov_len >= sizeof(fuse_out_header) &&
      iov[1].iov_len >= offsetof(fuse_init_out, flags) + sizeof(uint32_t) &&
      iov[1].iov_len <= sizeof out) {
    fuse_out_header oh;
    std::memcpy(&oh, iov[0].iov_base, sizeof oh);
    if (oh.unique == want && oh.error == 0) {
      std::memcpy(&out, iov[1].iov_base, iov[1].iov_len);
      out.flags |= FUSE_HANDLE_KILLPRIV_V2;
      iov[1].iov_base = &out;
      const ssize_t r = ::writev(fd, iov, count);
      if (r >= 0) negotiated = true;
      return r;
    }
  }
  return ::writev(fd, iov, count);
}

}  // namespace

bool install_kernel_io(fuse_session* se) {
  static const fuse_custom_io io = {kio_writev, kio_read, nullptr, nullptr};
  return fuse_session_custom_io(se, &io, fuse_session_fd(se)) == 0;
}

bool killpriv_v2() { return negotiated.load(); }
bool request_kills_setid() { return tl_kill_setid; }

}  // namespace plyfs
