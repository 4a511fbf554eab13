// plyctl branch and layer: the branch table of an image (offline, or from
// the daemon of the mount serving it), and the stack of a mount (through
// its control channel, fuse/control.h).
#include "cli.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "fs/fs.h"
#include "mount_client.h"
#include "output.h"
#include "snap/model.h"
#include "snap/snap.h"
#include "union/view.h"
#include "util/parse.h"
#include "util/text.h"

namespace plyfs::ctl {

namespace {

// The first view that shows branch `t` (writable, if `writing`).
Result<std::optional<std::string>> view_using(Volume& v, TreeId t, bool writing) {
  for (auto& view : PLY_TRY(list_views(v)))
    for (auto& l : view.layers)
      if (l.tree == t && (l.writable || !writing)) return std::optional<std::string>(view.name);
  return std::optional<std::string>{};
}

// What a command that made or changed one branch prints, the Branch
// object or `verb "NAME" (id N)`, read before the image is closed (which
// commits), and printed if that succeeds.
int close_and_print(const std::string& image, Volume& v, TreeId tree, bool json, const std::string& verb) {
  auto bs = model::Branches::read(v);
  if (!bs) return fail_on(image, bs.error());
  const BranchMeta* b = bs->find(tree);
  if (!b) return fail("the branch is gone");
  const Json o = bs->branch(*b);
  if (auto r = v.close(); !r) return fail_on(image, r.error());
  if (json) print_json(o);
  else std::printf("%s %s (id %llu)\n", verb.c_str(), in_quotes(b->name).c_str(), (unsigned long long)b->tree.v);
  return 0;
}

int list_branches(const std::string& path, bool json);
Result<QuotaChange> quota_options(const Parsed& p);
int set_quota_cmd(const std::string& path, const std::string& name, const QuotaChange& q,
                  const std::optional<std::string>& compress, bool json);
Result<std::optional<std::string>> compress_option(const Parsed& p);

// The branch commands on a mount point: the daemon answers with the stack.
int mounted_branch(const std::string& sub, const Parsed& p) {
  const auto& pos = p.pos;
  auto has = [&](const char* o) { return p.opt.count(o) > 0; };
  Json req = {{"command", sub}};
  if (sub == "list") {
    if (pos.size() != 1 || has("--save")) return usage_error("usage: plyctl branch list MOUNTPOINT [--all] [--json]");
    if (has("--all")) return list_branches(pos[0], has("--json"));
  } else if (has("--all")) {
    return usage_error("--all is for branch list MOUNTPOINT");
  } else if (sub == "add") {
    if (pos.size() != 2 || has("--rw") || has("--clone") || has("--parent") || has("--name"))
      return usage_error("usage: plyctl branch add MOUNTPOINT NAME [--at POS] [--ro] [--save] [--json]");
    auto at = parse_uint(has("--at") ? p.opt.at("--at") : "0", "position", 0, kMaxViewLayers);
    if (!at) return usage_error(at.error().message());
    req["position"] = *at;
    req["writable"] = !has("--ro");
  } else if (sub == "remove") {
    if (pos.size() != 2 || p.opt.size() > size_t(has("--json") + has("--save")))
      return usage_error("usage: plyctl branch remove MOUNTPOINT NAME [--save] [--json]");
  } else if (sub == "set") {
    const bool quota = has("--quota") || has("--exclusive-quota") || has("--compress");
    if (quota && !has("--ro") && !has("--rw") && !has("--save") && !has("--name") && pos.size() == 2) {
      auto q = quota_options(p);
      if (!q) return usage_error(q.error().message());
      auto z = compress_option(p);
      if (!z) return usage_error(z.error().message());
      return set_quota_cmd(pos[0], pos[1], *q, *z, has("--json"));
    }
    if (pos.size() != 2 || has("--ro") == has("--rw") || has("--name") || quota)
      return usage_error("usage: plyctl branch set MOUNTPOINT NAME --ro | --rw [--save] [--json], or "
                         "NAME [--quota SIZE|none] [--exclusive-quota SIZE|none] [--compress zstd[:N]|none|default] [--json]");
    req["writable"] = has("--rw");
  } else if (sub == "move") {
    if (pos.size() != 3) return usage_error("usage: plyctl branch move MOUNTPOINT NAME POS [--save] [--json]");
    auto at = parse_uint(pos[2], "position", 0, kMaxViewLayers);
    if (!at) return usage_error(at.error().message());
    req["position"] = *at;
  } else if (sub == "create") {
    return need_image("branch create", pos[0], "mkdir MOUNTPOINT/.plyfs/layers/NAME makes a layer on the "
                                               "branch the mount writes to, and plyctl clone MOUNTPOINT a clone");
  } else {
    return usage_error("unknown branch subcommand '" + sub + "' (list, add, remove, set, move)");
  }
  if (pos.size() >= 2) model::put_name(req, "branch", pos[1]);
  // Only asked for: a daemon before --save refuses no request without it.
  if (has("--save")) req["save"] = true;
  auto r = request(pos[0], req);
  if (!r) return fail(r.error().message());
  if (has("--json")) {
    print_json(*r);
    return 0;
  }
  std::string text;
  if (!r->is_array()) return fail(pos[0] + ": the daemon's answer is not a stack");
  for (const auto& e : *r) {
    auto name = model::get_name(e, "branch");
    if (!text.empty()) text += ':';
    text += shown(name ? *name : "?");
    text += e.value("writable", false) ? "=rw" : "=ro";
  }
  std::printf("%s\n", text.c_str());
  return 0;
}

// The image's [Branch]: read here, or answered by the daemon of the mount
// point `path` or of the mount serving image `path`. 0, or the exit status
// after the error is printed.
int read_branches(const std::string& path, Json& out) {
  auto t = open_target(path, false);
  if (!t) return fail_on(path, t.error());
  if (!t->mnt.empty()) {
    auto r = request(t->mnt, Json{{"command", "branches"}});
    if (!r) return fail(r.error().message());
    if (!r->is_array()) return fail(t->mnt + ": the daemon's answer is not a list of branches");
    out = std::move(*r);
    return 0;
  }
  auto bs = model::Branches::read(*t->o.vol, true);
  if (!bs) return fail_on(path, bs.error());
  out = Json::array();
  for (const auto& b : bs->all()) out.push_back(bs->branch(b));
  return 0;
}

int list_branches(const std::string& path, bool json) {
  Json a;
  if (int rc = read_branches(path, a)) return rc;
  if (json) print_json(a);
  else print_branch_table(a);
  return 0;
}

int create_branch_cmd(const Parsed& p) {
  const auto& pos = p.pos;
  auto has = [&](const char* o) { return p.opt.count(o) > 0; };
  if (pos.size() != 2 || (has("--clone") && has("--parent")) || has("--rw") || has("--name"))
    return usage_error("usage: plyctl branch create IMAGE NAME [--clone SRC | --parent P] [--ro] [--json]");
  // Checked before the image is opened: a bad name is the user's typo.
  if (auto n = check_branch_name(pos[1]); !n) return fail(n.error().message());
  auto o = open_volume(pos[0], true);
  if (!o) return fail_on(pos[0], o.error());
  Volume& v = *o->vol;
  const bool ro = has("--ro");
  Result<BranchMeta> made = Error::invalid("");
  if (has("--clone")) {
    auto src = find_branch(v, p.opt.at("--clone"));
    if (!src) return fail(src.error().message());
    made = clone_branch(v, src->tree, pos[1], ro);
  } else if (has("--parent")) {
    // The same function makes a layer online (mkdir in the control folder).
    auto par = find_branch(v, p.opt.at("--parent"));
    if (!par) return fail(par.error().message());
    made = create_layer(v, pos[1], par->tree, ro);
  } else {
    made = create_branch(v, pos[1], ro);
  }
  if (!made) return fail(made.error().message());
  return close_and_print(pos[0], v, made->tree, has("--json"), "created branch");
}

// branch remove, layer delete and delete: the branch as it was.
int remove_branch_cmd(const std::string& image, const std::string& name, bool json) {
  auto o = open_volume(image, true);
  if (!o) return fail_on(image, o.error());
  Volume& v = *o->vol;
  auto b = find_branch(v, name);
  if (!b) return fail(b.error().message());
  auto bs = model::Branches::read(v);
  if (!bs) return fail_on(image, bs.error());
  const Json was = bs->branch(*bs->find(b->tree));
  Result<void> r = ok();
  {  // the progress line goes before an error is printed
    Progress prog("deleting " + shown(b->name), 0, Progress::Unit::Count, "nodes");
    r = delete_branch(v, b->tree, [&](const BTree::DropStats& st) { prog.update(st.nodes, st.fraction); });
    if (r && prog.shown()) prog.finish();
  }
  if (!r) return fail(r.error().message());
  if (auto r = v.close(); !r) return fail_on(image, r.error());
  if (json) print_json(was);
  else std::printf("deleted branch %s (id %llu)\n", in_quotes(b->name).c_str(), (unsigned long long)b->tree.v);
  return 0;
}

// --quota and --exclusive-quota (format.md#quotas): a size, or none (0).
Result<QuotaChange> quota_options(const Parsed& p) {
  QuotaChange q;
  for (const char* k : {"--quota", "--exclusive-quota"}) {
    auto it = p.opt.find(k);
    if (it == p.opt.end()) continue;
    const uint64_t n = it->second == "none" ? 0 : PLY_TRY(parse_size(it->second, "quota"));
    (k[2] == 'q' ? q.referenced : q.exclusive) = n;
  }
  return q;
}

// --compress (format.md#fs-compress): zstd, zstd:LEVEL, none, or default
// (none given: the mount's), checked here.
Result<std::optional<std::string>> compress_option(const Parsed& p) {
  auto it = p.opt.find("--compress");
  if (it == p.opt.end()) return std::optional<std::string>();
  if (it->second == "default") return std::optional<std::string>("default");
  return std::optional<std::string>(compression_name(PLY_TRY(parse_compression(it->second))));
}

// A quota or a compression default alone, on an image or through the
// daemon of the mount serving it: the Branch after.
int set_quota_cmd(const std::string& path, const std::string& name, const QuotaChange& q,
                  const std::optional<std::string>& compress, bool json) {
  auto t = open_target(path, true);
  if (!t) return fail_on(path, t.error());
  Result<Json> r = Json();
  if (!t->mnt.empty()) {
    Json req{{"command", "quota"}};
    model::put_name(req, "branch", name);
    if (q.referenced) req["referenced"] = *q.referenced;
    if (q.exclusive) req["exclusive"] = *q.exclusive;
    if (compress) req["compress"] = *compress;
    r = request(t->mnt, req);
    if (!r) return fail(r.error().message());
  } else {
    Volume& v = *t->o.vol;
    auto b = find_branch(v, name);
    if (!b) return fail(b.error().message());
    if (q.referenced || q.exclusive)
      if (auto s = set_quota(v, b->tree, q); !s) return fail_on(path, s.error());
    if (compress) {
      auto m = Filesystem::branch(v, b->tree);
      if (!m) return fail_on(path, m.error());
      m->compress = *compress == "default" ? Compression{} : *parse_compression(*compress);
      if (auto s = Filesystem::set_branch(v, *m); !s) return fail_on(path, s.error());
    }
    return close_and_print(path, v, b->tree, json, "changed branch");
  }
  if (json) print_json(*r);
  else if (auto n = model::get_name(*r, "name"))
    std::printf("changed branch %s (id %llu)\n", in_quotes(*n).c_str(), (unsigned long long)r->value("id", uint64_t(0)));
  return 0;
}

int set_branch_cmd(const Parsed& p) {
  const auto& pos = p.pos;
  auto has = [&](const char* o) { return p.opt.count(o) > 0; };
  if (pos.size() != 2 || (has("--ro") && has("--rw")) || has("--clone") || has("--parent"))
    return usage_error("usage: plyctl branch set IMAGE NAME [--name NEW] [--ro | --rw] [--quota SIZE|none] "
                       "[--exclusive-quota SIZE|none] [--compress zstd[:N]|none|default] [--json]");
  if (has("--name"))
    if (auto n = check_branch_name(p.opt.at("--name")); !n) return fail(n.error().message());
  auto q = quota_options(p);
  if (!q) return usage_error(q.error().message());
  auto z = compress_option(p);
  if (!z) return usage_error(z.error().message());
  // A quota or compression default alone may go to a mounted image's
  // daemon; a rename or a flag changes the catalog offline only.
  if ((q->referenced || q->exclusive || *z) && !has("--name") && !has("--ro") && !has("--rw"))
    return set_quota_cmd(pos[0], pos[1], *q, *z, has("--json"));
  auto o = open_volume(pos[0], true);
  if (!o) return fail_on(pos[0], o.error());
  Volume& v = *o->vol;
  auto b = find_branch(v, pos[1]);
  if (!b) return fail(b.error().message());
  if (has("--name")) {
    // By name only (find_branch also takes ids): the name must be free.
    auto all = Filesystem::branches(v);
    if (!all) return fail_on(pos[0], all.error());
    const std::string& to = p.opt.at("--name");
    for (const auto& x : *all)
      if (!x.doomed && x.name == to && x.tree != b->tree) return fail("a branch named " + in_quotes(to) + " exists");
    b->name = to;
  }
  if (has("--ro")) b->read_only = true;
  if (has("--rw")) b->read_only = false;
  if (q->referenced) b->quota_referenced = *q->referenced;
  if (q->exclusive) b->quota_exclusive = *q->exclusive;
  if (*z) b->compress = **z == "default" ? Compression{} : *parse_compression(**z);
  if (b->read_only) {
    auto used = view_using(v, b->tree, true);
    if (!used) return fail(used.error().message());
    if (*used)
      return fail("view " + in_quotes(**used) + " writes to this branch: make the view show it read-only first "
                  "(plyctl view create IMAGE VIEW STACK)");
  }
  // One transaction: the new name and flag land together.
  if (auto r = Filesystem::set_branch(v, *b); !r) return fail(r.error().message());
  return close_and_print(pos[0], v, b->tree, has("--json"), "changed branch");
}

}  // namespace

int remove_branch(const std::string& image, const std::string& name, bool json) {
  return remove_branch_cmd(image, name, json);
}

int cmd_branch(const std::string& sub, const std::vector<std::string>& args) {
  auto p = parse(args, {"--clone", "--parent", "--name", "--at", "--quota", "--exclusive-quota", "--compress"},
                 {"--json", "--ro", "--rw", "--save", "--all"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  auto has = [&](const char* o) { return p->opt.count(o) > 0; };
  if ((has("--quota") || has("--exclusive-quota") || has("--compress")) && sub != "set")
    return usage_error("--quota, --exclusive-quota and --compress are for branch set");
  if (!pos.empty() && is_directory(pos[0])) return mounted_branch(sub, *p);
  if (has("--save"))
    return usage_error("--save is for a mount point; on an image, plyctl view create IMAGE VIEW STACK saves a stack");
  if (has("--all")) return usage_error("--all is for a mount point: branch list IMAGE lists every branch");
  if (sub == "add" || sub == "move") {
    if (pos.empty()) return usage_error("usage: plyctl branch " + sub + " MOUNTPOINT NAME ...");
    return need_mount("branch " + sub, pos[0],
                      "a view saves a stack for mounts: plyctl view create IMAGE VIEW STACK, then "
                      "plyfs -o view=VIEW");
  }
  if (has("--at")) return usage_error("--at is for a mount point");
  if (sub == "list") {
    if (pos.size() != 1 || p->opt.size() > has("--json")) return usage_error("usage: plyctl branch list IMAGE|MOUNTPOINT [--json]");
    return list_branches(pos[0], has("--json"));
  }
  if (sub == "create") return create_branch_cmd(*p);
  if (sub == "remove") {
    if (pos.size() != 2 || p->opt.size() > has("--json"))
      return usage_error("usage: plyctl branch remove IMAGE|MOUNTPOINT NAME [--json]");
    return remove_branch_cmd(pos[0], pos[1], has("--json"));
  }
  if (sub == "set") return set_branch_cmd(*p);
  return usage_error("unknown branch subcommand '" + sub + "' (list, create, remove, set, add, move)");
}

// OLFS layer trees: layers are branches made empty over a parent; the
// commands are the branch ones with the tree shown as a tree.
int cmd_layer(const std::string& sub, const std::vector<std::string>& args) {
  auto p = parse(args, {"--on"}, {"--json", "--ro"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  auto has = [&](const char* o) { return p->opt.count(o) > 0; };
  if (!pos.empty() && is_directory(pos[0]) && sub != "list")
    return need_image("layer " + sub, pos[0], "the layers are the folders of MOUNTPOINT/.plyfs/layers/");
  if (sub == "create") {
    if (pos.size() != 2 || !has("--on"))
      return usage_error("usage: plyctl layer create IMAGE NAME --on PARENT [--ro] [--json]");
    std::vector<std::string> a{"--parent", p->opt.at("--on")};
    if (has("--ro")) a.push_back("--ro");
    if (has("--json")) a.push_back("--json");
    a.insert(a.end(), {"--", pos[0], pos[1]});  // names stay names
    return cmd_branch("create", a);
  }
  if (sub == "delete") {
    if (pos.size() != 2 || has("--on") || has("--ro"))
      return usage_error("usage: plyctl layer delete IMAGE NAME [--json]");
    return remove_branch_cmd(pos[0], pos[1], has("--json"));
  }
  if (sub != "list") return usage_error("unknown layer subcommand '" + sub + "' (list, create, delete)");
  if (pos.size() != 1 || has("--on") || has("--ro"))
    return usage_error("usage: plyctl layer list IMAGE|MOUNTPOINT [--json]");
  Json a;
  if (int rc = read_branches(pos[0], a)) return rc;
  if (has("--json")) print_json(a);
  else print_layer_tree(a);
  return 0;
}

}  // namespace plyfs::ctl
