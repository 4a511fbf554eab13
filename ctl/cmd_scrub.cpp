// plyctl scrub (format.md#scrub): every node and data block any branch
// reaches, each once, read from the device and checked against its
// checksum; on an unmounted image here (lib/fs/scrub.h), on a mount point
// (or a mounted image) by its daemon while the mount goes on. The result
// object is the same either way (plyctl.schema.json: Scrub). Exit 4 when
// damage was found (fsck's "errors left uncorrected"), as btrfs scrub
// exits 3: a script can tell damage from a failure to scrub.
#include "cli.h"

#include <cstdio>

#include "mount_client.h"
#include "output.h"
#include "snap/model.h"
#include "util/parse.h"
#include "util/progress.h"

namespace plyfs::ctl {

namespace {

constexpr int kDamageFound = 4;

void print_scrub(const std::string& path, const model::Json& r) {
  for (const auto& d : r["damage"]) {
    std::string refs;
    for (const auto& x : d["references"]) {
      if (!refs.empty()) refs += ", ";
      refs += x["branch"].get<std::string>();
      if (x["path"].is_string()) refs += ":" + x["path"].get<std::string>();
    }
    std::printf("block %llu (%s, %s): %s\n", (unsigned long long)d["block"].get<uint64_t>(),
                d["type"].get<std::string>().c_str(), d["reason"].get<std::string>().c_str(),
                refs.empty() ? "no branch reaches it any more" : refs.c_str());
  }
  const size_t n = r["damage"].size();
  std::printf("%s: scrubbed %s (%llu metadata blocks, %llu data blocks) in %.2f s%s: %s\n", path.c_str(),
              format_size(r["bytes"].get<uint64_t>()).c_str(), (unsigned long long)r["metadata_blocks"].get<uint64_t>(),
              (unsigned long long)r["data_blocks"].get<uint64_t>(), r["seconds"].get<double>(),
              r["cancelled"].get<bool>() ? ", cancelled" : "",
              n == 0 ? "no damage found" : (std::to_string(n) + (n == 1 ? " damaged block" : " damaged blocks")).c_str());
}

}  // namespace

int cmd_scrub(const std::vector<std::string>& args) {
  auto p = parse(args, {"--rate"}, {"--json"});
  if (!p) return usage_error(p.error().message());
  const char* kUsage = "usage: plyctl scrub IMAGE|MOUNTPOINT [--rate SIZE] [--json] | scrub MOUNTPOINT status|cancel";
  if (p->pos.empty() || p->pos.size() > 2) return usage_error(kUsage);
  const std::string& path = p->pos[0];
  const std::string sub = p->pos.size() == 2 ? p->pos[1] : "";
  if (!sub.empty() && sub != "status" && sub != "cancel") return usage_error(kUsage);
  uint64_t rate = 0;
  if (p->opt.count("--rate")) {
    auto v = parse_size(p->opt.at("--rate"), "rate");
    if (!v || *v == 0) return usage_error(v ? "--rate must be more than 0 bytes a second" : v.error().message());
    rate = *v;
  }
  const bool json = p->opt.count("--json");
  auto t = open_target(path, false);
  if (!t) return fail_on(path, t.error());
  if (!sub.empty()) {
    if (t->mnt.empty())
      return need_mount("scrub " + sub, path, "an unmounted image is scrubbed by plyctl itself, in the foreground");
    auto r = request(t->mnt, model::Json{{"command", sub == "cancel" ? "scrub-cancel" : "progress"}});
    if (!r) return fail(path + ": " + r.error().message());
    if (sub == "cancel") {
      if (json) print_json(*r);
      else std::printf("%s: scrub cancelled (it stops at its next batch)\n", path.c_str());
      return 0;
    }
    const bool running = r->value("running", false) && r->value("command", std::string()) == "scrub";
    model::Json s{{"running", running}};
    if (running) {
      s["done_bytes"] = r->value("done", uint64_t(0));
      s["fraction"] = r->value("fraction", 0.0);
    }
    if (json) print_json(s);
    else if (!running) std::printf("%s: no scrub running\n", path.c_str());
    else
      std::printf("%s: scrub running, %s checked (%.1f %%)\n", path.c_str(),
                  format_size(s["done_bytes"].get<uint64_t>()).c_str(), 100 * s["fraction"].get<double>());
    return 0;
  }
  Result<model::Json> r = Error::invalid("");
  if (!t->mnt.empty()) {
    model::Json req{{"command", "scrub"}, {"rate", rate}};
    Progress work("scrubbing", 0, Progress::Unit::Bytes);
    r = request(t->mnt, req, nullptr, &work);
    if (!r) return fail(path + ": " + r.error().message());
  } else {
    Progress prog("scrubbing", 0, Progress::Unit::Bytes);
    ScrubOptions o;
    o.rate_bytes = rate;
    o.progress = [&](uint64_t done, uint64_t total) {
      prog.set_total(total);
      prog.update(done);
    };
    auto rep = scrub(*t->o.vol, o);
    if (!rep) return fail_on(path, rep.error());
    if (prog.shown()) prog.finish();
    r = model::scrub(*rep);
  }
  if (json) print_json(*r);
  else print_scrub(path, *r);
  return (*r)["damage"].empty() ? 0 : kDamageFound;
}

}  // namespace plyfs::ctl
