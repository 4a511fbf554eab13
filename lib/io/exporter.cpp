// export (io.h): a walk of a branch's view (Tar) or of its own tree
// (OciLayer) written through libarchive as a pax tarball, which GNU tar,
// bsdtar, umoci and import all read: names as bytes (hdrcharset=BINARY
// where they are not UTF-8), times to the nanosecond (mtime, atime, ctime),
// xattrs (SCHILY.xattr), POSIX ACLs as SCHILY.acl text (what GNU tar --acls
// restores), holes as sparse members (GNU sparse 1.0), hard links as links.
// Sockets cannot be archived (tar has no type for them): they are skipped
// with a note, as GNU tar does.
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "fs/acl.h"
#include "io/source.h"
#include "util/text.h"

namespace plyfs::io {

namespace {

constexpr size_t kChunkBytes = 8u << 20;
// What the sink gathers before one write: headers and small files.
constexpr size_t kGatherBytes = 1u << 20;
constexpr size_t kDirectBytes = 64u << 10;  // a piece this large goes out as it is

// What the walk reads: a union (a view) or one filesystem tree.
class Tree {
 public:
  virtual ~Tree() = default;
  virtual uint64_t root() = 0;
  virtual Result<Attr> getattr(uint64_t ino) = 0;
  virtual Result<Attr> lookup(uint64_t dir, std::string_view name) = 0;  // counted: release() it
  virtual void release(uint64_t ino) = 0;
  // A directory's entries, each with its attributes where the tree finds
  // them in the listing (a union's readdirplus: counted, release() them),
  // else none (nullptr: lookup() it).
  virtual Result<void> list(uint64_t dir, const std::function<bool(const DirEntry&, const Attr*)>& fn) = 0;
  virtual Result<size_t> read(uint64_t ino, uint64_t off, std::span<std::byte> out) = 0;
  virtual Result<uint64_t> lseek(uint64_t ino, uint64_t off, int whence) = 0;
  virtual Result<std::string> readlink(uint64_t ino) = 0;
  virtual Result<std::vector<std::string>> listxattr(uint64_t ino) = 0;
  virtual Result<std::vector<std::byte>> getxattr(uint64_t ino, std::string_view name) = 0;
};

template <class T>
class TreeOf final : public Tree {
 public:
  explicit TreeOf(T& t) : t_(t) {}
  uint64_t root() override { return t_.root(); }
  Result<Attr> getattr(uint64_t ino) override { return t_.getattr(ino); }
  Result<Attr> lookup(uint64_t dir, std::string_view name) override { return t_.lookup(dir, name); }
  void release(uint64_t ino) override {
    if constexpr (std::is_same_v<T, Union>) (void)t_.unpin(ino);
  }
  Result<void> list(uint64_t dir, const std::function<bool(const DirEntry&, const Attr*)>& fn) override {
    // A union resolves each name in its listing already: a lookup after it
    // would resolve it again (a tenth of export's instructions).
    if constexpr (std::is_same_v<T, Union>) return t_.readdirplus(dir, 0, fn);
    else return t_.readdir(dir, 0, [&](const DirEntry& d) { return fn(d, nullptr); });
  }
  Result<size_t> read(uint64_t ino, uint64_t off, std::span<std::byte> out) override { return t_.read(ino, off, out); }
  Result<uint64_t> lseek(uint64_t ino, uint64_t off, int whence) override { return t_.lseek(ino, off, whence); }
  Result<std::string> readlink(uint64_t ino) override { return t_.readlink(ino); }
  Result<std::vector<std::string>> listxattr(uint64_t ino) override { return t_.listxattr(ino); }
  Result<std::vector<std::byte>> getxattr(uint64_t ino, std::string_view n) override { return t_.getxattr(ino, n); }

 private:
  T& t_;
};

void add_acl(archive_entry* ae, int type, std::span<const std::byte> x) {
  auto entries = decode_acl(x);
  if (!entries) return;
  for (const auto& e : *entries) {
    int tag = 0;
    switch (e.tag) {
      case 0x01: tag = ARCHIVE_ENTRY_ACL_USER_OBJ; break;
      case 0x02: tag = ARCHIVE_ENTRY_ACL_USER; break;
      case 0x04: tag = ARCHIVE_ENTRY_ACL_GROUP_OBJ; break;
      case 0x08: tag = ARCHIVE_ENTRY_ACL_GROUP; break;
      case 0x10: tag = ARCHIVE_ENTRY_ACL_MASK; break;
      case 0x20: tag = ARCHIVE_ENTRY_ACL_OTHER; break;
      default: continue;
    }
    const bool named = e.tag == 0x02 || e.tag == 0x08;
    (void)archive_entry_acl_add_entry(ae, type, e.perm & 7, tag, named ? int(e.id) : -1, nullptr);
  }
}

// Whether a path fits a ustar header (name 100 bytes, prefix 155, split at
// a '/'). libarchive 3.6 writes a sparse member whose path does not with a
// GNU.sparse.name cut to its ustar name, which GNU tar then extracts under
// the wrong name: such a file goes whole, holes as zeros (format.md#import-export).
bool fits_ustar(std::string_view p) {
  if (p.size() <= 100) return true;
  for (size_t cut = p.find('/'); cut != std::string_view::npos; cut = p.find('/', cut + 1))
    if (cut <= 155 && p.size() - cut - 1 <= 100 && cut > 0) return true;
  return false;
}

// Where libarchive's output goes. libarchive's own blocking copies every
// byte into its record buffer, file data included: a second copy of all the
// data, a fifth of export's instructions (docs/benchmarks.md, issue 23). So
// libarchive writes unblocked (bytes_per_block 0: each piece handed on as
// it comes) and this sink gathers the small pieces (headers, padding, small
// files) into writes of up to 1 MiB, and sends a large piece (a file's data)
// from libarchive's pointer, behind what it gathered, in one writev. The
// bytes are the same; readers need 512-byte blocks only, which the format
// writer pads to itself.
class Sink {
 public:
  explicit Sink(int fd) : fd_(fd) { buf_.resize(kGatherBytes); }
  static la_ssize_t write_cb(archive* a, void* self, const void* p, size_t n) {
    return static_cast<Sink*>(self)->put(a, static_cast<const std::byte*>(p), n);
  }
  static int close_cb(archive* a, void* self) {
    Sink& s = *static_cast<Sink*>(self);
    return s.send(a, nullptr, 0) ? ARCHIVE_OK : ARCHIVE_FATAL;
  }

 private:
  la_ssize_t put(archive* a, const std::byte* p, size_t n) {
    if (n < kDirectBytes && used_ + n <= buf_.size()) {
      std::copy(p, p + n, buf_.data() + used_);
      used_ += n;
      return la_ssize_t(n);
    }
    if (n < kDirectBytes) {  // full: out with what is gathered, keep this piece
      if (!send(a, nullptr, 0)) return -1;
      std::copy(p, p + n, buf_.data());
      used_ = n;
      return la_ssize_t(n);
    }
    return send(a, p, n) ? la_ssize_t(n) : -1;
  }
  // What is gathered, then `n` bytes at `p`, whole (a write may be taken in
  // part), or an error set on `a` as libarchive's fd writer sets it.
  bool send(archive* a, const std::byte* p, size_t n) {
    iovec iov[2] = {{buf_.data(), used_}, {const_cast<std::byte*>(p), n}};
    int i = iov[0].iov_len ? 0 : 1;
    while (i < 2) {
      if (iov[i].iov_len == 0) {
        i++;
        continue;
      }
      const ssize_t w = ::writev(fd_, iov + i, 2 - i);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        archive_set_error(a, w < 0 ? errno : EIO, "Write error");
        return false;
      }
      for (size_t left = size_t(w); left > 0 && i < 2;) {
        const size_t k = std::min(left, iov[i].iov_len);
        iov[i].iov_base = static_cast<std::byte*>(iov[i].iov_base) + k;
        iov[i].iov_len -= k;
        left -= k;
        if (iov[i].iov_len == 0) i++;
      }
    }
    used_ = 0;
    return true;
  }

  int fd_;
  std::vector<std::byte> buf_;
  size_t used_ = 0;
};

class Exporter {
 public:
  Exporter(Tree& t, int fd, const ExportOptions& o) : t_(t), sink_(fd), o_(o) {}
  ~Exporter() {
    if (a_) archive_write_free(a_);
    if (ae_) archive_entry_free(ae_);
  }
  Result<ExportStats> run();

 private:
  Error failure(const std::string& what) const;
  // An entry of a directory as listed: its attributes when the listing
  // gave them (counted: a reference to release).
  struct Child {
    std::string name;
    uint8_t type;
    bool counted;
    Attr attr;
  };
  Result<void> walk(uint64_t dir, const std::string& path, int depth);
  Result<void> child(uint64_t dir, const Child& k, const std::string& path, int depth);
  Result<void> put(const std::string& path, const Attr& a, const std::string& name_for_notes);
  Result<void> put_marker(const std::string& path);
  Result<void> sparse_map(const Attr& a);
  Result<void> body(const Attr& a, const std::string& shown_name);
  Result<void> xattrs(uint64_t ino);
  void report(bool force = false);

  Tree& t_;
  Sink sink_;
  const ExportOptions& o_;
  archive* a_ = nullptr;
  archive_entry* ae_ = nullptr;
  ExportStats st_;
  std::map<uint64_t, std::string> linked_;  // inode -> the first path written for it
  std::vector<std::byte> buf_, zeros_;
  std::chrono::steady_clock::time_point last_{};
};

void Exporter::report(bool force) {
  if (!o_.progress) return;
  auto now = std::chrono::steady_clock::now();
  if (!force && now - last_ < std::chrono::milliseconds(50)) return;
  last_ = now;
  o_.progress(st_);
}

Error Exporter::failure(const std::string& what) const {
  const int e = archive_errno(a_);
  const char* why = archive_error_string(a_);
  std::string m = what;
  m += ": ";
  m += why ? why : "libarchive failed";
  // A system error of the output (a full disk, a closed pipe) keeps its code.
  if (e == ENOSPC || e == EDQUOT || e == EPIPE || e == EIO || e == EFBIG) return Error::io(e, m);
  return Error::io(EIO, m);
}

Result<void> Exporter::xattrs(uint64_t ino) {
  for (const auto& n : PLY_TRY(t_.listxattr(ino))) {
    auto v = PLY_TRY(t_.getxattr(ino, n));
    if (n == kAclAccess) add_acl(ae_, ARCHIVE_ENTRY_ACL_TYPE_ACCESS, v);
    else if (n == kAclDefault) add_acl(ae_, ARCHIVE_ENTRY_ACL_TYPE_DEFAULT, v);
    else archive_entry_xattr_add_entry(ae_, n.c_str(), v.data(), v.size());
  }
  return ok();
}

// The data regions SEEK_DATA and SEEK_HOLE find: a file with holes is a
// sparse member, its regions written back to back.
Result<void> Exporter::sparse_map(const Attr& a) {
  // Most files have no hole: the first hole at or past the end says so in
  // one call, and such a file is no sparse member (as the loop finds too).
  if (a.size == 0 || PLY_TRY(t_.lseek(a.ino, 0, SEEK_HOLE)) >= a.size) return ok();
  std::vector<std::pair<uint64_t, uint64_t>> regions;
  for (uint64_t off = 0; off < a.size;) {
    auto d = t_.lseek(a.ino, off, SEEK_DATA);
    if (!d) {
      if (d.error().code == ENXIO) break;
      return d.error();
    }
    const uint64_t h = std::min(PLY_TRY(t_.lseek(a.ino, *d, SEEK_HOLE)), a.size);
    if (h <= *d) break;
    regions.push_back({*d, h - *d});
    off = h;
  }
  const bool sparse = !(regions.size() == 1 && regions[0].first == 0 && regions[0].second == a.size) &&
                      fits_ustar(archive_entry_pathname(ae_));
  if (sparse) {
    for (auto [off, len] : regions) archive_entry_sparse_add_entry(ae_, la_int64_t(off), la_int64_t(len));
    if (regions.empty() || regions.back().first + regions.back().second < a.size)
      archive_entry_sparse_add_entry(ae_, la_int64_t(a.size), 0);  // a hole to the end
  }
  return ok();
}

Result<void> Exporter::put(const std::string& path, const Attr& a, const std::string& shown_name) {
  archive_entry_clear(ae_);
  archive_entry_copy_pathname(ae_, path.c_str());
  archive_entry_set_mode(ae_, a.mode);
  archive_entry_set_uid(ae_, a.uid);
  archive_entry_set_gid(ae_, a.gid);
  archive_entry_set_mtime(ae_, a.mtime.tv_sec, a.mtime.tv_nsec);
  archive_entry_set_atime(ae_, a.atime.tv_sec, a.atime.tv_nsec);
  archive_entry_set_ctime(ae_, a.ctime.tv_sec, a.ctime.tv_nsec);
  const uint32_t type = a.mode & S_IFMT;
  if (type == S_IFREG && a.nlink > 1) {
    auto [it, first] = linked_.try_emplace(a.ino, path);
    if (!first) {
      archive_entry_copy_hardlink(ae_, it->second.c_str());
      archive_entry_set_size(ae_, 0);
      if (archive_write_header(a_, ae_) < ARCHIVE_WARN) return failure(shown_name);
      st_.hardlinks++;
      st_.entries++;
      return ok();
    }
  }
  PLY_CHECK(xattrs(a.ino));
  switch (type) {
    case S_IFREG:
      archive_entry_set_size(ae_, la_int64_t(a.size));
      PLY_CHECK(sparse_map(a));
      st_.files++;
      break;
    case S_IFDIR: st_.dirs++; break;
    case S_IFLNK:
      archive_entry_copy_symlink(ae_, PLY_TRY(t_.readlink(a.ino)).c_str());
      st_.symlinks++;
      break;
    case S_IFCHR:
    case S_IFBLK:
      archive_entry_set_rdev(ae_, a.rdev);
      st_.specials++;
      break;
    case S_IFIFO: st_.specials++; break;
    default:
      if (o_.note) o_.note(shown_name + ": a socket, skipped (tar cannot hold sockets)");
      st_.skipped++;
      return ok();
  }
  // ARCHIVE_WARN: a name that is not UTF-8, written as bytes (hdrcharset).
  if (archive_write_header(a_, ae_) < ARCHIVE_WARN) return failure(shown_name);
  st_.entries++;
  if (type != S_IFREG || a.size == 0) return ok();
  return body(a, shown_name);
}

// A file's data: every region of the entry's sparse map (or all of it), in
// pieces of up to 8 MiB.
Result<void> Exporter::body(const Attr& a, const std::string& shown_name) {
  const int n = archive_entry_sparse_reset(ae_);
  std::vector<std::pair<uint64_t, uint64_t>> rs;
  if (n == 0) {
    rs.push_back({0, a.size});
  } else {
    la_int64_t off, len;
    while (archive_entry_sparse_next(ae_, &off, &len) == ARCHIVE_OK)
      if (len > 0) rs.push_back({uint64_t(off), uint64_t(len)});
  }
  // libarchive takes the whole file, holes included, and skips the holes
  // of a sparse member itself: they go as one zeroed buffer, never read.
  uint64_t pos = 0;
  auto skip_to = [&](uint64_t to) -> Result<void> {
    while (pos < to) {
      const size_t n = size_t(std::min<uint64_t>(to - pos, zeros_.size()));
      if (archive_write_data(a_, zeros_.data(), n) < 0) return failure(shown_name);
      pos += n;
    }
    return ok();
  };
  for (auto [off, len] : rs) {
    PLY_CHECK(skip_to(off));
    pos = off + len;
    for (uint64_t done = 0; done < len;) {
      const size_t want = size_t(std::min<uint64_t>(len - done, buf_.size()));
      const size_t got = PLY_TRY(t_.read(a.ino, off + done, std::span(buf_).first(want)));
      if (got == 0) return Error::io(EIO, shown_name + ": shorter than its size");
      if (archive_write_data(a_, buf_.data(), got) < 0) return failure(shown_name);
      done += got;
      st_.bytes += got;
      report();
    }
  }
  return skip_to(a.size);
}

// An OCI marker: an empty file ".wh.NAME" or ".wh..wh..opq".
Result<void> Exporter::put_marker(const std::string& path) {
  archive_entry_clear(ae_);
  archive_entry_copy_pathname(ae_, path.c_str());
  archive_entry_set_mode(ae_, S_IFREG | 0644);
  archive_entry_set_size(ae_, 0);
  if (archive_write_header(a_, ae_) < ARCHIVE_WARN) return failure(shown(path));
  st_.entries++;
  return ok();
}

Result<void> Exporter::walk(uint64_t dir, const std::string& path, int depth) {
  if (depth > 4096) return Error::io(ELOOP, shown(path) + ": directories nested too deep");
  std::vector<Child> kids;
  Result<void> r = t_.list(dir, [&](const DirEntry& d, const Attr* a) {
    if (d.name == "." || d.name == "..") return true;
    kids.push_back({std::string(d.name), d.type, a != nullptr, a ? *a : Attr{}});
    return true;
  });
  if (r) std::sort(kids.begin(), kids.end(), [](const Child& x, const Child& y) { return x.name < y.name; });
  size_t i = 0;
  for (; r && i < kids.size(); i++) r = child(dir, kids[i], path, depth);
  for (; i < kids.size(); i++)  // after a failure: the references the listing counted
    if (kids[i].counted) t_.release(kids[i].attr.ino);
  return r;
}

// One entry of a walked directory; drops the reference its attributes hold.
Result<void> Exporter::child(uint64_t dir, const Child& k, const std::string& path, int depth) {
  const std::string p = path + k.name;
  if (k.type == DT_WHT) {
    PLY_CHECK(put_marker(path + ".wh." + k.name));
    st_.whiteouts++;
    return ok();
  }
  const Attr a = k.counted ? k.attr : PLY_TRY(t_.lookup(dir, k.name));
  auto r = [&]() -> Result<void> {
    PLY_CHECK(put(S_ISDIR(a.mode) ? p + "/" : p, a, shown(p)));
    if (!S_ISDIR(a.mode)) return ok();
    if (a.opaque && o_.format == ExportFormat::OciLayer) {
      PLY_CHECK(put_marker(p + "/.wh..wh..opq"));
      st_.opaque++;
    }
    return walk(a.ino, p + "/", depth + 1);
  }();
  t_.release(a.ino);
  PLY_CHECK(r);
  report();
  return ok();
}

Result<ExportStats> Exporter::run() {
  a_ = archive_write_new();
  ae_ = archive_entry_new();
  if (!a_ || !ae_) return Error::io(ENOMEM, "out of memory");
  buf_.resize(kChunkBytes);
  zeros_.resize(kChunkBytes);
  if (archive_write_set_format_pax(a_) != ARCHIVE_OK) return failure("pax");
  // SCHILY.xattr only: GNU tar reads it, and would warn about each
  // LIBARCHIVE.xattr record.
  (void)archive_write_set_format_option(a_, "pax", "xattrheader", "SCHILY");
  int r = ARCHIVE_OK;
  if (o_.compress == Compress::Gzip) r = archive_write_add_filter_gzip(a_);
  if (o_.compress == Compress::Zstd) r = archive_write_add_filter_zstd(a_);
  if (r != ARCHIVE_OK) return failure("compression");
  // Unblocked: the sink gathers (Sink). Like the records of 1 MiB written
  // before it, the last one is not padded to tar's 10 KiB.
  (void)archive_write_set_bytes_per_block(a_, 0);
  if (archive_write_open(a_, &sink_, nullptr, Sink::write_cb, Sink::close_cb) != ARCHIVE_OK)
    return failure("cannot write the archive");
  Attr root = PLY_TRY(t_.getattr(t_.root()));
  PLY_CHECK(put("./", root, "the root"));
  if (root.opaque && o_.format == ExportFormat::OciLayer) {
    PLY_CHECK(put_marker("./.wh..wh..opq"));
    st_.opaque++;
  }
  PLY_CHECK(walk(t_.root(), "./", 0));
  if (archive_write_close(a_) != ARCHIVE_OK) return failure("cannot finish the archive");
  report(true);
  return st_;
}

}  // namespace

Result<ExportFormat> parse_export_format(std::string_view s) {
  if (s == "tar") return ExportFormat::Tar;
  if (s == "oci-layer") return ExportFormat::OciLayer;
  return Error::invalid("unknown export format '" + std::string(s) + "' (tar, oci-layer)");
}

Result<Compress> parse_compress(std::string_view s) {
  if (s == "none") return Compress::None;
  if (s == "gzip") return Compress::Gzip;
  if (s == "zstd") return Compress::Zstd;
  return Error::invalid("unknown compression '" + std::string(s) + "' (zstd, gzip, none)");
}

Result<std::vector<ViewLayer>> export_stack(Volume& v, TreeId tree) {
  BranchMeta b = PLY_TRY(Filesystem::branch(v, tree));
  std::vector<ViewLayer> s{{b.tree, false}};
  while (PLY_TRY(is_layer(v, b))) {
    if (s.size() >= kMaxViewLayers)
      return Error::invalid("branch \"" + shown(b.name) + "\" has more than " + std::to_string(kMaxViewLayers) +
                            " ancestors");
    b = PLY_TRY(Filesystem::branch(v, b.parent));
    s.push_back({b.tree, false});
  }
  return s;
}

Result<ExportStats> export_view(Volume& v, const std::vector<ViewLayer>& stack, int fd, const ExportOptions& o) {
  if (stack.empty()) return Error::invalid("nothing to export");
  if (o.format == ExportFormat::OciLayer) {
    auto fs = PLY_TRY(Filesystem::open(v, stack[0].tree, true));
    TreeOf<Filesystem> t(*fs);
    return Exporter(t, fd, o).run();
  }
  auto u = PLY_TRY(open_union(v, stack, true, true));
  TreeOf<Union> t(*u.u);
  return Exporter(t, fd, o).run();
}

Result<ExportStats> export_branch(Volume& v, TreeId tree, int fd, const ExportOptions& o) {
  if (o.format == ExportFormat::OciLayer) return export_view(v, {{tree, false}}, fd, o);
  return export_view(v, PLY_TRY(export_stack(v, tree)), fd, o);
}

}  // namespace plyfs::io
