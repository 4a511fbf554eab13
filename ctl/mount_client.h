// plyctl's end of a mount's control channel (fuse/control.h): JSON requests,
// answers paged in, and the refusals explained (a directory that is no
// plyfs mount, a daemon of another protocol version).
#pragma once

#include <string>

#include "snap/model.h"
#include "util/progress.h"

namespace plyfs::ctl {

// Sends `request` to the daemon serving mount point `mnt` and returns the
// result object of its answer (an answer paged out is read whole first;
// `progress`, if given, counts its bytes). The daemon's refusal comes back
// as its errno and reason.
Result<model::Json> request(const std::string& mnt, const model::Json& req, Progress* progress = nullptr);

// Flushes what the kernel holds for the mount (syncfs), so that a snapshot
// or diff of the daemon sees every write made before the command.
void sync_mount(const std::string& mnt);

}  // namespace plyfs::ctl
