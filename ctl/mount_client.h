// plyctl's end of a mount's control channel (fuse/control.h).
#pragma once

#include <string>

#include "util/result.h"

namespace plyfs::ctl {

// Sends one request over a mount's control channel; the daemon's answer.
Result<std::string> control(const std::string& mnt, const std::string& request);

}  // namespace plyfs::ctl
