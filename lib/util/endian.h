// Little-endian field types for on-disk structures (format.md#encoding).
//
// Each field is a byte array, so every struct has alignment 1 and no padding
// appears between fields. It is read and written as little-endian whatever
// the host: one unaligned load or store, byte-swapped on a big-endian host
// (GCC 12 does not turn a loop of shifts into one load, and these reads are
// most of what a B-tree search does: 16 % of the instructions of a
// metadata workload went to key comparisons before, docs/benchmarks.md).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace plyfs {

template <class T, size_t N>
struct LeInt {
  static_assert(sizeof(T) == N);
  uint8_t b[N];
  T get() const {
    T v;
    std::memcpy(&v, b, N);
    if constexpr (std::endian::native == std::endian::big) v = byteswap(v);
    return v;
  }
  void set(T v) {
    if constexpr (std::endian::native == std::endian::big) v = byteswap(v);
    std::memcpy(b, &v, N);
  }

 private:
  static T byteswap(T v) {
    T r = 0;
    for (size_t i = 0; i < N; i++) r |= static_cast<T>((v >> (8 * i)) & 0xff) << (8 * (N - 1 - i));
    return r;
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
