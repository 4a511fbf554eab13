#include "blockdev/test_devices.h"

#include <algorithm>
#include <cstring>

namespace plyfs {

// ---------------------------------------------------------------- MemDevice

MemDevice::MemDevice(uint64_t size_bytes, uint32_t sector_size, uint32_t physical_sector_size)
    : size_(size_bytes / sector_size * sector_size), lss_(sector_size), pss_(physical_sector_size) {}

void MemDevice::read_locked(uint64_t offset, std::span<std::byte> out) const {
  size_t done = 0;
  while (done < out.size()) {
    uint64_t pos = offset + done;
    uint64_t page = pos / kPage, in_page = pos % kPage;
    size_t n = std::min<uint64_t>(kPage - in_page, out.size() - done);
    auto it = pages_.find(page);
    if (it == pages_.end())
      std::memset(out.data() + done, 0, n);
    else
      std::memcpy(out.data() + done, it->second.get() + in_page, n);
    done += n;
  }
}

void MemDevice::write_locked(uint64_t offset, std::span<const std::byte> in) {
  size_t done = 0;
  while (done < in.size()) {
    uint64_t pos = offset + done;
    uint64_t page = pos / kPage, in_page = pos % kPage;
    size_t n = std::min<uint64_t>(kPage - in_page, in.size() - done);
    auto& p = pages_[page];
    if (!p) {
      p.reset(new std::byte[kPage]);
      std::memset(p.get(), 0, kPage);
    }
    std::memcpy(p.get() + in_page, in.data() + done, n);
    done += n;
  }
}

Result<void> MemDevice::read(uint64_t offset, std::span<std::byte> out) {
  PLY_CHECK(check_range(*this, offset, out.size()));
  std::lock_guard lk(mu_);
  read_locked(offset, out);
  return ok();
}

Result<void> MemDevice::write(uint64_t offset, std::span<const std::byte> in) {
  PLY_CHECK(check_range(*this, offset, in.size()));
  std::lock_guard lk(mu_);
  if (track_) {
    for (uint64_t s = 0; s < in.size(); s += lss_) {
      Pending p{offset + s, std::vector<std::byte>(lss_)};
      read_locked(offset + s, p.old_bytes);
      unflushed_.push_back(std::move(p));
    }
  }
  write_locked(offset, in);
  return ok();
}

Result<void> MemDevice::flush() {
  std::lock_guard lk(mu_);
  unflushed_.clear();
  return ok();
}

Result<void> MemDevice::discard(uint64_t offset, uint64_t len) {
  PLY_CHECK(check_range(*this, offset, len));
  std::lock_guard lk(mu_);
  // Zero the range; whole pages are released. (D7 allows old or zero.)
  std::vector<std::byte> zero(lss_);
  for (uint64_t s = 0; s < len; s += lss_) {
    uint64_t pos = offset + s;
    if (pos % kPage == 0 && len - s >= kPage) {
      pages_.erase(pos / kPage);
      s += kPage - lss_;
      continue;
    }
    write_locked(pos, zero);
  }
  return ok();
}

std::unique_ptr<MemDevice> MemDevice::clone() const {
  std::lock_guard lk(mu_);
  auto c = std::make_unique<MemDevice>(size_, lss_, pss_);
  for (const auto& [page, buf] : pages_) {
    auto& p = c->pages_[page];
    p.reset(new std::byte[kPage]);
    std::memcpy(p.get(), buf.get(), kPage);
  }
  c->track_ = track_;
  c->unflushed_ = unflushed_;
  return c;
}

void MemDevice::poke(uint64_t offset, std::span<const std::byte> bytes) {
  std::lock_guard lk(mu_);
  write_locked(offset, bytes);
}

std::vector<std::byte> MemDevice::peek(uint64_t offset, size_t len) const {
  std::lock_guard lk(mu_);
  std::vector<std::byte> out(len);
  read_locked(offset, out);
  return out;
}

bool MemDevice::same_content(const MemDevice& other) const {
  std::scoped_lock lk(mu_, other.mu_);
  if (size_ != other.size_) return false;
  static const std::byte zero[kPage] = {};
  auto page_of = [](const MemDevice& d, uint64_t p) -> const std::byte* {
    auto it = d.pages_.find(p);
    return it == d.pages_.end() ? zero : it->second.get();
  };
  for (const auto* d : {this, &other})
    for (const auto& [p, buf] : d->pages_)
      if (std::memcmp(page_of(*this, p), page_of(other, p), kPage) != 0) return false;
  return true;
}

void MemDevice::peek_into(uint64_t offset, std::span<std::byte> out) const {
  std::lock_guard lk(mu_);
  read_locked(offset, out);
}

uint64_t MemDevice::pages_in_use() const {
  std::lock_guard lk(mu_);
  return pages_.size();
}

void MemDevice::track_unflushed(bool on) {
  std::lock_guard lk(mu_);
  track_ = on;
  unflushed_.clear();
}

uint64_t MemDevice::crash(std::mt19937_64& rng) {
  std::lock_guard lk(mu_);
  // Each unflushed entry is one sector of one write; each is kept or dropped
  // independently, which also tears multi-sector writes (D1, D2). A sector
  // ends up with the bytes of its last kept write, or, if none is kept, the
  // bytes it had before its first unflushed write.
  std::map<uint64_t, std::vector<std::byte>> result, current;
  for (const auto& p : unflushed_)
    if (!result.count(p.sector_offset)) result[p.sector_offset] = p.old_bytes;
  for (const auto& [off, bytes] : result) {
    std::vector<std::byte> cur(lss_);
    read_locked(off, cur);
    current[off] = std::move(cur);
  }
  // The new bytes of entry i are the old bytes of the next entry for the same
  // sector, or the current content for the last one.
  std::map<uint64_t, size_t> next_index;
  std::vector<const std::vector<std::byte>*> new_bytes(unflushed_.size());
  for (size_t i = unflushed_.size(); i-- > 0;) {
    const auto& p = unflushed_[i];
    auto it = next_index.find(p.sector_offset);
    new_bytes[i] = it == next_index.end() ? &current[p.sector_offset]
                                          : &unflushed_[it->second].old_bytes;
    next_index[p.sector_offset] = i;
  }
  for (size_t i = 0; i < unflushed_.size(); i++)
    if (rng() & 1) result[unflushed_[i].sector_offset] = *new_bytes[i];
  uint64_t reverted = 0;
  for (auto& [off, bytes] : result) {
    if (bytes != current[off]) reverted++;
    write_locked(off, bytes);
  }
  unflushed_.clear();
  return reverted;
}

// ---------------------------------------------------------- RecordingDevice

Result<void> RecordingDevice::read(uint64_t offset, std::span<std::byte> out) {
  return inner_.read(offset, out);
}

Result<void> RecordingDevice::write(uint64_t offset, std::span<const std::byte> in) {
  auto r = inner_.write(offset, in);
  std::lock_guard lk(mu_);
  Entry e{r ? Kind::Write : Kind::WriteFailed, offset, in.size(), nullptr, {}, 0};
  e.data = std::make_shared<const std::vector<std::byte>>(in.begin(), in.end());
  log_.push_back(std::move(e));
  return r;
}

Result<void> RecordingDevice::flush() {
  auto r = inner_.flush();
  std::lock_guard lk(mu_);
  log_.push_back(Entry{r ? Kind::Flush : Kind::FlushFailed, 0, 0, nullptr, {}, 0});
  return r;
}

Result<void> RecordingDevice::discard(uint64_t offset, uint64_t len) {
  auto r = inner_.discard(offset, len);
  std::lock_guard lk(mu_);
  if (r) log_.push_back(Entry{Kind::Discard, offset, len, nullptr, {}, 0});
  return r;
}

void RecordingDevice::mark(std::string label, uint64_t arg) {
  std::lock_guard lk(mu_);
  log_.push_back(Entry{Kind::Mark, 0, 0, nullptr, std::move(label), arg});
}

std::vector<RecordingDevice::Entry> RecordingDevice::log() const {
  std::lock_guard lk(mu_);
  return log_;
}

void RecordingDevice::clear() {
  std::lock_guard lk(mu_);
  log_.clear();
}

// -------------------------------------------------------------- FaultDevice

void FaultDevice::add(Rule r) {
  std::lock_guard lk(mu_);
  rules_.push_back(r);
}

void FaultDevice::clear() {
  std::lock_guard lk(mu_);
  rules_.clear();
  std::fill(std::begin(counts_), std::end(counts_), 0);
  fired_ = 0;
}

uint64_t FaultDevice::fired() const {
  std::lock_guard lk(mu_);
  return fired_;
}

uint64_t FaultDevice::calls(Op op) const {
  std::lock_guard lk(mu_);
  return counts_[static_cast<int>(op)];
}

const FaultDevice::Rule* FaultDevice::hit(Op op) {
  std::lock_guard lk(mu_);
  uint64_t n = ++counts_[static_cast<int>(op)];
  uint64_t any = ++counts_[static_cast<int>(Op::Any)];
  uint64_t modify = op == Op::Read ? 0 : ++counts_[static_cast<int>(Op::Modify)];
  for (const auto& r : rules_) {
    uint64_t c = r.op == Op::Any ? any : r.op == Op::Modify ? modify : (r.op == op ? n : 0);
    if (c == 0) continue;
    if (c == r.nth || (r.sticky && c > r.nth)) {
      fired_++;
      return &r;
    }
  }
  return nullptr;
}

static Error fault_error(FaultDevice::Kind k, const char* what) {
  int code = (k == FaultDevice::Kind::Enospc || k == FaultDevice::Kind::Short) ? ENOSPC : EIO;
  return Error::io(code, std::string("injected fault on ") + what);
}

Result<void> FaultDevice::read(uint64_t offset, std::span<std::byte> out) {
  if (const Rule* r = hit(Op::Read)) return fault_error(r->kind, "read");
  return inner_.read(offset, out);
}

Result<void> FaultDevice::write(uint64_t offset, std::span<const std::byte> in) {
  const Rule* r = hit(Op::Write);
  if (!r) return inner_.write(offset, in);
  const uint64_t ss = inner_.logical_sector_size();
  const uint64_t nsec = in.size() / ss;
  if (r->kind == Kind::Short && nsec > 1) {
    uint64_t keep = nsec / 2;
    (void)inner_.write(offset, in.first(keep * ss));
  } else if (r->kind == Kind::Torn) {
    std::mt19937_64 rng(r->seed ^ offset);
    for (uint64_t s = 0; s < nsec; s++)
      if (rng() & 1) (void)inner_.write(offset + s * ss, in.subspan(s * ss, ss));
  }
  return fault_error(r->kind, "write");
}

Result<void> FaultDevice::flush() {
  if (const Rule* r = hit(Op::Flush)) return fault_error(r->kind, "flush");
  return inner_.flush();
}

Result<void> FaultDevice::discard(uint64_t offset, uint64_t len) {
  if (const Rule* r = hit(Op::Discard)) return fault_error(r->kind, "discard");
  return inner_.discard(offset, len);
}

}  // namespace plyfs
