// Volumes across several in-memory devices (format.md#multi-device), for
// the library tests of devices and placement.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "blockdev/device_set.h"
#include "blockdev/test_devices.h"
#include "commit/devices.h"
#include "commit/disk_superblock.h"
#include "fs/fs.h"
#include "fs_image.h"
#include "test_util.h"

namespace plyfs::test {

// The set over `devs` as plan_devices lays them out.
inline std::unique_ptr<DeviceSet> assemble(const std::vector<BlockDevice*>& devs) {
  std::vector<uint64_t> sizes;
  for (auto* d : devs) sizes.push_back(d->size_bytes());
  const auto layout = plan_devices(sizes, 4096);
  std::vector<DeviceSet::Member> m;
  for (size_t i = 0; i < devs.size(); i++)
    m.push_back(DeviceSet::Member{std::make_unique<BorrowedDevice>(*devs[i]), layout[i].first * 4096,
                                  layout[i].second * 4096, "dev" + std::to_string(i)});
  return must(DeviceSet::make(std::move(m), disk::kReservedBytes));
}

// The set of the devices `sb`'s table lists, each found among `devs` by its
// label, where the table puts it (as open_volume assembles one; a table
// with a device removed is not plan_devices' layout).
inline std::unique_ptr<DeviceSet> assemble_table(const SuperInfo& sb, const std::vector<BlockDevice*>& devs) {
  std::vector<DeviceSet::Member> m;
  for (const auto& d : sb.devices) {
    BlockDevice* found = nullptr;
    for (auto* dev : devs) {
      auto l = read_device_label(*dev);
      if (l && *l && (*l)->device_uuid == d.uuid) found = dev;
    }
    REQUIRE(found);
    m.push_back(DeviceSet::Member{std::make_unique<BorrowedDevice>(*found), d.first_block * sb.block_size,
                                  d.nblocks * sb.block_size, uuid_text(d.uuid)});
  }
  return must(DeviceSet::make(std::move(m), disk::kReservedBytes));
}

// A power cut during an operation on several devices: for each device j
// and each of its calls k that modify it (writes and flushes), call k and
// every later one fail (EIO); then every device keeps, drops or tears its
// unflushed writes on its own, `tears` times, each giving one crash state.
// `op(members)` runs the operation on the devices (j behind the fault);
// true when it ran to its end, which ends j's calls. `check(crashed, j, k,
// tear)` gets each state. Returns the number of states.
template <class Op, class Check>
uint64_t power_cuts(const std::vector<std::unique_ptr<MemDevice>>& base, uint64_t s0, uint64_t max_calls,
                    uint64_t tears, Op op, Check check) {
  uint64_t states = 0;
  for (size_t j = 0; j < base.size(); j++) {
    for (uint64_t k = 1;; k++) {
      REQUIRE(k < max_calls);  // the operation ends when nothing is cut
      std::vector<std::unique_ptr<MemDevice>> devs;
      for (const auto& d : base) devs.push_back(d->clone());
      for (auto& d : devs) d->track_unflushed(true);
      FaultDevice cut(*devs[j]);
      cut.add({FaultDevice::Op::Modify, k, true, FaultDevice::Kind::Eio, 0});
      std::vector<BlockDevice*> members;
      for (const auto& d : devs) members.push_back(d.get());
      members[j] = &cut;
      const bool done = op(members);
      for (uint64_t tear = 0; tear < tears; tear++) {
        std::vector<std::unique_ptr<MemDevice>> crashed;
        for (size_t i = 0; i < devs.size(); i++) {
          crashed.push_back(devs[i]->clone());
          std::mt19937_64 rng(s0 ^ (k * 131 + tear * 7 + i * 1009 + j * 65537));
          crashed.back()->crash(rng);
        }
        check(crashed, j, k, tear);
        states++;
      }
      if (done) break;
    }
  }
  return states;
}

template <class D>
std::vector<BlockDevice*> ptrs(const std::vector<std::unique_ptr<D>>& v) {
  std::vector<BlockDevice*> out;
  for (const auto& d : v) out.push_back(d.get());
  return out;
}

// Fresh in-memory devices formatted as one volume: `classes` named, device
// i of class device_classes[i].
inline std::vector<std::unique_ptr<MemDevice>> make_volume(const std::vector<uint64_t>& sizes,
                                                    const std::vector<std::string>& classes,
                                                    const std::vector<uint8_t>& device_classes) {
  std::vector<std::unique_ptr<MemDevice>> mem;
  for (uint64_t s : sizes) mem.push_back(std::make_unique<MemDevice>(s));
  auto set = assemble(ptrs(mem));
  FormatOptions fo;
  fo.classes = classes;
  fo.device_classes = device_classes;
  must(Volume::format(*set, fo));
  return mem;
}

inline std::vector<std::unique_ptr<MemDevice>> clones(const std::vector<std::unique_ptr<MemDevice>>& v) {
  std::vector<std::unique_ptr<MemDevice>> out;
  for (const auto& d : v) out.push_back(d->clone());
  return out;
}

// Which device of `sb` holds block b (-1: none).
inline int device_of(const SuperInfo& sb, uint64_t b) {
  for (size_t i = 0; i < sb.devices.size(); i++) {
    const auto& d = sb.devices[i];
    const uint64_t lo = i == 0 ? sb.first_block : d.first_block + sb.first_block;
    if (b >= lo && b < d.first_block + d.nblocks) return static_cast<int>(i);
  }
  return -1;
}

// A volume of several in-memory devices with a filesystem branch, opened
// read-write: the placement rules' tests start from it.
struct MultiFsImage {
  std::vector<std::unique_ptr<MemDevice>> mem;
  std::unique_ptr<DeviceSet> set;
  std::unique_ptr<Volume> vol;
  TreeId main;

  MultiFsImage(const std::vector<uint64_t>& sizes, const std::vector<std::string>& classes,
               const std::vector<uint8_t>& device_classes) {
    for (uint64_t s : sizes) mem.push_back(std::make_unique<MemDevice>(s));
    set = assemble(ptrs(mem));
    FormatOptions fo;
    fo.classes = classes;
    fo.device_classes = device_classes;
    must(format_filesystem(*set, fo, FsCreateOptions{}));
    open();
    main = must(Filesystem::default_tree(*vol));
  }
  void open() { vol = open_fs_volume(*set); }
  void reopen() {
    must(vol->close());
    vol.reset();
    open();
  }
};

}  // namespace plyfs::test
