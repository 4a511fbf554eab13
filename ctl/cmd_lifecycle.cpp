// plyctl snapshot, clone, merge, rollback, delete and diff, on an image or
// a mount point (format.md#snapshots). Either way a command ends with one
// object of the JSON model (snap/model.h): the daemon answers with the
// object plyctl makes offline, and the text is printed from that object, so
// that a command prints the same whether it ran on an image or on a mount.
#include "cli.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "fs/fs.h"
#include "mount_client.h"
#include "output.h"
#include "snap/model.h"
#include "union/view.h"
#include "util/progress.h"
#include "util/text.h"

namespace plyfs::ctl {

namespace {

std::string name_of(const Json& o, const char* key = "name") {
  auto n = model::get_name(o, key);
  return n ? *n : "?";
}

// A member of an answer, or null: what a daemon sends is read, not trusted.
Json member(const Json& o, const char* key) { return o.is_object() ? o.value(key, Json()) : Json(); }

// The text of a command's result object.
void print_text(const std::string& cmd, const Json& r, const std::string& arg) {
  if (cmd == "snapshot") {
    std::printf("snapshot %s of %s taken\n", in_quotes(name_of(member(r, "snapshot"))).c_str(),
                in_quotes(name_of(member(r, "live"))).c_str());
  } else if (cmd == "clone") {
    std::printf("cloned %s as %s (id %llu)\n", in_quotes(arg).c_str(), in_quotes(name_of(r)).c_str(),
                (unsigned long long)r.value("id", uint64_t(0)));
  } else if (cmd == "merge") {
    std::printf("merged %s into the branch below it: %llu entries, %llu objects, %llu names removed\n",
                in_quotes(name_of(member(r, "merged"))).c_str(), (unsigned long long)r.value("entries", uint64_t(0)),
                (unsigned long long)r.value("objects", uint64_t(0)), (unsigned long long)r.value("removed", uint64_t(0)));
  } else if (cmd == "rollback") {
    const Json to = member(r, "to");
    std::printf("rolled back %s %s\n", in_quotes(name_of(member(r, "branch"))).c_str(),
                to.is_object() ? ("to " + in_quotes(name_of(to, "branch"))).c_str() : "to empty (a layer without snapshots)");
  } else if (cmd == "delete") {
    std::printf("deleted branch %s (id %llu)\n", in_quotes(name_of(r)).c_str(), (unsigned long long)r.value("id", uint64_t(0)));
  }
}

// A diff, from either side, in the form asked for.
int print_diff(const std::vector<DiffEntry>& d, bool json, bool nul) {
  if (json) {
    print_json(model::diff(d));
    return 0;
  }
  const std::string text = model::diff_text(d, nul);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

// The commands on a mount point: a request to its daemon after flushing
// what the kernel holds, so that a snapshot or diff holds every write made
// before the command.
int mounted(const std::string& cmd, const Parsed& p, bool json, bool nul) {
  const auto& pos = p.pos;
  if (p.opt.count("--view") || p.opt.count("--branch"))
    return usage_error("--view is for an image, and so is --branch: a mount snapshots its writable branch");
  Json req = {{"command", cmd}};
  if (cmd == "snapshot" && p.opt.count("--name")) model::put_name(req, "name", p.opt.at("--name"));
  if (cmd == "rollback" && p.opt.count("--to")) model::put_name(req, "to", p.opt.at("--to"));
  if (cmd == "clone") {
    model::put_name(req, "source", pos[1]);
    model::put_name(req, "name", pos[2]);
    req["writable"] = !p.opt.count("--ro");
  } else if (cmd == "diff") {
    model::put_name(req, "from", pos[1]);
    model::put_name(req, "to", pos[2]);
  } else if (cmd != "snapshot") {
    model::put_name(req, "branch", pos[1]);
  }
  sync_mount(pos[0]);
  Result<Json> r = Error::invalid("");
  {  // the progress lines go before an error is printed
    // The long commands' line as offline (but for the name as given, which
    // the daemon resolves), from what the daemon says; then a diff's bytes
    // as they come.
    const bool long_one = cmd == "merge" || cmd == "delete" || cmd == "rollback" || cmd == "diff";
    std::string what, noun;
    if (cmd == "merge") what = "merging ", noun = "entries";
    if (cmd == "delete") what = "deleting ", noun = "nodes";
    if (cmd == "rollback") what = "rolling back ";
    if (cmd == "diff") {
      what = "comparing ";
      what += shown(pos[1]);
      what += " and ";
      noun = "changes";
    }
    if (long_one) what += shown(pos[cmd == "diff" ? 2 : 1]);
    Progress work(what, 0, Progress::Unit::Count, noun);
    Progress prog("receiving the diff", 0, Progress::Unit::Bytes);
    r = request(pos[0], req, cmd == "diff" ? &prog : nullptr, long_one ? &work : nullptr);
  }
  if (!r) return fail(r.error().message());
  if (cmd == "diff") {
    if (json) {  // the daemon's objects are the model's: printed as they came
      print_json(*r);
      return 0;
    }
    auto d = model::parse_diff(*r);
    if (!d) return fail(pos[0] + ": " + d.error().message());
    return print_diff(*d, false, nul);
  }
  if (json) print_json(*r);
  else print_text(cmd, *r, cmd == "clone" ? pos[1] : "");
  return 0;
}

// A snapshot of a named branch (--branch), or of a stack's writable branch
// (--view V, or the stack a plain mount shows).
Result<Json> offline_snapshot(Volume& v, const Parsed& p) {
  TreeId target;
  if (p.opt.count("--branch"))
    target = PLY_TRY(find_branch(v, p.opt.at("--branch"))).tree;
  else
    target = PLY_TRY(snapshot_target(PLY_TRY(p.opt.count("--view") ? view_stack(v, p.opt.at("--view")) : default_stack(v))));
  std::string name;
  if (p.opt.count("--name")) name = p.opt.at("--name");
  else name = PLY_TRY(snapshot_name(v, PLY_TRY(Filesystem::branch(v, target)).name));
  Snapshot s = PLY_TRY(snapshot(v, target, name));
  Json out = model::snapshot(PLY_TRY(model::Branches::read(v)), s);
  PLY_CHECK(v.close());
  return out;
}

Result<Json> offline_merge(Volume& v, const std::string& name) {
  BranchMeta b = PLY_TRY(find_branch(v, name));
  Merge m;
  {
    Progress prog("merging " + shown(b.name), 0, Progress::Unit::Count, "entries");
    m = PLY_TRY(merge(v, b.tree, nullptr, [&](const MergeStats& st) { prog.update(st.entries, st.fraction); }));
    if (prog.shown()) prog.finish();
  }
  Progress prog("freeing the replaced branches", 0, Progress::Unit::Count, "nodes");
  (void)PLY_TRY(drop_doomed(v, [&](const BTree::DropStats& st) { prog.update(st.nodes, st.fraction); }));
  if (prog.shown()) prog.finish();
  Json out = model::merge(PLY_TRY(model::Branches::read(v)), m);
  PLY_CHECK(v.close());
  return out;
}

Result<Json> offline_rollback(Volume& v, const std::string& name, const std::optional<std::string>& to) {
  BranchMeta b = PLY_TRY(find_branch(v, name));
  std::optional<TreeId> target;
  if (to) target = PLY_TRY(find_branch(v, *to)).tree;
  Rollback rb = PLY_TRY(rollback(v, b.tree, target));
  Progress prog("freeing what the rollback discarded", 0, Progress::Unit::Count, "nodes");
  (void)PLY_TRY(drop_doomed(v, [&](const BTree::DropStats& st) { prog.update(st.nodes, st.fraction); }));
  if (prog.shown()) prog.finish();
  Json out = model::rollback(PLY_TRY(model::Branches::read(v)), rb);
  PLY_CHECK(v.close());
  return out;
}

Result<Json> offline_clone(Volume& v, const std::string& src, const std::string& name, bool ro) {
  BranchMeta s = PLY_TRY(find_branch(v, src));
  BranchMeta c = PLY_TRY(clone_branch(v, s.tree, name, ro));
  auto bs = PLY_TRY(model::Branches::read(v));
  Json out = bs.branch(*bs.find(c.tree));
  PLY_CHECK(v.close());
  return out;
}

int offline_diff(const std::string& image, const std::string& from, const std::string& to, bool json, bool nul) {
  auto o = open_volume(image, false);
  if (!o) return fail_on(image, o.error());
  Volume& v = *o->vol;
  auto a = find_branch(v, from);
  if (!a) return fail(a.error().message());
  auto b = find_branch(v, to);
  if (!b) return fail(b.error().message());
  Result<std::vector<DiffEntry>> d = Error::invalid("");
  {  // the progress line goes before an error is printed
    Progress prog("comparing " + shown(a->name) + " and " + shown(b->name), 0, Progress::Unit::Count, "changes");
    d = diff(v, a->tree, b->tree, [&](const DiffStats& st) { prog.update(st.entries, st.fraction); });
    if (d && prog.shown()) prog.finish();
  }
  if (!d) return fail_on(image, d.error());
  return print_diff(*d, json, nul);
}

}  // namespace

int cmd_lifecycle(const std::string& cmd, const std::vector<std::string>& args) {
  auto p = parse(args, {"--view", "--name", "--branch", "--to"}, {"--json", "--ro", "-z"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  auto has = [&](const char* o) { return p->opt.count(o) > 0; };
  const bool json = has("--json");
  static const std::map<std::string, std::pair<std::string, size_t>> kUsage = {
      {"snapshot", {"snapshot IMAGE|MOUNTPOINT [--view V | --branch B] [--name SNAP] [--json]", 1}},
      {"clone", {"clone IMAGE|MOUNTPOINT SRC NAME [--ro] [--json]", 3}},
      {"merge", {"merge IMAGE|MOUNTPOINT BRANCH [--json]", 2}},
      {"rollback", {"rollback IMAGE|MOUNTPOINT BRANCH [--to SNAP] [--json]", 2}},
      {"delete", {"delete IMAGE|MOUNTPOINT BRANCH [--json]", 2}},
      {"diff", {"diff IMAGE|MOUNTPOINT FROM TO [-z | --json]", 3}}};
  const auto& [use, npos] = kUsage.at(cmd);
  if (pos.size() != npos || ((has("--view") || has("--branch")) && cmd != "snapshot") ||
      (has("--view") && has("--branch")) || (has("--name") && cmd != "snapshot") ||
      (has("--to") && cmd != "rollback") || (has("--ro") && cmd != "clone") || (has("-z") && (cmd != "diff" || json)))
    return usage_error("usage: plyctl " + use);
  // A new name is checked before anything is opened, the same on an image
  // and on a mount.
  if (cmd == "clone")
    if (auto n = check_branch_name(pos[2]); !n) return fail(n.error().message());
  if (cmd == "snapshot" && has("--name"))
    if (auto n = check_branch_name(p->opt.at("--name"), "snapshot"); !n) return fail(n.error().message());
  if (is_directory(pos[0])) return mounted(cmd, *p, json, has("-z"));
  if (cmd == "diff") return offline_diff(pos[0], pos[1], pos[2], json, has("-z"));
  if (cmd == "delete") return remove_branch(pos[0], pos[1], json);
  auto o = open_volume(pos[0], true);
  if (!o) return fail_on(pos[0], o.error());
  Volume& v = *o->vol;
  Result<Json> r = cmd == "snapshot" ? offline_snapshot(v, *p)
                   : cmd == "merge"  ? offline_merge(v, pos[1])
                   : cmd == "rollback" ? offline_rollback(v, pos[1], has("--to") ? std::optional(p->opt.at("--to")) : std::nullopt)
                                       : offline_clone(v, pos[1], pos[2], has("--ro"));
  if (!r) return fail_on(pos[0], r.error());
  if (json) print_json(*r);
  else print_text(cmd, *r, cmd == "clone" ? pos[1] : "");
  return 0;
}

}  // namespace plyfs::ctl
