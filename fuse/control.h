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
//   snapshot [SNAP], merge NAME, rollback NAME, clone SRC NAME [ro],
//   delete NAME             the branch lifecycle (snap.h, plyctl.8)
// Changes need root or the mount's owner; each one is atomic for the user
// and lasts until unmount (plyctl view create saves a stack).
//
// A diff is larger than an answer (and a FUSE ioctl cannot pass more than
// 16 KiB), so it is paged, with text requests as the rest:
//   diff FROM TO [json]     "TOKEN SIZE": the daemon computes the whole diff
//                           of a durable generation (it commits first) and
//                           keeps its text, as plyctl prints it, under TOKEN
//   read TOKEN OFFSET       the next at most 3063 bytes from OFFSET; the read
//                           that reaches the end frees the text
//   close TOKEN             frees it before the end
// (An empty diff, "TOKEN 0", is not kept: there is nothing to read.)
// At most 4 texts of at most 256 MiB in all wait: a new diff pushes the
// oldest out (its reads then fail with ENOENT), so a client that dies
// leaks nothing for long. Only root or the mount's owner may run them: a
// diff names files in directories the caller may not be allowed to list.
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
