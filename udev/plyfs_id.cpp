// plyfs_id: tells udev that a block device holds a plyfs filesystem.
//
// 64-plyfs.rules runs it, through IMPORT{program}, for a block device in
// which libblkid found nothing (a libblkid without the prober of
// contrib/libblkid/). It prints the variables that udev's own blkid builtin
// would: ID_FS_TYPE, ID_FS_USAGE, ID_FS_VERSION, ID_FS_UUID(_ENC) and
// ID_FS_LABEL(_ENC). The rule then makes the /dev/disk/by-uuid and by-label
// links from them, which libblkid's tag lookup (UUID=, LABEL= in fstab,
// findfs, mount) reads.
//
// Promises (tests/packaging/udev.sh):
//   I1 the superblock is the one a mount would use: read_superblocks picks the
//      valid slot with the newest generation (format.md#recovery), so a label
//      or UUID from a torn or stale copy is never exported;
//   I2 anything that is not a readable plyfs filesystem (another filesystem,
//      garbage, a damaged or unsupported plyfs superblock pair, an empty
//      loop device) prints nothing and exits 1: udev then imports nothing;
//   I3 the device is only read: opened read-only and without the plyfs lock,
//      so that a mounted image (whose daemon holds the lock) keeps its links;
//   I4 values are encoded as udev encodes them: blkid_safe_string for the plain
//      value, blkid_encode_string for _ENC (the names of the links).
#include <blkid/blkid.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <string>

#include "blockdev/blockdev.h"
#include "commit/devices.h"
#include "commit/superblock.h"

namespace {

constexpr int kFound = 0, kNotPlyfs = 1, kUsage = 2;

// A value as udev's blkid builtin sets it: blkid_safe_string gives the plain
// form (whitespace runs become one '_', control bytes '_'), and
// blkid_encode_string the _ENC form (bytes outside [A-Za-z0-9#+-.:=@_] and
// invalid UTF-8 as \xNN). Each fits in four times its length plus one.
std::string safe(const std::string& v) {
  std::string out(v.size() * 4 + 1, '\0');
  if (blkid_safe_string(v.c_str(), out.data(), out.size()) != 0) return {};
  out.resize(std::strlen(out.c_str()));
  return out;
}
std::string encoded(const std::string& v) {
  std::string out(v.size() * 4 + 1, '\0');
  if (blkid_encode_string(v.c_str(), out.data(), out.size()) != 0) return {};
  out.resize(std::strlen(out.c_str()));
  return out;
}

void usage(FILE* out) {
  std::fprintf(out,
               "Usage: plyfs_id DEVICE|IMAGE\n"
               "Print the udev variables of a plyfs filesystem (ID_FS_TYPE, UUID, LABEL...).\n"
               "Exits 1, printing nothing, if DEVICE holds no valid plyfs filesystem.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0)) {
    usage(stdout);
    return 0;
  }
  if (argc != 2 || argv[1][0] == '-') {
    usage(stderr);
    return kUsage;
  }
  plyfs::FileOpenOptions opts;
  opts.read_only = true;
  opts.lock = false;  // I3
  auto dev = plyfs::FileDevice::open(argv[1], opts);
  if (!dev) return kNotPlyfs;
  // A device of a multi-device volume (format.md#device-label): its label
  // names the volume, its newest superblock the rest; ID_FS_UUID_SUB is the
  // device's own uuid, as btrfs's members have.
  plyfs::SuperInfo s;
  std::string sub;
  auto label_of = plyfs::read_device_label(**dev);
  if (!label_of) return kNotPlyfs;  // I2: a damaged label
  if (*label_of) {
    auto m = plyfs::member_superblock(**dev);
    if (!m || m->uuid != (*label_of)->volume_uuid) return kNotPlyfs;
    s = *m;
    sub = plyfs::uuid_text((*label_of)->device_uuid);
  } else {
    auto choice = plyfs::read_superblocks(**dev);  // I1
    if (!choice) return kNotPlyfs;                 // I2
    s = choice->info;
  }

  std::string out = "ID_FS_TYPE=plyfs\nID_FS_USAGE=filesystem\n";
  out += "ID_FS_VERSION=" + std::to_string(s.version_major) + "." +
         std::to_string(s.version_minor) + "\n";
  // libblkid sets no UUID for an all-zero one, nor a LABEL for an empty one.
  bool nil = true;
  for (uint8_t b : s.uuid) nil = nil && b == 0;
  if (!nil) {
    const std::string uuid = plyfs::uuid_text(s.uuid);
    out += "ID_FS_UUID=" + safe(uuid) + "\n";
    out += "ID_FS_UUID_ENC=" + encoded(uuid) + "\n";
  }
  if (!sub.empty()) out += "ID_FS_UUID_SUB=" + safe(sub) + "\nID_FS_UUID_SUB_ENC=" + encoded(sub) + "\n";
  // libblkid trims trailing whitespace off a label (blkid_probe_set_label).
  std::string label = s.label;
  while (!label.empty() && std::isspace(static_cast<unsigned char>(label.back()))) label.pop_back();
  if (!label.empty()) {
    out += "ID_FS_LABEL=" + safe(label) + "\n";
    out += "ID_FS_LABEL_ENC=" + encoded(label) + "\n";
  }
  std::fputs(out.c_str(), stdout);
  return std::fflush(stdout) == 0 ? kFound : kNotPlyfs;
}
