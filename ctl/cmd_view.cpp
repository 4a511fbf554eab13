// plyctl view: the catalog's views, named stacks a mount shows
// (format.md#catalog); offline only.
#include "cli.h"

#include <algorithm>
#include <cstdio>

#include "output.h"
#include "snap/model.h"
#include "union/view.h"
#include "util/text.h"

namespace plyfs::ctl {

namespace {

int list_views_cmd(const std::string& image, bool json) {
  auto o = open_volume(image, false);
  if (!o) return fail_on(image, o.error());
  auto views = list_views(*o->vol);
  if (!views) return fail_on(image, views.error());
  auto bs = model::Branches::read(*o->vol);
  if (!bs) return fail_on(image, bs.error());
  if (json) {
    Json a = Json::array();
    for (const auto& w : *views) a.push_back(bs->view(w));
    print_json(a);
    return 0;
  }
  if (views->empty()) {
    auto d = default_stack(*o->vol);
    std::printf("no views; a mount shows %s\n", d ? bs->stack_text(*d).c_str() : "nothing");
    return 0;
  }
  Table t({{"NAME"}, {"DEFAULT"}, {"STACK"}});
  for (const auto& w : *views) t.add({shown(w.name), w.is_default ? "yes" : "no", bs->stack_text(w.layers)});
  t.print();
  return 0;
}

}  // namespace

int cmd_view(const std::string& sub, const std::vector<std::string>& args) {
  auto p = parse(args, {}, {"--json", "--default"});
  if (!p) return usage_error(p.error().message());
  const auto& pos = p->pos;
  const bool json = p->opt.count("--json") > 0;
  if (!pos.empty() && is_directory(pos[0]))
    return need_image("view " + sub, pos[0], "plyctl branch list|add|remove|set|move MOUNTPOINT change the "
                                             "mounted stack until unmount");
  if (sub == "list") {
    if (pos.size() != 1 || p->opt.count("--default")) return usage_error("usage: plyctl view list IMAGE [--json]");
    return list_views_cmd(pos[0], json);
  }
  if (sub != "create" && sub != "delete" && sub != "default")
    return usage_error("unknown view subcommand '" + sub + "' (list, create, delete, default)");
  const size_t want = sub == "create" ? 3 : 2;
  if (pos.size() != want || (sub != "create" && p->opt.count("--default")))
    return usage_error(sub == "create" ? "usage: plyctl view create IMAGE NAME STACK [--default] [--json]"
                                       : "usage: plyctl view " + sub + " IMAGE NAME [--json]");
  if (sub == "create")
    if (auto n = check_branch_name(pos[1], "view"); !n) return fail(n.error().message());
  auto o = open_volume(pos[0], true);
  if (!o) return fail_on(pos[0], o.error());
  Volume& v = *o->vol;
  auto views = list_views(v);
  if (!views) return fail_on(pos[0], views.error());
  auto it = std::find_if(views->begin(), views->end(), [&](auto& w) { return w.name == pos[1]; });
  if (sub != "create" && it == views->end()) return fail("no view named " + in_quotes(pos[1]));
  View result;
  Result<void> r = ok();
  if (sub == "create") {
    auto stack = parse_stack(v, pos[2]);
    if (!stack) return fail(stack.error().message());
    result = View{pos[1], p->opt.count("--default") > 0, *stack};
    r = put_view(v, result);
  } else if (sub == "delete") {
    result = *it;
    r = delete_view(v, pos[1]);
  } else {
    it->is_default = true;
    result = *it;
    r = put_view(v, *it);
  }
  if (!r) return fail(r.error().message());
  auto bs = model::Branches::read(v);
  if (!bs) return fail_on(pos[0], bs.error());
  if (auto c = v.close(); !c) return fail_on(pos[0], c.error());
  if (json) {
    print_json(bs->view(result));
    return 0;
  }
  if (sub == "default")
    std::printf("view %s is the default: %s\n", in_quotes(result.name).c_str(), bs->stack_text(result.layers).c_str());
  else
    std::printf("%s view %s: %s%s\n", sub == "create" ? "created" : "deleted", in_quotes(result.name).c_str(),
                bs->stack_text(result.layers).c_str(), result.is_default ? " (the default)" : "");
  return 0;
}

}  // namespace plyfs::ctl
