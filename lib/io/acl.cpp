// POSIX ACLs between the kernel's xattr encoding and a list of entries
// (source.h): a le32 version 2, then 8-byte entries, le16 tag, le16 perm,
// le32 id (lib/fs/acl.h).
#include <algorithm>

#include "io/source.h"

namespace plyfs::io {

namespace {
constexpr uint32_t kAclVersion = 2;
}

std::vector<std::byte> encode_acl(std::vector<AclEntry> entries) {
  std::sort(entries.begin(), entries.end(), [](const AclEntry& a, const AclEntry& b) {
    return a.tag != b.tag ? a.tag < b.tag : a.id < b.id;
  });
  std::vector<std::byte> out(4 + 8 * entries.size());
  auto put = [&](size_t at, uint64_t v, int n) {
    for (int i = 0; i < n; i++) out[at + size_t(i)] = std::byte(v >> (8 * i));
  };
  put(0, kAclVersion, 4);
  for (size_t i = 0; i < entries.size(); i++) {
    put(4 + 8 * i, entries[i].tag, 2);
    put(6 + 8 * i, entries[i].perm, 2);
    put(8 + 8 * i, entries[i].id, 4);
  }
  return out;
}

Result<std::vector<AclEntry>> decode_acl(std::span<const std::byte> x) {
  auto get = [&](size_t at, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= uint64_t(x[at + size_t(i)]) << (8 * i);
    return v;
  };
  if (x.size() < 4 || (x.size() - 4) % 8 || get(0, 4) != kAclVersion)
    return Error::invalid("a POSIX ACL xattr that is not in the kernel's encoding");
  std::vector<AclEntry> out;
  for (size_t at = 4; at < x.size(); at += 8)
    out.push_back({uint16_t(get(at, 2)), uint16_t(get(at + 2, 2)), uint32_t(get(at + 4, 4))});
  return out;
}

}  // namespace plyfs::io
