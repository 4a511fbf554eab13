// A string as a JSON string literal, quotes included: the one encoding the
// tools' --json outputs share (plyctl, fsck.plyfs, the diff formatter).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace plyfs {

inline std::string json_quote(std::string_view s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += c;
    }
  }
  return o + "\"";
}

}  // namespace plyfs
