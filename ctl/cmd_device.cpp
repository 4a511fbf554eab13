// plyctl device list (plyctl.8): the devices of a volume
// (format.md#multi-device), offline or through a mount's daemon.
#include <cstdio>

#include "cli.h"
#include "mount_client.h"
#include "output.h"
#include "snap/model.h"
#include "util/parse.h"

namespace plyfs::ctl {

namespace {

void print_devices(const Json& r) {
  std::printf("%-5s %-10s %-10s %10s %10s %10s  %s\n", "INDEX", "CLASS", "ROLE", "SIZE", "USED", "META", "PATH");
  for (const auto& d : r["devices"]) {
    const std::string cls = d["class"].is_string() ? d["class"].get<std::string>() : "-";
    const std::string path = d["path"].is_string() ? d["path"].get<std::string>() : "-";
    std::printf("%-5llu %-10s %-10s %10s %10s %10s  %s\n", (unsigned long long)d["index"].get<uint64_t>(), cls.c_str(),
                d["metadata"].get<bool>() ? "meta+data" : "data", format_size(d["size_bytes"].get<uint64_t>()).c_str(),
                format_size(d["used_bytes"].get<uint64_t>()).c_str(),
                format_size(d["metadata_bytes"].get<uint64_t>()).c_str(), path.c_str());
  }
}

}  // namespace

int cmd_device(const std::string& sub, const std::vector<std::string>& args) {
  if (sub != "list") return usage_error("unknown device subcommand '" + sub + "' (list)");
  auto p = parse(args, {}, {"--json"});
  if (!p) return usage_error(p.error().message());
  if (p->pos.size() != 1) return usage_error("usage: plyctl [--device PATH]... device list IMAGE|MOUNTPOINT [--json]");
  const std::string& path = p->pos[0];
  auto t = open_target(path, false);
  if (!t) return fail_on(path, t.error());
  Result<Json> r = Error::invalid("");
  if (!t->mnt.empty()) {
    r = request(t->mnt, Json{{"command", "devices"}});
    if (!r) return fail(path + ": " + r.error().message());
  } else {
    r = model::devices(*t->o.vol);
    if (!r) return fail_on(path, r.error());
  }
  if (p->opt.count("--json")) print_json(*r);
  else print_devices(*r);
  return 0;
}

}  // namespace plyfs::ctl
