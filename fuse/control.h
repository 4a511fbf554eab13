// The control channel of a mounted plyfs (format.md#control-channel): an
// ioctl on the mount point's root directory, which FUSE forwards to the
// daemon with the caller's uid, so that no socket or path has to be found
// and secured. plyctl uses it for the commands on a mount point (plyctl.8).
//
// Version 2. The request is one JSON object, {"command": C, ...}; names go
// as the JSON model carries them (snap/model.h, M1: "branch" and, for bytes
// that are not UTF-8, "branch_bytes"), so any name passes, spaces included:
//   {"command": "list"}                                   the stack
//   {"command": "add", "branch": B, "position": P, "writable": W[, "save": V]}
//   {"command": "remove", "branch": B[, "save": V]}
//   {"command": "set", "branch": B, "writable": W[, "save": V]}
//   {"command": "move", "branch": B, "position": P[, "save": V]}
//   {"command": "snapshot"[, "name": S]}, {"command": "merge", "branch": B},
//   {"command": "rollback", "branch": B}, {"command": "delete", "branch": B},
//   {"command": "clone", "source": B, "name": S, "writable": W},
//   {"command": "diff", "from": B, "to": B}
//   {"command": "read", "token": T, "offset": O}, {"command": "close", "token": T}
//   {"command": "progress"}
//   {"command": "show"}, {"command": "branches"}, {"command": "views"},
//   {"command": "default"}                 the image's, as offline (below)
//   {"command": "view-create", "name": N, "stack": S, "default": D},
//   {"command": "view-delete", "name": N}, {"command": "view-default", "name": N}
//   {"command": "sync"}
//   {"command": "hold"|"release", "branches": [{"branch": B}...]}
//   {"command": "quota", "branch": B[, "referenced": N][, "exclusive": N]}
//   {"command": "send", "branch": B[, "parent": B][, "zstd": L], "fd": N[, "output": O]}
//   {"command": "receive", "fd": N[, "name": S]}
// (send and receive: N is the caller's descriptor of the stream, which the
// daemon takes by the caller's pid, fuse/stream.cpp; O only names it in the
// answer, a Send or Receive object.)
// (B: a branch's name, or its id as a number.) The answer, with status 0,
// is {"result": X}, X being exactly the object plyctl prints offline for
// the same command (the stack: an array of StackEntry; a snapshot: a
// Snapshot; ...); with status an errno, {"error": "REASON"}. An answer
// longer than the answer field (a diff, a long stack) is {"paged":
// {"token": T, "size": N}}: the daemon keeps its text, `read` returns the
// raw bytes from O on (at most sizeof answer - 1), the read that reaches the
// end frees it, `close` frees it early. At most 4 texts of at most 256 MiB
// in all wait: a new one pushes out the oldest (its reads then fail with
// ENOENT), so a client that dies leaks nothing for long; the token (128
// random bits) is what lets a client read it.
//
// `progress` is answered at once, without ctl_mu, which a merge, delete,
// rollback or diff holds while it runs (fuse/daemon.h RunningOp):
// {"result": {"running": false}}, or {"result": {"running": true, "command":
// C, "what": W, "done": N, "unit": U, "fraction": F}}: the request running
// (or "clean", the cleaner dropping what a merge or rollback replaced), its
// progress line's text ("merging work"), its count so far of U ("entries",
// "nodes", "changes") and the share of the work done, 0 to 1 (snap.h's
// MergeStats, DiffStats, BTree::DropStats). plyctl asks for it from a second
// thread while its request runs (ctl/mount_client.h). It came after version
// 2 without a new version: a daemon without it refuses it alone (EINVAL,
// unknown command), which plyctl takes as no progress to show.
//
// The image's own commands (issue 24), so that plyctl never reads the
// blocks of a mounted image (the daemon reuses freed blocks after each
// commit): `show` commits and answers the Image object of that durable
// generation, `branches` [Branch], `views` [View], `default` the Stack a
// mount without -o view= shows, `view-*` the View created, deleted or made
// the default (S: the stack as plyctl view create takes it, "top=rw:base",
// carried as a name; each one durable generation), and `sync` commits and
// answers {"generation": G}, the durable generation. "save": true on a
// stack change also writes the new stack into the view the mount shows
// (-o view=, or the default view at mount time), ENOENT if it has none.
// Daemons before these refuse them alone (EINVAL, unknown command).
//
// Changes need root or the mount's owner, and so does a diff (it names files
// in directories the caller may not be allowed to list); `list`, `read`,
// `close`, `progress`, `show`, `branches`, `views`, `default` and `sync`
// (as sync(2)) are anyone's. Each change is atomic for the user and lasts until
// unmount (plyctl view create saves a stack).
//
// Versions. ControlMsg keeps version 1's size, ioctl number and the offsets
// of `status` and `version`, so that either side reads the other's version:
// a daemon answers a client of another version with status EPROTO and a
// message naming both versions (as text, which version 1's plyctl prints),
// and a version 1 daemon refuses this client's ioctl with EPROTO, which
// plyctl explains.
#pragma once

#include <linux/ioctl.h>
#include <stddef.h>
#include <stdint.h>

namespace plyfs {

struct ControlMsg {
  char request[1024];  // NUL-terminated JSON
  char answer[3064];   // NUL-terminated: JSON, or a read's slice of JSON text
  int32_t status;      // 0, or the errno of the failure
  uint32_t version;    // kControlVersion
};
static_assert(sizeof(ControlMsg) == 4096);
static_assert(offsetof(ControlMsg, status) == 4088 && offsetof(ControlMsg, version) == 4092);

inline constexpr uint32_t kControlVersion = 2;
// 0xB7 is not in the kernel's ioctl-number registry for file systems.
inline constexpr unsigned long kControlIoctl = _IOWR(0xB7, 1, ControlMsg);

}  // namespace plyfs
