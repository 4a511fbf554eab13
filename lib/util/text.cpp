// See text.h.
#include "util/text.h"

#include <cstdint>

namespace plyfs {

namespace text_detail {

size_t utf8_seq(std::string_view s, size_t i, char32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  size_t n;
  char32_t min;
  if ((c & 0xe0) == 0xc0) n = 2, cp = c & 0x1f, min = 0x80;
  else if ((c & 0xf0) == 0xe0) n = 3, cp = c & 0x0f, min = 0x800;
  else if ((c & 0xf8) == 0xf0) n = 4, cp = c & 0x07, min = 0x10000;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; k++) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (b(i + k) & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

}  // namespace text_detail

bool valid_utf8(std::string_view s) {
  bool ok = true;
  for_each_char(s, [&](long cp, std::string_view) { ok &= cp >= 0; });
  return ok;
}

std::string lossy_utf8(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for_each_char(s, [&](long cp, std::string_view bytes) { o += cp >= 0 ? bytes : "\xef\xbf\xbd"; });
  return o;
}

namespace {
bool is_control(long cp) { return cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f); }
}  // namespace

bool needs_escape(std::string_view s) {
  bool need = false;
  for_each_char(s, [&](long cp, std::string_view) { need |= cp < 0 || cp == '\\' || is_control(cp); });
  return need;
}

std::string escape(std::string_view s) {
  std::string o;
  auto octal = [&](std::string_view bytes) {
    for (unsigned char c : bytes) {
      o += '\\';
      o += char('0' + (c >> 6));
      o += char('0' + (c >> 3 & 7));
      o += char('0' + (c & 7));
    }
  };
  for_each_char(s, [&](long cp, std::string_view bytes) {
    static constexpr std::string_view kShort = "abtnvfr";  // \a is 7 ... \r is 13
    if (cp == '\\') o += "\\\\";
    else if (cp == ' ') o += "\\ ";
    else if (cp >= 7 && cp <= 13) o += '\\', o += kShort[size_t(cp - 7)];
    else if (cp < 0 || is_control(cp)) octal(bytes);
    else o += bytes;
  });
  return o;
}

std::string shown(std::string_view s) { return needs_escape(s) ? escape(s) : std::string(s); }

namespace {
constexpr std::string_view kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}  // namespace

std::string base64(std::string_view bytes) {
  std::string o;
  o.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = uint32_t(static_cast<unsigned char>(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(static_cast<unsigned char>(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 2]);
    o += kB64[v >> 18 & 63];
    o += kB64[v >> 12 & 63];
    o += i + 1 < bytes.size() ? kB64[v >> 6 & 63] : '=';
    o += i + 2 < bytes.size() ? kB64[v & 63] : '=';
  }
  return o;
}

std::optional<std::string> unbase64(std::string_view t) {
  if (t.size() % 4) return std::nullopt;
  std::string o;
  for (size_t i = 0; i < t.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (size_t k = 0; k < 4; k++) {
      const char c = t[i + k];
      size_t d = kB64.find(c);
      if (c == '=' && i + 4 == t.size() && k >= 2) {
        pad++;
        d = 0;
      } else if (d == std::string_view::npos || pad) {
        return std::nullopt;
      }
      v = v << 6 | uint32_t(d);
    }
    o += char(v >> 16);
    if (pad < 2) o += char(v >> 8 & 0xff);
    if (pad < 1) o += char(v & 0xff);
  }
  return o;
}

}  // namespace plyfs
