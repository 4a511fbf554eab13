// See output.h.
#include "output.h"

#include <langinfo.h>
#include <libsmartcols.h>

#include <clocale>
#include <cstdio>
#include <cstring>
#include <stdexcept>

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
