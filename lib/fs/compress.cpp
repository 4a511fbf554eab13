// zstd frames, the incompressibility test, the compression pool and the
// decompressed-frame cache (compress.h, format.md#fs-compress).
#include "fs/compress.h"

#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

#include "util/parse.h"

namespace plyfs {

Result<Compression> parse_compression(std::string_view s) {
  Compression c;
  if (s == "none" || s == "no" || s == "off") {
    c.mode = Compression::Mode::None;
    return c;
  }
  std::string_view algo = s, level;
  if (auto colon = s.find(':'); colon != std::string_view::npos) algo = s.substr(0, colon), level = s.substr(colon + 1);
  if (algo != "zstd")
    return Error::invalid("unknown compression '" + std::string(s) + "' (zstd, zstd:LEVEL with LEVEL 1-19, or none)");
  c.mode = Compression::Mode::Zstd;
  if (s.find(':') != std::string_view::npos) {
    c.level = int(PLY_TRY(parse_uint(level, "zstd level", 1, Compression::kMaxLevel)));
  }
  return c;
}

std::string compression_name(const Compression& c) {
  switch (c.mode) {
    case Compression::Mode::Unset: return "";
    case Compression::Mode::None: return "none";
    case Compression::Mode::Zstd: return "zstd:" + std::to_string(c.effective_level());
  }
  return "";
}

bool looks_compressible(std::span<const std::byte> data) {
  // 64 samples of 32 bytes spread over the frame: 2 KiB. Uniform random
  // bytes give an estimate near 7.9 bits per byte; text 4-5, code 5-6.
  constexpr size_t kSamples = 64, kRun = 32;
  if (data.size() < kSamples * kRun * 2) return true;
  uint32_t hist[256] = {};
  const size_t step = data.size() / kSamples;
  for (size_t s = 0; s < kSamples; s++)
    for (size_t i = 0; i < kRun; i++) hist[uint8_t(data[s * step + i])]++;
  const double n = double(kSamples * kRun);
  double h = 0;
  for (uint32_t c : hist)
    if (c) h -= (c / n) * std::log2(c / n);
  return h < 7.5;
}

namespace {
struct CCtx {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ~CCtx() { ZSTD_freeCCtx(c); }
};
struct DCtx {
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ~DCtx() { ZSTD_freeDCtx(d); }
};
}  // namespace

std::optional<std::vector<std::byte>> compress_frame(std::span<const std::byte> in, int level, uint32_t bs) {
  thread_local CCtx ctx;
  if (!ctx.c || in.size() <= bs) return std::nullopt;
  // At least one block saved, or it is not worth a frame (format.md#fs-compress).
  const size_t room = (in.size() + bs - 1) / bs * bs - bs;
  // A scratch buffer per thread: no zeroing of 124 KiB per frame.
  thread_local std::vector<std::byte> scratch;
  if (scratch.size() < room) scratch.resize(room);
  ZSTD_CCtx_reset(ctx.c, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(ctx.c, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(ctx.c, ZSTD_c_checksumFlag, 0);  // the blocks carry XXH3 checksums
  const size_t n = ZSTD_compress2(ctx.c, scratch.data(), room, in.data(), in.size());
  if (ZSTD_isError(n) || n > room) return std::nullopt;  // dstSize_tooSmall: it does not pay
  return std::vector<std::byte>(scratch.begin(), scratch.begin() + long(n));
}

Result<void> decompress_frame(std::span<const std::byte> frame, std::span<std::byte> out) {
  thread_local DCtx ctx;
  if (!ctx.d) return Error::io(ENOMEM, "cannot allocate a zstd decompression context");
  const size_t n = ZSTD_decompressDCtx(ctx.d, out.data(), out.size(), frame.data(), frame.size());
  if (ZSTD_isError(n))
    return Error::io(EIO, std::string("damaged compressed frame: ") + ZSTD_getErrorName(n));
  if (n != out.size())
    return Error::io(EIO, "compressed frame decodes to " + std::to_string(n) + " bytes, not " +
                              std::to_string(out.size()));
  return ok();
}

namespace {
// Threads that compress frames while the writer's own thread does too.
class Pool {
 public:
  Pool() {
    const unsigned n = std::clamp(std::thread::hardware_concurrency(), 2u, 8u) - 1;
    for (unsigned i = 0; i < n; i++) threads_.emplace_back([this] { run(); });
  }
  ~Pool() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  size_t size() const { return threads_.size(); }
  void submit(std::function<void()> f) {
    {
      std::lock_guard lk(mu_);
      q_.push_back(std::move(f));
    }
    cv_.notify_one();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        f = std::move(q_.front());
        q_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> q_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

Pool& pool() {
  static Pool p;
  return p;
}
}  // namespace

void parallel_for(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (n == 1) return fn(0);
  struct State {
    std::atomic<size_t> next{0};
    size_t done = 0;
    std::mutex mu;
    std::condition_variable cv;
    const std::function<void(size_t)>* fn;
  };
  auto st = std::make_shared<State>();
  st->fn = &fn;
  // A helper touches fn only for an index it claimed, and this call waits
  // for every claimed index: fn outlives every use.
  auto work = [st, n] {
    size_t mine = 0;
    for (size_t i; (i = st->next.fetch_add(1)) < n;) {
      (*st->fn)(i);
      mine++;
    }
    if (mine) {
      std::lock_guard lk(st->mu);
      st->done += mine;
      if (st->done == n) st->cv.notify_all();
    }
  };
  const size_t helpers = std::min(n - 1, pool().size());
  for (size_t i = 0; i < helpers; i++) pool().submit(work);
  work();
  std::unique_lock lk(st->mu);
  st->cv.wait(lk, [&] { return st->done == n; });
}

std::shared_ptr<const std::vector<std::byte>> FrameCache::get(uint64_t block, uint64_t tag) {
  std::lock_guard lk(mu_);
  auto it = map_.find(Key{block, tag});
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void FrameCache::put(uint64_t block, uint64_t tag, std::shared_ptr<const std::vector<std::byte>> data) {
  std::lock_guard lk(mu_);
  const Key k{block, tag};
  if (map_.count(k)) return;
  bytes_ += data->size();
  lru_.emplace_front(k, std::move(data));
  map_[k] = lru_.begin();
  while (bytes_ > max_ && lru_.size() > 1) {
    bytes_ -= lru_.back().second->size();
    map_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

}  // namespace plyfs
