// See uring.h. The ring structures are the kernel's (include/uapi/linux/
// fuse.h, protocol 7.42); Debian 12's headers predate them, so they are
// declared here and their sizes checked.
#include "uring.h"

#ifdef PLYFS_HAVE_URING

#include <liburing.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace plyfs::uring {
namespace {

constexpr uint32_t kCmdRegister = 1;        // FUSE_IO_URING_CMD_REGISTER
constexpr uint32_t kCmdCommitAndFetch = 2;  // FUSE_IO_URING_CMD_COMMIT_AND_FETCH
constexpr size_t kOpInSize = 128;           // FUSE_URING_OP_IN_OUT_SZ

// struct fuse_uring_ent_in_out
struct EntInOut {
  uint64_t flags;
  uint64_t commit_id;   // the request's id, echoed by the commit
  uint32_t payload_sz;  // bytes in the payload buffer, either way
  uint32_t padding;
  uint64_t reserved;
};
static_assert(sizeof(EntInOut) == 32);

// struct fuse_uring_req_header: iov[0] of a REGISTER
struct ReqHeader {
  char in_out[128];      // fuse_in_header in, fuse_out_header back
  char op_in[kOpInSize]; // the opcode's fixed argument (its in_args[0])
  EntInOut ent;
};
static_assert(sizeof(ReqHeader) == 288);

// struct fuse_uring_cmd_req: in the SQE's 80-byte command area
struct CmdReq {
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};
static_assert(sizeof(CmdReq) == 24);

struct Queue;

struct Entry {
  Queue* q = nullptr;
  ReqHeader* hdr = nullptr;
  char* payload = nullptr;
  uint64_t commit_id = 0;
  uint32_t last_cmd = kCmdRegister;
  iovec iov[2]{};
};

struct Queue {
  unsigned qid = 0;
  io_uring ring{};
  bool ring_up = false;
  int evfd = -1;
  std::thread th;
  std::vector<Entry> ents;
  std::vector<char> buf;  // one request laid out as /dev/fuse delivers it
  // Replies sent from other threads: the queue's thread alone touches its
  // ring, so they wait here and the eventfd wakes it.
  std::mutex foreign_mu;
  std::vector<Entry*> foreign;
  std::atomic<bool> stopping{false};
};

struct Pool {
  fuse_session* se = nullptr;
  int devfd = -1;
  size_t payload = 0;
  unsigned depth = 0;
  std::vector<std::unique_ptr<Queue>> queues;
  std::mutex start_mu;
  std::condition_variable start_cv;
  unsigned started = 0;
  // Requests taken from a ring whose reply has not gone out, by unique id.
  std::mutex pend_mu;
  std::unordered_map<uint64_t, Entry*> pending;
  std::atomic<uint64_t> requests{0};
  std::atomic<bool> announced{false}, refused{false};
  std::atomic<unsigned> helpers{0};  // control commands running off the queues
};

std::atomic<Pool*> g_pool{nullptr};  // read by every replying thread
std::atomic<bool> g_active{false};
void (*g_log)(const char* fmt, ...) = nullptr;
thread_local Queue* tl_queue = nullptr;  // the queue this thread serves

template <class... A>
void log(const char* fmt, A... a) {
  if (g_log) g_log(fmt, a...);
}

void prep(Queue* q, Entry* e, uint32_t cmd) {
  io_uring_sqe* sqe = io_uring_get_sqe(&q->ring);
  if (!sqe) {  // never: the SQ holds every entry's command and the poll
    io_uring_submit(&q->ring);
    sqe = io_uring_get_sqe(&q->ring);
    if (!sqe) {
      log("io_uring queue %u: no free submission entry", q->qid);
      return;
    }
  }
  std::memset(sqe, 0, 2 * sizeof(io_uring_sqe));  // SQE128
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->flags = IOSQE_FIXED_FILE;
  sqe->fd = 0;  // index of /dev/fuse among the ring's registered files
  sqe->cmd_op = cmd;
  io_uring_sqe_set_data(sqe, e);
  CmdReq r{};
  r.qid = uint16_t(q->qid);
  if (cmd == kCmdRegister) {
    sqe->addr = reinterpret_cast<uint64_t>(e->iov);
    sqe->len = 2;
  } else {
    r.commit_id = e->commit_id;
  }
  std::memcpy(sqe->cmd, &r, sizeof r);
  e->last_cmd = cmd;
}

void arm_poll(Queue* q) {
  io_uring_sqe* sqe = io_uring_get_sqe(&q->ring);
  if (!sqe) {
    io_uring_submit(&q->ring);
    sqe = io_uring_get_sqe(&q->ring);
  }
  if (!sqe) return;
  std::memset(sqe, 0, 2 * sizeof(io_uring_sqe));
  io_uring_prep_poll_add(sqe, q->evfd, POLLIN);
  io_uring_sqe_set_data(sqe, nullptr);
}

// Sends the reply already in e's buffers and takes the next request.
void commit(Entry* e) {
  Queue* q = e->q;
  if (tl_queue == q) {
    prep(q, e, kCmdCommitAndFetch);  // submitted by the loop's next enter
    return;
  }
  {
    std::lock_guard lk(q->foreign_mu);
    q->foreign.push_back(e);
  }
  const uint64_t one = 1;
  if (::write(q->evfd, &one, sizeof one) != sizeof one) log("io_uring queue %u: eventfd: %s", q->qid, strerror(errno));
}

void reply_error(Entry* e, uint64_t unique, int err) {
  fuse_out_header oh{};
  oh.len = sizeof oh;
  oh.error = -err;
  oh.unique = unique;
  std::memcpy(e->hdr->in_out, &oh, sizeof oh);
  e->hdr->ent.payload_sz = 0;
  commit(e);
}

void handle(Pool* p, Queue* q, Entry* e) {
  fuse_in_header in;
  std::memcpy(&in, e->hdr->in_out, sizeof in);
  e->commit_id = e->hdr->ent.commit_id;
  const size_t psz = e->hdr->ent.payload_sz;
  // The opcode's fixed argument is whatever of the request's length is not
  // the header or the payload.
  const size_t fixed = sizeof in + psz;
  if (psz > p->payload || in.len < fixed || in.len - fixed > kOpInSize) {
    log("io_uring queue %u: malformed request (opcode %u, length %u, payload %zu)", q->qid, in.opcode,
        in.len, psz);
    reply_error(e, in.unique, EIO);
    return;
  }
  const size_t op = in.len - fixed;
  char* b = q->buf.data();
  std::memcpy(b, &in, sizeof in);
  std::memcpy(b + sizeof in, e->hdr->op_in, op);
  if (psz) std::memcpy(b + sizeof in + op, e->payload, psz);
  {
    std::lock_guard lk(p->pend_mu);
    p->pending[in.unique] = e;
  }
  if (!p->announced.exchange(true))
    log("requests go through io_uring: %zu queues of %u entries", p->queues.size(), p->depth);
  p->requests.fetch_add(1, std::memory_order_relaxed);
  if (in.opcode == FUSE_IOCTL) {
    // A control command (plyctl) may invalidate the kernel's caches from
    // its handler, and the kernel may then need requests served (dirty
    // pages written back) before the notification returns: they would
    // queue behind the handler on this thread. So it runs on a thread of
    // its own, and its reply comes back through the eventfd.
    auto copy = std::make_shared<std::vector<char>>(b, b + in.len);
    p->helpers.fetch_add(1);
    std::thread([p, copy] {
      note_request(copy->data(), copy->size());
      fuse_buf fb{};
      fb.size = copy->size();
      fb.mem = copy->data();
      fuse_session_process_buf(p->se, &fb);
      p->helpers.fetch_sub(1);
    }).detach();
    return;
  }
  note_request(b, in.len);
  fuse_buf fb{};
  fb.size = in.len;
  fb.mem = b;
  fuse_session_process_buf(p->se, &fb);
}

void queue_thread(Pool* p, Queue* q) {
  tl_queue = q;
  const std::string name = "plyfs-ring-" + std::to_string(q->qid);
  pthread_setname_np(pthread_self(), name.c_str());
  // The kernel puts a request in the queue of the CPU its caller runs on;
  // the thread that serves it runs there too.
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(q->qid, &set);
  (void)sched_setaffinity(0, sizeof set, &set);

  bool ok = false;
  {
    io_uring_params prm{};
    prm.flags = IORING_SETUP_SQE128 | IORING_SETUP_CQSIZE;
    prm.cq_entries = 2 * (p->depth + 1);
    int rc = io_uring_queue_init_params(2 * (p->depth + 1), &q->ring, &prm);
    if (rc < 0) {
      log("io_uring queue %u: setup: %s", q->qid, strerror(-rc));
    } else {
      q->ring_up = true;
      rc = io_uring_register_files(&q->ring, &p->devfd, 1);
      if (rc < 0) log("io_uring queue %u: register /dev/fuse: %s", q->qid, strerror(-rc));
      else ok = true;
    }
  }
  if (ok) {
    q->buf.resize(sizeof(fuse_in_header) + kOpInSize + p->payload);
    for (Entry& e : q->ents) {
      e.q = q;
      e.hdr = static_cast<ReqHeader*>(std::aligned_alloc(4096, 4096));
      e.payload = static_cast<char*>(std::aligned_alloc(4096, (p->payload + 4095) / 4096 * 4096));
      if (!e.hdr || !e.payload) {
        ok = false;
        break;
      }
      std::memset(e.hdr, 0, 4096);
      e.iov[0] = {e.hdr, sizeof(ReqHeader)};
      e.iov[1] = {e.payload, p->payload};
      prep(q, &e, kCmdRegister);
    }
    if (ok) arm_poll(q);
    if (ok && io_uring_submit(&q->ring) < 0) ok = false;
  }
  {
    std::lock_guard lk(p->start_mu);
    p->started++;
  }
  p->start_cv.notify_all();
  if (!ok) return;

  while (!q->stopping.load()) {
    int rc = io_uring_submit_and_wait(&q->ring, 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      log("io_uring queue %u: %s", q->qid, strerror(-rc));
      break;
    }
    bool stop = false;
    unsigned head, n = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&q->ring, head, cqe) {
      n++;
      auto* e = static_cast<Entry*>(io_uring_cqe_get_data(cqe));
      if (!e) {  // the eventfd: replies from other threads, or stop
        uint64_t v;
        (void)!::read(q->evfd, &v, sizeof v);
        std::vector<Entry*> f;
        {
          std::lock_guard lk(q->foreign_mu);
          f.swap(q->foreign);
        }
        for (Entry* x : f) prep(q, x, kCmdCommitAndFetch);
        if (q->stopping.load()) stop = true;
        else arm_poll(q);
        continue;
      }
      const int res = cqe->res;
      if (res == -EAGAIN || res == -EINTR) {
        prep(q, e, e->last_cmd);
        continue;
      }
      if (res < 0) {
        // ENOTCONN and ENODEV: the connection is gone (unmounted).
        if (res != -ENOTCONN && res != -ENODEV && !p->refused.exchange(true))
          log("io_uring queue %u refused (%s): requests go through /dev/fuse", q->qid, strerror(-res));
        stop = true;
        continue;
      }
      handle(p, q, e);
    }
    io_uring_cq_advance(&q->ring, n);
    if (stop) break;
  }
}

}  // namespace

void set_logger(void (*fn)(const char* fmt, ...)) { g_log = fn; }

void not_offered() {
  log("the kernel does not offer FUSE over io_uring (Linux 6.14+, fuse.enable_uring=Y): requests go "
      "through /dev/fuse");
}

bool start(fuse_session* se, int devfd, size_t payload, unsigned depth) {
  if (g_pool.load()) return false;
  auto* p = new Pool;
  p->se = se;
  p->devfd = devfd;
  p->payload = payload;
  const int n = std::max(1, get_nprocs_conf());
  // Every entry holds a payload buffer of max_write (1 MiB): at most 64
  // entries in all, and at least 2 per queue.
  p->depth = std::clamp(64u / unsigned(n), 2u, std::max(depth, 2u));
  depth = p->depth;
  for (int i = 0; i < n; i++) {
    auto q = std::make_unique<Queue>();
    q->qid = unsigned(i);
    q->ents.resize(depth);
    q->evfd = eventfd(0, EFD_CLOEXEC);
    if (q->evfd < 0) {
      log("io_uring: eventfd: %s", strerror(errno));
      delete p;
      return false;
    }
    p->queues.push_back(std::move(q));
  }
  // Replies must find the ring from the first request on, which may come
  // as soon as the last queue registers, before the threads report.
  g_pool = p;
  g_active = true;
  for (auto& q : p->queues) q->th = std::thread(queue_thread, p, q.get());
  std::unique_lock lk(p->start_mu);
  p->start_cv.wait(lk, [&] { return p->started == p->queues.size(); });
  return true;
}

bool reply(const struct iovec* iov, int count, ssize_t* written) {
  Pool* p = g_pool.load();
  if (!p || !g_active.load(std::memory_order_acquire) || count < 1 || iov[0].iov_len < sizeof(fuse_out_header))
    return false;
  fuse_out_header oh;
  std::memcpy(&oh, iov[0].iov_base, sizeof oh);
  if (oh.unique == 0) return false;  // a notification
  Entry* e = nullptr;
  {
    std::lock_guard lk(p->pend_mu);
    auto it = p->pending.find(oh.unique);
    if (it == p->pending.end()) return false;
    e = it->second;
    p->pending.erase(it);
  }
  size_t len = 0, total = iov[0].iov_len;
  bool fits = true;
  for (int i = 1; i < count; i++) {
    total += iov[i].iov_len;
    if (len + iov[i].iov_len > p->payload) {
      fits = false;
      continue;
    }
    if (iov[i].iov_len) std::memcpy(e->payload + len, iov[i].iov_base, iov[i].iov_len);
    len += iov[i].iov_len;
  }
  if (!fits) {
    log("io_uring: a reply of %zu bytes does not fit the %zu-byte buffer", total, p->payload);
    oh.error = -EIO;
    oh.len = sizeof oh;
    len = 0;
  }
  std::memcpy(e->hdr->in_out, &oh, sizeof oh);
  e->hdr->ent.payload_sz = uint32_t(len);
  commit(e);
  *written = ssize_t(total);
  return true;
}

void stop() {
  Pool* p = g_pool.load();
  if (!p) return;
  // A control command still running replies through its queue: let it end.
  for (int i = 0; i < 3000 && p->helpers.load(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  g_active = false;
  for (auto& q : p->queues) {
    q->stopping = true;
    const uint64_t one = 1;
    (void)!::write(q->evfd, &one, sizeof one);
  }
  for (auto& q : p->queues) {
    if (q->th.joinable()) q->th.join();
    if (q->ring_up) io_uring_queue_exit(&q->ring);
    for (Entry& e : q->ents) {
      std::free(e.hdr);
      std::free(e.payload);
    }
    if (q->evfd >= 0) ::close(q->evfd);
  }
  g_pool = nullptr;
  delete p;
}

bool active() {
  Pool* p = g_pool.load();
  return g_active.load() && p && p->announced.load() && !p->refused.load();
}
uint64_t requests() {
  Pool* p = g_pool.load();
  return p ? p->requests.load() : 0;
}

}  // namespace plyfs::uring

#else  // PLYFS_HAVE_URING

// Built without liburing (meson option uring): main refuses -o uring
// (options.cpp), so the INIT reply never asks for a ring and none of this
// is reached but stop() and the reply hook, which find no ring.
namespace plyfs::uring {

void set_logger(void (*)(const char* fmt, ...)) {}
void not_offered() {}
bool start(fuse_session*, int, size_t, unsigned) { return false; }
bool reply(const struct iovec*, int, ssize_t*) { return false; }
void stop() {}
bool active() { return false; }
uint64_t requests() { return 0; }

}  // namespace plyfs::uring

#endif  // PLYFS_HAVE_URING
