// What a received branch must hold item for item (fs/send.h,
// format.md#send-stream), shared by the send tests and the crash
// workloads: a tree's items with what is the image's own taken out (the
// disk addresses of extents and, for plain ones, where in their space
// extent they start) and FsInfo but for the fields a stream carries.
#pragma once

#include <map>
#include <vector>

#include "fs/items.h"

namespace plyfs::test {

inline Result<std::map<Key, std::vector<std::byte>>> received_items(Volume& v, TreeId tree) {
  std::map<Key, std::vector<std::byte>> out;
  auto t = PLY_TRY(v.begin());
  PLY_CHECK(t.scan(tree, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> val) {
    std::vector<std::byte> x(val.begin(), val.end());
    if (k == Key{0, 0}) {
      disk::FsInfo fi{};
      if (fsitems::decode_info(val, fi)) {
        disk::FsInfo keep{};
        keep.root_ino = fi.root_ino;
        keep.created_ns = fi.created_ns;
        keep.compress = fi.compress;
        keep.compress_level = fi.compress_level;
        x.assign(reinterpret_cast<std::byte*>(&keep), reinterpret_cast<std::byte*>(&keep) + sizeof keep);
      }
    } else if (k.hi && fsitems::type_of(k) == disk::ItemType::Extent) {
      if (auto e = fsitems::decode_extent(k, val)) {
        e->disk_start = 0;
        if (!e->compressed()) {
          e->disk_nblocks = 0;
          e->offset = 0;
        }
        x = fsitems::encode_extent(*e);
      }
    }
    out.emplace(k, std::move(x));
    return true;
  }));
  return out;
}

}  // namespace plyfs::test
