// Numbers and sizes given on a command line or as mount options: one parser
// and one rule for every tool (mkfs.plyfs -s, plyfs -o cache=, plyctl
// --quota...), so that what one tool takes the others take too.
//
// Sizes follow util-linux's convention (lsblk(8), fallocate(1)): a whole or
// decimal number of bytes, optionally followed by a unit. K, M, G, T, P and
// E are powers of 1024, with or without "iB" (K = KiB = 1024); KB, MB, GB,
// TB, PB and EB are powers of 1000. Units are case-insensitive ("1g" is
// "1G"), a "B" alone means bytes. A sign, an empty string, trailing text or
// a value above 2^64 - 1 is refused: a typo must never become a filesystem
// of the wrong size.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/result.h"

namespace plyfs {

// `what` names the value in the message: "invalid size '1x': unknown unit".
Result<uint64_t> parse_size(std::string_view s, std::string_view what = "size");

// A whole number in [min, max], decimal (or 0x... hexadecimal when `hex`).
// Signs, spaces and trailing text are refused: strtoull would take "-1" as
// 2^64 - 1.
Result<uint64_t> parse_uint(std::string_view s, std::string_view what, uint64_t min = 0,
                            uint64_t max = ~uint64_t{0}, bool hex = false);

// "1.5 GiB", "512 B": binary units, at most one decimal, for messages and
// tables.
std::string format_size(uint64_t bytes);

}  // namespace plyfs
