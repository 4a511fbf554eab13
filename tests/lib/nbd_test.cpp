// lib/blockdev/nbd_device: an image on an NBD server, against real nbdkit
// servers on Unix sockets (tests/nbd_server.h); at the end, the crash
// harness over NBD (crash states rebuilt from the server's own log). Exits 77 (skipped) without
// nbdkit.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <catch2/generators/catch_generators.hpp>

#include "../nbd_server.h"
#include "../random_seed.h"
#include "blockdev/nbd_device.h"
#include "test_util.h"

using namespace plyfs;
using namespace plyfs::test;

extern "C" int plyfs_test_precheck() {
  if (nbdkit_path().empty()) {
    std::printf("SKIP: the NBD tests need nbdkit (Debian: nbdkit)\n");
    return 77;
  }
  return 0;
}

namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Dir {
  std::string path;
  Dir() {
    char t[] = "/tmp/plyfs-nbd-XXXXXX";
    REQUIRE(mkdtemp(t));
    path = t;
  }
  ~Dir() {
    const std::string cmd = "rm -rf '" + path + "'";
    if (std::system(cmd.c_str()) != 0) {}
  }
};

std::vector<std::byte> pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<std::byte>((seed * 131 + i * 7) >> (i % 3));
  return v;
}

}  // namespace

TEST_CASE("nbd device: size, round trips, flush, trim, range errors", "[nbd]") {
  Dir d;
  NbdServer srv(d.path, {"memory", "1G"});
  auto dev = must(NbdDevice::open(srv.uri(), false));
  REQUIRE(dev->size_bytes() == 1ull << 30);
  REQUIRE(dev->logical_sector_size() == 512);
  REQUIRE(dev->physical_sector_size() >= 512);
  REQUIRE(dev->connections() >= 1);

  auto a = pattern(4096, 1);
  REQUIRE(dev->write(8192, a));
  std::vector<std::byte> back(4096);
  REQUIRE(dev->read(8192, back));
  REQUIRE(back == a);
  REQUIRE(dev->flush());

  // Larger than one NBD request: split, all in flight, in order.
  auto big = pattern(40u << 20, 2);
  REQUIRE(dev->write(1u << 20, big));
  std::vector<std::byte> big_back(big.size());
  REQUIRE(dev->read(1u << 20, big_back));
  REQUIRE(big_back == big);
  REQUIRE(dev->flush());

  // Trim: advisory (D7); nbdkit memory trims to zeros. Over 4 GiB-1 would
  // need splitting: 1 GiB is the whole device here.
  REQUIRE(dev->can_trim());
  REQUIRE(dev->discard(8192, 4096));
  REQUIRE(dev->read(8192, back));
  REQUIRE(back == std::vector<std::byte>(4096));
  REQUIRE(dev->discard(0, dev->size_bytes()));

  auto mis = dev->write(100, std::span(a).first(512));
  REQUIRE(!mis);
  REQUIRE(mis.error().code == EINVAL);
  auto past = dev->read(dev->size_bytes() - 512, back);
  REQUIRE(!past);
  REQUIRE(past.error().code == EIO);
  REQUIRE(dev->read(0, std::span(back).first(0)));
}

TEST_CASE("nbd device: the data outlives the connection; read-only opens refuse writes", "[nbd]") {
  Dir d;
  NbdServer srv(d.path, {"memory", "64M"});
  auto a = pattern(65536, 3);
  {
    auto dev = must(open_device(srv.uri(), FileOpenOptions{.read_only = false}));
    REQUIRE(dev->write(1u << 20, a));
    REQUIRE(dev->flush());
  }
  auto ro = must(NbdDevice::open(srv.uri(), true));
  std::vector<std::byte> back(a.size());
  REQUIRE(ro->read(1u << 20, back));
  REQUIRE(back == a);
  auto w = ro->write(0, a);
  REQUIRE(!w);
  REQUIRE(w.error().code == EROFS);
  REQUIRE(ro->flush());  // nothing to make durable

  // A read-only export cannot be opened read-write.
  NbdServer rdonly(d.path, {"-r", "memory", "64M"}, "ro");
  auto rw = NbdDevice::open(rdonly.uri(), false);
  REQUIRE(!rw);
  REQUIRE(rw.error().code == EROFS);
  REQUIRE(NbdDevice::open(rdonly.uri(), true));
}

TEST_CASE("nbd device: several threads read and write at once", "[nbd]") {
  const uint64_t s = seed("nbd threads");
  Dir d;
  // With and without multi-conn: four connections, or one carrying every
  // thread's requests at once.
  const bool multi = GENERATE(true, false);
  std::vector<std::string> args = {"memory", "256M"};
  if (!multi) args = {"--filter=multi-conn", "memory", "256M", "multi-conn-mode=disable"};
  NbdServer srv(d.path, args);
  auto dev = must(NbdDevice::open(srv.uri(), false));
  INFO("multi-conn " << multi << ", connections " << dev->connections());
  REQUIRE((dev->connections() > 1) == multi);

  constexpr int kThreads = 8;
  constexpr uint64_t kRegion = 8u << 20;  // each thread's own
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; t++)
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(s + t);
      std::vector<uint64_t> gen(kRegion / 4096, 0);  // what each block holds
      for (int i = 0; i < 300; i++) {
        const uint64_t blk = rng() % gen.size();
        const uint64_t n = 1 + rng() % std::min<uint64_t>(16, gen.size() - blk);
        const uint64_t off = t * kRegion + blk * 4096;
        if (rng() % 2) {
          std::vector<std::byte> buf(n * 4096);
          for (uint64_t k = 0; k < n; k++) {
            gen[blk + k] = (uint64_t(t) << 40) | (uint64_t(i) << 8) | (k + 1);
            auto p = pattern(4096, gen[blk + k]);
            std::copy(p.begin(), p.end(), buf.begin() + k * 4096);
          }
          if (!dev->write(off, buf)) failures++;
        } else {
          std::vector<std::byte> buf(n * 4096);
          if (!dev->read(off, buf)) failures++;
          for (uint64_t k = 0; k < n; k++) {
            auto want = gen[blk + k] ? pattern(4096, gen[blk + k]) : std::vector<std::byte>(4096);
            if (!std::equal(want.begin(), want.end(), buf.begin() + k * 4096)) failures++;
          }
        }
        if (i % 50 == 0 && !dev->flush()) failures++;
      }
    });
  for (auto& t : ts) t.join();
  REQUIRE(failures == 0);
  REQUIRE(dev->flush());
}

TEST_CASE("nbd device: many requests in flight at once (queue depth >= 16)", "[nbd]") {
  Dir d;
  // Every read takes 200 ms at the server: 32 at once finish in about one
  // delay only if they are all in flight (one at a time: 6.4 s).
  const bool multi = GENERATE(true, false);
  std::vector<std::string> args = {"--filter=delay", "memory", "64M", "rdelay=200ms"};
  if (!multi) args = {"--filter=multi-conn", "--filter=delay", "memory", "64M", "rdelay=200ms",
                      "multi-conn-mode=disable"};
  NbdServer srv(d.path, args);
  auto dev = must(NbdDevice::open(srv.uri(), true));
  constexpr int kThreads = 32;
  std::atomic<int> failures{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; t++)
    ts.emplace_back([&, t] {
      std::vector<std::byte> buf(4096);
      if (!dev->read(uint64_t(t) * 4096, buf)) failures++;
    });
  for (auto& t : ts) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("multi-conn " << multi << ": 32 reads of 200 ms took " << secs << " s");
  REQUIRE(failures == 0);
  // nbdkit runs 16 requests of a connection at once (--threads): two
  // rounds on one connection; serial would be 6.4 s.
  REQUIRE(secs < 2.0);
}

TEST_CASE("nbd device: a batch of writes (a commit's runs) is in flight at once", "[nbd]") {
  Dir d;
  // Every write takes 200 ms at the server: 32 scattered writes of one
  // batch (BlockDevice::write_batch, what BlockCache::write_back hands a
  // commit's runs to) finish in about two delays only if they are in
  // flight together; one at a time they take 6.4 s.
  const bool multi = GENERATE(true, false);
  std::vector<std::string> args = {"--filter=delay", "memory", "64M", "wdelay=200ms"};
  if (!multi) args = {"--filter=multi-conn", "--filter=delay", "memory", "64M", "wdelay=200ms",
                      "multi-conn-mode=disable"};
  NbdServer srv(d.path, args);
  auto dev = must(NbdDevice::open(srv.uri(), false));
  std::vector<std::vector<std::byte>> bufs;
  std::vector<WriteReq> reqs;
  for (int i = 0; i < 32; i++) bufs.push_back(pattern(4096 * (1 + i % 3), uint64_t(i)));
  for (int i = 0; i < 32; i++) reqs.push_back({uint64_t(i) * (1 << 20), bufs[size_t(i)]});
  const auto t0 = std::chrono::steady_clock::now();
  must(dev->write_batch(reqs));
  // Write-back: the batch is on its way when write_batch returns; the
  // flush waits for every write of it (D3), then flushes.
  const double queued = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  must(dev->flush());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("multi-conn " << multi << ": a batch of 32 writes of 200 ms queued in " << queued << " s, flushed after "
                     << secs << " s");
  REQUIRE(queued < 0.2);
  REQUIRE(secs >= 0.2);  // the flush waited for the writes
  REQUIRE(secs < 2.0);
  for (int i = 0; i < 32; i++) {
    std::vector<std::byte> back(bufs[size_t(i)].size());
    must(dev->read(uint64_t(i) * (1 << 20), back));
    REQUIRE(back == bufs[size_t(i)]);
  }
}

TEST_CASE("nbd device: a server that takes one client gets one connection", "[nbd]") {
  Dir d;
  // nbdkit memory offers multi-conn, but the limit filter refuses every
  // connection after the first: the device keeps the one it has.
  NbdServer srv(d.path, {"--filter=limit", "memory", "64M", "limit=1"});
  auto dev = must(NbdDevice::open(srv.uri(), false));
  REQUIRE(dev->connections() == 1);
  auto a = pattern(8192, 5);
  REQUIRE(dev->write(0, a));
  REQUIRE(dev->flush());
  // A second writer is the server's to refuse.
  REQUIRE(!NbdDevice::open(srv.uri(), false));
  std::vector<std::byte> back(a.size());
  REQUIRE(dev->read(0, back));
  REQUIRE(back == a);
}

TEST_CASE("nbd device: bad URIs and missing servers are clear errors", "[nbd]") {
  Dir d;
  auto missing = open_device("nbd+unix:///?socket=" + d.path + "/none.sock");
  REQUIRE(!missing);
  INFO(missing.error().message());
  REQUIRE(missing.error().message().find("cannot connect to nbd+unix:///?socket=") != std::string::npos);
  REQUIRE(missing.error().code == ENOENT);

  for (const char* bad : {"nbd://", "nbd+unix:///", "nbd+unix:///?socket=", "nbd://[::1"}) {
    auto r = open_device(bad);
    INFO(bad);
    REQUIRE(!r);
    REQUIRE(r.error().message().find("cannot connect to") != std::string::npos);
  }
  REQUIRE(is_nbd_uri("nbd://host/x"));
  REQUIRE(is_nbd_uri("nbds://host/x"));
  REQUIRE(is_nbd_uri("nbd+unix:///?socket=/s"));
  REQUIRE(!is_nbd_uri("/tmp/nbd://x"));
  REQUIRE(!is_nbd_uri("image.img"));

  // A server that cannot flush cannot hold a filesystem that commits.
  NbdServer noflush(d.path, {"eval", "get_size=echo 1048576",
                             "pread=dd if=/dev/zero count=$3 iflag=count_bytes status=none",
                             "pwrite=cat >/dev/null", "can_write=exit 0"}, "noflush");
  auto nf = NbdDevice::open(noflush.uri(), false);
  REQUIRE(!nf);
  INFO(nf.error().message());
  REQUIRE(nf.error().message().find("cannot flush") != std::string::npos);
  REQUIRE(NbdDevice::open(noflush.uri(), true));
}

TEST_CASE("nbd device: a server that goes away gives EIO, not a crash", "[nbd]") {
  Dir d;
  NbdServer srv(d.path, {"memory", "256M"});
  auto dev = must(NbdDevice::open(srv.uri(), false));
  auto a = pattern(65536, 4);
  REQUIRE(dev->write(0, a));

  // Threads in the middle of their requests when it dies.
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0}, wrong_code{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 6; t++)
    ts.emplace_back([&, t] {
      std::vector<std::byte> buf(1u << 20);
      for (uint64_t i = 0; !stop; i++) {
        const uint64_t off = (uint64_t(t) * 32 + i % 32) << 20;
        auto r = (i % 2) ? dev->read(off, buf) : dev->write(off, buf);
        if (!r) {
          errors++;
          if (r.error().code != EIO) wrong_code++;
          break;
        }
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  srv.stop(SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  stop = true;
  for (auto& t : ts) t.join();
  REQUIRE(wrong_code == 0);
  std::vector<std::byte> back(4096);
  auto r = dev->read(0, back);
  REQUIRE(!r);
  INFO(r.error().message());
  REQUIRE(r.error().code == EIO);
  auto w = dev->write(0, back);
  REQUIRE(!w);
  REQUIRE(w.error().code == EIO);
  auto f = dev->flush();
  REQUIRE(!f);
  REQUIRE(f.error().code == EIO);
}

TEST_CASE("nbd device: the server's errors come back as they are", "[nbd]") {
  Dir d;
  NbdServer srv(d.path, {"--filter=error", "memory", "64M", "error=EIO", "error-pwrite-rate=100%"});
  auto dev = must(NbdDevice::open(srv.uri(), false));
  std::vector<std::byte> buf(4096);
  REQUIRE(dev->read(0, buf));  // reads are not filtered
  // Write-back: the write is accepted, the server's EIO comes back with the
  // flush, and every later write and flush fails too (D4: never a retry
  // that claims it durable).
  (void)dev->write(0, buf);
  auto f = dev->flush();
  REQUIRE(!f);
  REQUIRE(f.error().code == EIO);
  INFO(f.error().message());
  REQUIRE(f.error().message().find("byte 0") != std::string::npos);
  auto w = dev->write(8192, buf);
  REQUIRE(!w);
  REQUIRE(w.error().code == EIO);
  REQUIRE(!dev->flush());
  REQUIRE(dev->read(0, buf));  // reads go on
  REQUIRE(dev->read(4096, buf));
}

TEST_CASE("nbd device: write-back: a flush waits for the writes begun before it, not for later ones", "[nbd]") {
  Dir d;
  // Writes take 50 ms at the server; a writer issues one every millisecond
  // for 3 s, so that some are always in flight. A flush waits for those
  // begun before it (about 50 ms), not for a moment with none in flight,
  // which comes only when the writer stops.
  NbdServer srv(d.path, {"--filter=delay", "memory", "64M", "wdelay=50ms"});
  auto dev = must(NbdDevice::open(srv.uri(), false));
  std::atomic<bool> stop{false};
  std::atomic<int> failed{0};
  std::thread writer([&] {
    auto buf = pattern(4096, 9);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    for (uint64_t i = 0; !stop && std::chrono::steady_clock::now() < end; i++) {
      if (!dev->write((i % 8192) * 4096, buf)) failed++;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  auto f = dev->flush();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  writer.join();
  INFO("a flush among writes took " << secs << " s");
  REQUIRE(f);
  REQUIRE(failed == 0);
  REQUIRE(secs < 1.0);
  must(dev->flush());
}

TEST_CASE("nbd device: write-back: a read sees the write before it, overlapping writes land in order", "[nbd]") {
  Dir d;
  // Writes take 50 ms at the server, reads none: a read issued right after
  // a write of the same bytes returns the new bytes only because it waits
  // for the write (N4); two writes of the same bytes, in flight together,
  // could land in either order, so the second waits for the first.
  NbdServer srv(d.path, {"--filter=delay", "memory", "64M", "wdelay=50ms"});
  auto dev = must(NbdDevice::open(srv.uri(), false));
  for (int round = 0; round < 4; round++) {
    const uint64_t off = uint64_t(round) * 65536 + 4096;
    auto a = pattern(16384, uint64_t(round) * 2), b = pattern(8192, uint64_t(round) * 2 + 1);
    must(dev->write(off, a));
    std::vector<std::byte> back(16384);
    must(dev->read(off, back));
    REQUIRE(back == a);
    must(dev->write(off + 4096, b));  // inside the first one's bytes
    must(dev->read(off, back));
    std::vector<std::byte> want = a;
    std::copy(b.begin(), b.end(), want.begin() + 4096);
    REQUIRE(back == want);
  }
  must(dev->flush());
  // And reopened: the server has the last write of each.
  dev.reset();
  auto again = must(NbdDevice::open(srv.uri(), true));
  for (int round = 0; round < 4; round++) {
    const uint64_t off = uint64_t(round) * 65536 + 4096;
    auto a = pattern(16384, uint64_t(round) * 2), b = pattern(8192, uint64_t(round) * 2 + 1);
    std::copy(b.begin(), b.end(), a.begin() + 4096);
    std::vector<std::byte> back(16384);
    must(again->read(off, back));
    REQUIRE(back == a);
  }
}

// ---------------------------------------------------------------------------
// The crash harness over NBD. A workload of commits runs on an NbdDevice to
// nbdkit's memory plugin behind its log filter, which writes every request
// as the server receives and completes it. From the server's own order of
// events, with the data the engine wrote, every crash state the device
// contract allows (docs/format.md#device-contract: a write is durable once
// a flush that began after it completed has completed; any other write may
// be there, missing, or torn at sector granularity) is rebuilt at many
// points of the log and opened: each must recover to a committed generation
// with that generation's exact content, never older than the newest one
// whose commit had returned. And the transport itself: every write the
// engine made before a flush completed at the server before that flush
// began there (the NBD flush covers only completed writes).

namespace {

// What the engine asked of the device: each write with its data and the
// number of flushes it asked for before it.
class Witness final : public BlockDevice {
 public:
  explicit Witness(BlockDevice& d) : d_(d) {}
  struct W {
    uint64_t epoch, offset;
    std::vector<std::byte> data;
  };
  Result<void> read(uint64_t o, std::span<std::byte> out) override { return d_.read(o, out); }
  Result<void> write(uint64_t o, std::span<const std::byte> in) override {
    note(o, in);
    return d_.write(o, in);
  }
  Result<void> write_batch(std::span<const WriteReq> reqs) override {
    for (const auto& r : reqs) note(r.offset, r.data);
    return d_.write_batch(reqs);
  }
  Result<void> flush() override {
    auto r = d_.flush();
    std::lock_guard lk(mu_);
    flushes_++;
    return r;
  }
  Result<void> discard(uint64_t o, uint64_t n) override { return d_.discard(o, n); }
  uint64_t size_bytes() const override { return d_.size_bytes(); }
  uint32_t logical_sector_size() const override { return d_.logical_sector_size(); }
  uint32_t physical_sector_size() const override { return d_.physical_sector_size(); }
  uint64_t flushes() const {
    std::lock_guard lk(mu_);
    return flushes_;
  }
  std::vector<W> writes() const {
    std::lock_guard lk(mu_);
    return writes_;
  }

 private:
  void note(uint64_t o, std::span<const std::byte> in) {
    std::lock_guard lk(mu_);
    writes_.push_back(W{flushes_, o, std::vector<std::byte>(in.begin(), in.end())});
  }
  BlockDevice& d_;
  mutable std::mutex mu_;
  uint64_t flushes_ = 0;
  std::vector<W> writes_;
};

// One request of nbdkit's log filter: its start or its return.
struct Ev {
  char kind;  // 'W' write, 'F' flush, 'T' trim, 'Z' zero
  bool ret;
  uint64_t conn, id, offset = 0, count = 0;
};

std::vector<Ev> parse_log(const std::string& text) {
  std::vector<Ev> out;
  std::istringstream in(text);
  std::string line;
  auto field = [](const std::string& l, const std::string& key) -> uint64_t {
    const size_t at = l.find(" " + key + "=");
    if (at == std::string::npos) return 0;
    return std::stoull(l.substr(at + key.size() + 2), nullptr, 0);
  };
  while (std::getline(in, line)) {
    const size_t c = line.find("connection=");
    if (c == std::string::npos) continue;
    // "connection=N Write id=..." begins a request, "connection=N ...Write
    // id=... return=0" ends it.
    const size_t sp = line.find(' ', c);
    if (sp == std::string::npos) continue;
    const bool ret = line.compare(sp + 1, 3, "...") == 0;
    const std::string rest = line.substr(sp + 1 + (ret ? 3 : 0));
    char kind = 0;
    if (rest.rfind("Write ", 0) == 0) kind = 'W';
    else if (rest.rfind("Flush ", 0) == 0) kind = 'F';
    else if (rest.rfind("Trim ", 0) == 0) kind = 'T';
    else if (rest.rfind("Zero ", 0) == 0) kind = 'Z';
    if (!kind) continue;
    if (ret && line.find("return=0") == std::string::npos) FAIL("a request failed at the server: " << line);
    Ev e{kind, ret, field(line, "connection"), field(line, "id")};
    if (!ret) e.offset = field(line, "offset"), e.count = field(line, "count");
    out.push_back(e);
  }
  return out;
}

}  // namespace

TEST_CASE("nbd device: crash states from the server's own log recover; flushes cover completed writes", "[nbd]") {
  const uint64_t s0 = seed("nbd-crash");
  Dir d;
  const std::string log = d.path + "/requests.log";
  NbdServer srv(d.path, {"--filter=log", "memory", "4M", "logfile=" + log});
  auto nbd = must(NbdDevice::open(srv.uri(), false));
  must(Volume::format(*nbd, FormatOptions{}));
  REQUIRE(nbd->flush());
  // The image as formatted: the base every crash state starts from.
  auto base = std::make_unique<MemDevice>(nbd->size_bytes());
  {
    std::vector<std::byte> all(nbd->size_bytes());
    REQUIRE(nbd->read(0, all));
    REQUIRE(base->write(0, all));
  }
  const size_t skip = parse_log(slurp(log)).size();  // the format's requests

  Witness wit(*nbd);
  std::map<uint64_t, Model> model_at;   // generation -> the tree's content
  std::map<uint64_t, uint64_t> acked;   // generation -> flushes asked when its commit returned
  TreeId t;
  {
    auto vol = must(Volume::open(wit));
    model_at[vol->durable_generation().v] = {};
    acked[vol->durable_generation().v] = 0;
    {
      auto txn = must(vol->begin());
      t = must(txn.create_tree(kKindPlain));
    }
    std::mt19937_64 rng(s0);
    Model m;
    for (int round = 0; round < 20; round++) {
      {
        auto txn = must(vol->begin());
        for (int i = 0; i < 300; i++) {
          const Key k{rng() % 4000, 0};
          if (rng() % 4 == 0 && m.count(k)) {
            (void)must(txn.erase(t, k));
            m.erase(k);
          } else {
            std::vector<std::byte> v(8 + rng() % 200);
            for (auto& b : v) b = std::byte(rng());
            must(txn.put(t, k, v));
            m[k] = v;
          }
        }
      }
      const Generation g = must(vol->commit());
      model_at[g.v] = m;
      acked[g.v] = wit.flushes();
    }
    must(vol->close());
  }
  nbd.reset();
  srv.stop(SIGTERM);  // the log is whole once the server is gone
  const auto events = parse_log(slurp(log));
  INFO(events.size() << " events, " << skip << " of the format, " << wit.writes().size() << " writes");
  REQUIRE(events.size() >= skip + 20 * 8);  // each commit: nodes, flush, superblock, flush
  const auto writes = wit.writes();

  // The data of a write the server began in flush epoch `epoch`: the
  // engine's writes of that epoch that it covers, the later one where two
  // overlap. One request may carry several of them (N6: writes of bytes in
  // a row go out as one).
  auto data_of = [&](const Ev& e, uint64_t epoch) -> std::vector<std::byte> {
    std::vector<std::byte> out(e.count);
    std::vector<bool> have(e.count / 512);
    size_t missing = have.size();
    for (auto it = writes.rbegin(); it != writes.rend() && missing; ++it) {
      if (it->epoch != epoch) continue;
      const uint64_t lo = std::max(e.offset, it->offset);
      const uint64_t hi = std::min(e.offset + e.count, it->offset + it->data.size());
      for (uint64_t off = lo; off < hi; off += 512) {
        const size_t sec = (off - e.offset) / 512;
        if (have[sec]) continue;
        std::memcpy(out.data() + (off - e.offset), it->data.data() + (off - it->offset), 512);
        have[sec] = true;
        missing--;
      }
    }
    if (missing)
      FAIL("the server wrote " << e.count << " bytes at " << e.offset << " in flush epoch " << epoch
                               << ", bytes of which the engine never asked for");
    return out;
  };

  // Replay the server's order. `durable`: the base with every write a
  // completed flush covers. `open`: writes begun, not yet covered.
  struct Open {
    uint64_t offset;
    std::vector<std::byte> data;
    bool returned;
  };
  auto durable = base->clone();
  std::map<std::pair<uint64_t, uint64_t>, Open> open;  // (conn, id) -> write
  std::map<std::pair<uint64_t, uint64_t>, std::vector<Open>> covering;  // a flush's writes
  uint64_t epoch = 0, flushes_done = 0, states = 0, newest_seen = 0;
  std::map<uint64_t, uint64_t> opened_at;  // generation -> states that opened there
  std::mt19937_64 rng(s0 ^ 0x5eed);
  for (size_t i = skip; i < events.size(); i++) {
    const Ev& e = events[i];
    const auto key = std::make_pair(e.conn, e.id);
    if (e.kind == 'W' && !e.ret) {
      open[key] = Open{e.offset, data_of(e, epoch), false};
    } else if (e.kind == 'W') {
      open.at(key).returned = true;
    } else if (e.kind == 'F' && !e.ret) {
      // Every byte the engine wrote before asking for this flush must have
      // completed at the server by now.
      epoch++;
      for (const auto& w : writes) {
        if (w.epoch != epoch - 1) continue;
        for (uint64_t off = w.offset; off < w.offset + w.data.size(); off += 512) {
          bool done = false;
          for (const auto& [k, o] : open)
            done = done || (o.returned && o.offset <= off && off < o.offset + o.data.size());
          INFO("flush " << epoch << " began at the server before the write at " << off << " completed");
          REQUIRE(done);
        }
      }
      std::vector<Open> c;
      for (auto it = open.begin(); it != open.end();)
        if (it->second.returned) {
          c.push_back(it->second);
          it = open.erase(it);
        } else {
          ++it;
        }
      covering[key] = std::move(c);
    } else if (e.kind == 'F') {
      for (const auto& o : covering.at(key)) REQUIRE(durable->write(o.offset, o.data));
      covering.erase(key);
      flushes_done++;
    }
    // A power cut right after event i: each write not yet durable is there,
    // missing, or torn (each 512-byte sector on its own).
    for (int variant = 0; variant < 6; variant++) {
      auto img = durable->clone();
      std::vector<const Open*> maybe;
      for (const auto& [k, o] : open) maybe.push_back(&o);
      for (const auto& [k, c] : covering)
        for (const auto& o : c) maybe.push_back(&o);
      for (const Open* o : maybe) {
        const int pick = int(rng() % 3);
        if (pick == 0) continue;
        for (uint64_t off = 0; off < o->data.size(); off += 512)
          if (pick == 1 || rng() % 2) REQUIRE(img->write(o->offset + off, std::span(o->data).subspan(off, 512)));
      }
      // The newest generation whose commit had returned before this point:
      // its last flush completed at the server.
      uint64_t must_have = 0;
      for (const auto& [g, f] : acked)
        if (f <= flushes_done) must_have = std::max(must_have, g);
      INFO("power cut after server event " << i << " (variant " << variant << "), " << flushes_done
                                           << " flushes done");
      VolumeOptions ro;
      ro.read_only = true;
      auto vol = must(Volume::open(*img, ro));
      const uint64_t g = vol->durable_generation().v;
      REQUIRE(g >= must_have);
      REQUIRE(model_at.count(g));
      Model got;
      auto txn = must(vol->begin());
      auto exists = txn.scan(t, Key::min(), Key::max(), [&](Key k, std::span<const std::byte> v) {
        got.emplace(k, std::vector<std::byte>(v.begin(), v.end()));
        return true;
      });
      if (!exists) REQUIRE(model_at.at(g).empty());
      REQUIRE(got == model_at.at(g));
      opened_at[g]++;
      newest_seen = std::max(newest_seen, g);
      states++;
    }
  }
  std::printf("[nbd-crash] %llu crash states from %zu server events, at %zu generations\n",
              (unsigned long long)states, events.size() - skip, opened_at.size());
  REQUIRE(newest_seen == model_at.rbegin()->first);
  REQUIRE(opened_at.size() >= 10);
}

TEST_CASE("nbd device: write-back: writes of bytes in a row go out as one request (N6)", "[nbd]") {
  Dir d;
  const std::string log = d.path + "/requests.log";
  NbdServer srv(d.path, {"--filter=log", "memory", "64M", "logfile=" + log});
  auto dev = must(NbdDevice::open(srv.uri(), false));
  const size_t before = parse_log(slurp(log)).size();
  std::vector<std::byte> model(16 << 20);
  auto put = [&](uint64_t off, const std::vector<std::byte>& v) {
    must(dev->write(off, v));
    std::copy(v.begin(), v.end(), model.begin() + off);
  };
  // 512 writes of 4 KiB in a row (2 MiB): two runs of 1 MiB.
  for (uint64_t i = 0; i < 512; i++) put(i * 4096, pattern(4096, i));
  // 64 writes 64 KiB apart: no two in a row, one request each.
  for (uint64_t i = 0; i < 64; i++) put((4 << 20) + i * 65536, pattern(4096, 1000 + i));
  // A run that a read needs goes out for it, and a write into a staged run
  // (not after it) sends the run first: the later bytes win.
  put(8 << 20, pattern(8192, 7));
  std::vector<std::byte> back(8192);
  must(dev->read(8 << 20, back));
  REQUIRE(std::equal(back.begin(), back.end(), model.begin() + (8 << 20)));
  put(9 << 20, pattern(16384, 8));
  put((9 << 20) + 4096, pattern(4096, 9));
  must(dev->flush());
  // Left staged, never flushed: the close sends it.
  put(10 << 20, pattern(4096, 10));
  put((10 << 20) + 4096, pattern(4096, 11));
  dev.reset();
  auto again = must(NbdDevice::open(srv.uri(), true));
  std::vector<std::byte> all(model.size());
  must(again->read(0, all));
  REQUIRE(all == model);
  again.reset();
  srv.stop(SIGTERM);
  size_t writes = 0;
  const auto ev = parse_log(slurp(log));
  for (size_t i = before; i < ev.size(); i++) writes += ev[i].kind == 'W' && !ev[i].ret;
  INFO(writes << " write requests at the server");
  // 2 + 64 + 1 (the read's) + 2 (the overlap) + 1 (the close); one at a
  // time it would be 512 + 64 + 1 + 2 + 2 = 581.
  REQUIRE(writes == 70);
}
