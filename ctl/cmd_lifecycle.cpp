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

#include "fs/fs.h"
#include "mount_client.h"
#include "output.h"
#include "snap/model.h"
#include "union/view.h"
#include "util/progress.h"
#include "util/text.h"

namespace plyfs::ctl {

namespace {

std::string stack_text(const Json& stack) {
  std::string out;
  if (!stack.is_array()) return out;
  for (const auto& e : stack) {
    auto name = model::get_name(e, "branch");
    if (!out.empty()) out += ':';
    out += shown(name ? *name : "?");
    out += e.value("writable", false) ? "=rw" : "=ro";
  }
  return out;
}

std::string name_of(const Json& o, const char* key = "name") {
  auto n = model::get_name(o, key);
  return n ? *n : "?";
}

// A member of an answer, or null: what a daemon sends is read, not trusted.
Json member(const Json& o, const char* key) { return o.is_object() ? o.value(key, Json()) : Json(); }

// The text of a command's result object.
void print_text(const std::string& cmd, const Json& r, const std::string& arg) {
  if (cmd == "snapshot") {
    std::printf("snapshot %s taken; %s is a new layer on it: %s\n", in_quotes(name_of(member(r, "snapshot"))).c_str(),
                in_quotes(name_of(member(r, "live"))).c_str(), stack_text(member(r, "stack")).c_str());
  } else if (cmd == "clone") {
    std::printf("cloned %s as %s (id %llu)\n", in_quotes(arg).c_str(), in_quotes(name_of(r)).c_str(),
                (unsigned long long)r.value("id", uint64_t(0)));
  } else if (cmd == "merge") {
    std::printf("merged %s into the branch below it: %llu entries, %llu objects, %llu names removed\n",
                in_quotes(name_of(member(r, "merged"))).c_str(), (unsigned long long)r.value("entries", uint64_t(0)),
                (unsigned long long)r.value("objects", uint64_t(0)), (unsigned long long)r.value("removed", uint64_t(0)));
  } else if (cmd == "rollback") {
    std::printf("rolled back %s (now id %llu)\n", in_quotes(name_of(r)).c_str(), (unsigned long long)r.value("id", uint64_t(0)));
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
  if (p.opt.count("--view")) return usage_error("--view is for an image: a mount snapshots its own stack");
  Json req = {{"command", cmd}};
  if (cmd == "snapshot" && p.opt.count("--name")) model::put_name(req, "name", p.opt.at("--name"));
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
  {  // the progress line goes before an error is printed
    Progress prog("receiving the diff", 0, Progress::Unit::Bytes);
    r = request(pos[0], req, cmd == "diff" ? &prog : nullptr);
    if (r && prog.shown()) prog.finish();
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

Result<Json> offline_snapshot(Volume& v, const Parsed& p) {
  auto stack = PLY_TRY(p.opt.count("--view") ? view_stack(v, p.opt.at("--view")) : default_stack(v));
  std::string name;
  if (p.opt.count("--name")) {
    name = p.opt.at("--name");
  } else {
    auto top = std::find_if(stack.begin(), stack.end(), [](const ViewLayer& l) { return l.writable; });
    if (top == stack.end()) return Error::io(EROFS, "the stack has no writable branch");
    name = PLY_TRY(snapshot_name(v, PLY_TRY(Filesystem::branch(v, top->tree)).name));
  }
  Snapshot s = PLY_TRY(snapshot(v, stack, name));
  Json out = model::snapshot(PLY_TRY(model::Branches::read(v)), s);
  PLY_CHECK(v.close());
  return out;
}

Result<Json> offline_merge(Volume& v, const std::string& name) {
  BranchMeta b = PLY_TRY(find_branch(v, name));
  Merge m;
  {
    Progress prog("merging " + shown(b.name), 0, Progress::Unit::Count, "entries");
    m = PLY_TRY(merge(v, b.tree, nullptr, [&](const MergeStats& st) { prog.update(st.entries); }));
    if (prog.shown()) prog.finish();
  }
  Progress prog("freeing the replaced branches", 0, Progress::Unit::Count, "nodes");
  (void)PLY_TRY(drop_doomed(v, [&](const BTree::DropStats& st) { prog.update(st.nodes); }));
  if (prog.shown()) prog.finish();
  Json out = model::merge(PLY_TRY(model::Branches::read(v)), m);
  PLY_CHECK(v.close());
  return out;
}

Result<Json> offline_rollback(Volume& v, const std::string& name) {
  BranchMeta b = PLY_TRY(find_branch(v, name));
  BranchMeta fresh = PLY_TRY(rollback(v, b.tree));
  Progress prog("freeing the old layer", 0, Progress::Unit::Count, "nodes");
  (void)PLY_TRY(drop_doomed(v, [&](const BTree::DropStats& st) { prog.update(st.nodes); }));
  if (prog.shown()) prog.finish();
  auto bs = PLY_TRY(model::Branches::read(v));
  Json out = bs.branch(*bs.find(fresh.tree));
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
    d = diff(v, a->tree, b->tree, [&](uint64_t n) { prog.update(n); });
    if (d && prog.shown()) prog.finish();
  }
  if (!d) return fail_on(image, d.error());
  return print_diff(*d, json, nul);
}

}  // namespace

int cmd_lifecycle(const std::string& cmd, const std::vector<std::string>& args) {
  auto p = parse(args, {"--view", "--name"}, {"--json", "--ro", "-z"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  auto has = [&](const char* o) { return p->opt.count(o) > 0; };
  const bool json = has("--json");
  static const std::map<std::string, std::pair<std::string, size_t>> kUsage = {
      {"snapshot", {"snapshot IMAGE|MOUNTPOINT [--view V] [--name SNAP] [--json]", 1}},
      {"clone", {"clone IMAGE|MOUNTPOINT SRC NAME [--ro] [--json]", 3}},
      {"merge", {"merge IMAGE|MOUNTPOINT BRANCH [--json]", 2}},
      {"rollback", {"rollback IMAGE|MOUNTPOINT BRANCH [--json]", 2}},
      {"delete", {"delete IMAGE|MOUNTPOINT BRANCH [--json]", 2}},
      {"diff", {"diff IMAGE|MOUNTPOINT FROM TO [-z | --json]", 3}}};
  const auto& [use, npos] = kUsage.at(cmd);
  if (pos.size() != npos || (has("--view") && cmd != "snapshot") || (has("--name") && cmd != "snapshot") ||
      (has("--ro") && cmd != "clone") || (has("-z") && (cmd != "diff" || json)))
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
                   : cmd == "rollback" ? offline_rollback(v, pos[1])
                                       : offline_clone(v, pos[1], pos[2], has("--ro"));
  if (!r) return fail_on(pos[0], r.error());
  if (json) print_json(*r);
  else print_text(cmd, *r, cmd == "clone" ? pos[1] : "");
  return 0;
}

}  // namespace plyfs::ctl
