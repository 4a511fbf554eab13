// The block-device interface: the only way any layer of plyfs touches storage,
// and the place where tests plug in doubles and faults.
//
// Addresses are byte offsets. Offsets and lengths must be multiples of
// logical_sector_size(). The filesystem's block size is a property of the
// format (chosen by mkfs), not of the device; the device only knows sectors,
// which is also the unit of the crash model below.
//
// The device contract (format.md#device-contract). The commit protocol relies
// on exactly these rules, and the crash tests model exactly these:
//   D1 atomic unit: one logical sector. An interrupted write of n sectors may
//      persist any subset of them; each persisted sector holds the old or the
//      new bytes.
//   D2 volatile cache: a completed write() is durable only once a flush()
//      issued after it has returned success. Writes not yet covered by a flush
//      may be lost in any combination and persist in any order.
//   D3 flush is the only barrier: on success every write completed before the
//      call is durable.
//   D4 failed flush: the writes it covered stay unknown (any subset, possibly
//      torn) even after a later flush succeeds. The filesystem must never
//      retry a flush and then claim durability for those writes.
//   D5 failed write: the target sectors hold old or new bytes.
//   D6 reads may fail, transiently or persistently, per sector.
//   D7 discard: the content of a discarded range is unspecified (old or zero)
//      until rewritten.
// Calls are synchronous: issue order equals completion order. Implementations
// are safe to call from several threads at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "util/result.h"

namespace plyfs {

// One write of a batch (BlockDevice::write_batch).
struct WriteReq {
  uint64_t offset;
  std::span<const std::byte> data;
};

class DeviceSet;

class BlockDevice {
 public:
  virtual ~BlockDevice() = default;
  // The devices of a multi-device volume this one is (format.md#multi-device):
  // a DeviceSet answers itself, a wrapper that forwards every request to one
  // device answers that device's. Null: one device. Recovery and fsck read
  // each member's superblocks through it, mkfs writes each member's label.
  virtual DeviceSet* device_set() { return nullptr; }
  // What listings call this device (device_display_name: an absolute path,
  // or a URI); empty for one that has no name (memory, test doubles).
  // Wrappers answer for the device they forward to.
  virtual std::string display_name() const { return {}; }
  virtual Result<void> read(uint64_t offset, std::span<std::byte> out) = 0;
  // A read of the medium itself, past any cache of this process's in
  // between (ReadCacheDevice): what a scrub must check. Wrappers forward it
  // to the device they read from; a device with no such cache reads.
  virtual Result<void> read_uncached(uint64_t offset, std::span<std::byte> out) { return read(offset, out); }
  virtual Result<void> write(uint64_t offset, std::span<const std::byte> in) = 0;
  virtual Result<void> flush() = 0;  // durability barrier (D3)
  // Several writes with no order among them: D2 already lets writes not
  // yet covered by a flush persist in any order, so a device may have them
  // all in flight at once (NbdDevice does: a commit's runs go out
  // together). Returns when every one has completed; the first error, and
  // then each target holds old or new bytes (D5). Default: one by one.
  virtual Result<void> write_batch(std::span<const WriteReq> reqs) {
    for (const auto& r : reqs) PLY_CHECK(write(r.offset, r.data));
    return ok();
  }
  virtual Result<void> discard(uint64_t offset, uint64_t len) = 0;
  virtual uint64_t size_bytes() const = 0;
  virtual uint32_t logical_sector_size() const = 0;
  virtual uint32_t physical_sector_size() const = 0;
  // Reads the device's size again (a block device or image file may have
  // grown since it was opened) and, for an image file smaller than
  // `at_least` bytes, extends it first; returns the size now. A device that
  // cannot change keeps its size (plyctl resize, format.md#resize).
  virtual Result<uint64_t> resize(uint64_t at_least) {
    (void)at_least;
    return size_bytes();
  }
  // After a shrink (format.md#relocation): an image file longer than
  // `bytes` is cut to it, giving the space back to its host; a device keeps
  // its size. Returns the size now.
  virtual Result<uint64_t> truncate(uint64_t bytes) {
    (void)bytes;
    return size_bytes();
  }
};

// EINVAL for a misaligned request, EIO for one past the end of the device.
Result<void> check_range(const BlockDevice& dev, uint64_t offset, uint64_t len);

struct FileOpenOptions {
  bool read_only = false;
  // Keep other plyfs processes out: an exclusive flock for read-write opens,
  // a shared one for read-only opens, and O_EXCL on a block device opened
  // read-write (which also fails while the kernel has it mounted).
  bool lock = true;
  // O_DIRECT (format.md#device-direct): no host page cache between plyfs
  // and the device, so its bytes are not cached twice (the kernel's FUSE
  // page cache holds the files) and reach the device without the page
  // cache's copy and writeback. Writes are then write-back in the device
  // (FileDevice below). Ignored for NBD URIs (no host page cache there);
  // a file whose filesystem refuses O_DIRECT is opened buffered.
  bool direct = false;
  // For an NBD URI: a cache of this many bytes of the export in this
  // process (ReadCacheDevice, read_cache.h), in place of the host page
  // cache that an image file has; 0: none. Ignored for a path.
  uint64_t nbd_cache_bytes = 0;
};

// A regular image file or a block device, through pread/pwrite/fdatasync.
//
// Opened with `direct` (and where the host allows O_DIRECT), writes are
// write-back, as a disk's volatile cache is (D2), since the page cache that
// made a buffered pwrite cheap is gone (file_writeback.cpp):
//   F1 write() copies the bytes into an aligned buffer and queues them for
//      a few writer threads; it returns before they reach the device. At
//      most kWriteBackBytes are queued; past that, write() waits. The
//      threads start with the first write, so a program may open the
//      device and then fork (plyfs does) as long as it writes after.
//   F2 flush() waits for every write begun before it, then fdatasync: it
//      covers exactly those (D3). A write the host failed fails the next
//      flush and every later write and flush (D4: never retried into a claim
//      of durability); reads go on.
//   F3 Queued writes never overlap: a write, read or discard of bytes that
//      a queued write covers waits for it, so a read sees the write before
//      it and two writes of one sector land in their order.
//   F4 A request that O_DIRECT cannot take (not aligned to the host's
//      direct-I/O offset or memory alignment) goes through a second,
//      buffered descriptor of the same file; Linux keeps the two coherent.
//   F5 resize, truncate and the destructor first wait for every queued
//      write.
//   F6 A write smaller than kStageBytes is staged, not yet queued: the next
//      write of the bytes right after it joins it, so that what the
//      allocator laid out in a row (copy-on-write data, a commit's nodes)
//      reaches the device as one O_DIRECT request. The run is queued when a
//      write that does not join it comes, when it is full, and when a
//      read, discard or flush needs it (as NbdDevice's, nbd_device.h N6).
//
// Opened buffered (the default), writes are the host's page cache's until
// the host writes them back, which it would only do at the next flush
// (fdatasync) or after half a minute:
//   F7 Every kKickBytes written, a thread of the device's starts writeback
//      of the image's dirty pages (sync_file_range SYNC_FILE_RANGE_WRITE,
//      which waits for nothing), so that the device writes while the
//      workload runs and a commit's flush, or the unmount's, finds little
//      left. Durability is still only the flush's (D2, D3).
class FileDevice final : public BlockDevice {
 public:
  static Result<std::unique_ptr<FileDevice>> open(const std::string& path,
                                                  FileOpenOptions opts = {});
  ~FileDevice() override;

  Result<void> read(uint64_t offset, std::span<std::byte> out) override;
  Result<void> write(uint64_t offset, std::span<const std::byte> in) override;
  Result<void> flush() override;
  Result<void> discard(uint64_t offset, uint64_t len) override;
  uint64_t size_bytes() const override { return size_.load(std::memory_order_acquire); }
  uint32_t logical_sector_size() const override { return lss_; }
  uint32_t physical_sector_size() const override { return pss_; }
  Result<uint64_t> resize(uint64_t at_least) override;
  Result<uint64_t> truncate(uint64_t bytes) override;

  bool is_block_device() const { return is_bdev_; }
  // Opened with O_DIRECT (FileOpenOptions::direct, where the host allows it).
  bool is_direct() const { return wb_ != nullptr; }
  // The writes the writer threads have made of the device so far (F6: a
  // staged run is one).
  uint64_t direct_writes() const;
  const std::string& path() const { return path_; }
  std::string display_name() const override;  // device_display_name(path()) when opened

  static constexpr uint64_t kWriteBackBytes = 64ull << 20;
  static constexpr int kWriterThreads = 4;
  static constexpr uint64_t kStageBytes = 1ull << 20;  // F6: a run of at most this much
  static constexpr uint64_t kStageMin = 4096;          // queued once it has no room for this
  static constexpr uint64_t kKickBytes = 8ull << 20;   // F7
  struct WriteBack;  // the queue and writer threads of F1-F6 (file_writeback.cpp)
  struct Kicker;     // F7's thread (file_writeback.cpp)

 private:
  FileDevice();
  Result<void> open_direct();  // O_DIRECT beside fd_, writers started (F1, F4)
  Result<void> pread_all(int fd, uint64_t offset, std::span<std::byte> out) const;
  Result<void> pwrite_all(int fd, uint64_t offset, std::span<const std::byte> in) const;
  bool direct_ok(uint64_t offset, const void* buf, size_t len) const;  // F4
  Result<void> direct_read(uint64_t offset, std::span<std::byte> out);
  Result<void> queue_write(uint64_t offset, std::span<const std::byte> in);  // F1
  Result<void> wait_written();  // F2: the writes begun before this call; the sticky error
  void wait_unshadowed(uint64_t offset, uint64_t len);  // F3
  void wait_all();  // F5
  std::string path_;
  std::string display_;  // device_display_name(path_) when it was opened
  int fd_ = -1;
  bool is_bdev_ = false;
  bool read_only_ = false;
  std::atomic<uint64_t> size_{0};  // grows with resize(), read by every I/O's range check
  uint32_t lss_ = 512, pss_ = 512;
  int dfd_ = -1;                    // the O_DIRECT descriptor, when direct
  uint32_t dio_offset_align_ = 0;   // what O_DIRECT needs of offsets and lengths (F4)
  uint32_t dio_mem_align_ = 0;      // ... and of buffers
  std::unique_ptr<WriteBack> wb_;   // direct only
  std::unique_ptr<Kicker> kick_;    // buffered, made by the first kick (F7)
  std::once_flag kick_once_;
  std::atomic<uint64_t> unkicked_{0};  // bytes written since the last kick
  void kick();
};

// An image wherever the tools take one: an NBD URI (nbd://, nbds://,
// nbd+unix://: NbdDevice) or else a path (FileDevice). NBD has no lock: with
// opts.lock, a URI that a plyfs mount here was given is EBUSY, as a locked
// image file is. EOPNOTSUPP for a URI when this build has no NBD support.
bool is_nbd_uri(std::string_view path_or_uri);
// How a device is named in listings and device tables: a URI as given, a
// path made absolute (realpath; as given when that fails), since a daemon
// leaves the working directory it was started in.
std::string device_display_name(const std::string& path_or_uri);
// What makes two names one device: the inode of a regular file, the device
// number of a block device, the text of a URI; for a file not made yet, the
// inode of its directory and its name (or the text, when that directory
// cannot be looked at either). Equal for `a.img`, `./a.img` and a symlink.
std::string device_identity(const std::string& path_or_uri);
Result<std::unique_ptr<BlockDevice>> open_device(const std::string& path_or_uri,
                                                 FileOpenOptions opts = {});

}  // namespace plyfs
