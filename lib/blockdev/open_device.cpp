#include "blockdev/blockdev.h"

#ifdef PLYFS_HAVE_NBD
#include "blockdev/nbd_device.h"
#endif

namespace plyfs {

bool is_nbd_uri(std::string_view s) {
  return s.starts_with("nbd://") || s.starts_with("nbds://") || s.starts_with("nbd+unix://") ||
         s.starts_with("nbds+unix://");
}

Result<std::unique_ptr<BlockDevice>> open_device(const std::string& path_or_uri,
                                                 FileOpenOptions opts) {
  if (is_nbd_uri(path_or_uri)) {
#ifdef PLYFS_HAVE_NBD
    return std::unique_ptr<BlockDevice>(PLY_TRY(NbdDevice::open(path_or_uri, opts.read_only)));
#else
    return Error::io(EOPNOTSUPP, path_or_uri + ": this build has no NBD support (meson -Dnbd=enabled, libnbd-dev)");
#endif
  }
  return std::unique_ptr<BlockDevice>(PLY_TRY(FileDevice::open(path_or_uri, opts)));
}

}  // namespace plyfs
