// Volumes across several devices (format.md#multi-device): the device table
// and labels, placement by class, recovery when the devices disagree, a
// power cut during a commit with each device torn on its own, and finding
// the devices (missing, foreign, removed) when a volume is opened.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "blockdev/device_set.h"
#include "commit/devices.h"
#include "commit/disk_superblock.h"
#include "multidev_util.h"
#include "test_util.h"
#include "util/checksum.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

// A deterministic batch of puts and erases on tree `t`.
void change(Volume& v, TreeId t, Model& m, uint64_t seed, int n = 400) {
  std::mt19937_64 rng(seed);
  auto txn = must(v.begin());
  for (int i = 0; i < n; i++) {
    Key k{rng() % 5000, 0};
    if (rng() % 4 == 0) {
      (void)must(txn.erase(t, k));
      m.erase(k);
    } else {
      auto val = bytes("v" + std::to_string(rng()) + std::string(rng() % 160, 'x'));
      must(txn.put(t, k, val));
      m[k] = val;
    }
  }
}

// A crash state, opened as `vol` on `dev` with its content checked, goes on
// from there: a change committed, the image verified (only the superblock
// slot the cut left behind may be stale: S-slot), and `dev` opened again
// holds exactly the changed model.
void goes_on(std::unique_ptr<Volume> vol, BlockDevice& dev, TreeId t, const Model& before, uint64_t seed) {
  Model m = before;
  change(*vol, t, m, seed, 50);
  must(vol->close());
  vol.reset();
  auto rep = must(verify_image(dev));
  for (const auto& p : rep.problems) REQUIRE(p.code == "S-slot");
  REQUIRE(dump(*must(Volume::open(dev)), t) == m);
}

}  // namespace

TEST_CASE("multidev: the device table and the labels describe the volume", "[multidev]") {
  auto mem = make_volume({64 << 20, 96 << 20, 80 << 20}, {"fast", "slow"}, {0, 1, 1});
  auto set = assemble(ptrs(mem));
  auto vol = must(Volume::open(*set));
  const SuperInfo sb = vol->super();
  REQUIRE(is_multi_device(sb));
  REQUIRE(sb.classes == std::vector<std::string>{"fast", "slow"});
  REQUIRE(sb.devices.size() == 3);
  REQUIRE(sb.devices[0].first_block == 0);
  for (size_t i = 0; i < 3; i++) {
    REQUIRE(sb.devices[i].nblocks * 4096 == mem[i]->size_bytes());
    REQUIRE(sb.devices[i].class_id == (i == 0 ? 0 : 1));
    if (i > 0) {  // at a group boundary past the one before
      REQUIRE(sb.devices[i].first_block >= sb.devices[i - 1].first_block + sb.devices[i - 1].nblocks);
      REQUIRE((sb.devices[i].first_block - sb.first_block) % SpaceManager::kGroupBlocks == 0);
    }
    auto label = must(read_device_label(*mem[i]));
    REQUIRE(label);
    REQUIRE(label->volume_uuid == sb.uuid);
    REQUIRE(label->device_uuid == sb.devices[i].uuid);
  }
  // Usable space is the devices' blocks less each one's reserved area: the
  // gaps between them count for nothing.
  const SpaceStats st = vol->space_stats();
  REQUIRE(st.usable_blocks == (64 + 96 + 80) * 256 - 3 * sb.first_block);
  must(vol->close());
  require_clean(*set);
}

TEST_CASE("multidev: metadata on its class, data from the slowest class, the next when one is full",
          "[multidev]") {
  auto mem = make_volume({64 << 20, 40 << 20}, {"fast", "slow"}, {0, 1});
  auto set = assemble(ptrs(mem));
  auto vol = must(Volume::open(*set));
  const SuperInfo sb = vol->super();
  TreeId t;
  {
    auto txn = must(vol->begin());
    t = must(txn.create_tree(kKindPlain));
  }
  Model m;
  change(*vol, t, m, 1, 3000);
  must(vol->commit());
  // Every node so far on the fast device.
  auto use = must(vol->device_usage());
  REQUIRE(use.size() == 2);
  REQUIRE(use[0].meta_blocks > 3);
  REQUIRE(use[1].meta_blocks == 0);
  // Data: the slow device until it is full, then the fast one, then ENOSPC.
  std::vector<int> where;
  for (;;) {
    auto txn = must(vol->begin());
    auto b = txn.alloc_extent(256);
    if (!b) {
      REQUIRE(b.error().code == ENOSPC);
      break;
    }
    where.push_back(device_of(sb, b->v));
  }
  REQUIRE(where.size() > 10);
  const auto first_fast = std::find(where.begin(), where.end(), 0);
  REQUIRE(first_fast != where.begin());
  REQUIRE(std::all_of(where.begin(), first_fast, [](int d) { return d == 1; }));
  REQUIRE(std::all_of(first_fast, where.end(), [](int d) { return d == 0; }));
  REQUIRE(std::count(where.begin(), where.end(), -1) == 0);
  // The slow device was used up to within what one extent could not fill.
  use = must(vol->device_usage());
  REQUIRE(use[1].data_blocks + 256 > sb.devices[1].nblocks - sb.first_block);
}

TEST_CASE("multidev: a device a generation ahead, or with another copy of one, is not believed",
          "[multidev]") {
  auto base = make_volume({32 << 20, 32 << 20}, {"a"}, {0, 0});
  Model m0;
  TreeId t;
  {
    auto set = assemble(ptrs(base));
    auto vol = must(Volume::open(*set));
    {
      auto txn = must(vol->begin());
      t = must(txn.create_tree(kKindPlain));
    }
    change(*vol, t, m0, 7);
    must(vol->close());
  }
  // Two futures of the same generation, committed on copies.
  auto a = clones(base), b = clones(base);
  Model ma = m0, mb = m0;
  Generation ga, gb;
  for (auto* side : {&a, &b}) {
    auto set = assemble(ptrs(*side));
    auto vol = must(Volume::open(*set));
    change(*vol, t, side == &a ? ma : mb, side == &a ? 11 : 12);
    (side == &a ? ga : gb) = must(vol->commit());
  }
  REQUIRE(ga == gb);
  REQUIRE(ma != mb);
  SECTION("one device has the new generation, the other the old") {
    std::vector<BlockDevice*> mixed{a[0].get(), base[1].get()};
    auto set = assemble(mixed);
    auto vol = must(Volume::open(*set));
    REQUIRE(vol->durable_generation() < ga);
    REQUIRE(vol->recovery().fell_back);
    REQUIRE(dump(*vol, t) == m0);
  }
  SECTION("each device has its own copy of the new generation") {
    std::vector<BlockDevice*> mixed{a[0].get(), b[1].get()};
    auto set = assemble(mixed);
    auto vol = must(Volume::open(*set));
    REQUIRE(vol->durable_generation() < ga);
    REQUIRE(dump(*vol, t) == m0);
    // And the volume goes on from there: a commit makes a generation both hold.
    Model m = m0;
    change(*vol, t, m, 13);
    must(vol->close());
    auto again = must(Volume::open(*set));
    REQUIRE(dump(*again, t) == m);
    REQUIRE(!again->recovery().fell_back);
  }
}

TEST_CASE("multidev: a power cut during a commit, each device torn on its own, leaves the old or the new",
          "[multidev]") {
  // Device j's calls are cut at its call k (every later write and flush
  // there fails); the other goes on. Then every device drops or tears what
  // it had not flushed, each with its own dice (D1, D2 per device). The
  // volume must open to exactly the state before or after the commit.
  const uint64_t s0 = seed("multidev-power-cut");
  uint64_t states = 0, saw_old = 0, saw_new = 0;
  auto base = make_volume({1 << 20, 24 << 20, 24 << 20}, {"fast", "slow"}, {0, 1, 1});
  TreeId t;
  Model before;
  {
    auto set = assemble(ptrs(base));
    auto vol = must(Volume::open(*set));
    {
      auto txn = must(vol->begin());
      t = must(txn.create_tree(kKindPlain));
    }
    for (int round = 0; round < 6; round++) {
      change(*vol, t, before, s0 + 100 + round, 3000);
      must(vol->commit());
    }
    must(vol->close());
  }
  Model after = before;
  change(*must(Volume::open(*assemble(ptrs(clones(base))))), t, after, s0 + 1, 3000);
  {
    // The metadata class's device is small: the trees spill onto the others,
    // so that every device has nodes to lose, not only superblocks.
    auto set = assemble(ptrs(base));
    auto vol = must(Volume::open(*set));
    auto use = must(vol->device_usage());
    REQUIRE(use[1].meta_blocks + use[2].meta_blocks > 0);
  }
  states = power_cuts(
      base, s0, ~0ull, 8,
      [&](const std::vector<BlockDevice*>& members) {
        auto set = assemble(members);
        auto vol = must(Volume::open(*set));
        Model m = before;
        change(*vol, t, m, s0 + 1, 3000);
        return vol->commit().ok();
      },
      [&](std::vector<std::unique_ptr<MemDevice>>& crashed, size_t j, uint64_t k, uint64_t tear) {
        auto set = assemble(ptrs(crashed));
        auto vol = must(Volume::open(*set));
        auto got = dump(*vol, t);
        INFO("device " << j << " cut at call " << k << " tear " << tear);
        const bool is_old = got == before, is_new = got == after;
        REQUIRE((is_old || is_new));
        saw_old += is_old;
        saw_new += is_new;
        vol.reset();
        auto rep = must(verify_image(*set));
        for (const auto& p : rep.problems) REQUIRE(p.code == "S-slot");
      });
  std::printf("[multidev-power-cut] %llu crash states: %llu old, %llu new\n", (unsigned long long)states,
              (unsigned long long)saw_old, (unsigned long long)saw_new);
  REQUIRE(saw_old > 0);
  REQUIRE(saw_new > 0);
}

TEST_CASE("multidev: opening finds the devices and refuses a missing, foreign or removed one",
          "[multidev]") {
  char tmpl[] = "/tmp/plyfs_multidev.XXXXXX";
  REQUIRE(::mkdtemp(tmpl));
  const std::string dirp = tmpl;
  struct Cleanup {
    std::string p;
    ~Cleanup() { std::filesystem::remove_all(p); }
  } cleanup{dirp};
  auto file = [&](const std::string& name, uint64_t size) {
    const std::string p = dirp + "/" + name;
    const int fd = ::open(p.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(size)) == 0);
    ::close(fd);
    return p;
  };
  auto format = [&](const std::vector<std::string>& paths) {
    std::vector<std::unique_ptr<FileDevice>> devs;
    for (const auto& p : paths) devs.push_back(must(FileDevice::open(p)));
    auto set = assemble(ptrs(devs));
    FormatOptions fo;
    fo.classes = {"fast", "slow"};
    for (size_t i = 0; i < paths.size(); i++) fo.device_classes.push_back(i == 0 ? 0 : 1);
    return must(Volume::format(*set, fo));
  };
  const std::string a0 = file("a0.img", 32 << 20), a1 = file("a1.img", 48 << 20);
  const std::string b0 = file("b0.img", 32 << 20), b1 = file("b1.img", 32 << 20);
  const std::string single = file("single.img", 32 << 20);
  const SuperInfo sa = format({a0, a1});
  format({b0, b1});
  {
    auto d = must(FileDevice::open(single));
    must(Volume::format(*d, FormatOptions{}));
  }
  // Named, in either order, or found in a scanned directory; a device named
  // twice, by its path, a symlink or a directory scanned too, and the first
  // one named again, are opened once (their locks would refuse a second
  // open), as btrfs takes `device=` naming every device.
  const std::string a1_link = dirp + "/a1.link";
  REQUIRE(::symlink(a1.c_str(), a1_link.c_str()) == 0);
  for (const auto& others : {std::vector<std::string>{a1}, std::vector<std::string>{dirp},
                             std::vector<std::string>{a1, a1}, std::vector<std::string>{a0, a1},
                             std::vector<std::string>{a1_link, a1, dirp}}) {
    auto dev = must(open_volume(a0, others));
    auto vol = must(Volume::open(*dev));
    REQUIRE(vol->super().uuid == sa.uuid);
    REQUIRE(vol->super().devices.size() == 2);
  }
  {
    auto dev = must(open_volume(a1, {a0}));
    auto* set = dynamic_cast<DeviceSet*>(dev.get());
    REQUIRE(set);
    REQUIRE(set->member_info(0).name.ends_with("a0.img"));  // in the table's order
  }
  auto refused = [&](const std::string& path, const std::vector<std::string>& others, int code,
                     const std::string& says) {
    auto r = open_volume(path, others);
    REQUIRE(!r);
    INFO(r.error().message());
    REQUIRE(r.error().code == code);
    REQUIRE(r.error().message().find(says) != std::string::npos);
  };
  refused(a0, {}, ENODEV, "is missing");
  refused(a0, {a0}, ENODEV, "is missing");
  // A copy of a device is another file with the same device uuid: which
  // one is current cannot be told, so it is refused.
  {
    const std::string copy = dirp + "/a1.copy";
    std::filesystem::copy_file(a1, copy);
    refused(a0, {a1, copy}, EINVAL, "are the same device of the volume");
    std::filesystem::remove(copy);
  }
  refused(a0, {b1}, EINVAL, "another plyfs volume");
  refused(a0, {a1, single}, EINVAL, "not a device of a multi-device");
  refused(single, {a1}, EINVAL, "not a device of a multi-device");
  // A device whose label was damaged.
  {
    auto d = must(FileDevice::open(a1));
    std::vector<std::byte> buf(512);
    must(d->read(disk::kLabelOffset, buf));
    buf[20] ^= std::byte{1};
    must(d->write(disk::kLabelOffset, buf));
    must(d->flush());
  }
  refused(a0, {a1}, EUCLEAN, "label");
  // A single-device image still opens as itself.
  auto one = must(open_volume(single, {}));
  REQUIRE(dynamic_cast<DeviceSet*>(one.get()) == nullptr);
  one.reset();
  // With the label a conversion cut short left (format.md#device-convert):
  // still a volume of one device; with the table too, a set of that one.
  const SuperInfo s1 = must(member_superblock(*must(FileDevice::open(single))));
  {
    auto d = must(FileDevice::open(single));
    must(write_device_label(*d, s1.uuid, must(random_uuid()), 1));
    must(d->flush());
  }
  one = must(open_volume(single, {}));
  REQUIRE(dynamic_cast<DeviceSet*>(one.get()) == nullptr);
  REQUIRE(must(Volume::open(*one))->super().uuid == s1.uuid);
  one.reset();
  refused(single, {a1}, EINVAL, "not a device of a multi-device");
  must(make_multi_device(must(FileDevice::open(single)), single, "main"));
  one = must(open_volume(single, {}));
  REQUIRE(dynamic_cast<DeviceSet*>(one.get()) != nullptr);
  REQUIRE(must(Volume::open(*one))->super().devices.size() == 1);
}

TEST_CASE("multidev: a damaged device table is caught, a request across two devices is EIO",
          "[multidev]") {
  auto mem = make_volume({32 << 20, 32 << 20}, {"fast", "slow"}, {0, 1});
  {
    auto set = assemble(ptrs(mem));
    // Between the devices lies a gap: no request may reach into it.
    const auto& m1 = set->member_info(1);
    std::vector<std::byte> buf(8192);
    REQUIRE(set->read(m1.base - 4096, buf).error().code == EIO);
    REQUIRE(set->read(32 << 20, std::span(buf).first(4096)).error().code == EIO);
    must(set->read(m1.base + (1 << 20), buf));
  }
  SECTION("a field of the table, the checksum made to match") {
    for (auto& d : mem) {
      for (int slot = 0; slot < 2; slot++) {
        auto sb = d->peek(disk::kSuperOffset[slot], disk::kSuperSize);
        auto* s = reinterpret_cast<disk::Superblock*>(sb.data());
        auto* th = reinterpret_cast<disk::DeviceTableHeader*>(&s->s[0]);
        th->device_count.set(40);
        s->s7.checksum.set(xxh3(sb.data(), disk::kSuperSize - 16));
        d->poke(disk::kSuperOffset[slot], sb);
      }
    }
    auto set = assemble(ptrs(mem));
    auto r = read_superblocks(*set);
    REQUIRE(!r);
    REQUIRE(r.error().code == EUCLEAN);
    REQUIRE(r.error().message().find("device count") != std::string::npos);
  }
  SECTION("one device's copies only: the volume is refused, not guessed") {
    for (int slot = 0; slot < 2; slot++) {
      auto sb = mem[1]->peek(disk::kSuperOffset[slot] + 1024, 8);
      sb[0] ^= std::byte{0x40};
      mem[1]->poke(disk::kSuperOffset[slot] + 1024, sb);
    }
    auto set = assemble(ptrs(mem));
    auto r = Volume::open(*set);
    REQUIRE(!r);
    REQUIRE(r.error().code == EUCLEAN);
    REQUIRE(r.error().message().find("no superblock in common") != std::string::npos);
  }
}

TEST_CASE("multidev: a device added offline joins with its class; a power cut leaves the volume with it or without it",
          "[multidev]") {
  const uint64_t s0 = seed("multidev-add");
  auto base = make_volume({2 << 20, 8 << 20}, {"fast", "slow"}, {0, 1});
  TreeId t;
  Model before;
  {
    auto set = assemble(ptrs(base));
    auto vol = must(Volume::open(*set));
    {
      auto txn = must(vol->begin());
      t = must(txn.create_tree(kKindPlain));
    }
    change(*vol, t, before, s0, 2000);
    must(vol->close());
  }
  auto fresh_new = [] { return std::make_unique<MemDevice>(12 << 20); };
  {  // The add, and what it gives.
    auto devs = clones(base);
    auto extra = fresh_new();
    auto set = must(add_device(assemble(ptrs(devs)), std::make_unique<BorrowedDevice>(*extra), "new", "slow", false));
    REQUIRE(set->member_count() == 3);
    std::vector<BlockDevice*> all = ptrs(devs);
    all.push_back(extra.get());
    const auto layout = plan_devices({2 << 20, 8 << 20, 12 << 20}, 4096);
    auto vol = must(Volume::open(*set));
    const SuperInfo sb = vol->super();
    REQUIRE(sb.devices.size() == 3);
    REQUIRE(sb.devices[2].first_block == layout[2].first);
    REQUIRE(sb.devices[2].nblocks == layout[2].second);
    REQUIRE(sb.devices[2].class_id == 1);
    REQUIRE(sb.total_blocks == layout[2].first + layout[2].second);
    REQUIRE(dump(*vol, t) == before);
    {  // Data fills the slow class, the new device with it (on copies: the
       // extents are referenced by nothing).
      auto copies = clones(devs);
      copies.push_back(extra->clone());
      auto cset = assemble(ptrs(copies));
      auto cvol = must(Volume::open(*cset));
      std::set<int> used;
      for (;;) {
        auto txn = must(cvol->begin());
        auto b = txn.alloc_extent(256);
        if (!b) break;
        used.insert(device_of(sb, b->v));
      }
      REQUIRE(used.count(2));
      REQUIRE(!used.count(-1));
    }
    Model m = before;
    change(*vol, t, m, s0 + 1, 500);
    must(vol->close());
    // Opened again from its devices by path-free assembly, and refused twice.
    auto all_set = assemble(all);
    auto again = must(Volume::open(*all_set));
    REQUIRE(dump(*again, t) == m);
    again.reset();
    all_set.reset();
    require_clean(*assemble(all));
    auto twice = add_device(assemble(all), std::make_unique<BorrowedDevice>(*extra), "new", "slow", false);
    REQUIRE(!twice);
    CHECK(twice.error().message().find("already") != std::string::npos);
    auto tiny = std::make_unique<MemDevice>(64 << 10);
    CHECK(!add_device(assemble(all), std::move(tiny), "tiny", "slow", false));
    // A device of another volume: refused unless forced; a new class is the slowest.
    auto other = make_volume({2 << 20, 2 << 20}, {"a", "b"}, {0, 1});
    auto refused = add_device(assemble(all), std::make_unique<BorrowedDevice>(*other[1]), "other", "slow", false);
    REQUIRE(!refused);
    CHECK(refused.error().message().find("another") != std::string::npos);
    auto four = must(add_device(assemble(all), std::make_unique<BorrowedDevice>(*other[1]), "other", "archive", true));
    auto v4 = must(Volume::open(*four));
    REQUIRE(v4->super().classes == std::vector<std::string>{"fast", "slow", "archive"});
    REQUIRE(v4->super().devices[3].class_id == 2);
    REQUIRE(dump(*v4, t) == m);
  }
  // A power cut: device j cut at its call k, then every device keeps, drops
  // or tears its unflushed writes on its own. The volume opens (with the new
  // device given) at its old content, with two devices or three.
  uint64_t with = 0, without = 0;
  std::vector<std::unique_ptr<MemDevice>> three = clones(base);
  three.push_back(fresh_new());
  const uint64_t states = power_cuts(
      three, s0, 100, 6,
      [&](const std::vector<BlockDevice*>& members) {
        return add_device(assemble({members[0], members[1]}), std::make_unique<BorrowedDevice>(*members[2]), "new",
                          "slow", false)
            .ok();
      },
      [&](std::vector<std::unique_ptr<MemDevice>>& crashed, size_t j, uint64_t k, uint64_t tear) {
        INFO("device " << j << " cut at call " << k << " tear " << tear);
        // The devices open_volume would take: those of device 0's newest table.
        const size_t listed = must(member_superblock(*crashed[0])).devices.size();
        REQUIRE((listed == 2 || listed == 3));
        crashed.resize(listed);
        auto set = assemble(ptrs(crashed));
        auto vol = must(Volume::open(*set));
        REQUIRE(dump(*vol, t) == before);
        const size_t n = vol->super().devices.size();
        REQUIRE((n == 2 || n == 3));
        (n == 3 ? with : without)++;
        goes_on(std::move(vol), *set, t, before, s0 + 9);
      });
  std::printf("[multidev-add] %llu crash states: %llu with the device, %llu without\n", (unsigned long long)states,
              (unsigned long long)with, (unsigned long long)without);
  CHECK(with > 0);
  CHECK(without > 0);
}

TEST_CASE("multidev: a volume of one device takes a second, offline or in use; a power cut leaves it of one device or of the new two",
          "[multidev]") {
  const uint64_t s0 = seed("multidev-convert");
  std::vector<std::unique_ptr<MemDevice>> base;
  base.push_back(std::make_unique<MemDevice>(4 << 20));
  base.push_back(std::make_unique<MemDevice>(8 << 20));
  must(Volume::format(*base[0], FormatOptions{}));
  TreeId t;
  Model before;
  {
    auto vol = must(Volume::open(*base[0]));
    REQUIRE(!is_multi_device(vol->super()));
    {
      auto txn = must(vol->begin());
      t = must(txn.create_tree(kKindPlain));
    }
    change(*vol, t, before, s0, 2000);
    must(vol->close());
  }
  const uint64_t total0 = must(member_superblock(*base[0])).total_blocks;
  // Offline: make_multi_device, then add_device. In use (a mount's): the
  // volume on a set of its one device, Volume::add_device doing both.
  const auto convert_and_add = [](BlockDevice& d0, BlockDevice& d1,
                                  bool in_use = false) -> Result<std::unique_ptr<DeviceSet>> {
    if (in_use) {
      std::vector<DeviceSet::Member> m;
      m.push_back(DeviceSet::Member{std::make_unique<BorrowedDevice>(d0), 0, d0.size_bytes(), "dev0"});
      auto set = PLY_TRY(DeviceSet::make(std::move(m), disk::kReservedBytes));
      auto vol = PLY_TRY(Volume::open(*set));
      (void)PLY_TRY(vol->add_device(std::make_unique<BorrowedDevice>(d1), "dev1", "slow", false, "fast"));
      PLY_CHECK(vol->close());
      return set;
    }
    auto one = PLY_TRY(make_multi_device(std::make_unique<BorrowedDevice>(d0), "dev0", "fast"));
    return add_device(std::move(one), std::make_unique<BorrowedDevice>(d1), "dev1", "slow", false);
  };
  {  // The conversion and the add, and what they give.
    auto devs = clones(base);
    {  // Converted alone: one device of class fast, at block 0, the content as it was.
      auto copy = devs[0]->clone();
      auto one = must(make_multi_device(std::make_unique<BorrowedDevice>(*copy), "dev0", "fast"));
      auto vol = must(Volume::open(*one));
      const SuperInfo sb = vol->super();
      REQUIRE(is_multi_device(sb));
      REQUIRE(sb.classes == std::vector<std::string>{"fast"});
      REQUIRE(sb.devices.size() == 1);
      REQUIRE(sb.devices[0].first_block == 0);
      REQUIRE(sb.devices[0].nblocks == total0);
      REQUIRE(sb.total_blocks == total0);
      REQUIRE(dump(*vol, t) == before);
      auto l = must(read_device_label(*copy));
      REQUIRE(l);
      REQUIRE(l->volume_uuid == sb.uuid);
      REQUIRE(l->device_uuid == sb.devices[0].uuid);
      vol.reset();
      require_clean(*one);
      // Not twice, and a bad class name changes nothing.
      auto again = make_multi_device(std::make_unique<BorrowedDevice>(*copy), "dev0", "fast");
      REQUIRE(!again);
      CHECK(again.error().code == EINVAL);
      auto plain = devs[0]->clone();
      REQUIRE(!make_multi_device(std::make_unique<BorrowedDevice>(*plain), "dev0", "Fast!"));
      REQUIRE(!must(read_device_label(*plain)));
    }
    {  // In use: the same volume, and refusals that change nothing.
      auto c0 = devs[0]->clone(), c1 = devs[1]->clone();
      auto tiny = std::make_unique<MemDevice>(64 << 10);
      auto refused = convert_and_add(*c0, *tiny, true);
      REQUIRE(!refused);
      REQUIRE(!must(read_device_label(*c0)));
      REQUIRE(!is_multi_device(must(member_superblock(*c0))));
      auto done = must(convert_and_add(*c0, *c1, true));
      REQUIRE(done->member_count() == 2);
      auto vol = must(Volume::open(*done));
      REQUIRE(vol->super().classes == std::vector<std::string>{"fast", "slow"});
      REQUIRE(vol->super().devices.size() == 2);
      REQUIRE(dump(*vol, t) == before);
    }
    auto set = must(convert_and_add(*devs[0], *devs[1]));
    REQUIRE(set->member_count() == 2);
    auto vol = must(Volume::open(*set));
    const SuperInfo sb = vol->super();
    const auto layout = plan_devices({4 << 20, 8 << 20}, 4096);
    REQUIRE(sb.classes == std::vector<std::string>{"fast", "slow"});
    REQUIRE(sb.devices.size() == 2);
    REQUIRE(sb.devices[1].first_block == layout[1].first);
    REQUIRE(sb.devices[1].class_id == 1);
    REQUIRE(dump(*vol, t) == before);
    // New data goes to the slow class, the new device (on a copy).
    {
      auto copies = clones(devs);
      auto cset = assemble(ptrs(copies));
      auto cvol = must(Volume::open(*cset));
      auto txn = must(cvol->begin());
      auto b = must(txn.alloc_extent(16));
      REQUIRE(device_of(sb, b.v) == 1);
    }
    Model m = before;
    change(*vol, t, m, s0 + 1, 500);
    must(vol->close());
    vol.reset();
    set.reset();
    require_clean(*assemble(ptrs(devs)));
    REQUIRE(dump(*must(Volume::open(*assemble(ptrs(devs)))), t) == m);
  }
  // A power cut anywhere in the conversion and the add, each device torn
  // on its own: the volume opens with its content, of one device without a
  // table, of one device with one, or of both.
  uint64_t plain = 0, one = 0, two = 0, states = 0;
  for (const bool in_use : {false, true})
  states += power_cuts(
      base, s0 + in_use, 100, 6,
      [&](const std::vector<BlockDevice*>& members) { return convert_and_add(*members[0], *members[1], in_use).ok(); },
      [&](std::vector<std::unique_ptr<MemDevice>>& crashed, size_t j, uint64_t k, uint64_t tear) {
        INFO("device " << j << " cut at call " << k << " tear " << tear);
        const SuperInfo newest = must(member_superblock(*crashed[0]));
        std::unique_ptr<DeviceSet> set;
        BlockDevice* dev = crashed[0].get();
        if (is_multi_device(newest)) {
          const size_t listed = newest.devices.size();
          REQUIRE((listed == 1 || listed == 2));
          // Found by their labels, as open_volume finds them.
          set = assemble_table(newest, ptrs(crashed));
          dev = set.get();
        }
        auto vol = must(Volume::open(*dev));
        REQUIRE(dump(*vol, t) == before);
        const SuperInfo sb = vol->super();
        (!is_multi_device(sb) ? plain : sb.devices.size() == 1 ? one : two)++;
        goes_on(std::move(vol), *dev, t, before, s0 + 9);
      });
  std::printf("[multidev-convert] %llu crash states: %llu of one device, %llu converted, %llu with both\n",
              (unsigned long long)states, (unsigned long long)plain, (unsigned long long)one,
              (unsigned long long)two);
  CHECK(plain > 0);
  CHECK(one > 0);
  CHECK(two > 0);
}
