#include "commit/superblock.h"

#include <algorithm>
#include <cstring>

#include "alloc/space.h"
#include "blockdev/device_set.h"
#include "commit/devices.h"
#include "commit/disk_superblock.h"
#include "util/checksum.h"

namespace plyfs {

namespace {

void put_root(disk::RootPtr& d, const RootPtr& r) {
  std::memset(&d, 0, sizeof d);
  d.block.set(r.block.v);
  d.generation.set(r.gen.v);
  d.level = r.level;
}
RootPtr get_root(const disk::RootPtr& d) {
  return RootPtr{BlockNo{d.block.get()}, Generation{d.generation.get()}, d.level};
}
bool all_zero(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
}
uint64_t stamp_of(const disk::Superblock& sb, int sector) {
  if (sector == 0) return sb.s0.stamp.get();
  if (sector == 7) return sb.s7.stamp.get();
  return sb.s[sector - 1].stamp.get();
}

}  // namespace

bool is_multi_device(const SuperInfo& s) { return (s.incompat & kIncompatMultiDevice) != 0; }

const char* slot_state_name(SlotState s) {
  switch (s) {
    case SlotState::Valid: return "valid";
    case SlotState::Empty: return "empty";
    case SlotState::Foreign: return "not plyfs";
    case SlotState::Torn: return "torn";
    case SlotState::BadChecksum: return "bad checksum";
    case SlotState::BadFields: return "bad fields";
    case SlotState::Unsupported: return "unsupported version";
    case SlotState::Unreadable: return "unreadable";
  }
  return "?";
}

std::vector<std::byte> encode_superblock(const SuperInfo& s) {
  std::vector<std::byte> out(disk::kSuperSize);
  auto* sb = reinterpret_cast<disk::Superblock*>(out.data());
  auto& h = sb->s0;
  std::memcpy(h.magic, disk::kSuperMagic, 8);
  h.version_major.set(s.version_major);
  h.version_minor.set(s.version_minor);
  h.compat.set(s.compat);
  h.ro_compat.set(s.ro_compat);
  h.incompat.set(s.incompat);
  std::memcpy(h.uuid, s.uuid.data(), 16);
  std::memcpy(h.label, s.label.data(), std::min<size_t>(s.label.size(), sizeof h.label));
  h.block_size.set(s.block_size);
  h.sector_size.set(s.sector_size);
  h.total_blocks.set(s.total_blocks);
  h.generation.set(s.generation.v);
  h.slot.set(static_cast<uint32_t>(s.generation.v % 2));
  h.flags.set(0);
  h.fs_id.set(s.fs_id);
  put_root(h.root_tree, s.root_tree);
  put_root(h.space_tree, s.space_tree);
  h.next_tree_id.set(s.next_tree_id);
  h.next_inode.set(s.next_inode);
  h.first_block.set(s.first_block);
  h.used_blocks.set(s.used_blocks);
  h.meta_blocks.set(s.meta_blocks);
  h.data_blocks.set(s.data_blocks);
  h.reserve_blocks.set(s.reserve_blocks);
  h.mkfs_time_ns.set(s.mkfs_time_ns);
  h.commit_time_ns.set(s.commit_time_ns);
  if (is_multi_device(s)) {
    auto* th = reinterpret_cast<disk::DeviceTableHeader*>(&sb->s[0]);
    th->device_count.set(static_cast<uint32_t>(s.devices.size()));
    th->class_count.set(static_cast<uint32_t>(s.classes.size()));
    th->meta_class.set(s.meta_class);
    for (size_t c = 0; c < s.classes.size() && c < disk::kMaxClasses; c++)
      std::memcpy(th->class_names[c], s.classes[c].data(), std::min<size_t>(s.classes[c].size(), 16));
    for (size_t i = 0; i < s.devices.size() && i < disk::kMaxDevices; i++) {
      auto* ts = reinterpret_cast<disk::DeviceTableSector*>(&sb->s[1 + i / disk::kDevicesPerSector]);
      auto& e = ts->entries[i % disk::kDevicesPerSector];
      std::memcpy(e.uuid, s.devices[i].uuid.data(), 16);
      e.first_block.set(s.devices[i].first_block);
      e.nblocks.set(s.devices[i].nblocks);
      e.class_id = s.devices[i].class_id;
    }
  }
  // The generation in every sector (format.md#superblock, invariant C2).
  h.stamp.set(s.generation.v);
  for (auto& sec : sb->s) sec.stamp.set(s.generation.v);
  sb->s7.stamp.set(s.generation.v);
  sb->s7.checksum.set(xxh3(out.data(), disk::kSuperSize - 16));
  return out;
}

namespace {

// The device table of a slot whose checksum is right (format.md#device-table).
std::string decode_device_table(const disk::Superblock& sb, SuperInfo& s) {
  const auto* th = reinterpret_cast<const disk::DeviceTableHeader*>(&sb.s[0]);
  const uint32_t n = th->device_count.get(), nc = th->class_count.get();
  if (n < 1 || n > disk::kMaxDevices) return "device count " + std::to_string(n) + " out of range";
  if (nc < 1 || nc > disk::kMaxClasses) return "class count " + std::to_string(nc) + " out of range";
  if (th->meta_class.get() >= nc) return "the metadata class is not a class";
  if (th->reserved0.get() != 0 || !all_zero(th->reserved, sizeof th->reserved))
    return "reserved fields of the device table are not zero";
  s.meta_class = th->meta_class.get();
  for (uint32_t c = 0; c < disk::kMaxClasses; c++) {
    const char* name = reinterpret_cast<const char*>(th->class_names[c]);
    const size_t len = strnlen(name, 16);
    if (c >= nc) {
      if (!all_zero(th->class_names[c], 16)) return "an unused class name is not zero";
      continue;
    }
    if (len == 0 || !all_zero(th->class_names[c] + len, 16 - len)) return "class name " + std::to_string(c) + " is malformed";
    std::string cls(name, len);
    for (char ch : cls)
      if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-'))
        return "class name " + std::to_string(c) + " is malformed";
    for (const auto& other : s.classes)
      if (other == cls) return "class " + cls + " is named twice";
    s.classes.push_back(std::move(cls));
  }
  uint64_t end = 0;
  for (uint32_t i = 0; i < 5 * disk::kDevicesPerSector; i++) {
    const auto* ts = reinterpret_cast<const disk::DeviceTableSector*>(&sb.s[1 + i / disk::kDevicesPerSector]);
    const auto& e = ts->entries[i % disk::kDevicesPerSector];
    if (i % disk::kDevicesPerSector == 0 && !all_zero(ts->reserved, sizeof ts->reserved))
      return "reserved fields of the device table are not zero";
    if (i >= n) {
      if (!all_zero(reinterpret_cast<const uint8_t*>(&e), sizeof e)) return "an unused device entry is not zero";
      continue;
    }
    DeviceInfo d;
    std::memcpy(d.uuid.data(), e.uuid, 16);
    d.first_block = e.first_block.get();
    d.nblocks = e.nblocks.get();
    d.class_id = e.class_id;
    if (e.flags != 0 || !all_zero(e.reserved, sizeof e.reserved))
      return "reserved fields of device " + std::to_string(i) + " are not zero";
    if (d.class_id >= nc) return "device " + std::to_string(i) + " has no class";
    if (all_zero(d.uuid.data(), 16)) return "device " + std::to_string(i) + " has a nil uuid";
    for (const auto& other : s.devices)
      if (other.uuid == d.uuid) return "device " + std::to_string(i) + " is listed twice";
    // Each device at a group boundary after the one before, or the first at
    // block 0 (format.md#device-table): no extent crosses from one device
    // into the next, and each begins with its own reserved area. The first
    // begins past 0 once the device that did was removed.
    const uint64_t g = SpaceManager::kGroupBlocks;
    if (!(i == 0 && d.first_block == 0) &&
        (d.first_block < std::max(end, s.first_block) || (d.first_block - s.first_block) % g != 0))
      return "device " + std::to_string(i) + " begins at block " + std::to_string(d.first_block) +
             ", not at a group boundary after the device before it";
    if (d.nblocks < s.first_block + 1 || d.nblocks > (~0ull - d.first_block) / s.block_size / 2)
      return "device " + std::to_string(i) + " spans " + std::to_string(d.nblocks) + " blocks";
    end = d.first_block + d.nblocks;
    s.devices.push_back(d);
  }
  if (end != s.total_blocks) return "the device table does not end where the filesystem ends";
  return {};
}

}  // namespace

SlotReport decode_superblock(std::span<const std::byte> bytes, int slot, uint64_t device_bytes) {
  SlotReport r;
  const auto* sb = reinterpret_cast<const disk::Superblock*>(bytes.data());
  const auto& h = sb->s0;
  auto fail = [&](SlotState st, std::string why) {
    r.state = st;
    r.detail = std::move(why);
    return r;
  };
  if (all_zero(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()))
    return fail(SlotState::Empty, "the slot is all zeroes");
  if (std::memcmp(h.magic, disk::kSuperMagic, 8) != 0) {
    // A whole copy (its checksum matches) with a wrong magic was damaged;
    // anything else here is not plyfs, or a write that never completed.
    if (sb->s7.checksum.get() == xxh3(bytes.data(), disk::kSuperSize - 16))
      return fail(SlotState::BadFields, "wrong magic in a copy whose checksum is right");
    return fail(SlotState::Foreign, "no plyfs magic");
  }
  // Torn first: a mix of two generations is the expected result of a crash
  // during the superblock write, and names the first sector that differs.
  // Sector 0 holds both the generation and its own stamp: a write lands whole
  // sectors (D1), so a sector 0 that disagrees with itself was not torn but
  // damaged.
  const uint64_t gen = h.generation.get();
  if (stamp_of(*sb, 0) != gen)
    return fail(SlotState::BadFields, "sector 0 disagrees with itself: generation " +
                                            std::to_string(gen) + ", stamp " +
                                            std::to_string(stamp_of(*sb, 0)));
  // A torn slot mixes the sectors of two writes to the same slot, and either
  // may have landed sector 0: the other sectors carry a generation of the same
  // parity (a slot only ever holds one parity), older or newer, or zero (never
  // written). A stamp of the other parity is damage.
  for (int i = 1; i < 8; i++) {
    const uint64_t st = stamp_of(*sb, i);
    if (st != gen && st != 0 && st % 2 != gen % 2)
      return fail(SlotState::BadChecksum, "sector " + std::to_string(i) + " carries generation " +
                                              std::to_string(st) +
                                              ", which no write to this slot could leave");
  }
  for (int i = 1; i < 8; i++) {
    if (stamp_of(*sb, i) != gen) {
      r.torn_sector = i;
      return fail(SlotState::Torn, "sector " + std::to_string(i) + " carries generation " +
                                       std::to_string(stamp_of(*sb, i)) + ", the header " +
                                       std::to_string(gen));
    }
  }
  if (sb->s7.checksum.get() != xxh3(bytes.data(), disk::kSuperSize - 16))
    return fail(SlotState::BadChecksum, "checksum mismatch");
  if (h.version_major.get() != kVersionMajor)
    return fail(SlotState::Unsupported,
                "format version " + std::to_string(h.version_major.get()) + "." +
                    std::to_string(h.version_minor.get()) + ", this build reads " +
                    std::to_string(kVersionMajor) + ".x");

  SuperInfo s;
  s.version_major = h.version_major.get();
  s.version_minor = h.version_minor.get();
  s.compat = h.compat.get();
  s.ro_compat = h.ro_compat.get();
  s.incompat = h.incompat.get();
  std::memcpy(s.uuid.data(), h.uuid, 16);
  s.label.assign(reinterpret_cast<const char*>(h.label), strnlen(reinterpret_cast<const char*>(h.label), sizeof h.label));
  s.block_size = h.block_size.get();
  s.sector_size = h.sector_size.get();
  s.total_blocks = h.total_blocks.get();
  s.generation = Generation{gen};
  s.fs_id = h.fs_id.get();
  s.root_tree = get_root(h.root_tree);
  s.space_tree = get_root(h.space_tree);
  s.next_tree_id = h.next_tree_id.get();
  s.next_inode = h.next_inode.get();
  s.first_block = h.first_block.get();
  s.used_blocks = h.used_blocks.get();
  s.meta_blocks = h.meta_blocks.get();
  s.data_blocks = h.data_blocks.get();
  s.reserve_blocks = h.reserve_blocks.get();
  s.mkfs_time_ns = h.mkfs_time_ns.get();
  s.commit_time_ns = h.commit_time_ns.get();

  const uint32_t bs = s.block_size;
  if (bs < 4096 || bs > 65536 || (bs & (bs - 1)) != 0)
    return fail(SlotState::BadFields, "block size " + std::to_string(bs) + " out of range");
  if (h.slot.get() != static_cast<uint32_t>(slot) || gen % 2 != static_cast<uint64_t>(slot))
    return fail(SlotState::BadFields, "generation " + std::to_string(gen) +
                                          " does not belong in slot " + std::to_string(slot));
  if (gen == 0) return fail(SlotState::BadFields, "generation zero");
  if (s.first_block != disk::kReservedBytes / bs)
    return fail(SlotState::BadFields, "first block does not follow the reserved area");
  if (s.total_blocks <= s.first_block || s.total_blocks > (~0ull / bs))
    return fail(SlotState::BadFields, "total block count out of range");
  if (s.total_blocks * bs > device_bytes)
    return fail(SlotState::BadFields,
                "the filesystem spans " + std::to_string(s.total_blocks * bs) +
                    " bytes but the device has " + std::to_string(device_bytes));
  if (s.fs_id != xxh3(s.uuid.data(), 16)) return fail(SlotState::BadFields, "fs_id does not match the uuid");
  for (const RootPtr* rp : {&s.root_tree, &s.space_tree}) {
    if (rp->block.v < s.first_block || rp->block.v >= s.total_blocks || rp->gen.v > gen ||
        rp->gen.v == 0 || rp->level > 16)
      return fail(SlotState::BadFields, "a tree root points outside the filesystem or the future");
  }
  if (s.used_blocks > s.total_blocks || s.meta_blocks + s.data_blocks != s.used_blocks ||
      s.reserve_blocks > s.total_blocks)
    return fail(SlotState::BadFields, "space counters are inconsistent");
  if (s.next_tree_id < 256 || s.next_inode < 256)
    return fail(SlotState::BadFields, "next_tree_id or next_inode below 256");
  // Both counters only grow by one per tree or object made: at 2^63 one is
  // damage, and a counter let near 2^64 would wrap to 0 and hand out numbers
  // again. Bit 63 of a FUSE node id is the control folder's (format.md#fs-keys).
  if (s.next_tree_id >= kCounterLimit || s.next_inode >= kCounterLimit)
    return fail(SlotState::BadFields, "next_tree_id or next_inode at or past 2^63");
  if (s.used_blocks > s.total_blocks - s.first_block ||
      s.reserve_blocks > s.total_blocks - s.first_block)
    return fail(SlotState::BadFields, "space counters exceed the usable blocks");
  bool zero = h.flags.get() == 0 && all_zero(h.reserved, sizeof h.reserved) &&
              all_zero(h.root_tree.reserved, 7) && all_zero(h.space_tree.reserved, 7) &&
              all_zero(sb->s7.reserved, sizeof sb->s7.reserved);
  if (s.incompat & kIncompatMultiDevice) {
    auto why = decode_device_table(*sb, s);
    if (!why.empty()) return fail(SlotState::BadFields, why);
  } else {
    for (const auto& sec : sb->s) zero = zero && all_zero(sec.reserved, sizeof sec.reserved);
  }
  if (!zero) return fail(SlotState::BadFields, "reserved fields are not zero");
  r.state = SlotState::Valid;
  r.info = std::move(s);
  return r;
}

namespace {

struct DeviceSlots {
  SlotReport reports[2];
  std::vector<std::byte> raw[2];
};

// Both slots of one device, decoded against `span_bytes`, the size of what
// the volume spans.
DeviceSlots read_slots(BlockDevice& dev, uint64_t span_bytes, bool trust_torn) {
  DeviceSlots d;
  for (int slot = 0; slot < 2; slot++) {
    std::vector<std::byte> buf(disk::kSuperSize);
    auto r = dev.read(disk::kSuperOffset[slot], buf);
    for (int retry = 0; retry < 2 && !r; retry++) r = dev.read(disk::kSuperOffset[slot], buf);
    if (!r) {
      d.reports[slot].state = SlotState::Unreadable;
      d.reports[slot].detail = r.error().message();
      continue;
    }
    d.reports[slot] = decode_superblock(buf, slot, span_bytes);
    if (trust_torn && d.reports[slot].state == SlotState::Torn) {
      // Planted bug: trust the stamps over the header. A torn copy is read as
      // the newest generation any of its sectors carries, with whatever roots
      // its sector 0 holds (which may be the previous write's).
      auto* raw = reinterpret_cast<uint8_t*>(buf.data());
      auto* sbp = reinterpret_cast<disk::Superblock*>(buf.data());
      uint64_t newest = 0;
      for (int i = 0; i < 8; i++) {
        uint64_t st;
        std::memcpy(&st, raw + i * 512 + 504, 8);
        newest = std::max(newest, st);
      }
      sbp->s0.generation.set(newest);
      sbp->s0.slot.set(static_cast<uint32_t>(newest % 2));
      for (int i = 0; i < 8; i++) std::memcpy(raw + i * 512 + 504, raw + 136, 8);
      uint64_t sum = xxh3(buf.data(), disk::kSuperSize - 16);
      std::memcpy(raw + 4080, &sum, 8);
      d.reports[slot] = decode_superblock(buf, slot, span_bytes);
    }
    d.raw[slot] = std::move(buf);
  }
  return d;
}

// format.md#multi-device-recovery: the newest generation every member holds
// whole and identical. A commit writes the same superblock to every member
// and is durable only once every member flushed it, so a member may be one
// generation ahead of another (its copy landed, the other's not), or hold a
// copy of a generation that was cut short and written again since (the same
// number, other bytes): neither is agreed on, and the slot beside holds the
// generation before, which every member has.
Result<SuperChoice> choose_common(DeviceSet& set, bool trust_torn) {
  std::vector<DeviceSlots> m;
  for (size_t i = 0; i < set.member_count(); i++)
    m.push_back(read_slots(set.member(i), set.size_bytes(), trust_torn));
  for (size_t i = 0; i < m.size(); i++)
    for (const auto& rep : m[i].reports)
      if (rep.state == SlotState::Unsupported)
        return Error::io(EOPNOTSUPP, "device " + std::to_string(i) + ": " + rep.detail);
  SuperChoice c;
  c.reports[0] = m[0].reports[0];
  c.reports[1] = m[0].reports[1];
  // A generation counts when every device ITS table lists is a member where
  // the table puts it and holds it whole and identical; a member its table
  // does not list (one a removal dropped, one an add had not yet joined
  // when the generation was written) has no say (format.md#device-remove).
  // Each member's valid slots are the candidates.
  const auto listed = [&](const SuperInfo& info, size_t j) {
    const uint64_t bs = info.block_size;
    for (const auto& d : info.devices)
      if (set.member_info(j).base == d.first_block * bs && set.member_info(j).bytes == d.nblocks * bs) return true;
    return false;
  };
  std::optional<SuperInfo> chosen;
  int best = -1;
  uint64_t missing_gen = 0;  // the newest candidate that needs a device not given
  std::string missing;
  for (size_t i = 0; i < m.size(); i++)
    for (int slot = 0; slot < 2; slot++) {
      const auto& rep = m[i].reports[slot];
      if (rep.state != SlotState::Valid || !listed(*rep.info, i)) continue;
      const SuperInfo& info = *rep.info;
      if (chosen && info.generation <= chosen->generation) continue;
      size_t members_listed = 0;
      bool agreed = true;
      for (size_t j = 0; j < m.size() && agreed; j++) {
        if (!listed(info, j)) continue;
        members_listed++;
        agreed = m[j].reports[slot].state == SlotState::Valid && m[j].raw[slot] == m[i].raw[slot];
      }
      if (!agreed) continue;
      if (members_listed < info.devices.size()) {
        // Agreed by the members it lists, but it lists a device not given.
        if (info.generation.v > missing_gen) {
          missing_gen = info.generation.v;
          missing = "generation " + std::to_string(info.generation.v) + ", the newest the devices given hold, lists " +
                    std::to_string(info.devices.size()) + " devices and " + std::to_string(members_listed) +
                    " were given: a change of the volume's devices was cut short; give the others too";
        }
        continue;
      }
      chosen = info;
      best = slot;
    }
  // Only a generation older than one that needs a device agrees: choosing
  // it would drop what the newer one made durable.
  if (missing_gen > (chosen ? chosen->generation.v : 0)) return Error::io(ENODEV, missing);
  if (best < 0) {
    std::string why;
    for (size_t i = 0; i < m.size(); i++)
      for (int slot = 0; slot < 2; slot++) {
        const auto& r = m[i].reports[slot];
        why += (why.empty() ? "" : "; ") + std::string("device ") + std::to_string(i) + " slot " +
               std::to_string(slot) + ": " + slot_state_name(r.state) +
               (r.state == SlotState::Valid ? " generation " + std::to_string(r.info->generation.v)
                                            : ", " + r.detail);
      }
    return Error::corrupt(Error::kNoBlock,
                          "the devices of the volume hold no superblock in common (" + why + ")");
  }
  c.slot = best;
  c.info = *chosen;
  for (const auto& d : m) {
    const auto& other = d.reports[1 - best];
    if (other.state != SlotState::Valid && other.state != SlotState::Empty) c.fell_back = true;
    if (other.state == SlotState::Valid && other.info->generation > c.info.generation)
      c.fell_back = true;
  }
  return c;
}

}  // namespace

Result<SuperChoice> read_superblocks(BlockDevice& dev, bool trust_torn) {
  if (dev.logical_sector_size() > disk::kSuperSize)
    return Error::invalid("the device's " + std::to_string(dev.logical_sector_size()) +
                          "-byte sectors are larger than plyfs blocks can be");
  if (dev.size_bytes() < disk::kReservedBytes)
    return Error::invalid("the device is too small to hold a plyfs filesystem");
  if (auto* set = dev.device_set(); set && set->member_count() > 1)
    return choose_common(*set, trust_torn);
  SuperChoice c;
  {
    DeviceSlots d = read_slots(dev, dev.size_bytes(), trust_torn);
    c.reports[0] = std::move(d.reports[0]);
    c.reports[1] = std::move(d.reports[1]);
  }
  // A newer program wrote a whole superblock this one cannot read: falling
  // back to the older slot would roll its work back at the next commit.
  for (const auto& rep : c.reports)
    if (rep.state == SlotState::Unsupported) return Error::io(EOPNOTSUPP, rep.detail);
  int best = -1;
  for (int slot = 0; slot < 2; slot++) {
    if (c.reports[slot].state != SlotState::Valid) continue;
    if (best < 0 || c.reports[slot].info->generation > c.reports[best].info->generation)
      best = slot;
  }
  if (best < 0) {
    const auto& a = c.reports[0];
    const auto& b = c.reports[1];
    auto plain = [](SlotState s) { return s == SlotState::Empty || s == SlotState::Foreign; };
    if (plain(a.state) && plain(b.state)) return Error::invalid("no plyfs filesystem found");
    // mkfs wipes both slots before writing the first superblock: an empty
    // slot beside one whose write never completed (torn, garbage, unreadable)
    // is an mkfs that was cut short, not a damaged filesystem.
    auto unfinished = [](SlotState s) {
      return s == SlotState::Torn || s == SlotState::BadChecksum || s == SlotState::Foreign ||
             s == SlotState::Unreadable;
    };
    if ((a.state == SlotState::Empty && unfinished(b.state)) ||
        (b.state == SlotState::Empty && unfinished(a.state)))
      return Error::invalid("no plyfs filesystem found (an mkfs was cut short: run mkfs.plyfs again)");
    return Error::corrupt(Error::kNoBlock, std::string("both superblocks are damaged (slot 0: ") +
                                               slot_state_name(a.state) + ", " + a.detail +
                                               "; slot 1: " + slot_state_name(b.state) + ", " +
                                               b.detail + ")");
  }
  c.slot = best;
  c.info = *c.reports[best].info;
  // The other slot is torn or damaged where a newer commit was being written.
  const auto& other = c.reports[1 - best];
  c.fell_back = other.state != SlotState::Valid && other.state != SlotState::Empty;
  return c;
}

}  // namespace plyfs
