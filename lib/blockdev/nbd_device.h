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
// Invariants:
//   N1 Every libnbd call that can run a connection's state machine (aio
//      submit, notify, close) is made with that connection's mutex held, so
//      completion callbacks, which run inside those calls, may touch the
//      waiters' state without a lock of their own.
//   N2 At most one thread polls a connection's socket at a time; a submit
//      that changes the direction the poller waits for wakes it (eventfd).
//   N3 A request's waiter lives until its callback has run: libnbd retires
//      every command, with ENOTCONN when the connection dies.
#pragma once

#include <memory>
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
  size_t connections() const { return conns_.size(); }
  bool can_trim() const { return can_trim_; }

  struct Conn;  // one connection and its poller (nbd_device.cpp)

 private:
  NbdDevice() = default;
  enum class Op { kRead, kWrite, kTrim, kFlush };
  Result<void> submit(Op op, uint64_t offset, std::byte* buf, uint64_t len);
  Conn& pick();

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
