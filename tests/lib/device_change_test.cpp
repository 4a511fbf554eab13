// Devices joining and leaving a volume in use (Volume::add_device,
// Volume::remove_device; format.md#device-add, format.md#device-remove).
// Files, a snapshot and a reflinked copy are written across three devices;
// removing any one of them must move every block it held to the others
// (what was shared staying shared: the used blocks do not change), leave
// every file reading back byte for byte, the image verifying clean (an
// extent left in the removed device's blocks is A-hole), and the device
// wiped. Writers go on while a device leaves; a power cut during a removal,
// each device torn on its own, leaves the volume with the device or without
// it and every file whole.
#include <atomic>
#include <map>
#include <random>
#include <thread>

#include <catch2/generators/catch_generators.hpp>

#include "fs/check.h"
#include "snap/snap.h"
#include "multidev_util.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

std::vector<std::byte> pattern(uint64_t seed, uint64_t n) {
  std::vector<std::byte> v(n);
  std::mt19937_64 r(seed);
  for (auto& b : v) b = std::byte(r());
  return v;
}

// `n` files of up to `max_bytes` in the branch's root, plus a reflinked
// copy of the first.
Files write_files(Volume& vol, TreeId tree, uint64_t seed, int n, uint64_t max_bytes, const std::string& prefix) {
  Files out;
  auto fs = must(Filesystem::open(vol, tree));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < n; i++) {
    const std::string name = prefix + std::to_string(i);
    auto a = must(fs->mknod(fs->root(), name, S_IFREG | 0644, 0, 0, 0));
    auto data = pattern(rng(), 1 + rng() % max_bytes);
    REQUIRE(must(fs->write(a.ino, 0, data)) == data.size());
    out[name] = std::move(data);
  }
  auto src = must(fs->lookup(fs->root(), prefix + "0"));
  auto dst = must(fs->mknod(fs->root(), prefix + "copy", S_IFREG | 0644, 0, 0, 0));
  (void)must(fs->copy_range(src.ino, 0, dst.ino, 0, out[prefix + "0"].size()));
  out[prefix + "copy"] = out[prefix + "0"];
  return out;
}

// Blocks of extents on each device of the volume's table now.
std::vector<uint64_t> used_per_device(Volume& vol) {
  must(vol.commit());
  std::vector<uint64_t> out;
  for (const auto& u : must(vol.device_usage())) out.push_back(u.used_blocks);
  return out;
}

// The engine's invariants and every filesystem check, data checksums
// included (fsck -c).
void check_clean(BlockDevice& dev) {
  VerifyOptions vo;
  vo.kinds = fs_kinds();
  require_clean(dev, vo);
  CHECK(check_filesystems(dev, true).empty());
}

}  // namespace

TEST_CASE("devices: a device removed moves every block to the others; files, snapshots, reflinks intact",
          "[devices]") {
  const size_t gone = GENERATE(0, 1, 2);
  INFO("removing device " << gone);
  MultiFsImage im({8ull << 20, 8ull << 20, 16ull << 20}, {"fast", "slow"}, {0, 1, 1});
  Files want = write_files(*im.vol, im.main, 7 + gone, 20, 900 << 10, "f");
  const Snapshot s1 = must(snapshot(*im.vol, im.main, "s1"));
  const Files at_s1 = want;
  {  // Some rewritten after the snapshot (their old blocks the snapshot's).
    auto fs = must(Filesystem::open(*im.vol, im.main));
    for (int i = 1; i < 16; i += 4) {
      const std::string name = "f" + std::to_string(i);
      auto a = must(fs->lookup(fs->root(), name));
      auto data = pattern(100 + i, 50000);
      REQUIRE(must(fs->write(a.ino, 0, data)) == data.size());
      auto& w = want[name];
      if (w.size() < data.size()) w.resize(data.size());
      std::copy(data.begin(), data.end(), w.begin());
    }
  }
  const auto before = used_per_device(*im.vol);
  REQUIRE(before[gone] > 0);  // there is something to move
  const SuperInfo sb0 = im.vol->super();
  const uint64_t used = im.vol->space_stats().used_blocks;
  uint64_t last_done = 0, total = 0;
  (void)must(im.vol->remove_device(gone, [&](uint64_t d, uint64_t t) {
    REQUIRE(d >= last_done);
    last_done = d;
    total = t;
  }));
  CHECK(total > 0);
  CHECK(last_done == total);
  const SuperInfo sb = im.vol->super();
  REQUIRE(sb.devices.size() == 2);
  for (size_t i = 0, k = 0; i < 3; i++)
    if (i != gone) REQUIRE(sb.devices[k++].uuid == sb0.devices[i].uuid);
  CHECK(im.vol->space_stats().used_blocks == used);  // shared stayed shared
  CHECK(im.set->member_count() == 2);
  // Wiped: no label, no superblock.
  auto label = must(read_device_label(*im.mem[gone]));
  CHECK(!label);
  CHECK(!member_superblock(*im.mem[gone]));
  check_files(*im.vol, im.main, want);
  check_files(*im.vol, s1.frozen.tree, at_s1);
  // It goes on: new files land on the remaining devices.
  Files more = write_files(*im.vol, im.main, 99, 6, 300 << 10, "g");
  must(im.vol->close());
  im.vol.reset();
  // Opened again from the remaining devices alone.
  std::vector<BlockDevice*> rest;
  for (size_t i = 0; i < 3; i++)
    if (i != gone) rest.push_back(im.mem[i].get());
  auto set = assemble_table(must(member_superblock(*rest[0])), rest);
  check_clean(*set);
  auto vol = open_fs_volume(*set);
  REQUIRE(vol->super().devices.size() == 2);
  check_files(*vol, im.main, want);
  check_files(*vol, im.main, more);
  check_files(*vol, s1.frozen.tree, at_s1);
  must(vol->close());
  vol.reset();
  check_clean(*set);
}

TEST_CASE("devices: a removal that cannot be done is refused and changes nothing", "[devices]") {
  MultiFsImage im({4ull << 20, 16ull << 20, 6ull << 20}, {"fast", "slow"}, {0, 1, 1});
  // More data than devices 0 and 2 hold together.
  Files want = write_files(*im.vol, im.main, 3, 28, 1 << 20, "f");
  must(im.vol->commit());
  REQUIRE(im.vol->space_stats().used_blocks * 4096 > (10ull << 20));
  auto r = im.vol->remove_device(1);
  REQUIRE(!r);
  CHECK(r.error().code == ENOSPC);
  auto bad = im.vol->remove_device(3);
  REQUIRE(!bad);
  CHECK(bad.error().code == EINVAL);
  REQUIRE(im.vol->super().devices.size() == 3);
  REQUIRE(im.set->member_count() == 3);
  check_files(*im.vol, im.main, want);
  // Nothing stays excluded: the space the refused removal would have emptied
  // takes new data.
  Files more = write_files(*im.vol, im.main, 4, 4, 1 << 20, "g");
  im.reopen();
  check_files(*im.vol, im.main, more);
  must(im.vol->close());
  im.vol.reset();
  check_clean(*im.set);
  // The last device left cannot go.
  MultiFsImage two({4ull << 20, 8ull << 20}, {"fast", "slow"}, {0, 1});
  Files few = write_files(*two.vol, two.main, 5, 4, 100 << 10, "f");
  (void)must(two.vol->remove_device(0));
  REQUIRE(two.vol->super().devices.size() == 1);
  CHECK(two.vol->super().devices[0].first_block > 0);  // device 0 went: the first begins past block 0
  auto only = two.vol->remove_device(0);
  REQUIRE(!only);
  CHECK(only.error().code == EINVAL);
  check_files(*two.vol, two.main, few);
  two.reopen();
  check_files(*two.vol, two.main, few);
  must(two.vol->close());
  two.vol.reset();
  check_clean(*two.set);
}

TEST_CASE("devices: a device added to a volume in use takes data at once; a new class is the slowest",
          "[devices]") {
  MultiFsImage im({4ull << 20, 8ull << 20}, {"fast", "slow"}, {0, 1});
  Files want = write_files(*im.vol, im.main, 5, 8, 600 << 10, "f");
  auto extra = std::make_unique<MemDevice>(16ull << 20);
  auto other = std::make_unique<MemDevice>(8ull << 20);
  (void)must(im.vol->add_device(std::make_unique<BorrowedDevice>(*extra), "extra", "slow", false));
  REQUIRE(im.vol->super().devices.size() == 3);
  REQUIRE(im.set->member_count() == 3);
  // Named again: refused.
  auto twice = im.vol->add_device(std::make_unique<BorrowedDevice>(*extra), "extra", "slow", false);
  REQUIRE(!twice);
  CHECK(twice.error().message().find("already") != std::string::npos);
  // Filled past what the first two held: the new device takes data.
  Files more = write_files(*im.vol, im.main, 6, 18, 1 << 20, "g");
  const auto use = used_per_device(*im.vol);
  CHECK(use[2] > 0);
  (void)must(im.vol->add_device(std::make_unique<BorrowedDevice>(*other), "other", "archive", false));
  REQUIRE(im.vol->super().classes == std::vector<std::string>{"fast", "slow", "archive"});
  REQUIRE(im.vol->super().devices[3].class_id == 2);
  Files last = write_files(*im.vol, im.main, 8, 3, 200 << 10, "h");
  CHECK(used_per_device(*im.vol)[3] > 0);  // data goes to the slowest class first
  must(im.vol->close());
  im.vol.reset();
  std::vector<BlockDevice*> all = ptrs(im.mem);
  all.push_back(extra.get());
  all.push_back(other.get());
  auto set = assemble_table(must(member_superblock(*all[0])), all);
  check_clean(*set);
  auto vol = open_fs_volume(*set);
  check_files(*vol, im.main, want);
  check_files(*vol, im.main, more);
  check_files(*vol, im.main, last);
  // And leaves again, its data moved back.
  (void)must(vol->remove_device(2));
  check_files(*vol, im.main, more);
  must(vol->close());
  vol.reset();
  check_clean(*set);
}

TEST_CASE("devices: writers and readers go on while a device is removed", "[devices]") {
  MultiFsImage im({8ull << 20, 32ull << 20, 32ull << 20}, {"fast", "slow"}, {0, 1, 1});
  Files want = write_files(*im.vol, im.main, 11, 24, 600 << 10, "f");
  must(im.vol->commit());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> rounds{0};
  std::mutex mu;
  Files written;  // by the writer, while the removal runs
  std::thread writer([&] {
    auto fs = must(Filesystem::open(*im.vol, im.main));
    std::mt19937_64 rng(12);
    for (int i = 0; !stop.load() || i < 8; i++) {
      const std::string name = "w" + std::to_string(i % 40);
      auto data = pattern(rng(), 1 + rng() % (200 << 10));
      auto a = fs->lookup(fs->root(), name);
      uint64_t ino;
      if (a) {
        ino = a->ino;
        SetAttr sa;
        sa.size = 0;
        REQUIRE(fs->setattr(ino, sa).ok());
      } else {
        ino = must(fs->mknod(fs->root(), name, S_IFREG | 0644, 0, 0, 0)).ino;
      }
      REQUIRE(must(fs->write(ino, 0, data)) == data.size());
      // Read back what was written, and a file of the set before.
      std::vector<std::byte> got(data.size());
      REQUIRE(must(fs->read(ino, 0, got)) == data.size());
      REQUIRE(got == data);
      const std::string old = "f" + std::to_string(i % 24);
      auto o = must(fs->lookup(fs->root(), old));
      std::vector<std::byte> back(want.at(old).size());
      REQUIRE(must(fs->read(o.ino, 0, back)) == back.size());
      REQUIRE(back == want.at(old));
      std::lock_guard lk(mu);
      written[name] = std::move(data);
      rounds++;
    }
  });
  (void)must(im.vol->remove_device(1));
  stop = true;
  writer.join();
  INFO("writer rounds: " << rounds.load());
  CHECK(rounds.load() >= 8);
  REQUIRE(im.vol->super().devices.size() == 2);
  check_files(*im.vol, im.main, want);
  check_files(*im.vol, im.main, written);
  im.reopen();
  check_files(*im.vol, im.main, written);
  must(im.vol->close());
  im.vol.reset();
  check_clean(*im.set);
}

TEST_CASE("devices: a power cut during a removal, each device torn on its own, loses nothing", "[devices]") {
  // Files on all three devices; device 1 (slow, holding most data) is
  // removed while device j is cut at call k. The crashed devices, all three
  // given (the removed one wiped or not), open as open_volume assembles
  // them: at the table of a remaining device's newest slot, or its other
  // slot's when that one lists the removed device and the newest does not
  // -- both with every file whole, with two devices or three; a volume with
  // three finishes the removal; each verifies clean.
  const uint64_t s0 = seed("devices-remove-cut");
  MultiFsImage im({4ull << 20, 8ull << 20, 8ull << 20}, {"fast", "slow"}, {0, 1, 1});
  const Files want = write_files(*im.vol, im.main, s0, 8, 400 << 10, "f");
  must(im.vol->close());
  im.vol.reset();
  const auto& base = im.mem;
  uint64_t with = 0, without = 0;
  const uint64_t states = power_cuts(
      base, s0, 3000, 12,
      [&](const std::vector<BlockDevice*>& members) {
        auto set = assemble(members);
        VolumeOptions vo;
        vo.kinds = fs_kinds();
        vo.movers = fs_movers();
        auto vol = Volume::open(*set, vo);
        REQUIRE(vol);
        return (*vol)->remove_device(1).ok();
      },
      [&](std::vector<std::unique_ptr<MemDevice>>& crashed, size_t j, uint64_t k, uint64_t tear) {
        INFO("device " << j << " cut at call " << k << " tear " << tear);
        // As open_volume from device 0 with the others named: the table
        // of its newest slot, or of its other one when the generation the
        // first gives needs a device that table lacks.
        std::vector<BlockDevice*> all;
        for (auto& d : crashed)
          if (must(read_device_label(*d))) all.push_back(d.get());  // a wiped one is no device of it
        auto tables = must(member_superblocks(*crashed[0]));
        SuperInfo table = tables[0];
        if (!read_superblocks(*assemble_table(table, all)) && tables.size() > 1) table = tables[1];
        auto set = assemble_table(table, all);
        VolumeOptions vo;
        vo.kinds = fs_kinds();
        vo.movers = fs_movers();
        // Opened from the removed device instead (not wiped yet), by its
        // table: never an older generation than from device 0 -- one the
        // other devices made durable without it is not given up.
        uint64_t from_removed = 0;
        if (must(read_device_label(*crashed[1]))) {
          auto set1 = assemble_table(must(member_superblocks(*crashed[1]))[0], all);
          VolumeOptions ro = vo;
          ro.read_only = true;
          auto v1 = must(Volume::open(*set1, ro));
          check_files(*v1, im.main, want);
          from_removed = v1->super().generation.v;
        }
        auto vol = must(Volume::open(*set, vo));
        REQUIRE(from_removed <= vol->super().generation.v);
        if (from_removed) REQUIRE(from_removed == vol->super().generation.v);
        check_files(*vol, im.main, want);
        const size_t n = vol->super().devices.size();
        REQUIRE((n == 2 || n == 3));
        (n == 3 ? with : without)++;
        if (n == 3 && tear == 0) {
          (void)must(vol->remove_device(1));
          check_files(*vol, im.main, want);
        }
        Files more = write_files(*vol, im.main, k, 2, 30000, "n");
        must(vol->close());
        vol.reset();
        VerifyOptions vfo;
        vfo.kinds = fs_kinds();
        auto rep = must(verify_image(*set, vfo));
        for (const auto& p : rep.problems) REQUIRE(p.code == "S-slot");
      });
  std::printf("[devices-remove-cut] %llu crash states: %llu with the device, %llu without\n",
              (unsigned long long)states, (unsigned long long)with, (unsigned long long)without);
  CHECK(with > 0);
  CHECK(without > 0);
}
