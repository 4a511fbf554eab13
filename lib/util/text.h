// Names as bytes: whether they are UTF-8, how to show them on one line and
// how to carry them in JSON when they are not (plyctl.8, "JSON SCHEMA";
// format.md#fs-info, the name rule). Branch names of old images and file
// names in a diff are bytes, not text: every tool shows them through these
// functions, so that they print the same everywhere.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace plyfs {

// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing past
// U+10FFFF.
bool valid_utf8(std::string_view s);

// Calls fn(code_point, bytes) for each character of valid UTF-8 and
// fn(-1, byte) for each byte that starts no valid sequence.
template <class Fn>
void for_each_char(std::string_view s, Fn&& fn);

// `s` as valid UTF-8: each byte that starts no valid sequence becomes
// U+FFFD. The identity on valid UTF-8.
std::string lossy_utf8(std::string_view s);

// Whether a name needs quoting to be shown on one line: it holds a control
// character (C0, DEL, C1), a backslash, or bytes that are not UTF-8.
bool needs_escape(std::string_view s);
// `ls --quoting-style=escape` in a UTF-8 locale: backslash \\, space "\ ",
// \a \b \t \n \v \f \r, every other control character and every byte that
// is not UTF-8 as \ooo (three octal digits); printable UTF-8 as it is.
std::string escape(std::string_view s);
// What the tools print for a name in text: escape(s) if needs_escape(s),
// else s unchanged (spaces included).
std::string shown(std::string_view s);

// RFC 4648 base64 with padding; decode refuses anything else.
std::string base64(std::string_view bytes);
std::optional<std::string> unbase64(std::string_view text);

// --- implementation of the template ------------------------------------------------------

namespace text_detail {
// The length of the valid UTF-8 sequence at s[i] and its code point, or 0.
size_t utf8_seq(std::string_view s, size_t i, char32_t& cp);
}  // namespace text_detail

template <class Fn>
void for_each_char(std::string_view s, Fn&& fn) {
  for (size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const size_t n = text_detail::utf8_seq(s, i, cp);
    if (n == 0) {
      fn(-1L, s.substr(i, 1));
      i++;
    } else {
      fn(long(cp), s.substr(i, n));
      i += n;
    }
  }
}

}  // namespace plyfs
