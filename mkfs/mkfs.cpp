// mkfs.plyfs: writes an empty plyfs filesystem to a block device or an image
// file, following mkfs(8) conventions (mkfs -t plyfs finds it in /sbin).
//
// Promises the tests check (tests/mkfs/):
//   M1 nothing is written, created or wiped before every option has been
//      validated, and nothing at all with -n (Volume::plan does the checks);
//   M2 without -f, a device or file that holds a filesystem or partition table
//      libblkid knows, or a plyfs superblock, is left untouched;
//   M3 a mounted or busy block device is refused before any probe or wipe:
//      FileDevice opens it with O_EXCL, which also keeps it from being
//      mounted while we write;
//   M4 success means both superblocks are durable (Volume::format flushes).
// On an NBD export (an nbd:// or nbd+unix:// URI), M2 covers plyfs
// superblocks only (libblkid probes files, not URIs) and M3 is the NBD
// server's business: it must not serve the export to a second writer.
#include <blkid/blkid.h>
#include <fcntl.h>
#include <getopt.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uuid/uuid.h>

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <cstring>
#include <libgen.h>
#include <optional>
#include <string>
#include <utility>

#include "blockdev/blockdev.h"
#include "blockdev/device_set.h"
#include "commit/devices.h"
#include "commit/disk_superblock.h"
#include "blockdev/test_devices.h"
#include "commit/superblock.h"
#include "commit/volume.h"
#include "fs/fs.h"
#include "io/io.h"
#include "util/parse.h"
#include "util/progress.h"

#ifndef PLYFS_VERSION
#define PLYFS_VERSION "unknown"
#endif

namespace plyfs {
namespace {

constexpr const char* kProg = "mkfs.plyfs";

// The command line as typed; values are checked in resolve().
struct Args {
  bool force = false, dry_run = false, quiet = false, help = false, version = false, nodiscard = false;
  std::string label, path, root_dir;
  std::optional<std::string> uuid, block_size, size;  // empty when not given
  std::vector<std::string> paths;        // every DEVICE given; path is the first
  std::vector<std::string> class_args;   // --class NAME=DEVICE, in order
  std::string metadata_class;            // --metadata CLASS
};

struct Options {
  bool force = false, dry_run = false, quiet = false, discard = true;
  FormatOptions format;  // size_bytes 0: the whole device or existing file
  std::string path;
  std::string root_dir;  // -d: the first branch holds this directory's tree
  // Several devices (format.md#multi-device): each path with its class.
  std::vector<std::string> paths;
  std::vector<uint8_t> path_class;
};

void usage(FILE* out) {
  std::fprintf(out,
               "Usage: %s [options] DEVICE|IMAGE [DEVICE|IMAGE...]\n"
               "Create a plyfs filesystem on a block device or an image file, or one\n"
               "volume across several of them.\n\n"
               "Options:\n"
               "  -C, --class NAME=DEVICE\n"
               "                the device's class (several devices); classes are\n"
               "                named fastest first; a device without one is 'default'\n"
               "  -M, --metadata CLASS\n"
               "                the class metadata goes to (default: the fastest)\n"
               "  -f            overwrite an existing filesystem or partition table\n"
               "  -L LABEL      volume label (at most 64 bytes)\n"
               "  -U UUID       filesystem UUID, or 'random' (the default)\n"
               "  -b SIZE       block size, a power of two from 4096 to 65536 (default 4096)\n"
               "  -s SIZE       filesystem size (each device's, with several); creates or\n"
               "                extends an image file\n"
               "  -K            do not discard the device's blocks first\n"
               "  -d DIR        the first branch holds DIR's tree (as mke2fs -d)\n"
               "  -n            show what would be done; write nothing\n"
               "  -q            quiet: print nothing on success\n"
               "  -V            print the version and exit\n"
               "  -h            print this help and exit\n\n"
               "SIZE is in bytes, or with a unit: K, M, G, T, P, E (or KiB, MiB...) are\n"
               "powers of 1024, KB, MB, GB... powers of 1000, in any case (1g, 1.5GiB).\n",
               kProg);
}

Result<Args> parse_args(int argc, char** argv) {
  Args a;
  opterr = 0;  // our own messages, so that each starts with "mkfs.plyfs: "
  static const option kLong[] = {
      {"help", no_argument, nullptr, 'h'}, {"version", no_argument, nullptr, 'V'},
      {"class", required_argument, nullptr, 'C'}, {"metadata", required_argument, nullptr, 'M'}, {}};
  for (int c; (c = getopt_long(argc, argv, ":fL:U:b:s:d:KnqVhC:M:", kLong, nullptr)) != -1;) {
    switch (c) {
      case 'C': a.class_args.push_back(optarg); break;
      case 'M': a.metadata_class = optarg; break;
      case 'f': a.force = true; break;
      case 'L': a.label = optarg; break;
      case 'U': a.uuid = optarg; break;
      case 'b': a.block_size = optarg; break;
      case 's': a.size = optarg; break;
      case 'K': a.nodiscard = true; break;
      case 'd': a.root_dir = optarg; break;
      case 'n': a.dry_run = true; break;
      case 'q': a.quiet = true; break;
      case 'V': a.version = true; break;
      case 'h': a.help = true; break;
      case ':': return Error::invalid(std::string("option -") + char(optopt) + " needs a value");
      default:
        if (optopt == 0) return Error::invalid(std::string("unknown option ") + argv[optind - 1]);
        return Error::invalid(std::string("unknown option -") + char(optopt));
    }
  }
  if (a.help || a.version) return a;
  for (int i = optind; i < argc; i++) a.paths.push_back(argv[i]);
  if (a.paths.empty() && a.class_args.empty()) return Error::invalid("no device or image file given");
  return a;
}

Result<std::array<uint8_t, 16>> parse_uuid(const std::string& s) {
  std::array<uint8_t, 16> out{};  // all zero: the library picks a random one
  if (s == "random") return out;
  if (uuid_parse(s.c_str(), out.data()) != 0)
    return Error::invalid("invalid UUID '" + s +
                          "' (expected xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx or 'random')");
  if (uuid_is_null(out.data())) return Error::invalid("the nil UUID cannot name a filesystem");
  return out;
}

Result<Options> resolve(const Args& a) {
  Options o;
  o.force = a.force;
  o.dry_run = a.dry_run;
  o.quiet = a.quiet;
  o.discard = !a.nodiscard;
  // Devices: the positional ones in order, then those only --class names.
  std::vector<std::pair<std::string, std::string>> named;  // device, class
  for (const auto& c : a.class_args) {
    const size_t eq = c.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == c.size())
      return Error::invalid("--class " + c + ": expected NAME=DEVICE");
    const std::string name = c.substr(0, eq), dev = c.substr(eq + 1);
    if (name.size() > 15 || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos)
      return Error::invalid("--class " + c + ": a class name is 1 to 15 of a-z, 0-9, _ and -");
    for (const auto& [d, n] : named)
      if (device_identity(d) == device_identity(dev))
        return Error::invalid("--class: " + dev + " is given a class twice");
    named.emplace_back(dev, name);
    if (std::find(o.format.classes.begin(), o.format.classes.end(), name) == o.format.classes.end())
      o.format.classes.push_back(name);
  }
  // One device by two names (a.img and ./a.img, a symlink, a second node
  // of a block device) is one device given twice.
  o.paths = a.paths;
  auto same = [](const std::string& x, const std::string& y) { return device_identity(x) == device_identity(y); };
  for (const auto& [d, n] : named)
    if (std::none_of(o.paths.begin(), o.paths.end(), [&](const std::string& p) { return same(p, d); }))
      o.paths.push_back(d);
  for (size_t i = 0; i < o.paths.size(); i++)
    for (size_t j = 0; j < i; j++)
      if (same(o.paths[i], o.paths[j]))
        return Error::invalid(o.paths[i] == o.paths[j] ? o.paths[i] + " is given twice"
                                                       : o.paths[i] + " and " + o.paths[j] + " are the same device");
  if (o.paths.size() > 1 || !named.empty()) {
    if (o.paths.size() > disk::kMaxDevices)
      return Error::invalid("a volume has at most " + std::to_string(disk::kMaxDevices) + " devices");
    for (const auto& p : o.paths) {
      auto it = std::find_if(named.begin(), named.end(), [&](const auto& n) { return same(n.first, p); });
      const std::string cls = it == named.end() ? "default" : it->second;
      auto ci = std::find(o.format.classes.begin(), o.format.classes.end(), cls);
      if (ci == o.format.classes.end()) ci = o.format.classes.insert(o.format.classes.end(), cls);
      o.path_class.push_back(static_cast<uint8_t>(ci - o.format.classes.begin()));
    }
    if (o.format.classes.size() > disk::kMaxClasses)
      return Error::invalid("a volume has at most " + std::to_string(disk::kMaxClasses) + " classes");
    if (!a.metadata_class.empty()) {
      auto ci = std::find(o.format.classes.begin(), o.format.classes.end(), a.metadata_class);
      if (ci == o.format.classes.end())
        return Error::invalid("--metadata " + a.metadata_class + ": no device has that class");
      o.format.meta_class = static_cast<uint32_t>(ci - o.format.classes.begin());
    }
  } else if (!a.metadata_class.empty()) {
    return Error::invalid("--metadata needs several devices");
  }
  o.path = o.paths[0];
  o.format.label = a.label;
  o.root_dir = a.root_dir;
  struct stat st {};
  if (!o.root_dir.empty() && (::stat(o.root_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)))
    return Error::invalid("-d " + o.root_dir + ": not a directory");
  if (a.uuid) o.format.uuid = PLY_TRY(parse_uuid(*a.uuid));
  // One size rule for every tool (util/parse.h, util-linux's units).
  if (a.size) {
    o.format.size_bytes = PLY_TRY(parse_size(*a.size, "size"));
    // 0 would mean the whole device to the library.
    if (o.format.size_bytes == 0) return Error::invalid("invalid size '" + *a.size + "': must be greater than zero");
  }
  if (a.block_size) {
    const uint64_t bs = PLY_TRY(parse_size(*a.block_size, "block size"));
    if (bs > UINT32_MAX) return Error::invalid("invalid block size '" + *a.block_size + "': too large");
    o.format.block_size = static_cast<uint32_t>(bs);  // the library checks the range
  }
  return o;
}

// ---------------------------------------------------------------- output

std::string human_bytes(uint64_t n) {  // "64.00 MiB"; a filesystem is at least 1 MiB
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(n) / 1024;
  int i = 0;
  for (; v >= 1024 && i < 5; i++) v /= 1024;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[i]);
  return buf;
}

void print_summary(const Options& o, const SuperInfo& s) {
  if (o.quiet) return;
  char uuid[37];
  uuid_unparse_lower(s.uuid.data(), uuid);
  const std::string on = o.paths.size() > 1 ? std::to_string(o.paths.size()) + " devices" : o.path;
  std::printf("%s a plyfs filesystem on %s%s\n", o.dry_run ? "Would create" : "Creating",
              on.c_str(), o.dry_run ? " (dry run: nothing written)" : "");
  std::printf("  UUID        %s\n", uuid);
  std::printf("  Label       %s\n", s.label.empty() ? "(none)" : s.label.c_str());
  uint64_t blocks = s.total_blocks;
  if (!s.devices.empty()) {  // the devices' blocks, not the gaps between them
    blocks = 0;
    for (const auto& d : s.devices) blocks += d.nblocks;
  }
  std::printf("  Size        %s (%" PRIu64 " blocks of %u bytes)\n",
              human_bytes(blocks * s.block_size).c_str(), blocks, s.block_size);
  std::printf("  Reserved    %" PRIu64 " blocks for deletions and commits\n", s.reserve_blocks);
  for (size_t i = 0; i < s.devices.size(); i++) {
    const DeviceInfo& d = s.devices[i];
    std::printf("  Device %-4zu %s: %s, class %s%s\n", i, i < o.paths.size() ? o.paths[i].c_str() : "?",
                human_bytes(d.nblocks * s.block_size).c_str(), s.classes[d.class_id].c_str(),
                d.class_id == s.meta_class ? " (metadata)" : "");
  }
  // A plan has no generation yet; format writes 1 and then 2 (volume.cpp).
  if (!o.dry_run) std::printf("  Generation  %" PRIu64 "\n", s.generation.v);
}

// ------------------------------------------------------------- signatures

// "an " before a name said with a vowel sound first: ext4, iso9660, and the
// initialisms of an f, h, l, m, n, r, s or x (an xfs, an ntfs, an LVM2_member,
// an hfsplus), else "a " (a btrfs, a dos partition table, a gpt, a vfat, a
// swap, a squashfs).
std::string article(std::string_view name) {
  static const char* const kSaidAsLetters[] = {"xfs", "ntfs", "hfs", "f2fs", "lvm", "mbr", "nilfs", "rbd",
                                               "sgi", "msdos", "mdraid", "mpath", "lsi", "hpt"};
  if (name.empty()) return "a ";
  const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(name[0])));
  if (std::strchr("aeiou", c)) return "an ";
  std::string lower;
  for (char ch : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* p : kSaidAsLetters)
    if (lower.starts_with(p)) return "an ";
  return "a ";
}

// A libblkid probe over our own descriptor: read-only to look, read-write to
// wipe. For a block device the descriptor is not O_EXCL, because the
// FileDevice we hold already has the exclusive claim (M3).
class Probe {
 public:
  static Result<Probe> open(const std::string& path, bool writable) {
    Probe p;
    p.fd_ = ::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (p.fd_ < 0) return Error::sys(errno, "cannot open " + path + " to probe it");
    p.pr_ = blkid_new_probe();
    if (!p.pr_ || blkid_probe_set_device(p.pr_, p.fd_, 0, 0) != 0)
      return Error::io(EIO, "libblkid cannot probe " + path);
    blkid_probe_enable_superblocks(p.pr_, 1);
    blkid_probe_set_superblocks_flags(p.pr_, BLKID_SUBLKS_TYPE | BLKID_SUBLKS_LABEL |
                                                 BLKID_SUBLKS_MAGIC | BLKID_SUBLKS_USAGE |
                                                 BLKID_SUBLKS_BADCSUM);
    blkid_probe_enable_partitions(p.pr_, 1);
    blkid_probe_set_partitions_flags(p.pr_, BLKID_PARTS_MAGIC | BLKID_PARTS_FORCE_GPT);
    return p;
  }
  Probe(Probe&& o) noexcept : fd_(std::exchange(o.fd_, -1)), pr_(std::exchange(o.pr_, nullptr)) {}
  ~Probe() {
    if (pr_) blkid_free_probe(pr_);
    if (fd_ >= 0) ::close(fd_);
  }

  std::string value(const char* name) const {
    const char* data = nullptr;
    if (blkid_probe_lookup_value(pr_, name, &data, nullptr) != 0 || !data) return {};
    return data;
  }
  // "an ext4 file system labelled 'x'", or nothing when the device is blank.
  // RAID members and the like are "signatures".
  Result<std::optional<std::string>> describe(const std::string& path) {
    const int r = blkid_do_safeprobe(pr_);
    if (r == 1) return std::optional<std::string>{};
    if (r == -2) return std::optional<std::string>{"several conflicting signatures"};
    if (r < 0) return Error::io(EIO, "libblkid failed to probe " + path);
    if (std::string pt = value("PTTYPE"); !pt.empty())
      return std::optional<std::string>{article(pt) + pt + " partition table"};
    const bool fs = value("USAGE") == "filesystem";
    const std::string type = value("TYPE");
    std::string d = article(type) + type + (fs ? " file system" : " signature");
    if (std::string label = value("LABEL"); !label.empty()) d += " labelled '" + label + "'";
    return std::optional<std::string>{d};
  }
  // As wipefs(8) does: erase each signature found, then probe again.
  Result<void> wipe_all(const std::string& path) {
    while (blkid_do_probe(pr_) == 0) {
      std::string what = value("TYPE");
      if (what.empty()) what = value("PTTYPE");
      errno = 0;  // libblkid does not always set it
      if (blkid_do_wipe(pr_, 0) != 0)
        return Error::sys(errno ? errno : EIO, "cannot wipe the " + what + " signature on " + path);
    }
    if (::fsync(fd_) != 0) return Error::sys(errno, "fsync of " + path + " failed");
    return ok();
  }

 private:
  Probe() = default;
  int fd_ = -1;
  blkid_probe pr_ = nullptr;
};

// M2. libblkid does not know plyfs, so our own superblocks are checked too;
// a damaged plyfs filesystem still counts as one (it may be worth repairing).
Result<void> refuse_if_plyfs(BlockDevice& dev, const std::string& path) {
  const std::string tail = "; use -f to overwrite";
  // A device of a multi-device volume (format.md#device-label): its
  // superblock alone does not describe a filesystem it could hold.
  auto label = read_device_label(dev);
  if (!label) return Error{EEXIST, path + " holds a damaged plyfs device label" + tail};
  if (*label)
    return Error{EEXIST, path + " is a device of the plyfs volume " + uuid_text((*label)->volume_uuid) + tail};
  auto sb = read_superblocks(dev);
  if (sb) {
    std::string d = path + " contains a plyfs file system";
    if (!sb->info.label.empty()) d += " labelled '" + sb->info.label + "'";
    return Error{EEXIST, d + tail};
  }
  if (sb.error().code == EUCLEAN || sb.error().code == EOPNOTSUPP)
    return Error{EEXIST, path + " contains a plyfs file system that cannot be read (" +
                             sb.error().reason + ")" + tail};
  if (sb.error().code != EINVAL) return sb.error();  // an I/O error: do not guess
  return ok();
}

Result<void> refuse_if_in_use(FileDevice& dev, const std::string& path) {
  PLY_CHECK(refuse_if_plyfs(dev, path));
  const std::string tail = "; use -f to overwrite";
  Probe probe = PLY_TRY(Probe::open(path, false));
  auto found = PLY_TRY(probe.describe(path));
  if (found) return Error{EEXIST, path + " contains " + *found + tail};
  return ok();
}

// ------------------------------------------------------------- formatting

Result<SuperInfo> plan_for(const FileDevice& dev, const Options& o) {
  // An image file about to grow to -s: plan on a sparse stand-in of that size.
  if (!dev.is_block_device() && o.format.size_bytes > dev.size_bytes()) {
    MemDevice grown(o.format.size_bytes, dev.logical_sector_size(), dev.physical_sector_size());
    return Volume::plan(grown, o.format);
  }
  return Volume::plan(dev, o.format);
}

// Tells the device that every block of the filesystem is free (as mke2fs,
// mkfs.xfs and mkfs.btrfs do): a thin or flash device gets its space back,
// and an image file its holes. Advisory (D7): a device that cannot does
// nothing. On a large device it takes a while, so it goes by 1 GiB steps
// with the progress line on a terminal.
Result<void> discard_all(BlockDevice& dev, const Options& o, const SuperInfo& plan) {
  if (!o.discard) return ok();
  const uint64_t total = plan.total_blocks * plan.block_size;
  constexpr uint64_t kStep = 1ull << 30;
  Progress bar("discarding " + o.path, total, Progress::Unit::Bytes, "", o.quiet ? nullptr : stderr);
  for (uint64_t off = 0; off < total; off += kStep) {
    PLY_CHECK(dev.discard(off, std::min(kStep, total - off)));
    bar.update(std::min(kStep, total - off) + off);
  }
  return ok();
}

Result<SuperInfo> write_filesystem(BlockDevice& dev, const Options& o, const SuperInfo& plan) {
  FormatOptions f = o.format;
  f.uuid = plan.uuid;  // the plan drew the random uuid; write exactly what was checked
  SuperInfo s = PLY_TRY(format_filesystem(dev, f, FsCreateOptions{}));
  if (o.root_dir.empty()) return s;
  // -d: the tree imported as a new branch that replaces the empty "main" in
  // one generation (lib/io, io.h I1).
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.cache_bytes = 64ull << 20;
  vo.dirty_limit_bytes = vo.cache_bytes / 4;
  auto v = PLY_TRY(Volume::open(dev, vo));
  io::ImportOptions imp;
  imp.name = "main";
  imp.format = io::Format::Dir;
  imp.replace = true;
  Progress prog("copying " + o.root_dir, 0, Progress::Unit::Bytes, "", stderr, false);
  if (!o.quiet && prog.shown())
    imp.progress = [&](const io::ImportStats& st) {
      prog.set_total(st.total_bytes);
      prog.update(st.read_bytes);
    };
  imp.note = [&](const std::string& n) { std::fprintf(stderr, "%s: %s\n", kProg, n.c_str()); };
  (void)PLY_TRY(io::import(*v, o.root_dir, imp));
  if (prog.shown()) prog.finish();
  PLY_CHECK(v->close());
  return v->super();
}

// The directory entry of a new image must be durable too, not only its blocks.
Result<void> sync_parent(const std::string& path) {
  std::string copy = path;
  const int fd = ::open(::dirname(copy.data()), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error::sys(errno, "cannot open the directory of " + path);
  const int r = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (r != 0) return Error::sys(e, "fsync of the directory of " + path + " failed");
  return ok();
}

Result<SuperInfo> format_new(const Options& o, const SuperInfo& plan) {
  auto dev = PLY_TRY(FileDevice::open(o.path));
  const SuperInfo done = PLY_TRY(write_filesystem(*dev, o, plan));
  PLY_CHECK(sync_parent(o.path));
  return done;
}

// A mistyped device name (/dev/sdz) must not turn into a regular file in
// /dev: a new image is refused in a directory of the filesystem /dev is on
// (devtmpfs), and made anywhere else, /dev/shm's tmpfs included.
Result<void> refuse_in_dev(const std::string& path) {
  std::string copy = path;
  struct stat dir {}, dev {};
  if (::stat(::dirname(copy.data()), &dir) != 0 || ::stat("/dev", &dev) != 0) return ok();  // open() says why
  if (dir.st_dev == dev.st_dev) return Error::io(ENOENT, "no such device " + path);
  return ok();
}

Result<void> make_new_image(const Options& o) {
  PLY_CHECK(refuse_in_dev(o.path));
  if (o.format.size_bytes == 0)
    return Error::invalid(o.path + " does not exist; give -s SIZE to create an image file");
  MemDevice sized(o.format.size_bytes);
  const SuperInfo plan = PLY_TRY(Volume::plan(sized, o.format));
  if (o.dry_run) {
    print_summary(o, plan);
    return ok();
  }
  const int fd = ::open(o.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) return Error::sys(errno, "cannot create " + o.path);
  const bool sized_ok = ::ftruncate(fd, static_cast<off_t>(o.format.size_bytes)) == 0;
  const int e = errno;
  ::close(fd);
  auto r = sized_ok ? format_new(o, plan)
                     : Result<SuperInfo>(Error::sys(e, "cannot size " + o.path));
  if (!r) {
    ::unlink(o.path.c_str());  // leave no half-made image behind
    return r.error();
  }
  print_summary(o, *r);
  return ok();
}

// A dry run opens read-only, without the exclusive claim; ask for it here so
// that -n refuses a busy device as the real run would (M3).
Result<void> check_not_busy(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_EXCL | O_CLOEXEC);
  if (fd < 0 && errno == EBUSY)
    return Error::io(EBUSY, path + " is busy: mounted, or open by another program");
  if (fd < 0) return Error::sys(errno, "cannot open " + path);
  ::close(fd);
  return ok();
}

Result<void> make_on_existing(const Options& o) {
  auto dev = PLY_TRY(FileDevice::open(o.path, FileOpenOptions{.read_only = o.dry_run}));
  if (o.dry_run && dev->is_block_device()) PLY_CHECK(check_not_busy(o.path));
  if (!o.force) PLY_CHECK(refuse_if_in_use(*dev, o.path));
  const SuperInfo plan = PLY_TRY(plan_for(*dev, o));  // M1: every check before a write
  if (o.dry_run) {
    print_summary(o, plan);
    return ok();
  }
  const bool grow = !dev->is_block_device() && o.format.size_bytes > dev->size_bytes();
  if (o.force) {
    Probe probe = PLY_TRY(Probe::open(o.path, true));
    PLY_CHECK(probe.wipe_all(o.path));
  }
  if (grow) {  // an image file only: reopen to see its new size
    dev.reset();
    if (::truncate(o.path.c_str(), static_cast<off_t>(o.format.size_bytes)) != 0)
      return Error::sys(errno, "cannot extend " + o.path);
    dev = PLY_TRY(FileDevice::open(o.path));
  }
  PLY_CHECK(discard_all(*dev, o, plan));
  print_summary(o, PLY_TRY(write_filesystem(*dev, o, plan)));
  return ok();
}

// An NBD export has its size: -s may use less of it, never more.
Result<void> make_on_nbd(const Options& o) {
  auto dev = PLY_TRY(open_device(o.path, FileOpenOptions{.read_only = o.dry_run}));
  if (!o.force) PLY_CHECK(refuse_if_plyfs(*dev, o.path));
  if (o.format.size_bytes > dev->size_bytes())
    return Error::invalid("-s " + std::to_string(o.format.size_bytes) + " is more than the " +
                          std::to_string(dev->size_bytes()) + " bytes of the NBD export " + o.path);
  const SuperInfo plan = PLY_TRY(Volume::plan(*dev, o.format));  // M1
  if (o.dry_run) {
    print_summary(o, plan);
    return ok();
  }
  PLY_CHECK(discard_all(*dev, o, plan));
  print_summary(o, PLY_TRY(write_filesystem(*dev, o, plan)));
  return ok();
}

// Several devices (format.md#multi-device): each checked as one device
// would be (M2, M3), image files created or extended to -s, every check
// before any write (M1); then one volume laid out across them.
Result<void> make_multi(const Options& o) {
  std::vector<DeviceSet::Member> members;
  std::vector<std::string> created;
  auto undo = [&] {
    for (const auto& p : created) ::unlink(p.c_str());
  };
  // An NBD export has its size (-s may use less of it, never more), is
  // neither created nor sized, and is checked for plyfs superblocks only
  // (M2, as make_on_nbd).
  std::map<std::string, uint64_t> nbd_bytes;
  for (const auto& p : o.paths) {
    if (is_nbd_uri(p)) {
      auto dev = PLY_TRY(open_device(p, FileOpenOptions{.read_only = true}));
      if (!o.force) PLY_CHECK(refuse_if_plyfs(*dev, p));
      if (o.format.size_bytes > dev->size_bytes())
        return Error::invalid("-s " + std::to_string(o.format.size_bytes) + " is more than the " +
                              std::to_string(dev->size_bytes()) + " bytes of the NBD export " + p);
      nbd_bytes[p] = o.format.size_bytes ? o.format.size_bytes : dev->size_bytes();
      continue;
    }
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      if (errno != ENOENT) return Error::sys(errno, "cannot access " + p);
      PLY_CHECK(refuse_in_dev(p));
      if (o.format.size_bytes == 0)
        return Error::invalid(p + " does not exist; give -s SIZE to create image files");
      continue;
    }
    auto dev = PLY_TRY(FileDevice::open(p, FileOpenOptions{.read_only = true}));
    if (o.dry_run && dev->is_block_device()) PLY_CHECK(check_not_busy(p));
    if (!o.force) PLY_CHECK(refuse_if_in_use(*dev, p));
  }
  // The plan on stand-ins of the devices' sizes: every check before a write (M1).
  std::vector<uint64_t> sizes;
  for (const auto& p : o.paths) {
    // A block device: all of it, or -s of it. An image file: -s (created
    // or extended to it), else its size.
    struct stat st {};
    uint64_t size = o.format.size_bytes;
    if (nbd_bytes.count(p)) {
      size = nbd_bytes[p];
    } else if (::stat(p.c_str(), &st) == 0) {
      auto dev = PLY_TRY(FileDevice::open(p, FileOpenOptions{.read_only = true}));
      if (dev->is_block_device() && size > dev->size_bytes())
        return Error::invalid("-s " + std::to_string(size) + " is more than the " +
                              std::to_string(dev->size_bytes()) + " bytes of " + p);
      if (!size) size = dev->size_bytes();
    }
    sizes.push_back(size);
  }
  const auto layout = plan_devices(sizes, o.format.block_size);
  {
    std::vector<DeviceSet::Member> stand_ins;
    for (size_t i = 0; i < sizes.size(); i++)
      stand_ins.push_back(DeviceSet::Member{std::make_unique<MemDevice>(sizes[i]),
                                            layout[i].first * o.format.block_size,
                                            layout[i].second * o.format.block_size, o.paths[i]});
    auto set = PLY_TRY(DeviceSet::make(std::move(stand_ins), disk::kReservedBytes));
    FormatOptions f = o.format;
    f.size_bytes = 0;
    f.device_classes = o.path_class;
    const SuperInfo plan = PLY_TRY(Volume::plan(*set, f));
    if (o.dry_run) {
      print_summary(o, plan);
      return ok();
    }
  }
  for (size_t i = 0; i < o.paths.size(); i++) {
    const std::string& p = o.paths[i];
    if (nbd_bytes.count(p)) {
      auto dev = open_device(p, FileOpenOptions{});
      if (!dev) {
        undo();
        return dev.error();
      }
      members.push_back(DeviceSet::Member{std::move(*dev), layout[i].first * o.format.block_size,
                                          layout[i].second * o.format.block_size, p});
      continue;
    }
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) {
      const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd < 0) {
        undo();
        return Error::sys(errno, "cannot create " + p);
      }
      created.push_back(p);
      ::close(fd);
    } else if (o.force) {
      Probe probe = PLY_TRY(Probe::open(p, true));
      PLY_CHECK(probe.wipe_all(p));
    }
    if (!S_ISBLK(st.st_mode) && ::truncate(p.c_str(), static_cast<off_t>(sizes[i])) != 0) {
      undo();
      return Error::sys(errno, "cannot size " + p);
    }
    auto dev = FileDevice::open(p);
    if (!dev) {
      undo();
      return dev.error();
    }
    members.push_back(DeviceSet::Member{std::move(*dev), layout[i].first * o.format.block_size,
                                        layout[i].second * o.format.block_size, p});
  }
  auto set = DeviceSet::make(std::move(members), disk::kReservedBytes);
  if (!set) {
    undo();
    return set.error();
  }
  for (size_t i = 0; i < o.paths.size(); i++) {
    Options one = o;
    one.path = o.paths[i];
    SuperInfo span;
    span.block_size = o.format.block_size;
    span.total_blocks = layout[i].second;
    if (auto r = discard_all((*set)->member(i), one, span); !r) {
      undo();
      return r.error();
    }
  }
  FormatOptions f = o.format;
  f.size_bytes = 0;
  f.device_classes = o.path_class;
  Options multi = o;
  multi.format = f;
  SuperInfo plan = PLY_TRY(Volume::plan(**set, f));
  auto done = write_filesystem(**set, multi, plan);
  if (!done) {
    undo();
    return done.error();
  }
  for (const auto& p : created) PLY_CHECK(sync_parent(p));
  print_summary(o, *done);
  return ok();
}

Result<void> run(const Options& o) {
  if (!o.path_class.empty()) return make_multi(o);
  if (is_nbd_uri(o.path)) return make_on_nbd(o);
  struct stat st {};
  if (::stat(o.path.c_str(), &st) == 0) return make_on_existing(o);
  if (errno != ENOENT) return Error::sys(errno, "cannot access " + o.path);
  return make_new_image(o);
}

// One line: strerror only after a system call's failure (Error::sys), the
// advice to run fsck.plyfs after a damaged image's.
void print_error(const Error& e, const std::string& path = {}) {
  std::fprintf(stderr, "%s: %s\n", kProg, e.user_message(path).c_str());
}

int real_main(int argc, char** argv) {
  auto args = parse_args(argc, argv);
  if (!args) {
    print_error(args.error());
    std::fprintf(stderr, "Try '%s -h' for more information.\n", kProg);
    return 1;
  }
  if (args->help) {
    usage(stdout);
    return 0;
  }
  if (args->version) {
    std::printf("%s (plyfs) %s\n", kProg, PLYFS_VERSION);
    return 0;
  }
  auto opts = resolve(*args);
  if (!opts) {
    print_error(opts.error());
    return 1;
  }
  auto r = run(*opts);
  if (!r) {
    print_error(r.error(), opts->path);
    return 1;
  }
  if (std::fflush(stdout) != 0) {
    std::fprintf(stderr, "%s: cannot write the summary: %s\n", kProg, std::strerror(errno));
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace plyfs

int main(int argc, char** argv) {
  try {
    return plyfs::real_main(argc, argv);
  } catch (const std::exception& e) {  // out of memory; never a crash
    std::fprintf(stderr, "mkfs.plyfs: %s\n", e.what());
    return 1;
  }
}
