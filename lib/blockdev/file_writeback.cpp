// FileDevice opened with O_DIRECT: its write-back queue (blockdev.h F1-F5,
// format.md#device-direct).
//
// Without the host's page cache a pwrite waits for the device, and the
// daemon's request thread would wait with it. So writes are queued, a
// disk's volatile cache in the daemon: D2 already lets a write not yet
// covered by a flush be lost or land in any order, which is all a queue
// adds. Writer threads keep several requests at the device at once.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "blockdev/blockdev.h"
#include "blockdev/ranges.h"

namespace plyfs {

namespace {

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBuf = std::unique_ptr<std::byte, FreeDeleter>;

AlignedBuf aligned_buf(size_t align, size_t len) {
  void* p = nullptr;
  if (::posix_memalign(&p, std::max<size_t>(align, sizeof(void*)), std::max<size_t>(len, 1)) != 0)
    return nullptr;
  return AlignedBuf(static_cast<std::byte*>(p));
}

}  // namespace

struct FileDevice::WriteBack {
  struct Job {
    uint64_t seq = 0;
    uint64_t offset = 0;
    size_t len = 0;
    AlignedBuf buf;
    size_t cap = 0;  // bytes buf holds (a staged run grows, F6)
  };

  explicit WriteBack(FileDevice& dev) : dev(dev) {}
  // With the first write, not when the device opens: a daemon that opens
  // its devices and then forks (plyfs, to claim the image on the terminal)
  // would leave the threads in the parent.
  void start_locked() {
    if (!workers.empty()) return;
    for (int i = 0; i < kWriterThreads; i++) workers.emplace_back([this] { run(); });
  }
  // F6: the staged run goes to the writers.
  void release_staged_locked() {
    if (!staged) return;
    queue.push_back(std::move(*staged));
    staged.reset();
    start_locked();
    work_cv.notify_one();
  }
  bool staged_overlaps_locked(uint64_t offset, uint64_t len) const {
    return staged && staged->offset < offset + len && offset < staged->offset + staged->len;
  }

  ~WriteBack() {
    {
      std::lock_guard lk(mu);
      release_staged_locked();
      stop = true;
    }
    work_cv.notify_all();
    for (auto& t : workers) t.join();  // they empty the queue first (F5)
  }

  bool overlaps_locked(uint64_t offset, uint64_t len) const { return overlaps_any(inflight, offset, len); }  // F3

  void run() {
    std::unique_lock lk(mu);
    for (;;) {
      work_cv.wait(lk, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop, and nothing left to write
      Job j = std::move(queue.front());
      queue.pop_front();
      lk.unlock();
      const bool direct = dev.direct_ok(j.offset, j.buf.get(), j.len);
      auto r = dev.pwrite_all(direct ? dev.dfd_ : dev.fd_, j.offset, std::span(j.buf.get(), j.len));
      lk.lock();
      if (!r && failed == 0) {  // F2: sticky
        failed = r.error().code ? r.error().code : EIO;
        failed_msg = r.error().message();
      }
      inflight.erase(j.offset);
      seqs.erase(j.seq);
      written++;
      bytes -= j.len;
      done_cv.notify_all();
    }
  }

  Error failed_error() const {
    return Error::io(failed, "an earlier write-back write failed: " + failed_msg);
  }

  FileDevice& dev;
  std::mutex mu;  // guards everything below
  std::condition_variable work_cv;  // a job was queued, or stop
  std::condition_variable done_cv;  // a job was written
  std::deque<Job> queue;
  std::optional<Job> staged;  // F6: not yet the writers'; in inflight and seqs already
  std::map<uint64_t, uint64_t> inflight;  // offset -> length, queued or being written (F3: disjoint)
  // Each write's number in the order write() took them, and those not yet
  // written: a flush waits only for the writes begun before it (F2), so
  // writers that never pause cannot hold a commit back.
  std::set<uint64_t> seqs;
  uint64_t next_seq = 1;
  uint64_t bytes = 0;
  uint64_t written = 0;  // jobs the writers finished
  int failed = 0;
  std::string failed_msg;
  bool stop = false;
  std::vector<std::thread> workers;  // started by the first write (start_locked)
};

// F7: starts the host's writeback of the image's dirty pages, away from
// the writers (sync_file_range may wait for room in the device's queue).
struct FileDevice::Kicker {
  explicit Kicker(int fd) : fd(fd) {}
  ~Kicker() {
    {
      std::lock_guard lk(mu);
      stop = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }
  void kick() {
    {
      std::lock_guard lk(mu);
      asked = true;
      // With the first kick, not at open: a daemon that forks after opening.
      if (!thread.joinable()) thread = std::thread([this] { run(); });
    }
    cv.notify_one();
  }
  void run() {
    std::unique_lock lk(mu);
    for (;;) {
      cv.wait(lk, [&] { return stop || asked; });
      if (stop) return;
      asked = false;
      lk.unlock();
      // Advisory: an error here loses nothing, the flush still decides (D3).
      (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
      lk.lock();
    }
  }
  const int fd;
  std::mutex mu;
  std::condition_variable cv;
  bool asked = false, stop = false;
  std::thread thread;
};

void FileDevice::kick() {
  unkicked_.store(0, std::memory_order_relaxed);
  std::call_once(kick_once_, [&] { kick_ = std::make_unique<Kicker>(fd_); });
  kick_->kick();
}

// Here, where WriteBack and Kicker are whole.
FileDevice::FileDevice() = default;

FileDevice::~FileDevice() {
  kick_.reset();
  wb_.reset();  // F5: every queued write is written first
  if (dfd_ >= 0) ::close(dfd_);
  if (fd_ >= 0) ::close(fd_);
}

Result<void> FileDevice::open_direct() {
  // A second open file description of the same file, with O_DIRECT (F4):
  // fd_ keeps the lock, the buffered path and fdatasync.
  const std::string self = "/proc/self/fd/" + std::to_string(fd_);
  int flags = (read_only_ ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_DIRECT;
  dfd_ = ::open(self.c_str(), flags);
  if (dfd_ < 0) {
    if (errno == EINVAL) return ok();  // the host filesystem has no O_DIRECT: stay buffered
    return Error::sys(errno, "cannot open " + path_ + " with O_DIRECT");
  }
  // Only where the kernel says what direct I/O needs (statx STATX_DIOALIGN,
  // Linux 6.1+): a filesystem that does not say (tmpfs, whose page cache
  // is the file itself, so there is nothing to bypass) stays buffered.
  bool said = false;
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (::statx(dfd_, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
      sx.stx_dio_offset_align != 0) {
    dio_offset_align_ = sx.stx_dio_offset_align;
    dio_mem_align_ = std::max<uint32_t>(sx.stx_dio_mem_align, 1);
    said = true;
  }
#endif
  if (!said) {
    ::close(dfd_);
    dfd_ = -1;
    return ok();
  }
  wb_ = std::make_unique<WriteBack>(*this);
  return ok();
}

bool FileDevice::direct_ok(uint64_t offset, const void* buf, size_t len) const {
  return offset % dio_offset_align_ == 0 && len % dio_offset_align_ == 0 &&
         reinterpret_cast<uintptr_t>(buf) % dio_mem_align_ == 0;
}

Result<void> FileDevice::direct_read(uint64_t offset, std::span<std::byte> out) {
  wait_unshadowed(offset, out.size());  // F3: a read sees the write before it
  if (direct_ok(offset, out.data(), out.size())) return pread_all(dfd_, offset, out);
  if (offset % dio_offset_align_ != 0 || out.size() % dio_offset_align_ != 0)
    return pread_all(fd_, offset, out);  // F4
  // Aligned on the device, not in memory: through an aligned buffer.
  AlignedBuf b = aligned_buf(dio_mem_align_, out.size());
  if (!b) return pread_all(fd_, offset, out);
  PLY_CHECK(pread_all(dfd_, offset, std::span(b.get(), out.size())));
  std::memcpy(out.data(), b.get(), out.size());
  return ok();
}

Result<void> FileDevice::queue_write(uint64_t offset, std::span<const std::byte> in) {
  if (in.empty()) return ok();
  const size_t n = in.size();
  WriteBack& w = *wb_;
  std::unique_lock lk(w.mu);
  for (;;) {
    if (w.failed) return w.failed_error();
    // F6: the bytes right after the staged run join it.
    auto& st = w.staged;
    if (st && offset == st->offset + st->len && st->len + n <= kStageBytes &&
        !w.overlaps_locked(offset, n) && w.bytes + n <= kWriteBackBytes) {
      if (st->len + n > st->cap) {
        const size_t cap = std::min<size_t>(kStageBytes, std::max(st->cap * 2, st->len + n));
        AlignedBuf grown = aligned_buf(dio_mem_align_, cap);
        if (!grown) return Error::io(ENOMEM, "no memory for a write-back buffer of " + std::to_string(cap) + " bytes");
        std::memcpy(grown.get(), st->buf.get(), st->len);
        st->buf = std::move(grown);
        st->cap = cap;
      }
      std::memcpy(st->buf.get() + st->len, in.data(), n);
      st->len += n;
      w.inflight[st->offset] = st->len;
      w.bytes += n;
      if (st->len + kStageMin > kStageBytes) w.release_staged_locked();  // full
      return ok();
    }
    // Anything else sends the staged run first (F3: two writes of one
    // sector keep their order; a run is bytes in a row).
    w.release_staged_locked();
    if (w.failed == 0 && (w.overlaps_locked(offset, n) || (w.bytes != 0 && w.bytes + n > kWriteBackBytes))) {
      w.done_cv.wait(lk);
      continue;
    }
    if (w.failed) return w.failed_error();
    break;
  }
  // F1: the copy, outside the lock.
  lk.unlock();
  AlignedBuf b = aligned_buf(dio_mem_align_, n);
  if (!b) return Error::io(ENOMEM, "no memory for a write-back buffer of " + std::to_string(n) + " bytes");
  std::memcpy(b.get(), in.data(), n);
  lk.lock();
  // Meanwhile another write may have come for these bytes: it keeps its
  // place before this one (F3).
  while (w.failed == 0 && (w.overlaps_locked(offset, n) || w.staged_overlaps_locked(offset, n))) {
    if (w.staged_overlaps_locked(offset, n)) w.release_staged_locked();
    else w.done_cv.wait(lk);
  }
  if (w.failed) return w.failed_error();
  const uint64_t seq = w.next_seq++;
  w.inflight.emplace(offset, n);
  w.seqs.insert(seq);
  w.bytes += n;
  WriteBack::Job job{seq, offset, n, std::move(b), n};
  if (n < kStageBytes) {  // F6: staged, for what follows it
    w.release_staged_locked();
    w.staged = std::move(job);
    return ok();
  }
  w.release_staged_locked();
  w.queue.push_back(std::move(job));
  w.start_locked();
  lk.unlock();
  w.work_cv.notify_one();
  return ok();
}

Result<void> FileDevice::wait_written() {
  WriteBack& w = *wb_;
  std::unique_lock lk(w.mu);
  const uint64_t upto = w.next_seq;
  if (w.staged && w.staged->seq < upto) w.release_staged_locked();  // F6
  w.done_cv.wait(lk, [&] { return w.seqs.empty() || *w.seqs.begin() >= upto; });
  if (w.failed) return w.failed_error();
  return ok();
}

void FileDevice::wait_unshadowed(uint64_t offset, uint64_t len) {
  WriteBack& w = *wb_;
  std::unique_lock lk(w.mu);
  for (;;) {
    if (w.staged_overlaps_locked(offset, len)) w.release_staged_locked();  // F6: needed now
    if (!w.overlaps_locked(offset, len)) return;
    w.done_cv.wait(lk);
  }
}

uint64_t FileDevice::direct_writes() const {
  if (!wb_) return 0;
  std::lock_guard lk(wb_->mu);
  return wb_->written;
}

void FileDevice::wait_all() {
  WriteBack& w = *wb_;
  std::unique_lock lk(w.mu);
  w.release_staged_locked();
  w.done_cv.wait(lk, [&] { return w.seqs.empty(); });
}

}  // namespace plyfs
