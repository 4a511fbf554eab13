// The control channel's client (mount_client.h, fuse/control.h).
#include "mount_client.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "control.h"

namespace plyfs::ctl {

// Sends one request over a mount's control channel (fuse/control.h).
Result<std::string> control(const std::string& mnt, const std::string& request) {
  int fd = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Error::io(errno, "cannot open " + mnt);
  ControlMsg m{};
  m.version = kControlVersion;
  std::snprintf(m.request, sizeof m.request, "%s", request.c_str());
  const int r = ::ioctl(fd, kControlIoctl, &m);
  const int e = errno;
  ::close(fd);
  if (r != 0) {
    if (e == ENOTTY || e == ENOSYS || e == EINVAL)
      return Error::io(e, mnt + " is not the mount point of a plyfs mount");
    return Error::io(e, mnt + ": " + std::strerror(e));
  }
  m.answer[sizeof m.answer - 1] = 0;
  if (m.status) return Error::io(m.status, m.answer);
  return std::string(m.answer);
}

}  // namespace plyfs::ctl
