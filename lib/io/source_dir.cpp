// A directory as a source of entries (source.h): a depth-first walk that
// never follows a symbolic link, names sorted as bytes (the same tree gives
// the same import), hard links known by st_dev/st_ino, holes found with
// SEEK_DATA/SEEK_HOLE, xattrs read with llistxattr/lgetxattr.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <map>

#include "io/source.h"

namespace plyfs::io {

namespace {

constexpr size_t kReadBytes = 8u << 20;

// O_NOATIME: reading a file or listing a directory must not change the
// source's atimes, which the import keeps (root may use it on any file,
// others on their own files only).
int open_noatime(int dirfd, const char* name, int flags) {
  int fd = ::openat(dirfd, name, flags | O_CLOEXEC | O_NOATIME);
  if (fd < 0 && errno == EPERM) fd = ::openat(dirfd, name, flags | O_CLOEXEC);
  return fd;
}

struct Frame {
  int fd = -1;
  std::string rel;                 // "" for the root
  std::vector<std::string> names;  // sorted
  size_t next = 0;
};

Result<std::vector<std::string>> list_names(int fd, const std::string& shown_path) {
  int dup_fd = ::dup(fd);
  if (dup_fd < 0) return Error::sys(errno, "cannot read directory " + shown_path);
  DIR* d = ::fdopendir(dup_fd);
  if (!d) {
    ::close(dup_fd);
    return Error::sys(errno, "cannot read directory " + shown_path);
  }
  ::rewinddir(d);  // the offset is shared with `fd`, which an earlier walk read
  std::vector<std::string> names;
  errno = 0;
  while (dirent* de = ::readdir(d)) {
    std::string_view n = de->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
    errno = 0;
  }
  const int e = errno;
  ::closedir(d);
  if (e) return Error::sys(e, "cannot read directory " + shown_path);
  std::sort(names.begin(), names.end());
  return names;
}

Result<std::vector<Xattr>> read_xattrs(const std::string& path) {
  std::vector<Xattr> out;
  std::vector<char> list(4096);
  ssize_t n;
  while ((n = ::llistxattr(path.c_str(), list.data(), list.size())) < 0 && errno == ERANGE)
    list.resize(list.size() * 4);
  if (n < 0) {
    if (errno == ENOTSUP) return out;
    return Error::sys(errno, "cannot list the xattrs of " + path);
  }
  std::vector<std::byte> val(65536);
  for (ssize_t i = 0; i < n;) {
    std::string name(list.data() + i);
    i += ssize_t(name.size()) + 1;
    ssize_t m = ::lgetxattr(path.c_str(), name.c_str(), val.data(), val.size());
    if (m < 0) {
      if (errno == ENODATA) continue;  // gone meanwhile
      return Error::sys(errno, "cannot read xattr " + name + " of " + path);
    }
    out.push_back({name, std::vector<std::byte>(val.begin(), val.begin() + m)});
  }
  return out;
}

class DirSource final : public EntrySource {
 public:
  explicit DirSource(std::string root) : root_(std::move(root)) { buf_.resize(kReadBytes); }
  ~DirSource() override {
    for (auto& f : stack_) ::close(f.fd);
    if (file_fd_ >= 0) ::close(file_fd_);
  }

  Result<void> open_root(bool count);
  Result<std::optional<SourceEntry>> next() override;
  Result<std::optional<DataPiece>> data() override;
  bool strips_leading_slash() const override { return false; }

 private:
  Result<SourceEntry> describe(int dirfd, const std::string& name, const std::string& rel, struct stat& st);
  Result<void> push(int fd, const std::string& rel);
  Result<void> count(int fd, const std::string& rel);
  std::string full(const std::string& rel) const { return rel.empty() ? root_ : root_ + "/" + rel; }

  std::string root_;
  std::vector<Frame> stack_;
  bool root_done_ = false;
  std::map<std::pair<dev_t, ino_t>, uint64_t> links_;
  int file_fd_ = -1;
  uint64_t file_pos_ = 0, file_size_ = 0;
  std::string file_path_;
  std::vector<std::byte> buf_;
};

Result<void> DirSource::push(int fd, const std::string& rel) {
  Frame f;
  f.fd = fd;
  f.rel = rel;
  auto names = list_names(fd, full(rel));
  if (!names) {
    ::close(fd);
    return names.error();
  }
  f.names = std::move(*names);
  stack_.push_back(std::move(f));
  return ok();
}

// The bytes of every regular file, for progress: one walk of lstat.
Result<void> DirSource::count(int fd, const std::string& rel) {
  for (const auto& n : PLY_TRY(list_names(fd, full(rel)))) {
    struct stat st;
    if (::fstatat(fd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISREG(st.st_mode)) total_ += uint64_t(st.st_size);
    if (!S_ISDIR(st.st_mode)) continue;
    int sub = open_noatime(fd, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (sub < 0) continue;
    auto r = count(sub, rel.empty() ? n : rel + "/" + n);
    ::close(sub);
    PLY_CHECK(r);
  }
  return ok();
}

Result<void> DirSource::open_root(bool want_total) {
  int fd = open_noatime(AT_FDCWD, root_.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Error::sys(errno, "cannot open directory " + root_);
  if (want_total) {
    auto r = count(fd, "");
    if (!r) {
      ::close(fd);
      return r.error();
    }
  }
  return push(fd, "");
}

Result<SourceEntry> DirSource::describe(int dirfd, const std::string& name, const std::string& rel,
                                        struct stat& st) {
  const std::string path = full(rel);
  if (::fstatat(dirfd, name.empty() ? "." : name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return Error::sys(errno, "cannot stat " + path);
  SourceEntry e = SourceEntry::of(rel, st.st_mode, st.st_uid, st.st_gid, st.st_atim, st.st_mtim);
  e.size = S_ISREG(st.st_mode) ? uint64_t(st.st_size) : 0;
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) e.rdev = st.st_rdev;
  if (S_ISLNK(st.st_mode)) {
    std::string t(size_t(st.st_size) + 1, '\0');
    ssize_t n = ::readlinkat(dirfd, name.c_str(), t.data(), t.size());
    if (n < 0) return Error::sys(errno, "cannot read symbolic link " + path);
    t.resize(size_t(n));
    e.target = std::move(t);
  }
  if (!S_ISDIR(st.st_mode) && st.st_nlink > 1) {
    auto [it, fresh] = links_.try_emplace({st.st_dev, st.st_ino}, links_.size() + 1);
    e.link_key = it->second;
  }
  e.xattrs = PLY_TRY(read_xattrs(path));
  return e;
}

Result<std::optional<SourceEntry>> DirSource::next() {
  if (file_fd_ >= 0) {
    ::close(file_fd_);
    file_fd_ = -1;
  }
  struct stat st;
  if (!root_done_) {
    root_done_ = true;
    return std::optional<SourceEntry>(PLY_TRY(describe(stack_.back().fd, "", "", st)));
  }
  while (!stack_.empty()) {
    Frame& f = stack_.back();
    if (f.next == f.names.size()) {
      ::close(f.fd);
      stack_.pop_back();
      continue;
    }
    const std::string name = f.names[f.next++];
    const std::string rel = f.rel.empty() ? name : f.rel + "/" + name;
    const int dirfd = f.fd;
    SourceEntry e = PLY_TRY(describe(dirfd, name, rel, st));
    if (S_ISDIR(st.st_mode)) {
      int fd = open_noatime(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      if (fd < 0) return Error::sys(errno, "cannot open directory " + full(rel));
      PLY_CHECK(push(fd, rel));
    } else if (S_ISREG(st.st_mode)) {
      file_fd_ = open_noatime(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW);
      if (file_fd_ < 0) return Error::sys(errno, "cannot open " + full(rel));
      (void)::posix_fadvise(file_fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
      file_pos_ = 0;
      file_size_ = e.size;
      file_path_ = full(rel);
    }
    return std::optional<SourceEntry>(std::move(e));
  }
  return std::optional<SourceEntry>{};
}

// The data regions SEEK_DATA and SEEK_HOLE find, read in pieces of 8 MiB.
Result<std::optional<DataPiece>> DirSource::data() {
  if (file_fd_ < 0 || file_pos_ >= file_size_) return std::optional<DataPiece>{};
  off_t d = ::lseek(file_fd_, off_t(file_pos_), SEEK_DATA);
  if (d < 0) {
    if (errno == ENXIO) return std::optional<DataPiece>{};  // a hole to the end
    return Error::sys(errno, "cannot find the data of " + file_path_);
  }
  off_t h = ::lseek(file_fd_, d, SEEK_HOLE);
  if (h < 0) return Error::sys(errno, "cannot find the holes of " + file_path_);
  const uint64_t end = std::min<uint64_t>(uint64_t(h), file_size_);
  if (uint64_t(d) >= end) return std::optional<DataPiece>{};
  const size_t want = size_t(std::min<uint64_t>(end - uint64_t(d), buf_.size()));
  ssize_t n = ::pread(file_fd_, buf_.data(), want, d);
  if (n < 0) return Error::sys(errno, "cannot read " + file_path_);
  if (n == 0) return Error::io(EIO, file_path_ + " changed while it was read (shorter than its size)");
  file_pos_ = uint64_t(d) + uint64_t(n);
  read_ += uint64_t(n);
  return std::optional<DataPiece>(DataPiece{uint64_t(d), std::span<const std::byte>(buf_).first(size_t(n))});
}

}  // namespace

Result<std::unique_ptr<EntrySource>> open_dir_source(const std::string& dir, bool count_total) {
  auto s = std::make_unique<DirSource>(dir);
  PLY_CHECK(s->open_root(count_total));
  return std::unique_ptr<EntrySource>(std::move(s));
}

}  // namespace plyfs::io
