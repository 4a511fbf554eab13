// The pieces plyctl's commands share (cli.h).
#include "cli.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>

#include "fs/fs.h"
#include "snap/snap.h"

namespace plyfs::ctl {

int fail(const std::string& msg) {
  std::fprintf(stderr, "%s: %s\n", kProg, msg.c_str());
  return 1;
}
int usage_error(const std::string& msg) {
  std::fprintf(stderr, "%s: %s\nTry '%s --help' for more information.\n", kProg, msg.c_str(), kProg);
  return 2;
}

void usage(FILE* out) {
  std::fprintf(out,
               "Usage: %s COMMAND ...\n\n"
               "  show IMAGE [--json]          superblocks, space and trees of an image\n"
               "  branch list IMAGE [--json]   the branches (subvolumes) and their parents\n"
               "  branch create IMAGE NAME [--clone SRC | --parent P] [--ro]\n"
               "                               a new empty branch (a layer over P), or an\n"
               "                               O(1) clone of SRC sharing all its blocks\n"
               "  branch remove IMAGE NAME     delete a branch, freeing what only it used\n"
               "  branch set IMAGE NAME [--name NEW] [--ro | --rw]\n"
               "On a mount point, the branch commands change the mounted stack, at once\n"
               "and until unmount (root or the mount's owner):\n"
               "  branch list MNT [--json]     the stack, leftmost first\n"
               "  branch add MNT NAME [--at POS] [--ro]   show branch NAME (default: leftmost, rw)\n"
               "  branch remove MNT NAME       stop showing NAME (its data stays)\n"
               "  branch set MNT NAME --ro | --rw\n"
               "  branch move MNT NAME POS     POS 0 is the leftmost place\n"
               "  layer list IMAGE [--json]    the layer trees (layers: branches made over a parent)\n"
               "  layer create IMAGE NAME --on PARENT [--ro]\n"
               "  layer delete IMAGE NAME      (plyfs -o layer=NAME mounts a layer over its ancestors)\n"
               "  view list IMAGE [--json]     the views: ordered stacks of branches\n"
               "  view create IMAGE NAME STACK [--default]\n"
               "                               STACK: top=rw:base=ro (leftmost wins)\n"
               "  view delete IMAGE NAME\n"
               "  view default IMAGE NAME      the view a mount shows without -o view=\n"
               "  snapshot IMAGE|MNT [--view V] [--name SNAP] [--json]\n"
               "                               freeze the stack's writable branch as SNAP (default\n"
               "                               NAME@YYMMDD-HHMMSS) under a new empty one, O(1)\n"
               "  clone IMAGE|MNT SRC NAME [--ro]   a new branch sharing all of SRC's blocks, O(1)\n"
               "  merge IMAGE|MNT BRANCH [--json]   merge layer BRANCH into the branch below it\n"
               "  rollback IMAGE|MNT BRANCH    discard a layer's changes\n"
               "  delete IMAGE|MNT BRANCH      delete a branch, freeing what only it used\n"
               "  diff IMAGE|MNT FROM TO [--json]  paths added (+), removed (-), modified (M), renamed (R)\n"
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

Result<std::unique_ptr<FileDevice>> open_image(const std::string& path, bool write) {
  return FileDevice::open(path, FileOpenOptions{!write, true});
}

Result<Opened> open_volume(const std::string& image, bool write) {
  Opened o;
  auto dev = open_image(image, write);
  if (!dev) {
    if (dev.error().code == EBUSY)
      return Error::io(EBUSY, image + " is mounted or in use; unmount it first");
    return dev.error();
  }
  o.dev = std::move(*dev);
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.read_only = !write;
  vo.cache_bytes = 64ull << 20;
  // A long merge commits as it goes, so that its dirty metadata never has
  // to fit the cache (what it built before a crash is a doomed scratch tree).
  vo.dirty_limit_bytes = write ? vo.cache_bytes / 4 : 0;
  o.vol = PLY_TRY(Volume::open(*o.dev, vo));
  // What an interrupted merge or rollback left goes first (format.md#snapshots).
  if (write) (void)PLY_TRY(drop_doomed(*o.vol));
  return o;
}

Result<Parsed> parse(const std::vector<std::string>& args, const std::set<std::string>& with_value,
                     const std::set<std::string>& flags) {
  Parsed p;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) == 0) {
      if (with_value.count(a)) {
        if (i + 1 >= args.size()) return Error::invalid(a + " needs a value");
        p.opt[a] = args[++i];
      } else if (flags.count(a)) {
        p.opt[a] = "";
      } else {
        return Error::invalid("unknown option '" + a + "'");
      }
    } else {
      p.pos.push_back(a);
    }
  }
  return p;
}

bool is_directory(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace plyfs::ctl
