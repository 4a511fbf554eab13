// plyctl policy list|set|test (plyctl.8): the placement rules of a volume of
// several devices (format.md#placement-rules), offline or through a mount's
// daemon.
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "cli.h"
#include "mount_client.h"
#include "output.h"
#include "snap/model.h"
#include "union/view.h"
#include "util/parse.h"
#include "util/progress.h"

namespace plyfs::ctl {

namespace {

std::string joined(const Json& list, const char* sep) {
  std::string out;
  for (const auto& c : list) out += (out.empty() ? "" : sep) + c.get<std::string>();
  return out;
}

void print_rules(const Json& r) {
  std::printf("classes (fastest first): %s\n", joined(r["classes"], ", ").c_str());
  if (r["rules"].empty()) {
    std::printf("no placement rules: data goes to the slowest class first, metadata to its class\n");
    return;
  }
  for (const auto& x : r["rules"])
    std::printf("%3llu  %s\n", (unsigned long long)x["rank"].get<uint64_t>(), x["rule"].get<std::string>().c_str());
  if (r.contains("migration")) {  // a mount's: files that crossed a rule since it began
    const Json& m = r["migration"];
    std::printf("moved since mounted: %llu files (%s), %llu failed, %llu waiting\n",
                (unsigned long long)m["files_moved"].get<uint64_t>(), format_size(m["moved_bytes"].get<uint64_t>()).c_str(),
                (unsigned long long)m["files_failed"].get<uint64_t>(), (unsigned long long)m["queued"].get<uint64_t>());
  }
}

// The rules a `set` gives: its arguments, or the lines of --file (blank
// lines and lines starting with '#' skipped).
Result<std::vector<std::string>> rule_texts(const Parsed& p) {
  std::vector<std::string> out(p.pos.begin() + 2, p.pos.end());
  if (auto f = p.opt.find("--file"); f != p.opt.end()) {
    if (!out.empty()) return Error::invalid("rules come from the arguments or from --file, not both");
    std::ifstream in(f->second);
    if (!in) return Error::sys(errno, "cannot read " + f->second);
    std::string line;
    while (std::getline(in, line)) {
      const size_t a = line.find_first_not_of(" \t\r");
      if (a == std::string::npos || line[a] == '#') continue;
      const size_t b = line.find_last_not_of(" \t\r");
      out.push_back(line.substr(a, b - a + 1));
    }
  }
  return out;
}

// A path in a mount: the mount's root (the topmost directory above it on
// the same filesystem) and the path below it ("/a/b"). The path need not
// exist: its nearest existing ancestor decides.
Result<std::pair<std::string, std::string>> mount_path(const std::string& path) {
  std::string have = path, rest;
  struct stat st {};
  for (;;) {
    if (::stat(have.c_str(), &st) == 0) break;
    if (errno != ENOENT) return Error::sys(errno, "cannot stat " + have);
    const size_t slash = have.find_last_of('/');
    std::string name = slash == std::string::npos ? have : have.substr(slash + 1);
    if (name.empty() || name == "." || name == "..") return Error::invalid("give the path of a file in a mount");
    rest = "/" + name + rest;
    have = slash == std::string::npos ? "." : slash == 0 ? "/" : have.substr(0, slash);
  }
  char* rp = ::realpath(have.c_str(), nullptr);
  if (!rp) return Error::sys(errno, "cannot resolve " + have);
  const std::string full = rp;
  std::free(rp);
  const std::string mnt = mount_root(full, st.st_dev);
  std::string inner = full.substr(mnt == "/" ? 0 : mnt.size()) + rest;
  if (inner.empty()) inner = "/";
  return std::make_pair(mnt, inner);
}

int test(const Parsed& p) {
  static const char* kUsage =
      "usage: plyctl policy test PATH SIZE [UID] [--gid GID] [--mode OCTAL] [--image IMAGE] [--json]";
  if (p.pos.size() < 3 || p.pos.size() > 4) return usage_error(kUsage);
  const std::string& path = p.pos[1];
  auto size = parse_size(p.pos[2]);
  if (!size) return usage_error(size.error().message());
  uint32_t uid = ::getuid(), gid = ::getgid(), mode = 0644;
  if (p.pos.size() == 4) {
    auto u = parse_uint(p.pos[3], "uid", 0, 0xffffffffu);
    if (!u) return usage_error(u.error().message());
    uid = uint32_t(*u);
  }
  if (auto g = p.opt.find("--gid"); g != p.opt.end()) {
    auto n = parse_uint(g->second, "gid", 0, 0xffffffffu);
    if (!n) return usage_error(n.error().message());
    gid = uint32_t(*n);
  }
  if (auto m = p.opt.find("--mode"); m != p.opt.end()) {
    char* end = nullptr;
    const unsigned long v = std::strtoul(m->second.c_str(), &end, 8);
    if (m->second.empty() || *end || v > 07777) return usage_error("invalid mode '" + m->second + "': octal, up to 7777");
    mode = uint32_t(v);
  }
  Result<Json> r = Error::invalid("");
  if (auto img = p.opt.find("--image"); img != p.opt.end()) {
    if (path.empty() || path[0] != '/') return usage_error("with --image, PATH is a path from the volume's root, as /dir/file");
    auto t = open_target(img->second, false);
    if (!t) return fail_on(img->second, t.error());
    if (!t->mnt.empty()) {
      r = request(t->mnt, Json{{"command", "policy-test"}, {"path", path}, {"size", *size}, {"uid", uid}, {"gid", gid}, {"mode", mode}});
    } else {
      auto rules = list_placement_rules(*t->o.vol);
      if (!rules) return fail_on(img->second, rules.error());
      r = model::policy_test(*t->o.vol, *rules, path, *size, uid, gid, S_IFREG | mode);
    }
    if (!r) return fail(img->second + ": " + r.error().message());
  } else {
    auto mp = mount_path(path);
    if (!mp) return fail(path + ": " + mp.error().message());
    r = request(mp->first, Json{{"command", "policy-test"}, {"path", mp->second}, {"size", *size}, {"uid", uid}, {"gid", gid}, {"mode", mode}});
    if (!r) return fail(path + ": " + r.error().message());
  }
  if (p.opt.count("--json")) {
    print_json(*r);
    return 0;
  }
  const Json& x = *r;
  std::printf("%s (%s, uid %u, gid %u, mode %04o): ", x["path"].get<std::string>().c_str(),
              format_size(*size).c_str(), uid, gid, mode);
  if (x["rule"].is_null()) std::printf("no rule matches, the default order: ");
  else std::printf("rule %llu (%s): ", (unsigned long long)x["rule"]["rank"].get<uint64_t>(),
                   x["rule"]["rule"].get<std::string>().c_str());
  std::printf("%s%s", joined(x["classes"], ", then ").c_str(), x["strict"].get<bool>() ? " only (strict)" : "");
  if (x.contains("stage"))
    std::printf(" (staged on %s, moved to %s once quiet)", x["stage"].get<std::string>().c_str(),
                x["rule"]["to"][0].get<std::string>().c_str());
  std::printf("\n");
  return 0;
}

// plyctl policy apply: every file of the mounted (or default) branch moved
// to its rule's first class.
int apply(const Parsed& p) {
  if (p.pos.size() != 2) return usage_error("usage: plyctl policy apply IMAGE|MOUNTPOINT [--json]");
  const std::string& target = p.pos[1];
  auto t = open_target(target, true);
  if (!t) return fail_on(target, t.error());
  Result<Json> r = Error::invalid("");
  if (!t->mnt.empty()) {
    Progress work("moving files to their rules' classes", 0, Progress::Unit::Count);
    r = request(t->mnt, Json{{"command", "policy-apply"}}, nullptr, &work);
    if (!r) return fail(target + ": " + r.error().message());
  } else {
    Volume& v = *t->o.vol;
    if (auto l = load_placement_rules(v); !l) return fail_on(target, l.error());
    auto stack = default_stack(v);
    if (!stack) return fail_on(target, stack.error());
    auto fs = Filesystem::open(v, stack->front().tree);
    if (!fs) return fail_on(target, fs.error());
    Progress prog("moving files to their rules' classes", 0, Progress::Unit::Count);
    auto st = (*fs)->migrate_all([&](uint64_t done, uint64_t total) {
      prog.set_total(total);
      prog.update(done);
    });
    if (prog.shown()) prog.finish();
    if (!st) return fail_on(target, st.error());
    fs->reset();
    r = model::policy_applied(v, *st);
    if (auto c = v.close(); !c) return fail_on(target, c.error());
  }
  if (p.opt.count("--json")) {
    print_json(*r);
  } else {
    std::printf("moved %llu files (%s)%s\n", (unsigned long long)(*r)["files_moved"].get<uint64_t>(),
                format_size((*r)["moved_bytes"].get<uint64_t>()).c_str(),
                (*r)["files_failed"].get<uint64_t>() ? "; some could not move (a full class?)" : "");
  }
  return 0;
}

}  // namespace

int cmd_policy(const std::string& sub, const std::vector<std::string>& args) {
  if (sub != "list" && sub != "set" && sub != "test" && sub != "apply")
    return usage_error("unknown policy subcommand '" + sub + "' (list, set, test, apply)");
  std::vector<std::string> a = args;
  a.insert(a.begin(), sub);
  auto p = parse(a, {"--file", "--gid", "--mode", "--image"}, {"--json"});
  if (!p) return usage_error(p.error().message());
  if (sub == "test") return test(*p);
  if (sub == "apply") return apply(*p);
  if (p->pos.size() < 2 || (sub == "list" && p->pos.size() != 2))
    return usage_error(sub == "list" ? "usage: plyctl policy list IMAGE|MOUNTPOINT [--json]"
                                     : "usage: plyctl policy set IMAGE|MOUNTPOINT [RULE...] [--file FILE] [--json]");
  const std::string& target = p->pos[1];
  std::vector<PlacementRule> rules;
  std::vector<std::string> texts;
  if (sub == "set") {
    auto tx = rule_texts(*p);
    if (!tx) return usage_error(tx.error().message());
    texts = *tx;
    for (size_t i = 0; i < texts.size(); i++) {
      auto r = parse_rule(texts[i]);
      if (!r) return usage_error("rule " + std::to_string(i + 1) + ": " + r.error().message());
      rules.push_back(std::move(*r));
    }
  }
  auto t = open_target(target, sub == "set");
  if (!t) return fail_on(target, t.error());
  Result<Json> r = Error::invalid("");
  if (!t->mnt.empty()) {
    r = sub == "list" ? request(t->mnt, Json{{"command", "policy"}})
                      : request(t->mnt, Json{{"command", "policy-set"}, {"rules", texts}});
    if (!r) return fail(target + ": " + r.error().message());
  } else {
    if (sub == "set") {
      // A rule the volume cannot follow (a class it lacks) is the caller's error.
      if (auto s = set_placement_rules(*t->o.vol, std::move(rules)); !s)
        return s.error().code == EINVAL || s.error().code == EOPNOTSUPP ? usage_error(target + ": " + s.error().message())
                                                                         : fail_on(target, s.error());
      if (auto c = t->o.vol->commit(); !c) return fail_on(target, c.error());
    }
    r = model::policy(*t->o.vol);
    if (!r) return fail_on(target, r.error());
  }
  if (p->opt.count("--json")) print_json(*r);
  else print_rules(*r);
  return 0;
}

}  // namespace plyfs::ctl
