// See output.h.
#include "output.h"

#include <langinfo.h>
#include <libsmartcols.h>

#include <clocale>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>

#include "util/parse.h"
#include "util/text.h"

namespace plyfs::ctl {

void print_json(const Json& j) {
  const std::string s = model::dump(j);
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fputc('\n', stdout);
}

std::string in_quotes(std::string_view name) {
  std::string o = "\"";
  o += shown(name);
  o += '"';
  return o;
}

namespace {
std::string name_in(const Json& o, const char* key) {
  auto n = model::get_name(o, key);
  return n ? shown(*n) : "?";
}
uint64_t id_in(const Json& o) { return o.is_object() && o.contains("id") && o["id"].is_number_unsigned() ? o["id"].get<uint64_t>() : 0; }
}  // namespace

std::string stack_text(const Json& stack) {
  std::string out;
  if (!stack.is_array()) return out;
  for (const auto& e : stack) {
    if (!out.empty()) out += ':';
    out += name_in(e, "branch");
    out += e.is_object() && e.value("writable", false) ? "=rw" : "=ro";
  }
  return out;
}

std::string kind_text(const Json& b) {
  if (!b.is_object()) return "?";
  if (b.value("layer", false)) return "layer";
  return b.contains("parent") && b["parent"].is_object() ? "clone" : "base";
}

void print_branch_table(const Json& branches) {
  Table t({{"ID", true}, {"NAME"}, {"PARENT"}, {"KIND"}, {"MODE"}, {"HELD"}, {"CREATED", true}});
  for (const auto& b : branches) {
    const Json parent = b.is_object() ? b.value("parent", Json()) : Json();
    t.add({std::to_string(id_in(b)), name_in(b, "name"), parent.is_object() ? name_in(parent, "branch") : "-",
           kind_text(b), b.value("writable", false) ? "rw" : "ro", b.value("held", false) ? "held" : "-",
           std::to_string(b.value("created_generation", uint64_t(0)))});
  }
  t.print();
}

namespace {
std::string two_parts(const Json& u) {
  return format_size(u.value("total", uint64_t(0))) + " (data " + format_size(u.value("data", uint64_t(0))) +
         ", metadata " + format_size(u.value("metadata", uint64_t(0))) + ")";
}

}  // namespace

void print_du(const Json& d, bool one) {
  const Json& vol = d["volume"];
  if (one) {
    for (const auto& b : d["branches"]) {
      std::printf("%s (id %llu)\n", ("\"" + name_in(b, "branch") + "\"").c_str(), (unsigned long long)id_in(b));
      std::printf("  referenced: %s\n", two_parts(b["referenced"]).c_str());
      std::printf("  exclusive:  %s, what deleting it frees\n", two_parts(b["exclusive"]).c_str());
      if (b["shared"].empty()) std::printf("  shares nothing with another branch\n");
      for (const auto& s : b["shared"])
        std::printf("  shared with %s: %s\n", ("\"" + name_in(s, "branch") + "\"").c_str(),
                    format_size(s.value("bytes", uint64_t(0))).c_str());
    }
    return;
  }
  Table t({{"NAME"}, {"ID", true}, {"REFERENCED", true}, {"EXCLUSIVE", true}});
  for (const auto& b : d["branches"])
    t.add({name_in(b, "branch"), std::to_string(id_in(b)), format_size(b["referenced"].value("total", uint64_t(0))),
           format_size(b["exclusive"].value("total", uint64_t(0)))});
  t.print();
  const uint64_t used = vol.value("used", uint64_t(0)), excl = vol.value("exclusive", uint64_t(0));
  std::printf("image: %s used of %s (data %s, metadata %s); %s held by one branch alone, %s shared or the "
              "image's own\n",
              format_size(used).c_str(), format_size(vol.value("size", uint64_t(0))).c_str(),
              format_size(vol.value("data", uint64_t(0))).c_str(), format_size(vol.value("metadata", uint64_t(0))).c_str(),
              format_size(excl).c_str(), format_size(used > excl ? used - excl : 0).c_str());
}


// Layers hang under the branch they are made on; bases and clones are roots.
void print_layer_tree(const Json& branches) {
  std::map<uint64_t, const Json*> by_id;
  for (const auto& b : branches) by_id[id_in(b)] = &b;
  Table t({{"NAME"}, {"ID", true}, {"KIND"}, {"MODE"}}, true);
  std::function<void(const Json&, libscols_line*)> add = [&](const Json& b, libscols_line* parent) {
    std::string kind = kind_text(b);
    if (kind == "clone") {
      kind += " of ";
      kind += name_in(b["parent"], "branch");
    }
    libscols_line* ln = t.add({name_in(b, "name"), std::to_string(id_in(b)), kind,
                               b.value("writable", false) ? "rw" : "ro"}, parent);
    for (const auto& c : b.value("children", Json::array()))
      if (auto it = by_id.find(id_in(c)); it != by_id.end()) add(*it->second, ln);
  };
  for (const auto& b : branches) {
    const Json parent = b.is_object() ? b.value("parent", Json()) : Json();
    if (!b.value("layer", false) || !parent.is_object() || !by_id.count(id_in(parent))) add(b, nullptr);
  }
  t.print();
}

Table::Table(std::vector<Column> cols, bool tree) : tb_(scols_new_table()), ncols_(cols.size()) {
  if (!tb_) throw std::runtime_error("out of memory");
  // Never cut a cell: a script reading the table gets whole names, and a
  // terminal narrower than the table wraps lines, not names.
  scols_table_set_termforce(tb_, SCOLS_TERMFORCE_NEVER);
  for (size_t i = 0; i < cols.size(); i++) {
    int flags = cols[i].right ? SCOLS_FL_RIGHT : 0;
    if (tree && i == 0) flags |= SCOLS_FL_TREE;
    if (!scols_table_new_column(tb_, cols[i].name, 0, flags)) throw std::runtime_error("out of memory");
  }
}

Table::~Table() { scols_unref_table(tb_); }

libscols_line* Table::add(const std::vector<std::string>& cells, libscols_line* parent) {
  libscols_line* ln = scols_table_new_line(tb_, parent);
  if (!ln) throw std::runtime_error("out of memory");
  for (size_t i = 0; i < cells.size() && i < ncols_; i++) scols_line_set_data(ln, i, cells[i].c_str());
  return ln;
}

void Table::print() {
  scols_print_table(tb_);
  std::fflush(stdout);
}

void set_utf8_locale() {
  std::setlocale(LC_ALL, "");
  if (std::strcmp(nl_langinfo(CODESET), "UTF-8") != 0) std::setlocale(LC_CTYPE, "C.UTF-8");
}

}  // namespace plyfs::ctl
