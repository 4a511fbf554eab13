// The kernel cache invalidations' own thread (notifier.h).
#include "notifier.h"

namespace plyfs {

Notifier::Inval Notifier::Inval::entry(fuse_ino_t dir, std::string name) {
  Inval i;
  i.kind = Entry;
  i.ino = dir;
  i.name = std::move(name);
  return i;
}

Notifier::Inval Notifier::Inval::inode(fuse_ino_t ino, off_t off, off_t len) {
  Inval i;
  i.kind = Inode;
  i.ino = ino;
  i.off = off;
  i.len = len;
  return i;
}

Notifier::Inval Notifier::Inval::store(fuse_ino_t ino, std::function<bool(off_t&, std::string&)> fetch) {
  Inval i;
  i.kind = Store;
  i.ino = ino;
  i.fetch = std::move(fetch);
  return i;
}

Notifier::Inval Notifier::Inval::run(std::function<void()> call) {
  Inval i;
  i.kind = Call;
  i.call = std::move(call);
  return i;
}

void Notifier::start(fuse_session* se) {
  std::lock_guard lk(mu_);
  if (thread_.joinable()) return;
  se_ = se;
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Notifier::stop() {
  {
    std::lock_guard lk(mu_);
    if (!thread_.joinable()) return;
    stop_ = true;
  }
  work_.notify_all();
  thread_.join();
  std::lock_guard lk(mu_);
  q_.clear();
}

void Notifier::post(std::vector<Inval> batch) {
  if (batch.empty()) return;
  {
    std::lock_guard lk(mu_);
    if (!thread_.joinable() || stop_) return;
    q_.push_back(std::move(batch));
  }
  work_.notify_one();
}

void Notifier::loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    work_.wait(lk, [&] { return stop_ || !q_.empty(); });
    if (stop_) return;
    std::vector<Inval> batch = std::move(q_.front());
    q_.pop_front();
    lk.unlock();
    // Errors are the kernel's to have: ENOENT when it holds nothing of the
    // node or name (nothing to drop), ENODEV once unmounted.
    for (Inval& i : batch) {
      switch (i.kind) {
        case Inval::Entry:
          (void)fuse_lowlevel_notify_inval_entry(se_, i.ino, i.name.data(), i.name.size());
          break;
        case Inval::Inode:
          (void)fuse_lowlevel_notify_inval_inode(se_, i.ino, i.off, i.len);
          break;
        case Inval::Store: {
          if (!i.fetch || !i.fetch(i.off, i.name) || i.name.empty()) break;
          fuse_bufvec v = FUSE_BUFVEC_INIT(i.name.size());
          v.buf[0].mem = i.name.data();
          (void)fuse_lowlevel_notify_store(se_, i.ino, i.off, &v, fuse_buf_copy_flags(0));
          break;
        }
        case Inval::Call:
          if (i.call) i.call();
          break;
      }
    }
    lk.lock();
  }
}

}  // namespace plyfs
