// Which automatic snapshots to keep (plyfs -o snapshot_keep, format.md#snapshots,
// "Automatic snapshots"): the newest `last`, and per class the newest
// snapshot of each of the `count` most recent periods (hours, days, weeks,
// months, UTC) that hold one -- the timeline classes of snapper and
// zfs-auto-snapshot. A snapshot any rule keeps stays; the others go.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/result.h"

namespace plyfs {

struct Retention {
  uint32_t last = 0;  // the newest N, whatever their age
  uint32_t hourly = 0, daily = 0, weekly = 0, monthly = 0;
  bool keeps_all() const { return !last && !hourly && !daily && !weekly && !monthly; }
};

// "N" (the newest N: the old form), or classes joined by ':' in any order:
// "last=5:hourly=24:daily=7:weekly=4:monthly=12". 0 or "" keeps all.
Result<Retention> parse_retention(std::string_view s);

// The snapshots to delete, as indices into `created_ns` (their creation
// times, any order; of two equal times the later index counts as the
// newer), oldest first.
std::vector<size_t> prune(const std::vector<uint64_t>& created_ns, const Retention& r);

}  // namespace plyfs
