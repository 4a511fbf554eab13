#include "snap/retention.h"

#include <algorithm>
#include <ctime>
#include <numeric>
#include <set>

#include "util/parse.h"

namespace plyfs {

namespace {

constexpr uint32_t kMaxCount = 1000000;

// The period a time falls in, per class: consecutive integers for
// consecutive periods. Weeks start on Monday (1970-01-01 was a Thursday).
int64_t period(uint64_t ns, int cls) {
  const int64_t s = int64_t(ns / 1000000000);
  const int64_t days = s >= 0 ? s / 86400 : (s - 86399) / 86400;
  switch (cls) {
    case 0: return s / 3600;
    case 1: return days;
    case 2: return (days + 3) / 7;  // day 0 (Thursday) is in week 0, which began on day -3
    default: {
      std::time_t t = std::time_t(s);
      std::tm tm{};
      gmtime_r(&t, &tm);
      return int64_t(tm.tm_year) * 12 + tm.tm_mon;
    }
  }
}

}  // namespace

Result<Retention> parse_retention(std::string_view s) {
  Retention r;
  if (s.empty()) return r;
  if (s.find('=') == std::string_view::npos) {
    r.last = uint32_t(PLY_TRY(parse_uint(s, "snapshot_keep", 0, kMaxCount)));
    return r;
  }
  std::set<std::string> seen;
  for (size_t pos = 0; pos <= s.size();) {
    const size_t end = std::min(s.find(':', pos), s.size());
    const std::string_view part = s.substr(pos, end - pos);
    const size_t eq = part.find('=');
    if (eq == std::string_view::npos)
      return Error::invalid("invalid snapshot_keep class '" + std::string(part) + "': want CLASS=N");
    const std::string cls(part.substr(0, eq));
    const uint32_t n = uint32_t(PLY_TRY(parse_uint(part.substr(eq + 1), "snapshot_keep " + cls, 0, kMaxCount)));
    uint32_t* field = cls == "last"      ? &r.last
                      : cls == "hourly"  ? &r.hourly
                      : cls == "daily"   ? &r.daily
                      : cls == "weekly"  ? &r.weekly
                      : cls == "monthly" ? &r.monthly
                                         : nullptr;
    if (!field)
      return Error::invalid("invalid snapshot_keep class '" + cls + "' (last, hourly, daily, weekly, monthly)");
    if (!seen.insert(cls).second) return Error::invalid("invalid snapshot_keep: class '" + cls + "' given twice");
    *field = n;
    pos = end + 1;
  }
  return r;
}

std::vector<size_t> prune(const std::vector<uint64_t>& created_ns, const Retention& r) {
  if (r.keeps_all()) return {};
  std::vector<size_t> order(created_ns.size());  // newest first
  std::iota(order.begin(), order.end(), size_t{0});
  // Equal times (a coarse clock): the later index is the newer, as callers
  // list snapshots oldest first (snapshots_of).
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return created_ns[a] != created_ns[b] ? created_ns[a] > created_ns[b] : a > b;
  });
  std::vector<bool> keep(created_ns.size(), false);
  for (size_t i = 0; i < order.size() && i < r.last; i++) keep[order[i]] = true;
  const uint32_t counts[] = {r.hourly, r.daily, r.weekly, r.monthly};
  for (int cls = 0; cls < 4; cls++) {
    // Walking newest first, the first snapshot of each new period is that
    // period's newest; the first `count` periods met are the most recent.
    uint32_t periods = 0;
    bool any = false;
    int64_t current = 0;
    for (size_t i : order) {
      if (periods >= counts[cls]) break;
      const int64_t p = period(created_ns[i], cls);
      if (any && p == current) continue;
      any = true;
      current = p;
      keep[i] = true;
      periods++;
    }
  }
  std::vector<size_t> out;
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    if (!keep[*it]) out.push_back(*it);
  return out;
}

}  // namespace plyfs
