// plyctl branch, layer and view: the branch table and the catalog of
// views on an image, and the stack of a mount (through its control channel).
#include "cli.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>

#include "fs/fs.h"
#include "mount_client.h"
#include "snap/snap.h"
#include "union/view.h"
#include "util/json.h"

namespace plyfs::ctl {

namespace {

// The first view that shows branch `t` (writable, if `writing`).
Result<std::optional<std::string>> view_using(Volume& v, TreeId t, bool writing) {
  for (auto& view : PLY_TRY(list_views(v)))
    for (auto& l : view.layers)
      if (l.tree == t && (l.writable || !writing)) return std::optional<std::string>(view.name);
  return std::optional<std::string>{};
}

// The branch commands on a mount point.
int cmd_mounted_branch(const std::string& sub, const Parsed& p) {
  const auto& pos = p.pos;
  auto has = [&](const char* o) { return p.opt.count(o) > 0; };
  std::string req;
  if (sub == "list") {
    if (pos.size() != 1) return usage_error("usage: plyctl branch list MOUNTPOINT [--json]");
    req = "list";
  } else if (sub == "add") {
    if (pos.size() != 2 || has("--rw") || has("--clone") || has("--parent") || has("--name"))
      return usage_error("usage: plyctl branch add MOUNTPOINT NAME [--at POS] [--ro]");
    req = "add " + pos[1] + " " + (has("--at") ? p.opt.at("--at") : "0") + (has("--ro") ? " ro" : " rw");
  } else if (sub == "remove") {
    if (pos.size() != 2) return usage_error("usage: plyctl branch remove MOUNTPOINT NAME");
    req = "remove " + pos[1];
  } else if (sub == "set") {
    if (pos.size() != 2 || has("--ro") == has("--rw") || has("--name"))
      return usage_error("usage: plyctl branch set MOUNTPOINT NAME --ro | --rw");
    req = "set " + pos[1] + (has("--ro") ? " ro" : " rw");
  } else if (sub == "move") {
    if (pos.size() != 3) return usage_error("usage: plyctl branch move MOUNTPOINT NAME POS");
    req = "move " + pos[1] + " " + pos[2];
  } else {
    return usage_error("unknown branch subcommand '" + sub + "' for a mount point");
  }
  for (char c : req)
    if (c == '\n') return usage_error("names cannot hold a newline");
  auto r = control(pos[0], req);
  if (!r) return fail(r.error().message());
  if (has("--json")) {
    // "a=rw:b=ro" -> [{"name": "a", "writable": true}, ...]
    std::printf("[");
    size_t start = 0;
    for (int i = 0; start <= r->size() && !r->empty(); i++) {
      size_t end = r->find(':', start);
      if (end == std::string::npos) end = r->size();
      const std::string layer = r->substr(start, end - start);
      const size_t eq = layer.rfind('=');
      std::printf("%s{\"name\": %s, \"writable\": %s}", i ? ", " : "",
                  json_quote(layer.substr(0, eq)).c_str(), layer.substr(eq + 1) == "rw" ? "true" : "false");
      start = end + 1;
    }
    std::printf("]\n");
  } else {
    std::printf("%s\n", r->c_str());
  }
  return 0;
}

}  // namespace

int cmd_branch(const std::string& sub, const std::vector<std::string>& args) {
  auto p = parse(args, {"--clone", "--parent", "--name", "--at"}, {"--json", "--ro", "--rw"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  auto has = [&](const char* o) { return p->opt.count(o) > 0; };
  if (!pos.empty() && is_directory(pos[0])) return cmd_mounted_branch(sub, *p);
  if (has("--at")) return usage_error("--at is for a mount point");
  if (sub == "list") {
    if (pos.size() != 1) return usage_error("usage: plyctl branch list IMAGE [--json]");
    auto o = open_volume(pos[0], false);
    if (!o) return fail(pos[0] + ": " + o.error().message());
    auto bs = Filesystem::branches(*o->vol);
    if (!bs) return fail(pos[0] + ": " + bs.error().message());
    std::erase_if(*bs, [](const BranchMeta& b) { return b.doomed; });  // dropped at the next write
    auto name_of = [&](TreeId t) -> std::string {
      for (auto& b : *bs)
        if (b.tree == t) return b.name;
      return t.v ? std::to_string(t.v) : "";
    };
    if (has("--json")) {
      std::printf("[");
      for (size_t i = 0; i < bs->size(); i++) {
        const auto& b = (*bs)[i];
        std::printf("%s{\"id\": %llu, \"name\": %s, \"parent\": %s, \"read_only\": %s, "
                    "\"created_generation\": %llu}",
                    i ? ", " : "", (unsigned long long)b.tree.v, json_quote(b.name).c_str(),
                    b.parent.v ? json_quote(name_of(b.parent)).c_str() : "null",
                    b.read_only ? "true" : "false", (unsigned long long)b.created.v);
      }
      std::printf("]\n");
      return 0;
    }
    std::printf("%-6s %-20s %-20s %-4s %s\n", "ID", "NAME", "PARENT", "MODE", "CREATED");
    for (const auto& b : *bs)
      std::printf("%-6llu %-20s %-20s %-4s gen %llu\n", (unsigned long long)b.tree.v, b.name.c_str(),
                  b.parent.v ? name_of(b.parent).c_str() : "-", b.read_only ? "ro" : "rw",
                  (unsigned long long)b.created.v);
    return 0;
  }
  if (sub == "create") {
    if (pos.size() != 2 || (has("--clone") && has("--parent")))
      return usage_error("usage: plyctl branch create IMAGE NAME [--clone SRC | --parent P] [--ro]");
    auto o = open_volume(pos[0], true);
    if (!o) return fail(pos[0] + ": " + o.error().message());
    Volume& v = *o->vol;
    if (find_branch(v, pos[1])) return fail("a branch named \"" + pos[1] + "\" exists");
    BranchMeta m;
    m.name = pos[1];
    m.read_only = has("--ro");
    if (has("--clone")) {
      auto src = find_branch(v, p->opt["--clone"]);
      if (!src) return fail(src.error().message());
      auto c = clone_branch(v, src->tree, m.name, m.read_only);
      if (!c) return fail(c.error().message());
      m = *c;
    } else if (has("--parent")) {
      // The same function makes a layer online (mkdir in the control folder).
      auto par = find_branch(v, p->opt["--parent"]);
      if (!par) return fail(par.error().message());
      auto l = create_layer(v, m.name, par->tree, m.read_only);
      if (!l) return fail(l.error().message());
      m = *l;
    } else {
      FsCreateOptions fo;
      fo.name = m.name;
      fo.read_only = m.read_only;
      auto id = Filesystem::create(v, fo);
      if (!id) return fail(id.error().message());
      m.tree = *id;
      m.parent = fo.parent;
    }
    if (auto r = Filesystem::set_branch(v, m); !r) return fail(r.error().message());
    if (auto r = v.close(); !r) return fail(r.error().message());
    std::printf("created branch \"%s\" (id %llu)\n", m.name.c_str(), (unsigned long long)m.tree.v);
    return 0;
  }
  if (sub == "remove") {
    if (pos.size() != 2) return usage_error("usage: plyctl branch remove IMAGE NAME");
    auto o = open_volume(pos[0], true);
    if (!o) return fail(pos[0] + ": " + o.error().message());
    Volume& v = *o->vol;
    auto b = find_branch(v, pos[1]);
    if (!b) return fail(b.error().message());
    if (auto r = delete_branch(v, b->tree); !r) return fail(r.error().message());
    if (auto r = v.close(); !r) return fail(r.error().message());
    std::printf("removed branch \"%s\"\n", b->name.c_str());
    return 0;
  }
  if (sub == "set") {
    if (pos.size() != 2 || (has("--ro") && has("--rw")))
      return usage_error("usage: plyctl branch set IMAGE NAME [--name NEW] [--ro | --rw]");
    auto o = open_volume(pos[0], true);
    if (!o) return fail(pos[0] + ": " + o.error().message());
    Volume& v = *o->vol;
    auto b = find_branch(v, pos[1]);
    if (!b) return fail(b.error().message());
    if (has("--name")) {
      if (find_branch(v, p->opt["--name"])) return fail("a branch named \"" + p->opt["--name"] + "\" exists");
      b->name = p->opt["--name"];
    }
    if (has("--ro")) b->read_only = true;
    if (has("--rw")) b->read_only = false;
    if (b->read_only) {
      auto used = view_using(v, b->tree, true);
      if (!used) return fail(used.error().message());
      if (*used) return fail("view \"" + **used + "\" writes to this branch; change it first");
    }
    if (auto r = Filesystem::set_branch(v, *b); !r) return fail(r.error().message());
    if (auto r = v.close(); !r) return fail(r.error().message());
    return 0;
  }
  return usage_error("unknown branch subcommand '" + sub + "'");
}

// OLFS layer trees: layers are branches made empty over a parent; the
// commands are the branch ones with the tree shown as a tree.
int cmd_layer(const std::string& sub, const std::vector<std::string>& args) {
  auto p = parse(args, {"--on"}, {"--json", "--ro"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  auto has = [&](const char* o) { return p->opt.count(o) > 0; };
  if (sub == "create") {
    if (pos.size() != 2 || !has("--on") || has("--json"))
      return usage_error("usage: plyctl layer create IMAGE NAME --on PARENT [--ro]");
    std::vector<std::string> a{pos[0], pos[1], "--parent", p->opt.at("--on")};
    if (has("--ro")) a.push_back("--ro");
    return cmd_branch("create", a);
  }
  if (sub == "delete") {
    if (pos.size() != 2 || has("--on") || has("--ro") || has("--json"))
      return usage_error("usage: plyctl layer delete IMAGE NAME");
    return cmd_branch("remove", pos);
  }
  if (sub != "list") return usage_error("unknown layer subcommand '" + sub + "' (list, create, delete)");
  if (pos.size() != 1 || has("--on") || has("--ro"))
    return usage_error("usage: plyctl layer list IMAGE [--json]");
  auto o = open_volume(pos[0], false);
  if (!o) return fail(pos[0] + ": " + o.error().message());
  auto bs = Filesystem::branches(*o->vol);
  if (!bs) return fail(pos[0] + ": " + bs.error().message());
  std::erase_if(*bs, [](const BranchMeta& b) { return b.doomed; });
  std::map<uint64_t, const BranchMeta*> by_tree;
  std::map<uint64_t, std::vector<const BranchMeta*>> children;
  std::vector<const BranchMeta*> roots;
  std::map<uint64_t, bool> layer;
  for (const auto& b : *bs) {
    by_tree[b.tree.v] = &b;
    auto l = is_layer(*o->vol, b);
    if (!l) return fail(pos[0] + ": " + l.error().message());
    layer[b.tree.v] = *l;
  }
  for (const auto& b : *bs) {
    if (layer[b.tree.v] && by_tree.count(b.parent.v)) children[b.parent.v].push_back(&b);
    else roots.push_back(&b);
  }
  auto name_of = [&](TreeId t) { return by_tree.count(t.v) ? by_tree[t.v]->name : std::to_string(t.v); };
  if (has("--json")) {
    std::printf("[");
    for (size_t i = 0; i < bs->size(); i++) {
      const auto& b = (*bs)[i];
      std::printf("%s{\"name\": %s, \"id\": %llu, \"parent\": %s, \"layer\": %s, \"read_only\": %s}",
                  i ? ", " : "", json_quote(b.name).c_str(), (unsigned long long)b.tree.v,
                  b.parent.v ? json_quote(name_of(b.parent)).c_str() : "null",
                  layer[b.tree.v] ? "true" : "false", b.read_only ? "true" : "false");
    }
    std::printf("]\n");
    return 0;
  }
  std::function<void(const BranchMeta*, const std::string&, const std::string&)> show =
      [&](const BranchMeta* b, const std::string& lead, const std::string& more) {
        std::string what = "id " + std::to_string(b->tree.v) + (b->read_only ? ", ro" : "");
        if (!layer[b->tree.v] && b->parent.v) what += ", clone of " + name_of(b->parent);
        std::printf("%s%s (%s)\n", lead.c_str(), b->name.c_str(), what.c_str());
        const auto& kids = children[b->tree.v];
        for (size_t i = 0; i < kids.size(); i++) {
          const bool last = i + 1 == kids.size();
          show(kids[i], more + (last ? "\u2514\u2500\u2500 " : "\u251c\u2500\u2500 "),
               more + (last ? "    " : "\u2502   "));
        }
      };
  for (const auto* r : roots) show(r, "", "");
  return 0;
}

int cmd_view(const std::string& sub, const std::vector<std::string>& args) {
  auto p = parse(args, {}, {"--json", "--default"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  if (sub == "list") {
    if (pos.size() != 1) return usage_error("usage: plyctl view list IMAGE [--json]");
    auto o = open_volume(pos[0], false);
    if (!o) return fail(pos[0] + ": " + o.error().message());
    auto views = list_views(*o->vol);
    if (!views) return fail(views.error().message());
    if (p->opt.count("--json")) {
      std::printf("[");
      for (size_t i = 0; i < views->size(); i++) {
        const auto& w = (*views)[i];
        std::printf("%s{\"name\": %s, \"default\": %s, \"branches\": %s}", i ? ", " : "",
                    json_quote(w.name).c_str(), w.is_default ? "true" : "false",
                    json_quote(format_stack(*o->vol, w.layers)).c_str());
      }
      std::printf("]\n");
      return 0;
    }
    if (views->empty()) {
      auto d = default_stack(*o->vol);
      std::printf("no views; a mount shows %s\n", d ? format_stack(*o->vol, *d).c_str() : "nothing");
      return 0;
    }
    for (const auto& w : *views)
      std::printf("%-20s %s%s\n", w.name.c_str(), format_stack(*o->vol, w.layers).c_str(),
                  w.is_default ? "  (default)" : "");
    return 0;
  }
  if (sub == "create" || sub == "delete" || sub == "default") {
    const size_t want = sub == "create" ? 3 : 2;
    if (pos.size() != want)
      return usage_error(sub == "create" ? "usage: plyctl view create IMAGE NAME STACK [--default]"
                                         : "usage: plyctl view " + sub + " IMAGE NAME");
    auto o = open_volume(pos[0], true);
    if (!o) return fail(pos[0] + ": " + o.error().message());
    Volume& v = *o->vol;
    Result<void> r = ok();
    if (sub == "create") {
      auto stack = parse_stack(v, pos[2]);
      if (!stack) return fail(stack.error().message());
      r = put_view(v, View{pos[1], p->opt.count("--default") > 0, *stack});
    } else if (sub == "delete") {
      r = delete_view(v, pos[1]);
    } else {
      auto views = list_views(v);
      if (!views) return fail(views.error().message());
      auto it = std::find_if(views->begin(), views->end(), [&](auto& w) { return w.name == pos[1]; });
      if (it == views->end()) return fail("no view named \"" + pos[1] + "\"");
      it->is_default = true;
      r = put_view(v, *it);
    }
    if (!r) return fail(r.error().message());
    if (auto c = v.close(); !c) return fail(c.error().message());
    return 0;
  }
  return usage_error("unknown view subcommand '" + sub + "'");
}

}  // namespace plyfs::ctl
