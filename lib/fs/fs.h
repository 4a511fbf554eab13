// The filesystem-object layer: POSIX inodes, directories, files, symlinks and
// extended attributes in one filesystem tree (tree kind 2, format.md#fs-tree).
//
// A Filesystem serves one tree and knows nothing of branches or unions: the
// union layer (a later layer) stacks several of them. Every operation is one
// Volume::Txn, so it lands whole in one generation: a crash leaves it either
// done or not done (format.md#commit).
//
// File data is copy-on-write: a write puts the new bytes in newly allocated
// blocks, writes them to the device before the tree items that refer to them
// change (so the commit's flush orders data before the superblock), and
// only then swaps the extent items. Blocks the durable generation can reach
// are never overwritten.
//
// Concurrency: operations that only read (lookup, getattr, read, readdir,
// getxattr) take the tree lock shared and run in parallel; data reads
// leave the lock before they touch the device. Changes take it exclusive
// for their tree updates only. Writers of one file are serialized by a
// per-inode lock that also covers the read-modify-write of partial blocks.
#pragma once

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "commit/volume.h"
#include "fs/compress.h"
#include "fs/pins.h"
#include "fs/policy.h"

namespace plyfs {

namespace fsitems {
struct Ext;
}

// What VolumeOptions::kinds needs to open an image with filesystem trees.
ValueRefs fs_value_refs();
std::map<uint8_t, ValueRefs> fs_kinds();
// How to move those references when their extents move (shrinking).
std::map<uint8_t, ValueMove> fs_movers();

struct Attr {
  uint64_t ino = 0;
  uint32_t mode = 0, uid = 0, gid = 0, nlink = 0;
  uint64_t size = 0, blocks = 0, rdev = 0, generation = 0;
  timespec atime{}, mtime{}, ctime{}, btime{};
  bool opaque = false;  // a directory that hides the ones below it in a union
};

struct SetAttr {
  std::optional<uint32_t> mode, uid, gid;
  std::optional<uint64_t> size;
  std::optional<timespec> atime, mtime;  // tv_nsec == UTIME_NOW: now
  std::optional<timespec> ctime;         // default: now
  std::optional<bool> opaque;            // directories only
  // Clear setuid, and setgid when the file is group-executable, unless
  // `mode` sets the bits itself: what Linux does to a non-directory on
  // chown, and on a write or truncate by a caller without CAP_FSETID.
  bool kill_setid = false;
};

// A raw directory entry: what a name is in this tree, whiteouts included.
struct Entry {
  uint64_t ino;  // 0 for a whiteout
  uint8_t type;  // DT_*, or DT_WHT for a whiteout
};

// A filesystem tree's branch fields (format.md#fs-info).
struct BranchMeta {
  TreeId tree;
  std::string name;
  TreeId parent;        // the branch it was created from or layered on; 0: none
  bool read_only = false;
  bool doomed = false;  // left by an unfinished merge or rollback: dropped at the next open
  // Taken by `snapshot` of `origin` (format.md#snapshots): an O(1) clone.
  bool snapshot = false;
  // Held (plyctl hold): no delete, merge or retention makes it go away
  // (format.md#snapshots, "Holds"). A clone or snapshot is not held.
  bool held = false;
  uint64_t root = 0, created_ns = 0;
  Generation created;   // generation of its root record
  TreeId origin;        // the tree it was cloned from (its root record's cloned_from); 0: none
  // The branch's identity, random, kept by renames (all zero for a tree
  // written before version 4 until its info is next written); and for a
  // received branch, the uuid of the branch it copies.
  std::array<uint8_t, 16> uuid{}, received_uuid{};
  // Quotas (plyctl branch set --quota): the most bytes the branch may
  // reference, and hold exclusively; 0: no limit (format.md#quotas).
  uint64_t quota_referenced = 0, quota_exclusive = 0;
  // The branch's compression default (plyctl branch set --compress); Unset:
  // the mount's (format.md#fs-compress).
  Compression compress;
};

struct DirEntry {
  std::string_view name;
  uint64_t ino;
  uint8_t type;       // DT_*
  uint64_t next;      // the cookie to continue after this entry
};

// The compression a mount asked for (plyfs -o compress=, compress-force=),
// for every filesystem of the volume it serves: a Volume::extension.
class MountCompression {
 public:
  Compression get() {
    std::lock_guard lk(mu_);
    return c_;
  }
  void set(const Compression& c) {
    std::lock_guard lk(mu_);
    c_ = c;
  }

 private:
  std::mutex mu_;
  Compression c_;
};

// How long a staged file must be quiet before it moves (plyfs -o
// stage_delay=, format.md#staged-writes), for every filesystem of the volume
// a mount serves: a Volume::extension. Filesystem::set_stage_delay wins.
struct MountStageDelay {
  std::atomic<int64_t> ms{5000};
};

// Most specific wins (format.md#fs-compress, "Policy"): an inode's NOCOMPRESS
// or COMPRESS flag, then the branch's default, then the mount's. COMPRESS
// takes the level and force of the branch or mount when they compress.
Compression effective_compression(uint32_t inode_flags, const Compression& branch, const Compression& mount);

struct FsCreateOptions {
  std::string name = "main";
  uint32_t root_mode = 0755, uid = 0, gid = 0;
  TreeId parent{0};
  bool read_only = false;
  bool doomed = false;
};

// mkfs: an empty image whose one filesystem tree (the default branch) holds
// an empty root directory. Both superblocks are durable when it returns.
Result<SuperInfo> format_filesystem(BlockDevice& dev, const FormatOptions& f,
                                    const FsCreateOptions& o);

class Filesystem {
 public:
  // Creates an empty filesystem tree (a root directory) and returns its id.
  static Result<TreeId> create(Volume& v, const FsCreateOptions& o);
  // The same inside a transaction that does more (a snapshot's one
  // generation), which reserved the blocks: kCreateBlocks for this, and
  // kSetBranchBlocks per set_branch (format.md#commit, A5).
  static constexpr uint64_t kCreateBlocks = 80, kSetBranchBlocks = 20;
  static Result<TreeId> create(Volume::Txn& t, const FsCreateOptions& o);
  // The tree a mount uses when none is named: the lowest-id filesystem tree.
  static Result<TreeId> default_tree(Volume& v);
  // Opens a filesystem tree. Read-write opens free the orphans a crash left,
  // unless `reader`: an instance that only reads, beside another that may
  // hold open orphans (a mount's, while a snapshot or diff looks at it).
  static Result<std::unique_ptr<Filesystem>> open(Volume& v, TreeId tree, bool reader = false);
  ~Filesystem();
  // Every filesystem tree of the image with its branch fields, by tree id.
  static Result<std::vector<BranchMeta>> branches(Volume& v);
  static Result<BranchMeta> branch(Volume& v, TreeId tree);
  // Rewrites a branch's name, parent, flags or received uuid (one
  // generation). Its uuid stays (a tree without one gets one).
  static Result<void> set_branch(Volume& v, const BranchMeta& m);
  // The same inside a larger transaction.
  static Result<void> set_branch(Volume::Txn& t, const BranchMeta& m);
  static Result<BranchMeta> branch(Volume::Txn& t, TreeId tree);
  static Result<std::vector<BranchMeta>> branches(Volume::Txn& t);
  // The branch (not doomed) named `name`, or nullopt. An index of names
  // kept per volume makes this O(1) in the number of branches
  // (format.md#fs-info, "Finding a branch by name"), so that an image with
  // thousands of snapshots names new ones as fast as with one.
  static Result<std::optional<BranchMeta>> find(Volume& v, std::string_view name);
  static Result<std::optional<BranchMeta>> find(Volume::Txn& t, std::string_view name);
  // The branches whose parent is `parent` (layers on it, clones of it), and
  // those cloned from `origin` (its clones and snapshots), by tree id; and
  // how many branches are not doomed. From the same per-volume index.
  static Result<std::vector<BranchMeta>> children(Volume::Txn& t, TreeId parent);
  static Result<std::vector<BranchMeta>> clones_of(Volume::Txn& t, TreeId origin);
  static Result<size_t> live_branches(Volume::Txn& t);
  // A new branch sharing every block of `src` (Volume::Txn::clone_tree, O(1))
  // with the fields of `m` (its tree, origin and created are set here, and
  // a new uuid): a clone or a snapshot. kCloneBlocks reserved by the caller.
  static constexpr uint64_t kCloneBlocks = 64 + kSetBranchBlocks;
  static Result<BranchMeta> clone(Volume::Txn& t, TreeId src, BranchMeta m);
  // Drops a branch's tree, freeing what no other tree shares.
  static Result<void> drop(Volume::Txn& t, TreeId tree, const BTree::DropProgress& progress = {});
  // Branch `dst` takes the content of branch `src` (Volume::Txn::reset_tree)
  // and keeps its own tree id and branch fields: a rollback to a snapshot.
  static Result<void> reset(Volume::Txn& t, TreeId dst, TreeId src,
                            const BTree::DropProgress& progress = {});

  // What differs between two filesystem trees of one volume, item by item
  // (Volume::Txn::diff: subtrees the two share are skipped unread). For
  // diff (format.md#snapshots).
  struct NameChange {
    uint64_t dir;
    std::string name;
    uint64_t ino;   // 0: a whiteout
    uint8_t type;   // DT_*, or DT_WHT
  };
  struct Changes {
    std::vector<NameChange> removed, added;  // entries only in `from` / only in `to`
    std::vector<uint64_t> modified;          // objects in both whose items differ
    uint64_t nodes_read = 0;
  };
  // `progress`: the share of the two trees compared so far (BTree::diff).
  static Result<Changes> compare(Volume& v, TreeId from, TreeId to, const BTree::DiffProgress& progress = {});
  // A path of object `ino` from the root ("/a/b"), found through the parent
  // fields (a file's is a hint: format.md#fs-inode); nullopt if the hint
  // does not lead to a name of it.
  Result<std::optional<std::string>> path(uint64_t ino);
  // Every name of object `ino`: (directory, name), up to `limit` of them.
  // An inode keeps no list of its names (format.md#fs-inode), so this is
  // one scan of the tree: for the rare hard link a union copies up.
  Result<std::vector<std::pair<uint64_t, std::string>>> names_of(uint64_t ino, size_t limit);

  uint64_t root() const { return root_; }
  TreeId tree() const { return tree_; }
  uint32_t block_size() const { return bs_; }
  Volume& volume() { return vol_; }

  Result<Attr> getattr(uint64_t ino);
  Result<Attr> lookup(uint64_t dir, std::string_view name);
  // Regular files, FIFOs, sockets and device nodes. `umask` applies unless
  // the directory has a default ACL, which narrows the mode instead (pass 0
  // when the caller applied the umask already).
  Result<Attr> mknod(uint64_t dir, std::string_view name, uint32_t mode, uint64_t rdev,
                     uint32_t uid, uint32_t gid, uint32_t umask = 0);
  Result<Attr> mkdir(uint64_t dir, std::string_view name, uint32_t mode, uint32_t uid,
                     uint32_t gid, uint32_t umask = 0);
  Result<Attr> symlink(uint64_t dir, std::string_view name, std::string_view target,
                       uint32_t uid, uint32_t gid);
  Result<Attr> link(uint64_t ino, uint64_t dir, std::string_view name);
  // With `whiteout` the name becomes a whiteout in the same generation.
  Result<void> unlink(uint64_t dir, std::string_view name, bool whiteout = false);
  Result<void> rmdir(uint64_t dir, std::string_view name, bool whiteout = false);
  // flags: RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT (the old name
  // becomes a whiteout).
  Result<void> rename(uint64_t odir, std::string_view oname, uint64_t ndir,
                      std::string_view nname, unsigned flags);
  Result<std::string> readlink(uint64_t ino);

  // Whiteouts and copy-up, for the union layer (format.md#fs-union). A
  // whiteout is an entry of its own type; creating a name over one replaces
  // it, and a directory made over one is opaque. Lookup, rmdir's emptiness
  // test and rename treat a whiteout as no entry; readdir returns them with
  // type DT_WHT so that a union can hide the names below.
  Result<std::optional<Entry>> entry(uint64_t dir, std::string_view name);
  // Makes `name` a whiteout (EEXIST if it names a file; no-op if it is one).
  Result<void> whiteout(uint64_t dir, std::string_view name);
  // Copies object `ino` of `src` (another tree of the same volume) into this
  // tree under dir/name, keeping its inode number, attributes and xattrs and
  // sharing its data extents (no data is copied) and, for a file, grafting
  // its items (format.md#btree-graft): the leaves holding only them are
  // shared, so the cost is about one reference per leaf (1.75 MiB of
  // data at 64-block extents), not one per extent. A
  // directory comes over empty. If this tree already holds `ino` (a hard
  // link copied up by another name) the name is linked to it. A whiteout at
  // the name is replaced. One generation.
  Result<Attr> copy_in(Filesystem& src, uint64_t ino, uint64_t dir, std::string_view name);
  // For a merge (format.md#snapshots): gives this tree's object `ino` the
  // attributes, xattrs and data of the same object in `src`, sharing its
  // extents; keeps this tree's names of it (nlink) and, for a directory, its
  // entries, size, parent and opaque flag. One generation.
  Result<Attr> replace_from(Filesystem& src, uint64_t ino);
  // Whether object `ino` holds the same xattrs and data here as in `other`
  // (a tree of the same volume), item for item, its inode and entries
  // aside: true for a copy-up (copy_in shares the extents) that nothing
  // wrote since. For diff, which pairs a layer's copy-up with its original.
  Result<bool> same_content(Filesystem& other, uint64_t ino);
  Result<Attr> setattr(uint64_t ino, const SetAttr& s);
  // lsattr and chattr (FS_IOC_GETFLAGS, FS_IOC_SETFLAGS): the flags this
  // filesystem keeps are FS_COMPR_FL (+c) and FS_NOCOMP_FL (+m)
  // (format.md#fs-compress); setting any other is EOPNOTSUPP, both at once
  // EINVAL. Setting changes ctime, as chattr does on ext4 and btrfs.
  Result<uint32_t> get_fsflags(uint64_t ino);
  Result<void> set_fsflags(uint64_t ino, uint32_t fs_flags);

  // Entries after cookie (0: from the start, with "." and ".."), in cookie
  // order, while fn returns true. Cookies are stable (format.md#fs-dirent).
  Result<void> readdir(uint64_t dir, uint64_t cookie,
                       const std::function<bool(const DirEntry&)>& fn);

  Result<size_t> read(uint64_t ino, uint64_t off, std::span<std::byte> out);
  Result<size_t> write(uint64_t ino, uint64_t off, std::span<const std::byte> in);
  // mode: 0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE|KEEP_SIZE, FALLOC_FL_ZERO_RANGE[|KEEP_SIZE].
  Result<void> fallocate(uint64_t ino, int mode, uint64_t off, uint64_t len);
  // SEEK_DATA or SEEK_HOLE.
  Result<uint64_t> lseek(uint64_t ino, uint64_t off, int whence);
  // Where `ino`'s data lies (plyctl where, format.md#placement): each
  // extent in file order with the blocks of the volume it reads (a
  // compressed one: its whole frame). Empty for a file whose data is inline
  // (it lives in the tree, with the metadata) or that has none.
  struct Placed {
    uint64_t file_offset = 0, bytes = 0;  // the part of the file
    uint64_t block = 0, nblocks = 0;      // where it is stored
  };
  Result<std::vector<Placed>> placement(uint64_t ino);
  // Placement rules (format.md#placement-rules, fs_place.cpp): new data of
  // a file goes to the classes of the first rule that matches it, on a
  // volume whose PolicyState holds rules. A file whose rule changes (a
  // write or truncate across a size bound, a rename, chown or chmod) is
  // queued for migration, which a background thread of this filesystem
  // runs; settle_placement() waits until the queue is empty.
  // A file written under a staged rule (stage=, format.md#staged-writes) is
  // queued too, due once it has had no write for stage_delay (or has been
  // written for 4 times that; set_stage_delay, else the volume's
  // MountStageDelay, 5 s by default); settle_placement() makes every such file due
  // at once. On a read-write filesystem whose rules stage, the thread first
  // looks at every file once for staged data an earlier mount left.
  // migrate(ino) moves the file's data off other classes to its rule's
  // first class now (what the thread runs): the blocks moved; staged_only:
  // only the data that lies on a stage class.
  void settle_placement();
  Result<uint64_t> migrate(uint64_t ino, bool staged_only = false);
  void set_stage_delay(std::chrono::milliseconds d);
  // For tests: the startup look for staged data calls `hook` with each file
  // before it looks at it, and with 0 once it is done. Set before first use.
  void set_scan_hook(std::function<void(uint64_t ino)> hook);
  struct MigrationStats {
    uint64_t files = 0, blocks = 0, failed = 0;
    uint64_t queued = 0;  // migration_stats(): files waiting, or moving now
    MigrationStats& operator+=(const MigrationStats& o) {  // a stack's sum
      files += o.files;
      blocks += o.blocks;
      failed += o.failed;
      queued += o.queued;
      return *this;
    }
  };
  MigrationStats migration_stats();
  // plyctl policy apply: migrate() of every regular file of the branch now
  // (the seed's periodic enforcer), after a change of the rules.
  // `progress`: files done, files in all.
  Result<MigrationStats> migrate_all(const std::function<void(uint64_t, uint64_t)>& progress = nullptr);
  // The rule that decides for `ino` now (-1: none, the default order).
  struct PlacementAnswer {
    int rule = -1;
    Placement place;
  };
  Result<PlacementAnswer> placement_rule(uint64_t ino);
  // Shares whole blocks (reflink) where offsets allow, copies the rest.
  Result<uint64_t> copy_range(uint64_t in, uint64_t off_in, uint64_t out, uint64_t off_out,
                              uint64_t len);

  // flags: XATTR_CREATE, XATTR_REPLACE. Values up to 64 KiB (E2BIG
  // beyond); one too large for the name's item goes out of line
  // (format.md#fs-xattr).
  Result<void> setxattr(uint64_t ino, std::string_view name, std::span<const std::byte> value,
                        int flags);
  Result<std::vector<std::byte>> getxattr(uint64_t ino, std::string_view name);
  Result<std::vector<std::string>> listxattr(uint64_t ino);
  Result<void> removexattr(uint64_t ino, std::string_view name);

  struct StatFs { uint64_t blocks, bfree, bavail, files, ffree; uint32_t bsize, namemax; };
  StatFs statfs();

  // References from above (pins.h). This filesystem's own pins keep an
  // inode whole: one whose last name is removed while pinned becomes an
  // orphan and is freed at the last unpin.
  void pin(uint64_t ino, uint64_t n = 1);
  Result<void> unpin(uint64_t ino, uint64_t n = 1);
  // References kept in a table shared with other filesystems (a union's,
  // pins.h): they pin inodes here as this filesystem's own do. Attaching
  // is O(1). Whoever drops a shared table's last reference to an inode
  // calls release(ino) on every filesystem the table is attached to.
  void attach_pins(std::shared_ptr<const PinTable> t);
  // The table no longer pins anything here: the orphans nothing else pins
  // are freed.
  Result<void> detach_pins(const PinTable* t);
  // Counts an open handle to `ino` in t (a table attached here): from then
  // on the inode outlives its last name until the hold goes. ESTALE for an
  // inode already freed (a ghost) or being freed (an orphan nothing holds).
  Result<void> hold(uint64_t ino, PinTable& t);
  // Frees `ino` if it is an orphan here that nothing pins any more, and
  // forgets its ghost.
  Result<void> release(uint64_t ino);
  // The same for every orphan (after a shared table was cleared).
  Result<void> release_orphans();
  // Frees every pinned orphan (the mount is going away) and forgets every
  // reference, shared tables included. Idempotent.
  Result<void> release_all();
  size_t orphan_count();

  // With a kernel writeback cache the kernel keeps a file's mtime and ctime
  // as it writes and sends them with setattr; writes then leave them alone,
  // so that the times a program saw are the ones stored.
  void set_kernel_times(bool on) { kernel_times_ = on; }

  // A frame of a write (format.md#fs-compress): file blocks [fb, fb +
  // nblocks) and, if it compressed, the zstd frame that stores them.
  struct Frame {
    uint64_t fb;
    uint32_t nblocks;
    std::optional<std::vector<std::byte>> z;
    bool tail = false;  // its last block is the write's partial one, zero-padded
  };
  // How a write to `ino` compresses now: its flags, then the branch's
  // default, then the mount's (effective_compression).
  Result<Compression> compression_of(uint64_t ino);

  // Durable: commits the open generation.
  Result<void> sync();
  // Turns the filesystem read-only after an error (EIO for the caller).
  void fail(const Error& e);
  bool read_only() const;
  // The branch's content was replaced under this object (a rollback or a
  // merge, Filesystem::reset): from now on it changes nothing in the tree,
  // not even the orphans its pins kept (another object serves the new
  // content), and answers ESTALE to hold. Memory state is simply dropped.
  void retire() { retired_ = true; }

 private:
  Filesystem(Volume& v, TreeId tree, uint64_t root);
  struct Ctx;
  Result<void> free_orphans();
  Result<void> free_inode(uint64_t ino);
  Result<void> free_if_unpinned(uint64_t ino);
  Result<Attr> make_node(uint64_t dir, std::string_view name, uint32_t mode, uint64_t rdev,
                         uint32_t uid, uint32_t gid, std::string_view symlink_target,
                         uint32_t umask);
  Result<void> remove_name(uint64_t dir, std::string_view name, bool want_dir, bool whiteout);
  Result<void> rename_names(uint64_t odir, std::string_view oname, uint64_t ndir, std::string_view nname,
                            unsigned flags);
  Result<size_t> write_locked(uint64_t ino, uint64_t off, std::span<const std::byte> in,
                              const std::vector<Frame>* frames = nullptr);
  Result<std::vector<Frame>> precompress(uint64_t ino, uint64_t off, std::span<const std::byte> in);
  // A compressed extent's frame, decoded (or from frames_): EIO if it is damaged.
  Result<std::shared_ptr<const std::vector<std::byte>>> frame(uint64_t ino, const fsitems::Ext& e);
  FrameCache frames_;
  Result<void> truncate_locked(uint64_t ino, uint64_t size);
  Result<void> unshare_inline(uint64_t ino, const Placement& place = {});
  // Placement rules (fs_place.cpp).
  class Placer;
  Placer& placer();
  bool placing() const;
  void placing_named(const Attr& a, uint64_t dir, std::string_view name);
  void placing_renamed(uint64_t ndir, std::string_view nname);
  void placing_changed(const Attr& a);
  void placing_queue(uint64_t ino);
  Result<std::string> place_path(uint64_t ino);
  // Where new data of `ino` goes at `size`: with `staged` (a write), the
  // rule's write placement, and whether it stages; without, where the rule
  // keeps its data (fallocate: a preallocated extent is never moved).
  Result<Placement> place_for(uint64_t ino, const Attr& a, uint64_t size, bool* crossed, bool* staged = nullptr);
  Result<uint64_t> place_candidates(uint64_t ino, const Attr& a, const PlacementPolicy& pol, uint64_t version);
  Result<std::vector<uint64_t>> files_with_blocks();
  void placing_staged(uint64_t ino);
  void placing_gone(uint64_t ino);  // its blocks are freed: no longer waits
  std::mutex& inode_lock(uint64_t ino) { return ino_mu_[ino % ino_mu_.size()]; }

  Volume& vol_;
  TreeId tree_;
  uint64_t root_;
  uint32_t bs_;
  std::shared_mutex mu_;  // the tree: shared for reads, exclusive for changes
  std::array<std::mutex, 64> ino_mu_;
  bool pinned(uint64_t ino);  // any reference
  bool held(uint64_t ino);    // one that keeps the inode whole
  // Ghosts: the last attributes of inodes freed while the kernel still
  // knew them (pinned, not held; pins.h). getattr answers with them and
  // setattr changes them, so that the kernel's flush of a deleted file's
  // times costs no transaction; nothing else sees them. Each goes with its
  // last pin. Memory only: a crash or unmount loses nothing that was kept.
  void add_ghost(const Attr& a);
  std::optional<Attr> ghost(uint64_t ino);
  bool drop_ghost(uint64_t ino);
  void drop_unpinned_ghosts();
  std::mutex ghost_mu_;  // a leaf
  std::unordered_map<uint64_t, Attr> ghosts_;
  Result<void> for_each_orphan(const std::function<void(uint64_t)>& fn);
  PinTable pins_;  // this filesystem's own references
  std::mutex pin_mu_;  // guards shared_pins_ (taken before a table's own mutex)
  std::vector<std::shared_ptr<const PinTable>> shared_pins_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> retired_{false};
  bool kernel_times_ = false;
  PolicyState* policy_;  // the volume's rules (a Volume::extension)
  std::once_flag placer_once_;
  // How long a staged file must go unwritten before it moves (fs_place.cpp).
  std::atomic<int64_t> stage_delay_ms_{-1};  // -1: the mount's (MountStageDelay)
  std::function<void(uint64_t)> scan_hook_;  // set_scan_hook
  struct PlacerGone {  // Placer is complete only in fs_place.cpp
    void operator()(Placer* p) const;
  };
  std::unique_ptr<Placer, PlacerGone> placer_;  // last: its thread stops first
};

}  // namespace plyfs
