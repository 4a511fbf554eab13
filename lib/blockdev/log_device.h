// LogDevice: a test-only wrapper that forwards every call to an inner device
// and appends each write (offset and bytes), flush and discard to a log file,
// for the crash harness (docs/testing.md, "Daemon runs"). The FUSE daemon
// uses it under `-o crashlog=PATH`; tests/crash/crashlog.h's load_log() reads
// the file back into a Log.
//
// The file: the header "PLYCLOG1", u32 logical sector size, u32 zero, u64
// device size; then records, all little-endian: u8 kind (LogRecord), 7 zero
// bytes, u64 offset, u64 length, and for writes (failed ones too) `length`
// bytes of data. Records are appended in completion order, which under the
// device lock is issue order. The buffer goes to the kernel at each flush
// (and every 8 MiB, and on destruction), so a SIGKILL of the daemon loses
// at most the records after the last device flush.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "blockdev/blockdev.h"

namespace plyfs {

enum class LogRecord : uint8_t { Write = 1, Flush = 2, Discard = 3, WriteFailed = 4, FlushFailed = 5 };
inline constexpr char kLogMagic[8] = {'P', 'L', 'Y', 'C', 'L', 'O', 'G', '1'};

class LogDevice final : public BlockDevice {
 public:
  // Creates (truncates) the log file at `path`.
  static Result<std::unique_ptr<LogDevice>> create(std::unique_ptr<BlockDevice> inner,
                                                   const std::string& path) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Error::sys(errno, "crashlog: cannot create " + path);
    std::unique_ptr<LogDevice> d(new LogDevice(std::move(inner), fd));
    unsigned char h[24] = {};
    std::memcpy(h, kLogMagic, 8);
    put64(h + 8, d->inner_->logical_sector_size());
    put64(h + 16, d->inner_->size_bytes());
    d->buf_.insert(d->buf_.end(), h, h + sizeof h);
    if (!d->drain()) return Error::sys(errno, "crashlog: cannot write " + path);
    return d;
  }
  ~LogDevice() override {
    drain();
    ::close(fd_);
  }

  Result<void> read_uncached(uint64_t offset, std::span<std::byte> out) override {
    return inner_->read_uncached(offset, out);
  }
  Result<void> read(uint64_t offset, std::span<std::byte> out) override {
    return inner_->read(offset, out);
  }
  Result<void> write(uint64_t offset, std::span<const std::byte> in) override {
    std::lock_guard<std::mutex> l(mu_);
    auto r = inner_->write(offset, in);
    record(r ? LogRecord::Write : LogRecord::WriteFailed, offset, in.size());
    const auto* p = reinterpret_cast<const unsigned char*>(in.data());
    buf_.insert(buf_.end(), p, p + in.size());
    if (buf_.size() >= (8u << 20)) drain();
    return r;
  }
  Result<void> flush() override {
    std::lock_guard<std::mutex> l(mu_);
    auto r = inner_->flush();
    record(r ? LogRecord::Flush : LogRecord::FlushFailed, 0, 0);
    if (!drain()) return Error::io(EIO, "crashlog: cannot write the log");
    return r;
  }
  Result<void> discard(uint64_t offset, uint64_t len) override {
    std::lock_guard<std::mutex> l(mu_);
    auto r = inner_->discard(offset, len);
    if (r) record(LogRecord::Discard, offset, len);
    return r;
  }
  uint64_t size_bytes() const override { return inner_->size_bytes(); }
  Result<uint64_t> resize(uint64_t at_least) override { return inner_->resize(at_least); }
  Result<uint64_t> truncate(uint64_t bytes) override { return inner_->truncate(bytes); }
  uint32_t logical_sector_size() const override { return inner_->logical_sector_size(); }
  uint32_t physical_sector_size() const override { return inner_->physical_sector_size(); }
  DeviceSet* device_set() override { return inner_->device_set(); }
  std::string display_name() const override { return inner_->display_name(); }

 private:
  LogDevice(std::unique_ptr<BlockDevice> inner, int fd) : inner_(std::move(inner)), fd_(fd) {}
  static void put64(unsigned char* p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = static_cast<unsigned char>(v >> (8 * i));
  }
  void record(LogRecord k, uint64_t offset, uint64_t length) {
    unsigned char h[24] = {};
    h[0] = static_cast<unsigned char>(k);
    put64(h + 8, offset);
    put64(h + 16, length);
    buf_.insert(buf_.end(), h, h + sizeof h);
  }
  // Hands the buffer to the kernel (a SIGKILL does not lose it after this).
  bool drain() {
    size_t done = 0;
    while (done < buf_.size()) {
      const ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    buf_.clear();
    return true;
  }

  std::unique_ptr<BlockDevice> inner_;
  int fd_;
  std::mutex mu_;
  std::vector<unsigned char> buf_;
};

}  // namespace plyfs
