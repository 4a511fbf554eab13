// The union layer (lib/union) on an in-memory device: a randomized
// differential test against a model of what the user sees, over 1-4
// branches with random contents (files, directories, whiteouts, opaque
// directories) and random read-only/read-write modes, plus Unionfs's cases
// one by one.
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <map>
#include <set>
#include <thread>

#include <catch2/generators/catch_generators.hpp>

#include "commit/superblock.h"
#include "fs/check.h"
#include "fs/fs.h"
#include "fs/items.h"
#include "fsck/fsck.h"
#include "snap/snap.h"
#include "union/union.h"
#include "union/view.h"
#include "test_util.h"
#include "usage_check.h"

namespace plyfs::test {
namespace {

// The model tests run once plain and once with compression forced on every
// volume they open (format.md#fs-compress); then files are also written
// with large compressible contents, so that frames are copied up, merged,
// snapshotted and rolled back.
Compression g_compress;
struct CompressAll {
  explicit CompressAll(bool on) {
    if (on) g_compress = Compression{Compression::Mode::Zstd, 1, true};
  }
  ~CompressAll() { g_compress = Compression{}; }
};
// Runs of a few letters, 8 KiB to 128 KiB: frames that compress.
std::string big_text(std::mt19937_64& rng) {
  std::string d(8192 + rng() % (120 << 10), '\0');
  for (size_t i = 0; i < d.size();) {
    const size_t run = std::min<size_t>(d.size() - i, 1 + rng() % 40);
    std::fill_n(d.begin() + long(i), run, char('a' + rng() % 6));
    i += run;
  }
  return d;
}

const Caller kRoot{0, 0, 0};

// An image with `n` branches, each a filesystem tree.
struct Image {
  std::unique_ptr<MemDevice> dev;
  std::unique_ptr<Volume> vol;
  std::vector<std::unique_ptr<Filesystem>> fs;
  std::vector<TreeId> trees;
  BlockDevice* via = nullptr;    // open through this device (a FaultDevice) instead
  bool commit_each_txn = false;  // every filesystem operation its own generation

  void open() {
    VolumeOptions vo;
    vo.kinds = fs_kinds();
    vo.commit_each_txn = commit_each_txn;
    vol = must(Volume::open(via ? *via : *dev, vo));
    vol->extension<MountCompression>().set(g_compress);
    fs.clear();
    for (TreeId t : trees) fs.push_back(must(Filesystem::open(*vol, t)));
  }
  void close() {
    for (auto& f : fs) must(f->release_all());
    fs.clear();
    must(vol->close());
    vol.reset();
  }
};

// Compressed extent items in every branch of the image.
size_t compressed_items(Image& im) {
  size_t n = 0;
  auto t = must(im.vol->begin());
  for (TreeId tree : im.trees)
    must(t.scan(tree, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
      if (fsitems::type_of(k) == disk::ItemType::Extent) n += must(fsitems::decode_extent(k, v)).compressed();
      return true;
    }));
  return n;
}

Image make_image(size_t n) {
  Image im;
  im.dev = std::make_unique<MemDevice>(256ull << 20);
  must(format_filesystem(*im.dev, FormatOptions{}, FsCreateOptions{}));
  VolumeOptions vo;
  vo.kinds = fs_kinds();
  im.vol = must(Volume::open(*im.dev, vo));
  im.trees.push_back(must(Filesystem::default_tree(*im.vol)));
  for (size_t i = 1; i < n; i++) {
    FsCreateOptions o;
    o.name = "b" + std::to_string(i);
    im.trees.push_back(must(Filesystem::create(*im.vol, o)));
  }
  im.close();
  im.open();
  return im;
}

std::vector<std::byte> bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size()};
}

// fsck finds nothing it would fix, and the objects and views check clean.
void check_image(Image& im) {
  FsckOptions fo;
  fo.kinds = fs_kinds();
  auto rep = must(fsck_run(*im.dev, fo));
  for (const auto& p : rep.problems) {
    INFO(p.code << ": " << p.message);
    CHECK(p.fix == FixClass::Info);
  }
  auto ps = check_filesystems(*im.dev);
  for (const auto& p : ps) UNSCOPED_INFO(p.code << ": " << p.message);
  REQUIRE(ps.empty());
  auto vs = check_views(*im.dev);
  for (const auto& p : vs) UNSCOPED_INFO(p.code << ": " << p.message);
  REQUIRE(vs.empty());
}

// --- the model: what the user sees -------------------------------------------

struct MObj {
  char type;         // 'f' file, 'd' directory
  std::string data;  // a file's bytes
  uint32_t mode;
  uint64_t ino = 0;  // 0: not known yet (the first walk fills it in)
};
using Model = std::map<std::string, MObj>;

std::string parent_of(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? "" : p.substr(0, s);
}
std::string base_of(const std::string& p) {
  auto s = p.rfind('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}
bool inside(const std::string& p, const std::string& dir) {
  return p.size() > dir.size() && p.compare(0, dir.size(), dir) == 0 && p[dir.size()] == '/';
}

// The union view, computed from the branches by the model's own (simple,
// recursive) reading of the rules: first occurrence wins, whiteouts hide,
// directories merge down to the first opaque one or the first non-directory.
void merge(std::vector<std::unique_ptr<Filesystem>>& fs, const std::vector<std::pair<int, uint64_t>>& dirs,
           const std::string& prefix, Model& out) {
  std::map<std::string, std::vector<std::pair<int, Entry>>> names;  // in branch order
  for (const auto& part : dirs) {
    const int b = part.first;  // lambdas may not capture structured bindings (clang)
    must(fs[b]->readdir(part.second, 0, [&](const DirEntry& e) {
      if (e.name != "." && e.name != "..") names[std::string(e.name)].push_back({b, Entry{e.ino, e.type}});
      return true;
    }));
  }
  for (auto& [name, occ] : names) {
    auto [b0, e0] = occ[0];
    if (e0.type == DT_WHT) continue;
    const std::string path = prefix.empty() ? name : prefix + "/" + name;
    Attr a = must(fs[b0]->getattr(e0.ino));
    if (!S_ISDIR(a.mode)) {
      std::vector<std::byte> buf(a.size);
      must(fs[b0]->read(e0.ino, 0, buf));
      out[path] = MObj{'f', std::string(reinterpret_cast<char*>(buf.data()), buf.size()), a.mode & 07777};
      continue;
    }
    out[path] = MObj{'d', "", a.mode & 07777};
    std::vector<std::pair<int, uint64_t>> sub{{b0, e0.ino}};
    bool stop = a.opaque;
    for (size_t i = 1; i < occ.size() && !stop; i++) {
      auto [b, e] = occ[i];
      if (e.type != DT_DIR) break;
      sub.push_back({b, e.ino});
      stop = must(fs[b]->getattr(e.ino)).opaque;
    }
    merge(fs, sub, path, out);
  }
}

// Random contents for one branch, through the filesystem layer directly.
void populate(Filesystem& fs, std::mt19937_64& rng) {
  const char* names[] = {"a", "b", "c", "d"};
  std::vector<uint64_t> dirs{fs.root()};
  const int n = 4 + int(rng() % 12);
  for (int i = 0; i < n; i++) {
    const uint64_t d = dirs[rng() % dirs.size()];
    const std::string name = names[rng() % 4];
    switch (rng() % 6) {
      case 0: case 1: {
        auto a = fs.mkdir(d, name, 0755, 0, 0);
        if (a && dirs.size() < 8) dirs.push_back(a->ino);
        if (a && rng() % 4 == 0) {
          SetAttr s;
          s.opaque = true;
          must(fs.setattr(a->ino, s));
        }
        break;
      }
      case 2: case 3: {
        auto a = fs.mknod(d, name, S_IFREG | 0644, 0, 0, 0);
        if (a && g_compress.on() && rng() % 3 == 0) must(fs.write(a->ino, 0, bytes(big_text(rng))));
        else if (a) must(fs.write(a->ino, 0, bytes(std::string(1 + rng() % 40, char('A' + rng() % 26)))));
        break;
      }
      default:
        (void)fs.whiteout(d, name);
        break;
    }
  }
}

// A branch's whole raw content, whiteouts and opaque flags included.
std::string dump(Filesystem& fs, uint64_t dir, const std::string& prefix = "") {
  std::string out;
  must(fs.readdir(dir, 0, [&](const DirEntry& e) {
    if (e.name == "." || e.name == "..") return true;
    const std::string p = prefix + "/" + std::string(e.name);
    if (e.type == DT_WHT) {
      out += p + " whiteout\n";
      return true;
    }
    Attr a = must(fs.getattr(e.ino));
    out += p + " " + std::to_string(a.mode) + " " + std::to_string(a.size) + (a.opaque ? " opaque" : "") + "\n";
    if (S_ISDIR(a.mode)) out += dump(fs, e.ino, p);
    else if (S_ISREG(a.mode)) {
      std::vector<std::byte> buf(a.size);
      must(fs.read(e.ino, 0, buf));
      out += std::string(reinterpret_cast<char*>(buf.data()), buf.size()) + "\n";
    }
    return true;
  }));
  return out;
}

Result<uint64_t> resolve(Union& u, const std::string& path) {
  uint64_t ino = u.root();
  if (path.empty()) return ino;
  size_t p = 0;
  while (p <= path.size()) {
    size_t q = path.find('/', p);
    if (q == std::string::npos) q = path.size();
    Attr a = PLY_TRY(u.lookup(ino, path.substr(p, q - p)));
    ino = a.ino;
    p = q + 1;
  }
  return ino;
}

// Compares the union with the model; fills in the model's unknown inode
// numbers and checks the known ones (st_ino persists across copy-ups and
// renames).
void compare(Union& u, Model& m) {
  Model seen;
  std::function<void(uint64_t, const std::string&)> walk = [&](uint64_t dir, const std::string& prefix) {
    std::vector<std::pair<std::string, uint64_t>> es;
    std::set<std::string> names;
    must(u.readdir(dir, 0, [&](const DirEntry& e) {
      if (e.name == "." || e.name == "..") return true;
      INFO("duplicate-free readdir in " << prefix << ": " << e.name);
      REQUIRE(names.insert(std::string(e.name)).second);
      es.emplace_back(std::string(e.name), e.ino);
      return true;
    }));
    // readdirplus hands out what lookup finds, from the listing alone.
    std::map<std::string, Attr> plus;
    must(u.readdirplus(dir, 0, [&](const DirEntry& e, const Attr* a) {
      if (e.name == "." || e.name == "..") {
        REQUIRE(!a);
        return true;
      }
      REQUIRE(a);
      plus[std::string(e.name)] = *a;
      return true;
    }));
    REQUIRE(plus.size() == es.size());
    for (auto& [name, dino] : es) {
      const std::string path = prefix.empty() ? name : prefix + "/" + name;
      Attr a = must(u.lookup(dir, name));
      {
        INFO("readdirplus of " << path);
        REQUIRE(plus.count(name) == 1);
        CHECK(plus[name].ino == a.ino);
        CHECK(plus[name].mode == a.mode);
        CHECK(plus[name].size == a.size);
        CHECK(plus[name].nlink == a.nlink);
        CHECK(plus[name].opaque == a.opaque);
      }
      INFO(path);
      REQUIRE(a.ino == dino);
      MObj o{S_ISDIR(a.mode) ? 'd' : 'f', "", a.mode & 07777, a.ino};
      if (!S_ISDIR(a.mode)) {
        std::vector<std::byte> buf(a.size + 1);
        size_t n = must(u.read(a.ino, 0, buf));
        REQUIRE(n == a.size);
        o.data.assign(reinterpret_cast<char*>(buf.data()), n);
      }
      seen[path] = o;
      if (S_ISDIR(a.mode)) {
        // The walk below goes through what readdirplus recorded of the
        // directory (its merged parts), not what lookup did.
        must(u.readdirplus(dir, 0, [](const DirEntry&, const Attr*) { return true; }));
        walk(a.ino, path);
      }
    }
  };
  walk(u.root(), "");
  std::set<std::string> all;
  for (auto& [p, o] : m) all.insert(p);
  for (auto& [p, o] : seen) all.insert(p);
  std::set<uint64_t> inos;
  for (const auto& p : all) {
    INFO("path " << p);
    REQUIRE(m.count(p) == 1);
    REQUIRE(seen.count(p) == 1);
    MObj& want = m[p];
    const MObj& got = seen[p];
    REQUIRE(want.type == got.type);
    REQUIRE(want.mode == got.mode);
    REQUIRE(want.data == got.data);
    if (want.ino) REQUIRE(want.ino == got.ino);
    want.ino = got.ino;
    if (got.type == 'd') REQUIRE(inos.insert(got.ino).second);  // unique (files may be links)
  }
}

struct Config {
  std::vector<bool> writable;
  DeleteMode del = DeleteMode::Whiteout;
};

std::unique_ptr<Union> make_union(Image& im, const Config& c) {
  std::vector<UnionBranch> bs;
  for (size_t i = 0; i < im.fs.size(); i++) bs.push_back({im.fs[i].get(), bool(c.writable[i])});
  return std::make_unique<Union>(std::move(bs), CopyUpMode{}, c.del);
}

// One random operation on the union and on the model: whether the model
// says it must succeed, and whether it did.
struct OpOutcome {
  bool want = false, got = false;
  std::string what;  // the operation, for messages
};

OpOutcome random_op(Union& u, Model& m, std::mt19937_64& rng) {
  const char* names[] = {"a", "b", "c", "d", "e"};
  auto random_path = [&]() {
    std::string p = names[rng() % 5];
    while (rng() % 3 == 0 && p.size() < 9) p += std::string("/") + names[rng() % 5];
    return p;
  };
  auto is_dir = [&](const std::string& p) { return p.empty() || (m.count(p) && m[p].type == 'd'); };
  const std::string a = random_path(), b = random_path();
  const std::string pa = parent_of(a), pb = parent_of(b);
  const int kind = int(rng() % 10);
  const std::string what = "kind " + std::to_string(kind) + " " + a + " " + b;
  bool want = false, got = false;
  switch (kind) {
    case 0: {  // create
      want = is_dir(pa) && !m.count(a);
      auto d = resolve(u, pa);
      got = d && u.mknod(*d, base_of(a), S_IFREG | 0640, 0, kRoot).ok();
      if (want) m[a] = MObj{'f', "", 0640};
      break;
    }
    case 1: {  // mkdir
      want = is_dir(pa) && !m.count(a);
      auto d = resolve(u, pa);
      got = d && u.mkdir(*d, base_of(a), 0750, kRoot).ok();
      if (want) m[a] = MObj{'d', "", 0750};
      break;
    }
    case 2: case 3: {  // write (copy-up of a lower file)
      want = m.count(a) && m[a].type == 'f';
      auto i = resolve(u, a);
      if (i && want) {
        const bool big = g_compress.on() && rng() % 3 == 0;
        const uint64_t off = big ? (rng() % 4) * 4096 + rng() % 2 * (rng() % 4096) : rng() % 30;
        const std::string d = big ? big_text(rng) : std::string(1 + rng() % 20, char('a' + rng() % 26));
        got = u.open(*i, true, kRoot).ok() && u.write(*i, off, bytes(d), kRoot).ok();
        std::string& x = m[a].data;
        if (x.size() < off + d.size()) x.resize(off + d.size(), '\0');
        x.replace(off, d.size(), d);
      } else {
        got = i && u.write(*i, 0, bytes("x"), kRoot).ok();
      }
      break;
    }
    case 4: {  // truncate or chmod
      want = m.count(a) > 0;
      auto i = resolve(u, a);
      SetAttr st;
      if (want && m[a].type == 'f' && rng() % 2) {
        st.size = rng() % 10;
        m[a].data.resize(*st.size, '\0');
      } else {
        st.mode = 0700 | (rng() % 0100);
        if (want) m[a].mode = *st.mode;
      }
      got = i && u.setattr(*i, st, kRoot).ok();
      break;
    }
    case 5: {  // unlink
      want = m.count(a) && m[a].type == 'f';
      auto d = resolve(u, pa);
      got = d && u.unlink(*d, base_of(a)).ok();
      if (want) m.erase(a);
      break;
    }
    case 6: {  // rmdir
      bool empty = true;
      for (auto& [p, o] : m) empty &= !inside(p, a);
      want = m.count(a) && m[a].type == 'd' && empty;
      auto d = resolve(u, pa);
      got = d && u.rmdir(*d, base_of(a)).ok();
      if (want) m.erase(a);
      break;
    }
    default: {  // rename, files and whole directories, across branches
      want = m.count(a) && is_dir(pb) && a != b && !inside(b, a);
      if (want && m.count(b)) {
        const bool sd = m[a].type == 'd', dd = m[b].type == 'd';
        bool empty = true;
        for (auto& [p, o] : m) empty &= !inside(p, b);
        want = sd == dd && (!dd || empty);
      }
      if (a == b && m.count(a)) want = true;  // renaming onto itself: nothing
      auto od = resolve(u, pa);
      auto nd = resolve(u, pb);
      if (od && nd) {
        auto r = u.rename(*od, base_of(a), *nd, base_of(b), 0, kRoot);
        got = r.ok();
        if (!r) UNSCOPED_INFO("rename: " << r.error().message());
      }
      if (want && a != b) {
        Model moved;
        for (auto it = m.begin(); it != m.end();) {
          if (it->first == b || inside(it->first, b)) it = m.erase(it);
          else ++it;
        }
        for (auto it = m.begin(); it != m.end();) {
          if (it->first == a || inside(it->first, a)) {
            moved[b + it->first.substr(a.size())] = it->second;
            it = m.erase(it);
          } else {
            ++it;
          }
        }
        m.merge(moved);
      }
      break;
    }
  }
  return {want, got, what};
}

TEST_CASE("union: random operations agree with the model of the view", "[union][unionmodel]") {
  CompressAll compress_all(GENERATE(false, true));
  size_t frames = 0;
  const uint64_t s = seed("union-model");
  std::mt19937_64 rng(s);
  const int rounds = int(12 * scale());
  for (int round = 0; round < rounds; round++) {
    const size_t nb = 1 + rng() % 4;
    INFO("seed " << s << " round " << round << ", " << nb << " branches");
    Image im = make_image(nb);
    Config cfg;
    for (size_t i = 0; i < nb; i++) cfg.writable.push_back(i == 0 || rng() % 3 == 0);
    // Both deletion modes show the same view.
    if (rng() % 2) cfg.del = DeleteMode::All;
    INFO("delete mode " << (cfg.del == DeleteMode::All ? "all" : "whiteout"));
    for (size_t i = 0; i < nb; i++) populate(*im.fs[i], rng);
    std::vector<std::string> ro_before(nb);
    for (size_t i = 0; i < nb; i++)
      if (!cfg.writable[i]) ro_before[i] = dump(*im.fs[i], im.fs[i]->root());
    Model m;
    {
      std::vector<std::pair<int, uint64_t>> roots;
      for (size_t i = 0; i < nb; i++) roots.push_back({int(i), im.fs[i]->root()});
      merge(im.fs, roots, "", m);
    }
    auto u = make_union(im, cfg);
    compare(*u, m);
    const int nops = 150;
    for (int op = 0; op < nops; op++) {
      INFO("op " << op);
      auto [want, got, what] = random_op(*u, m, rng);
      INFO(what);
      if (want != got)
        for (size_t i = 0; i < nb; i++)
          UNSCOPED_INFO("branch " << i << (cfg.writable[i] ? " rw" : " ro") << ":\n"
                                  << dump(*im.fs[i], im.fs[i]->root()));
      REQUIRE(want == got);
      if (op % 25 == 24) compare(*u, m);
      if (op % 60 == 59) {  // a remount: whiteouts and opaque flags persist
        u.reset();
        im.close();
        im.open();
        u = make_union(im, cfg);
        compare(*u, m);
      }
    }
    compare(*u, m);
    // Read-only branches never change.
    for (size_t i = 0; i < nb; i++)
      if (!cfg.writable[i]) REQUIRE(dump(*im.fs[i], im.fs[i]->root()) == ro_before[i]);
    frames += compressed_items(im);
    u.reset();
    im.close();
    check_image(im);
  }
  if (g_compress.on()) CHECK(frames > 0);  // the compressed run made frames
}

// The view as the model reads it from the branches' trees.
Model read_view(Image& im) {
  Model m;
  std::vector<std::pair<int, uint64_t>> roots;
  for (size_t i = 0; i < im.fs.size(); i++) {
    roots.push_back({int(i), im.fs[i]->root()});
    if (must(im.fs[i]->getattr(im.fs[i]->root())).opaque) break;
  }
  merge(im.fs, roots, "", m);
  return m;
}

bool same_view(const Model& a, const Model& b) {
  if (a.size() != b.size()) return false;
  for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib)
    if (ia->first != ib->first || ia->second.type != ib->second.type ||
        ia->second.mode != ib->second.mode || ia->second.data != ib->second.data)
      return false;
  return true;
}

// The catalog's views as model entries (names starting with '\1', which no
// path has), so that the crash test checks them with the view.
const std::string kViewKey = "\1view/";

void add_views(Image& im, Model& m) {
  for (auto& v : must(list_views(*im.vol)))
    m[kViewKey + v.name] = MObj{'v', format_stack(*im.vol, v.layers) + (v.is_default ? " default" : ""), 0};
}

Model without_views(Model m) {
  for (auto it = m.begin(); it != m.end();) it = it->first.rfind(kViewKey, 0) == 0 ? m.erase(it) : std::next(it);
  return m;
}

// One random change of the catalog (create, replace or delete a view) on the
// volume and the model.
OpOutcome random_view_op(Image& im, Model& m, std::mt19937_64& rng) {
  const std::string name = "v" + std::to_string(rng() % 3);
  const std::string key = kViewKey + name;
  if (rng() % 3 == 0) {
    const bool want = m.count(key) > 0;
    m.erase(key);
    return {want, delete_view(*im.vol, name).ok(), "delete view " + name};
  }
  View v;
  v.name = name;
  v.is_default = rng() % 2;
  for (size_t i = 0; i < im.trees.size(); i++)
    if (i == 0 || rng() % 2) v.layers.push_back({im.trees[i], i == 0});
  if (v.is_default)
    for (auto& [k, o] : m)
      if (k.rfind(kViewKey, 0) == 0 && o.data.size() > 8 && o.data.ends_with(" default"))
        o.data.resize(o.data.size() - 8);
  m[key] = MObj{'v', format_stack(*im.vol, v.layers) + (v.is_default ? " default" : ""), 0};
  return {true, put_view(*im.vol, v).ok(), "put view " + name};
}

// The atomicity claim of the union layer (format.md#fs-union): every step of
// a multi-step operation (copy-ups, parent directories, whiteouts, opaque
// flags, hidden deletions) but the last leaves the view as it was. Here each
// filesystem operation is its own generation (commit_each_txn), and a power
// cut strikes at a random write: the recovered view must be the one before
// or the one after the operation that was running, never a mixture.
TEST_CASE("union: a power cut at any write of a union or view operation recovers the state before or after it",
          "[union][unioncrash]") {
  const uint64_t s = seed("union-crash");
  std::mt19937_64 rng(s);
  const int runs = int(40 * scale());
  int struck = 0;
  for (int run = 0; run < runs; run++) {
    const size_t nb = 2 + rng() % 2;
    INFO("seed " << s << " run " << run << ", " << nb << " branches");
    Image im = make_image(nb);
    Config cfg;
    for (size_t i = 0; i < nb; i++) cfg.writable.push_back(i == 0 || rng() % 3 == 0);
    if (rng() % 2) cfg.del = DeleteMode::All;
    for (size_t i = 0; i < nb; i++) populate(*im.fs[i], rng);
    im.close();
    im.dev->track_unflushed(true);
    FaultDevice dev(*im.dev);
    im.via = &dev;
    im.commit_each_txn = true;
    im.open();
    Model m = read_view(im);
    add_views(im, m);
    Model before = m;  // the view before the operation running when the power went
    std::optional<Model> after;
    std::string last;  // the operation that was running
    {
      auto u = make_union(im, cfg);
      FaultDevice::Rule rule;
      rule.op = FaultDevice::Op::Modify;
      rule.nth = rng() % 110 + 1;  // 100 operations make about 70-150 changes
      rule.sticky = true;
      rule.kind = rng() % 2 ? FaultDevice::Kind::Eio : FaultDevice::Kind::Torn;
      rule.seed = rng();
      INFO("cut at change " << rule.nth);
      dev.add(rule);
      for (int op = 0; op < 100; op++) {
        before = m;
        // One operation in eight changes the catalog instead (views).
        auto [want, got, what] = rng() % 8 == 0 ? random_view_op(im, m, rng) : random_op(*u, m, rng);
        last = what + (want ? " (must succeed)" : " (must fail)");
        if (dev.fired()) {
          struck++;
          if (want) after = m;
          break;
        }
        INFO("op " << op);
        REQUIRE(want == got);
      }
      if (!dev.fired()) before = m, last = "nothing (every operation completed)";
      // The power is off: drop everything without closing.
      u.reset();
      im.fs.clear();
      im.vol.reset();
    }
    im.dev->crash(rng);
    im.via = nullptr;
    im.commit_each_txn = false;
    check_image(im);
    im.open();
    Model got = read_view(im);
    add_views(im, got);
    const bool is_before = same_view(got, before);
    const bool is_after = after && same_view(got, *after);
    if (!is_before && !is_after) {
      auto show = [](const Model& x) {
        std::string o;
        for (auto& [p, ob] : x) o += p + " " + ob.type + " " + std::to_string(ob.mode) + " " + ob.data + "\n";
        return o;
      };
      UNSCOPED_INFO("during " << last << "\nrecovered:\n" << show(got) << "before:\n" << show(before)
                                    << (after ? "after:\n" + show(*after) : std::string()));
    }
    REQUIRE((is_before || is_after));
    // The union reads the recovered branches as the model does.
    auto u = make_union(im, cfg);
    Model view = without_views(got);
    compare(*u, view);
    u.reset();
    im.close();
  }
  // The cuts must land inside operations, not only after the last one.
  INFO(struck << " of " << runs << " runs cut during an operation");
  CHECK(struck > runs / 2);
}

// Two branches: a read-write top over a read-only base holding `files`.
struct TwoLayer {
  Image im = make_image(2);
  std::unique_ptr<Union> u;
  explicit TwoLayer(std::function<void(Filesystem&)> fill) {
    fill(*im.fs[1]);
    u = make_union(im, Config{{true, false}});
  }
};

TEST_CASE("union: copy-up is O(1), shares extents and keeps st_ino, owner, mode, times, xattrs", "[union]") {
  uint64_t big_ino = 0;
  const auto data = std::vector<std::byte>(8 << 20, std::byte{7});
  TwoLayer t([&](Filesystem& fs) {
    Attr a = must(fs.mknod(fs.root(), "big", S_IFREG | 0640, 0, 1000, 100));
    must(fs.write(a.ino, 0, data));
    must(fs.setxattr(a.ino, "user.k", bytes("v"), 0));
    SetAttr s;
    s.mtime = timespec{1000, 5};
    must(fs.setattr(a.ino, s));
    big_ino = a.ino;
  });
  Union& u = *t.u;
  Attr before = must(u.lookup(u.root(), "big"));
  const auto used_before = t.im.vol->space_stats();
  must(u.open(before.ino, true, kRoot));
  const auto used_after = t.im.vol->space_stats();
  // No data block was copied: a few metadata blocks at most.
  REQUIRE(used_before.free_blocks - used_after.free_blocks < 32);
  REQUIRE(u.branch_of(before.ino) == 0);
  Attr after = must(u.getattr(before.ino));
  CHECK(after.ino == big_ino);
  CHECK(after.uid == 1000);
  CHECK(after.gid == 100);
  CHECK(after.mode == before.mode);
  CHECK(after.mtime.tv_sec == 1000);
  CHECK(after.mtime.tv_nsec == 5);
  CHECK(must(u.getxattr(before.ino, "user.k")) == bytes("v"));
  // The write lands in the copy; the base keeps its data.
  must(u.write(before.ino, 0, bytes("new"), kRoot));
  std::vector<std::byte> buf(3);
  must(t.im.fs[1]->read(big_ino, 0, buf));
  CHECK(buf == std::vector<std::byte>(3, std::byte{7}));
  must(u.read(before.ino, 0, buf));
  CHECK(buf == bytes("new"));
  t.u.reset();
  t.im.close();
  REQUIRE(check_filesystems(*t.im.dev).empty());
}

// A file of many extents: copy-up grafts its items (format.md#btree-graft),
// so what it writes follows the seams, not the 1,500 extent items (at
// least 24 leaves' worth, which a copy item by item would write).
TEST_CASE("union: copy-up of a file of 1500 extents shares their leaves", "[union]") {
  uint64_t ino = 0;
  TwoLayer t([&](Filesystem& fs) {
    ino = must(fs.mknod(fs.root(), "frag", S_IFREG | 0644, 0, 0, 0)).ino;
    for (uint64_t i = 0; i < 1500; i++)
      must(fs.write(ino, 2 * i * 4096, std::vector<std::byte>(4096, std::byte(i))));
  });
  must(t.im.vol->commit());
  Union& u = *t.u;
  (void)must(u.lookup(u.root(), "frag"));
  const auto before = t.im.vol->space_stats();
  must(u.open(ino, true, kRoot));
  const auto after = t.im.vol->space_stats();
  INFO("copy-up took " << before.free_blocks - after.free_blocks << " blocks");
  REQUIRE(before.free_blocks - after.free_blocks < 16);
  // Writes on either side copy the shared leaf they change, nothing else.
  must(u.write(ino, 700 * 2 * 4096, bytes("upper"), kRoot));
  std::vector<std::byte> buf(5);
  must(t.im.fs[1]->read(ino, 700 * 2 * 4096, buf));
  CHECK(buf == std::vector<std::byte>(5, std::byte(700 % 256)));
  must(u.read(ino, 700 * 2 * 4096, buf));
  CHECK(buf == bytes("upper"));
  for (uint64_t i : {0ull, 1ull, 699ull, 701ull, 1499ull}) {
    must(u.read(ino, 2 * i * 4096 + 100, buf));
    CHECK(buf == std::vector<std::byte>(5, std::byte(i)));
  }
  t.u.reset();
  t.im.close();
  REQUIRE(check_filesystems(*t.im.dev).empty());
  VerifyOptions vo;
  vo.kinds = fs_kinds();
  auto rep = must(verify_image(*t.im.dev, vo));
  INFO(rep.summary());
  REQUIRE(rep.clean());
}

std::vector<std::byte> xpattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i++) v[i] = std::byte((i * 31 + size_t(seed) * 7 + i / 251) & 0xff);
  return v;
}

// Large xattrs (format.md#fs-xattr) are items of the object like the rest:
// copy-up copies the chunks with the record, and the copy owes nothing to
// the branch it came from.
TEST_CASE("union: copy-up keeps a 64 KiB xattr; the copy outlives its lower branch", "[union][xattr]") {
  uint64_t ino = 0;
  TwoLayer t([&](Filesystem& fs) {
    ino = must(fs.mknod(fs.root(), "f", S_IFREG | 0644, 0, 0, 0)).ino;
    must(fs.write(ino, 0, bytes("data")));
    must(fs.setxattr(ino, "user.big", xpattern(65536, 1), 0));
    must(fs.setxattr(ino, "user.small", bytes("s"), 0));
  });
  Union& u = *t.u;
  ino = must(u.lookup(u.root(), "f")).ino;  // the union's number of it
  must(u.open(ino, true, kRoot));           // copy-up
  REQUIRE(u.branch_of(ino) == 0);
  CHECK(must(u.getxattr(ino, "user.big")) == xpattern(65536, 1));
  CHECK(must(t.im.fs[0]->same_content(*t.im.fs[1], ino)));  // item for item, chunks included
  // The copy's value changes alone; written back, the items are the same again.
  must(u.setxattr(ino, "user.big", xpattern(40000, 2), 0, kRoot));
  CHECK(must(t.im.fs[1]->getxattr(ino, "user.big")) == xpattern(65536, 1));
  CHECK(!must(t.im.fs[0]->same_content(*t.im.fs[1], ino)));
  must(u.setxattr(ino, "user.big", xpattern(65536, 1), 0, kRoot));
  CHECK(must(t.im.fs[0]->same_content(*t.im.fs[1], ino)));
  must(u.setxattr(ino, "user.big", xpattern(65536, 3), XATTR_REPLACE, kRoot));
  t.u.reset();
  // The lower branch goes; the upper one still holds every byte.
  const TreeId upper = t.im.trees[0], lower = t.im.trees[1];
  t.im.close();
  t.im.trees = {upper};
  t.im.open();
  must(delete_branch(*t.im.vol, lower));
  must(t.im.vol->commit());
  CHECK(must(t.im.fs[0]->getxattr(ino, "user.big")) == xpattern(65536, 3));
  CHECK(must(t.im.fs[0]->getxattr(ino, "user.small")) == bytes("s"));
  t.im.close();
  check_image(t.im);
  t.im.open();
  CHECK(must(t.im.fs[0]->getxattr(ino, "user.big")) == xpattern(65536, 3));
  t.im.close();
}

TEST_CASE("union: copy-up modes set the owner and mode of copies", "[union]") {
  Image im = make_image(2);
  Attr a = must(im.fs[1]->mknod(im.fs[1]->root(), "f", S_IFREG | 0640, 0, 1000, 100));
  const Caller caller{2000, 200, 027};
  auto owner_after_copyup = [&](CopyUpMode mode) {
    Union u({{im.fs[0].get(), true}, {im.fs[1].get(), false}}, mode);
    Attr f = must(u.lookup(u.root(), "f"));
    REQUIRE(f.ino == a.ino);
    must(u.open(f.ino, true, caller));
    Attr c = must(im.fs[0]->getattr(a.ino));  // the copy, in the top branch
    must(u.unpin(f.ino));                           // the lookup's reference
    must(im.fs[0]->unlink(im.fs[0]->root(), "f"));  // undo, for the next mode
    return c;
  };
  Attr o = owner_after_copyup({});
  CHECK((o.uid == 1000 && o.gid == 100 && (o.mode & 07777) == 0640));
  Attr k = owner_after_copyup({CopyUpMode::Const, 7, 8, 0600});
  CHECK((k.uid == 7 && k.gid == 8 && (k.mode & 07777) == 0600));
  Attr c = owner_after_copyup({CopyUpMode::Current});
  // No pid: the umask is the fallback, 022 (copyup_umask).
  CHECK((c.uid == 2000 && c.gid == 200 && (c.mode & 07777) == 0640));
  // The base is untouched throughout.
  Attr base = must(im.fs[1]->getattr(a.ino));
  CHECK((base.uid == 1000 && base.gid == 100 && (base.mode & 07777) == 0640));
}

// copyup=current applies the caller's umask, read from /proc/PID/status:
// FUSE sends the umask with creations only.
TEST_CASE("union: copyup=current applies the calling process's umask", "[union]") {
  CHECK(copyup_umask(Caller{0, 0, 0, 0}) == 022);            // pid unknown
  CHECK(copyup_umask(Caller{0, 0, 0, 0x7ffffff0}) == 022);   // no such process
  const mode_t was = ::umask(077);
  CHECK(copyup_umask(Caller{0, 0, 0, uint32_t(::getpid())}) == 077);
  ::umask(027);
  CHECK(copyup_umask(Caller{0, 0, 0, uint32_t(::getpid())}) == 027);
  Image im = make_image(2);
  const uint64_t f = must(im.fs[1]->mknod(im.fs[1]->root(), "f", S_IFREG | 0666, 0, 1000, 100)).ino;
  const uint64_t g = must(im.fs[1]->mknod(im.fs[1]->root(), "g", S_IFREG | 0666, 0, 1000, 100)).ino;
  std::vector<uint64_t> hooked;
  {
    Union u({{im.fs[0].get(), true}, {im.fs[1].get(), false}}, {CopyUpMode::Current});
    u.set_copyup_hook([&](uint64_t ino) { hooked.push_back(ino); });
    must(u.lookup(u.root(), "f"));
    // The umask of the caller's process (027), not the one in Caller (0).
    must(u.open(f, true, Caller{2000, 200, 0, uint32_t(::getpid())}));
    ::umask(was);
    Attr c = must(im.fs[0]->getattr(f));
    CHECK((c.uid == 2000 && c.gid == 200 && (c.mode & 07777) == 0640));
    CHECK(hooked == std::vector<uint64_t>{f});
  }
  {
    // Nothing changes (the owner's copy-up, or the same owner and mode): no hook.
    hooked.clear();
    Union u({{im.fs[0].get(), true}, {im.fs[1].get(), false}}, {CopyUpMode::Const, 1000, 100, 0666});
    u.set_copyup_hook([&](uint64_t ino) { hooked.push_back(ino); });
    must(u.lookup(u.root(), "g"));
    must(u.open(g, true, kRoot));
    CHECK(u.branch_of(g) == 0);
    CHECK(hooked.empty());
  }
}

TEST_CASE("union: Unionfs's cases one by one", "[union]") {
  TwoLayer t([&](Filesystem& fs) {
    Attr d = must(fs.mkdir(fs.root(), "d", 0755, 0, 0));
    must(fs.mknod(d.ino, "x", S_IFREG | 0644, 0, 0, 0));
    must(fs.mknod(d.ino, "y", S_IFREG | 0644, 0, 0, 0));
    Attr f = must(fs.mknod(fs.root(), "f", S_IFREG | 0644, 0, 0, 0));
    must(fs.link(f.ino, fs.root(), "f2"));
  });
  Union& u = *t.u;
  const uint64_t d = must(u.lookup(u.root(), "d")).ino;

  SECTION("a successful delete never exposes a lower file") {
    must(u.unlink(d, "x"));
    CHECK(u.lookup(d, "x").error().code == ENOENT);
    const uint64_t upper_d = must(t.im.fs[0]->lookup(t.im.fs[0]->root(), "d")).ino;
    CHECK(upper_d == d);  // the copied-up parent keeps its number
    auto e = must(t.im.fs[0]->entry(upper_d, "x"));
    REQUIRE(e);
    CHECK(e->type == DT_WHT);
  }
  SECTION("rmdir of a lower directory needs it empty in the union, then hides it") {
    CHECK(u.rmdir(u.root(), "d").error().code == ENOTEMPTY);
    must(u.unlink(d, "x"));
    must(u.unlink(d, "y"));
    must(u.rmdir(u.root(), "d"));
    CHECK(u.lookup(u.root(), "d").error().code == ENOENT);
    SECTION("mkdir over a whiteout is empty (opaque)") {
      Attr nd = must(u.mkdir(u.root(), "d", 0700, kRoot));
      CHECK(nd.opaque);
      int n = 0;
      must(u.readdir(nd.ino, 0, [&](const DirEntry&) { return ++n, true; }));
      CHECK(n == 2);  // . and ..
    }
  }
  SECTION("a failed rename leaves both names as they were") {
    Attr x = must(u.lookup(d, "x"));
    CHECK(u.rename(d, "x", u.root(), "d", 0, kRoot).error().code == EISDIR);
    CHECK(u.rename(u.root(), "d", d, "z", 0, kRoot).error().code == EINVAL);
    CHECK(must(u.lookup(d, "x")).ino == x.ino);
    CHECK(must(u.lookup(u.root(), "d")).ino == d);
  }
  SECTION("rename of a lower directory: no EXDEV, contents and numbers kept") {
    const uint64_t x = must(u.lookup(d, "x")).ino;
    must(u.rename(u.root(), "d", u.root(), "e", 0, kRoot));
    CHECK(u.lookup(u.root(), "d").error().code == ENOENT);
    Attr e = must(u.lookup(u.root(), "e"));
    CHECK(e.ino == d);
    CHECK(must(u.lookup(e.ino, "x")).ino == x);
    CHECK(must(u.lookup(e.ino, "y")).ino != 0);
  }
  SECTION("hard links survive copy-up") {
    Attr f = must(u.lookup(u.root(), "f"));
    must(u.open(f.ino, true, kRoot));
    must(u.write(f.ino, 0, bytes("hello"), kRoot));
    Attr f2 = must(u.lookup(u.root(), "f2"));
    CHECK(f2.ino == f.ino);
    std::vector<std::byte> buf(5);
    must(u.read(f2.ino, 0, buf));
    CHECK(buf == bytes("hello"));
  }
  SECTION("readdir merges without duplicates, with stable cookies") {
    must(u.mknod(d, "z", S_IFREG | 0644, 0, kRoot));
    std::vector<std::pair<std::string, uint64_t>> all;
    must(u.readdir(d, 0, [&](const DirEntry& e) { return all.emplace_back(std::string(e.name), e.next), true; }));
    REQUIRE(all.size() == 5);  // . .. x y z
    // Resuming after each cookie yields the rest, also after another copy-up.
    must(u.open(must(u.lookup(d, "x")).ino, true, kRoot));
    for (size_t i = 0; i < all.size(); i++) {
      std::vector<std::string> rest;
      must(u.readdir(d, all[i].second, [&](const DirEntry& e) { return rest.emplace_back(e.name), true; }));
      REQUIRE(rest.size() == all.size() - i - 1);
      for (size_t j = 0; j < rest.size(); j++) CHECK(rest[j] == all[i + 1 + j].first);
    }
  }
}

// A file "f" holding "old" with four names: f, f2, d/g and d/hidden.
void four_names(Filesystem& fs) {
  Attr f = must(fs.mknod(fs.root(), "f", S_IFREG | 0644, 0, 0, 0));
  must(fs.write(f.ino, 0, bytes("old")));
  Attr d = must(fs.mkdir(fs.root(), "d", 0755, 0, 0));
  must(fs.link(f.ino, fs.root(), "f2"));
  must(fs.link(f.ino, d.ino, "g"));
  must(fs.link(f.ino, d.ino, "hidden"));
}

TEST_CASE("union: hard links survive copy-up: every visible name moves to the copy", "[union]") {
  TwoLayer t([&](Filesystem& fs) {
    four_names(fs);
  });
  Union& u = *t.u;
  const uint64_t d = must(u.lookup(u.root(), "d")).ino;
  const Attr f = must(u.lookup(u.root(), "f"));
  CHECK(f.nlink == 4);
  must(u.unlink(d, "hidden"));  // a whiteout hides one name: it stays behind
  auto content = [&](uint64_t dir, const char* name) {
    const Attr a = must(u.lookup(dir, name));
    std::vector<std::byte> out(a.size);
    CHECK(must(u.read(a.ino, 0, out)) == a.size);
    return std::string(reinterpret_cast<const char*>(out.data()), out.size());
  };
  must(u.open(f.ino, true, kRoot));  // the copy-up
  must(u.write(f.ino, 0, bytes("new!"), kRoot));
  // The three visible names are links of the copy in the upper branch.
  Filesystem& up = *t.im.fs[0];
  CHECK(must(up.lookup(up.root(), "f2")).ino == f.ino);
  CHECK(must(up.lookup(must(up.lookup(up.root(), "d")).ino, "g")).ino == f.ino);
  CHECK(must(up.getattr(f.ino)).nlink == 3);
  CHECK(must(u.getattr(f.ino)).nlink == 3);
  CHECK(content(u.root(), "f2") == "new!");
  CHECK(content(d, "g") == "new!");
  CHECK(u.lookup(d, "hidden").error().code == ENOENT);
  // Deleting the name the copy-up came through leaves the others on the
  // copy, not on the old version below.
  must(u.unlink(u.root(), "f"));
  CHECK(content(u.root(), "f2") == "new!");
  CHECK(content(d, "g") == "new!");
  CHECK(must(u.lookup(u.root(), "f2")).nlink == 2);
  must(u.unlink(d, "g"));
  CHECK(content(u.root(), "f2") == "new!");
  CHECK(must(u.lookup(u.root(), "f2")).nlink == 1);
  // The lower branch is untouched.
  CHECK(must(t.im.fs[1]->getattr(f.ino)).nlink == 4);
  must(t.im.vol->commit());
  check_image(t.im);
}

// Every filesystem operation its own generation (commit_each_txn), as a
// crash between any two would see them: the copy-up of a file with four
// names, their directory among them, still commits once.
TEST_CASE("union: the copy-up of a hard-linked file is one generation", "[union]") {
  Image im = make_image(2);
  four_names(*im.fs[1]);
  im.close();
  im.commit_each_txn = true;
  im.open();
  auto u = make_union(im, Config{{true, false}});
  const Attr f = must(u->lookup(u->root(), "f"));
  const Generation g0 = im.vol->durable_generation();
  must(u->open(f.ino, true, kRoot));
  // Five copies (the file, f2, d, g, hidden) and the file's ctime: one commit.
  CHECK(im.vol->durable_generation().v == g0.v + 1);
  CHECK(must(u->getattr(f.ino)).nlink == 4);
  CHECK(must(im.fs[0]->getattr(f.ino)).nlink == 4);
  // Groups nest, and a commit inside one is refused, not waited for.
  {
    Volume::Group outer(*im.vol);
    Volume::Group inner(*im.vol);
    auto c = im.vol->commit();
    REQUIRE(!c);
    CHECK(c.error().code == EDEADLK);
  }
  u.reset();
  im.close();
  REQUIRE(check_filesystems(*im.dev).empty());
}

// A copy-up group holds the commit gate while other threads' writes wait
// for a commit with a file's inode lock held: the group must never need
// one of those locks. Copy-ups of hard-linked files race writers and
// back-to-back commits; a deadlock hangs the test (ctest's timeout).
TEST_CASE("union: copy-ups of hard-linked files race writers and commits", "[union]") {
  constexpr int kFiles = 400;
  Image im = make_image(2);
  std::vector<uint64_t> lower;
  {
    Filesystem& fs = *im.fs[1];
    Attr d = must(fs.mkdir(fs.root(), "d", 0755, 0, 0));
    for (int i = 0; i < kFiles; i++) {
      Attr f = must(fs.mknod(fs.root(), "f" + std::to_string(i), S_IFREG | 0644, 0, 0, 0));
      must(fs.write(f.ino, 0, bytes("lower")));
      must(fs.link(f.ino, d.ino, "g" + std::to_string(i)));
      lower.push_back(f.ino);
    }
  }
  im.close();
  im.open();
  auto u = make_union(im, Config{{true, false}});
  std::vector<uint64_t> upper;
  for (int i = 0; i < 8; i++)
    upper.push_back(must(u->mknod(u->root(), "u" + std::to_string(i), S_IFREG | 0644, 0, kRoot)).ino);
  for (int i = 0; i < kFiles; i++) (void)must(u->lookup(u->root(), "f" + std::to_string(i)));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> writes{0}, commits{0};
  {
    std::vector<std::jthread> th;
    for (int w = 0; w < 2; w++)
      th.emplace_back([&, w] {
        for (uint64_t k = 0; !stop; k++) {
          must(u->write(upper[(k + w) % upper.size()], k % 64 * 4096, std::vector<std::byte>(4096, std::byte(k)), kRoot));
          writes++;
        }
      });
    th.emplace_back([&] {
      while (!stop) {
        must(im.vol->commit());
        commits++;
      }
    });
    for (int i = 0; i < kFiles; i++) {
      must(u->write(lower[i], 0, bytes("upper"), kRoot));  // copy-up of both names
      CHECK(must(im.fs[0]->getattr(lower[i])).nlink == 2);
    }
    stop = true;
  }
  INFO(writes << " writes, " << commits << " commits");
  CHECK(writes > 0);
  CHECK(commits > 0);
  u.reset();
  im.close();
  REQUIRE(check_filesystems(*im.dev).empty());
}

TEST_CASE("union: a rename of a hard-linked lower file keeps its other names on the moved copy", "[union]") {
  TwoLayer t([&](Filesystem& fs) {
    Attr f = must(fs.mknod(fs.root(), "f", S_IFREG | 0644, 0, 0, 0));
    must(fs.write(f.ino, 0, bytes("v1")));
    must(fs.link(f.ino, fs.root(), "other"));
  });
  Union& u = *t.u;
  const uint64_t ino = must(u.lookup(u.root(), "f")).ino;
  must(u.rename(u.root(), "f", u.root(), "moved", 0, kRoot));
  must(u.write(ino, 0, bytes("v2"), kRoot));
  must(u.unlink(u.root(), "moved"));
  const Attr o = must(u.lookup(u.root(), "other"));
  CHECK(o.ino == ino);
  CHECK(o.nlink == 1);
  std::vector<std::byte> out(2);
  must(u.read(ino, 0, out));
  CHECK(out == bytes("v2"));
  must(t.im.vol->commit());
  check_image(t.im);
}

TEST_CASE("union: deleting or replacing one name of a lower hard-linked file drops its count", "[union]") {
  TwoLayer t([&](Filesystem& fs) {
    Attr f = must(fs.mknod(fs.root(), "f", S_IFREG | 0644, 0, 0, 0));
    must(fs.write(f.ino, 0, bytes("F")));
    must(fs.link(f.ino, fs.root(), "g"));
    must(fs.link(f.ino, fs.root(), "h"));
    Attr x = must(fs.mknod(fs.root(), "x", S_IFREG | 0644, 0, 0, 0));
    must(fs.write(x.ino, 0, bytes("X")));
  });
  Union& u = *t.u;
  const uint64_t f = must(u.lookup(u.root(), "f")).ino;
  CHECK(must(u.getattr(f)).nlink == 3);
  must(u.unlink(u.root(), "h"));  // a whiteout alone would leave the count at 3
  CHECK(must(u.lookup(u.root(), "f")).nlink == 2);
  must(u.rename(u.root(), "x", u.root(), "f", 0, kRoot));  // replaces one name
  const Attr g = must(u.lookup(u.root(), "g"));
  CHECK(g.ino == f);
  CHECK(g.nlink == 1);
  std::vector<std::byte> out(1);
  must(u.read(f, 0, out));
  CHECK(out == bytes("F"));
  must(u.read(must(u.lookup(u.root(), "f")).ino, 0, out));
  CHECK(out == bytes("X"));
  CHECK(must(t.im.fs[1]->getattr(f)).nlink == 3);  // the read-only branch is untouched
  must(t.im.vol->commit());
  check_image(t.im);
}

TEST_CASE("union: a link whose name a whiteout hides in the file's branch goes further left", "[union]") {
  Image im = make_image(2);
  const uint64_t ino = must(im.fs[1]->mknod(im.fs[1]->root(), "f", S_IFREG | 0644, 0, 0, 0)).ino;
  must(im.fs[1]->write(ino, 0, bytes("data")));
  must(im.fs[1]->mknod(im.fs[1]->root(), "n", S_IFREG | 0644, 0, 0, 0));
  auto u = make_union(im, Config{{true, true}});  // both writable
  must(u->unlink(u->root(), "n"));  // branch 1 loses n; nothing below: no whiteout
  must(im.fs[0]->whiteout(im.fs[0]->root(), "n"));  // as an older deletion leaves it
  CHECK(u->lookup(u->root(), "n").error().code == ENOENT);
  must(u->lookup(u->root(), "f"));
  const Attr a = must(u->link(ino, u->root(), "n", kRoot));
  CHECK(a.ino == ino);
  CHECK(a.nlink == 2);
  CHECK(must(u->lookup(u->root(), "n")).ino == ino);
  CHECK(must(u->lookup(u->root(), "f")).nlink == 2);
  // Both names are in branch 0 now, on one copy.
  CHECK(must(im.fs[0]->lookup(im.fs[0]->root(), "f")).ino == ino);
  std::vector<std::byte> out(4);
  must(u->read(ino, 0, out));
  CHECK(out == bytes("data"));
  must(im.vol->commit());
  check_image(im);
}

TEST_CASE("union: a merged directory's link count is 1 (not counted), a plain one's is exact", "[union]") {
  TwoLayer t([&](Filesystem& fs) {
    Attr d = must(fs.mkdir(fs.root(), "d", 0755, 0, 0));
    must(fs.mkdir(d.ino, "lower", 0755, 0, 0));
    Attr p = must(fs.mkdir(fs.root(), "plain", 0755, 0, 0));
    must(fs.mkdir(p.ino, "a", 0755, 0, 0));
    must(fs.mkdir(p.ino, "b", 0755, 0, 0));
  });
  Union& u = *t.u;
  const uint64_t d = must(u.lookup(u.root(), "d")).ino;
  // Not merged yet: the lower directory's own count.
  CHECK(must(u.getattr(d)).nlink == 3);
  CHECK(must(u.lookup(u.root(), "plain")).nlink == 4);
  // A subdirectory made through the union copies d up: d now has two parts,
  // whose own counts (upper 3, lower 3) say nothing of the merged four.
  must(u.mkdir(d, "upper", 0755, kRoot));
  CHECK(must(u.getattr(d)).nlink == 1);
  CHECK(must(u.lookup(u.root(), "d")).nlink == 1);
  bool listed = false;
  must(u.readdirplus(u.root(), 0, [&](const DirEntry& e, const Attr* a) {
    if (e.name == "d") {
      REQUIRE(a);
      CHECK(a->nlink == 1);
      listed = true;
    }
    if (e.name == "plain") CHECK(a->nlink == 4);
    return true;
  }));
  CHECK(listed);
  CHECK(must(u.lookup(u.root(), "plain")).nlink == 4);
  // The branches themselves keep their true counts (fsck checks them).
  check_image(t.im);
}

TEST_CASE("union: delete=all removes the writable instances and whiteouts only over read-only ones", "[union]") {
  // rw0 over rw1 over ro2; "x" in all three, "y" in both writable ones,
  // "d" a directory in both writable ones (rw1's holding a name rw0 hides).
  Image im = make_image(3);
  auto mk = [&](int b, uint64_t dir, const char* name) {
    return must(im.fs[b]->mknod(dir, name, S_IFREG | 0644, 0, 0, 0)).ino;
  };
  for (int b = 0; b < 3; b++) mk(b, im.fs[b]->root(), "x");
  for (int b = 0; b < 2; b++) mk(b, im.fs[b]->root(), "y");
  const uint64_t d0 = must(im.fs[0]->mkdir(im.fs[0]->root(), "d", 0755, 0, 0)).ino;
  const uint64_t d1 = must(im.fs[1]->mkdir(im.fs[1]->root(), "d", 0755, 0, 0)).ino;
  mk(1, d1, "hidden");
  must(im.fs[0]->whiteout(d0, "hidden"));
  Union u({{im.fs[0].get(), true}, {im.fs[1].get(), true}, {im.fs[2].get(), false}}, {},
          DeleteMode::All);
  auto raw = [&](int b, uint64_t dir, const char* name) { return must(im.fs[b]->entry(dir, name)); };
  must(u.unlink(u.root(), "y"));
  CHECK(!raw(0, im.fs[0]->root(), "y"));  // no whiteout needed: nothing left below
  CHECK(!raw(1, im.fs[1]->root(), "y"));
  must(u.unlink(u.root(), "x"));
  CHECK(raw(0, im.fs[0]->root(), "x")->type == DT_WHT);  // over the read-only copy
  CHECK(!raw(1, im.fs[1]->root(), "x"));
  CHECK(raw(2, im.fs[2]->root(), "x")->type == DT_REG);  // read-only: untouched
  must(u.rmdir(u.root(), "d"));
  CHECK(raw(0, im.fs[0]->root(), "d")->type == DT_WHT);  // rw1's "d" could not go
  CHECK(raw(1, im.fs[1]->root(), "d")->type == DT_DIR);
  CHECK(u.lookup(u.root(), "d").error().code == ENOENT);
  // The default mode leaves the lower writable copies and whiteouts them.
  mk(0, im.fs[0]->root(), "z");
  mk(1, im.fs[1]->root(), "z");
  {
    Union w({{im.fs[0].get(), true}, {im.fs[1].get(), true}, {im.fs[2].get(), false}});
    must(w.unlink(w.root(), "z"));
  }
  CHECK(raw(0, im.fs[0]->root(), "z")->type == DT_WHT);
  CHECK(raw(1, im.fs[1]->root(), "z")->type == DT_REG);
  // A rename in delete=all mode takes the old name's lower copies along.
  mk(0, im.fs[0]->root(), "r");
  mk(1, im.fs[1]->root(), "r");
  must(u.rename(u.root(), "r", u.root(), "s", 0, kRoot));
  CHECK(!raw(0, im.fs[0]->root(), "r"));
  CHECK(!raw(1, im.fs[1]->root(), "r"));
  CHECK(u.lookup(u.root(), "r").error().code == ENOENT);
}

// A clone of main, registered as branch "x"; the image reopened with it
// (the Filesystems of before are gone: im.fs[0] is main's new one).
TreeId clone_of_main(Image& im) {
  TreeId clone;
  {
    auto t = must(im.vol->begin({.reserve_blocks = 64}));
    clone = must(t.clone_tree(im.trees[0]));
  }
  BranchMeta m;
  m.tree = clone;
  m.name = "x";
  m.parent = im.trees[0];
  must(Filesystem::set_branch(*im.vol, m));
  im.trees.push_back(clone);
  im.close();
  im.open();
  return clone;
}

// The names a union directory lists, without . and ..; each listed entry's
// number must be what a lookup of its name gives.
std::vector<std::string> union_names(Union& u, uint64_t dir) {
  std::vector<std::string> out;
  std::vector<std::pair<std::string, uint64_t>> listed;
  must(u.readdir(dir, 0, [&](const DirEntry& e) {
    if (e.name != "." && e.name != "..") listed.emplace_back(std::string(e.name), e.ino);
    return true;
  }));
  for (auto& [name, ino] : listed) {
    Attr a = must(u.lookup(dir, name));
    CHECK(a.ino == ino);
    must(u.unpin(a.ino));
    out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// format.md#fs-union, "Inode numbers": one number names one object in a
// view, with the names of the leftmost branch of its lineage holding it.
TEST_CASE("union: an object a clone renamed shows once, under the clone's name", "[union][lineage]") {
  Image im = make_image(1);
  Filesystem& main = *im.fs[0];
  const uint64_t f = must(main.mknod(main.root(), "f", S_IFREG | 0644, 0, 0, 0)).ino;
  must(main.write(f, 0, bytes("old")));
  const TreeId clone = clone_of_main(im);
  // In the clone the object is renamed and changed: no whiteout, it is not
  // a layer. Stacked over main, main's name "f" would name the same object
  // (the same inode number) under a second name with nlink 1.
  Filesystem& x = *im.fs[1];
  must(x.rename(x.root(), "f", x.root(), "g", 0));
  must(x.write(f, 0, bytes("new")));
  Union u({{im.fs[1].get(), true}, {im.fs[0].get(), false}});
  CHECK(u.lookup(u.root(), "f").error().code == ENOENT);
  Attr viag = must(u.lookup(u.root(), "g"));
  CHECK(viag.ino == f);
  CHECK(viag.nlink == 1);
  CHECK(union_names(u, u.root()) == std::vector<std::string>{"g"});
  std::vector<std::byte> buf(3);
  must(u.read(viag.ino, 0, buf));
  CHECK(buf == bytes("new"));
  CHECK(u.branch_of(f) == 0);
  // readdirplus hides it too.
  std::vector<std::string> plus;
  must(u.readdirplus(u.root(), 0, [&](const DirEntry& e, const Attr* a) {
    if (a) plus.emplace_back(e.name);
    return true;
  }));
  CHECK(plus == std::vector<std::string>{"g"});
  for (size_t i = 0; i < plus.size(); i++) must(u.unpin(f));
  // The name is free: a new file there is another object, and main keeps its f.
  Attr nf = must(u.mknod(u.root(), "f", S_IFREG | 0644, 0, kRoot));
  CHECK(nf.ino != f);
  CHECK(union_names(u, u.root()) == std::vector<std::string>({"f", "g"}));
  CHECK(must(im.fs[0]->entry(im.fs[0]->root(), "f"))->ino == f);
  // Is the clone told apart from a layer?
  CHECK(!must(is_layer(*im.vol, must(Filesystem::branch(*im.vol, clone)))));
  // The other way round (main over its clone), main's names win.
  Union r({{im.fs[0].get(), false}, {im.fs[1].get(), false}});
  CHECK(must(r.lookup(r.root(), "f")).ino == f);
  CHECK(r.lookup(r.root(), "g").error().code == ENOENT);
}

TEST_CASE("union: hard links in a clone over its source: the clone's names and count", "[union][lineage]") {
  Image im = make_image(1);
  Filesystem& main = *im.fs[0];
  const uint64_t a = must(main.mknod(main.root(), "a", S_IFREG | 0644, 0, 0, 0)).ino;
  must(main.link(a, main.root(), "h"));
  must(main.link(a, main.root(), "gone"));
  clone_of_main(im);
  Filesystem& x = *im.fs[1];
  must(x.rename(x.root(), "a", x.root(), "b", 0));
  must(x.unlink(x.root(), "gone", false));
  Union u({{im.fs[1].get(), true}, {im.fs[0].get(), false}});
  CHECK(union_names(u, u.root()) == std::vector<std::string>({"b", "h"}));
  Attr b = must(u.lookup(u.root(), "b"));
  Attr h = must(u.lookup(u.root(), "h"));
  CHECK(b.ino == a);
  CHECK(h.ino == a);
  CHECK(b.nlink == 2);
  CHECK(h.nlink == 2);
  CHECK(u.lookup(u.root(), "a").error().code == ENOENT);
  CHECK(u.lookup(u.root(), "gone").error().code == ENOENT);
  must(u.write(a, 0, bytes("via h"), kRoot));
  std::vector<std::byte> buf(5);
  must(x.read(a, 0, buf));
  CHECK(buf == bytes("via h"));
  // Unlinking one of the clone's names drops the count the other shows.
  must(u.unlink(u.root(), "h"));
  CHECK(must(u.getattr(a)).nlink == 1);
  CHECK(union_names(u, u.root()) == std::vector<std::string>{"b"});
  // main is untouched.
  CHECK(must(im.fs[0]->getattr(a)).nlink == 3);
}

TEST_CASE("union: a directory a clone renamed shows once; its emptied source can go", "[union][lineage]") {
  Image im = make_image(1);
  Filesystem& main = *im.fs[0];
  const uint64_t d = must(main.mkdir(main.root(), "d", 0755, 0, 0)).ino;
  must(main.mknod(d, "x", S_IFREG | 0644, 0, 0, 0));
  const uint64_t keep = must(main.mkdir(main.root(), "keep", 0755, 0, 0)).ino;
  const uint64_t y = must(main.mknod(keep, "y", S_IFREG | 0644, 0, 0, 0)).ino;
  clone_of_main(im);
  Filesystem& x = *im.fs[1];
  must(x.rename(x.root(), "d", x.root(), "e", 0));
  must(x.rename(keep, "y", d, "y", 0));
  Union u({{im.fs[1].get(), true}, {im.fs[0].get(), false}});
  CHECK(union_names(u, u.root()) == std::vector<std::string>({"e", "keep"}));
  CHECK(u.lookup(u.root(), "d").error().code == ENOENT);
  Attr e = must(u.lookup(u.root(), "e"));
  CHECK(e.ino == d);
  CHECK(union_names(u, d) == std::vector<std::string>({"x", "y"}));
  // keep merges the clone's and main's parts (one object, one name); main's
  // part still names y, which the clone holds in e: keep is empty.
  Attr k = must(u.lookup(u.root(), "keep"));
  CHECK(k.ino == keep);
  CHECK(union_names(u, keep).empty());
  CHECK(u.lookup(keep, "y").error().code == ENOENT);
  CHECK(must(u.lookup(d, "y")).ino == y);
  must(u.rmdir(u.root(), "keep"));
  CHECK(union_names(u, u.root()) == std::vector<std::string>{"e"});
}

TEST_CASE("union: a layer (another lineage) keeps showing hard-link copies", "[union][lineage]") {
  // A layer over main: a copy-up of one name of a hard-linked file brings
  // the others, and the union shows the copy (leftmost_copy), as before.
  Image im = make_image(2);
  Filesystem& low = *im.fs[1];
  const uint64_t a = must(low.mknod(low.root(), "a", S_IFREG | 0644, 0, 0, 0)).ino;
  must(low.link(a, low.root(), "b"));
  Union u({{im.fs[0].get(), true}, {im.fs[1].get(), false}});
  must(u.lookup(u.root(), "a"));
  must(u.open(a, true, kRoot));
  CHECK(u.branch_of(a) == 0);
  CHECK(must(u.lookup(u.root(), "b")).ino == a);
  CHECK(must(u.lookup(u.root(), "b")).nlink == 2);
  CHECK(union_names(u, u.root()) == std::vector<std::string>({"a", "b"}));
}

TEST_CASE("union: the catalog checks (U4) find views that name gone or read-only branches", "[union]") {
  Image im = make_image(3);
  CHECK(check_views(*im.vol).empty());  // no catalog yet
  must(put_view(*im.vol, View{"a", true, {{im.trees[1], true}, {im.trees[0], false}}}));
  must(put_view(*im.vol, View{"b", false, {{im.trees[2], true}}}));
  CHECK(check_views(*im.vol).empty());
  // Branches changed behind the views' back (plyctl refuses both).
  BranchMeta ro = must(Filesystem::branch(*im.vol, im.trees[1]));
  ro.read_only = true;
  must(Filesystem::set_branch(*im.vol, ro));
  im.fs.pop_back();
  {
    auto t = must(im.vol->begin({.for_delete = true}));
    must(t.drop_tree(im.trees[2]));
  }
  auto ps = check_views(*im.vol);
  std::string all;
  for (const auto& p : ps) {
    CHECK(p.code == "U4-view");
    all += p.message + "\n";
  }
  INFO(all);
  CHECK(ps.size() == 2);
  CHECK(all.find("writes to read-only branch \"b1\"") != std::string::npos);
  CHECK(all.find("names tree " + std::to_string(im.trees[2].v) + ", which is no branch") != std::string::npos);
}

TEST_CASE("union: views and stacks in the catalog persist", "[union]") {
  Image im = make_image(3);
  auto bs = must(Filesystem::branches(*im.vol));
  REQUIRE(bs.size() == 3);
  CHECK(must(default_stack(*im.vol)).size() == 1);
  auto st = must(parse_stack(*im.vol, "b1=rw:main:b2=ro"));
  REQUIRE(st.size() == 3);
  CHECK(st[0].writable);
  CHECK(!st[1].writable);
  CHECK(parse_stack(*im.vol, "main:main").error().code == EINVAL);
  CHECK(parse_stack(*im.vol, "nope").error().code == ENOENT);
  CHECK(parse_stack(*im.vol, "main=xx").error().code == EINVAL);
  must(put_view(*im.vol, View{"v1", true, st}));
  must(put_view(*im.vol, View{"v2", true, {{st[2].tree, true}}}));
  im.close();
  im.open();
  auto views = must(list_views(*im.vol));
  REQUIRE(views.size() == 2);
  CHECK(!views[0].is_default);
  CHECK(views[1].is_default);
  CHECK(must(default_stack(*im.vol)).at(0).tree == st[2].tree);
  CHECK(must(view_stack(*im.vol, "v1")).size() == 3);
  must(delete_view(*im.vol, "v1"));
  CHECK(view_stack(*im.vol, "v1").error().code == ENOENT);
  // A branch flagged read-only may not be writable in a view.
  BranchMeta b = must(Filesystem::branch(*im.vol, st[2].tree));
  b.read_only = true;
  must(Filesystem::set_branch(*im.vol, b));
  CHECK(parse_stack(*im.vol, "b2=rw").error().code == EROFS);
  im.close();
  REQUIRE(check_filesystems(*im.dev).empty());
}


// --- snapshots, clones, merges, rollback, diff (lib/snap, format.md#snapshots) --------

// A mounted stack as the daemon keeps it: the image's volume, the stack's
// branches open, and a union over them.
struct Mounted {
  Image& im;
  std::vector<ViewLayer> stack;
  std::unique_ptr<Union> u;

  void open() {
    im.trees.clear();
    for (const auto& l : stack) im.trees.push_back(l.tree);
    im.open();
    must(drop_doomed(*im.vol));  // what a merge or rollback replaced (as a mount does)
    remake();
  }
  void remake() {
    std::vector<UnionBranch> bs;
    for (size_t i = 0; i < stack.size(); i++) bs.push_back({im.fs[i].get(), stack[i].writable});
    u = std::make_unique<Union>(std::move(bs));
  }
  // A lifecycle operation changed the branches: remount on the new stack.
  void remount(std::vector<ViewLayer> next) {
    u.reset();
    im.close();
    stack = std::move(next);
    open();
  }
  int index_of(TreeId t) const {
    for (size_t i = 0; i < stack.size(); i++)
      if (stack[i].tree == t) return int(i);
    return -1;
  }
  // A snapshot as a mount takes it: while nothing else runs
  // (fuse/lifecycle.cpp, take_snapshot). Nothing the union shows changes.
  Snapshot snapshot_live(const std::string& name) {
    Snapshot sn;
    must(u->hold_still([&]() -> Result<void> {
      sn = PLY_TRY(snapshot(*im.vol, PLY_TRY(snapshot_target(stack)), name));
      return ok();
    }));
    return sn;
  }
  // A new empty layer on the stack's writable branch, stacked over it
  // read-write (OLFS's transactional use: work in a layer, then merge it
  // down or roll it back). Returns the layer (live) and the branch below it
  // (frozen: read-only in the stack now).
  struct Layered {
    BranchMeta live, frozen;
  };
  Layered layer_up(const std::string& name) {
    const TreeId top = must(snapshot_target(stack));
    BranchMeta base = must(Filesystem::branch(*im.vol, top));
    BranchMeta l = must(create_layer(*im.vol, name, top, false));
    auto next = stack;
    const long at = index_of(top);
    next[size_t(at)].writable = false;
    next.insert(next.begin() + at, ViewLayer{l.tree, true});
    remount(next);
    return {l, base};
  }
  // The same made online: inserted at the top by the union's restack, which
  // keeps what the union knows (the pins move in O(1)).
  Layered layer_up_live(const std::string& name) {
    const TreeId top = must(snapshot_target(stack));
    BranchMeta base = must(Filesystem::branch(*im.vol, top));
    BranchMeta l = must(create_layer(*im.vol, name, top, false));
    must(u->restack([&]() -> Result<std::vector<UnionBranch>> {
      const long at = index_of(top);
      stack[size_t(at)].writable = false;
      stack.insert(stack.begin() + at, ViewLayer{l.tree, true});
      im.fs.insert(im.fs.begin() + at, PLY_TRY(Filesystem::open(*im.vol, l.tree)));
      im.trees.insert(im.trees.begin() + at, l.tree);
      std::vector<UnionBranch> bs;
      for (size_t i = 0; i < stack.size(); i++) bs.push_back({im.fs[i].get(), stack[i].writable});
      return bs;
    }));
    return {l, base};
  }
};

// One branch's raw names (whiteouts hidden), with inode numbers, for diff.
struct Raw {
  char type;
  std::string data;
  uint32_t mode;
  std::pair<int64_t, long> mtime;  // a truncate to the same size changes only this
};
std::map<std::pair<std::string, uint64_t>, Raw> raw(Filesystem& fs, uint64_t dir = 0, const std::string& prefix = "") {
  std::map<std::pair<std::string, uint64_t>, Raw> out;
  if (!dir) dir = fs.root();
  std::vector<std::pair<std::string, uint64_t>> es;
  must(fs.readdir(dir, 2, [&](const DirEntry& e) {
    if (e.type != DT_WHT) es.emplace_back(std::string(e.name), e.ino);
    return true;
  }));
  for (auto& [name, ino] : es) {
    const std::string p = prefix + "/" + name;
    Attr a = must(fs.getattr(ino));
    Raw r{S_ISDIR(a.mode) ? 'd' : 'f', "", a.mode, {a.mtime.tv_sec, a.mtime.tv_nsec}};
    if (!S_ISDIR(a.mode)) {
      std::vector<std::byte> buf(a.size);
      must(fs.read(ino, 0, buf));
      r.data.assign(reinterpret_cast<char*>(buf.data()), buf.size());
    } else {
      out.merge(raw(fs, ino, p));
    }
    out[{p, ino}] = r;
  }
  return out;
}

// The same of what a view shows: a layer's branch over its ancestors.
std::map<std::pair<std::string, uint64_t>, Raw> raw_union(Union& u, uint64_t dir, const std::string& prefix) {
  std::map<std::pair<std::string, uint64_t>, Raw> out;
  std::vector<std::pair<std::string, Attr>> es;
  must(u.readdirplus(dir, 2, [&](const DirEntry& e, const Attr* a) {
    if (a) es.emplace_back(std::string(e.name), *a);
    return true;
  }));
  for (auto& [name, a] : es) {
    const std::string p = prefix + "/" + name;
    Raw r{S_ISDIR(a.mode) ? 'd' : 'f', "", a.mode, {a.mtime.tv_sec, a.mtime.tv_nsec}};
    if (!S_ISDIR(a.mode)) {
      std::vector<std::byte> buf(a.size);
      must(u.read(a.ino, 0, buf));
      r.data.assign(reinterpret_cast<char*>(buf.data()), buf.size());
    } else {
      out.merge(raw_union(u, a.ino, p));
    }
    out[{p, a.ino}] = r;
  }
  return out;
}
std::map<std::pair<std::string, uint64_t>, Raw> raw_view(Volume& v, TreeId t) {
  auto b = must(Filesystem::branch(v, t));
  auto ou = must(open_union(v, must(layer_stack(v, b.name)), true, true));
  return raw_union(*ou.u, ou.u->root(), "");
}
// Two layers on one parent are compared by what they show (snap.h, diff).
bool layers_on_one_parent(Volume& v, TreeId a, TreeId b) {
  auto x = must(Filesystem::branch(v, a)), y = must(Filesystem::branch(v, b));
  return x.parent == y.parent && must(is_layer(v, x)) && must(is_layer(v, y));
}

// diff(a, b) against the two branches' raw contents: every (path, inode)
// only in b is added (or a rename's new name), every one only in a removed
// (or a rename's old name), and every file in both whose bytes or mode
// changed is reported modified.
void check_diff(Volume& v, TreeId a, TreeId b, const std::map<std::pair<std::string, uint64_t>, Raw>& ra,
                const std::map<std::pair<std::string, uint64_t>, Raw>& rb) {
  auto d = must(diff(v, a, b));
  std::set<std::string> added, removed, modified, want_added, want_removed, want_modified;
  for (const auto& e : d) {
    if (e.change == Change::Added) added.insert(e.path);
    if (e.change == Change::Removed) removed.insert(e.path);
    if (e.change == Change::Modified) modified.insert(e.path);
    if (e.change == Change::Renamed) removed.insert(e.path), added.insert(e.new_path);
  }
  for (const auto& [k, r] : rb)
    if (!ra.count(k)) want_added.insert(k.first);
  for (const auto& [k, r] : ra) {
    auto it = rb.find(k);
    if (it == rb.end()) want_removed.insert(k.first);
    else if (r.type == 'f' && (r.data != it->second.data || r.mode != it->second.mode)) want_modified.insert(k.first);
  }
  // A renamed directory is reported once (zfs diff's way): what moved with
  // it, under the same inode numbers, is not a change of its own.
  for (const auto& e : d) {
    if (e.change != Change::Renamed) continue;
    const std::string o = e.path + "/", n = e.new_path + "/";
    for (const auto& [k, r] : rb) {
      if (k.first.rfind(n, 0) != 0) continue;
      const std::string old_path = o + k.first.substr(n.size());
      if (ra.count({old_path, k.second})) want_added.erase(k.first), want_removed.erase(old_path);
    }
  }
  std::string shown;
  for (const auto& e : d) shown += std::string(1, char(e.change)) + " " + e.path + " " + e.new_path + "\n";
  INFO("diff:\n" << shown);
  CHECK(added == want_added);
  CHECK(removed == want_removed);
  for (const auto& p : want_modified) {
    INFO("modified " << p);
    CHECK(modified.count(p) == 1);
  }
  // A file renamed and nothing else is reported renamed only. Its mtime
  // counts: an operation that changes neither bytes nor mode may set it (a
  // truncate to the same size), and the diff then rightly says M; whether
  // the two times differ depends on the clock's tick (4 ms, coarse), so
  // the model's bytes and mode alone made this check flaky.
  for (const auto& e : d) {
    if (e.change != Change::Renamed || e.type != DT_REG) continue;
    const Raw* before = nullptr;
    const Raw* after = nullptr;
    for (const auto& [k, r] : ra)
      if (k.first == e.path) before = &r;
    for (const auto& [k, r] : rb)
      if (k.first == e.new_path) after = &r;
    if (before && after && before->data == after->data && before->mode == after->mode &&
        before->mtime == after->mtime) {
      INFO("renamed " << e.path << " -> " << e.new_path);
      CHECK(modified.count(e.new_path) == 0);
    }
  }
}


// What a stack shows, read through a union over it (a snapshot's frozen view).
Model view_of(Volume& v, const std::vector<ViewLayer>& stack) {
  auto ou = must(open_union(v, stack, true, true));
  Model m;
  std::vector<std::pair<int, uint64_t>> roots;
  for (size_t i = 0; i < ou.fs.size(); i++) {
    roots.push_back({int(i), ou.fs[i]->root()});
    if (must(ou.fs[i]->getattr(ou.fs[i]->root())).opaque) break;
  }
  merge(ou.fs, roots, "", m);
  return m;
}

// Random union workloads interleaved with snapshots (O(1) clones that
// change nothing the mount shows), layers made and merged down or rolled
// back, rollbacks to snapshots, clones, diffs and deletions. A snapshot
// keeps the view it was taken of for ever; a merge keeps the view and every
// inode number; a rollback shows what the snapshot (or, for a layer without
// one, the branch below) showed; a diff matches the branches' contents.
TEST_CASE("snap: snapshots, merges, rollbacks, clones and diffs agree with the union model",
          "[snap][snapmodel]") {
  CompressAll compress_all(GENERATE(false, true));
  const uint64_t s = seed("snap-model");
  std::mt19937_64 rng(s);
  const int rounds = int(24 * scale());
  int merges = 0, rollbacks = 0, snap_rollbacks = 0, snaps = 0, diffs = 0, layer_diffs = 0, deletes = 0;
  for (int round = 0; round < rounds; round++) {
    INFO("seed " << s << " round " << round);
    Image im = make_image(1);
    populate(*im.fs[0], rng);
    Mounted mt{im, {{im.trees[0], true}}, nullptr};
    im.close();
    mt.open();
    Model m = read_view(im);
    compare(*mt.u, m);
    std::map<uint64_t, Model> below;   // layer tree -> the view below it when it was made
    std::map<uint64_t, Model> frozen;  // snapshot tree -> the view it was taken of
    int names = 0;
    for (int step = 0; step < 16; step++) {
      INFO("step " << step);
      for (int op = 0; op < 15; op++) {
        auto [want, got, what] = random_op(*mt.u, m, rng);
        INFO(what);
        REQUIRE(want == got);
      }
      const int kind = int(rng() % 7);
      INFO("lifecycle " << kind << " on " << format_stack(*im.vol, mt.stack));
      const TreeId top = must(snapshot_target(mt.stack));
      if (kind <= 1) {  // snapshot of the writable branch, offline or online
        const std::string name = "s" + std::to_string(names++);
        const auto was = mt.stack;
        Snapshot sn;
        if (rng() % 2) {
          sn = must(snapshot(*im.vol, top, name));
        } else {
          sn = mt.snapshot_live(name);
        }
        REQUIRE(sn.live.tree == top);
        REQUIRE(sn.frozen.snapshot);
        REQUIRE(sn.frozen.read_only);
        REQUIRE(sn.frozen.origin == top);
        REQUIRE(mt.stack.size() == was.size());  // the mount never grows deeper
        frozen[sn.frozen.tree.v] = m;
        snaps++;
      } else if (kind == 2 && mt.stack.size() < 6) {  // a layer to work in
        mt.layer_up("l" + std::to_string(names++));
        below[mt.stack[0].tree.v] = m;
      } else if (kind == 3) {  // merge a random layer into the branch below it
        std::vector<size_t> cand;
        for (size_t i = 0; i + 1 < mt.stack.size(); i++) {
          auto b = must(Filesystem::branch(*im.vol, mt.stack[i].tree));
          if (b.parent == mt.stack[i + 1].tree && must(is_layer(*im.vol, b)) && !b.read_only) cand.push_back(i);
        }
        if (cand.empty()) continue;
        const size_t i = cand[rng() % cand.size()];
        const TreeId upper = mt.stack[i].tree, lower = mt.stack[i + 1].tree;
        auto r = merge(*im.vol, upper, im.fs[i].get());
        // A view (the default one an earlier merge made for plain mounts)
        // that shows the lower branch alone refuses it.
        if (!r && r.error().code == EBUSY && r.error().message().find("view") != std::string::npos) continue;
        auto mg = must(std::move(r));
        im.fs[i]->retire();  // the branch's content was replaced (snap.h)
        REQUIRE(mg.lower == lower);
        REQUIRE(mg.merged.tree == upper);  // the branch keeps its id
        auto next = mt.stack;
        next.erase(next.begin() + long(i) + 1);
        if (below.count(lower.v)) below[upper.v] = below[lower.v];
        else below.erase(upper.v);
        mt.remount(next);
        merges++;
      } else if (kind == 4) {  // rollback of the writable branch
        auto b = must(Filesystem::branch(*im.vol, top));
        auto snapshots = must(snapshots_of(*im.vol, top));
        // Those taken while the branch sat where it sits now (a merge since
        // moved it onto another parent: such a snapshot belongs elsewhere).
        const TreeId here = must(is_layer(*im.vol, b)) ? b.parent : top;
        std::erase_if(snapshots, [&](const BranchMeta& x) { return x.parent != here || !frozen.count(x.tree.v); });
        if (!snapshots.empty()) {
          const bool newest = rng() % 2;
          const BranchMeta& to = newest ? snapshots.back() : snapshots[rng() % snapshots.size()];
          auto rb = newest && must(snapshots_of(*im.vol, top)).back().tree == to.tree
                        ? must(rollback(*im.vol, top))
                        : must(rollback(*im.vol, top, to.tree));
          REQUIRE(rb.to);
          REQUIRE(rb.to->tree == to.tree);
          REQUIRE(rb.branch.tree == top);
          REQUIRE(rb.branch.name == b.name);
          m = frozen[to.tree.v];
          snap_rollbacks++;
        } else if (below.count(top.v) && must(is_layer(*im.vol, b)) && must(snapshots_of(*im.vol, top)).empty()) {
          auto rb = must(rollback(*im.vol, top));
          REQUIRE(!rb.to);
          REQUIRE(rb.branch.tree == top);
          m = below[top.v];
        } else {
          continue;
        }
        im.fs[0]->retire();  // the branch's content was replaced (snap.h)
        mt.remount(mt.stack);
        rollbacks++;
      } else if (kind == 5 && !frozen.empty()) {  // a snapshot's content, and its deletion
        auto it = frozen.begin();
        std::advance(it, long(rng() % frozen.size()));
        const TreeId sn{it->first};
        auto b = must(Filesystem::branch(*im.vol, sn));
        INFO("snapshot " << b.name);
        // It shows what the view showed when it was taken (its lower
        // branches are read-only, or kept by it when merged away).
        Model now = view_of(*im.vol, must(layer_stack(*im.vol, b.name)));
        REQUIRE(same_view(now, it->second));
        // A diff against the branch it was taken of reads what changed.
        if (mt.index_of(b.origin) >= 0) {
          auto sfs = must(Filesystem::open(*im.vol, sn, true));
          if (layers_on_one_parent(*im.vol, sn, b.origin))
            check_diff(*im.vol, sn, b.origin, raw_view(*im.vol, sn), raw_view(*im.vol, b.origin));
          else
            check_diff(*im.vol, sn, b.origin, raw(*sfs), raw(*im.fs[size_t(mt.index_of(b.origin))]));
          diffs++;
        }
        if (rng() % 2) {
          // It frees exactly the exclusive bytes it reported (usage.h).
          delete_checked(*im.vol, sn, [&](auto progress) { must(delete_branch(*im.vol, sn, progress)); });
          frozen.erase(it);
          deletes++;
        }
      } else {  // clone the writable branch, change it, diff, delete the clone
        auto c = must(clone_branch(*im.vol, top, "c" + std::to_string(names++), true));
        const bool views = layers_on_one_parent(*im.vol, c.tree, top);
        auto before = views ? raw_view(*im.vol, c.tree) : raw(*im.fs[0]);
        for (int op = 0; op < 15; op++) {
          auto [want, got, what] = random_op(*mt.u, m, rng);
          INFO(what);
          REQUIRE(want == got);
        }
        must(im.vol->commit());  // what the view over the branch reads
        check_diff(*im.vol, c.tree, top, before, views ? raw_view(*im.vol, top) : raw(*im.fs[0]));
        delete_checked(*im.vol, c.tree, [&](auto progress) { must(delete_branch(*im.vol, c.tree, progress)); });
        diffs++;
      }
      compare(*mt.u, m);
      // Every branch's referenced and exclusive bytes, after every
      // lifecycle step and the copy-ups of the operations before it.
      check_accounting(*im.vol);
    }
    // Every snapshot left still shows what it was taken of, after a remount.
    mt.remount(mt.stack);
    for (const auto& [tree, view] : frozen) {
      auto b = must(Filesystem::branch(*im.vol, TreeId{tree}));
      INFO("snapshot " << b.name << " at the end");
      REQUIRE(same_view(view_of(*im.vol, must(layer_stack(*im.vol, b.name))), view));
    }
    // A layer's diff against the branch it is on is the change of the view
    // since the layer was made.
    if (mt.stack.size() >= 2 && below.count(mt.stack[0].tree.v)) {
      auto b = must(Filesystem::branch(*im.vol, mt.stack[0].tree));
      if (b.parent == mt.stack[1].tree && must(is_layer(*im.vol, b))) {
        const Model& old = below[mt.stack[0].tree.v];
        auto d = must(diff(*im.vol, mt.stack[1].tree, mt.stack[0].tree));
        layer_diffs++;
        // Paths without the leading slash, as the model's.
        std::set<std::string> plus, minus, modified, want_added, want_removed;
        std::vector<std::pair<std::string, std::string>> renames;  // old, new
        std::string shown;
        for (const auto& e : d) {
          shown += std::string(1, char(e.change)) + " " + e.path + (e.new_path.empty() ? "" : " -> " + e.new_path) + "\n";
          std::string p = e.path.substr(1);
          if (e.change == Change::Added) plus.insert(p);
          if (e.change == Change::Removed) minus.insert(p);
          if (e.change == Change::Modified) modified.insert(p);
          if (e.change == Change::Renamed) renames.emplace_back(p, e.new_path.substr(1));
        }
        INFO("layer diff:\n" << shown);
        // Where a path of the view was before, through the deepest rename at
        // or above it (what a renamed directory carried along moved with it).
        auto before = [&](const std::string& p) {
          size_t best = 0;
          std::string q = p;
          for (const auto& [o, n] : renames)
            if ((p == n || p.rfind(n + "/", 0) == 0) && n.size() > best) best = n.size(), q = o + p.substr(n.size());
          return q;
        };
        for (const auto& [o, n] : renames) {
          INFO("R " << o << " -> " << n);
          CHECK((old.count(o) && m.count(n) && old.at(o).type == m.at(n).type));
        }
        std::set<std::string> came;  // old paths the view's paths came from
        for (const auto& [p, o] : m) {
          const std::string q = before(p);
          if (old.count(q) && old.at(q).type == o.type) came.insert(q);
          else want_added.insert(p);
        }
        for (const auto& [q, o] : old)
          if (!came.count(q)) want_removed.insert(q);
        std::set<std::string> renamed_to, renamed_from;
        for (const auto& [o, n] : renames) renamed_from.insert(o), renamed_to.insert(n);
        for (const auto& p : want_added) {
          INFO("added " << p);
          CHECK((plus.count(p) || renamed_to.count(p)));
        }
        for (const auto& q : want_removed) {
          INFO("removed " << q);
          CHECK((minus.count(q) || renamed_from.count(q)));
        }
        // Nothing else, but for an object replaced by another at its path:
        // + there, and - or R from where it was before (the path alone cannot
        // tell a file under a renamed directory from a new one of its name).
        std::map<std::string, std::string> now_at;  // old path -> its path in the view
        for (const auto& [p, o] : m) now_at[before(p)] = p;
        auto replaced = [&](const std::string& p) {
          const std::string q = before(p);
          if (plus.count(p) && (minus.count(q) || renamed_from.count(q))) return true;
          for (size_t cut = p.rfind('/'); cut != std::string::npos; cut = cut ? p.rfind('/', cut - 1) : std::string::npos)
            if (plus.count(p.substr(0, cut))) return true;  // in a new directory: new too
          return false;
        };
        for (const auto& p : plus) {
          INFO("reported added " << p);
          CHECK((want_added.count(p) || replaced(p)));
        }
        for (const auto& q : minus) {
          INFO("reported removed " << q);
          CHECK((want_removed.count(q) || renamed_to.count(q) || (now_at.count(q) && replaced(now_at[q]))));
        }
        for (const auto& [p, o] : m) {
          auto it = old.find(before(p));
          if (it == old.end() || o.type != 'f' || (it->second.data == o.data && it->second.mode == o.mode)) continue;
          INFO("changed " << p << " (was " << it->first << ")");
          CHECK((modified.count(p) || replaced(p)));
        }
      }
    }
    mt.u.reset();
    im.close();
    check_image(im);
  }
  INFO(snaps << " snapshots, " << merges << " merges, " << rollbacks << " rollbacks (" << snap_rollbacks
             << " to snapshots), " << diffs << " diffs, " << deletes << " snapshot deletions");
  CHECK(snaps > 0);
  CHECK(merges > 0);
  CHECK(rollbacks > snap_rollbacks);
  CHECK(snap_rollbacks > 0);
  CHECK(deletes > 0);
  CHECK(layer_diffs > 0);
}

// Space: what a deleted snapshot or clone held comes back, to the block.
TEST_CASE("snap: deleting a clone or a snapshot, or merging a layer, returns the space the old data held", "[snap]") {
  Image im = make_image(1);
  im.close();
  Mounted mt{im, {{im.trees[0], true}}, nullptr};
  mt.open();
  const uint64_t bs = im.vol->block_size();
  const size_t mib = 16;
  std::vector<std::byte> buf(1 << 20);
  auto fill = [&](Union& u, uint64_t ino, size_t from_mib, size_t n, char c) {
    std::fill(buf.begin(), buf.end(), std::byte(c));
    for (size_t i = from_mib; i < from_mib + n; i++) must(u.write(ino, i << 20, buf, kRoot));
  };
  uint64_t f = must(mt.u->mknod(mt.u->root(), "big", S_IFREG | 0644, 0, kRoot)).ino;
  fill(*mt.u, f, 0, mib, 'a');
  must(im.vol->commit());
  const uint64_t data0 = im.vol->space_stats().data_blocks;
  REQUIRE(data0 == mib * (1 << 20) / bs);
  const auto free0 = mt.u->statfs().bfree;

  // btrfs style: a clone, the original half overwritten, the clone deleted.
  auto c = must(clone_branch(*im.vol, mt.stack[0].tree, "copy", true));
  fill(*mt.u, f, 0, mib / 2, 'b');
  must(im.vol->commit());
  CHECK(im.vol->space_stats().data_blocks == data0 + data0 / 2);
  must(delete_branch(*im.vol, c.tree));
  must(im.vol->commit());
  must(im.vol->commit());  // what the deletion freed is reusable once durable
  CHECK(im.vol->space_stats().data_blocks == data0);

  // A snapshot (an O(1) clone), half overwritten, the snapshot deleted.
  auto sn = must(snapshot(*im.vol, mt.stack[0].tree, "snap"));
  CHECK(im.vol->space_stats().data_blocks == data0);  // O(1): no data copied
  fill(*mt.u, f, 0, mib / 2, 'b');
  must(im.vol->commit());
  CHECK(im.vol->space_stats().data_blocks == data0 + data0 / 2);
  must(delete_branch(*im.vol, sn.frozen.tree));
  must(im.vol->commit());
  must(im.vol->commit());
  CHECK(im.vol->space_stats().data_blocks == data0);

  // OLFS style: a layer, half overwritten through a copy-up, merged down
  // (the lower branch goes: nothing else is layered on it).
  const BranchMeta layer = mt.layer_up("work").live;
  f = must(resolve(*mt.u, "big"));
  must(mt.u->open(f, true, kRoot));
  fill(*mt.u, f, mib / 2, mib / 2, 'c');
  must(im.vol->commit());
  CHECK(im.vol->space_stats().data_blocks == data0 + data0 / 2);
  auto mg = must(merge(*im.vol, layer.tree, im.fs[0].get()));
  im.fs[0]->retire();
  CHECK(mg.merged.name == "work");
  CHECK(mg.lower_doomed);
  mt.remount({{mg.merged.tree, true}});
  must(im.vol->commit());
  must(im.vol->commit());
  CHECK(im.vol->space_stats().data_blocks == data0);
  // The merged file reads as the view showed it.
  f = must(resolve(*mt.u, "big"));
  std::vector<std::byte> got(1 << 20);
  for (size_t i = 0; i < mib; i++) {
    must(mt.u->read(f, i << 20, got));
    CHECK(got[0] == std::byte(i < mib / 2 ? 'b' : 'c'));
  }
  // statfs agrees, within the metadata the trees moved.
  const auto free1 = mt.u->statfs().bfree;
  CHECK(free1 + 64 >= free0);
  CHECK(free1 <= free0 + 64);
  auto names = must(Filesystem::branches(*im.vol));
  CHECK(names.size() == 1);
  mt.u.reset();
  im.close();
  check_image(im);
}

// A rename in a layer is a copy-up (same inode number) and a whiteout; the
// layer diff pairs the two back into one R, as the clone diff reports it.
TEST_CASE("snap: a layer diff reports a rename as R", "[snap]") {
  Image im = make_image(1);
  im.close();
  Mounted mt{im, {{im.trees[0], true}}, nullptr};
  mt.open();
  Union& u0 = *mt.u;
  const std::vector<std::byte> one(100, std::byte('1'));
  auto file = [&](Union& u, uint64_t dir, const char* name) {
    uint64_t ino = must(u.mknod(dir, name, S_IFREG | 0644, 0, kRoot)).ino;
    must(u.write(ino, 0, one, kRoot));
    return ino;
  };
  for (const char* n : {"f", "g", "h", "del", "hl1"}) file(u0, u0.root(), n);
  const uint64_t d = must(u0.mkdir(u0.root(), "d", 0755, kRoot)).ino;
  file(u0, d, "x");
  const uint64_t sub = must(u0.mkdir(d, "sub", 0755, kRoot)).ino;
  file(u0, sub, "y");
  must(u0.link(must(resolve(u0, "hl1")), u0.root(), "hl2", kRoot));
  auto sn = mt.layer_up("s1");
  Union& u = *mt.u;
  const uint64_t root = u.root();
  must(u.rename(root, "f", root, "f2", 0, kRoot));       // R only
  must(u.rename(root, "g", root, "g2", 0, kRoot));       // R and M
  const uint64_t g2 = must(resolve(u, "g2"));
  must(u.open(g2, true, kRoot));
  // Longer: the clock may not have ticked since g was made (attributes tell).
  must(u.write(g2, 0, std::vector<std::byte>(200, std::byte('2')), kRoot));
  // R and M: the same size and mtime, other bytes (the data tells).
  must(u.rename(root, "h", root, "h2", 0, kRoot));
  const uint64_t h2 = must(resolve(u, "h2"));
  const timespec mtime = must(u.getattr(h2)).mtime;
  must(u.open(h2, true, kRoot));
  must(u.write(h2, 0, std::vector<std::byte>(100, std::byte('3')), kRoot));
  SetAttr keep;
  keep.mtime = mtime;
  must(u.setattr(h2, keep, kRoot));
  must(u.rename(root, "d", root, "d2", 0, kRoot));       // a lower directory: one R
  must(u.rename(root, "hl1", root, "hl3", 0, kRoot));    // both names of one inode
  must(u.rename(root, "hl2", root, "hl4", 0, kRoot));    // moved: ambiguous
  must(u.unlink(root, "del"));                           // unrelated - and +
  file(u, root, "new");
  std::string shown;
  for (const auto& e : must(diff(*im.vol, sn.frozen.tree, sn.live.tree)))
    shown += std::string(1, char(e.change)) + " " + e.path + (e.new_path.empty() ? "" : " -> " + e.new_path) +
             (e.change == Change::Renamed ? (e.type == DT_DIR ? " dir" : " file") : "") + "\n";
  CHECK(shown ==
        "R /d -> /d2 dir\n"
        "- /del\n"
        "R /f -> /f2 file\n"
        "R /g -> /g2 file\n"
        "M /g2\n"
        "R /h -> /h2 file\n"
        "M /h2\n"
        "- /hl1\n"
        "- /hl2\n"
        "+ /hl3\n"
        "+ /hl4\n"
        "+ /new\n");
  mt.u.reset();
  im.close();
  check_image(im);
}

// Large xattrs in the snapshot operations: a clone diff sees one byte of a
// 64 KiB value change (its chunks are items); a layer diff pairs a renamed
// copy-up with its original only while its chunks are the same; a merge
// carries the values down, on files and on directories.
TEST_CASE("snap: diffs and merges see large xattrs", "[snap][xattr]") {
  Image im = make_image(1);
  im.close();
  Mounted mt{im, {{im.trees[0], true}}, nullptr};
  mt.open();
  Union& u0 = *mt.u;
  for (const char* n : {"f", "g", "h"}) {
    const uint64_t ino = must(u0.mknod(u0.root(), n, S_IFREG | 0644, 0, kRoot)).ino;
    must(u0.setxattr(ino, "user.big", xpattern(65536, 1), 0, kRoot));
  }
  const uint64_t d = must(u0.mkdir(u0.root(), "d", 0755, kRoot)).ino;
  must(u0.setxattr(d, "user.big", xpattern(30000, 1), 0, kRoot));
  auto show = [](const std::vector<DiffEntry>& es) {
    std::string s;
    for (const auto& e : es)
      s += std::string(1, char(e.change)) + " " + e.path + (e.new_path.empty() ? "" : " -> " + e.new_path) + "\n";
    return s;
  };
  {
    // The last byte of f's value, in a clone.
    auto c = must(clone_branch(*im.vol, mt.stack[0].tree, "c", false));
    auto cfs = must(Filesystem::open(*im.vol, c.tree));
    auto v = xpattern(65536, 1);
    v.back() ^= std::byte{1};
    const uint64_t f = must(cfs->lookup(cfs->root(), "f")).ino;
    must(cfs->setxattr(f, "user.big", v, XATTR_REPLACE));
    CHECK(show(must(diff(*im.vol, mt.stack[0].tree, c.tree))) == "M /f\n");
    cfs.reset();
    must(delete_branch(*im.vol, c.tree));
  }
  auto sn = mt.layer_up("s1");
  Union& u = *mt.u;
  const uint64_t root = u.root();
  must(u.setxattr(must(resolve(u, "f")), "user.big", xpattern(65536, 2), 0, kRoot));
  must(u.rename(root, "g", root, "g2", 0, kRoot));  // a copy-up, same chunks: R only
  must(u.rename(root, "h", root, "h2", 0, kRoot));  // and a changed chunk: R and M
  auto v = xpattern(65536, 1);
  v[40000] ^= std::byte{1};
  must(u.setxattr(must(resolve(u, "h2")), "user.big", v, 0, kRoot));
  must(u.setxattr(must(resolve(u, "d")), "user.big", xpattern(50000, 2), 0, kRoot));
  const std::string shown = show(must(diff(*im.vol, sn.frozen.tree, sn.live.tree)));
  CHECK(shown.find("M /f\n") != std::string::npos);
  CHECK(shown.find("R /g -> /g2\n") != std::string::npos);
  CHECK(shown.find("M /g2\n") == std::string::npos);
  CHECK(shown.find("R /h -> /h2\nM /h2\n") != std::string::npos);
  auto mg = must(merge(*im.vol, sn.live.tree, im.fs[0].get()));
  im.fs[0]->retire();
  mt.remount({{mg.merged.tree, true}});
  CHECK(must(mt.u->getxattr(must(resolve(*mt.u, "f")), "user.big")) == xpattern(65536, 2));
  CHECK(must(mt.u->getxattr(must(resolve(*mt.u, "g2")), "user.big")) == xpattern(65536, 1));
  CHECK(must(mt.u->getxattr(must(resolve(*mt.u, "h2")), "user.big")) == v);
  CHECK(must(mt.u->getxattr(must(resolve(*mt.u, "d")), "user.big")) == xpattern(50000, 2));
  mt.u.reset();
  im.close();
  check_image(im);
}

// Deleting a branch is one transaction however large the branch: the walk
// that frees its tree reports as it goes, and ends with what it freed.
TEST_CASE("snap: deleting a branch reports what it frees as it goes", "[snap]") {
  Image im = make_image(2);
  const size_t files = 3000;
  const std::vector<std::byte> data(8192, std::byte('d'));  // two blocks: one extent
  for (size_t i = 0; i < files; i++) {
    const uint64_t ino = must(im.fs[1]->mknod(im.fs[1]->root(), "f" + std::to_string(i), S_IFREG | 0644, 0, 0, 0, 0)).ino;
    must(im.fs[1]->write(ino, 0, data));
  }
  const TreeId gone = im.trees[1];
  im.fs.pop_back();
  im.trees.pop_back();
  must(im.vol->commit());
  const SpaceStats before = im.vol->space_stats();
  // Its nodes, counted as plyctl debug tree does (nothing shares them).
  uint64_t nodes = 0;
  {
    const SuperInfo sb = must(read_superblocks(*im.dev)).info;
    auto t = must(im.vol->begin());
    BlockCache cache(*im.dev, sb.block_size, 16 << 20);
    WalkMemo memo;
    std::vector<Problem> problems;
    WalkHooks h;
    h.on_node = [&](BlockNo, int, Generation, uint64_t, bool first) { nodes += first; };
    check_tree(cache, sb.fs_id, must(t.tree_info(gone)).root, sb.generation, h, memo, problems);
    REQUIRE(problems.empty());
  }
  std::vector<BTree::DropStats> seen;
  must(delete_branch(*im.vol, gone, [&](const BTree::DropStats& st) { seen.push_back(st); }));
  must(im.vol->commit());
  must(im.vol->commit());  // what the deletion freed counts once durable
  const SpaceStats after = im.vol->space_stats();
  REQUIRE(seen.size() > 3);
  for (size_t i = 1; i < seen.size(); i++) {
    INFO("call " << i);
    CHECK(seen[i].nodes >= seen[i - 1].nodes);
    CHECK(seen[i].extents >= seen[i - 1].extents);
    CHECK(seen[i].nodes + seen[i].extents > seen[i - 1].nodes + seen[i - 1].extents);
  }
  // The share of the tree walked grows to 1 and follows the nodes freed
  // (nothing shares them, and the tree is balanced): a progress line's
  // percentage and ETA come from it.
  for (size_t i = 1; i < seen.size(); i++) {
    INFO("call " << i << ": " << seen[i].nodes << " of " << nodes << " nodes, fraction " << seen[i].fraction);
    CHECK(seen[i].fraction >= seen[i - 1].fraction);
    CHECK(seen[i].fraction <= 1.0);
    CHECK(std::abs(seen[i].fraction - double(seen[i].nodes) / double(nodes)) < 0.2);
  }
  CHECK(seen.back().fraction == 1.0);
  // The last call holds the totals: every node of the tree, every file's extent.
  CHECK(seen.back().nodes == nodes);
  CHECK(nodes > 100);
  CHECK(seen.back().extents == files);
  CHECK(before.data_blocks - after.data_blocks == files * data.size() / im.vol->block_size());
  im.close();
  check_image(im);
}

TEST_CASE("snap: refusals leave everything as it was", "[snap]") {
  Image im = make_image(1);
  im.close();
  Mounted mt{im, {{im.trees[0], true}}, nullptr};
  mt.open();
  const TreeId base = mt.stack[0].tree;
  // A base branch is no layer: nothing to merge into; without a snapshot
  // nothing to roll back to.
  CHECK(merge(*im.vol, base).error().code == EINVAL);
  CHECK(rollback(*im.vol, base).error().code == EINVAL);
  CHECK(delete_branch(*im.vol, base).error().code == EBUSY);  // the only branch
  auto sn = must(snapshot(*im.vol, base, "one"));
  CHECK(snapshot(*im.vol, base, "one").error().code == EEXIST);
  CHECK(snapshot(*im.vol, base, "a/b").error().code == EINVAL);
  // A snapshot is read-only: it does not roll back, and is no rollback
  // target for another branch.
  CHECK(rollback(*im.vol, sn.frozen.tree).error().code == EROFS);
  auto other = must(clone_branch(*im.vol, base, "other", false));
  CHECK(rollback(*im.vol, other.tree, sn.frozen.tree).error().code == EINVAL);
  must(delete_branch(*im.vol, other.tree));
  // A view shows the snapshot: it cannot go.
  must(put_view(*im.vol, View{"old", false, {{sn.frozen.tree, false}}}));
  auto refused = delete_branch(*im.vol, sn.frozen.tree);
  CHECK(refused.error().code == EBUSY);
  CHECK(refused.error().message().find("view \"old\" shows \"one\"") != std::string::npos);
  // A layer U on main; a view must not show main other than right below U.
  auto l = mt.layer_up("u");
  must(put_view(*im.vol, View{"lower", false, {{base, false}}}));
  CHECK(merge(*im.vol, l.live.tree).error().code == EBUSY);
  must(delete_view(*im.vol, "lower"));
  // A layer on U: U cannot roll back under it.
  FsCreateOptions o;
  o.name = "onu";
  o.parent = l.live.tree;
  TreeId onu = must(Filesystem::create(*im.vol, o));
  CHECK(rollback(*im.vol, l.live.tree).error().code == EBUSY);
  must(delete_branch(*im.vol, onu));
  // The view "old" shows the snapshot, a clone of main, not a layer on it:
  // main merges (and goes, nothing being layered on it).
  auto mg = must(merge(*im.vol, l.live.tree, im.fs[0].get()));
  im.fs[0]->retire();
  CHECK(mg.merged.name == "u");
  CHECK(mg.merged.tree == l.live.tree);
  CHECK(mg.lower_doomed);
  must(drop_doomed(*im.vol));
  CHECK(must(Filesystem::branches(*im.vol)).size() == 2);  // u, and the snapshot
  CHECK(must(view_stack(*im.vol, "old")).size() == 1);
  mt.u.reset();
  mt.stack = {{mg.merged.tree, true}};
  im.trees = {mg.merged.tree};
  im.fs.clear();
  im.close();
  check_image(im);
}

// diff between a layer and its snapshot compares what the two show over
// their parent: a copy-up is a change, not an addition; a whiteout removes
// the parent's names with everything below them; names only one layer made
// come and go.
TEST_CASE("snap: diff between a layer and its snapshot compares their views", "[snap]") {
  Image im = make_image(1);
  im.close();
  Mounted mt{im, {{im.trees[0], true}}, nullptr};
  mt.open();
  uint64_t root = mt.u->root();
  const uint64_t docs0 = must(mt.u->mkdir(root, "docs", 0755, kRoot)).ino;
  must(mt.u->mknod(must(mt.u->mkdir(docs0, "notes", 0755, kRoot)).ino, "x", S_IFREG | 0644, 0, kRoot));
  must(mt.u->mknod(root, "hello", S_IFREG | 0644, 0, kRoot));
  must(mt.u->mknod(root, "same", S_IFREG | 0644, 0, kRoot));
  must(mt.u->mknod(root, "chmodded", S_IFREG | 0644, 0, kRoot));
  auto l = mt.layer_up("work");
  root = mt.u->root();  // a new union: its objects are looked up again
  // Before the snapshot: one copy-up and one file of the layer's own.
  uint64_t f = must(resolve(*mt.u, "chmodded"));
  SetAttr sa;
  sa.mode = 0600;
  must(mt.u->setattr(f, sa, kRoot));
  must(mt.u->mknod(root, "mine", S_IFREG | 0644, 0, kRoot));
  must(mt.u->mknod(root, "kept", S_IFREG | 0644, 0, kRoot));
  auto sn = mt.snapshot_live("s");
  REQUIRE(must(is_layer(*im.vol, sn.frozen)));
  // After it: the parent's directory removed whole (a whiteout), the
  // parent's file written (a copy-up), the layer's own file removed (no
  // whiteout: the parent never had it), a new file; "same", "kept" and
  // "chmodded" stay as they were.
  must(mt.u->unlink(must(resolve(*mt.u, "docs/notes")), "x"));
  must(mt.u->rmdir(must(resolve(*mt.u, "docs")), "notes"));
  f = must(resolve(*mt.u, "hello"));
  must(mt.u->open(f, true, kRoot));
  const std::vector<std::byte> data(4096, std::byte('h'));
  must(mt.u->write(f, 0, data, kRoot));
  must(mt.u->unlink(root, "mine"));
  must(mt.u->mknod(root, "new", S_IFREG | 0644, 0, kRoot));
  must(im.vol->commit());
  std::string shown;
  for (const auto& e : must(diff(*im.vol, sn.frozen.tree, l.live.tree)))
    shown += std::string(1, char(e.change)) + " " + e.path + "\n";
  CHECK(shown ==
        "M /\n"
        "M /docs\n"
        "- /docs/notes\n"
        "- /docs/notes/x\n"
        "M /hello\n"
        "- /mine\n"
        "+ /new\n");
  // And back: the same changes the other way.
  shown.clear();
  for (const auto& e : must(diff(*im.vol, l.live.tree, sn.frozen.tree)))
    shown += std::string(1, char(e.change)) + " " + e.path + "\n";
  CHECK(shown ==
        "M /\n"
        "M /docs\n"
        "+ /docs/notes\n"
        "+ /docs/notes/x\n"
        "M /hello\n"
        "+ /mine\n"
        "- /new\n");
  mt.u.reset();
  im.close();
  check_image(im);
}

// A merge's progress says what share of the layer's names it has walked:
// it only grows, ends at 1, and follows the entries applied.
TEST_CASE("snap: a merge reports the share of the layer it has walked", "[snap]") {
  Image im = make_image(1);
  im.close();
  Mounted mt{im, {{im.trees[0], true}}, nullptr};
  mt.open();
  auto l = mt.layer_up("work");
  // 4,000 names in uneven directories: 3,000 in one, 10 dirs of 90, the rest at the root.
  const uint64_t big = must(mt.u->mkdir(mt.u->root(), "big", 0755, kRoot)).ino;
  for (int i = 0; i < 3000; i++) must(mt.u->mknod(big, "f" + std::to_string(i), S_IFREG | 0644, 0, kRoot));
  for (int d = 0; d < 10; d++) {
    const uint64_t dir = must(mt.u->mkdir(mt.u->root(), "d" + std::to_string(d), 0755, kRoot)).ino;
    for (int i = 0; i < 90; i++) must(mt.u->mknod(dir, "g" + std::to_string(i), S_IFREG | 0644, 0, kRoot));
  }
  for (int i = 0; i < 89; i++) must(mt.u->mknod(mt.u->root(), "r" + std::to_string(i), S_IFREG | 0644, 0, kRoot));
  must(im.vol->commit());
  std::vector<MergeStats> seen;
  auto mg = must(merge(*im.vol, l.live.tree, im.fs[0].get(), [&](const MergeStats& st) { seen.push_back(st); }));
  im.fs[0]->retire();
  REQUIRE(seen.size() >= 4);
  const double total = double(seen.back().entries);
  CHECK(seen.back().entries == 4000);
  for (size_t i = 1; i < seen.size(); i++) {
    INFO("call " << i << ": " << seen[i].entries << " entries, fraction " << seen[i].fraction);
    CHECK(seen[i].fraction >= seen[i - 1].fraction);
    CHECK(seen[i].fraction <= 1.0 + 1e-9);
    // Directories weigh alike whatever they hold: the estimate is rough,
    // but never stuck or past the end.
    CHECK(std::abs(seen[i].fraction - double(seen[i].entries) / total) < 0.8);
  }
  CHECK(std::abs(seen.back().fraction - 1.0) < 1e-9);
  mt.remount({{mg.merged.tree, true}});
  mt.u.reset();
  im.close();
  check_image(im);
}

// A merge keeps the lower branch while other layers are made on it:
// siblings, and the snapshots of the upper one.
TEST_CASE("snap: a merge keeps the lower branch for the other layers on it", "[snap]") {
  Image im = make_image(1);
  im.close();
  Mounted mt{im, {{im.trees[0], true}}, nullptr};
  mt.open();
  must(mt.u->mknod(mt.u->root(), "base-file", S_IFREG | 0644, 0, kRoot));
  auto l = mt.layer_up("work");
  must(mt.u->mknod(mt.u->root(), "in-work", S_IFREG | 0644, 0, kRoot));
  auto sn = mt.snapshot_live("work@1");
  CHECK(sn.frozen.parent == l.frozen.tree);  // a snapshot of a layer is a layer on its parent
  CHECK(must(is_layer(*im.vol, sn.frozen)));
  Model frozen_view = read_view(im);
  must(mt.u->unlink(mt.u->root(), "base-file"));
  must(mt.u->mknod(mt.u->root(), "later", S_IFREG | 0644, 0, kRoot));
  Model m = read_view(im);
  auto mg = must(merge(*im.vol, l.live.tree, im.fs[0].get()));
  im.fs[0]->retire();
  CHECK(!mg.lower_doomed);  // the snapshot is layered on it
  mt.remount({{mg.merged.tree, true}});
  CHECK(same_view(read_view(im), m));
  // The snapshot still shows what it was taken of, over the kept branch.
  CHECK(same_view(view_of(*im.vol, must(layer_stack(*im.vol, "work@1"))), frozen_view));
  // The merged branch is no layer any more: it is on main's parent (none).
  CHECK(!must(is_layer(*im.vol, mg.merged)));
  CHECK(must(Filesystem::branch(*im.vol, l.frozen.tree)).name == "main");
  mt.u.reset();
  im.close();
  check_image(im);
}

// Cases around the edges of a merge: the lower branch is a base but the
// view stacks more below it; a view that shows the upper branch alone; the
// default a plain mount shows; a clone of a layer.
TEST_CASE("snap: merges keep what hides lower branches, the default mount and layer clones", "[snap]") {
  Image im = make_image(1);
  im.close();
  Mounted mt{im, {{im.trees[0], true}}, nullptr};
  mt.open();
  const TreeId mainb = mt.stack[0].tree;
  // X below main holds "gone"; a layer U on main, mounted U:main:X.
  FsCreateOptions o;
  o.name = "x";
  const TreeId x = must(Filesystem::create(*im.vol, o));
  {
    auto xf = must(Filesystem::open(*im.vol, x));
    must(xf->mknod(xf->root(), "gone", S_IFREG | 0644, 0, 0, 0));
    must(xf->mkdir(xf->root(), "dir", 0755, 0, 0));
    must(xf->mknod(must(xf->lookup(xf->root(), "dir")).ino, "inner", S_IFREG | 0644, 0, 0, 0));
  }
  o.name = "u";
  o.parent = mainb;
  const TreeId u = must(Filesystem::create(*im.vol, o));
  mt.remount({{u, true}, {mainb, false}, {x, false}});
  must(mt.u->unlink(mt.u->root(), "gone"));                     // a whiteout in U
  must(mt.u->unlink(must(resolve(*mt.u, "dir")), "inner"));
  must(mt.u->rmdir(mt.u->root(), "dir"));
  must(mt.u->mkdir(mt.u->root(), "dir", 0700, kRoot));          // opaque: hides X's dir/inner
  Model before = read_view(im);
  CHECK(!before.count("gone"));
  CHECK(!before.count("dir/inner"));
  // A view showing U without main right below it refuses the merge.
  must(put_view(*im.vol, View{"odd", false, {{u, true}, {x, false}}}));
  CHECK(merge(*im.vol, u, im.fs[0].get()).error().code == EBUSY);
  must(delete_view(*im.vol, "odd"));
  // No view is the default: a plain mount shows main (the lowest id). After
  // the merge it must show the result, whose id is higher than x's.
  CHECK(must(default_stack(*im.vol)).at(0).tree == mainb);
  auto mg = must(merge(*im.vol, u, im.fs[0].get()));
  im.fs[0]->retire();
  mt.remount({{mg.merged.tree, true}, {x, false}});
  Model after = read_view(im);
  CHECK(same_view(before, after));  // whiteouts and opaque flags kept in a base
  auto d = must(default_stack(*im.vol));
  REQUIRE(d.size() == 1);
  CHECK(d[0].tree == mg.merged.tree);
  // A clone of a layer is a layer on the same parent: the same view.
  o.name = "l";
  o.parent = mg.merged.tree;
  const TreeId l = must(Filesystem::create(*im.vol, o));
  auto c = must(clone_branch(*im.vol, l, "lc", false));
  CHECK(c.parent == mg.merged.tree);
  CHECK(must(layer_stack(*im.vol, "lc")).size() == 2);
  mt.u.reset();
  im.close();
  check_image(im);
}

// The atomicity claim for the lifecycle operations: with every filesystem
// operation its own generation, a power cut at any write of a merge, a
// rollback to a snapshot, a snapshot, a clone or a snapshot's deletion
// recovers a view the model allows (the same view for all but rollback,
// which may also show the snapshot's), no doomed tree survives the next
// open, and fsck finds nothing.
TEST_CASE("snap: a power cut at any write of a snapshot, merge or rollback recovers before or after it",
          "[snap][snapcrash]") {
  const uint64_t s = seed("snap-crash");
  std::mt19937_64 rng(s);
  const int runs = int(120 * scale());
  int struck = 0;
  for (int run = 0; run < runs; run++) {
    INFO("seed " << s << " run " << run);
    Image im = make_image(1);
    populate(*im.fs[0], rng);
    Mounted mt{im, {{im.trees[0], true}}, nullptr};
    im.close();
    mt.open();
    // A layer on main, changes, a snapshot of the layer, more changes, committed.
    const TreeId layer = mt.layer_up("work").live.tree;
    Model m = read_view(im);
    for (int op = 0; op < 20; op++) {
      auto [want, got, what] = random_op(*mt.u, m, rng);
      INFO(what);
      REQUIRE(want == got);
    }
    const Model at_snap = m;
    const TreeId snap = must(snapshot(*im.vol, layer, "s")).frozen.tree;
    for (int op = 0; op < 20; op++) {
      auto [want, got, what] = random_op(*mt.u, m, rng);
      INFO(what);
      REQUIRE(want == got);
    }
    mt.u.reset();
    im.close();
    im.dev->track_unflushed(true);
    FaultDevice dev(*im.dev);
    im.via = &dev;
    im.commit_each_txn = true;
    mt.open();
    const int kind = int(rng() % 5);
    INFO("operation " << kind);
    auto op = [&](Volume& v, Filesystem* up) {
      if (kind == 0) return merge(v, layer, up).ok();
      if (kind == 1) return rollback(v, layer).ok();
      if (kind == 2) return snapshot(v, layer, "t").ok();
      if (kind == 3) return clone_branch(v, layer, "c", false).ok() && drop_doomed(v).ok();
      return delete_branch(v, snap).ok();
    };
    // How many changes the operation makes, on a copy of the device, so
    // that the cut lands inside it.
    uint64_t budget;
    {
      auto copy = im.dev->clone();
      FaultDevice counting(*copy);
      VolumeOptions vo;
      vo.kinds = fs_kinds();
      vo.commit_each_txn = true;
      auto v2 = must(Volume::open(counting, vo));
      REQUIRE(op(*v2, nullptr));
      budget = counting.calls(FaultDevice::Op::Modify);
    }
    FaultDevice::Rule rule;
    rule.op = FaultDevice::Op::Modify;
    rule.nth = dev.calls(FaultDevice::Op::Modify) + 1 + rng() % std::max<uint64_t>(budget, 1);
    rule.sticky = true;
    rule.kind = rng() % 2 ? FaultDevice::Kind::Eio : FaultDevice::Kind::Torn;
    rule.seed = rng();
    INFO("cut at change " << rule.nth << " of " << budget);
    dev.add(rule);
    const bool done = op(*im.vol, im.fs[0].get());
    if (dev.fired()) struck++;
    else REQUIRE(done);
    mt.u.reset();
    for (auto& f : im.fs) f->retire();  // the volume is gone: nothing is released
    im.fs.clear();
    im.vol.reset();
    im.dev->crash(rng);
    im.via = nullptr;
    im.commit_each_txn = false;
    check_image(im);
    // Recover: a mount of the layer shows it over main (the merge keeps its
    // id and drops main from the stack).
    {
      VolumeOptions vo;
      vo.kinds = fs_kinds();
      im.vol = must(Volume::open(*im.dev, vo));
      must(drop_doomed(*im.vol));
      for (const auto& b : must(Filesystem::branches(*im.vol))) CHECK(!b.doomed);
      mt.stack = must(layer_stack(*im.vol, "work"));
      must(im.vol->close());
      im.vol.reset();
    }
    mt.open();
    Model got = read_view(im);
    const bool same = same_view(got, m);
    const bool rolled = kind == 1 && same_view(got, at_snap);
    REQUIRE((same || rolled));
    if (!dev.fired() && kind == 1) REQUIRE(rolled);
    Model expect = same ? m : at_snap;
    compare(*mt.u, expect);
    mt.u.reset();
    im.close();
    check_image(im);
  }
  INFO(struck << " of " << runs << " runs cut during an operation");
  CHECK(struck > runs / 2);
}

// Both names of a hard-linked file of a lower branch renamed in the upper
// one: the first rename copies the object up; the second must link its
// name to that copy (it failed with EINVAL: a copy from the tree to itself).
TEST_CASE("union: renaming both names of a lower hard link", "[union]") {
  Image im = make_image(2);
  Attr f = must(im.fs[1]->mknod(im.fs[1]->root(), "a", S_IFREG | 0644, 0, 0, 0));
  must(im.fs[1]->write(f.ino, 0, bytes("linked")));
  must(im.fs[1]->link(f.ino, im.fs[1]->root(), "b"));
  Union u({{im.fs[0].get(), true}, {im.fs[1].get(), false}});
  must(u.rename(u.root(), "a", u.root(), "c", 0, kRoot));
  must(u.rename(u.root(), "b", u.root(), "d", 0, kRoot));
  for (const char* gone : {"a", "b"}) CHECK(u.lookup(u.root(), gone).error().code == ENOENT);
  Attr c = must(u.lookup(u.root(), "c")), d = must(u.lookup(u.root(), "d"));
  CHECK(c.ino == f.ino);
  CHECK(d.ino == f.ino);
  CHECK(d.nlink == 2);
  std::vector<std::byte> buf(6);
  REQUIRE(must(u.read(d.ino, 0, buf)) == 6);
  CHECK(buf == bytes("linked"));
  must(u.release_all());
  im.close();
  REQUIRE(check_filesystems(*im.dev).empty());
}

TEST_CASE("union: a layer stacked online keeps a file unlinked while open there", "[union][snap]") {
  // A restack that puts a new layer on top hands the kernel's references to the new branch
  // in O(1) (one table shared by the holders, fs/pins.h): a file the kernel
  // looked up before the snapshot, copied up into the new branch and
  // unlinked there, must live until the last forget, and go then.
  Image im = make_image(1);
  Attr f = must(im.fs[0]->mknod(im.fs[0]->root(), "f", S_IFREG | 0644, 0, 0, 0));
  must(im.fs[0]->write(f.ino, 0, bytes("old bytes!")));
  im.close();
  Mounted mt{im, {{im.trees[0], true}}, nullptr};
  mt.open();
  Union& u = *mt.u;
  Attr a = must(u.lookup(u.root(), "f"));  // the kernel's references: two
  must(u.lookup(u.root(), "f"));
  must(u.hold(a.ino));  // and an open handle
  mt.layer_up_live("s1");
  must(u.write(a.ino, 0, bytes("new"), kRoot));  // the copy-up into the new branch
  REQUIRE(u.branch_of(a.ino) == 0);
  must(u.unlink(u.root(), "f"));
  CHECK(u.lookup(u.root(), "f").error().code == ENOENT);
  REQUIRE(im.fs[0]->orphan_count() == 1);
  std::vector<std::byte> buf(10);
  REQUIRE(must(u.read(a.ino, 0, buf)) == 10);
  CHECK(buf == bytes("new bytes!"));
  must(u.unhold(a.ino));  // the release
  CHECK(im.fs[0]->orphan_count() == 1);
  must(u.unpin(a.ino));
  CHECK(im.fs[0]->orphan_count() == 1);
  must(u.unpin(a.ino));  // the last forget
  CHECK(im.fs[0]->orphan_count() == 0);
  CHECK(im.fs[1]->orphan_count() == 0);  // the frozen branch's file has its name
  must(u.release_all());
  mt.u.reset();
  im.close();
  REQUIRE(check_filesystems(*im.dev).empty());
}

TEST_CASE("union: a layer stacked online under a read-only branch moves only what lies below it", "[union][snap]") {
  // Stack: A (read-only) over B (writable). The new layer goes between
  // branch between them, so a file the union knows in A keeps its place
  // and one in B moves one down (Union::shift_ covers only the top).
  Image im = make_image(2);
  Attr fa = must(im.fs[0]->mknod(im.fs[0]->root(), "a", S_IFREG | 0644, 0, 0, 0));
  must(im.fs[0]->write(fa.ino, 0, bytes("in A")));
  Attr fb = must(im.fs[1]->mknod(im.fs[1]->root(), "b", S_IFREG | 0644, 0, 0, 0));
  must(im.fs[1]->write(fb.ino, 0, bytes("in B")));
  im.close();
  Mounted mt{im, {{im.trees[0], false}, {im.trees[1], true}}, nullptr};
  mt.open();
  Union& u = *mt.u;
  Attr a = must(u.lookup(u.root(), "a")), b = must(u.lookup(u.root(), "b"));
  const auto sn = mt.layer_up_live("s1");
  REQUIRE(mt.stack.size() == 3);
  REQUIRE(mt.stack[1].tree == sn.live.tree);
  CHECK(u.branch_of(a.ino) == 0);
  CHECK(u.branch_of(b.ino) == 2);
  std::vector<std::byte> buf(4);
  REQUIRE(must(u.read(a.ino, 0, buf)) == 4);
  CHECK(buf == bytes("in A"));
  REQUIRE(must(u.read(b.ino, 0, buf)) == 4);
  CHECK(buf == bytes("in B"));
  must(u.write(b.ino, 0, bytes("IN"), kRoot));  // copied up into the new branch
  CHECK(u.branch_of(b.ino) == 1);
  REQUIRE(must(im.fs[1]->read(b.ino, 0, buf)) == 4);
  CHECK(buf == bytes("IN B"));
  REQUIRE(must(im.fs[2]->read(b.ino, 0, buf)) == 4);
  CHECK(buf == bytes("in B"));  // the branch below holds the old bytes
  CHECK(u.write(a.ino, 0, bytes("x"), kRoot).error().code == EROFS);
  must(u.release_all());
  mt.u.reset();
  im.close();
  REQUIRE(check_filesystems(*im.dev).empty());
}

TEST_CASE("union: two unions over one branch keep their references apart", "[union]") {
  // A mount and a view of its control folder share the branch's filesystem
  // object: a file unlinked while both hold it lives until both let go, and
  // one union going away frees nothing the other still holds.
  Image im = make_image(1);
  Attr f = must(im.fs[0]->mknod(im.fs[0]->root(), "f", S_IFREG | 0644, 0, 0, 0));
  must(im.fs[0]->write(f.ino, 0, bytes("shared")));
  Attr g = must(im.fs[0]->mknod(im.fs[0]->root(), "g", S_IFREG | 0644, 0, 0, 0));
  auto one = std::make_unique<Union>(std::vector<UnionBranch>{{im.fs[0].get(), true}});
  Union two({{im.fs[0].get(), true}});
  must(one->lookup(one->root(), "f"));
  must(two.lookup(two.root(), "f"));
  must(one->lookup(one->root(), "g"));
  must(two.lookup(two.root(), "g"));
  must(one->hold(f.ino));  // both have f open, the second g
  must(two.hold(f.ino));
  must(two.hold(g.ino));
  must(one->unlink(one->root(), "f"));
  must(one->unlink(one->root(), "g"));
  REQUIRE(im.fs[0]->orphan_count() == 2);
  must(one->unhold(f.ino));
  must(one->unpin(f.ino));
  CHECK(im.fs[0]->orphan_count() == 2);
  std::vector<std::byte> buf(6);
  REQUIRE(must(two.read(f.ino, 0, buf)) == 6);
  CHECK(buf == bytes("shared"));
  must(two.unhold(f.ino));
  CHECK(im.fs[0]->orphan_count() == 2);  // still known to the second
  must(two.unpin(f.ino));
  CHECK(im.fs[0]->orphan_count() == 1);
  // The first union goes away: the file the second still holds stays.
  must(one->release_all());
  one.reset();
  CHECK(im.fs[0]->orphan_count() == 1);
  must(two.unhold(g.ino));
  CHECK(im.fs[0]->orphan_count() == 1);
  must(two.unpin(g.ino));
  CHECK(im.fs[0]->orphan_count() == 0);
  must(two.release_all());
  im.close();
  REQUIRE(check_filesystems(*im.dev).empty());
}

TEST_CASE("union: a file only looked up goes with its last name; its ghost answers the kernel", "[union]") {
  // Without an open handle nothing can read the file once its name is
  // gone: it is freed in the unlink's own transaction, no orphan. The
  // kernel may still ask for its attributes and flush its times (a ghost,
  // fs.h); it can no longer open it (ESTALE: look the name up again).
  Image im = make_image(1);
  auto& fs = *im.fs[0];
  const auto free0 = fs.statfs().bfree;
  Attr f = must(fs.mknod(fs.root(), "f", S_IFREG | 0640, 0, 7, 8));
  must(fs.write(f.ino, 0, std::vector<std::byte>(3 * 4096, std::byte{1})));
  must(fs.setxattr(f.ino, "user.k", bytes("v"), 0));
  // A large one (more items than one unlink frees at once): freed at once
  // too, through the orphan list.
  Attr big = must(fs.mknod(fs.root(), "big", S_IFREG | 0644, 0, 0, 0));
  for (uint64_t i = 0; i < 40; i++) must(fs.write(big.ino, i * 2 * 4096, std::vector<std::byte>(4096, std::byte{2})));
  Union u({{&fs, true}});
  Attr a = must(u.lookup(u.root(), "f"));
  Attr b = must(u.lookup(u.root(), "big"));
  must(u.unlink(u.root(), "f"));
  must(u.unlink(u.root(), "big"));
  CHECK(fs.orphan_count() == 0);
  must(fs.sync());
  CHECK(check_filesystems(*im.dev).empty());
  CHECK(fs.statfs().bfree == free0);  // the data blocks are free already
  Attr g = must(u.getattr(a.ino));
  CHECK((g.nlink == 0 && g.size == 3 * 4096 && g.uid == 7 && (g.mode & 07777) == 0640));
  CHECK(must(u.getattr(b.ino)).nlink == 0);
  SetAttr times;
  times.mtime = timespec{1000, 5};
  times.ctime = timespec{2000, 6};
  Attr t = must(u.setattr(a.ino, times, kRoot));
  CHECK((t.mtime.tv_sec == 1000 && t.ctime.tv_sec == 2000));
  CHECK(must(u.getattr(a.ino)).mtime.tv_nsec == 5);
  CHECK(u.hold(a.ino).error().code == ESTALE);
  CHECK(u.hold(b.ino).error().code == ESTALE);
  std::vector<std::byte> buf(10);
  CHECK(!u.read(a.ino, 0, buf));
  CHECK(!u.getxattr(a.ino, "user.k"));
  // The last forget drops the ghost; nothing was written for it.
  must(u.unpin(a.ino));
  must(u.unpin(b.ino));
  CHECK(!u.getattr(a.ino));
  CHECK(!fs.getattr(b.ino));
  // Held: an orphan, readable, freed at the release and last forget.
  Attr h = must(u.mknod(u.root(), "h", S_IFREG | 0644, 0, kRoot));
  must(u.write(h.ino, 0, bytes("kept"), kRoot));
  must(u.hold(h.ino));
  must(u.unlink(u.root(), "h"));
  CHECK(fs.orphan_count() == 1);
  REQUIRE(must(u.read(h.ino, 0, buf)) == 4);
  must(u.hold(h.ino));  // a second open of a file held
  must(u.unhold(h.ino));
  must(u.unhold(h.ino));
  CHECK(fs.orphan_count() == 1);  // the kernel still knows it
  must(u.unpin(h.ino));
  CHECK(fs.orphan_count() == 0);
  CHECK(!u.getattr(h.ino));
  must(u.release_all());
  must(fs.sync());
  im.close();
  REQUIRE(check_filesystems(*im.dev).empty());
}

TEST_CASE("union: a branch that turns read-only keeps serving a file unlinked while open", "[union]") {
  // The kernel's references stay with every branch that held them while it
  // stays in the stack: the file lives until the last reference goes.
  Image im = make_image(2);
  Attr f = must(im.fs[0]->mknod(im.fs[0]->root(), "f", S_IFREG | 0644, 0, 0, 0));
  must(im.fs[0]->write(f.ino, 0, bytes("still here")));
  Union u({{im.fs[0].get(), true}, {im.fs[1].get(), false}});
  Attr a = must(u.lookup(u.root(), "f"));  // the kernel's reference
  REQUIRE(a.ino == f.ino);
  must(u.hold(a.ino));  // open
  must(u.unlink(u.root(), "f"));
  REQUIRE(im.fs[0]->orphan_count() == 1);
  // The top branch turns read-only; the other one takes the writes.
  must(u.restack({{im.fs[0].get(), false}, {im.fs[1].get(), true}}));
  CHECK(im.fs[0]->orphan_count() == 1);
  std::vector<std::byte> buf(10);
  REQUIRE(must(u.read(a.ino, 0, buf)) == 10);
  CHECK(buf == bytes("still here"));
  // A new write branch holds it too; the release and the last forget free
  // it in both.
  must(u.unhold(a.ino));
  CHECK(im.fs[0]->orphan_count() == 1);
  must(u.unpin(a.ino));
  CHECK(im.fs[0]->orphan_count() == 0);
  // A branch that leaves the stack gives its references up at once.
  Attr g = must(u.mknod(u.root(), "g", S_IFREG | 0644, 0, kRoot));
  must(u.hold(g.ino));
  must(u.unlink(u.root(), "g"));
  REQUIRE(im.fs[1]->orphan_count() == 1);
  must(u.restack({{im.fs[0].get(), true}}));
  CHECK(im.fs[1]->orphan_count() == 0);
  must(u.unpin(g.ino));
  must(u.release_all());
  im.close();
  REQUIRE(check_filesystems(*im.dev).empty());
}

TEST_CASE("union: a restack that shows a file from an instance of another size gives it a new generation",
          "[union]") {
  // With FUSE's writeback cache the kernel keeps its own size and times of a
  // file while it holds the inode; only a new generation makes it take new ones.
  Image im = make_image(3);
  Attr f = must(im.fs[1]->mknod(im.fs[1]->root(), "f", S_IFREG | 0644, 0, 0, 0));
  must(im.fs[1]->write(f.ino, 0, bytes("short")));
  Union u({{im.fs[0].get(), true}, {im.fs[1].get(), false}});
  const uint64_t gen = must(u.lookup(u.root(), "f")).generation;
  must(u.write(f.ino, 0, bytes("a longer content"), kRoot));  // a copy-up: same number, in fs[0]
  CHECK(must(u.lookup(u.root(), "f")).generation == gen);
  auto listed = [&] {
    uint64_t g = 0;
    must(u.readdirplus(u.root(), 0, [&](const DirEntry& e, const Attr* a) {
      if (e.name == "f") g = a->generation;
      return true;
    }));
    return g;
  };
  // fs[0] leaves: fs[1]'s 5 bytes show under the number the kernel holds.
  must(u.restack({{im.fs[1].get(), false}}));
  Attr a = must(u.lookup(u.root(), "f"));
  CHECK(a.size == 5);
  CHECK(a.generation == gen + 1);
  CHECK(listed() == gen + 1);
  // The same instance, another mode or an empty branch beside it: no change.
  must(u.restack({{im.fs[2].get(), true}, {im.fs[1].get(), true}}));
  CHECK(must(u.lookup(u.root(), "f")).generation == gen + 1);
  // Back to fs[0]'s 16 bytes; a hard link reports what lookup does.
  must(u.restack({{im.fs[0].get(), true}, {im.fs[1].get(), false}}));
  a = must(u.lookup(u.root(), "f"));
  CHECK(a.size == 16);
  CHECK(a.generation == gen + 2);
  CHECK(must(u.link(f.ino, u.root(), "g", kRoot)).generation == gen + 2);
  must(u.release_all());
  im.close();
  REQUIRE(check_filesystems(*im.dev).empty());
}

}  // namespace
}  // namespace plyfs::test

namespace plyfs::test {
namespace {

// Snapshots cost the same however many there are (issue 22): 10,000 in a
// row of a branch written between them, each one O(1) in metadata written
// (a bound on the blocks each adds, not a time), the live branch as deep as
// before, every snapshot holding its own moment, found by name at once.
TEST_CASE("snap: 10000 snapshots in a row each as cheap as the first", "[snap]") {
  Image im = make_image(1);
  im.close();
  Mounted mt{im, {{im.trees[0], true}}, nullptr};
  mt.open();
  Union& u = *mt.u;
  const TreeId live = mt.stack[0].tree;
  const uint64_t f = must(u.mknod(u.root(), "counter", S_IFREG | 0644, 0, kRoot)).ino;
  const int n = 10000;
  auto used = [&] { return im.vol->space_stats().used_blocks; };
  must(im.vol->commit());
  uint64_t first_cost = 0, worst = 0;
  for (int i = 0; i < n; i++) {
    const std::string v = std::to_string(i);
    must(u.write(f, 0, bytes(v + std::string(8 - v.size(), ' ')), kRoot));
    const uint64_t before = used();
    mt.snapshot_live("n" + v);
    const uint64_t cost = used() - before;  // blocks the snapshot itself added
    if (i == 0) first_cost = cost;
    worst = std::max(worst, cost);
    if (i % 500 == 499) must(im.vol->commit());
  }
  must(im.vol->commit());
  INFO("blocks per snapshot: first " << first_cost << ", worst " << worst);
  CHECK(worst <= std::max<uint64_t>(first_cost, 8));
  CHECK(mt.stack.size() == 1);
  CHECK(must(snapshots_of(*im.vol, live)).size() == size_t(n));
  // Each holds its moment; names resolve through the index.
  for (int i : {0, 1, 4999, n - 1}) {
    auto b = must(find_branch(*im.vol, "n" + std::to_string(i)));
    auto sfs = must(Filesystem::open(*im.vol, b.tree, true));
    std::vector<std::byte> buf(8);
    must(sfs->read(f, 0, buf));
    const std::string want = std::to_string(i);
    CHECK(std::string(reinterpret_cast<char*>(buf.data()), want.size()) == want);
  }
  // The live branch reads and writes as before.
  must(u.write(f, 0, bytes("live    "), kRoot));
  std::vector<std::byte> buf(8);
  must(u.read(f, 0, buf));
  CHECK(buf == bytes("live    "));
  CHECK(snapshot(*im.vol, live, "n5").error().code == EEXIST);
  mt.u.reset();
  im.close();
}

}  // namespace
}  // namespace plyfs::test

namespace plyfs::test {
namespace {

// Two trees that share nodes, written, snapshotted, cloned and dropped from
// different threads at once: a writer of one copies a shared node while the
// other tree's writer copies it too, or its drop releases it. The look at a
// shared node's count and its change must not interleave
// (NodeSpace::shared_nodes_mutex): two copies that both read 2 would free a
// node the other tree still reaches ("shared node lost its last reference").
TEST_CASE("snap: writers snapshots clones and deletions of trees that share nodes at once", "[snap]") {
  Image im = make_image(1);
  const TreeId live = im.trees[0];
  Filesystem& fs = *im.fs[0];
  std::vector<uint64_t> files;
  for (int i = 0; i < 400; i++)
    files.push_back(must(fs.mknod(fs.root(), "f" + std::to_string(i), S_IFREG | 0644, 0, 0, 0)).ino);
  must(im.vol->commit());
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::string first_error;
  std::mutex err_mu;
  auto note = [&](const Error& e) {
    std::lock_guard lk(err_mu);
    if (errors++ == 0) first_error = e.message();
  };
  // A snapshot holds the writer still, as the daemon's does (hold_still):
  // one write is several tree operations, and a snapshot between them would
  // hold an inode whose extents are not in yet. Everything else runs at
  // once: the writer's copy-on-write of nodes the snapshots share, the
  // clone's, and the deletions dropping them.
  std::mutex op_mu;
  std::thread writer([&] {
    std::mt19937_64 rng(seed("shared-writer"));
    while (!stop) {
      const uint64_t ino = files[rng() % files.size()];
      std::lock_guard lk(op_mu);
      if (auto r = fs.write(ino, 0, bytes(std::string(1 + rng() % 3000, 'w'))); !r) note(r.error());
    }
  });
  std::deque<TreeId> snaps;
  for (int i = 0; i < int(300 * scale()) && !errors; i++) {
    auto s = [&] {
      std::lock_guard lk(op_mu);
      return snapshot(*im.vol, live, "s" + std::to_string(i));
    }();
    if (!s) {
      note(s.error());
      break;
    }
    snaps.push_back(s->frozen.tree);
    // A writable clone of the snapshot, written while the live tree is.
    auto c = clone_branch(*im.vol, s->frozen.tree, "c" + std::to_string(i), false);
    if (!c) {
      note(c.error());
      break;
    }
    {
      auto cfs = Filesystem::open(*im.vol, c->tree);
      if (!cfs) note(cfs.error());
      else if (auto r = (*cfs)->write(files[size_t(i) % files.size()], 0, bytes("clone")); !r) note(r.error());
    }
    if (auto r = delete_branch(*im.vol, c->tree); !r) note(r.error());
    if (snaps.size() > 3) {
      if (auto r = delete_branch(*im.vol, snaps.front()); !r) note(r.error());
      snaps.pop_front();
    }
    if (i % 20 == 19)
      if (auto r = im.vol->commit(); !r) note(r.error());
  }
  stop = true;
  writer.join();
  INFO(first_error);
  REQUIRE(errors == 0);
  im.close();
  check_image(im);
}

}  // namespace
}  // namespace plyfs::test

namespace plyfs::test {

// Lookups keep what they resolved (format.md#fs-union, "Resolution cache"):
// every change to a branch, made through this union or not (here: straight
// into the branches' trees, through other Filesystem objects, as the control
// folder's views and other stacks do), must show in the next lookup.
TEST_CASE("union: a lookup answered from the resolution cache sees every change to any branch", "[union]") {
  Image im = make_image(3);
  const Attr x2 = must(im.fs[2]->mknod(im.fs[2]->root(), "x", S_IFREG | 0644, 0, 0, 0));
  (void)must(im.fs[2]->mkdir(im.fs[2]->root(), "d", 0755, 0, 0));
  Union u({{im.fs[0].get(), true}, {im.fs[1].get(), false}, {im.fs[2].get(), false}});
  for (int i = 0; i < 2; i++) {  // the second from the cache
    CHECK(must(u.lookup(u.root(), "x")).ino == x2.ino);
    auto y = u.lookup(u.root(), "y");
    REQUIRE(!y);
    CHECK(y.error().code == ENOENT);
  }
  // Another object of a branch's tree: the change is the volume's.
  auto other1 = must(Filesystem::open(*im.vol, im.trees[1]));
  const Attr x1 = must(other1->mknod(other1->root(), "x", S_IFREG | 0600, 0, 0, 0));
  CHECK(must(u.lookup(u.root(), "x")).ino == x1.ino);
  const Attr y2 = must(im.fs[2]->mknod(im.fs[2]->root(), "y", S_IFREG | 0644, 0, 0, 0));
  CHECK(must(u.lookup(u.root(), "y")).ino == y2.ino);
  must(im.fs[0]->whiteout(im.fs[0]->root(), "x"));
  auto gone = u.lookup(u.root(), "x");
  REQUIRE(!gone);
  CHECK(gone.error().code == ENOENT);
  // A merged directory gains a part on top: its number is the new part's.
  const Attr d2 = must(u.lookup(u.root(), "d"));
  CHECK(must(u.lookup(u.root(), "d")).ino == d2.ino);
  const Attr d0 = must(im.fs[0]->mkdir(im.fs[0]->root(), "d", 0755, 0, 0));
  CHECK(must(u.lookup(u.root(), "d")).ino == d0.ino);
  // Attributes are read fresh on every hit: a size changed below shows.
  SetAttr sa;
  sa.size = 12345;
  (void)must(im.fs[2]->setattr(y2.ino, sa));
  CHECK(must(u.lookup(u.root(), "y")).size == 12345);
}

}  // namespace plyfs::test
