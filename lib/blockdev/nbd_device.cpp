#include "blockdev/nbd_device.h"
#include "blockdev/ranges.h"

#include <libnbd.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <optional>
#include <mutex>
#include <thread>

namespace plyfs {

namespace {

// A few connections are enough to keep nbdkit's worker threads busy; each
// also carries many requests at once (N2).
constexpr size_t kMultiConns = 4;
// libnbd refuses requests over 64 MiB; servers often stop at 32 MiB.
constexpr uint64_t kMaxRequest = 32u << 20;
// NBD_CMD_TRIM's length is 32 bits.
constexpr uint64_t kMaxTrim = 1u << 30;

bool power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// The connection is gone (server killed, network down): the request's
// fate is unknown, which the layers above know as EIO (D4, D5).
int gone_to_eio(int e) {
  switch (e) {
    case 0: case ENOTCONN: case ECONNRESET: case EPIPE: case ESHUTDOWN: case ECONNABORTED:
    case ETIMEDOUT: case EPROTO: case EBADMSG:
      return EIO;
    default:
      return e;
  }
}

Error nbd_error(const std::string& what) {
  const int e = nbd_get_errno();
  const char* msg = nbd_get_error();
  return Error::io(gone_to_eio(e), what + ": " + (msg && *msg ? msg : "libnbd error"));
}

// What the requests of one call wait for: `left` commands, the first error.
struct Pending {
  int left = 0;
  int err = 0;
  std::condition_variable cv;  // its thread, woken when done or made the poller
};

// A command's callbacks (N1: the connection's mutex is held). Its end is
// counted by `.free`, which libnbd calls exactly once for every command
// handed to it: also when the submit fails, before or after the command
// was queued (libnbd 1.14 may return -1 for a command it queued and later
// retires, completion callback and all). The completion callback, which
// may or may not run then, only keeps the error.
int on_done(void* user, int* error) {
  auto* p = static_cast<Pending*>(user);
  if (*error != 0 && p->err == 0) p->err = *error;
  return 1;  // retire the command: nobody asks for it by cookie
}
void on_free(void* user) { static_cast<Pending*>(user)->left--; }

}  // namespace

struct NbdDevice::AsyncWrite {
  NbdDevice* dev;
  Conn* conn;
  uint64_t seq, offset, len;
  std::vector<std::byte> data;  // a copy: the caller's buffer is theirs again at once
  int pieces;                         // requests unanswered, plus one while they are submitted
  int err;
};

struct NbdDevice::Conn {
  nbd_handle* h = nullptr;
  int wake_fd = -1;
  std::mutex mu;
  std::vector<Pending*> waiters;  // the calls waiting on this connection
  bool polling = false;   // N2
  unsigned poll_dir = 0;  // what the poller waits for
  // Write-back: the pieces of writes in flight, which the drainer thread
  // waits for (taking its turn at polling, N2) whenever there are any.
  Pending async;
  std::condition_variable drain_cv;  // writes were submitted, or stop
  bool stop = false;
  std::thread drainer;

  ~Conn() {
    if (h) nbd_close(h);  // no request is in flight: the device is being destroyed
    if (wake_fd >= 0) ::close(wake_fd);
  }

  // A piece of a write answered, and its end (N1: mu held; on_done's
  // comment says why the end is counted by `.free`).
  static int on_write(void* user, int* error) {
    auto* w = static_cast<AsyncWrite*>(user);
    if (*error != 0 && w->err == 0) w->err = *error;
    return 1;
  }
  static void on_write_free(void* user) {
    auto* w = static_cast<AsyncWrite*>(user);
    w->conn->async.left--;
    if (--w->pieces == 0) w->dev->write_done(w);
  }

  void drain_loop(NbdDevice& dev) {
    std::unique_lock lk(mu);
    while (!stop) {
      if (async.left == 0) {
        drain_cv.wait(lk);
        continue;
      }
      wait(async, lk);
      if (async.left > 0) {
        // The connection died with writes unanswered, which N3 says libnbd
        // never leaves: nothing will answer them; the device fails rather
        // than wait forever.
        {
          std::lock_guard wl(dev.wmu_);
          dev.abandoned_ = true;
          if (!dev.failed_) dev.failed_ = EIO, dev.failed_msg_ = "the NBD server went away with writes unanswered";
        }
        dev.wcv_.notify_all();
        drain_cv.wait(lk, [&] { return stop; });
      }
    }
  }

  // After a submit, with mu held: a poller waiting only to read must also
  // wait to write now that a request is queued for the socket (N2).
  void kick() {
    if (!polling) return;
    if ((nbd_aio_get_direction(h) & ~poll_dir) != 0) {
      const uint64_t one = 1;
      if (::write(wake_fd, &one, sizeof one) < 0) {}  // a full counter wakes it anyway
    }
  }

  // Waits, with `lk` on mu, until every command of `p` has completed.
  // Each waiter is woken alone: when its commands are done, or to take
  // over the polling from a poller whose commands are (no thundering herd).
  void wait(Pending& p, std::unique_lock<std::mutex>& lk) {
    waiters.push_back(&p);
    while (p.left > 0) {
      if (nbd_aio_is_dead(h) || nbd_aio_is_closed(h)) {
        // libnbd retired the commands when the connection died (N3); this
        // guards against waiting on a socket nobody will answer.
        if (p.err == 0) p.err = EIO;
        break;
      }
      if (polling) {
        p.cv.wait(lk);
        continue;
      }
      poll_once(lk);
    }
    waiters.erase(std::find(waiters.begin(), waiters.end(), &p));
    if (!polling)
      for (Pending* w : waiters)
        if (w->left > 0) {
          w->cv.notify_one();
          break;
        }
  }

  void poll_once(std::unique_lock<std::mutex>& lk) {
    polling = true;
    poll_dir = nbd_aio_get_direction(h);
    pollfd fds[2] = {{nbd_aio_get_fd(h), 0, 0}, {wake_fd, POLLIN, 0}};
    if (poll_dir & LIBNBD_AIO_DIRECTION_READ) fds[0].events |= POLLIN;
    if (poll_dir & LIBNBD_AIO_DIRECTION_WRITE) fds[0].events |= POLLOUT;
    lk.unlock();
    const int r = ::poll(fds, 2, -1);
    lk.lock();
    if (r > 0) {
      if (fds[1].revents & POLLIN) {
        uint64_t n;
        if (::read(wake_fd, &n, sizeof n) < 0) {}
      }
      const short ev = fds[0].revents;
      // A failed notify leaves the handle dead, its commands retired (N3).
      if ((ev & (POLLIN | POLLHUP | POLLERR)) && (poll_dir & LIBNBD_AIO_DIRECTION_READ))
        (void)nbd_aio_notify_read(h);
      else if ((ev & (POLLOUT | POLLHUP | POLLERR)) && (poll_dir & LIBNBD_AIO_DIRECTION_WRITE))
        (void)nbd_aio_notify_write(h);
    }
    polling = false;
    for (Pending* w : waiters)
      if (w->left == 0) w->cv.notify_one();
  }
};

namespace {

Result<std::unique_ptr<NbdDevice::Conn>> connect(const std::string& uri) {
  auto c = std::make_unique<NbdDevice::Conn>();
  c->h = nbd_create();
  if (!c->h) return nbd_error("cannot create an NBD handle");
  c->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (c->wake_fd < 0) return Error::sys(errno, "eventfd");
  if (nbd_supports_uri(c->h) != 1)
    return Error::io(EOPNOTSUPP, "this libnbd cannot connect to URIs (built without libxml2)");
  // The URI is the user's own (a command line, a mount option), not a
  // remote party's: its TLS key or certificate files (tls-psk-file=,
  // tls-certificates=) may be read, as nbdinfo and nbdcopy allow.
  if (nbd_set_uri_allow_local_file(c->h, true) != 0) return nbd_error("cannot allow the URI's TLS files");
  if (nbd_connect_uri(c->h, uri.c_str()) != 0) {
    const int e = nbd_get_errno();
    const char* msg = nbd_get_error();
    return Error::io(e ? e : EIO, "cannot connect to " + uri + ": " + (msg ? msg : "libnbd error"));
  }
  return c;
}

}  // namespace

Result<std::unique_ptr<NbdDevice>> NbdDevice::open(const std::string& uri, bool read_only) {
  std::unique_ptr<NbdDevice> d(new NbdDevice());
  d->uri_ = uri;
  d->read_only_ = read_only;
  d->conns_.push_back(PLY_TRY(connect(uri)));
  nbd_handle* h = d->conns_[0]->h;

  if (!read_only && nbd_is_read_only(h) == 1)
    return Error::io(EROFS, uri + " is a read-only export: open it read-only");
  // Without NBD_CMD_FLUSH nothing could ever be known durable (D3): a
  // commit would claim what the server may still lose.
  if (!read_only && nbd_can_flush(h) != 1)
    return Error::io(EOPNOTSUPP, "the NBD server of " + uri +
                                     " cannot flush, so no commit could be made durable: "
                                     "refusing to open it read-write");
  const int64_t size = nbd_get_size(h);
  if (size < 0) return nbd_error("cannot get the size of " + uri);
  const int64_t min = nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
  const int64_t pref = nbd_get_block_size(h, LIBNBD_SIZE_PREFERRED);
  const int64_t max = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);
  d->lss_ = power_of_two(min) && min >= 512 && min <= 65536 ? uint32_t(min) : 512;
  d->pss_ = power_of_two(pref) && pref >= d->lss_ && pref <= 65536 ? uint32_t(pref) : d->lss_;
  d->max_request_ = max >= d->lss_ ? std::min<uint64_t>(uint64_t(max) / d->lss_ * d->lss_, kMaxRequest)
                                   : kMaxRequest;
  d->size_ = uint64_t(size) / d->lss_ * d->lss_;
  d->can_trim_ = !read_only && nbd_can_trim(h) == 1;

  // More connections only where the server promises that a flush on one
  // covers writes completed on all; a server that refuses the extra ones
  // (a connection limit) leaves the ones it took.
  if (nbd_can_multi_conn(h) == 1) {
    while (d->conns_.size() < kMultiConns) {
      auto c = connect(uri);
      if (!c) break;
      d->conns_.push_back(std::move(*c));
    }
  }
  if (!read_only)
    for (auto& c : d->conns_) c->drainer = std::thread([c = c.get(), dev = d.get()] { c->drain_loop(*dev); });
  return d;
}

NbdDevice::~NbdDevice() {
  // What is in flight is answered first (a write the caller was told had
  // gone, D2 lets it be lost, but a server that answers should get it).
  send_staged();
  {
    std::unique_lock wl(wmu_);
    wcv_.wait(wl, [&] { return inflight_bytes_ == 0 || abandoned_; });
  }
  for (auto& c : conns_) {
    {
      std::lock_guard lk(c->mu);
      c->stop = true;
      const uint64_t one = 1;
      if (::write(c->wake_fd, &one, sizeof one) < 0) {}  // a poller's poll() returns
    }
    c->drain_cv.notify_all();
    if (c->drainer.joinable()) c->drainer.join();
  }
}

bool NbdDevice::overlaps_locked(uint64_t offset, uint64_t len) const {
  return overlaps_any(inflight_, offset, len);  // disjoint (N4)
}

void NbdDevice::wait_unshadowed(uint64_t offset, uint64_t len) {
  std::unique_lock wl(wmu_);
  for (;;) {
    if (staged_ && staged_->offset < offset + len && offset < staged_->offset + staged_->len) {
      auto s = take_staged_locked();  // N6: bytes someone waits for go out now
      wl.unlock();
      (void)send(std::move(*s));  // an error is failed_'s
      wl.lock();
      continue;
    }
    if (abandoned_ || !overlaps_locked(offset, len)) return;
    wcv_.wait(wl);
  }
}

Error NbdDevice::failed_error() const {
  return Error::io(failed_, failed_msg_ + " (no write or flush of " + uri_ + " succeeds after it: remount)");
}

void NbdDevice::write_done(AsyncWrite* w) {
  {
    std::lock_guard wl(wmu_);  // N5: after the connection's mutex
    inflight_.erase(w->offset);
    inflight_seqs_.erase(w->seq);
    inflight_bytes_ -= w->len;
    if (w->err != 0 && failed_ == 0) {
      failed_ = gone_to_eio(w->err);
      failed_msg_ = "a write at byte " + std::to_string(w->offset) + " of " + uri_ + " failed: " +
                    (w->err == ENOTCONN ? std::string("the NBD server went away") : std::strerror(w->err));
    }
  }
  wcv_.notify_all();
  delete w;
}

NbdDevice::Conn& NbdDevice::pick() {
  return *conns_[next_.fetch_add(1, std::memory_order_relaxed) % conns_.size()];
}

// Issues the whole request on one connection, in pieces the server takes,
// all in flight at once, and waits for them.
Result<void> NbdDevice::submit(Op op, uint64_t offset, std::byte* buf, uint64_t len) {
  Conn& c = pick();
  Pending p;
  std::unique_lock lk(c.mu);
  const uint64_t piece = op == Op::kTrim ? kMaxTrim : max_request_;
  uint64_t done = 0;
  int submit_errno = 0;
  std::string submit_msg;
  do {
    const uint64_t n = std::min(piece, len - done);
    const nbd_completion_callback cb = {.callback = on_done, .user_data = &p, .free = on_free};
    p.left++;  // on_free's, whatever happens
    int64_t cookie = -1;
    switch (op) {
      case Op::kRead: cookie = nbd_aio_pread(c.h, buf + done, n, offset + done, cb, 0); break;
      case Op::kTrim: cookie = nbd_aio_trim(c.h, n, offset + done, cb, 0); break;
      case Op::kFlush: cookie = nbd_aio_flush(c.h, cb, 0); break;
    }
    if (cookie < 0) {  // not submitted, or queued on a connection that died: on_free counts it
      const char* msg = nbd_get_error();
      submit_msg = msg ? msg : "libnbd error";
      submit_errno = gone_to_eio(nbd_get_errno());
      if (nbd_aio_is_dead(c.h) || nbd_aio_is_closed(c.h)) {  // EINVAL from libnbd: not the caller's
        submit_errno = EIO;
        submit_msg = "the NBD server went away (" + submit_msg + ")";
      }
      break;
    }
    done += n;
  } while (done < len);
  c.kick();
  c.wait(p, lk);  // also for the pieces submitted before a failed one (N3)
  const char* what = op == Op::kRead ? "read" : op == Op::kTrim ? "trim" : "flush";
  const std::string where = op == Op::kFlush ? "" : " at byte " + std::to_string(offset);
  if (submit_errno)
    return Error::io(submit_errno, std::string(what) + where + " of " + uri_ + " failed: " + submit_msg);
  if (p.err) {
    const int e = gone_to_eio(p.err);
    return Error::io(e, std::string(what) + where + " of " + uri_ + " failed: " +
                            (p.err == ENOTCONN ? "the NBD server went away" : std::strerror(p.err)));
  }
  return ok();
}

Result<void> NbdDevice::read(uint64_t offset, std::span<std::byte> out) {
  PLY_CHECK(check_range(*this, offset, out.size()));
  if (out.empty()) return ok();
  wait_unshadowed(offset, out.size());  // N4: it sees the write before it
  return submit(Op::kRead, offset, out.data(), out.size());
}

Result<void> NbdDevice::write(uint64_t offset, std::span<const std::byte> in) {
  if (read_only_) return Error::io(EROFS, uri_ + " is open read-only");
  PLY_CHECK(check_range(*this, offset, in.size()));
  if (in.empty()) return ok();
  const uint64_t len = in.size();
  std::optional<Staged> out;  // a staged run this write ends, sent once wmu_ is let go
  auto send_out = [&] {
    if (out) (void)send(std::move(*out));  // an error is failed_'s, for the next flush (D4)
    out.reset();
  };
  std::unique_lock wl(wmu_);
  for (;;) {
    if (failed_) return failed_error();
    // N6: the bytes right after the staged run join it.
    if (staged_ && offset == staged_->offset + staged_->len && staged_->len + len <= kStageBytes &&
        !overlaps_locked(offset, len) && inflight_bytes_ + len <= kWriteBackBytes) {
      staged_->data.insert(staged_->data.end(), in.begin(), in.end());
      staged_->len += len;
      inflight_[staged_->offset] = staged_->len;
      inflight_bytes_ += len;
      if (staged_->len + kStageMin > kStageBytes) out = take_staged_locked();  // full
      wl.unlock();
      send_out();
      return ok();
    }
    // Anything else sends the staged run first: the order of two writes of
    // one sector is kept (N4), and a run is only ever one of bytes in a row.
    if (staged_) {
      out = take_staged_locked();
      wl.unlock();
      send_out();
      wl.lock();
      continue;
    }
    if (overlaps_locked(offset, len) || (inflight_bytes_ != 0 && inflight_bytes_ + len > kWriteBackBytes)) {
      wcv_.wait(wl);
      continue;
    }
    break;
  }
  Staged w{next_seq_++, offset, len, {}};
  inflight_[offset] = len;
  inflight_bytes_ += len;
  inflight_seqs_.insert(w.seq);
  if (len < kStageBytes) {  // N6: staged, to be sent with what follows it
    w.data.assign(in.begin(), in.end());
    staged_ = std::move(w);
    return ok();
  }
  wl.unlock();
  w.data.assign(in.begin(), in.end());
  return send(std::move(w));
}

std::optional<NbdDevice::Staged> NbdDevice::take_staged_locked() {
  std::optional<Staged> s = std::move(staged_);
  staged_.reset();
  return s;
}

void NbdDevice::send_staged() {
  std::optional<Staged> s;
  {
    std::lock_guard wl(wmu_);
    s = take_staged_locked();
  }
  if (s) (void)send(std::move(*s));  // an error is failed_'s, for the next flush (D4)
}

// The write is registered in flight (inflight_, inflight_seqs_) already.
Result<void> NbdDevice::send(Staged s) {
  Conn& c = pick();
  const uint64_t offset = s.offset, len = s.len;
  auto* w = new AsyncWrite{this, &c, s.seq, offset, len, std::move(s.data), 1, 0};
  int submit_errno = 0;
  std::string submit_msg;
  std::unique_lock lk(c.mu);
  for (uint64_t done = 0; done < len;) {
    const uint64_t n = std::min(max_request_, len - done);
    const nbd_completion_callback cb = {.callback = Conn::on_write, .user_data = w, .free = Conn::on_write_free};
    w->pieces++;  // on_write_free's, whatever happens
    c.async.left++;
    if (nbd_aio_pwrite(c.h, w->data.data() + done, n, offset + done, cb, 0) < 0) {  // on_write_free counts it
      const char* msg = nbd_get_error();
      submit_msg = msg ? msg : "libnbd error";
      submit_errno = gone_to_eio(nbd_get_errno());
      if (nbd_aio_is_dead(c.h) || nbd_aio_is_closed(c.h)) {
        submit_errno = EIO;
        submit_msg = "the NBD server went away (" + submit_msg + ")";
      }
      if (w->err == 0) w->err = submit_errno;
      break;
    }
    done += n;
  }
  c.kick();
  c.drain_cv.notify_one();
  if (--w->pieces == 0) write_done(w);  // all answered already, or none submitted
  lk.unlock();
  if (submit_errno)
    return Error::io(submit_errno, "write at byte " + std::to_string(offset) + " of " + uri_ + " failed: " + submit_msg);
  return ok();
}

Result<void> NbdDevice::write_batch(std::span<const WriteReq> reqs) {
  // Every write is in flight once write() returns: the batch goes out
  // whole, spread over the connections (a commit's runs together).
  for (const auto& r : reqs) PLY_CHECK(write(r.offset, r.data));
  return ok();
}

Result<void> NbdDevice::flush() {
  if (read_only_) return ok();
  // D3: the writes begun before it first (the NBD flush covers only
  // writes the server has answered; later ones it need not wait for); one
  // the server failed fails this flush and every later one (D4).
  {
    std::unique_lock wl(wmu_);
    const uint64_t upto = next_seq_ - 1;  // the writes begun before this flush
    for (;;) {
      if (staged_ && staged_->seq <= upto) {  // N6: it goes out now
        auto st = take_staged_locked();
        wl.unlock();
        (void)send(std::move(*st));  // an error is failed_'s, below
        wl.lock();
        continue;
      }
      if (failed_ != 0 || inflight_seqs_.empty() || *inflight_seqs_.begin() > upto) break;
      wcv_.wait(wl);
    }
    if (failed_) return failed_error();
  }
  // Multi-conn: a flush on any one connection covers the writes completed
  // on every connection; without it there is only the one connection.
  return submit(Op::kFlush, 0, nullptr, 0);
}

Result<void> NbdDevice::discard(uint64_t offset, uint64_t len) {
  if (read_only_) return Error::io(EROFS, uri_ + " is open read-only");
  PLY_CHECK(check_range(*this, offset, len));
  if (len == 0 || !can_trim_) return ok();  // advisory (D7)
  wait_unshadowed(offset, len);             // N4
  return submit(Op::kTrim, offset, nullptr, len);
}

Result<uint64_t> NbdDevice::resize(uint64_t at_least) {
  (void)at_least;  // as a block device: the caller sees the size it gets
  return size_;
}

}  // namespace plyfs
