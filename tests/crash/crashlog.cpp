#include "crashlog.h"

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <random>

#include "blockdev/log_device.h"
#include "commit/devices.h"
#include "commit/disk_superblock.h"

namespace plyfs::crash {

void Log::index() {
  writes.clear();
  flushes.clear();
  discards.clear();
  supers.clear();
  by_sector.clear();
  first_failed_flush = entries.size();
  for (size_t i = 0; i < entries.size(); i++) {
    const Entry& e = entries[i];
    if (e.kind == Kind::FlushFailed && first_failed_flush == entries.size()) first_failed_flush = i;
    // D4: after a failed flush, no later flush makes its writes durable.
    if (e.kind == Kind::Flush && i < first_failed_flush) flushes.push_back(i);
    if (e.kind == Kind::Discard) discards.push_back(i);
    if (!is_write(i)) continue;
    writes.push_back(i);
    for (uint64_t s = e.offset / sector; s < (e.offset + e.length) / sector; s++)
      by_sector[s].push_back(static_cast<uint32_t>(i));
    // Commit points come from the bytes written at the superblock offsets.
    for (int slot = 0; slot < 2; slot++)
      if (e.offset == disk::kSuperOffset[slot] && e.length == disk::kSuperSize && e.data) {
        const auto* sb = reinterpret_cast<const disk::Superblock*>(e.data->data());
        supers.push_back(SuperWrite{i, slot, sb->s0.generation.get()});
      }
  }
}

long Log::last_flush_before(size_t crash_at) const {
  auto it = std::lower_bound(flushes.begin(), flushes.end(), crash_at);
  return it == flushes.begin() ? -1 : static_cast<long>(*std::prev(it));
}

uint64_t Log::gen_lo(size_t crash_at, uint64_t base_gen) const {
  const long f = last_flush_before(crash_at);
  uint64_t g = base_gen;
  for (const auto& s : supers)
    if (static_cast<long>(s.pos) < f && s.gen > g) g = s.gen;
  return g;
}

uint64_t Log::gen_hi(size_t crash_at, uint64_t base_gen) const {
  uint64_t g = base_gen;
  for (const auto& s : supers)
    if (s.pos < crash_at && s.gen > g) g = s.gen;
  return g;
}

std::string load_log(const std::string& path, Log& log, std::vector<uint64_t>* ends) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return "cannot open " + path;
  std::vector<unsigned char> b;
  unsigned char chunk[1 << 16];
  for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) b.insert(b.end(), chunk, chunk + n);
  std::fclose(f);
  auto get64 = [&](size_t at) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[at + size_t(i)];
    return v;
  };
  if (b.size() < 24 || std::memcmp(b.data(), kLogMagic, 8) != 0) return path + ": not a crash log";
  log.sector = static_cast<uint32_t>(get64(8));
  log.entries.clear();
  if (ends) ends->clear();
  for (size_t at = 24; at + 24 <= b.size();) {
    Entry e;
    const uint64_t len = get64(at + 16);
    switch (static_cast<LogRecord>(b[at])) {
      case LogRecord::Write: e.kind = Kind::Write; break;
      case LogRecord::WriteFailed: e.kind = Kind::WriteFailed; break;
      case LogRecord::Flush: e.kind = Kind::Flush; break;
      case LogRecord::FlushFailed: e.kind = Kind::FlushFailed; break;
      case LogRecord::Discard: e.kind = Kind::Discard; break;
      default: return path + ": unknown record at byte " + std::to_string(at);
    }
    e.offset = get64(at + 8);
    e.length = len;
    at += 24;
    if (e.kind == Kind::Write || e.kind == Kind::WriteFailed) {
      if (b.size() - at < len) break;  // cut short
      auto* p = reinterpret_cast<const std::byte*>(b.data() + at);
      e.data = std::make_shared<const std::vector<std::byte>>(p, p + len);
      at += len;
    }
    log.entries.push_back(std::move(e));
    if (ends) ends->push_back(at);
  }
  log.index();
  return "";
}

std::string Spec::id() const {
  std::string s = tier + ":at=" + std::to_string(crash_at) + ":keep=";
  for (size_t i = 0; i < kept.size(); i++) {
    if (i) s += ',';
    s += std::to_string(kept[i]);
  }
  if (tear) {
    s += ":tear=";
    for (bool b : *tear) s += b ? '1' : '0';
    s += lost == Lost::Old ? "/old" : lost == Lost::Garbage ? "/garbage" : "/eio";
  }
  return s;
}

StateDevice::StateDevice(const Log& log, Spec spec, uint64_t garbage_seed)
    : log_(log), spec_(std::move(spec)), seed_(garbage_seed) {
  open_start_ = static_cast<size_t>(log_.last_flush_before(spec_.crash_at) + 1);
  kept_mask_.assign(log_.entries.size(), 0);
  for (size_t p : spec_.kept) kept_mask_[p] = 1;
}

Result<void> StateDevice::read_sector(uint64_t sector, std::byte* out) {
  const uint32_t ss = log_.sector;
  if (auto o = overlay_.find(sector); o != overlay_.end()) {
    std::memcpy(out, o->second.data(), ss);
    return ok();
  }
  auto it = log_.by_sector.find(sector);
  if (it != log_.by_sector.end()) {
    const auto& positions = it->second;
    // The newest write to this sector that is in the state: kept writes of
    // the open set first, then the last durable one.
    auto end = std::lower_bound(positions.begin(), positions.end(),
                                static_cast<uint32_t>(spec_.crash_at));
    for (auto p = end; p != positions.begin();) {
      --p;
      const size_t pos = *p;
      if (pos >= open_start_ && !kept_mask_[pos]) continue;
      const Entry& e = log_.entries[pos];
      const uint64_t idx = sector - e.offset / ss;  // sector within the write
      if (pos >= open_start_ && spec_.tear && !spec_.kept.empty() && pos == spec_.kept.back() &&
          !(*spec_.tear)[idx]) {
        if (spec_.lost == Lost::Unreadable)
          return Error::io(EIO, "crash state: unreadable torn sector " + std::to_string(sector));
        if (spec_.lost == Lost::Garbage) {
          std::mt19937_64 rng(seed_ ^ (sector * 0x9e3779b97f4a7c15ull));
          for (uint32_t i = 0; i < ss; i += 8) {
            uint64_t v = rng();
            std::memcpy(out + i, &v, std::min<uint32_t>(8, ss - i));
          }
          return ok();
        }
        continue;  // Old: what was there before this write
      }
      if (discarded(sector, long(pos))) std::memset(out, 0, ss);
      else std::memcpy(out, e.data->data() + idx * ss, ss);
      return ok();
    }
  }
  if (discarded(sector, -1)) std::memset(out, 0, ss);
  else log_.base->peek_into(sector * ss, std::span<std::byte>(out, ss));
  return ok();
}

bool StateDevice::discarded(uint64_t sector, long after) const {
  const uint32_t ss = log_.sector;
  for (auto it = log_.discards.rbegin(); it != log_.discards.rend(); ++it) {
    const long pos = long(*it);
    if (size_t(pos) >= spec_.crash_at) continue;
    if (pos <= after) return false;
    const Entry& e = log_.entries[size_t(pos)];
    if (sector >= e.offset / ss && sector < (e.offset + e.length) / ss) return true;
  }
  return false;
}

Result<void> StateDevice::read(uint64_t offset, std::span<std::byte> out) {
  PLY_CHECK(check_range(*this, offset, out.size()));
  const uint32_t ss = log_.sector;
  for (uint64_t i = 0; i < out.size(); i += ss) PLY_CHECK(read_sector((offset + i) / ss, out.data() + i));
  return ok();
}

Result<void> StateDevice::write(uint64_t offset, std::span<const std::byte> in) {
  PLY_CHECK(check_range(*this, offset, in.size()));
  const uint32_t ss = log_.sector;
  for (uint64_t i = 0; i < in.size(); i += ss)
    overlay_[(offset + i) / ss].assign(in.begin() + i, in.begin() + i + ss);
  overlay_writes_++;
  return ok();
}

}  // namespace plyfs::crash

namespace plyfs::crash {

size_t MultiLog::local_cut(size_t d, size_t cut) const {
  const auto& g = global_of[d];
  return static_cast<size_t>(std::lower_bound(g.begin(), g.end(), cut) - g.begin());
}

uint64_t MultiLog::gen_lo(size_t cut, uint64_t base_gen) const {
  uint64_t g = ~0ull;
  for (size_t d = 0; d < members.size(); d++) g = std::min(g, members[d].gen_lo(local_cut(d, cut), base_gen));
  return g;
}

uint64_t MultiLog::gen_hi(size_t cut, uint64_t base_gen) const {
  uint64_t g = ~0ull;
  for (size_t d = 0; d < members.size(); d++) g = std::min(g, members[d].gen_hi(local_cut(d, cut), base_gen));
  return g;
}

// One member of a recorded set: its calls go to the inner device and into
// the recorder's global order.
class RecMember final : public BlockDevice {
 public:
  RecMember(SetRecorder& rec, int d, BlockDevice& inner) : rec_(rec), d_(d), inner_(inner) {}
  Result<void> read(uint64_t offset, std::span<std::byte> out) override { return inner_.read(offset, out); }
  Result<void> write(uint64_t offset, std::span<const std::byte> in) override {
    auto r = inner_.write(offset, in);
    Entry e{r ? Kind::Write : Kind::WriteFailed, offset, in.size(), nullptr, {}, 0};
    e.data = std::make_shared<const std::vector<std::byte>>(in.begin(), in.end());
    rec_.add(d_, std::move(e));
    return r;
  }
  Result<void> flush() override {
    auto r = inner_.flush();
    rec_.add(d_, Entry{r ? Kind::Flush : Kind::FlushFailed, 0, 0, nullptr, {}, 0});
    return r;
  }
  Result<void> discard(uint64_t offset, uint64_t len) override {
    auto r = inner_.discard(offset, len);
    if (r) rec_.add(d_, Entry{Kind::Discard, offset, len, nullptr, {}, 0});
    return r;
  }
  uint64_t size_bytes() const override { return inner_.size_bytes(); }
  uint32_t logical_sector_size() const override { return inner_.logical_sector_size(); }
  uint32_t physical_sector_size() const override { return inner_.physical_sector_size(); }

 private:
  SetRecorder& rec_;
  int d_;
  BlockDevice& inner_;
};

std::unique_ptr<BlockDevice> SetRecorder::member(size_t d, BlockDevice& inner) {
  return std::make_unique<RecMember>(*this, static_cast<int>(d), inner);
}

void SetRecorder::add(int d, Entry e) {
  std::lock_guard lk(mu_);
  entries_.push_back(std::move(e));
  dev_.push_back(d);
}

void SetRecorder::mark(std::string label, uint64_t arg) {
  add(-1, Entry{Kind::Mark, 0, 0, nullptr, std::move(label), arg});
}

MultiLog SetRecorder::take(std::vector<std::unique_ptr<MemDevice>> bases,
                           std::vector<uint64_t> member_bytes) {
  std::lock_guard lk(mu_);
  MultiLog ml;
  ml.member_bytes = std::move(member_bytes);
  ml.members.resize(bases.size());
  ml.global_of.resize(bases.size());
  for (size_t d = 0; d < bases.size(); d++) {
    ml.members[d].sector = bases[d]->logical_sector_size();
    ml.members[d].base = std::move(bases[d]);
  }
  ml.entries = entries_;
  ml.dev = dev_;
  ml.local.assign(entries_.size(), 0);
  for (size_t i = 0; i < entries_.size(); i++) {
    if (dev_[i] < 0) continue;
    auto& m = ml.members[size_t(dev_[i])];
    ml.local[i] = m.entries.size();
    ml.global_of[size_t(dev_[i])].push_back(i);
    m.entries.push_back(entries_[i]);
  }
  for (auto& m : ml.members) m.index();
  return ml;
}

Result<std::unique_ptr<DeviceSet>> assemble(const std::vector<BlockDevice*>& devs,
                                            const std::vector<uint64_t>& member_bytes) {
  const auto layout = plan_devices(member_bytes, 4096);
  std::vector<DeviceSet::Member> m;
  for (size_t i = 0; i < devs.size(); i++)
    m.push_back(DeviceSet::Member{std::make_unique<BorrowedDevice>(*devs[i]), layout[i].first * 4096,
                                  layout[i].second * 4096, "dev" + std::to_string(i)});
  return DeviceSet::make(std::move(m), disk::kReservedBytes);
}

std::string MultiSpec::id() const {
  std::string s = tier + ":at=" + std::to_string(cut);
  for (size_t d = 0; d < members.size(); d++) {
    const Spec& m = members[d];
    s += "|" + std::to_string(d) + ":keep=";
    for (size_t i = 0; i < m.kept.size(); i++) s += (i ? "," : "") + std::to_string(m.kept[i]);
    if (m.tear) {
      s += ":tear=";
      for (bool b : *m.tear) s += b ? '1' : '0';
      s += m.lost == Lost::Old ? "/old" : m.lost == Lost::Garbage ? "/garbage" : "/eio";
    }
  }
  return s;
}

}  // namespace plyfs::crash
