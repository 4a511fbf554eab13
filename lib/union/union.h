// The union layer: one view of an ordered stack of branches (filesystem
// trees of one image), with Unionfs's semantics (format.md#fs-union):
//
//  - lookup goes from the leftmost (highest-priority) branch to the right and
//    stops at the first file or whiteout; directories merge, down to the
//    first opaque one;
//  - readdir merges the branches' entries, without duplicates and without
//    the names whiteouts hide, with stable cookies;
//  - a change to an object of a read-only branch first copies it up into
//    the nearest writable branch to its left, creating its parent
//    directories there lazily; the copy keeps the inode number and shares
//    the data extents and the leaves of its extent items (Filesystem::copy_in,
//    a B-tree graft), so no data is copied and the metadata written is
//    about one reference per leaf (2 ms for 1 GiB through FUSE);
//  - deleting a name that a branch further right also holds leaves a
//    whiteout; mkdir over a whiteout makes an opaque directory;
//  - rename never fails with EXDEV: the source is copied up (a directory:
//    its whole visible subtree, as metadata, then made opaque) and renamed
//    inside one branch, leaving a whiteout where the old name must stay
//    hidden.
//
// Inode numbers: a union inode number is the object's inode number, which
// the image allocates once for all branches; a copy keeps it. A number
// resolves to the leftmost branch holding that object, so hard links keep
// naming one file after a copy-up by one of their names, and st_ino stays
// the same across remounts and copy-ups. A copy-up of a file with several
// links brings every name the union shows it by into the copy's branch
// (copy_links), so deleting one name never uncovers the old version.
// Branches of one lineage (a clone and its source) hold one object each
// under its own names: a name right of a branch of its lineage that holds
// its object is not shown (held_left), so a number names one object, with
// the leftmost holder's names and link count.
//
// Atomicity: every step that changes a branch is one Filesystem operation,
// so one generation. A multi-step operation orders its steps so that every
// prefix shows the user the same view as before (copy-ups, parent
// directories, whiteouts at names already hidden), and the last step makes
// the change visible: a crash or error between steps never shows a half-done
// operation.
//
// This layer reaches the branches only through Filesystem; it never touches
// the volume's trees itself.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "fs/fs.h"

namespace plyfs {

namespace union_internal {
struct Merged;
struct Listing;
}

// A shared mutex that counts its exclusive holds: a reader that saw the
// same count before and after let go knows that no writer ran in between
// (the union's parked listings, union_readdir.cpp, invariant L1).
class CountedMutex {
 public:
  void lock() {
    mu_.lock();
    count_.fetch_add(1, std::memory_order_relaxed);
  }
  bool try_lock() {
    if (!mu_.try_lock()) return false;
    count_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  void unlock() { mu_.unlock(); }
  void lock_shared() { mu_.lock_shared(); }
  bool try_lock_shared() { return mu_.try_lock_shared(); }
  void unlock_shared() { mu_.unlock_shared(); }
  // Exact while held (shared or exclusive): it moves only under the lock.
  uint64_t changes() const { return count_.load(std::memory_order_relaxed); }
  // A change made elsewhere (another union over the same branches).
  void note_change() { count_.fetch_add(1, std::memory_order_relaxed); }

 private:
  std::shared_mutex mu_;
  std::atomic<uint64_t> count_{0};
};

struct UnionBranch {
  Filesystem* fs;
  bool writable;
};

// How a copy-up sets the owner and mode of the copy (Unionfs's three modes).
struct CopyUpMode {
  enum Kind { Owner, Const, Current } kind = Owner;
  uint32_t uid = 0, gid = 0, mode = 0;  // Const
};

// What deleting a name does to the branches that hold it (Unionfs's modes).
//  - Whiteout: the visible instance is deleted (from a writable branch) or
//    hidden, and a whiteout hides the instances further right.
//  - All: every instance in a writable branch is deleted, right to left, the
//    visible one last, so that a failure midway leaves the view unchanged;
//    a whiteout is left only where a read-only branch (or a writable one
//    whose directory could not go: it holds names hidden by whiteouts)
//    still holds the name.
enum class DeleteMode { Whiteout, All };

// The caller of an operation: the owner of what it creates, with `umask`
// applied to creations (0 when the kernel applied it already), and
// CopyUpMode::Current's owner of copies.
struct Caller {
  uint32_t uid = 0, gid = 0, umask = 022;
  // The calling process, 0 if unknown: CopyUpMode::Current applies its
  // umask (copyup_umask), which FUSE sends only with a creation, not with
  // the open, write or chmod that copies a file up.
  uint32_t pid = 0;
};

// The umask CopyUpMode::Current applies to a copy: the Umask line of the
// caller's /proc/PID/status (Linux 4.7+), or 022 when it cannot be read
// (pid 0: the caller lives in a pid namespace the daemon does not see; the
// process is gone; no /proc).
uint32_t copyup_umask(const Caller& c);

class Union {
 public:
  // `branches` left (highest priority) to right; at least one.
  Union(std::vector<UnionBranch> branches, CopyUpMode copyup = {},
        DeleteMode del = DeleteMode::Whiteout);

  // Replaces the stack while mounted: branches added, removed, reordered or
  // switched between read-only and read-write, in one step that no other
  // operation overlaps (format.md#fs-union, "Live branch changes"). What the
  // kernel references is found again in the new stack: a file in the
  // leftmost branch that holds its number, a directory by its name under its
  // parent; one that no branch shows any more answers ESTALE. A file shown
  // from another instance than before, with another size or other times,
  // is reported with a new generation from then on (Attr::generation in
  // lookup, readdirplus, link): the kernel keeps its own size and times of
  // a file it writes back for as long as it keeps the inode (held open, or
  // a release still on its way), and only a new generation makes it drop
  // that inode for a fresh one. When it returns, no operation uses a branch
  // that left the stack any more: the caller may close it.
  Result<void> restack(std::vector<UnionBranch> branches);
  // The same, with `prepare` run first while nothing else runs, not even a
  // data change that resolved its branch earlier: a snapshot or merge of a
  // mounted stack changes the branches there and returns the new stack
  // (format.md#snapshots, "Online"). An error from prepare leaves the stack.
  Result<void> restack(const std::function<Result<std::vector<UnionBranch>>()>& prepare);
  std::vector<UnionBranch> stack();
  // Runs `fn` while nothing else runs, as restack's prepare, and changes
  // nothing: a reader of whole branches (a mount's diff, format.md#snapshots
  // "Online") sees them hold still, with no change half landed.
  Result<void> hold_still(const std::function<Result<void>()>& fn);
  // What the kernel may have cached: (parent, name, inode) of every known
  // object but the root, for invalidation after a restack.
  struct Known {
    uint64_t parent;
    std::string name;
    uint64_t ino;
  };
  std::vector<Known> known();

  // Another union over some of the same branches changed one of them (the
  // FUSE daemon's mounted view and the views of its control folder,
  // format.md#control-folder, "Caching"). What this union knows of the
  // objects there may be stale: a directory may have gained a part in that
  // branch, a file a copy in it.
  //
  // The names from the root to known object `ino` (empty for the root), or
  // none when a link of that chain is not known.
  std::optional<std::vector<std::string>> path_of(uint64_t ino);
  // Resolves `path` from the root afresh, as lookups would but counting no
  // reference, and updates what this union knows of each object on it (a
  // directory's parts, a file's copy). Returns the numbers of the objects
  // along it that this union knows, the root first, up to the first it does
  // not know or cannot find: an object the kernel holds has every
  // directory above it known.
  std::vector<uint64_t> refresh_path(const std::vector<std::string>& path);
  // Whether `ino` is known (the kernel may hold it).
  bool knows(uint64_t ino);

  uint64_t root() const { return root_; }
  uint32_t block_size() const { return bs_; }
  size_t branch_count() const { return br_.size(); }
  // The branch index that holds `ino` now (its leftmost instance), or -1.
  int branch_of(uint64_t ino);

  Result<Attr> getattr(uint64_t ino);
  Result<Attr> lookup(uint64_t dir, std::string_view name);
  Result<Attr> mknod(uint64_t dir, std::string_view name, uint32_t mode, uint64_t rdev,
                     const Caller& c);
  Result<Attr> mkdir(uint64_t dir, std::string_view name, uint32_t mode, const Caller& c);
  Result<Attr> symlink(uint64_t dir, std::string_view name, std::string_view target,
                       const Caller& c);
  Result<Attr> link(uint64_t ino, uint64_t dir, std::string_view name, const Caller& c);
  Result<void> unlink(uint64_t dir, std::string_view name);
  Result<void> rmdir(uint64_t dir, std::string_view name);
  Result<void> rename(uint64_t odir, std::string_view oname, uint64_t ndir,
                      std::string_view nname, unsigned flags, const Caller& c);
  Result<std::string> readlink(uint64_t ino);
  Result<Attr> setattr(uint64_t ino, const SetAttr& s, const Caller& c);
  // chattr/lsattr's flags (Filesystem::get_fsflags); setting copies up.
  Result<uint32_t> get_fsflags(uint64_t ino);
  Result<void> set_fsflags(uint64_t ino, uint32_t fs_flags, const Caller& c);
  // Entries after `cookie` (0: from the start, with "." and ".."), merged.
  // A call at the cookie where an earlier one stopped continues that listing
  // without reading the branches again, unless a name changed meanwhile; any
  // cookie gives the same entries either way (union_readdir.cpp, L1-L3).
  Result<void> readdir(uint64_t dir, uint64_t cookie,
                       const std::function<bool(const DirEntry&)>& fn);
  // The same with each entry's attributes, as lookup would find them (FUSE's
  // readdirplus), from what the listing read (no second resolution). Every
  // entry `fn` accepts (returns true for) counts one reference, like lookup;
  // "." and ".." come with no attributes and count none.
  Result<void> readdirplus(uint64_t dir, uint64_t cookie,
                           const std::function<bool(const DirEntry&, const Attr*)>& fn);

  // Opening for writing copies the file up, so that every later write of
  // that handle goes to a writable branch.
  Result<void> open(uint64_t ino, bool for_write, const Caller& c);
  Result<size_t> read(uint64_t ino, uint64_t off, std::span<std::byte> out);
  Result<size_t> write(uint64_t ino, uint64_t off, std::span<const std::byte> in, const Caller& c);
  Result<void> fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len, const Caller& c);
  Result<uint64_t> lseek(uint64_t ino, uint64_t off, int whence);
  // The visible file's data extents (Filesystem::placement): plyctl where.
  Result<std::vector<Filesystem::Placed>> placement(uint64_t ino);
  Result<uint64_t> copy_range(uint64_t in, uint64_t off_in, uint64_t out, uint64_t off_out,
                              uint64_t len, const Caller& c);

  Result<void> setxattr(uint64_t ino, std::string_view name, std::span<const std::byte> value,
                        int flags, const Caller& c);
  Result<std::vector<std::byte>> getxattr(uint64_t ino, std::string_view name);
  Result<std::vector<std::string>> listxattr(uint64_t ino);
  Result<void> removexattr(uint64_t ino, std::string_view name, const Caller& c);

  Filesystem::StatFs statfs();

  // References from above (the kernel's lookup counts): every lookup,
  // mknod, mkdir, symlink and link that succeeds counts one reference to
  // the node it returns, and unpin drops them (FUSE's forget; a caller that
  // could not hand the entry out unpins it at once). A node stays known while
  // referenced; the writable branches keep unlinked files alive meanwhile.
  Result<void> unpin(uint64_t ino, uint64_t n = 1);
  // Open handles (FUSE open and create, until release): a file held is kept
  // whole when its last name goes (an orphan), one only referenced is freed
  // with it (fs/pins.h). ESTALE for a file already deleted. unhold frees an
  // orphan nothing references any more.
  Result<void> hold(uint64_t ino);
  Result<void> unhold(uint64_t ino);
  // Forgets every reference (the mount is going away) and frees the files
  // that were unlinked while open, unless another user of the branch pins
  // them.
  Result<void> release_all();

  // Called after a copy-up changed the owner or mode of `ino` (CopyUpMode
  // Const or Current), on the thread of the operation that caused it,
  // whose object that is: the FUSE daemon drops the kernel's cached
  // attributes. Set before the union serves anyone.
  void set_copyup_hook(std::function<void(uint64_t ino)> fn) { copyup_hook_ = std::move(fn); }

  Result<void> sync();
  void fail(const Error& e);
  bool read_only();
  void set_kernel_times(bool on);

 private:
  // What the union knows of an object the kernel references.
  struct Node {
    uint64_t parent = 0;   // union inode of the directory it was found in
    std::string name;      // its name there
    bool is_dir = false;
    // (branch, inode there), left to right. A directory: every branch
    // whose same-named directory merges into it (down to the first opaque
    // one); anything else: one, the leftmost branch holding the object.
    // In nodes_ the branch is a key, its index minus shift_ (keyed());
    // node() returns a copy with indices.
    std::vector<std::pair<int, uint64_t>> inst;
    uint64_t refs = 0;
    // Added to the inode's generation in what lookups report (entry_of):
    // raised by a restack that shows the number from another instance with
    // another size or times, so that the kernel retires the inode it holds.
    uint64_t incarnation = 0;
  };
  struct Found {          // one name resolved in a merged directory
    Attr attr;
    std::vector<std::pair<int, uint64_t>> inst;
    int top_branch;       // branch of the visible (leftmost) entry
  };

  // A branch's filesystem and the object's inode there.
  using Part = std::pair<Filesystem*, uint64_t>;
  Result<Node> node(uint64_t ino);
  Result<Node> dir_node(uint64_t dir);  // node(), which must be a directory (takes mu_)
  Result<Attr> attr_of(uint64_t ino);  // getattr without io_mu_ (callers under mu_)
  // The visible part of `ino` as (branch index, inode): for use under mu_
  // (the indices change with restack).
  Result<std::pair<int, uint64_t>> top(uint64_t ino);
  // The same as a Part, safe without mu_: the filesystem outlives a restack.
  Result<Part> part(uint64_t ino);
  // `a` as a lookup reports it: the generation with the node's incarnation.
  Attr entry_of(Attr a);
  // Records what the union knows of `ino`; `count`: one more reference.
  void remember(uint64_t ino, uint64_t parent, std::string_view name, const Found& f,
                bool count = false);
  Result<std::optional<Found>> resolve(const Node& dir, std::string_view name);
  // What lookups resolved (format.md#fs-union, "Resolution cache"): a name
  // looked up again costs one attribute read, not an item lookup in every
  // branch of its directory (a miss in each branch above the one holding
  // it, a part in each for a merged directory). True while no tree of the
  // volume changed (Volume::mutations) and this union ran no change or
  // restack (mu_.changes()): emptied at the first use after either.
  struct Resolved {
    bool found = false;
    std::vector<std::pair<int, uint64_t>> inst;  // branch indices, as Found
    int top_branch = 0;
  };
  static constexpr size_t kResolvedMax = size_t(1) << 16;
  std::mutex rc_mu_;  // a leaf
  uint64_t rc_mutations_ = 0, rc_changes_ = 0;
  std::unordered_map<std::string, Resolved> rc_;
  uint64_t mutations() const;
  std::optional<Resolved> cached(uint64_t dir, std::string_view name, uint64_t mutations, uint64_t changes);
  void cache(uint64_t dir, std::string_view name, const std::optional<Found>& f, uint64_t mutations,
             uint64_t changes);
  // For a hard-linked file found in f.top_branch: its copy in a branch of
  // another lineage further left, if one holds it (see resolve).
  void leftmost_copy(Found& f);
  // Whether an entry at branch b naming object `ino` is hidden because a
  // branch of b's lineage left of it holds the object, other than as one of
  // `shown` (format.md#fs-union, "Inode numbers"; union.cpp).
  Result<bool> held_left(int b, uint64_t ino, const std::vector<std::pair<int, uint64_t>>& shown);
  Result<bool> hidden_name(const union_internal::Merged& m);  // the same for a listed name
  // After a copy of hard-linked file `ino` from branch b into t: its other
  // names that the union shows come along as links of the copy.
  Result<void> copy_links(uint64_t ino, int b, int t);
  // Whether a branch right of `b` holds anything (entry or whiteout) at the name.
  Result<bool> below_has(const Node& dir, int b, std::string_view name);
  int writable_left_of(int b) const;  // nearest writable branch left of b (b itself if writable)
  int leftmost_writable() const;
  // Whether directory `dir` can have a part in branch b (no opaque
  // directory of a branch further left cuts b off on the way up).
  Result<bool> reachable(uint64_t dir, int b);
  // The nearest writable branch at or left of b where every dir is reachable; -1: none.
  int usable_writable(int b, std::initializer_list<uint64_t> dirs);
  // The inode of directory `dir` in branch `b`, copying it and its parents
  // there first if needed.
  Result<uint64_t> dir_in(uint64_t dir, int b);
  // Makes `ino` (not a directory) live in a writable branch; returns it.
  Result<int> copy_up(uint64_t ino, const Caller& c);
  Result<Part> writable_instance(uint64_t ino, const Caller& c);
  Result<void> apply_copyup_mode(int b, uint64_t ino, const Caller& c);
  // Copies the visible subtree of directory `dir` into branch b and makes
  // every directory of it there opaque (for a rename of a merged directory).
  Result<void> materialize(uint64_t dir, int b, const Caller& c, int depth = 0);
  Result<bool> union_empty(uint64_t dir);
  // A merged listing of `dir` from `cookie` (union_readdir.cpp), continuing
  // a parked one where the cookie is where it stopped.
  Result<void> list(uint64_t dir, uint64_t cookie,
                    const std::function<Result<bool>(const DirEntry&, const union_internal::Merged*)>& fn);
  std::shared_ptr<union_internal::Listing> take_listing(uint64_t dir, uint64_t cookie);
  void park_listing(std::shared_ptr<union_internal::Listing> l);
  Result<void> remove(uint64_t dir, const Node& d, std::string_view name, const Found& f,
                      bool is_dir);
  // DeleteMode::All: deletes the instances of `name` that the visible one,
  // `vis`, hides, in writable branches, right to left, each step leaving
  // the view as it was.
  Result<void> remove_hidden(const Node& d, std::string_view name, const Found& vis);
  Result<Attr> create(uint64_t dir, std::string_view name,
                      const std::function<Result<Attr>(Filesystem&, uint64_t)>& make,
                      bool is_dir);

  // Read under mu_ (or nodes_mu_); replaced by restack under both, exclusive.
  std::vector<UnionBranch> br_;
  // The branches that hold the kernel's references (pins): the writable
  // ones, and any branch that held them and is still in the stack (a
  // branch turned read-only or frozen by a snapshot still serves the files
  // unlinked while open there). Changed only by restack, under mu_.
  std::vector<Filesystem*> holders_;
  // The kernel's references, counted once and attached to every holder
  // (fs/pins.h): a branch joins or leaves the holders in O(1).
  std::shared_ptr<PinTable> refs_ = std::make_shared<PinTable>();
  bool kernel_times_ = false;
  // Per branch: the tree its clone chain starts from (format.md#root-record,
  // cloned_from), 0 if unknown. Only branches of one lineage hold the same
  // object under different names without a hard link, so held_left looks
  // only where two of them are stacked (any_lineage_).
  std::vector<uint64_t> origin_;
  bool any_lineage_ = false;  // two branches of one lineage are stacked
  void compute_origins();
  // Whether branches a and b are of one lineage (an unknown origin counts
  // as every lineage).
  bool lineage(int a, int b) const;
  CopyUpMode copyup_;
  std::function<void(uint64_t)> copyup_hook_;
  DeleteMode del_;
  uint64_t root_;
  uint32_t bs_;
  // Shared by operations that change no name; exclusive for those that do
  // (creates, deletes, renames, copy-ups), so that a resolution is not
  // undone halfway by another thread. Its count of exclusive holds tells a
  // parked listing whether a name may have changed since.
  CountedMutex mu_;
  // Shared by every operation that leaves mu_ once it has its branch (data
  // and attribute reads and changes), exclusive for a restack; taken before
  // mu_. When a restack returns, nothing uses a branch that left the stack.
  std::shared_mutex io_mu_;
  std::shared_mutex nodes_mu_;
  std::unordered_map<uint64_t, Node> nodes_;
  // Listings the kernel is likely to continue (its next readdir asks for
  // the cookie where one stopped), oldest first: a few per directory being
  // listed at once, since FUSE sends no opendir here (fuse/ops_names.cpp).
  static constexpr size_t kParkedListings = 16;
  std::mutex lot_mu_;  // a leaf
  std::vector<std::shared_ptr<union_internal::Listing>> lot_;
  // A node's branch index is its key plus shift_. A snapshot's restack
  // inserts its new branch at the top: every known object's index grows by
  // one, and raising shift_ does that without touching the nodes, so the
  // snapshot of a warm mount stays O(1) (format.md#snapshots, "Online").
  // Changed by restack under nodes_mu_, exclusive; read under nodes_mu_.
  int shift_ = 0;
  Error stray(uint64_t ino) const;
  std::vector<std::pair<int, uint64_t>> keyed(std::vector<std::pair<int, uint64_t>> inst) const {
    for (auto& part : inst) part.first -= shift_;
    return inst;
  }
};

}  // namespace plyfs
