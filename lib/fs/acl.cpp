// POSIX ACL inheritance (acl.h), following posix_acl_create_masq() in the
// kernel's fs/posix_acl.c.
#include "fs/acl.h"

#include <cstring>

#include "util/endian.h"

namespace plyfs {
namespace {

constexpr uint32_t kAclVersion = 2;
enum : uint16_t {
  kUserObj = 0x01, kUser = 0x02, kGroupObj = 0x04, kGroup = 0x08, kMask = 0x10, kOther = 0x20,
};

struct Entry {
  le16 tag;
  le16 perm;
  le32 id;
};
static_assert(sizeof(Entry) == 8);

}  // namespace

Result<InheritedAcl> inherit_acl(std::span<const std::byte> parent_default, bool is_dir,
                                 uint32_t& mode) {
  if (parent_default.size() < 4 || (parent_default.size() - 4) % sizeof(Entry) ||
      view_as<le32>(parent_default)->get() != kAclVersion)
    return Error::invalid("malformed default ACL");
  std::vector<std::byte> acl(parent_default.begin(), parent_default.end());
  const size_t n = (acl.size() - 4) / sizeof(Entry);
  Entry* group_obj = nullptr;
  Entry* mask = nullptr;
  bool extended = false;  // entries beyond owner, group and other
  uint32_t m = mode;
  for (size_t i = 0; i < n; i++) {
    auto* e = view_as<Entry>(std::span(acl), 4 + i * sizeof(Entry));
    const uint16_t perm = e->perm.get();
    switch (e->tag.get()) {
      case kUserObj:
        e->perm.set(uint16_t(perm & ((m >> 6) & 7)));
        m &= (uint32_t(e->perm.get()) << 6) | ~0700u;
        break;
      case kUser:
      case kGroup:
        extended = true;
        break;
      case kGroupObj:
        group_obj = e;
        break;
      case kOther:
        e->perm.set(uint16_t(perm & (m & 7)));
        m &= uint32_t(e->perm.get()) | ~07u;
        break;
      case kMask:
        mask = e;
        extended = true;
        break;
      default:
        return Error::invalid("malformed default ACL");
    }
  }
  Entry* g = mask ? mask : group_obj;
  if (!g) return Error::invalid("default ACL without a group entry");
  g->perm.set(uint16_t(g->perm.get() & ((m >> 3) & 7)));
  m &= (uint32_t(g->perm.get()) << 3) | ~070u;
  mode = m;
  InheritedAcl out;
  if (extended) out.access = std::move(acl);
  if (is_dir) out.dflt.assign(parent_default.begin(), parent_default.end());
  return out;
}

}  // namespace plyfs
