// Devices for tests and tools. They sit below the BlockDevice interface, the
// only place plyfs allows doubles:
//   MemDevice        sparse, in memory, with a crash() that applies D1/D2
//   RecordingDevice  logs every write, flush, discard and mark, in order
//   FaultDevice      fails the Nth matching call once or from then on
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "blockdev/blockdev.h"
#include "blockdev/borrowed_device.h"

namespace plyfs {

// A sparse in-memory device. Unwritten sectors read as zeroes. It also models
// the volatile write cache (D2) when asked to: track_unflushed() keeps every
// write since the last flush so that crash() can drop or tear them.
class MemDevice final : public BlockDevice {
 public:
  explicit MemDevice(uint64_t size_bytes, uint32_t sector_size = 512,
                     uint32_t physical_sector_size = 4096);

  Result<void> read(uint64_t offset, std::span<std::byte> out) override;
  Result<void> write(uint64_t offset, std::span<const std::byte> in) override;
  Result<void> flush() override;
  Result<void> discard(uint64_t offset, uint64_t len) override;
  uint64_t size_bytes() const override { return size_; }
  uint32_t logical_sector_size() const override { return lss_; }
  uint32_t physical_sector_size() const override { return pss_; }

  // A deep copy, with the writes not yet flushed when tracking is on, so
  // that several power cuts can be tried from one state.
  std::unique_ptr<MemDevice> clone() const;
  // Overwrite bytes directly, bypassing the contract (to craft corruption).
  void poke(uint64_t offset, std::span<const std::byte> bytes);
  std::vector<std::byte> peek(uint64_t offset, size_t len) const;
  void peek_into(uint64_t offset, std::span<std::byte> out) const;
  // Same bytes everywhere (unwritten pages read as zeroes on both sides).
  bool same_content(const MemDevice& other) const;
  uint64_t pages_in_use() const;

  // D2: remember each write since the last flush (its old and new sector
  // content) so that crash() can model a power cut.
  void track_unflushed(bool on);
  // Power cut: every unflushed write is kept, dropped or torn at sector
  // granularity, chosen by `rng`. Returns how many sectors went back to their
  // old content.
  uint64_t crash(std::mt19937_64& rng);

 private:
  static constexpr uint64_t kPage = 4096;
  struct Pending { uint64_t sector_offset; std::vector<std::byte> old_bytes; };
  void write_locked(uint64_t offset, std::span<const std::byte> in);
  void read_locked(uint64_t offset, std::span<std::byte> out) const;

  mutable std::mutex mu_;
  uint64_t size_;
  uint32_t lss_, pss_;
  std::unordered_map<uint64_t, std::unique_ptr<std::byte[]>> pages_;
  bool track_ = false;
  std::vector<Pending> unflushed_;  // in write order, one entry per sector
};

// Logs every call that reaches the device, in order, and forwards it.
class RecordingDevice final : public BlockDevice {
 public:
  enum class Kind : uint8_t { Write, Flush, Discard, Mark, WriteFailed, FlushFailed };
  struct Entry {
    Kind kind;
    uint64_t offset = 0, length = 0;
    std::shared_ptr<const std::vector<std::byte>> data;  // Write: the bytes written
    std::string label;                                    // Mark
    uint64_t arg = 0;                                     // Mark
  };

  explicit RecordingDevice(BlockDevice& inner) : inner_(inner) {}
  Result<void> read(uint64_t offset, std::span<std::byte> out) override;
  Result<void> write(uint64_t offset, std::span<const std::byte> in) override;
  Result<void> flush() override;
  Result<void> discard(uint64_t offset, uint64_t len) override;
  uint64_t size_bytes() const override { return inner_.size_bytes(); }
  uint32_t logical_sector_size() const override { return inner_.logical_sector_size(); }
  uint32_t physical_sector_size() const override { return inner_.physical_sector_size(); }

  // Operation begin/end, acknowledged fsync/commit, or any label of the test's.
  void mark(std::string label, uint64_t arg = 0);
  std::vector<Entry> log() const;
  void clear();

 private:
  BlockDevice& inner_;
  mutable std::mutex mu_;
  std::vector<Entry> log_;
};

// Injects failures into calls to an inner device.
class FaultDevice final : public BlockDevice {
 public:
  // Modify counts writes, flushes and discards together: a power cut at the
  // Nth change, whatever reads happen meanwhile.
  enum class Op : uint8_t { Read, Write, Flush, Discard, Any, Modify };
  enum class Kind : uint8_t {
    Eio,     // nothing happens, EIO
    Enospc,  // nothing happens, ENOSPC
    Short,   // a write: its first half of sectors lands, then ENOSPC
    Torn,    // a write: a random subset of its sectors lands, then EIO
  };
  struct Rule {
    Op op = Op::Any;
    uint64_t nth = 1;    // the Nth matching call (1-based) fails...
    bool sticky = false; // ...once, or every matching call from the Nth on
    Kind kind = Kind::Eio;
    uint64_t seed = 0;   // for Torn
  };

  explicit FaultDevice(BlockDevice& inner) : inner_(inner) {}
  Result<void> read(uint64_t offset, std::span<std::byte> out) override;
  Result<void> write(uint64_t offset, std::span<const std::byte> in) override;
  Result<void> flush() override;
  Result<void> discard(uint64_t offset, uint64_t len) override;
  uint64_t size_bytes() const override { return inner_.size_bytes(); }
  uint32_t logical_sector_size() const override { return inner_.logical_sector_size(); }
  uint32_t physical_sector_size() const override { return inner_.physical_sector_size(); }

  void add(Rule r);
  void clear();          // remove all rules and reset the counters
  uint64_t fired() const;  // how many calls failed so far
  uint64_t calls(Op op) const;

 private:
  // Counts the call and returns the rule that makes it fail, if any.
  const Rule* hit(Op op);
  BlockDevice& inner_;
  mutable std::mutex mu_;
  std::vector<Rule> rules_;
  uint64_t counts_[6] = {};
  uint64_t fired_ = 0;
};

}  // namespace plyfs
