// plyctl sync: makes what a mount holds durable (issue 24). On this kernel
// a FUSE mount is sent no FUSE_SYNCFS (the kernel sends it only when the
// connection asks for it, which only virtiofs does), so sync -f and
// syncfs(2) flush the kernel's cached writes to the daemon and stop there;
// plyctl sync does the same syncfs and then asks the daemon to commit
// (control.h, `sync`). An image that no mount serves holds only durable
// generations: there is nothing to do but say which is the newest.
#include "cli.h"

#include <cstdio>

#include "mount_client.h"
#include "output.h"

namespace plyfs::ctl {

int cmd_sync(const std::vector<std::string>& args) {
  auto p = parse(args, {}, {"--json"});
  if (!p) return usage_error(p.error().message());
  if (p->pos.size() != 1) return usage_error("usage: plyctl sync IMAGE|MOUNTPOINT [--json]");
  const std::string& path = p->pos[0];
  auto t = open_target(path, false);
  if (!t) return fail_on(path, t.error());
  Json o;
  if (t->mnt.empty()) {
    o = Json{{"generation", t->o.vol->super().generation.v}};
  } else {
    // The kernel's cached writes reach the daemon first, then it commits.
    if (auto s = syncfs_mount(t->mnt); !s) return fail(s.error().message());
    auto r = request(t->mnt, Json{{"command", "sync"}});
    if (!r) return fail(r.error().message());
    if (!r->is_object() || !r->contains("generation") || !(*r)["generation"].is_number_unsigned())
      return fail(t->mnt + ": the daemon's answer is not understood");
    o = std::move(*r);
  }
  if (p->opt.count("--json")) print_json(o);
  else std::printf("generation %llu is durable\n", (unsigned long long)o["generation"].get<uint64_t>());
  return 0;
}

}  // namespace plyfs::ctl
