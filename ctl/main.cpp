// plyctl: branches, layers, views, snapshots, clones, merges and diffs of
// plyfs images and mounts; and, for testing, damage on purpose (plyctl.8).
//   plyctl show IMAGE|MOUNTPOINT [--json]
//   plyctl branch list|create|remove|set IMAGE ...
//   plyctl branch list|add|remove|set|move MOUNTPOINT ... [--save]   (a mounted stack)
//   plyctl view list|create|delete|default IMAGE|MOUNTPOINT ...
//   plyctl layer list IMAGE|MOUNTPOINT, layer create|delete IMAGE ...
//   plyctl sync IMAGE|MOUNTPOINT
//   plyctl hold|release IMAGE|MOUNTPOINT BRANCH...
//   plyctl snapshot|clone|merge|rollback|delete|diff IMAGE|MOUNTPOINT ...
//   plyctl import IMAGE BRANCH SOURCE [--parent P] [--format F]
//   plyctl export IMAGE|MOUNTPOINT BRANCH [-o FILE] [--format tar|oci-layer] [--compress zstd|gzip]
//   plyctl send IMAGE|MOUNTPOINT BRANCH [--parent SNAP] [-o FILE] [--compress zstd[:N]|none]
//   plyctl receive IMAGE|MOUNTPOINT [-f FILE] [--name NAME]
//   plyctl du IMAGE|MOUNTPOINT [BRANCH]
//   plyctl trim IMAGE|MOUNTPOINT [--minimum SIZE]
//   plyctl resize IMAGE|MOUNTPOINT SIZE|max
//   plyctl debug tree IMAGE TREE
//   plyctl debug fields STRUCT
//   plyctl debug corrupt IMAGE STRUCT [LOCATOR] FIELD (--set V|--flip BIT|--zero|--add N) [--keep-checksum]
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli.h"
#include "output.h"

#ifndef PLYFS_VERSION
#define PLYFS_VERSION "unknown"
#endif

namespace plyfs::ctl {
namespace {

int real_main(int argc, char** argv) {
  set_utf8_locale();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) return usage_error("no command given");
  if (args[0] == "-h" || args[0] == "--help") return usage(stdout), 0;
  if (args[0] == "-V" || args[0] == "--version") {
    std::printf("%s (plyfs) %s\n", kProg, PLYFS_VERSION);
    return 0;
  }
  // --device PATH, anywhere before "--" and any number of times: the other
  // devices of a multi-device volume, or directories to scan (cli.h).
  for (size_t i = 0; i < args.size() && args[i] != "--";) {
    if (args[i].rfind("--device=", 0) == 0) {
      extra_devices().push_back(args[i].substr(9));
      args.erase(args.begin() + static_cast<long>(i));
    } else if (args[i] == "--device") {
      if (i + 1 >= args.size()) return usage_error("--device needs a path");
      extra_devices().push_back(args[i + 1]);
      args.erase(args.begin() + static_cast<long>(i), args.begin() + static_cast<long>(i) + 2);
    } else {
      i++;
    }
  }
  if (args.empty()) return usage_error("no command given");
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
  if (cmd == "hold" || cmd == "release") return cmd_hold(cmd, args);
  if (cmd == "sync") return cmd_sync(args);
  if (cmd == "import") return cmd_import(args);
  if (cmd == "export") return cmd_export(args);
  if (cmd == "send") return cmd_send(args);
  if (cmd == "receive") return cmd_receive(args);
  if (cmd == "trim") return cmd_trim(args);
  if (cmd == "du") return cmd_du(args);
  if (cmd == "resize") return cmd_resize(args);
  if (cmd == "scrub") return cmd_scrub(args);
  if (cmd == "where") return cmd_where(args);
  if (cmd == "policy") {
    if (args.empty()) return usage_error("policy needs a subcommand: list, set or test");
    const std::string sub = args[0];
    args.erase(args.begin());
    return cmd_policy(sub, args);
  }
  if (cmd == "device") {
    if (args.empty()) return usage_error("device needs a subcommand: list, add, remove, replace");
    const std::string sub = args[0];
    args.erase(args.begin());
    return cmd_device(sub, args);
  }
  if (cmd == "debug") {
    if (args.empty()) return usage_error("debug needs a subcommand: tree, fields or corrupt");
    const std::string sub = args[0];
    args.erase(args.begin());
    if (sub == "tree") return cmd_tree(args);
    if (sub == "fields") return cmd_fields(args);
    if (sub == "corrupt") return cmd_corrupt(args);
    return usage_error("unknown debug subcommand '" + sub + "' (tree, fields, corrupt)");
  }
  return usage_error("unknown command '" + cmd + "'");
}

}  // namespace
}  // namespace plyfs::ctl

int main(int argc, char** argv) {
  try {
    return plyfs::ctl::real_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "plyctl: %s\n", e.what());
    return 1;
  }
}
