// See kernel_io.h. The structures are the kernel's (<linux/fuse.h>); every
// field read is checked against the length the read returned.
#include "kernel_io.h"

#include "uring.h"

#include <linux/fuse.h>
#include <sys/uio.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
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
std::atomic<bool> uring_offered{false};   // the kernel offered FUSE_OVER_IO_URING
std::atomic<bool> init_replied{false};
bool uring_wanted = false;                // -o uring (set before the mount)
unsigned uring_depth = 8;
fuse_session* session = nullptr;

// FUSE_OVER_IO_URING is bit 41 of the INIT flags: bit 9 of flags2.
constexpr uint32_t kUringFlag2 = 1u << (41 - 32);

thread_local bool tl_kill_setid = false;  // the request this thread handles

template <class T>
bool field(const void* buf, size_t len, size_t off, T& out) {
  if (len < off + sizeof(T)) return false;
  std::memcpy(&out, static_cast<const std::byte*>(buf) + off, sizeof(T));
  return true;
}

}  // namespace

void uring::note_request(const void* buf, size_t len) {
  tl_kill_setid = false;
  fuse_in_header h;
  if (!field(buf, len, 0, h)) return;
  const size_t arg = sizeof(fuse_in_header);
  switch (h.opcode) {
    case FUSE_INIT: {
      uint32_t flags = 0;
      if (field(buf, len, arg + offsetof(fuse_init_in, flags), flags))
        init_offered = (flags & FUSE_HANDLE_KILLPRIV_V2) != 0;
      uint32_t flags2 = 0;
      if ((flags & FUSE_INIT_EXT) && field(buf, len, arg + offsetof(fuse_init_in, flags2), flags2))
        uring_offered = (flags2 & kUringFlag2) != 0;
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

namespace {

std::atomic<unsigned> spin_us{0};
std::atomic<bool> spinning{false};  // one spinner at a time

uint64_t now_us() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return uint64_t(t.tv_sec) * 1000000 + uint64_t(t.tv_nsec) / 1000;
}

// Polls (without taking the request: another thread may) until a request
// is ready or the time is up; the read below then finds it, or sleeps.
void spin_for_request(int fd) {
  const unsigned budget = spin_us.load(std::memory_order_relaxed);
  if (!budget || spinning.exchange(true)) return;
  const uint64_t end = now_us() + budget;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) != 0 || now_us() >= end) break;
  }
  spinning.store(false);
}

ssize_t kio_read(int fd, void* buf, size_t len, void*) {
  spin_for_request(fd);
  const ssize_t n = ::read(fd, buf, len);
  if (n > 0) uring::note_request(buf, size_t(n));
  return n;
}

// libfuse sends a reply as [fuse_out_header, argument...]; the INIT reply's
// argument is one fuse_init_out. Only that reply is changed, in a copy.
// Replies to requests taken from an io_uring queue go back through it.
ssize_t kio_writev(int fd, struct iovec* iov, int count, void*) {
  ssize_t done;
  if (uring::reply(iov, count, &done)) return done;
  fuse_init_out out;
  const uint64_t want = init_unique.load();
  const bool ask_uring = uring_wanted && uring_offered.load();
  static std::atomic<bool> told{false};
  if (want && uring_wanted && !uring_offered.load() && !told.exchange(true)) uring::not_offered();
  if (want && !init_replied.load() && (init_offered.load() || ask_uring) && count >= 2 &&
      iov[0].iov_len >= sizeof(fuse_out_header) &&
      iov[1].iov_len >= offsetof(fuse_init_out, flags) + sizeof(uint32_t) &&
      iov[1].iov_len <= sizeof out) {
    fuse_out_header oh;
    std::memcpy(&oh, iov[0].iov_base, sizeof oh);
    if (oh.unique == want && oh.error == 0) {
      std::memset(&out, 0, sizeof out);
      std::memcpy(&out, iov[1].iov_base, iov[1].iov_len);
      if (init_offered.load()) out.flags |= FUSE_HANDLE_KILLPRIV_V2;
      const bool has_flags2 = iov[1].iov_len >= offsetof(fuse_init_out, flags2) + sizeof(uint32_t);
      const bool uring = ask_uring && has_flags2;
      if (uring) {
        out.flags |= FUSE_INIT_EXT;
        out.flags2 |= kUringFlag2;
      }
      iov[1].iov_base = &out;
      const ssize_t r = ::writev(fd, iov, count);
      if (r >= 0) {
        init_replied = true;
        negotiated = init_offered.load();
        // The kernel takes a request's payload (a write's data, a read's
        // reply) in one buffer of at least max_write and max_pages pages.
        if (uring) {
          // The rings serve the requests; /dev/fuse carries only forgets
          // and interrupts, not worth a spinning thread.
          spin_us = 0;
          size_t payload = std::max<size_t>(out.max_write, 8192);
          if (out.flags & FUSE_MAX_PAGES) payload = std::max<size_t>(payload, size_t(out.max_pages) * 4096);
          uring::start(session, fd, payload + 4096, uring_depth);
        }
      }
      return r;
    }
  }
  return ::writev(fd, iov, count);
}

}  // namespace

void set_spin(unsigned microseconds) { spin_us = microseconds; }

void want_uring(bool on, unsigned depth) {
  uring_wanted = on;
  uring_depth = depth ? depth : 8;
}

bool install_kernel_io(fuse_session* se) {
  session = se;
  static const fuse_custom_io io = {kio_writev, kio_read, nullptr, nullptr};
  return fuse_session_custom_io(se, &io, fuse_session_fd(se)) == 0;
}

bool killpriv_v2() { return negotiated.load(); }
bool request_kills_setid() { return tl_kill_setid; }

}  // namespace plyfs
