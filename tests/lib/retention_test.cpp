// snap/retention.h: which automatic snapshots -o snapshot_keep keeps,
// against a direct reading of the rule, and its parser.
#include "snap/retention.h"

#include <map>
#include <random>
#include <set>

#include "test_util.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

constexpr uint64_t kSec = 1000000000ull;

// The rule as format.md states it, by brute force: periods by calendar (UTC),
// weeks from Monday.
std::set<size_t> kept_by_rule(const std::vector<uint64_t>& t, const Retention& r) {
  std::set<size_t> keep;
  std::vector<size_t> idx(t.size());
  for (size_t i = 0; i < t.size(); i++) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return t[a] > t[b]; });
  for (size_t i = 0; i < idx.size() && i < r.last; i++) keep.insert(idx[i]);
  auto key = [&](uint64_t ns, int cls) -> int64_t {
    std::time_t s = std::time_t(ns / kSec);
    std::tm tm{};
    gmtime_r(&s, &tm);
    if (cls == 0) return int64_t(s / 3600);
    if (cls == 1) return int64_t(s / 86400);
    if (cls == 2) {  // the Monday that starts the week, as a day number
      const int64_t day = int64_t(s / 86400);
      const int wday = (tm.tm_wday + 6) % 7;  // Monday 0
      return day - wday;
    }
    return int64_t(tm.tm_year) * 12 + tm.tm_mon;
  };
  const uint32_t counts[] = {r.hourly, r.daily, r.weekly, r.monthly};
  for (int cls = 0; cls < 4; cls++) {
    std::map<int64_t, size_t, std::greater<>> newest;  // period -> newest in it
    for (size_t i = 0; i < t.size(); i++) {
      auto [it, fresh] = newest.emplace(key(t[i], cls), i);
      if (!fresh && t[i] > t[it->second]) it->second = i;
    }
    uint32_t n = 0;
    for (const auto& [p, i] : newest) {
      if (n++ >= counts[cls]) break;
      keep.insert(i);
    }
  }
  return keep;
}

}  // namespace

TEST_CASE("retention: the snapshots pruned are exactly those no class keeps", "[snap][retention]") {
  const uint64_t s = seed("retention");
  std::mt19937_64 rng(s);
  for (int round = 0; round < 300; round++) {
    // Up to 400 snapshots over up to 90 days, at random moments (distinct).
    const size_t n = rng() % 400;
    const uint64_t start = (1700000000ull + rng() % 100000000ull) * kSec;
    const uint64_t span = (1 + rng() % (90 * 86400)) * kSec;
    std::set<uint64_t> ts;
    while (ts.size() < n) ts.insert(start + rng() % span);
    std::vector<uint64_t> t(ts.begin(), ts.end());
    std::shuffle(t.begin(), t.end(), rng);
    Retention r;
    r.last = rng() % 4 ? uint32_t(rng() % 10) : 0;
    r.hourly = rng() % 2 ? uint32_t(rng() % 30) : 0;
    r.daily = rng() % 2 ? uint32_t(rng() % 10) : 0;
    r.weekly = rng() % 2 ? uint32_t(rng() % 6) : 0;
    r.monthly = rng() % 3 ? 0 : uint32_t(rng() % 4);
    const auto gone = prune(t, r);
    if (r.keeps_all()) {
      REQUIRE(gone.empty());
      continue;
    }
    const std::set<size_t> keep = kept_by_rule(t, r);
    std::set<size_t> gone_set(gone.begin(), gone.end());
    REQUIRE(gone_set.size() == gone.size());
    for (size_t i = 0; i < t.size(); i++) {
      INFO("round " << round << " snapshot " << i);
      REQUIRE((keep.count(i) == 1) == (gone_set.count(i) == 0));
    }
    for (size_t i = 1; i < gone.size(); i++) REQUIRE(t[gone[i - 1]] < t[gone[i]]);  // oldest first
  }
}

TEST_CASE("retention: weeks start on Monday, months by the calendar", "[snap][retention]") {
  // 1795392000 is Monday 2026-11-23 00:00 UTC.
  const uint64_t mon = (1795392000ull + 3600) * kSec, sun = mon - 86400 * kSec, tue = mon + 86400 * kSec;
  Retention w;
  w.weekly = 2;
  // Monday and Tuesday share a week, Sunday is the week before: Tuesday and
  // Sunday stay.
  REQUIRE(prune({sun, mon, tue}, w) == std::vector<size_t>{1});
  Retention m;
  m.monthly = 1;
  // 1793491200 is 2026-11-01 00:00 UTC.
  const uint64_t nov1 = (1793491200ull + 3600) * kSec, oct31 = nov1 - 86400 * kSec;
  REQUIRE(prune({oct31, nov1}, m) == std::vector<size_t>{0});
}

TEST_CASE("retention: the option's forms, and clear refusals", "[snap][retention]") {
  REQUIRE(must(parse_retention("5")).last == 5);
  REQUIRE(must(parse_retention("0")).keeps_all());
  const Retention r = must(parse_retention("hourly=24:daily=7:weekly=4:monthly=12:last=3"));
  REQUIRE(r.hourly == 24);
  REQUIRE(r.daily == 7);
  REQUIRE(r.weekly == 4);
  REQUIRE(r.monthly == 12);
  REQUIRE(r.last == 3);
  for (const char* bad : {"abc", "-1", "hourly", "hourly=", "hourly=x", "yearly=2", "daily=1:daily=2", "daily=1:",
                          "=3", "daily=1000001"}) {
    INFO(bad);
    auto e = parse_retention(bad);
    REQUIRE_FALSE(e);
    REQUIRE(e.error().code == EINVAL);
  }
}
