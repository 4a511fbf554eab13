// A tarball as a source of entries (source.h), read with libarchive: plain,
// gzip, zstd or xz (any compression the library reads), every tar dialect
// (ustar, pax, GNU: long names, sparse members, xattrs and ACLs). An OCI
// layer is a tarball whose ".wh.NAME" entries are whiteouts and whose
// ".wh..wh..opq" entries make their directory opaque (the OCI image spec,
// "Whiteouts").
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <map>

#include "io/source.h"
#include "util/text.h"

namespace plyfs::io {

namespace {

constexpr size_t kInputBytes = 1u << 20;
constexpr std::string_view kWhiteout = ".wh.", kOpaque = ".wh..wh..opq";

// The access or default ACL libarchive parsed from SCHILY.acl.* text, in the
// kernel's encoding; empty when the entry has none beyond its mode.
std::vector<std::byte> acl_xattr(archive_entry* e, int type) {
  if (archive_entry_acl_reset(e, type) <= 0) return {};
  std::vector<AclEntry> out;
  bool extended = false, have[3] = {false, false, false};
  int t, perm, tag, id;
  const char* name;
  while (archive_entry_acl_next(e, type, &t, &perm, &tag, &id, &name) == ARCHIVE_OK) {
    const uint16_t p = uint16_t(perm & 7);
    switch (tag) {
      case ARCHIVE_ENTRY_ACL_USER_OBJ: out.push_back({0x01, p, ~0u}), have[0] = true; break;
      case ARCHIVE_ENTRY_ACL_USER: out.push_back({0x02, p, uint32_t(id)}), extended = true; break;
      case ARCHIVE_ENTRY_ACL_GROUP_OBJ: out.push_back({0x04, p, ~0u}), have[1] = true; break;
      case ARCHIVE_ENTRY_ACL_GROUP: out.push_back({0x08, p, uint32_t(id)}), extended = true; break;
      case ARCHIVE_ENTRY_ACL_MASK: out.push_back({0x10, p, ~0u}), extended = true; break;
      case ARCHIVE_ENTRY_ACL_OTHER: out.push_back({0x20, p, ~0u}), have[2] = true; break;
      default: break;
    }
  }
  const uint32_t mode = archive_entry_perm(e);
  if (type == ARCHIVE_ENTRY_ACL_TYPE_ACCESS) {
    if (!extended) return {};  // the mode says it all
    if (!have[0]) out.push_back({0x01, uint16_t((mode >> 6) & 7), ~0u});
    if (!have[1]) out.push_back({0x04, uint16_t((mode >> 3) & 7), ~0u});
    if (!have[2]) out.push_back({0x20, uint16_t(mode & 7), ~0u});
  }
  return encode_acl(std::move(out));
}

class ArchiveSource final : public EntrySource {
 public:
  ArchiveSource(std::string file, bool oci, DigestFeed feed)
      : file_(std::move(file)), oci_(oci), feed_(std::move(feed)) {}
  ~ArchiveSource() override {
    if (a_) archive_read_free(a_);
    if (fd_ >= 0) ::close(fd_);
  }

  Result<void> open();
  Result<std::optional<SourceEntry>> next() override;
  Result<std::optional<DataPiece>> data() override;
  Result<void> finish() override;

 private:
  static la_ssize_t on_read(archive*, void* self, const void** buf);
  static std::vector<Xattr> xattrs_of(archive_entry* ae, uint32_t& mode);
  static bool oci_marker(SourceEntry& e);
  Error failure(const char* what) const;

  std::string file_;
  bool oci_;
  DigestFeed feed_;
  int fd_ = -1;
  archive* a_ = nullptr;
  std::vector<std::byte> in_;
  int read_errno_ = 0;
  bool in_data_ = false;
};

la_ssize_t ArchiveSource::on_read(archive*, void* p, const void** buf) {
  auto* s = static_cast<ArchiveSource*>(p);
  ssize_t n;
  while ((n = ::read(s->fd_, s->in_.data(), s->in_.size())) < 0 && errno == EINTR) {
  }
  if (n < 0) {
    s->read_errno_ = errno;
    return -1;
  }
  if (s->feed_) s->feed_(std::span<const std::byte>(s->in_).first(size_t(n)));
  s->read_ += uint64_t(n);
  *buf = s->in_.data();
  return n;
}

Error ArchiveSource::failure(const char* what) const {
  if (read_errno_) return Error::sys(read_errno_, "cannot read " + file_);
  const char* why = archive_error_string(a_);
  std::string m = shown(file_);
  m += ": ";
  m += what;
  m += ": ";
  m += why ? why : "unreadable";
  return Error::invalid(m);
}

Result<void> ArchiveSource::open() {
  // "-": standard input (tar's convention), read through a duplicate.
  fd_ = file_ == "-" ? ::fcntl(0, F_DUPFD_CLOEXEC, 3) : ::open(file_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) return Error::sys(errno, "cannot open " + file_);
  struct stat st;
  if (::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode)) total_ = uint64_t(st.st_size);
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  in_.resize(kInputBytes);
  a_ = archive_read_new();
  if (!a_) return Error::io(ENOMEM, "out of memory");
  archive_read_support_filter_all(a_);
  archive_read_support_format_tar(a_);
  archive_read_support_format_gnutar(a_);
  if (archive_read_open(a_, this, nullptr, &ArchiveSource::on_read, nullptr) != ARCHIVE_OK)
    return failure("not a tarball libarchive reads");
  return ok();
}

Result<std::optional<SourceEntry>> ArchiveSource::next() {
  archive_entry* ae = nullptr;
  for (;;) {
    in_data_ = false;
    const int r = archive_read_next_header(a_, &ae);
    if (r == ARCHIVE_EOF) return std::optional<SourceEntry>{};
    // ARCHIVE_WARN: a name that is not UTF-8 in a pax header, which the
    // entry still holds as bytes.
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return failure("a damaged or truncated archive");
    in_data_ = true;
    const char* p = archive_entry_pathname(ae);
    if (!p) return failure("an entry without a name");
    const timespec mtime{archive_entry_mtime(ae), archive_entry_mtime_nsec(ae)};
    // Without an atime (ustar, GNU) the file was last read when written.
    const timespec atime = archive_entry_atime_is_set(ae)
                               ? timespec{archive_entry_atime(ae), archive_entry_atime_nsec(ae)}
                               : mtime;
    SourceEntry e = SourceEntry::of(p, archive_entry_mode(ae), uint32_t(archive_entry_uid(ae)),
                                    uint32_t(archive_entry_gid(ae)), atime, mtime);
    if (archive_entry_filetype(ae) == AE_IFCHR || archive_entry_filetype(ae) == AE_IFBLK)
      e.rdev = archive_entry_rdev(ae);
    e.size = archive_entry_size_is_set(ae) && archive_entry_size(ae) > 0 ? uint64_t(archive_entry_size(ae)) : 0;
    if (const char* h = archive_entry_hardlink(ae)) e.link_path = std::string(h);
    if (const char* t = archive_entry_symlink(ae)) e.target = t;
    e.xattrs = xattrs_of(ae, e.mode);
    if (oci_ && !oci_marker(e)) continue;  // aufs's own bookkeeping, no file
    return std::optional<SourceEntry>(std::move(e));
  }
}

// The entry's xattrs, later ones of a name winning; POSIX ACLs from the
// xattrs GNU tar records or from libarchive's ACL entries (SCHILY.acl
// text). `mode` takes the ACL's mask as its group bits.
std::vector<Xattr> ArchiveSource::xattrs_of(archive_entry* ae, uint32_t& mode) {
  std::map<std::string, std::vector<std::byte>> xs;
  archive_entry_xattr_reset(ae);
  const char* name;
  const void* val;
  size_t len;
  while (archive_entry_xattr_next(ae, &name, &val, &len) == ARCHIVE_OK) {
    auto* b = static_cast<const std::byte*>(val);
    xs[name] = std::vector<std::byte>(b, b + len);
  }
  if (!xs.count("system.posix_acl_access"))
    if (auto acl = acl_xattr(ae, ARCHIVE_ENTRY_ACL_TYPE_ACCESS); !acl.empty()) xs["system.posix_acl_access"] = acl;
  if (!xs.count("system.posix_acl_default"))
    if (auto acl = acl_xattr(ae, ARCHIVE_ENTRY_ACL_TYPE_DEFAULT); !acl.empty())
      xs["system.posix_acl_default"] = acl;
  // With an extended access ACL the group bits of the mode are its mask
  // (POSIX.1e); libarchive's mode has the owning group's instead.
  if (auto it = xs.find("system.posix_acl_access"); it != xs.end())
    if (auto acl = decode_acl(it->second))
      for (const auto& x : *acl)
        if (x.tag == 0x10) mode = (mode & ~uint32_t(070)) | (uint32_t(x.perm & 7) << 3);
  std::vector<Xattr> out;
  for (auto& [n, v] : xs) out.push_back({n, std::move(v)});
  return out;
}

// An OCI layer's markers (the OCI image spec, "Whiteouts"): ".wh.NAME" is a
// whiteout of NAME, ".wh..wh..opq" makes its directory opaque. False for
// the other ".wh..wh." names, which are no files.
bool ArchiveSource::oci_marker(SourceEntry& e) {
  std::string_view path = e.path;
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  const size_t cut = path.rfind('/');
  const std::string_view base = cut == std::string_view::npos ? path : path.substr(cut + 1);
  const std::string dir(cut == std::string_view::npos ? std::string_view{} : path.substr(0, cut + 1));
  if (base == kOpaque) {
    e.opaque = true;
    e.path = dir.empty() ? "." : dir;
  } else if (base.substr(0, kWhiteout.size()) == kWhiteout) {
    if (base.substr(kWhiteout.size(), kWhiteout.size()) == kWhiteout) return false;
    e.whiteout = true;
    e.path = dir + std::string(base.substr(kWhiteout.size()));
  }
  return true;
}

Result<std::optional<DataPiece>> ArchiveSource::data() {
  if (!in_data_) return std::optional<DataPiece>{};
  for (;;) {
    const void* buf;
    size_t len;
    la_int64_t off;
    const int r = archive_read_data_block(a_, &buf, &len, &off);
    if (r == ARCHIVE_EOF) {
      in_data_ = false;
      return std::optional<DataPiece>{};
    }
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return failure("a damaged or truncated archive");
    if (len == 0) continue;  // the end of a sparse member
    return std::optional<DataPiece>(
        DataPiece{uint64_t(off), std::span<const std::byte>(static_cast<const std::byte*>(buf), len)});
  }
}

// What follows the archive's end (padding) is read too, so that a digest
// covers the whole file.
Result<void> ArchiveSource::finish() {
  if (!feed_) return ok();
  for (;;) {
    const void* buf;
    la_ssize_t n = on_read(a_, this, &buf);
    if (n < 0) return Error::sys(read_errno_, "cannot read " + file_);
    if (n == 0) return ok();
  }
}

}  // namespace

Result<std::unique_ptr<EntrySource>> open_archive_source(const std::string& file, bool oci_layer, DigestFeed feed) {
  auto s = std::make_unique<ArchiveSource>(file, oci_layer, std::move(feed));
  PLY_CHECK(s->open());
  return std::unique_ptr<EntrySource>(std::move(s));
}

}  // namespace plyfs::io
