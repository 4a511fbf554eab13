// The daemon's state and what its parts share: the one Daemon (g), the one
// errno mapping, the replies that hand the kernel an inode, and the
// functions one part calls in another. The parts: plyfs.cpp (main),
// options.cpp, daemon.cpp (this header's helpers), ops_names.cpp and
// ops_files.cpp (the FUSE operations on the mounted union), control.cpp
// (the control requests, control.h) and lifecycle.cpp (snapshot, merge,
// rollback and the threads that run them unasked).
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

#include <sys/stat.h>

#include <condition_variable>
#include <cstdarg>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "blockdev/blockdev.h"
#include "fs/fs.h"
#include "union/union.h"
#include "snap/retention.h"
#include "union/view.h"
#include "ctl_folder.h"
#include "notifier.h"

namespace plyfs::daemon {

// How far ahead the kernel reads a file the daemon serves (INIT's
// max_readahead, and the mount's read_ahead_kb: plyfs.cpp).
inline constexpr uint32_t kMaxReadahead = 1u << 20;

// --- the daemon's state -------------------------------------------------------

struct Daemon {
  std::unique_ptr<BlockDevice> dev;
  std::unique_ptr<Volume> vol;
  // Every branch opened since the mount, by tree id: kept until unmount,
  // because an operation that began before a restack may still use one.
  std::map<uint64_t, std::unique_ptr<Filesystem>> branches;
  std::unique_ptr<Union> u;
  std::unique_ptr<ControlFolder> ctl;  // every branch's view, under .plyfs
  Notifier notifier;                   // the invalidations for those views' caches (notifier.h)
  Notifier seeker;                     // SEEK_DATA/SEEK_HOLE after a write-back (ops_files.cpp)
  fuse_session* se = nullptr;
  std::mutex ctl_mu;                // one branch change at a time
  std::vector<ViewLayer> stack;     // what the union shows, under ctl_mu
  // The view the mount shows (-o view=, or the default view at mount time),
  // where plyctl branch ... --save writes the stack; empty: none (-o
  // branches=, -o layer=, or an image without views).
  std::string view;
  // Automatic snapshots (-o snapshot_interval, snapshot_keep).
  unsigned snap_interval = 0;
  Retention snap_keep;  // keeps all by default
  std::thread snapper;
  std::mutex snap_mu;
  std::condition_variable snap_cv;
  bool snap_stop = false;
  // The cleaner: drops the branches a merge or rollback doomed, after the
  // command that doomed them returned (format.md#snapshots, "Online").
  std::thread cleaner;
  std::mutex clean_mu;
  std::condition_variable clean_cv;
  bool clean_pending = false, clean_stop = false;
  // The memory watch (memory_loop): gives back the NBD read caches' lines
  // when the machine runs short (read_cache.h, C8). Runs when nbd_cache > 0.
  std::thread memwatch;
  std::mutex mem_mu;
  std::condition_variable mem_cv;
  bool mem_stop = false;
  bool read_only = false;
  bool daemonized = false;
  bool acl = false;        // default_permissions: the kernel checks permissions, and ACLs
  std::string image;       // the image's path, for messages
  bool dont_mask = false;  // the kernel leaves the umask to us (ACLs on)
  bool no_opendir = false; // the kernel can do without opendir
  bool writeback = true;    // ask for the kernel's writeback cache
  bool kernel_caches_writes = false;  // ... and the kernel gave it (op_init)
  uint64_t nbd_cache = 0;   // -o nbd_cache: an NBD device's read cache, a device added too
  bool odirect = false;     // -o odirect: devices opened with O_DIRECT, a device added too
  double timeout = 60.0;  // -o timeout: every change goes through this daemon
};
extern Daemon* g;

// To stderr as "plyfs: MESSAGE", or to syslog once the daemon runs in the
// background.
void log_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// libfuse's messages (fuse_set_log_func), each line as the daemon's own:
// "plyfs: unknown option(s): ..." rather than "fuse: ...". Its debug
// output (-d) passes unchanged.
void libfuse_log(enum fuse_log_level level, const char* fmt, va_list ap);
// How many error lines libfuse has said so far.
unsigned libfuse_errors();

// The mounted union and its inode numbers as FUSE knows them (the root is 1).
Union& fs();
uint64_t to_fs(fuse_ino_t i);
fuse_ino_t to_fuse(uint64_t i);
int errno_of(const Error& e);
void reply_err(fuse_req_t req, const Error& e);
void changed(std::initializer_list<ViewChange> cs);
struct stat to_stat(const Attr& a);
fuse_entry_param to_entry(const Attr& a);
void reply_entry(fuse_req_t req, const Result<Attr>& a, std::initializer_list<ViewChange> cs = {});
Caller caller(fuse_req_t req);
Result<void> kill_setid(fuse_req_t req, fuse_ino_t ino, bool kill);
// The mounted union's copy-up hook (Union::set_copyup_hook): the owner or
// mode of `ino` changed under the kernel's cached attributes.
void attributes_changed(uint64_t ino);

// The session's operations (ops_names.cpp), and those of other parts that
// the table takes: ops_files.cpp's and control.cpp's ioctl.
fuse_lowlevel_ops make_ops();
void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void op_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi);
void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
void op_write(fuse_req_t req, fuse_ino_t ino, const char* data, size_t size, off_t off, fuse_file_info*);
void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void op_fsync(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*);
void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                 int flags);
void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size);
void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char* name);
void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, fuse_file_info*);
void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, fuse_file_info*);
void op_copy_file_range(fuse_req_t req, fuse_ino_t in, off_t off_in, fuse_file_info*, fuse_ino_t out,
                        off_t off_out, fuse_file_info*, size_t len, int flags);
void op_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void*, fuse_file_info*, unsigned flags,
              const void* in_buf, size_t in_size, size_t out_size);

// Live branch changes (control.h). control() runs one JSON request, for
// op_ioctl and for the automatic snapshots (`may_change`: from root or the
// mount's owner); lifecycle() runs a snapshot, merge or rollback
// (lifecycle.cpp). Every restack opens its branches with union_branches
// and, unless the view stays the same, drops what the kernel cached with
// invalidate_all (daemon.cpp).
// Both answer with the JSON model's object for the command (snap/model.h).
// lifecycle's `arg`: a rollback's target snapshot (empty: the newest).
// `caller`: the requesting process (fuse_req_ctx), whose descriptors send
// and receive take their streams from.
Result<nlohmann::ordered_json> control(const nlohmann::ordered_json& request, bool may_change, pid_t caller = 0);
// `send` and `receive` (stream.cpp, format.md#send-stream): the stream is
// the caller's descriptor "fd", taken by the caller's pid.
Result<nlohmann::ordered_json> send_online(const nlohmann::ordered_json& req, pid_t caller);
Result<nlohmann::ordered_json> receive_online(const nlohmann::ordered_json& req, pid_t caller);
// A request's branch argument: a name (M1) or an id (control.cpp).
Result<BranchMeta> arg_branch(const nlohmann::ordered_json& req, const std::string& key);
Result<nlohmann::ordered_json> lifecycle(const std::string& cmd, const std::string& name, const std::string& arg);
Result<nlohmann::ordered_json> delete_online(const BranchMeta& b);
// Trim (space.cpp, format.md#discard): the control request "trim" (under
// ctl_mu, like the other requests) and fstrim's FITRIM ioctl.
Result<nlohmann::ordered_json> trim_online(uint64_t start, uint64_t len, uint64_t min_bytes);
// `resize` (space.cpp, format.md#resize): nullopt grows to the device's size.
Result<nlohmann::ordered_json> resize_online(std::optional<uint64_t> bytes);
// `device-add`, `device-remove`, `device-replace` (space.cpp,
// format.md#device-add, format.md#device-remove).
Result<nlohmann::ordered_json> device_online(const std::string& cmd, const nlohmann::ordered_json& req);
// scrub.cpp: the scrub (rate: bytes a second, 0: no limit), and its cancel
// (answered at once, outside ctl_mu; the running scrub stops at its next batch).
Result<nlohmann::ordered_json> scrub_online(uint64_t rate_bytes);
nlohmann::ordered_json cancel_scrub();
void op_fitrim(fuse_req_t req, const void* in_buf, size_t in_size, size_t out_size);
// FS_IOC_GETFLAGS and FS_IOC_SETFLAGS (ops_files.cpp).
void op_fsflags(fuse_req_t req, fuse_ino_t ino, unsigned cmd, const void* in_buf, size_t in_size,
                size_t out_size);
// The long operation running now (a merge, delete, rollback, diff, or the
// cleaner's drop), for the control channel's `progress` command
// (control.h), which answers without ctl_mu, held by the operation: made
// when the operation starts, fed from the callbacks the offline tools draw
// their progress lines from, gone when it ends (control.cpp).
class RunningOp {
 public:
  // `command`: the request's ("merge"...; "clean" for the cleaner); `what`
  // and `noun`: the progress line's, as plyctl draws it offline.
  RunningOp(const std::string& command, const std::string& what, const std::string& noun);
  ~RunningOp();
  RunningOp(const RunningOp&) = delete;
  RunningOp& operator=(const RunningOp&) = delete;
  void update(uint64_t done, double fraction);
};
void cleaner_loop();  // Daemon::cleaner and Daemon::snapper, started by main
void memory_loop();   // Daemon::memwatch
void snapper_loop();
void invalidate_all();
Result<std::vector<UnionBranch>> union_branches(const std::vector<ViewLayer>& s);

}  // namespace plyfs::daemon
