// plyctl debug: a tree's nodes, and fields damaged on purpose for the
// tests of fsck (lib/fsck/corrupt.h, lib/fs/corrupt_fs.h).
#include "cli.h"

#include <cinttypes>
#include <cstdio>

#include "btree/btree.h"
#include "fs/corrupt_fs.h"
#include "fs/fs.h"
#include "fsck/corrupt.h"
#include "output.h"
#include "util/text.h"
#include "union/view.h"

namespace plyfs::ctl {

namespace {
// Takes --json out of `args`: whether it was there.
bool take_json(std::vector<std::string>& args) {
  return std::erase(args, std::string("--json")) > 0;
}
}  // namespace

int cmd_tree(std::vector<std::string> args) {
  const bool json = take_json(args);
  if (args.size() != 2) return usage_error("usage: plyctl debug tree IMAGE TREE [--json]");
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
  Json nodes = Json::array();
  h.on_node = [&](BlockNo b, int level, Generation g, uint64_t owner, bool first) {
    if (json)
      nodes.push_back({{"block", b.v}, {"level", level}, {"generation", g.v}, {"owner", owner}, {"shared", !first}});
    else
      std::printf("%*snode %" PRIu64 " level %d generation %" PRIu64 " owner %" PRIu64 "%s\n",
                  2 * (16 - level) % 32, "", b.v, level, g.v, owner, first ? "" : " (shared, again)");
  };
  h.on_item = [&](Key, std::span<const std::byte>) { items++; };
  check_tree(cache, s.fs_id, root, s.generation, h, memo, problems);
  if (json) {
    Json ps = Json::array();
    for (const auto& p : problems)
      ps.push_back({{"code", p.code}, {"block", p.block == Error::kNoBlock ? Json(nullptr) : Json(p.block)},
                    {"message", lossy_utf8(p.message)}});
    print_json({{"nodes", std::move(nodes)}, {"items", items}, {"problems", std::move(ps)}});
  } else {
    std::printf("%" PRIu64 " items\n", items);
    for (const auto& p : problems)
      std::printf("problem %s block %" PRIu64 ": %s\n", p.code.c_str(), p.block, p.message.c_str());
  }
  return problems.empty() ? 0 : 1;
}

Result<CorruptStruct> struct_named(const std::string& s) {
  for (auto c : {CorruptStruct::Superblock, CorruptStruct::Node, CorruptStruct::SpaceItem,
                 CorruptStruct::RootRecord})
    if (s == corrupt_struct_name(c)) return c;
  return Error::invalid("unknown structure '" + s +
                        "' (superblock, node, space-item or root-record)");
}

int cmd_fields(std::vector<std::string> args) {
  const bool json = take_json(args);
  if (args.size() != 1) return usage_error("usage: plyctl debug fields STRUCT [--json]");
  std::vector<std::string> fields;
  if (auto f = fs_struct_named(args[0])) {
    fields = fs_corrupt_fields(*f);
  } else {
    auto s = struct_named(args[0]);
    if (!s) return usage_error(s.error().reason);
    for (const auto& f : corrupt_fields(*s)) fields.push_back(f);
  }
  if (json) print_json(fields);
  else
    for (const auto& f : fields) std::printf("%s\n", f.c_str());
  return 0;
}

int corrupt_item(FsStruct f, const std::vector<std::string>& pos, const CorruptAction& act, bool json);

namespace {
// What debug corrupt did: "IMAGE: WHAT", or {"structure", "field", "change"}.
int print_corrupted(const std::vector<std::string>& pos, const std::string& what, bool json) {
  if (json) print_json({{"structure", pos[1]}, {"field", pos.back()}, {"change", lossy_utf8(what)}});
  else std::printf("%s: %s\n", pos[0].c_str(), what.c_str());
  return 0;
}
}  // namespace

int cmd_corrupt(std::vector<std::string> args) {
  const bool json = take_json(args);
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
  if (auto f = fs_struct_named(pos[1])) return corrupt_item(*f, pos, act, json);
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
  return print_corrupted(pos, *r, json);
}

// plyctl debug corrupt IMAGE STRUCT BRANCH LOCATOR... FIELD ACTION for the
// items of filesystem trees (lib/fs/corrupt_fs.h). BRANCH is a name or a
// tree id (a damaged info item may have no name left).
int corrupt_item(FsStruct f, const std::vector<std::string>& pos, const CorruptAction& act, bool json) {
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
  t.dev = o->dev.get();  // the leaf.* fields damage the leaf in place
  auto r = corrupt_fs(*o->vol, t, act);
  if (!r) return fail(pos[0] + ": " + r.error().message());
  return print_corrupted(pos, *r, json);
}

}  // namespace plyfs::ctl
