// See parse.h.
#include "util/parse.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace plyfs {

namespace {

Error bad(std::string_view what, std::string_view s, std::string_view why) {
  std::string m = "invalid ";
  m += what;
  m += " '";
  m += s;
  m += "': ";
  m += why;
  return Error::invalid(std::move(m));
}

char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

}  // namespace

Result<uint64_t> parse_uint(std::string_view s, std::string_view what, uint64_t min, uint64_t max,
                            bool hex) {
  if (s.empty()) return bad(what, s, "expected a number");
  unsigned base = 10;
  std::string_view digits = s;
  if (hex && s.size() > 2 && s[0] == '0' && lower(s[1]) == 'x') {
    base = 16;
    digits = s.substr(2);
  }
  uint64_t v = 0;
  for (char c : digits) {
    unsigned d;
    if (c >= '0' && c <= '9') d = unsigned(c - '0');
    else if (base == 16 && lower(c) >= 'a' && lower(c) <= 'f') d = unsigned(lower(c) - 'a' + 10);
    else if (c == '-') return bad(what, s, "must not be negative");
    else return bad(what, s, "expected a whole number");
    if (v > (~uint64_t{0} - d) / base) return bad(what, s, "too large");
    v = v * base + d;
  }
  if (v < min) return bad(what, s, std::string("must be at least ") += std::to_string(min));
  if (v > max) return bad(what, s, std::string("must be at most ") += std::to_string(max));
  return v;
}

Result<uint64_t> parse_size(std::string_view s, std::string_view what) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+'))
    return bad(what, s, s[i] == '-' ? "must not be negative" : "expected a number");
  uint64_t whole = 0;
  size_t nd = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; i++, nd++) {
    const unsigned d = unsigned(s[i] - '0');
    if (whole > (~uint64_t{0} - d) / 10) return bad(what, s, "too large");
    whole = whole * 10 + d;
  }
  // A fraction: up to 9 digits are kept (a nanobyte is precise enough).
  uint64_t frac = 0, frac_div = 1;
  if (i < s.size() && s[i] == '.') {
    i++;
    size_t nf = 0;
    for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; i++, nf++)
      if (frac_div < 1000000000) {
        frac = frac * 10 + unsigned(s[i] - '0');
        frac_div *= 10;
      }
    if (nf == 0) return bad(what, s, "expected digits after '.'");
  }
  if (nd == 0) return bad(what, s, "expected a number");
  std::string unit;
  for (; i < s.size(); i++) unit += lower(s[i]);
  uint64_t base = 1024;
  unsigned power = 0;
  if (!unit.empty() && unit != "b") {
    static constexpr std::string_view kUnits = "kmgtpe";
    const size_t u = kUnits.find(unit[0]);
    const std::string rest = unit.substr(1);
    if (u == std::string_view::npos || !(rest.empty() || rest == "ib" || rest == "b"))
      return bad(what, s, "unknown unit (use K, M, G, T, P, E, KiB..EiB, or KB..EB for powers of 1000)");
    power = unsigned(u) + 1;
    if (rest == "b") base = 1000;
  }
  // whole * base^power + frac / frac_div * base^power, refusing overflow.
  uint64_t mult = 1;
  for (unsigned p = 0; p < power; p++) mult *= base;
  if (whole > ~uint64_t{0} / mult) return bad(what, s, "too large");
  uint64_t v = whole * mult;
  if (frac) {
    const long double f = static_cast<long double>(frac) / static_cast<long double>(frac_div) *
                          static_cast<long double>(mult);
    const uint64_t add = static_cast<uint64_t>(std::floor(f));
    if (v > ~uint64_t{0} - add) return bad(what, s, "too large");
    v += add;
  }
  return v;
}

std::string format_size(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  long double v = static_cast<long double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    u++;
  }
  char b[32];
  std::snprintf(b, sizeof b, v < 10 ? "%.2Lf %s" : v < 100 ? "%.1Lf %s" : "%.0Lf %s", v, kUnits[u]);
  return b;
}

}  // namespace plyfs
