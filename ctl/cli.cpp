// The pieces plyctl's commands share (cli.h).
#include "cli.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>

#include "fs/fs.h"
#include "mount_client.h"
#include "snap/snap.h"
#include "union/view.h"

#include "commit/devices.h"

namespace plyfs::ctl {

namespace {
// Errors are one line: a name in a message may hold a newline (an old
// image's branch), which would make it two.
std::string one_line(const std::string& msg) {
  std::string o;
  for (char c : msg) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\%03o", unsigned(static_cast<unsigned char>(c)));
      o += b;
    } else {
      o += c;
    }
  }
  return o;
}
}  // namespace

int fail(const std::string& msg) {
  std::fprintf(stderr, "%s: %s\n", kProg, one_line(msg).c_str());
  return 1;
}
int fail_on(const std::string& image, const Error& e) {
  std::string m = image;
  m += ": ";
  m += e.user_message(image);
  return fail(m);
}
int usage_error(const std::string& msg) {
  std::fprintf(stderr, "%s: %s\nTry '%s --help' for more information.\n", kProg, one_line(msg).c_str(), kProg);
  return 2;
}

int need_mount(const std::string& what, const std::string& path, const std::string& instead) {
  std::string m = what;
  m += " needs a mount point, and ";
  m += path;
  m += " is not a directory";
  if (!instead.empty()) m += "; on an image, " + instead;
  return usage_error(m);
}
int need_image(const std::string& what, const std::string& path, const std::string& instead) {
  std::string m = what;
  m += " needs an image (a file or block device), and ";
  m += path;
  m += " is a directory";
  if (!instead.empty()) m += "; on a mount point, " + instead;
  return usage_error(m);
}

void usage(FILE* out) {
  std::fprintf(out,
               "Usage: %s COMMAND ... [--json]\n\n"
               "On an image (a file or block device) or a mount point; the daemon of a\n"
               "mount point, or of the mount serving the image, answers for a mounted one:\n"
               "  show IMAGE|MNT               superblocks, space and trees of an image\n"
               "  branch list IMAGE            the branches and their parents\n"
               "  layer list IMAGE|MNT         the layer trees (layers: branches made over a parent)\n"
               "  view list IMAGE|MNT          the views: ordered stacks of branches\n"
               "  view create IMAGE|MNT NAME STACK [--default]\n"
               "                               STACK: top=rw:base=ro (leftmost wins)\n"
               "  view delete IMAGE|MNT NAME\n"
               "  view default IMAGE|MNT NAME  the view a mount shows without -o view=\n"
               "                               (a mount keeps the stack it shows until remounted)\n"
               "  sync IMAGE|MNT               make everything written to a mount durable\n"
               "On an image (not mounted):\n"
               "  branch create IMAGE NAME [--clone SRC | --parent P] [--ro]\n"
               "                               a new empty branch (a layer over P), or an\n"
               "                               O(1) clone of SRC sharing all its blocks\n"
               "  branch remove IMAGE NAME     delete a branch, freeing what only it used\n"
               "  branch set IMAGE NAME [--name NEW] [--ro | --rw]\n"
               "  layer create IMAGE NAME --on PARENT [--ro]\n"
               "  layer delete IMAGE NAME      (plyfs -o layer=NAME mounts a layer over its ancestors)\n"
               "On a mount point, the stack changes at once, until unmount, and with --save\n"
               "in the view the mount shows too (root or the mount's owner):\n"
               "  branch list MNT [--all]      the stack, leftmost first (--all: the image's branches)\n"
               "  branch add MNT NAME [--at POS] [--ro] [--save]   show branch NAME (default: leftmost, rw)\n"
               "  branch remove MNT NAME [--save]   stop showing NAME (its data stays)\n"
               "  branch set MNT NAME --ro | --rw [--save]\n"
               "  branch move MNT NAME POS [--save]   POS 0 is the leftmost place\n"
               "On an image or a mount point:\n"
               "  branch set IMAGE|MNT NAME [--quota SIZE|none] [--exclusive-quota SIZE|none]\n"
               "             [--compress zstd[:N]|none|default]   limits, and how new data compresses\n"
               "  snapshot IMAGE|MNT [--view V] [--name SNAP]\n"
               "                               freeze the stack's writable branch as SNAP (default\n"
               "                               NAME@YYMMDD-HHMMSS) under a new empty one, O(1)\n"
               "  clone IMAGE|MNT SRC NAME [--ro]   a new branch sharing all of SRC's blocks, O(1)\n"
               "  merge IMAGE|MNT BRANCH       merge layer BRANCH into the branch below it\n"
               "  rollback IMAGE|MNT BRANCH    discard a layer's changes\n"
               "  delete IMAGE|MNT BRANCH      delete a branch, freeing what only it used\n"
               "  diff IMAGE|MNT FROM TO [-z]  paths added (+), removed (-), modified (M), renamed (R)\n"
               "  hold IMAGE|MNT BRANCH...     keep branches from delete, merge and snapshot_keep\n"
               "  release IMAGE|MNT BRANCH...  take the hold off again\n"
               "Data in and out (offline; export, send and receive on a mount point too):\n"
               "  import IMAGE BRANCH SOURCE [--parent P] [--format dir|tar|oci-layer|oci|ext4] [--ro] [--force]\n"
               "                               a directory, tarball, OCI layer or image, or ext4\n"
               "                               image as a new branch (a layer over P)\n"
               "  export IMAGE|MNT BRANCH [-o FILE] [--format tar|oci-layer] [--compress zstd|gzip|none]\n"
               "                               the branch's view as a tarball, or a layer's own\n"
               "                               changes as an OCI layer\n"
               "  send IMAGE|MNT BRANCH [--parent SNAP] [-o FILE] [--compress zstd[:N]|none]\n"
               "                               the branch as a stream, whole or what differs from SNAP\n"
               "  receive IMAGE|MNT [-f FILE] [--name NAME]\n"
               "                               a stream as a new read-only branch\n"               "Space:\n"
               "  device list IMAGE|MNT        the devices of a volume on several: class, size, use\n"
               "  device add IMAGE|MNT DEVICE  a device joins the volume (--class C)\n"
               "  device remove IMAGE|MNT DEV  its blocks moved to the others, the device leaves\n"
               "  device replace IMAGE|MNT DEV NEWDEV  NEWDEV joins with DEV's class, DEV leaves\n"
               "  where PATH                   on which devices a file's data lies (on a mount)\n"
               "  policy list IMAGE|MNT        the placement rules of a volume on several devices\n"
               "  policy set IMAGE|MNT RULE... replace them ('ext=mp4 to=slow', 'size<64K to=fast strict')\n"
               "  policy test PATH SIZE [UID]  which rule a new file would fall under, and where it goes\n"
               "  policy apply IMAGE|MNT       move every file to its rule's class now\n"
               "  du IMAGE|MNT [BRANCH]        each branch's referenced and exclusive bytes, or one\n"
               "                               branch's, with what it shares with each other branch\n"
               "  trim IMAGE|MNT [--minimum SIZE]  discard every free block (fstrim's job):\n"
               "                               punched out of an image file, BLKDISCARD on a device\n"
               "  resize IMAGE|MNT SIZE|max    grow the filesystem to SIZE (an image file is extended)\n"
               "                               or to its device's size, or shrink it to SIZE (what lies\n"
               "                               past it moves below first; an image file is cut)\n"
               "  scrub IMAGE|MNT [--rate SIZE] read every block any branch reaches and check its checksum;\n"
               "                               exit 4 on damage, naming each damaged file (MNT status|cancel)\n"
               "For testing:\n"
               "  debug tree IMAGE TREE        every node of a tree (TREE: an id, root or space)\n"
               "  debug fields STRUCT          the fields debug corrupt can damage\n"
               "  debug corrupt IMAGE STRUCT [LOCATOR] FIELD ACTION [--keep-checksum]\n"
               "  debug corrupt IMAGE fsinfo|inode|dirent|whiteout|xattr|extent|inline|orphan\n"
               "                BRANCH [INO [NAME|OFFSET]] FIELD ACTION\n"
               "  debug corrupt IMAGE xattr-chunk BRANCH INO NAME OFFSET FIELD ACTION\n"
               "      STRUCT: superblock [SLOT], node BLOCK, space-item START, root-record TREE\n"
               "      ACTION: --set VALUE, --flip BIT, --zero or --add N\n"
               "      The checksum is recomputed unless --keep-checksum, so that the\n"
               "      field checks themselves must find the damage.\n\n"
               "Every command takes --json: one JSON value on stdout (plyctl(8), JSON SCHEMA).\n"
               "A branch is named by its name or its id; -- ends the options.\n"
               "--device PATH (any number, anywhere): another device of a volume on several,\n"
               "or a directory to scan for them, when IMAGE is one of its devices.\n"
               "Exit status: 0 success, 1 failure, 2 usage error.\n",
               kProg);
}

Result<uint64_t> number(const std::string& s, const char* what) {
  if (s.empty()) return Error::invalid(std::string("empty ") + what);
  char* end = nullptr;
  errno = 0;
  uint64_t v = std::strtoull(s.c_str(), &end, 0);
  if (*end || errno) return Error::invalid(std::string("invalid ") + what + " '" + s + "'");
  return v;
}

std::vector<std::string>& extra_devices() {
  static std::vector<std::string> v;
  return v;
}

std::string mount_root(const std::string& resolved, dev_t dev) {
  std::string mnt = resolved;
  for (;;) {
    const size_t slash = mnt.rfind('/');
    const std::string up = slash == 0 ? "/" : mnt.substr(0, slash);
    struct stat ps {};
    if (mnt == "/" || ::stat(up.c_str(), &ps) != 0 || ps.st_dev != dev) break;
    mnt = up;
  }
  return mnt;
}

Result<std::unique_ptr<BlockDevice>> open_image(const std::string& path, bool write) {
  return ::plyfs::open_volume(path, extra_devices(), FileOpenOptions{!write, true});
}

Result<Opened> open_volume(const std::string& image, bool write) {
  Opened o;
  auto dev = open_image(image, write);
  if (!dev) {
    if (dev.error().code == EBUSY)
      return Error::io(EBUSY, "it is mounted or in use: unmount it first, or give the mount point");
    return dev.error();
  }
  o.dev = std::move(*dev);
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.movers = fs_movers();
  vo.read_only = !write;
  vo.cache_bytes = 64ull << 20;
  // A long merge commits as it goes, so that its dirty metadata never has
  // to fit the cache (what it built before a crash is a doomed scratch tree).
  vo.dirty_limit_bytes = write ? vo.cache_bytes / 4 : 0;
  o.vol = PLY_TRY(Volume::open(*o.dev, vo));
  // What an interrupted merge or rollback left goes first (format.md#snapshots).
  if (write) (void)PLY_TRY(drop_doomed(*o.vol));
  // The placement rules in force for whatever the command writes (a
  // receive, an import, a removal's moves), as on a mount
  // (format.md#placement-rules): a damaged rule leaves them all out, with a
  // warning, and fsck reports it.
  if (write)
    if (auto r = load_placement_rules(*o.vol); !r)
      std::fprintf(stderr, "%s: %s: placement rules not in force: %s\n", kProg, image.c_str(),
                   r.error().message().c_str());
  return o;
}

Result<Target> open_target(const std::string& path, bool write) {
  Target t;
  if (is_directory(path)) {
    t.mnt = path;
    return t;
  }
  auto o = open_volume(path, write);
  if (o) {
    t.o = std::move(*o);
    return t;
  }
  if (o.error().code != EBUSY) return o.error();
  auto mnt = mount_of(path);
  if (!mnt) return o.error();  // locked by something that is no plyfs mount here
  t.mnt = *mnt;
  return t;
}

Result<Parsed> parse(const std::vector<std::string>& args, const std::set<std::string>& with_value,
                     const std::set<std::string>& flags) {
  Parsed p;
  bool options = true;
  for (size_t i = 0; i < args.size(); i++) {
    std::string a = args[i];
    if (!options || a.size() < 2 || a[0] != '-') {
      p.pos.push_back(a);
      continue;
    }
    if (a == "--") {  // what follows is names, even one that starts with '-' (an old image's)
      options = false;
      continue;
    }
    std::string value;
    bool has_value = false;
    if (auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a.resize(eq);
      has_value = true;
    }
    if (with_value.count(a)) {
      if (!has_value) {
        if (i + 1 >= args.size()) return Error::invalid(a + " needs a value");
        value = args[++i];
      }
      p.opt[a] = value;
    } else if (flags.count(a) && !has_value) {
      p.opt[a] = "";
    } else {
      return Error::invalid("unknown option '" + a + "'");
    }
  }
  return p;
}

bool is_directory(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace plyfs::ctl
