// References from above to a filesystem's inodes, counted per inode, of two
// strengths:
//   - pins: the kernel knows the inode (a FUSE mount's lookup counts);
//   - holds: it has the inode open (FUSE open/create until release).
// An inode whose last name goes while held becomes an orphan
// (format.md#fs-orphan) and lives on until neither kind is left. One only
// pinned is freed with its name, in the same generation, and lives on only
// in memory as a ghost (Filesystem, "ghosts"): the kernel may still ask for
// its attributes or flush its times, but can no longer reach its data
// (format.md#fs-orphan, "When an inode is freed").
//
// A table can be shared: a union keeps one table for all the branches that
// hold its references (Filesystem::attach_pins), so that a branch joining
// the stack takes every reference at once instead of one by one. That is
// what makes a snapshot of a warm mount O(1) (format.md#fs-union, "Inode
// references"). The mutex is a leaf: nothing else is locked under it.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace plyfs {

class PinTable {
 public:
  void pin(uint64_t ino, uint64_t n = 1) {
    std::lock_guard lk(mu_);
    n_[ino] += n;
  }
  // Drops up to n references; true if none is left (or there was none).
  bool unpin(uint64_t ino, uint64_t n = 1) {
    std::lock_guard lk(mu_);
    auto it = n_.find(ino);
    if (it == n_.end()) return true;
    if (it->second > n) {
      it->second -= n;
      return false;
    }
    n_.erase(it);
    return true;
  }
  void hold(uint64_t ino) {
    std::lock_guard lk(mu_);
    open_[ino]++;
  }
  // Drops one hold; true if none is left (or there was none).
  bool unhold(uint64_t ino) {
    std::lock_guard lk(mu_);
    auto it = open_.find(ino);
    if (it == open_.end()) return true;
    if (--it->second) return false;
    open_.erase(it);
    return true;
  }
  // Either kind of reference.
  bool pinned(uint64_t ino) const {
    std::lock_guard lk(mu_);
    return n_.count(ino) != 0 || open_.count(ino) != 0;
  }
  bool held(uint64_t ino) const {
    std::lock_guard lk(mu_);
    return open_.count(ino) != 0;
  }
  bool empty() const {
    std::lock_guard lk(mu_);
    return n_.empty() && open_.empty();
  }
  void clear() {
    std::lock_guard lk(mu_);
    n_.clear();
    open_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, uint64_t> n_, open_;
};

}  // namespace plyfs
