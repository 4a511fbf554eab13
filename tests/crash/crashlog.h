// Recorded logs and the crash states built from them (docs/testing.md).
//
// A crash state is the base image plus: every write before the last
// successful flush before the crash point (durable, D3), and a chosen subset
// of the writes after it (D2), the last of which may be torn at sector
// granularity (D1), its lost sectors old, garbage or unreadable. A flush that
// failed closes nothing: the writes it covered stay in the open set (D4).
// A sector discarded before the crash point and not written since (by a
// write in the state) reads as zeros (D7 allows zeros or the old bytes; the
// old bytes are the state without the discard, which the same enumeration
// covers where no discard happened, and the protocol check P7 covers here).
// States are never copied images: reads resolve through the log.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "blockdev/device_set.h"
#include "blockdev/test_devices.h"

namespace plyfs::crash {

using Entry = RecordingDevice::Entry;
using Kind = RecordingDevice::Kind;

struct SuperWrite {
  size_t pos;       // index in the log
  int slot;
  uint64_t gen;     // parsed from the written bytes, not reported by a hook
};

struct Log {
  std::unique_ptr<MemDevice> base;  // the image when recording began
  std::vector<Entry> entries;
  uint32_t sector = 512;
  uint32_t block_size = 4096;

  // Derived by index():
  std::vector<size_t> writes;         // positions of Write and WriteFailed entries
  std::vector<size_t> flushes;        // successful flushes that close an epoch
  std::vector<size_t> discards;       // positions of Discard entries
  size_t first_failed_flush = 0;      // entries.size() if none
  std::vector<SuperWrite> supers;     // superblock writes, in order
  std::unordered_map<uint64_t, std::vector<uint32_t>> by_sector;  // sector -> write positions
  void index();

  bool is_write(size_t pos) const {
    return entries[pos].kind == Kind::Write || entries[pos].kind == Kind::WriteFailed;
  }
  // The last successful flush before `crash_at` (exclusive), or -1.
  long last_flush_before(size_t crash_at) const;
  // Commit points as the state at crash_at allows them: the newest
  // generation surely durable (its superblock write and a flush after it
  // happened), and the newest one whose superblock write happened at all.
  uint64_t gen_lo(size_t crash_at, uint64_t base_gen) const;
  uint64_t gen_hi(size_t crash_at, uint64_t base_gen) const;
};

// Reads a log that LogDevice (lib/blockdev/log_device.h, the daemon's
// `-o crashlog=PATH`) wrote into log.entries and log.sector, then indexes it;
// log.base is the caller's. A record cut short at the end of the file (a
// daemon killed while writing) is dropped. `ends`, when given, gets the file
// offset at which each entry ends. Empty on success, else what is wrong.
std::string load_log(const std::string& path, Log& log, std::vector<uint64_t>* ends = nullptr);

enum class Lost : uint8_t { Old, Garbage, Unreadable };

struct Spec {
  size_t crash_at = 0;              // entries [0, crash_at) happened
  std::vector<size_t> kept;         // open-set write positions that reached the disk
  // The last kept write may be torn: sectors with a 1 bit in `tear` are new,
  // the others `lost`.
  std::optional<std::vector<bool>> tear;
  Lost lost = Lost::Old;
  std::string tier;                 // T0..T4
  std::string id() const;
};

// A device showing one crash state. Writes after the crash (recovery, fsck,
// the write checks) go to a private overlay, so the log stays untouched.
class StateDevice final : public BlockDevice {
 public:
  StateDevice(const Log& log, Spec spec, uint64_t garbage_seed);
  Result<void> read(uint64_t offset, std::span<std::byte> out) override;
  Result<void> write(uint64_t offset, std::span<const std::byte> in) override;
  Result<void> flush() override { return ok(); }
  Result<void> discard(uint64_t, uint64_t) override { return ok(); }
  uint64_t size_bytes() const override { return log_.base->size_bytes(); }
  uint32_t logical_sector_size() const override { return log_.sector; }
  uint32_t physical_sector_size() const override { return log_.sector; }

  uint64_t overlay_writes() const { return overlay_writes_; }
  const Spec& spec() const { return spec_; }

 private:
  Result<void> read_sector(uint64_t sector, std::byte* out);
  // A discard before the crash point, after log position `after` (-1: the
  // base image), covers `sector`.
  bool discarded(uint64_t sector, long after) const;
  const Log& log_;
  Spec spec_;
  uint64_t seed_;
  size_t open_start_ = 0;             // first position of the open set
  std::vector<char> kept_mask_;       // per log position: kept (open set)
  std::unordered_map<uint64_t, std::vector<std::byte>> overlay_;
  uint64_t overlay_writes_ = 0;
};

// ------------------------------------------------------------ several devices
//
// A volume of several devices (format.md#multi-device) is recorded as one
// global order of every member's calls: a power cut is one instant. Each
// member keeps the device contract on its own (format.md#multi-device,
// "Device contract"): at the cut, member d holds every write before ITS last
// successful flush, and any subset of its writes since, the last kept one
// possibly torn. So a multi-device crash state is a cut in the global order
// and one Spec per member, each built over that member's own log.

struct MultiLog {
  std::vector<uint64_t> member_bytes;  // each member's size, laid out by plan_devices
  std::vector<Log> members;            // each member's own log; offsets are the member's
  // The global order, marks included: entries[i] is member dev[i]'s entry
  // local[i] (a mark: dev -1, local 0).
  std::vector<Entry> entries;
  std::vector<int> dev;
  std::vector<size_t> local;
  std::vector<std::vector<size_t>> global_of;  // member -> local position -> global position

  bool empty() const { return members.empty(); }
  // Of the global entries [0, cut), how many are member d's: its crash_at.
  size_t local_cut(size_t d, size_t cut) const;
  // Generations as for one device (Log::gen_lo, gen_hi), across the set: a
  // generation is durable only when every member flushed its superblock
  // (C4 on every device), and selectable only when every member was sent it.
  uint64_t gen_lo(size_t cut, uint64_t base_gen) const;
  uint64_t gen_hi(size_t cut, uint64_t base_gen) const;
};

// Records the members of a set into one MultiLog: member(d, inner) wraps
// member d's device, and the set the volume runs on is built over the
// wrappers. Calls are recorded as RecordingDevice records them.
class SetRecorder {
 public:
  std::unique_ptr<BlockDevice> member(size_t d, BlockDevice& inner);
  void mark(std::string label, uint64_t arg = 0);
  // The recorded order split into members' logs; `bases` are the members'
  // images when recording began (moved into the logs).
  MultiLog take(std::vector<std::unique_ptr<MemDevice>> bases, std::vector<uint64_t> member_bytes);

 private:
  friend class RecMember;
  void add(int d, Entry e);
  std::mutex mu_;
  std::vector<Entry> entries_;
  std::vector<int> dev_;
};

// A set over `devs` (borrowed, not owned) laid out by plan_devices over
// `member_bytes`, as mkfs lays out a new volume.
Result<std::unique_ptr<DeviceSet>> assemble(const std::vector<BlockDevice*>& devs,
                                            const std::vector<uint64_t>& member_bytes);

// A crash state of a multi-device volume: the cut, and each member's state
// (its Spec's crash_at is local_cut of the cut).
struct MultiSpec {
  size_t cut = 0;
  std::vector<Spec> members;
  std::string tier;
  std::string id() const;  // e.g. T2:at=41|0:keep=37,39|1:keep=|2:keep=40:tear=0110/old
};

}  // namespace plyfs::crash
