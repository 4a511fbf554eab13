// POSIX ACL inheritance for new inodes (format.md#fs-xattr).
//
// ACLs are stored as the kernel hands them over: the xattrs
// system.posix_acl_access and system.posix_acl_default in the kernel's
// encoding (a le32 version 2, then 8-byte entries: le16 tag, le16 perm,
// le32 id). The kernel checks access with them (FUSE_CAP_POSIX_ACL); the
// filesystem's one job is inheritance when it creates an inode under a
// directory with a default ACL, as posix_acl_create() does in the kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "util/result.h"

namespace plyfs {

inline constexpr const char* kAclAccess = "system.posix_acl_access";
inline constexpr const char* kAclDefault = "system.posix_acl_default";

struct InheritedAcl {
  std::vector<std::byte> access;  // empty: the mode says it all
  std::vector<std::byte> dflt;    // a new directory's default ACL, else empty
};

// `parent_default` is the parent's default ACL; `mode` the requested mode
// (type and permission bits), narrowed in place by the ACL (the umask does
// not apply when a default ACL exists). EINVAL for a malformed ACL.
Result<InheritedAcl> inherit_acl(std::span<const std::byte> parent_default, bool is_dir,
                                 uint32_t& mode);

}  // namespace plyfs
