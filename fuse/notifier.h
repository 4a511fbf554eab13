// Invalidations of the kernel's caches that a change through one of the
// daemon's unions (the mounted view, or a view of the control folder)
// calls for in another one that shows the same branch
// (format.md#control-folder, "Caching"), sent from a thread of their own
// right after the request's reply.
//
// Why not before the reply, from the request's thread: the kernel acts on
// an entry invalidation holding the directory's lock (i_rwsem), and on a
// page invalidation holding the pages' locks, writing dirty pages back
// through the daemon first. The threads that hold those locks are often
// waiting for a request of this daemon: a create in a mount directory holds
// that directory while a create in the same directory seen through a view
// holds the view's one, and each one's invalidation needs the other's lock;
// a rename from one to the other holds both while it waits for its EXDEV.
// A request that waited for its invalidations would close such a knot, and
// it does under concurrent use (tests/fuse/ctl_folder_test.cpp, "at
// once"; a bounded wait only turns the deadlock into stalls).
//
// So no request ever waits for this thread, which holds no lock of the
// daemon while the kernel runs a notification: every lock it waits for is
// held by a thread whose request completes without it. The price: another
// view may show the old state for the moment between the reply and the
// notification (the tests wait for it, boundedly).
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace plyfs {

class Notifier {
 public:
  // One invalidation, as libfuse sends it.
  struct Inval {
    enum Kind { Entry, Inode, Store, Call } kind = Inode;
    fuse_ino_t ino = 0;  // Entry: the directory
    std::string name;    // Entry: the name
    off_t off = 0;       // Inode: negative for the attributes only
    off_t len = 0;       // Inode: 0 for up to the end
    // Store: the bytes to store and where, read when it is sent (after the
    // invalidations before it in its batch); false: nothing to store.
    std::function<bool(off_t& off, std::string& bytes)> fetch;
    // Call: run on this thread, in order with the notifications (a reply
    // that must come after one, fuse/ops_files.cpp op_lseek).
    std::function<void()> call;
    static Inval entry(fuse_ino_t dir, std::string name);
    static Inval inode(fuse_ino_t ino, off_t off, off_t len);
    static Inval store(fuse_ino_t ino, std::function<bool(off_t&, std::string&)> fetch);
    static Inval run(std::function<void()> call);
  };

  Notifier() = default;
  ~Notifier() { stop(); }
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  // From the mount on; stop() after the unmount (the kernel then answers
  // every notification at once, ENODEV), before what `fetch` uses goes.
  void start(fuse_session* se);
  void stop();
  // Queues `batch`, sent in order after the batches queued before it.
  // Without a session it does nothing.
  void post(std::vector<Inval> batch);

 private:
  void loop();

  fuse_session* se_ = nullptr;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable work_;
  std::deque<std::vector<Inval>> q_;
  bool stop_ = false;
};

}  // namespace plyfs
