// plyctl hold and release (zfs hold/release; format.md#snapshots, "Holds"),
// on an image or a mount point: a held branch is not deleted, consumed by
// a merge or pruned by a mount's retention until it is released. Every
// branch named is found before any changes, so that a wrong name changes
// nothing. Idempotent: holding a held branch, or releasing one that is not
// held, succeeds (plyctl.8 says why). --json prints the Branch objects after.
#include "cli.h"

#include <cstdio>

#include "mount_client.h"
#include "output.h"
#include "snap/model.h"
#include "snap/snap.h"
#include "union/view.h"

namespace plyfs::ctl {

namespace {

Result<Json> offline_hold(Opened o, const std::vector<std::string>& names, bool held) {
  Volume& v = *o.vol;
  std::vector<BranchMeta> bs;
  for (const auto& n : names) bs.push_back(PLY_TRY(find_branch(v, n)));
  for (const auto& b : bs) (void)PLY_TRY(set_held(v, b.tree, held));
  auto all = PLY_TRY(model::Branches::read(v));
  Json out = Json::array();
  for (const auto& b : bs) out.push_back(all.branch(*all.find(b.tree)));
  PLY_CHECK(v.close());
  return out;
}

Result<Json> mounted_hold(const std::string& mnt, const std::string& cmd, const std::vector<std::string>& names) {
  Json req{{"command", cmd}, {"branches", Json::array()}};
  for (const auto& n : names) {
    Json one = Json::object();
    model::put_name(one, "branch", n);
    req["branches"].push_back(std::move(one));
  }
  return request(mnt, req);
}

}  // namespace

int cmd_hold(const std::string& cmd, const std::vector<std::string>& args) {
  auto p = parse(args, {}, {"--json"});
  if (!p) return usage_error(p.error().message());
  if (p->pos.size() < 2) return usage_error("usage: plyctl " + cmd + " IMAGE|MOUNTPOINT BRANCH... [--json]");
  const std::string& path = p->pos[0];
  const std::vector<std::string> names(p->pos.begin() + 1, p->pos.end());
  auto t = open_target(path, true);
  if (!t) return fail_on(path, t.error());
  const bool held = cmd == "hold";
  Result<Json> r = t->mnt.empty() ? offline_hold(std::move(t->o), names, held) : mounted_hold(t->mnt, cmd, names);
  if (!r) return t->mnt.empty() && r.error().code != ENOENT ? fail_on(path, r.error()) : fail(r.error().message());
  if (p->opt.count("--json")) {
    print_json(*r);
    return 0;
  }
  for (const auto& b : *r) {
    auto name = model::get_name(b, "name");
    std::printf("branch %s (id %llu) is %s\n", in_quotes(name ? *name : "?").c_str(),
                (unsigned long long)b.value("id", uint64_t(0)), b.value("held", false) ? "held" : "not held");
  }
  return 0;
}

}  // namespace plyfs::ctl
