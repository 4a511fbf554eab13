// The node ids of the control folder (ctl_folder.h, "Node ids"; C3, C6),
// and what its replies share, for its parts (ctl_folder.cpp,
// ctl_layers.cpp, ctl_names.cpp, ctl_files.cpp, ctl_caches.cpp).
#pragma once

#include <string>
#include <string_view>

#include "ctl_folder.h"

namespace plyfs::ctl {

inline constexpr unsigned kSlotShift = 40;
inline constexpr uint64_t kNumMask = (uint64_t(1) << kSlotShift) - 1;
inline constexpr fuse_ino_t kRootNode = kCtlBit | 1, kLayersNode = kCtlBit | 2;
inline constexpr uint64_t kMaxFolder = kNumMask >> 3;

// Slot s > 0: view s's union inode number n.
inline fuse_ino_t node(size_t slot, uint64_t n) { return kCtlBit | (uint64_t(slot) << kSlotShift) | n; }
inline size_t slot_of(fuse_ino_t i) { return size_t((i & ~kCtlBit) >> kSlotShift); }
inline uint64_t num_of(fuse_ino_t i) { return i & kNumMask; }
// Slot 0: a name's nodes (C6), its folder id, then the kind in the low 3 bits.
enum NodeKind : uint64_t { kFolder = 1, kInfo = 2, kDataListed = 3, kChildren = 4, kChildLink = 5 };
inline fuse_ino_t named_node(uint64_t id, NodeKind k) { return kCtlBit | (id << 3) | k; }
inline uint64_t kind_of(fuse_ino_t i) { return slot_of(i) == 0 && (i & kNumMask) >> 3 ? i & 7 : 0; }
inline fuse_ino_t folder_node(uint64_t id) { return named_node(id, kFolder); }
inline fuse_ino_t info_node(uint64_t id) { return named_node(id, kInfo); }
inline bool is_folder(fuse_ino_t i) { return kind_of(i) == kFolder; }
inline bool is_info(fuse_ino_t i) { return kind_of(i) == kInfo; }
inline bool is_children(fuse_ino_t i) { return kind_of(i) == kChildren; }
inline bool is_child_link(fuse_ino_t i) { return kind_of(i) == kChildLink; }
inline uint64_t folder_of(fuse_ino_t i) { return (i & kNumMask) >> 3; }

// A branch's entry in layers/ (and children/): its name, or, for a name
// no directory entry can hold (empty, ".", "..", a '/'; only old images
// have them, format.md#control-folder), the alias "=ID", which no valid
// name can be (the name rule refuses '='), so that it can still be listed,
// renamed and removed.
inline std::string entry_name(const BranchMeta& b) {
  if (b.name.empty() || b.name == "." || b.name == ".." || b.name.find_first_of(std::string_view("/\0", 2)) != std::string::npos)
    return "=" + std::to_string(b.tree.v);
  return b.name;
}

// A link of children/: to the child's folder.
inline std::string child_target(std::string_view name) { return "../../" + std::string(name); }

// Names and numbers here change under the kernel's feet (another view,
// plyctl on the mount): nothing is cached (format.md#control-folder).
inline constexpr double kTimeout = 0.0;

}  // namespace plyfs::ctl
