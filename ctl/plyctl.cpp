// plyctl: inspects plyfs images and, for testing, damages them on purpose.
//   plyctl show IMAGE [--json]
//   plyctl debug tree IMAGE TREE
//   plyctl debug fields STRUCT
//   plyctl debug corrupt IMAGE STRUCT [LOCATOR] FIELD (--set V|--flip BIT|--zero|--add N) [--keep-checksum]
// Exit status: 0 success, 1 failure, 2 usage error.
#include <uuid/uuid.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "blockdev/blockdev.h"
#include "commit/volume.h"
#include "fs/fs.h"
#include "fsck/corrupt.h"

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
               "  debug tree IMAGE TREE        every node of a tree (TREE: an id, root or space)\n"
               "  debug fields STRUCT          the fields debug corrupt can damage\n"
               "  debug corrupt IMAGE STRUCT [LOCATOR] FIELD ACTION [--keep-checksum]\n"
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
  auto s = struct_named(args[0]);
  if (!s) return usage_error(s.error().reason);
  for (const auto& f : corrupt_fields(*s)) std::printf("%s\n", f.c_str());
  return 0;
}

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
