// An image on an NBD server (nbdkit, qemu-nbd, nbd-server), through libnbd:
// no kernel nbd module, no root. Only built when meson finds libnbd
// (option nbd); open_device() picks it for nbd://, nbds:// and nbd+unix://.
//
// How the device contract (blockdev.h, format.md#device-contract) maps:
//   D2/D3 write() is NBD_CMD_WRITE without FUA; flush() is NBD_CMD_FLUSH, the
//         only barrier. A read-write open refuses a server that cannot flush.
//   D7    discard() is NBD_CMD_TRIM when the server offers it, else nothing.
//   D1    the logical sector is the server's minimum block size (512 when it
//         names none).
// Many requests are in flight at once: each connection is driven through
// libnbd's asynchronous API, and the threads waiting on it take turns at
// polling its socket (N1 below). A server that allows multi-conn gets a few
// connections; one flush covers the writes completed on all of them, which
// is what multi-conn promises (NBD protocol, "Multi-conn").
//
// Writes are write-back, as a disk's volatile cache is (D2): write()
// copies the data and returns once the request is on its way; the server's
// answer comes later, and a background thread per connection polls for it
// while writes are in flight. flush() first waits for every write begun
// before it, then sends NBD_CMD_FLUSH, so that it covers them (D3). A write
// the server failed fails the next flush and every later write (sticky:
// D4 forbids claiming it durable after a retry); reads go on. Up to
// kWriteBackBytes are in flight; past that, write() waits.
//
// Invariants:
//   N1 Every libnbd call that can run a connection's state machine (aio
//      submit, notify, close) is made with that connection's mutex held, so
//      completion callbacks, which run inside those calls, may touch the
//      waiters' state without a lock of their own.
//   N2 At most one thread polls a connection's socket at a time; a submit
//      that changes the direction the poller waits for wakes it (eventfd).
//   N3 A request's waiter lives until its callback has run: libnbd retires
//      every command, with ENOTCONN when the connection dies.
//   N4 Writes in flight never overlap: a write, read or trim of bytes that
//      one in flight covers waits for it (NBD orders no two requests in
//      flight, and a read must see the write before it).
//   N5 Lock order: a connection's mutex, then wmu_; never the other way.
//   N6 A write smaller than kStageBytes is staged, not sent: the next
//      write of the bytes right after it joins it, so that writes the
//      allocator laid out in a row (the copy-on-write data of random small
//      writes, a commit's nodes) cost one request instead of one each. The
//      staged run is in flight for N4 and for flush() (its first write's
//      number), and goes out when a write that does not join it comes,
//      when it is full, when a read, trim or flush needs its bytes, and at
//      close. D2 allows a write to sit in a volatile cache until a flush.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "blockdev/blockdev.h"

struct nbd_handle;

namespace plyfs {

class NbdDevice final : public BlockDevice {
 public:
  // uri: nbd://HOST[:PORT]/EXPORT, nbds://..., nbd+unix:///EXPORT?socket=PATH.
  static Result<std::unique_ptr<NbdDevice>> open(const std::string& uri, bool read_only);
  ~NbdDevice() override;

  Result<void> read(uint64_t offset, std::span<std::byte> out) override;
  Result<void> write(uint64_t offset, std::span<const std::byte> in) override;
  Result<void> flush() override;
  // Every write in flight at once, spread over the connections.
  Result<void> write_batch(std::span<const WriteReq> reqs) override;
  Result<void> discard(uint64_t offset, uint64_t len) override;
  uint64_t size_bytes() const override { return size_; }
  uint32_t logical_sector_size() const override { return lss_; }
  uint32_t physical_sector_size() const override { return pss_; }
  // The NBD protocol fixes an export's size when the connection is made:
  // both return it (a grown export is seen after a remount).
  Result<uint64_t> resize(uint64_t at_least) override;

  const std::string& uri() const { return uri_; }
  std::string display_name() const override { return uri_; }
  size_t connections() const { return conns_.size(); }
  bool can_trim() const { return can_trim_; }

  static constexpr uint64_t kWriteBackBytes = 64ull << 20;
  static constexpr uint64_t kStageBytes = 1ull << 20;  // N6: a run of at most this much
  static constexpr uint64_t kStageMin = 4096;          // sent once it has no room for this

  struct Conn;        // one connection and its poller (nbd_device.cpp)
  struct AsyncWrite;  // a write in flight

 private:
  NbdDevice() = default;
  enum class Op { kRead, kTrim, kFlush };
  Result<void> submit(Op op, uint64_t offset, std::byte* buf, uint64_t len);
  Conn& pick();
  // N4: waits until nothing in flight overlaps [offset, offset + len).
  void wait_unshadowed(uint64_t offset, uint64_t len);
  bool overlaps_locked(uint64_t offset, uint64_t len) const;
  Error failed_error() const;
  void write_done(AsyncWrite* w);  // its last piece answered (N1: its connection's mutex held)
  // A write registered in flight, its bytes in `data` (N6: a staged run's
  // buffer may be larger than len).
  struct Staged {
    uint64_t seq, offset, len;
    std::vector<std::byte> data;  // len bytes (a run grows as writes join it)
  };
  Result<void> send(Staged w);   // submits it (no lock held; N5)
  std::optional<Staged> take_staged_locked();
  void send_staged();            // the staged run, if any, goes out

  std::mutex wmu_;  // guards what follows (N5)
  std::condition_variable wcv_;            // a write in flight was answered
  std::map<uint64_t, uint64_t> inflight_;  // offset -> length of each write in flight (N4: disjoint)
  uint64_t inflight_bytes_ = 0;
  // Each write's number, in the order write() took them, and those in
  // flight: a flush waits only for the writes begun before it (D3), so
  // that writers that never pause cannot hold a commit back.
  uint64_t next_seq_ = 1;
  std::set<uint64_t> inflight_seqs_;
  int failed_ = 0;  // the first error a write in flight got: sticky for writes and flushes
  std::string failed_msg_;
  bool abandoned_ = false;  // a dead connection left writes unanswered (never, by N3)
  std::optional<Staged> staged_;  // N6

  std::string uri_;
  std::vector<std::unique_ptr<Conn>> conns_;
  bool read_only_ = false;
  bool can_trim_ = false;
  uint64_t size_ = 0;
  uint64_t max_request_ = 32u << 20;
  uint32_t lss_ = 512, pss_ = 512;
  std::atomic<uint64_t> next_{0};  // round-robin over conns_
};

}  // namespace plyfs
