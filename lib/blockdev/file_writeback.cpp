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
#include <set>
#include <thread>
#include <vector>

#include "blockdev/blockdev.h"

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
  };

  explicit WriteBack(FileDevice& dev) : dev(dev) {}
  // With the first write, not when the device opens: a daemon that opens
  // its devices and then forks (plyfs, to claim the image on the terminal)
  // would leave the threads in the parent.
  void start_locked() {
    if (!workers.empty()) return;
    for (int i = 0; i < kWriterThreads; i++) workers.emplace_back([this] { run(); });
  }
  ~WriteBack() {
    {
      std::lock_guard lk(mu);
      stop = true;
    }
    work_cv.notify_all();
    for (auto& t : workers) t.join();  // they empty the queue first (F5)
  }

  bool overlaps_locked(uint64_t offset, uint64_t len) const {
    auto it = inflight.lower_bound(offset);
    if (it != inflight.end() && it->first < offset + len) return true;
    if (it == inflight.begin()) return false;
    --it;
    return it->first + it->second > offset;
  }

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
  std::map<uint64_t, uint64_t> inflight;  // offset -> length, queued or being written (F3: disjoint)
  // Each write's number in the order write() took them, and those not yet
  // written: a flush waits only for the writes begun before it (F2), so
  // writers that never pause cannot hold a commit back.
  std::set<uint64_t> seqs;
  uint64_t next_seq = 1;
  uint64_t bytes = 0;
  int failed = 0;
  std::string failed_msg;
  bool stop = false;
  std::vector<std::thread> workers;  // started by the first write (start_locked)
};

// Here, where WriteBack is whole.
FileDevice::FileDevice() = default;

FileDevice::~FileDevice() {
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
  dio_offset_align_ = lss_;
  dio_mem_align_ = 4096;  // what any device needs, when the kernel does not say
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (::statx(dfd_, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
    if (sx.stx_dio_offset_align == 0) {  // the kernel says: no direct I/O on this file
      ::close(dfd_);
      dfd_ = -1;
      return ok();
    }
    dio_offset_align_ = sx.stx_dio_offset_align;
    dio_mem_align_ = std::max<uint32_t>(sx.stx_dio_mem_align, 1);
  }
#endif
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
  // F1: the copy, outside the lock.
  AlignedBuf b = aligned_buf(dio_mem_align_, in.size());
  if (!b) return Error::io(ENOMEM, "no memory for a write-back buffer of " + std::to_string(in.size()) + " bytes");
  std::memcpy(b.get(), in.data(), in.size());
  WriteBack& w = *wb_;
  std::unique_lock lk(w.mu);
  w.done_cv.wait(lk, [&] {
    return w.failed != 0 ||
           ((w.bytes == 0 || w.bytes + in.size() <= kWriteBackBytes) && !w.overlaps_locked(offset, in.size()));
  });
  if (w.failed) return w.failed_error();
  const uint64_t seq = w.next_seq++;
  w.inflight.emplace(offset, in.size());
  w.seqs.insert(seq);
  w.bytes += in.size();
  w.queue.push_back(WriteBack::Job{seq, offset, in.size(), std::move(b)});
  w.start_locked();
  lk.unlock();
  w.work_cv.notify_one();
  return ok();
}

Result<void> FileDevice::wait_written() {
  WriteBack& w = *wb_;
  std::unique_lock lk(w.mu);
  const uint64_t upto = w.next_seq;
  w.done_cv.wait(lk, [&] { return w.seqs.empty() || *w.seqs.begin() >= upto; });
  if (w.failed) return w.failed_error();
  return ok();
}

void FileDevice::wait_unshadowed(uint64_t offset, uint64_t len) {
  WriteBack& w = *wb_;
  std::unique_lock lk(w.mu);
  w.done_cv.wait(lk, [&] { return !w.overlaps_locked(offset, len); });
}

void FileDevice::wait_all() {
  WriteBack& w = *wb_;
  std::unique_lock lk(w.mu);
  w.done_cv.wait(lk, [&] { return w.seqs.empty(); });
}

}  // namespace plyfs
