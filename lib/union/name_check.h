// fsck's check of branch and view names against the one name rule
// (check_branch_name, view.h): invariant U5 of format.md#catalog. Names made
// before the rule was enforced, or damaged on disk, may hold '/', ':', '=' or
// control characters, which break the control folder, the stack syntax and
// every line a tool prints. fsck reports each one (code "U5-name") and
// `fsck -y` gives it a valid name no other branch (view) has.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "commit/volume.h"

namespace plyfs {

// Every live branch and every view whose name breaks the rule (an empty
// branch name is U3's, check.h). Only reads.
std::vector<Problem> check_names(Volume& v);
std::vector<Problem> check_names(BlockDevice& dev);  // opened read-only

// Renames what check_names finds, in the open generation of a read-write
// volume (the caller commits). Returns what it did, one sentence each,
// naming the old name and the new one.
Result<std::vector<std::string>> repair_names(Volume& v);

// The valid name a repair gives `name`: its refused bytes become '_'; if
// that is no valid name, `fallback`. Then, if `taken` says the result is
// in use, `~ID` replaces its end (at most 32 bytes); then `fallback`, then
// `fallback` with a counter. Exposed for the tests.
std::string repaired_name(std::string_view name, const std::string& fallback, uint64_t id,
                          const std::function<bool(const std::string&)>& taken);

// A name as the reports print it: printable ASCII as it is, '"' and '\'
// escaped, every other byte as \xHH, so that a name never breaks a line.
std::string printable_name(std::string_view name);

}  // namespace plyfs
