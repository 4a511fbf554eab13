#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "blockdev/blockdev.h"

namespace plyfs {

Result<void> check_range(const BlockDevice& dev, uint64_t offset, uint64_t len) {
  const uint64_t ss = dev.logical_sector_size();
  if (offset % ss != 0 || len % ss != 0)
    return Error::invalid("I/O at " + std::to_string(offset) + "+" + std::to_string(len) +
                          " is not aligned to the " + std::to_string(ss) + "-byte sector");
  if (offset > dev.size_bytes() || len > dev.size_bytes() - offset)
    return Error::io(EIO, "I/O at " + std::to_string(offset) + "+" + std::to_string(len) +
                              " is beyond the end of the device (" +
                              std::to_string(dev.size_bytes()) + " bytes)");
  return ok();
}

Result<std::unique_ptr<FileDevice>> FileDevice::open(const std::string& path,
                                                     FileOpenOptions opts) {
  std::unique_ptr<FileDevice> d(new FileDevice());
  d->path_ = path;
  // Absolute now: a daemon leaves its working directory after opening.
  d->display_ = device_display_name(path);
  d->read_only_ = opts.read_only;

  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return Error::sys(errno, "cannot open " + path);
  d->is_bdev_ = S_ISBLK(st.st_mode);
  if (!d->is_bdev_ && !S_ISREG(st.st_mode))
    return Error::invalid(path + " is neither a regular file nor a block device");

  int flags = (opts.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;
  if (d->is_bdev_ && !opts.read_only && opts.lock) flags |= O_EXCL;
  d->fd_ = ::open(path.c_str(), flags);
  if (d->fd_ < 0) {
    int e = errno;
    if (e == EBUSY)
      return Error::io(EBUSY, path + " is busy: mounted, or open by another program");
    return Error::sys(e, "cannot open " + path);
  }
  if (opts.lock && ::flock(d->fd_, (opts.read_only ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
    int e = errno;
    if (e == EWOULDBLOCK)
      return Error::io(EBUSY, path + " is in use by another plyfs program (it holds the lock)");
    return Error::sys(e, "cannot lock " + path);
  }

  if (d->is_bdev_) {
    uint64_t bytes = 0;
    int lss = 0;
    unsigned int pss = 0;
    if (::ioctl(d->fd_, BLKGETSIZE64, &bytes) != 0)
      return Error::sys(errno, "BLKGETSIZE64 failed on " + path);
    if (::ioctl(d->fd_, BLKSSZGET, &lss) != 0)
      return Error::sys(errno, "BLKSSZGET failed on " + path);
    if (::ioctl(d->fd_, BLKPBSZGET, &pss) != 0)
      return Error::sys(errno, "BLKPBSZGET failed on " + path);
    d->size_ = bytes;
    d->lss_ = static_cast<uint32_t>(lss);
    d->pss_ = pss;
  } else {
    if (::fstat(d->fd_, &st) != 0) return Error::sys(errno, "cannot stat " + path);
    d->lss_ = 512;
    d->pss_ = st.st_blksize >= 512 && st.st_blksize <= 65536 ? static_cast<uint32_t>(st.st_blksize)
                                                              : 4096;
    // An image file's usable size is whole sectors.
    d->size_ = static_cast<uint64_t>(st.st_size) / d->lss_ * d->lss_;
  }
  if (opts.direct) PLY_CHECK(d->open_direct());
  return d;
}

Result<uint64_t> FileDevice::resize(uint64_t at_least) {
  if (wb_) wait_all();  // F5
  if (is_bdev_) {
    uint64_t bytes = 0;
    if (::ioctl(fd_, BLKGETSIZE64, &bytes) != 0) return Error::sys(errno, "BLKGETSIZE64 failed on " + path_);
    size_ = bytes;
    return bytes;
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return Error::sys(errno, "cannot stat " + path_);
  if (static_cast<uint64_t>(st.st_size) < at_least) {
    if (read_only_) return Error::io(EROFS, path_ + " is open read-only");
    // Sparse: the new end costs nothing until written.
    if (::ftruncate(fd_, static_cast<off_t>(at_least)) != 0)
      return Error::sys(errno, "cannot extend " + path_ + " to " + std::to_string(at_least) + " bytes");
    st.st_size = static_cast<off_t>(at_least);
  }
  size_ = static_cast<uint64_t>(st.st_size) / lss_ * lss_;
  return size_.load();
}

Result<uint64_t> FileDevice::truncate(uint64_t bytes) {
  if (is_bdev_ || bytes >= size_.load()) return size_.load();
  if (wb_) wait_all();  // F5
  if (read_only_) return Error::io(EROFS, path_ + " is open read-only");
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0)
    return Error::sys(errno, "cannot cut " + path_ + " to " + std::to_string(bytes) + " bytes");
  size_ = bytes / lss_ * lss_;
  return size_.load();
}

std::string FileDevice::display_name() const { return display_; }

Result<void> FileDevice::pread_all(int fd, uint64_t offset, std::span<std::byte> out) const {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::sys(errno, "read of " + path_ + " at byte " + std::to_string(offset + done) +
                                  " failed");
    }
    if (n == 0) return Error::io(EIO, "unexpected end of " + path_);
    done += static_cast<size_t>(n);
  }
  return ok();
}

// pwrite may write less than asked (a full host filesystem, a signal): loop,
// and report the error that ends the loop, never a short success.
Result<void> FileDevice::pwrite_all(int fd, uint64_t offset, std::span<const std::byte> in) const {
  size_t done = 0;
  while (done < in.size()) {
    ssize_t n = ::pwrite(fd, in.data() + done, in.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::sys(errno, "write of " + path_ + " at byte " + std::to_string(offset + done) +
                                  " failed");
    }
    if (n == 0) return Error::io(EIO, "write of " + path_ + " made no progress");
    done += static_cast<size_t>(n);
  }
  return ok();
}

Result<void> FileDevice::read(uint64_t offset, std::span<std::byte> out) {
  PLY_CHECK(check_range(*this, offset, out.size()));
  if (!wb_) return pread_all(fd_, offset, out);
  return direct_read(offset, out);
}

Result<void> FileDevice::write(uint64_t offset, std::span<const std::byte> in) {
  if (read_only_) return Error::io(EROFS, path_ + " is open read-only");
  PLY_CHECK(check_range(*this, offset, in.size()));
  if (wb_) return queue_write(offset, in);
  PLY_CHECK(pwrite_all(fd_, offset, in));
  if (unkicked_.fetch_add(in.size(), std::memory_order_relaxed) + in.size() >= kKickBytes) kick();  // F7
  return ok();
}

Result<void> FileDevice::flush() {
  if (read_only_) return ok();
  if (wb_) PLY_CHECK(wait_written());  // F2
  if (::fdatasync(fd_) != 0) return Error::sys(errno, "flush (fdatasync) of " + path_ + " failed");
  return ok();
}

Result<void> FileDevice::discard(uint64_t offset, uint64_t len) {
  if (read_only_) return Error::io(EROFS, path_ + " is open read-only");
  PLY_CHECK(check_range(*this, offset, len));
  if (len == 0) return ok();
  if (wb_) wait_unshadowed(offset, len);  // F3
  int r;
  if (is_bdev_) {
    uint64_t range[2] = {offset, len};
    r = ::ioctl(fd_, BLKDISCARD, &range);
  } else {
    r = ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                    static_cast<off_t>(len));
  }
  // Discard is advisory (D7): a device that cannot do it loses nothing.
  if (r != 0 && errno != EOPNOTSUPP && errno != ENOTTY)
    return Error::sys(errno, "discard on " + path_ + " failed");
  return ok();
}

}  // namespace plyfs
