// The control channel of a mounted plyfs: an ioctl on the mount point's root
// directory, which FUSE forwards to the daemon with the caller's uid, so that
// no socket or path has to be found and secured. plyctl uses it for the
// branch commands on a mount point (plyctl.8, format.md#fs-union "Live
// branch changes").
//
// The request and the answer are text, so that the struct never changes:
//   list                    the stack, "NAME=rw:NAME=ro:..." left to right
//   add NAME POS rw|ro      put branch NAME at position POS (0: leftmost)
//   remove NAME             take NAME out of the stack (its data stays)
//   set NAME rw|ro          switch NAME between read-write and read-only
//   move NAME POS           move NAME to position POS
// Changes need root or the mount's owner; each one is atomic for the user
// and lasts until unmount (plyctl view create saves a stack).
#pragma once

#include <linux/ioctl.h>
#include <stdint.h>

namespace plyfs {

struct ControlMsg {
  char request[1024];  // NUL-terminated
  char answer[3064];   // NUL-terminated: the stack after the command, or an error
  int32_t status;      // 0, or the errno of the failure
  uint32_t version;    // kControlVersion
};
static_assert(sizeof(ControlMsg) == 4096);

inline constexpr uint32_t kControlVersion = 1;
// 0xB7 is not in the kernel's ioctl-number registry for file systems.
inline constexpr unsigned long kControlIoctl = _IOWR(0xB7, 1, ControlMsg);

}  // namespace plyfs
