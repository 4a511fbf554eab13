// plyctl's end of a mount's control channel (fuse/control.h): JSON requests,
// answers paged in, and the refusals explained (a directory that is no
// plyfs mount, a daemon of another protocol version).
#pragma once

#include <optional>
#include <string>

#include "snap/model.h"
#include "util/progress.h"

namespace plyfs::ctl {

// Sends `request` to the daemon serving mount point `mnt` and returns the
// result object of its answer (an answer paged out is read whole first;
// `progress`, if given, counts its bytes, and is finished once it has them
// all). The daemon's refusal comes back as its errno and reason.
// With `work`, the progress line the same command draws offline, when it
// is shown (a terminal), another thread asks the daemon how far it is (the
// "progress" command, control.h) about 5 times a second while it works on
// the request, and draws it from what the daemon says of this command; the
// line is finished if the request succeeded and the daemon said something.
// A daemon that does not know the command (an older one) is not asked
// again; the request goes on as without.
Result<model::Json> request(const std::string& mnt, const model::Json& req, Progress* progress = nullptr,
                            Progress* work = nullptr);

// The mount point of the plyfs mount serving `image` (an image file or a
// block device) in this mount namespace, from /proc/self/mountinfo: each
// fuse.plyfs mount's source (the image as plyfs was given it) is stat'ed
// and compared with `image` by device and inode (by device number for a
// block device), so that any path to the same file matches. nullopt when
// no such mount is visible here.
std::optional<std::string> mount_of(const std::string& image);

// Flushes what the kernel holds for the mount (syncfs), so that a snapshot
// or diff of the daemon sees every write made before the command.
void sync_mount(const std::string& mnt);
// The same, with its error (an EIO of the writeback): plyctl sync.
Result<void> syncfs_mount(const std::string& mnt);

}  // namespace plyfs::ctl
