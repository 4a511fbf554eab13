// plyctl view: the catalog's views, named stacks a mount shows
// (format.md#catalog); on an image, or through the daemon of a mount point
// or of the mount serving the image (control.h: views, default,
// view-create, view-delete, view-default). Either way the command ends with
// the objects of the JSON model, and the text is printed from them.
#include "cli.h"

#include <algorithm>
#include <cstdio>

#include "mount_client.h"
#include "output.h"
#include "snap/model.h"
#include "union/view.h"
#include "util/text.h"

namespace plyfs::ctl {

namespace {

// The views, and the Stack a plain mount shows (null when there is none),
// read here.
Result<Json> offline_views(Volume& v, Json& dflt) {
  auto views = PLY_TRY(list_views(v));
  auto bs = PLY_TRY(model::Branches::read(v));
  Json a = Json::array();
  for (const auto& w : views) a.push_back(bs.view(w));
  auto d = default_stack(v);
  dflt = d ? bs.stack(*d) : Json();
  return a;
}

int list_views_cmd(const std::string& path, bool json) {
  auto t = open_target(path, false);
  if (!t) return fail_on(path, t.error());
  Json views, dflt;
  if (t->mnt.empty()) {
    auto a = offline_views(*t->o.vol, dflt);
    if (!a) return fail_on(path, a.error());
    views = std::move(*a);
  } else {
    auto a = request(t->mnt, Json{{"command", "views"}});
    if (!a) return fail(a.error().message());
    if (!a->is_array()) return fail(t->mnt + ": the daemon's answer is not a list of views");
    views = std::move(*a);
    if (views.empty() && !json)
      if (auto d = request(t->mnt, Json{{"command", "default"}})) dflt = std::move(*d);
  }
  if (json) {
    print_json(views);
    return 0;
  }
  if (views.empty()) {
    std::printf("no views; a mount shows %s\n", dflt.is_array() ? stack_text(dflt).c_str() : "nothing");
    return 0;
  }
  Table tb({{"NAME"}, {"DEFAULT"}, {"STACK"}});
  for (const auto& w : views) {
    auto name = model::get_name(w, "name");
    tb.add({name ? shown(*name) : "?", w.value("default", false) ? "yes" : "no", stack_text(w.value("stack", Json()))});
  }
  tb.print();
  return 0;
}

// create, delete or default on an image opened here: the View.
Result<Json> offline_change(Volume& v, const std::string& sub, const std::vector<std::string>& pos, bool dflt) {
  auto views = PLY_TRY(list_views(v));
  auto it = std::find_if(views.begin(), views.end(), [&](auto& w) { return w.name == pos[1]; });
  if (sub != "create" && it == views.end()) {
    std::string m = "no view named ";
    m += in_quotes(pos[1]);
    return Error::io(ENOENT, m);
  }
  View result;
  if (sub == "create") {
    result = View{pos[1], dflt, PLY_TRY(parse_stack(v, pos[2]))};
    PLY_CHECK(put_view(v, result));
  } else if (sub == "delete") {
    result = *it;
    PLY_CHECK(delete_view(v, pos[1]));
  } else {
    it->is_default = true;
    result = *it;
    PLY_CHECK(put_view(v, *it));
  }
  return PLY_TRY(model::Branches::read(v)).view(result);
}

}  // namespace

int cmd_view(const std::string& sub, const std::vector<std::string>& args) {
  auto p = parse(args, {}, {"--json", "--default"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  const bool json = p->opt.count("--json") > 0;
  if (sub == "list") {
    if (pos.size() != 1 || p->opt.count("--default"))
      return usage_error("usage: plyctl view list IMAGE|MOUNTPOINT [--json]");
    return list_views_cmd(pos[0], json);
  }
  if (sub != "create" && sub != "delete" && sub != "default")
    return usage_error("unknown view subcommand '" + sub + "' (list, create, delete, default)");
  const size_t want = sub == "create" ? 3 : 2;
  if (pos.size() != want || (sub != "create" && p->opt.count("--default")))
    return usage_error(sub == "create" ? "usage: plyctl view create IMAGE|MOUNTPOINT NAME STACK [--default] [--json]"
                                       : "usage: plyctl view " + sub + " IMAGE|MOUNTPOINT NAME [--json]");
  if (sub == "create")
    if (auto n = check_branch_name(pos[1], "view"); !n) return fail(n.error().message());
  auto t = open_target(pos[0], true);
  if (!t) return fail_on(pos[0], t.error());
  Result<Json> r = Error::invalid("");
  if (t->mnt.empty()) {
    Volume& v = *t->o.vol;
    r = offline_change(v, sub, pos, p->opt.count("--default") > 0);
    if (!r) return fail(r.error().message());
    if (auto c = v.close(); !c) return fail_on(pos[0], c.error());
  } else {
    // One generation on the mount; the mount keeps the stack it shows.
    Json req = {{"command", "view-" + sub}};
    model::put_name(req, "name", pos[1]);
    if (sub == "create") {
      model::put_name(req, "stack", pos[2]);
      req["default"] = p->opt.count("--default") > 0;
    }
    r = request(t->mnt, req);
    if (!r) return fail(r.error().message());
  }
  if (json) {
    print_json(*r);
    return 0;
  }
  auto name = model::get_name(*r, "name");
  const std::string shown_name = in_quotes(name ? *name : "?");
  const std::string stack = stack_text(r->value("stack", Json()));
  if (sub == "default")
    std::printf("view %s is the default: %s\n", shown_name.c_str(), stack.c_str());
  else
    std::printf("%s view %s: %s%s\n", sub == "create" ? "created" : "deleted", shown_name.c_str(), stack.c_str(),
                r->value("default", false) ? " (the default)" : "");
  return 0;
}

}  // namespace plyfs::ctl
