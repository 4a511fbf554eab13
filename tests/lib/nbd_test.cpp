// lib/blockdev/nbd_device: an image on an NBD server, against real nbdkit
// servers on Unix sockets (tests/nbd_server.h). Exits 77 (skipped) without
// nbdkit.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
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
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("multi-conn " << multi << ": a batch of 32 writes of 200 ms took " << secs << " s");
  REQUIRE(secs < 2.0);
  must(dev->flush());
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
  auto w = dev->write(0, buf);
  REQUIRE(!w);
  REQUIRE(w.error().code == EIO);
  REQUIRE(dev->read(4096, buf));  // the connection stays usable
}
