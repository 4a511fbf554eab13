// Random trees and their comparison, for the import/export tests: every file
// type, modes with setuid/setgid/sticky, owners, times to the nanosecond,
// xattrs in every namespace plyfs keeps (some out of line), POSIX ACLs,
// hard-link groups, sparse files, names of 255 bytes and names that are not
// UTF-8. compare_trees checks content, type, mode, owner, times, xattrs,
// link groups and hole maps, and says where two trees first differ.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace plyfs::iotest {

struct GenOptions {
  int entries = 150;
  bool sockets = true;          // tar cannot hold them
  bool devices = true;
  bool security_xattrs = true;  // security.* (umoci drops some)
  bool big_xattrs = true;       // values past 2000 bytes (ext4 holds 4 KiB of xattrs a file)
  uint64_t big_bytes = 1u << 20;
};

inline std::vector<std::byte> acl_xattr(uint32_t uid, uint16_t user_perm, uint16_t mask) {
  // Kernel encoding: version 2, then (tag, perm, id) sorted by tag.
  std::vector<std::byte> v;
  auto put = [&](uint64_t x, int n) {
    for (int i = 0; i < n; i++) v.push_back(std::byte(x >> (8 * i)));
  };
  put(2, 4);
  const uint32_t none = ~0u;
  for (auto [tag, perm, id] : std::vector<std::tuple<int, int, uint32_t>>{
           {1, 7, none}, {2, user_perm, uid}, {4, 5, none}, {16, mask, none}, {32, 4, none}}) {
    put(uint64_t(tag), 2);
    put(uint64_t(perm), 2);
    put(id, 4);
  }
  return v;
}

class TreeGen {
 public:
  TreeGen(std::string root, uint64_t seed, GenOptions o) : root_(std::move(root)), rng_(seed), o_(o) {}

  void make() {
    ::mkdir(root_.c_str(), 0755);
    dirs_.push_back("");
    for (int i = 0; i < o_.entries; i++) one();
    finish();
  }

 private:
  uint64_t r(uint64_t n) { return n ? rng_() % n : 0; }
  std::string full(const std::string& rel) const { return rel.empty() ? root_ : root_ + "/" + rel; }

  std::string name() {
    const int kind = int(r(20));
    std::string n;
    if (kind == 0) {
      n.assign(255, 'L');  // the longest name
      n[0] = char('a' + r(26));
      n[254] = char('a' + r(26));
    } else if (kind == 1) {
      n = "\xff\xfe-bad-";  // not UTF-8
      n += char('a' + r(26));
    } else if (kind == 2) {
      n = "sp ace\tand\\x";
    } else {
      const int len = 1 + int(r(12));
      for (int i = 0; i < len; i++) n += char("abcdefghijklmnopqrstuvwxyz0123456789_-."[r(39)]);
      if (n == "." || n == ".." || n.rfind(".wh.", 0) == 0) n = "x" + n;
    }
    return n;
  }

  std::string fresh_path() {
    for (;;) {
      const std::string& d = dirs_[r(dirs_.size())];
      std::string p = d.empty() ? name() : d + "/" + name();
      struct stat st;
      if (::lstat(full(p).c_str(), &st) != 0) return p;
    }
  }

  std::string bytes(size_t n) {
    std::string s(n, '\0');
    for (size_t i = 0; i < n; i += 8) {
      const uint64_t x = rng_();
      std::memcpy(s.data() + i, &x, std::min<size_t>(8, n - i));
    }
    return s;
  }

  void write_at(int fd, uint64_t off, const std::string& data) {
    if (::pwrite(fd, data.data(), data.size(), off_t(off)) != ssize_t(data.size())) std::abort();
  }

  void file(const std::string& p) {
    int fd = ::open(full(p).c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return;
    const int k = int(r(10));
    if (k < 5) {
      write_at(fd, 0, bytes(r(9000)));
    } else if (k < 8) {
      write_at(fd, 0, bytes(r(300000)));
    } else if (k < 9) {
      write_at(fd, 0, bytes(o_.big_bytes / 2 + r(o_.big_bytes / 2)));
    } else {  // sparse: 4 KiB-aligned pieces in a file of up to 4 MiB, maybe ending in a hole
      const uint64_t size = (1 + r(1024)) * 4096 + r(4096);
      if (::ftruncate(fd, off_t(size)) != 0) std::abort();
      for (int i = 0, n = 1 + int(r(4)); i < n; i++) {
        const uint64_t off = r(size / 4096) * 4096;
        write_at(fd, off, bytes(std::min<uint64_t>(size - off, (1 + r(8)) * 4096)));
      }
    }
    ::close(fd);
    files_.push_back(p);
  }

  void one() {
    const std::string p = fresh_path();
    const std::string f = full(p);
    const int k = int(r(100));
    if (k < 40) {
      file(p);
    } else if (k < 60) {
      if (::mkdir(f.c_str(), 0755) == 0) dirs_.push_back(p);
    } else if (k < 70) {
      std::string t = r(2) ? name() : "../" + name() + "/x";
      if (::symlink(t.c_str(), f.c_str()) == 0) others_.push_back(p);
    } else if (k < 80) {
      if (!files_.empty() && ::link(full(files_[r(files_.size())]).c_str(), f.c_str()) == 0) files_.push_back(p);
    } else if (k < 86) {
      if (::mkfifo(f.c_str(), 0644) == 0) others_.push_back(p);
    } else if (k < 92 && o_.sockets) {
      int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      // bind wants a path under 108 bytes: from a short directory.
      char cwd[4096];
      if (!::getcwd(cwd, sizeof cwd)) std::abort();
      const std::string dir = f.substr(0, f.rfind('/')), base = f.substr(f.rfind('/') + 1);
      if (base.size() < sizeof a.sun_path && ::chdir(dir.c_str()) == 0) {
        std::memcpy(a.sun_path, base.c_str(), base.size());
        if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) others_.push_back(p);
        if (::chdir(cwd) != 0) std::abort();
      }
      ::close(s);
    } else if (k < 98 && o_.devices) {
      const mode_t t = r(2) ? S_IFCHR : S_IFBLK;
      if (::mknod(f.c_str(), t | 0640, makedev(unsigned(r(300)), unsigned(r(300000)))) == 0) others_.push_back(p);
    } else {
      file(p);
    }
  }

  void xattrs(const std::string& p, bool is_dir) {
    const std::string f = full(p);
    for (int i = 0, n = int(r(4)); i < n; i++) {
      std::string v = bytes(o_.big_xattrs && r(5) == 0 ? 2000 + r(8000) : r(200));
      std::string key = "user.k" + std::to_string(r(5));
      (void)::lsetxattr(f.c_str(), key.c_str(), v.data(), v.size(), 0);
    }
    if (r(6) == 0) (void)::lsetxattr(f.c_str(), "trusted.t", "tv", 2, 0);
    if (o_.security_xattrs && r(6) == 0) (void)::lsetxattr(f.c_str(), "security.s", "sv", 2, 0);
    if (r(5) == 0) {
      auto acl = acl_xattr(uint32_t(1000 + r(100)), uint16_t(r(8)), uint16_t(r(8)));
      (void)::lsetxattr(f.c_str(), "system.posix_acl_access", acl.data(), acl.size(), 0);
    }
    if (is_dir && r(6) == 0) {
      auto acl = acl_xattr(uint32_t(2000 + r(100)), 5, 7);
      (void)::lsetxattr(f.c_str(), "system.posix_acl_default", acl.data(), acl.size(), 0);
    }
  }

  timespec when() { return {time_t(1000000000 + r(700000000)), long(r(1000000000))}; }

  // Owners, modes, xattrs and times last, deepest first, so that nothing
  // made later changes them (a directory's mtime, an inherited ACL).
  void finish() {
    std::vector<std::pair<std::string, bool>> all;
    for (auto& p : files_) all.push_back({p, false});
    for (auto& p : others_) all.push_back({p, false});
    for (size_t i = dirs_.size(); i-- > 0;) all.push_back({dirs_[i], true});
    for (auto& [p, is_dir] : all) {
      const std::string f = full(p);
      struct stat st;
      if (::lstat(f.c_str(), &st) != 0) continue;
      if (::lchown(f.c_str(), uid_t(r(3) ? r(70000) : 0), gid_t(r(3) ? r(70000) : 0)) != 0) std::abort();
      if (!S_ISLNK(st.st_mode)) {
        mode_t m = mode_t(r(01000));
        if (is_dir) m |= 0700;
        if (r(8) == 0) m |= S_ISUID;
        if (r(8) == 0) m |= S_ISGID;
        if (r(8) == 0) m |= S_ISVTX;
        if (::chmod(f.c_str(), m) != 0) std::abort();
        if (S_ISREG(st.st_mode) || is_dir) xattrs(p, is_dir);
      }
      timespec ts[2] = {when(), when()};
      if (::utimensat(AT_FDCWD, f.c_str(), ts, AT_SYMLINK_NOFOLLOW) != 0) std::abort();
    }
  }

  std::string root_;
  std::mt19937_64 rng_;
  GenOptions o_;
  std::vector<std::string> dirs_, files_, others_;
};

struct CompareOptions {
  bool atime = true;
  bool sockets = true;     // false: sockets of `a` are not expected in `b` (tar)
  bool root_attrs = true;
  bool holes = true;
  bool xattrs = true;
  bool security = true;    // compare security.* xattrs
  bool ns = true;          // times to the nanosecond (else seconds)
  bool ustar_holes = false;  // through export's tarball: holes only where the path fits ustar
};

inline bool fits_ustar(const std::string& p) {
  if (p.size() <= 100) return true;
  for (size_t cut = p.find('/'); cut != std::string::npos; cut = p.find('/', cut + 1))
    if (cut > 0 && cut <= 155 && p.size() - cut - 1 <= 100) return true;
  return false;
}

class TreeCompare {
 public:
  TreeCompare(std::string a, std::string b, CompareOptions o) : a_(std::move(a)), b_(std::move(b)), o_(o) {}

  // "" when equal, else the first difference.
  std::string run() {
    walk("");
    return diff_.str();
  }

 private:
  static std::vector<std::string> names(const std::string& dir) {
    std::vector<std::string> out;
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOATIME);
    if (fd < 0) return out;
    DIR* d = ::fdopendir(fd);
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != ".." && !(n == ".plyfs")) out.push_back(n);
    }
    ::closedir(d);
    std::sort(out.begin(), out.end());
    return out;
  }

  static std::string read_all(const std::string& p) {
    std::string s;
    int fd = ::open(p.c_str(), O_RDONLY | O_NOATIME);
    if (fd < 0) return "<cannot open>";
    char buf[65536];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, size_t(n));
    ::close(fd);
    return s;
  }

  static std::vector<std::pair<off_t, off_t>> holes(const std::string& p, off_t size) {
    std::vector<std::pair<off_t, off_t>> out;
    int fd = ::open(p.c_str(), O_RDONLY | O_NOATIME);
    if (fd < 0) return out;
    for (off_t off = 0; off < size;) {
      off_t d = ::lseek(fd, off, SEEK_DATA);
      if (d < 0) break;
      off_t h = ::lseek(fd, d, SEEK_HOLE);
      if (h <= d) break;
      out.push_back({d, h});
      off = h;
    }
    ::close(fd);
    return out;
  }

  std::map<std::string, std::string> xattrs(const std::string& p) {
    std::map<std::string, std::string> out;
    char list[65536];
    ssize_t n = ::llistxattr(p.c_str(), list, sizeof list);
    for (ssize_t i = 0; i < n;) {
      std::string k = list + i;
      i += ssize_t(k.size()) + 1;
      if (!o_.security && k.rfind("security.", 0) == 0) continue;
      std::string v(70000, '\0');
      ssize_t m = ::lgetxattr(p.c_str(), k.c_str(), v.data(), v.size());
      v.resize(m < 0 ? 0 : size_t(m));
      out[k] = v;
    }
    return out;
  }

  bool differ(const std::string& rel, const std::string& what) {
    if (diff_.tellp() == 0) diff_ << "/" << rel << ": " << what;
    return false;
  }

  bool same_time(const timespec& x, const timespec& y) {
    return x.tv_sec == y.tv_sec && (!o_.ns || x.tv_nsec == y.tv_nsec);
  }

  bool entry(const std::string& rel) {
    const std::string pa = rel.empty() ? a_ : a_ + "/" + rel, pb = rel.empty() ? b_ : b_ + "/" + rel;
    struct stat sa, sb;
    if (::lstat(pa.c_str(), &sa) != 0) return differ(rel, "missing in the first tree");
    if (::lstat(pb.c_str(), &sb) != 0) return differ(rel, "missing in the second tree");
    auto num = [](auto x, auto y) {
      std::ostringstream s;
      s << std::oct << x << " vs " << y;
      return s.str();
    };
    if ((sa.st_mode & S_IFMT) != (sb.st_mode & S_IFMT)) return differ(rel, "type " + num(sa.st_mode, sb.st_mode));
    const bool root = rel.empty();
    if (root && !o_.root_attrs) return true;
    if (!S_ISLNK(sa.st_mode) && (sa.st_mode & 07777) != (sb.st_mode & 07777))
      return differ(rel, "mode " + num(sa.st_mode, sb.st_mode));
    if (sa.st_uid != sb.st_uid || sa.st_gid != sb.st_gid)
      return differ(rel, "owner " + std::to_string(sa.st_uid) + ":" + std::to_string(sa.st_gid) + " vs " +
                             std::to_string(sb.st_uid) + ":" + std::to_string(sb.st_gid));
    if (!same_time(sa.st_mtim, sb.st_mtim))
      return differ(rel, "mtime " + std::to_string(sa.st_mtim.tv_sec) + "." + std::to_string(sa.st_mtim.tv_nsec) +
                             " vs " + std::to_string(sb.st_mtim.tv_sec) + "." + std::to_string(sb.st_mtim.tv_nsec));
    if (o_.atime && !S_ISLNK(sa.st_mode) && !same_time(sa.st_atim, sb.st_atim))
      return differ(rel, "atime " + std::to_string(sa.st_atim.tv_sec) + "." + std::to_string(sa.st_atim.tv_nsec) +
                             " vs " + std::to_string(sb.st_atim.tv_sec) + "." + std::to_string(sb.st_atim.tv_nsec));
    if (o_.xattrs) {
      auto xa = xattrs(pa), xb = xattrs(pb);
      if (xa != xb) {
        std::string which;
        for (auto& [k, v] : xa)
          if (!xb.count(k) || xb[k] != v) which += " " + k + (xb.count(k) ? "(value)" : "(missing)");
        for (auto& [k, v] : xb)
          if (!xa.count(k)) which += " " + k + "(extra)";
        return differ(rel, "xattrs:" + which);
      }
    }
    if (S_ISCHR(sa.st_mode) || S_ISBLK(sa.st_mode))
      if (sa.st_rdev != sb.st_rdev) return differ(rel, "rdev");
    if (S_ISLNK(sa.st_mode)) {
      char ta[4096], tb[4096];
      ssize_t na = ::readlink(pa.c_str(), ta, sizeof ta), nb = ::readlink(pb.c_str(), tb, sizeof tb);
      if (std::string(ta, size_t(std::max<ssize_t>(na, 0))) != std::string(tb, size_t(std::max<ssize_t>(nb, 0))))
        return differ(rel, "symlink target");
    }
    if (S_ISREG(sa.st_mode)) {
      if (sa.st_size != sb.st_size) return differ(rel, "size " + std::to_string(sa.st_size) + " vs " + std::to_string(sb.st_size));
      if (read_all(pa) != read_all(pb)) return differ(rel, "content");
      // Link groups: the first path met of each inode, on both sides (the
      // walk's order is export's: names sorted as bytes).
      auto ga = group_a_.try_emplace(sa.st_ino, rel).first->second;
      auto gb = group_b_.try_emplace(sb.st_ino, rel).first->second;
      if (ga != gb) return differ(rel, "hard link group: with /" + ga + " vs with /" + gb);
      // A tarball keeps the holes of a file whose first path fits ustar
      // (export's one limit, lib/io/exporter.cpp fits_ustar).
      const bool holes_kept = !o_.ustar_holes || fits_ustar("./" + ga);
      if (o_.holes && holes_kept && holes(pa, sa.st_size) != holes(pb, sb.st_size)) return differ(rel, "hole map");
    }
    return true;
  }

  void walk(const std::string& rel) {
    if (!entry(rel)) return;
    const std::string pa = rel.empty() ? a_ : a_ + "/" + rel, pb = rel.empty() ? b_ : b_ + "/" + rel;
    struct stat st;
    if (::lstat(pa.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;
    auto na = names(pa), nb = names(pb);
    if (!o_.sockets)
      std::erase_if(na, [&](const std::string& n) {
        struct stat s;
        return ::lstat((pa + "/" + n).c_str(), &s) == 0 && S_ISSOCK(s.st_mode);
      });
    if (na != nb) {
      for (auto& n : na)
        if (!std::binary_search(nb.begin(), nb.end(), n)) return (void)differ(rel.empty() ? n : rel + "/" + n, "missing in the second tree");
      for (auto& n : nb)
        if (!std::binary_search(na.begin(), na.end(), n)) return (void)differ(rel.empty() ? n : rel + "/" + n, "missing in the first tree");
    }
    for (const auto& n : na) {
      walk(rel.empty() ? n : rel + "/" + n);
      if (diff_.tellp() != 0) return;
    }
  }

  std::string a_, b_;
  CompareOptions o_;
  std::ostringstream diff_;
  std::map<ino_t, std::string> group_a_, group_b_;
};

inline std::string compare_trees(const std::string& a, const std::string& b, CompareOptions o = {}) {
  return TreeCompare(a, b, o).run();
}

}  // namespace plyfs::iotest
