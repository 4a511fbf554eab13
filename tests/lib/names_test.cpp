// The name rule (check_branch_name, lib/union/view.h; format.md#fs-info,
// "Names") and the functions that give a branch, layer, snapshot or view
// a name; and names as bytes (lib/util/text.h): UTF-8, escaping, base64,
// and the JSON model's FIELD_bytes (lib/snap/model.h).
#include <dirent.h>

#include "test_util.h"

#include "fs/fs.h"
#include "snap/model.h"
#include "snap/snap.h"
#include "union/view.h"
#include "util/text.h"

using namespace plyfs;
using namespace plyfs::test;

namespace {

const std::vector<std::string> kBad = {"", ".", "..", "a/b", "/", "a\\b", "a:b", "a=b", "a,b", "-a", " a", "a ",
                                       "a\nb", "a\tb", std::string("a\0b", 3), "a\x7f", "a\xc2\x80", "a\xc2\x9f",
                                       "a\xff", "a\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                       std::string(33, 'x')};
const std::vector<std::string> kGood = {"main", "a b", "a-b", "a.b", "a@250101-120000", ".hidden", "a-", "x ~y",
                                        "\xc3\xbc\xc3\xb1\xc3\xad", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "#1", "a\xc2\xa0",
                                        std::string(32, 'y')};

struct Img {
  std::unique_ptr<MemDevice> dev;
  std::unique_ptr<Volume> vol;
  TreeId main;
};
Img image() {
  Img im;
  im.dev = std::make_unique<MemDevice>(64ull << 20);
  must(format_filesystem(*im.dev, FormatOptions{}, FsCreateOptions{}));
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  im.vol = must(Volume::open(*im.dev, vo));
  im.main = must(Filesystem::default_tree(*im.vol));
  return im;
}

}  // namespace

TEST_CASE("names: the rule", "[names]") {
  for (const auto& n : kBad) {
    INFO("\"" << escape(n) << "\"");
    auto r = check_branch_name(n);
    REQUIRE(!r);
    CHECK(r.error().code == (n.size() > 32 ? ENAMETOOLONG : EINVAL));
    CHECK(!r.error().system);  // plyfs's own refusal: no strerror tail
    const std::string m = r.error().message();
    CHECK(m.find('\n') == std::string::npos);  // one line, the name escaped
    CHECK(m.rfind("invalid branch name \"", 0) == 0);
  }
  for (const auto& n : kGood) {
    INFO("\"" << n << "\"");
    CHECK(check_branch_name(n));
  }
  CHECK(check_branch_name("a/b", "view").error().message().rfind("invalid view name \"a/b\"", 0) == 0);
}

TEST_CASE("names: every library function that gives a name checks it", "[names]") {
  Img im = image();
  Volume& v = *im.vol;
  const size_t branches = must(Filesystem::branches(v)).size();
  for (const auto& n : kBad) {
    INFO("\"" << escape(n) << "\"");
    CHECK(!create_branch(v, n, false));
    CHECK(!create_layer(v, n, im.main, false));
    CHECK(!clone_branch(v, im.main, n, false));
    CHECK(!rename_branch(v, im.main, n));
    CHECK(!snapshot(v, im.main, n));
    CHECK(!put_view(v, View{n, false, {{im.main, true}}}));
  }
  CHECK(must(Filesystem::branches(v)).size() == branches);
  CHECK(must(list_views(v)).empty());
  CHECK(must(Filesystem::branch(v, im.main)).name == "main");
  for (const auto& n : kGood) {
    INFO("\"" << n << "\"");
    if (n == "main") continue;
    auto l = must(create_layer(v, n, im.main, false));
    CHECK(l.name == n);
    must(put_view(v, View{n, false, {{l.tree, true}, {im.main, false}}}));
    must(delete_view(v, n));
    must(delete_branch(v, l.tree));
  }
  // An old image's bad names stay usable: its view can become the default,
  // and its branch can be renamed to a good name and found by id.
  auto b = must(create_branch(v, "ok", false));
  b.name = "bad/name";
  must(Filesystem::set_branch(v, b));
  CHECK(must(find_branch(v, "bad/name")).tree == b.tree);
  CHECK(must(find_branch(v, std::to_string(b.tree.v))).tree == b.tree);
  CHECK(must(rename_branch(v, b.tree, "good")).name == "good");
}

TEST_CASE("names: UTF-8, escaping as ls does, base64", "[names]") {
  CHECK(valid_utf8("plain \xc3\xbc \xe2\x82\xac \xf0\x9f\x98\x80"));
  for (const char* s : {"\xff", "\xc3", "\xc0\x80", "\xe0\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80"})
    CHECK(!valid_utf8(s));
  CHECK(lossy_utf8("a\xff" "b\xc3") == "a\xef\xbf\xbd" "b\xef\xbf\xbd");
  CHECK(lossy_utf8("ok \xc3\xbc") == "ok \xc3\xbc");
  CHECK(!needs_escape("a b \xc3\xbc"));
  CHECK(shown("a b") == "a b");
  CHECK(escape("a b") == "a\\ b");
  CHECK(escape("t\tn\nb\\") == "t\\tn\\nb\\\\");
  CHECK(escape("\x01\x7f\xc2\x85\xff") == "\\001\\177\\302\\205\\377");
  CHECK(escape("\a\b\v\f\r") == "\\a\\b\\v\\f\\r");
  CHECK(shown("x\ty") == "x\\ty");
  for (const std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar", "\xff\x00\x80"}) {
    INFO(s);
    CHECK(unbase64(base64(s)) == s);
  }
  CHECK(base64("foobar") == "Zm9vYmFy");
  CHECK(base64("fo") == "Zm8=");
  CHECK(!unbase64("Zm8"));
  CHECK(!unbase64("Zm=8"));
  CHECK(!unbase64("Z!8="));
}

TEST_CASE("names: the JSON model carries any bytes (FIELD and FIELD_bytes)", "[names]") {
  model::Json o = model::Json::object();
  model::put_name(o, "path", "ok");
  CHECK(o.dump() == R"({"path":"ok"})");
  model::put_name(o, "path", "a\xff\nb");
  CHECK(o["path"] == "a\xef\xbf\xbd\nb");
  CHECK(o["path_bytes"] == base64("a\xff\nb"));
  CHECK(must(model::get_name(o, "path")) == "a\xff\nb");
  CHECK(model::dump(o) == R"({"path":"a�\nb","path_bytes":"Yf8KYg=="})");
  // The diff formats: JSON, text (escaped), -z (raw, NUL-terminated).
  std::vector<DiffEntry> d = {{Change::Added, "/a\tb", "", DT_REG}, {Change::Renamed, "/x", "/y\xff", DT_DIR}};
  CHECK(model::diff_text(d, false) == "+\t/a\\tb\nR\t/x -> /y\\377\n");
  CHECK(model::diff_text(d, true) == std::string("+\t/a\tb\0R\t/x\0/y\xff\0", 16));
  auto back = must(model::parse_diff(model::diff(d)));
  REQUIRE(back.size() == 2);
  CHECK(back[1].new_path == "/y\xff");
  CHECK(back[1].type == DT_DIR);
  CHECK(model::dump(model::diff(d)) ==
        R"([{"change":"added","type":"file","path":"/a\tb"},)"
        R"({"change":"renamed","type":"directory","path":"/x","new_path":"/y�","new_path_bytes":"L3n/"}])");
}
