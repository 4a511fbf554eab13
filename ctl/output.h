// What plyctl prints: JSON (one object or array of the model, snap/model.h,
// on one line) and text tables (libsmartcols, so that long names do not
// break the columns). Names in text are shown (util/text.h): escaped as
// `ls --quoting-style=escape` does when they hold control characters,
// backslashes or bytes that are not UTF-8.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "snap/model.h"

struct libscols_table;
struct libscols_line;

namespace plyfs::ctl {

using model::Json;

// The JSON value and a newline, on stdout.
void print_json(const Json& j);
// "NAME" in double quotes, shown: for the sentences of text output.
std::string in_quotes(std::string_view name);

// The text of a Stack ([StackEntry]): "top=rw:base=ro", names shown, the
// same as model::Branches::stack_text.
std::string stack_text(const Json& stack);
// The KIND column of a Branch object: "layer", "clone" (made from a
// branch) or "base".
std::string kind_text(const Json& branch);
// The tables of plyctl branch list and layer list, from [Branch].
void print_branch_table(const Json& branches);
void print_layer_tree(const Json& branches);
// plyctl du's text, from a Du object: a table of the branches and the
// image's totals, or (`one`) one branch in detail.
void print_du(const Json& du, bool one);

// A table with a header line, printed whole to stdout. A tree table draws
// its first column as a tree (add(parent)).
class Table {
 public:
  struct Column {
    const char* name;
    bool right = false;  // numbers
  };
  explicit Table(std::vector<Column> cols, bool tree = false);
  ~Table();
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;
  // A new row (under `parent` in a tree); its cells, left to right.
  libscols_line* add(const std::vector<std::string>& cells, libscols_line* parent = nullptr);
  void print();

 private:
  libscols_table* tb_;
  size_t ncols_;
};

// Text output is UTF-8 whatever the locale (names are UTF-8 by the name
// rule): libsmartcols measures and escapes by the locale's character set.
void set_utf8_locale();

}  // namespace plyfs::ctl
