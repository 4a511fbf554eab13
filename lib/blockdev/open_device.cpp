#include "blockdev/blockdev.h"

#include "util/mountinfo.h"

#include <sys/stat.h>

#include <cstdlib>
#include <optional>
#include <vector>

#ifdef PLYFS_HAVE_NBD
#include "blockdev/nbd_device.h"
#include "blockdev/read_cache.h"
#endif

namespace plyfs {

bool is_nbd_uri(std::string_view s) {
  return s.starts_with("nbd://") || s.starts_with("nbds://") || s.starts_with("nbd+unix://") ||
         s.starts_with("nbds+unix://");
}

std::string device_display_name(const std::string& p) {
  if (is_nbd_uri(p)) return p;
  std::string out = p;
  if (char* rp = ::realpath(p.c_str(), nullptr)) out = rp, ::free(rp);
  return out;
}

std::string device_identity(const std::string& p) {
  struct stat st{};
  if (is_nbd_uri(p)) return "name:" + p;
  if (::stat(p.c_str(), &st) != 0) {
    // Not there yet (mkfs.plyfs -s creates it): the directory it would be
    // made in and its name, so that new.img and ./new.img are one file.
    const size_t slash = p.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : p.substr(0, slash);
    const std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
    if (base.empty() || ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return "name:" + p;
    return "new:" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + "/" + base;
  }
  if (S_ISBLK(st.st_mode)) return "bdev:" + std::to_string(st.st_rdev);
  return "file:" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

namespace {

// The mount point of a plyfs mount here whose source is `uri`, spelled the
// same: what the lock of an image file finds for a file.
std::optional<std::string> plyfs_mount_of(const std::string& uri) {
  for (const MountEntry& m : read_mountinfo())
    if (m.fstype == "fuse.plyfs" && m.source == uri) return m.mountpoint;
  return std::nullopt;
}

}  // namespace

Result<std::unique_ptr<BlockDevice>> open_device(const std::string& path_or_uri,
                                                 FileOpenOptions opts) {
  if (is_nbd_uri(path_or_uri)) {
#ifdef PLYFS_HAVE_NBD
    // NBD has no lock: a plyfs mount of the same URI here stands in for it
    // (a second writer elsewhere is the server's to refuse).
    if (opts.lock)
      if (auto mnt = plyfs_mount_of(path_or_uri))
        return Error::io(EBUSY, path_or_uri + " is mounted at " + *mnt);
    std::unique_ptr<BlockDevice> dev = PLY_TRY(NbdDevice::open(path_or_uri, opts.read_only));
    if (opts.nbd_cache_bytes >= ReadCacheDevice::kLine)
      dev = std::make_unique<ReadCacheDevice>(std::move(dev), opts.nbd_cache_bytes);
    return dev;
#else
    return Error::io(EOPNOTSUPP, path_or_uri + ": this build has no NBD support (meson -Dnbd=enabled, libnbd-dev)");
#endif
  }
  return std::unique_ptr<BlockDevice>(PLY_TRY(FileDevice::open(path_or_uri, opts)));
}

}  // namespace plyfs
