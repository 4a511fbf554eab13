// Little-endian field types for on-disk structures (format.md#encoding).
//
// Each field is a byte array read and written by shifting, so the host's byte
// order never matters, every struct has alignment 1, and no padding appears
// between fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace plyfs {

template <class T, size_t N>
struct LeInt {
  uint8_t b[N];
  constexpr T get() const {
    T v = 0;
    for (size_t i = 0; i < N; i++) v |= static_cast<T>(b[i]) << (8 * i);
    return v;
  }
  constexpr void set(T v) {
    for (size_t i = 0; i < N; i++) b[i] = static_cast<uint8_t>(v >> (8 * i));
  }
};

using le16 = LeInt<uint16_t, 2>;
using le32 = LeInt<uint32_t, 4>;
using le64 = LeInt<uint64_t, 8>;
static_assert(sizeof(le16) == 2 && sizeof(le32) == 4 && sizeof(le64) == 8);
static_assert(alignof(le64) == 1);

// Views a byte buffer as an on-disk struct. The structs hold only byte arrays,
// so this is access through a character type, and alignment is 1.
template <class S>
S* view_as(std::span<std::byte> buf, size_t offset = 0) {
  return reinterpret_cast<S*>(buf.data() + offset);
}
template <class S>
const S* view_as(std::span<const std::byte> buf, size_t offset = 0) {
  return reinterpret_cast<const S*>(buf.data() + offset);
}

}  // namespace plyfs
