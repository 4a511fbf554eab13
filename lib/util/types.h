// Distinct integer types for the numbers that must never be mixed up:
// a block number is not a generation is not a tree id.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>

namespace plyfs {

template <class Tag>
struct Strong {
  uint64_t v = 0;
  constexpr Strong() = default;
  constexpr explicit Strong(uint64_t x) : v(x) {}
  constexpr auto operator<=>(const Strong&) const = default;
};

using BlockNo = Strong<struct BlockNoTag>;
using Generation = Strong<struct GenerationTag>;
using TreeId = Strong<struct TreeIdTag>;
using InodeNo = Strong<struct InodeNoTag>;
using BranchId = Strong<struct BranchIdTag>;

constexpr BlockNo operator+(BlockNo b, uint64_t n) { return BlockNo{b.v + n}; }
constexpr Generation next(Generation g) { return Generation{g.v + 1}; }

}  // namespace plyfs

template <class Tag>
struct std::hash<plyfs::Strong<Tag>> {
  size_t operator()(const plyfs::Strong<Tag>& s) const noexcept {
    return std::hash<uint64_t>{}(s.v);
  }
};
