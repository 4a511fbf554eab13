// plyctl: inspects plyfs images and, for testing, damages them on purpose.
//   plyctl show IMAGE [--json]
//   plyctl branch list|create|remove|set IMAGE ...
//   plyctl branch list|add|remove|set|move MOUNTPOINT ...   (a mounted stack)
//   plyctl view list|create|delete|default IMAGE ...
//   plyctl layer list|create|delete IMAGE ...
//   plyctl snapshot|clone|merge|rollback|delete|diff IMAGE|MOUNTPOINT ...
//   plyctl debug tree IMAGE TREE
//   plyctl debug fields STRUCT
//   plyctl debug corrupt IMAGE STRUCT [LOCATOR] FIELD (--set V|--flip BIT|--zero|--add N) [--keep-checksum]
// Exit status: 0 success, 1 failure, 2 usage error.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <uuid/uuid.h>

#include <cinttypes>
#include <functional>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "util/json.h"
#include "blockdev/blockdev.h"
#include "commit/volume.h"
#include "fs/fs.h"
#include "fsck/corrupt.h"
#include "fs/corrupt_fs.h"
#include "snap/snap.h"
#include "union/view.h"
#include "control.h"

#ifndef PLYFS_VERSION
#define PLYFS_VERSION "unknown"
#endif

namespace plyfs {
namespace {

constexpr const char* kProg = "plyctl";

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

int cmd_show(const std::vector<std::string>& args) {
  if (args.empty() || args.size() > 2 || (args.size() == 2 && args[1] != "--json"))
    return usage_error("usage: plyctl show IMAGE [--json]");
  const bool json = args.size() == 2;
  auto dev = open_image(args[0], false);
  if (!dev) return fail(dev.error().message());
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  vo.read_only = true;
  auto vol = Volume::open(**dev, vo);
  if (!vol) return fail(args[0] + ": " + vol.error().message());
  const SuperInfo s = (*vol)->super();
  const auto& rec = (*vol)->recovery();
  const auto st = (*vol)->space_stats();
  auto txn = (*vol)->begin();
  if (!txn) return fail(txn.error().message());
  auto trees = txn->list_trees();
  if (!trees) return fail(trees.error().message());
  char uuid[37];
  uuid_unparse_lower(s.uuid.data(), uuid);
  if (json) {
    std::printf("{\"uuid\": \"%s\", \"label\": \"%s\", \"generation\": %" PRIu64
                ", \"slot\": %d, \"block_size\": %u, \"total_blocks\": %" PRIu64
                ", \"used_blocks\": %" PRIu64 ", \"meta_blocks\": %" PRIu64
                ", \"data_blocks\": %" PRIu64 ", \"reserve_blocks\": %" PRIu64
                ", \"slots\": [\"%s\", \"%s\"], \"trees\": [",
                uuid, s.label.c_str(), s.generation.v, rec.slot, s.block_size, s.total_blocks,
                s.used_blocks, s.meta_blocks, s.data_blocks, s.reserve_blocks,
                slot_state_name(rec.reports[0].state), slot_state_name(rec.reports[1].state));
    for (size_t i = 0; i < trees->size(); i++) {
      const auto& t = (*trees)[i];
      std::printf("%s{\"id\": %" PRIu64 ", \"kind\": %u, \"root\": %" PRIu64 ", \"level\": %u, "
                  "\"created\": %" PRIu64 ", \"cloned_from\": %" PRIu64 "}",
                  i ? ", " : "", t.id.v, t.kind, t.root.block.v, t.root.level, t.created.v,
                  t.cloned_from.v);
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("Filesystem   %s\nUUID         %s\nLabel        %s\n", args[0].c_str(), uuid,
              s.label.empty() ? "(none)" : s.label.c_str());
  std::printf("Generation   %" PRIu64 " in slot %d (slot 0 %s, slot 1 %s)\n", s.generation.v,
              rec.slot, slot_state_name(rec.reports[0].state), slot_state_name(rec.reports[1].state));
  std::printf("Blocks       %" PRIu64 " of %u bytes, first usable %" PRIu64 "\n", s.total_blocks,
              s.block_size, s.first_block);
  std::printf("Used         %" PRIu64 " blocks (%" PRIu64 " metadata, %" PRIu64 " data), %" PRIu64
              " free, %" PRIu64 " in reserve\n",
              st.used_blocks, st.meta_blocks, st.data_blocks, st.free_blocks, st.reserve_blocks);
  std::printf("Trees        %zu\n", trees->size());
  for (const auto& t : *trees)
    std::printf("  tree %" PRIu64 ": kind %u, root block %" PRIu64 " level %u, created in %" PRIu64
                "%s\n",
                t.id.v, t.kind, t.root.block.v, t.root.level, t.created.v,
                t.cloned_from.v ? (", clone of " + std::to_string(t.cloned_from.v)).c_str() : "");
  return 0;
}

int cmd_tree(const std::vector<std::string>& args) {
  if (args.size() != 2) return usage_error("usage: plyctl debug tree IMAGE TREE");
  auto dev = open_image(args[0], false);
  if (!dev) return fail(dev.error().message());
  auto ch = read_superblocks(**dev);
  if (!ch) return fail(args[0] + ": " + ch.error().message());
  const SuperInfo& s = ch->info;
  RootPtr root;
  if (args[1] == "root") root = s.root_tree;
  else if (args[1] == "space") root = s.space_tree;
  else {
    auto id = number(args[1], "tree id");
    if (!id) return usage_error(id.error().reason);
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    vo.read_only = true;
    auto vol = Volume::open(**dev, vo);
    if (!vol) return fail(vol.error().message());
    auto txn = (*vol)->begin();
    auto info = txn->tree_info(TreeId{*id});
    if (!info) return fail(info.error().message());
    root = info->root;
  }
  BlockCache cache(**dev, s.block_size, 64 << 20);
  WalkMemo memo;
  std::vector<Problem> problems;
  uint64_t items = 0;
  WalkHooks h;
  h.on_node = [](BlockNo b, int level, Generation g, uint64_t owner, bool first) {
    std::printf("%*snode %" PRIu64 " level %d generation %" PRIu64 " owner %" PRIu64 "%s\n",
                2 * (16 - level) % 32, "", b.v, level, g.v, owner, first ? "" : " (shared, again)");
  };
  h.on_item = [&](Key, std::span<const std::byte>) { items++; };
  check_tree(cache, s.fs_id, root, s.generation, h, memo, problems);
  std::printf("%" PRIu64 " items\n", items);
  for (const auto& p : problems)
    std::printf("problem %s block %" PRIu64 ": %s\n", p.code.c_str(), p.block, p.message.c_str());
  return problems.empty() ? 0 : 1;
}

Result<CorruptStruct> struct_named(const std::string& s) {
  for (auto c : {CorruptStruct::Superblock, CorruptStruct::Node, CorruptStruct::SpaceItem,
                 CorruptStruct::RootRecord})
    if (s == corrupt_struct_name(c)) return c;
  return Error::invalid("unknown structure '" + s +
                        "' (superblock, node, space-item or root-record)");
}

int cmd_fields(const std::vector<std::string>& args) {
  if (args.size() != 1) return usage_error("usage: plyctl debug fields STRUCT");
  if (auto f = fs_struct_named(args[0])) {
    for (const auto& x : fs_corrupt_fields(*f)) std::printf("%s\n", x.c_str());
    return 0;
  }
  auto s = struct_named(args[0]);
  if (!s) return usage_error(s.error().reason);
  for (const auto& f : corrupt_fields(*s)) std::printf("%s\n", f.c_str());
  return 0;
}

int corrupt_item(FsStruct f, const std::vector<std::string>& pos, const CorruptAction& act);

int cmd_corrupt(std::vector<std::string> args) {
  CorruptAction act;
  bool have_action = false;
  std::vector<std::string> pos;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    auto value = [&]() -> Result<uint64_t> {
      if (i + 1 >= args.size()) return Error::invalid(a + " needs a value");
      return number(args[++i], "value");
    };
    if (a == "--keep-checksum") { act.fix_checksum = false; continue; }
    if (a == "--zero" || a == "--set" || a == "--flip" || a == "--add") {
      if (have_action) return usage_error("give one of --set, --flip, --zero, --add");
      have_action = true;
      if (a == "--zero") { act.how = Damage::Zero; continue; }
      auto v = value();
      if (!v) return usage_error(v.error().reason);
      if (a == "--set") act.how = Damage::Set, act.value = *v;
      else if (a == "--add") act.how = Damage::Add, act.value = *v;
      else act.how = Damage::Flip, act.bit = static_cast<unsigned>(*v);
      continue;
    }
    if (a.rfind("--", 0) == 0) return usage_error("unknown option " + a);
    pos.push_back(a);
  }
  if (!have_action) return usage_error("give one of --set, --flip, --zero, --add");
  if (pos.size() < 3) return usage_error("usage: plyctl debug corrupt IMAGE STRUCT [LOCATOR] FIELD ACTION");
  if (auto f = fs_struct_named(pos[1])) return corrupt_item(*f, pos, act);
  auto s = struct_named(pos[1]);
  if (!s) return usage_error(s.error().reason);
  CorruptTarget t;
  t.what = *s;
  if (*s == CorruptStruct::Superblock) {
    if (pos.size() == 4) {
      auto slot = number(pos[2], "slot");
      if (!slot || *slot > 1) return usage_error("the superblock slot is 0 or 1");
      t.slot = static_cast<int>(*slot);
    } else if (pos.size() != 3) {
      return usage_error("usage: plyctl debug corrupt IMAGE superblock [SLOT] FIELD ACTION");
    }
  } else {
    if (pos.size() != 4) return usage_error(std::string("usage: plyctl debug corrupt IMAGE ") + pos[1] + " LOCATOR FIELD ACTION");
    auto loc = number(pos[2], "locator");
    if (!loc) return usage_error(loc.error().reason);
    t.locator = *loc;
  }
  t.field = pos.back();
  auto dev = open_image(pos[0], true);
  if (!dev) return fail(dev.error().message());
  auto r = corrupt(**dev, t, act);
  if (!r) return fail(pos[0] + ": " + r.error().message());
  std::printf("%s: %s\n", pos[0].c_str(), r->c_str());
  return 0;
}

// --- branches and views (offline: the image must not be mounted) ---------


struct Opened {
  std::unique_ptr<FileDevice> dev;
  std::unique_ptr<Volume> vol;
};

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

// plyctl debug corrupt IMAGE STRUCT BRANCH LOCATOR... FIELD ACTION for the
// items of filesystem trees (lib/fs/corrupt_fs.h). BRANCH is a name or a
// tree id (a damaged info item may have no name left).
int corrupt_item(FsStruct f, const std::vector<std::string>& pos, const CorruptAction& act) {
  // What follows BRANCH: fsinfo nothing; inode and orphan INO; dirent,
  // whiteout and xattr INO NAME; extent and inline INO OFFSET; xattr-chunk
  // INO NAME OFFSET.
  const size_t locators = f == FsStruct::FsInfo                             ? 0
                          : f == FsStruct::Inode || f == FsStruct::Orphan   ? 1
                          : f == FsStruct::XattrChunk                       ? 3
                                                                            : 2;
  static const char* what[] = {"", " INO", " INO NAME|OFFSET", " INO NAME OFFSET"};
  if (pos.size() != 4 + locators)
    return usage_error(std::string("usage: plyctl debug corrupt IMAGE ") + fs_struct_name(f) + " BRANCH" +
                       what[locators] + " FIELD ACTION");
  if (act.fix_checksum == false) return usage_error("--keep-checksum is for the engine's structures");
  auto o = open_volume(pos[0], true);
  if (!o) return fail(pos[0] + ": " + o.error().message());
  FsTarget t;
  t.what = f;
  if (auto b = find_branch(*o->vol, pos[2])) t.tree = b->tree;
  else if (auto id = number(pos[2], "branch")) t.tree = TreeId{*id};
  else return usage_error("no branch \"" + pos[2] + "\"");
  if (locators >= 1) {
    auto ino = number(pos[3], "inode number");
    if (!ino) return usage_error(ino.error().reason);
    t.ino = *ino;
  }
  if (locators >= 2) {
    if (f == FsStruct::Extent || f == FsStruct::Inline) {
      auto off = number(pos[4], "offset");
      if (!off) return usage_error(off.error().reason);
      t.offset = *off;
    } else {
      t.name = pos[4];
    }
  }
  if (locators == 3) {
    auto off = number(pos[5], "offset");
    if (!off) return usage_error(off.error().reason);
    t.offset = *off;
  }
  t.field = pos.back();
  auto r = corrupt_fs(*o->vol, t, act);
  if (!r) return fail(pos[0] + ": " + r.error().message());
  std::printf("%s: %s\n", pos[0].c_str(), r->c_str());
  return 0;
}

// Splits options (--x [value]) from positional arguments.
struct Parsed {
  std::vector<std::string> pos;
  std::map<std::string, std::string> opt;
};
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

// The first view that shows branch `t` (writable, if `writing`).
Result<std::optional<std::string>> view_using(Volume& v, TreeId t, bool writing) {
  for (auto& view : PLY_TRY(list_views(v)))
    for (auto& l : view.layers)
      if (l.tree == t && (l.writable || !writing)) return std::optional<std::string>(view.name);
  return std::optional<std::string>{};
}

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

// The branch commands on a mount point.
int cmd_mounted_branch(const std::string& sub, const Parsed& p) {
  const auto& pos = p.pos;
  auto has = [&](const char* o) { return p.opt.count(o) > 0; };
  std::string req;
  if (sub == "list") {
    if (pos.size() != 1) return usage_error("usage: plyctl branch list MOUNTPOINT [--json]");
    req = "list";
  } else if (sub == "add") {
    if (pos.size() != 2 || has("--rw") || has("--clone") || has("--parent") || has("--name"))
      return usage_error("usage: plyctl branch add MOUNTPOINT NAME [--at POS] [--ro]");
    req = "add " + pos[1] + " " + (has("--at") ? p.opt.at("--at") : "0") + (has("--ro") ? " ro" : " rw");
  } else if (sub == "remove") {
    if (pos.size() != 2) return usage_error("usage: plyctl branch remove MOUNTPOINT NAME");
    req = "remove " + pos[1];
  } else if (sub == "set") {
    if (pos.size() != 2 || has("--ro") == has("--rw") || has("--name"))
      return usage_error("usage: plyctl branch set MOUNTPOINT NAME --ro | --rw");
    req = "set " + pos[1] + (has("--ro") ? " ro" : " rw");
  } else if (sub == "move") {
    if (pos.size() != 3) return usage_error("usage: plyctl branch move MOUNTPOINT NAME POS");
    req = "move " + pos[1] + " " + pos[2];
  } else {
    return usage_error("unknown branch subcommand '" + sub + "' for a mount point");
  }
  for (char c : req)
    if (c == '\n') return usage_error("names cannot hold a newline");
  auto r = control(pos[0], req);
  if (!r) return fail(r.error().message());
  if (has("--json")) {
    // "a=rw:b=ro" -> [{"name": "a", "writable": true}, ...]
    std::printf("[");
    size_t start = 0;
    for (int i = 0; start <= r->size() && !r->empty(); i++) {
      size_t end = r->find(':', start);
      if (end == std::string::npos) end = r->size();
      const std::string layer = r->substr(start, end - start);
      const size_t eq = layer.rfind('=');
      std::printf("%s{\"name\": %s, \"writable\": %s}", i ? ", " : "",
                  json_quote(layer.substr(0, eq)).c_str(), layer.substr(eq + 1) == "rw" ? "true" : "false");
      start = end + 1;
    }
    std::printf("]\n");
  } else {
    std::printf("%s\n", r->c_str());
  }
  return 0;
}

bool is_directory(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int cmd_branch(const std::string& sub, const std::vector<std::string>& args) {
  auto p = parse(args, {"--clone", "--parent", "--name", "--at"}, {"--json", "--ro", "--rw"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  auto has = [&](const char* o) { return p->opt.count(o) > 0; };
  if (!pos.empty() && is_directory(pos[0])) return cmd_mounted_branch(sub, *p);
  if (has("--at")) return usage_error("--at is for a mount point");
  if (sub == "list") {
    if (pos.size() != 1) return usage_error("usage: plyctl branch list IMAGE [--json]");
    auto o = open_volume(pos[0], false);
    if (!o) return fail(pos[0] + ": " + o.error().message());
    auto bs = Filesystem::branches(*o->vol);
    if (!bs) return fail(pos[0] + ": " + bs.error().message());
    std::erase_if(*bs, [](const BranchMeta& b) { return b.doomed; });  // dropped at the next write
    auto name_of = [&](TreeId t) -> std::string {
      for (auto& b : *bs)
        if (b.tree == t) return b.name;
      return t.v ? std::to_string(t.v) : "";
    };
    if (has("--json")) {
      std::printf("[");
      for (size_t i = 0; i < bs->size(); i++) {
        const auto& b = (*bs)[i];
        std::printf("%s{\"id\": %llu, \"name\": %s, \"parent\": %s, \"read_only\": %s, "
                    "\"created_generation\": %llu}",
                    i ? ", " : "", (unsigned long long)b.tree.v, json_quote(b.name).c_str(),
                    b.parent.v ? json_quote(name_of(b.parent)).c_str() : "null",
                    b.read_only ? "true" : "false", (unsigned long long)b.created.v);
      }
      std::printf("]\n");
      return 0;
    }
    std::printf("%-6s %-20s %-20s %-4s %s\n", "ID", "NAME", "PARENT", "MODE", "CREATED");
    for (const auto& b : *bs)
      std::printf("%-6llu %-20s %-20s %-4s gen %llu\n", (unsigned long long)b.tree.v, b.name.c_str(),
                  b.parent.v ? name_of(b.parent).c_str() : "-", b.read_only ? "ro" : "rw",
                  (unsigned long long)b.created.v);
    return 0;
  }
  if (sub == "create") {
    if (pos.size() != 2 || (has("--clone") && has("--parent")))
      return usage_error("usage: plyctl branch create IMAGE NAME [--clone SRC | --parent P] [--ro]");
    auto o = open_volume(pos[0], true);
    if (!o) return fail(pos[0] + ": " + o.error().message());
    Volume& v = *o->vol;
    if (find_branch(v, pos[1])) return fail("a branch named \"" + pos[1] + "\" exists");
    BranchMeta m;
    m.name = pos[1];
    m.read_only = has("--ro");
    if (has("--clone")) {
      auto src = find_branch(v, p->opt["--clone"]);
      if (!src) return fail(src.error().message());
      auto c = clone_branch(v, src->tree, m.name, m.read_only);
      if (!c) return fail(c.error().message());
      m = *c;
    } else if (has("--parent")) {
      // The same function makes a layer online (mkdir in the control folder).
      auto par = find_branch(v, p->opt["--parent"]);
      if (!par) return fail(par.error().message());
      auto l = create_layer(v, m.name, par->tree, m.read_only);
      if (!l) return fail(l.error().message());
      m = *l;
    } else {
      FsCreateOptions fo;
      fo.name = m.name;
      fo.read_only = m.read_only;
      auto id = Filesystem::create(v, fo);
      if (!id) return fail(id.error().message());
      m.tree = *id;
      m.parent = fo.parent;
    }
    if (auto r = Filesystem::set_branch(v, m); !r) return fail(r.error().message());
    if (auto r = v.close(); !r) return fail(r.error().message());
    std::printf("created branch \"%s\" (id %llu)\n", m.name.c_str(), (unsigned long long)m.tree.v);
    return 0;
  }
  if (sub == "remove") {
    if (pos.size() != 2) return usage_error("usage: plyctl branch remove IMAGE NAME");
    auto o = open_volume(pos[0], true);
    if (!o) return fail(pos[0] + ": " + o.error().message());
    Volume& v = *o->vol;
    auto b = find_branch(v, pos[1]);
    if (!b) return fail(b.error().message());
    if (auto r = delete_branch(v, b->tree); !r) return fail(r.error().message());
    if (auto r = v.close(); !r) return fail(r.error().message());
    std::printf("removed branch \"%s\"\n", b->name.c_str());
    return 0;
  }
  if (sub == "set") {
    if (pos.size() != 2 || (has("--ro") && has("--rw")))
      return usage_error("usage: plyctl branch set IMAGE NAME [--name NEW] [--ro | --rw]");
    auto o = open_volume(pos[0], true);
    if (!o) return fail(pos[0] + ": " + o.error().message());
    Volume& v = *o->vol;
    auto b = find_branch(v, pos[1]);
    if (!b) return fail(b.error().message());
    if (has("--name")) {
      if (find_branch(v, p->opt["--name"])) return fail("a branch named \"" + p->opt["--name"] + "\" exists");
      b->name = p->opt["--name"];
    }
    if (has("--ro")) b->read_only = true;
    if (has("--rw")) b->read_only = false;
    if (b->read_only) {
      auto used = view_using(v, b->tree, true);
      if (!used) return fail(used.error().message());
      if (*used) return fail("view \"" + **used + "\" writes to this branch; change it first");
    }
    if (auto r = Filesystem::set_branch(v, *b); !r) return fail(r.error().message());
    if (auto r = v.close(); !r) return fail(r.error().message());
    return 0;
  }
  return usage_error("unknown branch subcommand '" + sub + "'");
}

// OLFS layer trees: layers are branches made empty over a parent; the
// commands are the branch ones with the tree shown as a tree.
int cmd_layer(const std::string& sub, const std::vector<std::string>& args) {
  auto p = parse(args, {"--on"}, {"--json", "--ro"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  auto has = [&](const char* o) { return p->opt.count(o) > 0; };
  if (sub == "create") {
    if (pos.size() != 2 || !has("--on") || has("--json"))
      return usage_error("usage: plyctl layer create IMAGE NAME --on PARENT [--ro]");
    std::vector<std::string> a{pos[0], pos[1], "--parent", p->opt.at("--on")};
    if (has("--ro")) a.push_back("--ro");
    return cmd_branch("create", a);
  }
  if (sub == "delete") {
    if (pos.size() != 2 || has("--on") || has("--ro") || has("--json"))
      return usage_error("usage: plyctl layer delete IMAGE NAME");
    return cmd_branch("remove", pos);
  }
  if (sub != "list") return usage_error("unknown layer subcommand '" + sub + "' (list, create, delete)");
  if (pos.size() != 1 || has("--on") || has("--ro"))
    return usage_error("usage: plyctl layer list IMAGE [--json]");
  auto o = open_volume(pos[0], false);
  if (!o) return fail(pos[0] + ": " + o.error().message());
  auto bs = Filesystem::branches(*o->vol);
  if (!bs) return fail(pos[0] + ": " + bs.error().message());
  std::erase_if(*bs, [](const BranchMeta& b) { return b.doomed; });
  std::map<uint64_t, const BranchMeta*> by_tree;
  std::map<uint64_t, std::vector<const BranchMeta*>> children;
  std::vector<const BranchMeta*> roots;
  std::map<uint64_t, bool> layer;
  for (const auto& b : *bs) {
    by_tree[b.tree.v] = &b;
    auto l = is_layer(*o->vol, b);
    if (!l) return fail(pos[0] + ": " + l.error().message());
    layer[b.tree.v] = *l;
  }
  for (const auto& b : *bs) {
    if (layer[b.tree.v] && by_tree.count(b.parent.v)) children[b.parent.v].push_back(&b);
    else roots.push_back(&b);
  }
  auto name_of = [&](TreeId t) { return by_tree.count(t.v) ? by_tree[t.v]->name : std::to_string(t.v); };
  if (has("--json")) {
    std::printf("[");
    for (size_t i = 0; i < bs->size(); i++) {
      const auto& b = (*bs)[i];
      std::printf("%s{\"name\": %s, \"id\": %llu, \"parent\": %s, \"layer\": %s, \"read_only\": %s}",
                  i ? ", " : "", json_quote(b.name).c_str(), (unsigned long long)b.tree.v,
                  b.parent.v ? json_quote(name_of(b.parent)).c_str() : "null",
                  layer[b.tree.v] ? "true" : "false", b.read_only ? "true" : "false");
    }
    std::printf("]\n");
    return 0;
  }
  std::function<void(const BranchMeta*, const std::string&, const std::string&)> show =
      [&](const BranchMeta* b, const std::string& lead, const std::string& more) {
        std::string what = "id " + std::to_string(b->tree.v) + (b->read_only ? ", ro" : "");
        if (!layer[b->tree.v] && b->parent.v) what += ", clone of " + name_of(b->parent);
        std::printf("%s%s (%s)\n", lead.c_str(), b->name.c_str(), what.c_str());
        const auto& kids = children[b->tree.v];
        for (size_t i = 0; i < kids.size(); i++) {
          const bool last = i + 1 == kids.size();
          show(kids[i], more + (last ? "\u2514\u2500\u2500 " : "\u251c\u2500\u2500 "),
               more + (last ? "    " : "\u2502   "));
        }
      };
  for (const auto* r : roots) show(r, "", "");
  return 0;
}

int cmd_view(const std::string& sub, const std::vector<std::string>& args) {
  auto p = parse(args, {}, {"--json", "--default"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  if (sub == "list") {
    if (pos.size() != 1) return usage_error("usage: plyctl view list IMAGE [--json]");
    auto o = open_volume(pos[0], false);
    if (!o) return fail(pos[0] + ": " + o.error().message());
    auto views = list_views(*o->vol);
    if (!views) return fail(views.error().message());
    if (p->opt.count("--json")) {
      std::printf("[");
      for (size_t i = 0; i < views->size(); i++) {
        const auto& w = (*views)[i];
        std::printf("%s{\"name\": %s, \"default\": %s, \"branches\": %s}", i ? ", " : "",
                    json_quote(w.name).c_str(), w.is_default ? "true" : "false",
                    json_quote(format_stack(*o->vol, w.layers)).c_str());
      }
      std::printf("]\n");
      return 0;
    }
    if (views->empty()) {
      auto d = default_stack(*o->vol);
      std::printf("no views; a mount shows %s\n", d ? format_stack(*o->vol, *d).c_str() : "nothing");
      return 0;
    }
    for (const auto& w : *views)
      std::printf("%-20s %s%s\n", w.name.c_str(), format_stack(*o->vol, w.layers).c_str(),
                  w.is_default ? "  (default)" : "");
    return 0;
  }
  if (sub == "create" || sub == "delete" || sub == "default") {
    const size_t want = sub == "create" ? 3 : 2;
    if (pos.size() != want)
      return usage_error(sub == "create" ? "usage: plyctl view create IMAGE NAME STACK [--default]"
                                         : "usage: plyctl view " + sub + " IMAGE NAME");
    auto o = open_volume(pos[0], true);
    if (!o) return fail(pos[0] + ": " + o.error().message());
    Volume& v = *o->vol;
    Result<void> r = ok();
    if (sub == "create") {
      auto stack = parse_stack(v, pos[2]);
      if (!stack) return fail(stack.error().message());
      r = put_view(v, View{pos[1], p->opt.count("--default") > 0, *stack});
    } else if (sub == "delete") {
      r = delete_view(v, pos[1]);
    } else {
      auto views = list_views(v);
      if (!views) return fail(views.error().message());
      auto it = std::find_if(views->begin(), views->end(), [&](auto& w) { return w.name == pos[1]; });
      if (it == views->end()) return fail("no view named \"" + pos[1] + "\"");
      it->is_default = true;
      r = put_view(v, *it);
    }
    if (!r) return fail(r.error().message());
    if (auto c = v.close(); !c) return fail(c.error().message());
    return 0;
  }
  return usage_error("unknown view subcommand '" + sub + "'");
}


// --- snapshots, clones, merges, rollback, deletion, diff (format.md#snapshots) --------

// Sends a lifecycle request to a mount after flushing what the kernel
// holds, so that a snapshot holds every write made before the command.
int mounted_request(const std::string& mnt, const std::string& req, bool json) {
  for (char c : req)
    if (c == '\n' || c == '\t') return usage_error("names cannot hold a newline or tab");
  // The request is words: a name with a space would split (fuse/control.h).
  if (std::count(req.begin(), req.end(), ' ') + 1 > (req.rfind("clone ", 0) == 0 ? 4 : 2))
    return usage_error("on a mount point, branch names cannot hold spaces");
  int fd = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    (void)::syscall(SYS_syncfs, fd);
    ::close(fd);
  }
  auto r = control(mnt, req);
  if (!r) return fail(r.error().message());
  const bool stack = req.rfind("clone", 0) != 0 && req.rfind("delete", 0) != 0;
  if (json) std::printf("{\"%s\": %s}\n", stack ? "stack" : "result", json_quote(*r).c_str());
  else std::printf("%s\n", r->c_str());
  return 0;
}

// A diff from a mount's daemon, paged (fuse/control.h): "diff" leaves the
// whole text with the daemon under a token, and "read"s fetch it a chunk at
// a time, the last one freeing it. The daemon formats it with format_diff,
// as the offline diff below, so both print the same bytes.
int mounted_diff(const std::string& mnt, const std::string& from, const std::string& to, bool json) {
  for (const auto& n : {from, to})
    if (n.find_first_of(" \t\n") != std::string::npos)
      return usage_error("on a mount point, branch names cannot hold spaces");
  int fd = ::open(mnt.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {  // what the kernel holds lands first, as for a snapshot
    (void)::syscall(SYS_syncfs, fd);
    ::close(fd);
  }
  auto r = control(mnt, "diff " + from + " " + to + (json ? " json" : ""));
  if (!r) return fail(r.error().message());
  std::istringstream in(*r);
  std::string token;
  unsigned long long size = 0;
  if (!(in >> token >> size)) return fail(mnt + ": unexpected answer to diff: \"" + *r + "\"");
  for (unsigned long long off = 0; off < size;) {
    auto c = control(mnt, "read " + token + " " + std::to_string(off));
    if (!c) return fail(c.error().message());
    if (c->empty()) return fail(mnt + ": the diff ended early, at byte " + std::to_string(off));
    std::fwrite(c->data(), 1, c->size(), stdout);
    off += c->size();
  }
  return 0;
}

std::string branch_json(const BranchMeta& b) {
  return "{\"name\": " + json_quote(b.name) + ", \"id\": " + std::to_string(b.tree.v) +
         ", \"read_only\": " + (b.read_only ? "true" : "false") + "}";
}

int cmd_lifecycle(const std::string& cmd, const std::vector<std::string>& args) {
  auto p = parse(args, {"--view", "--name"}, {"--json", "--ro"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  auto has = [&](const char* o) { return p->opt.count(o) > 0; };
  const bool json = has("--json");
  static const std::map<std::string, std::pair<std::string, size_t>> kUsage = {
      {"snapshot", {"snapshot IMAGE|MOUNTPOINT [--view V] [--name SNAP] [--json]", 1}},
      {"clone", {"clone IMAGE|MOUNTPOINT SRC NAME [--ro] [--json]", 3}},
      {"merge", {"merge IMAGE|MOUNTPOINT BRANCH [--json]", 2}},
      {"rollback", {"rollback IMAGE|MOUNTPOINT BRANCH [--json]", 2}},
      {"delete", {"delete IMAGE|MOUNTPOINT BRANCH", 2}},
      {"diff", {"diff IMAGE|MOUNTPOINT FROM TO [--json]", 3}}};
  const auto& [use, npos] = kUsage.at(cmd);
  if (pos.size() != npos || (has("--view") && cmd != "snapshot") || (has("--name") && cmd != "snapshot") ||
      (has("--ro") && cmd != "clone"))
    return usage_error("usage: plyctl " + use);
  if (is_directory(pos[0])) {
    if (cmd == "snapshot") {
      if (has("--view")) return usage_error("--view is for an image: a mount snapshots its own stack");
      return mounted_request(pos[0], "snapshot" + (has("--name") ? " " + p->opt.at("--name") : std::string()), json);
    }
    if (cmd == "merge" || cmd == "rollback" || cmd == "delete")
      return mounted_request(pos[0], cmd + " " + pos[1], json);
    if (cmd == "clone") return mounted_request(pos[0], "clone " + pos[1] + " " + pos[2] + (has("--ro") ? " ro" : ""), json);
    return mounted_diff(pos[0], pos[1], pos[2], json);
  }
  auto o = open_volume(pos[0], cmd != "diff");
  if (!o) return fail(pos[0] + ": " + o.error().message());
  Volume& v = *o->vol;
  auto branch = [&](const std::string& name) { return find_branch(v, name); };
  if (cmd == "snapshot") {
    auto stack = has("--view") ? view_stack(v, p->opt.at("--view")) : default_stack(v);
    if (!stack) return fail(stack.error().message());
    std::string name;
    if (has("--name")) {
      name = p->opt.at("--name");
    } else {
      auto top = std::find_if(stack->begin(), stack->end(), [](const ViewLayer& l) { return l.writable; });
      auto b = top == stack->end() ? Result<BranchMeta>(Error::io(EROFS, "the stack has no writable branch"))
                                   : Filesystem::branch(v, top->tree);
      if (!b) return fail(b.error().message());
      auto n = snapshot_name(v, b->name);
      if (!n) return fail(n.error().message());
      name = *n;
    }
    auto s = snapshot(v, *stack, name);
    if (!s) return fail(s.error().message());
    if (auto c = v.close(); !c) return fail(c.error().message());
    if (json)
      std::printf("{\"snapshot\": %s, \"live\": %s, \"stack\": %s}\n", branch_json(s->frozen).c_str(),
                  branch_json(s->live).c_str(), json_quote(format_stack(v, s->stack)).c_str());
    else
      std::printf("snapshot \"%s\" taken; \"%s\" is a new layer on it (%s)\n", s->frozen.name.c_str(),
                  s->live.name.c_str(), format_stack(v, s->stack).c_str());
    return 0;
  }
  if (cmd == "clone") {
    auto src = branch(pos[1]);
    if (!src) return fail(src.error().message());
    auto c = clone_branch(v, src->tree, pos[2], has("--ro"));
    if (!c) return fail(c.error().message());
    if (auto r = v.close(); !r) return fail(r.error().message());
    if (json) std::printf("%s\n", branch_json(*c).c_str());
    else std::printf("cloned \"%s\" as \"%s\" (id %llu)\n", src->name.c_str(), c->name.c_str(), (unsigned long long)c->tree.v);
    return 0;
  }
  if (cmd == "merge") {
    auto b = branch(pos[1]);
    if (!b) return fail(b.error().message());
    const bool tty = isatty(2);
    auto m = merge(v, b->tree, nullptr, [&](const MergeStats& st) {
      if (tty) std::fprintf(stderr, "\rmerging: %llu entries, %llu objects", (unsigned long long)st.entries,
                            (unsigned long long)st.objects);
    });
    if (tty) std::fprintf(stderr, "\n");
    if (!m) return fail(m.error().message());
    bool shown = false;
    auto dropped = drop_doomed(v, [&](const BTree::DropStats& st) {
      if (tty) std::fprintf(stderr, "\rfreeing the merged branches: %llu nodes, %llu extents",
                            (unsigned long long)st.nodes, (unsigned long long)st.extents);
      shown = tty;
    });
    if (shown) std::fprintf(stderr, "\n");
    if (!dropped) return fail(dropped.error().message());
    if (auto r = v.close(); !r) return fail(r.error().message());
    if (json)
      std::printf("{\"merged\": %s, \"entries\": %llu, \"objects\": %llu, \"removed\": %llu}\n",
                  branch_json(m->merged).c_str(), (unsigned long long)m->stats.entries,
                  (unsigned long long)m->stats.objects, (unsigned long long)m->stats.removed);
    else
      std::printf("merged \"%s\" into the branch below it: %llu entries, %llu objects, %llu names removed\n",
                  m->merged.name.c_str(), (unsigned long long)m->stats.entries,
                  (unsigned long long)m->stats.objects, (unsigned long long)m->stats.removed);
    return 0;
  }
  if (cmd == "rollback" || cmd == "delete") {
    auto b = branch(pos[1]);
    if (!b) return fail(b.error().message());
    // Freeing a large tree is one long transaction: on a terminal, as for a
    // merge, what it freed so far.
    const bool tty = isatty(2);
    bool shown = false;
    auto progress = [&](const BTree::DropStats& st) {
      if (!tty) return;
      std::fprintf(stderr, "\rfreeing: %llu nodes, %llu extents", (unsigned long long)st.nodes,
                   (unsigned long long)st.extents);
      shown = true;
    };
    if (cmd == "rollback") {
      auto r = rollback(v, b->tree);
      if (!r) return fail(r.error().message());
    } else if (auto r = delete_branch(v, b->tree, progress); !r) {
      if (shown) std::fprintf(stderr, "\n");
      return fail(r.error().message());
    }
    auto dropped = drop_doomed(v, progress);  // a rollback's old layer
    if (shown) std::fprintf(stderr, "\n");
    if (!dropped) return fail(dropped.error().message());
    if (auto r = v.close(); !r) return fail(r.error().message());
    if (json) std::printf("{\"%s\": %s}\n", cmd == "rollback" ? "rolled_back" : "deleted", json_quote(b->name).c_str());
    else std::printf("%s \"%s\"\n", cmd == "rollback" ? "rolled back" : "deleted", b->name.c_str());
    return 0;
  }
  // diff
  auto a = branch(pos[1]);
  if (!a) return fail(a.error().message());
  auto b = branch(pos[2]);
  if (!b) return fail(b.error().message());
  auto d = diff(v, a->tree, b->tree);
  if (!d) return fail(d.error().message());
  const std::string text = format_diff(*d, json);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

int real_main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return usage_error("no command given");
  if (args[0] == "-h" || args[0] == "--help") return usage(stdout), 0;
  if (args[0] == "-V" || args[0] == "--version") {
    std::printf("%s (plyfs) %s\n", kProg, PLYFS_VERSION);
    return 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "show") return cmd_show(args);
  if (cmd == "branch" || cmd == "view" || cmd == "layer") {
    if (args.empty()) return usage_error(cmd + " needs a subcommand");
    const std::string sub = args[0];
    args.erase(args.begin());
    return cmd == "branch" ? cmd_branch(sub, args) : cmd == "view" ? cmd_view(sub, args) : cmd_layer(sub, args);
  }
  if (cmd == "snapshot" || cmd == "clone" || cmd == "merge" || cmd == "rollback" || cmd == "delete" ||
      cmd == "diff")
    return cmd_lifecycle(cmd, args);
  if (cmd == "debug") {
    if (args.empty()) return usage_error("debug needs a subcommand: tree, fields or corrupt");
    const std::string sub = args[0];
    args.erase(args.begin());
    if (sub == "tree") return cmd_tree(args);
    if (sub == "fields") return cmd_fields(args);
    if (sub == "corrupt") return cmd_corrupt(args);
    return usage_error("unknown debug subcommand '" + sub + "'");
  }
  return usage_error("unknown command '" + cmd + "'");
}

}  // namespace
}  // namespace plyfs

int main(int argc, char** argv) {
  try {
    return plyfs::real_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plyctl: %s\n", e.what());
    return 1;
  }
}
