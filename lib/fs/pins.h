// References from above to a filesystem's inodes (a FUSE mount's lookup
// counts), counted per inode. An inode whose last name goes while something
// pins it becomes an orphan (format.md#fs-orphan) and lives on until the
// last pin goes.
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
  bool pinned(uint64_t ino) const {
    std::lock_guard lk(mu_);
    return n_.count(ino) != 0;
  }
  bool empty() const {
    std::lock_guard lk(mu_);
    return n_.empty();
  }
  void clear() {
    std::lock_guard lk(mu_);
    n_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, uint64_t> n_;
};

}  // namespace plyfs
