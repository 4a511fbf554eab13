// Persistence across SIGKILL of the daemon, and a second mount of a mounted
// image.
#include <atomic>
#include <map>
#include <thread>

#include <algorithm>

#include "fuse_util.h"

using namespace plyfs::fusetest;

TEST_CASE("SIGKILL of the daemon keeps everything fsync'd", "[kill]") {
  const uint64_t s = seed("kill");
  std::mt19937_64 rng(s);
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "512M", tmp / "mkfs.log");
  // commit=0: generations commit only on fsync (and unmount), so what was
  // not synced is known to be lost.
  const std::vector<std::string> opts = {"commit=0"};
  std::map<std::string, std::string> durable;  // path -> content, after the kill
  std::vector<std::string> gone;                // must not exist after the kill

  // What the earlier rounds made durable is there; what they removed is not.
  auto check_durable = [&](const Mount& m) {
    for (const auto& [p, data] : durable) {
      INFO(p);
      REQUIRE_SAME(read_file(m / p), data);
    }
    for (const auto& p : gone) {
      struct stat st;
      INFO(p << " should not exist");
      REQUIRE_ERRNO(::lstat((m / p).c_str(), &st), ENOENT);
    }
  };
  for (int round = 0; round < 4; round++) {
    INFO("round " << round);
    Mount m(img, tmp / "mnt", opts);
    m.start();
    check_durable(m);
    gone.clear();
    const std::string dir = "r" + std::to_string(round);
    REQUIRE(::mkdir((m / dir).c_str(), 0755) == 0);
    std::map<std::string, std::string> closed;  // written and closed, not yet synced
    for (int i = 0; i < 30; i++) {
      const std::string p = dir + "/f" + std::to_string(i);
      size_t size = rng() % 4 == 0 ? rng() % 2000 : rng() % (1 << 20);
      std::string data = random_bytes(rng, size);
      write_file(m / p, data);
      closed[p] = data;
      if (rng() % 5 == 0) {
        // Overwrite part of an earlier durable file.
        if (!durable.empty()) {
          auto it = durable.begin();
          std::advance(it, long(rng() % durable.size()));
          if (it->second.size() > 10) {
            std::string patch = random_bytes(rng, 1 + rng() % 10000);
            size_t off = rng() % it->second.size();
            int fd = ::open((m / it->first).c_str(), O_WRONLY);
            REQUIRE(fd >= 0);
            pwrite_all(fd, patch.data(), patch.size(), off_t(off));
            REQUIRE(::close(fd) == 0);
            // The newest content: a patch closed since the last sync counts.
            std::string d = closed.count(it->first) ? closed[it->first] : it->second;
            if (off + patch.size() > d.size()) d.resize(off + patch.size());
            d.replace(off, patch.size(), patch);
            closed[it->first] = d;
          }
        }
      }
      if (rng() % 4 == 0) {
        // fsync one file: the whole generation commits, with every file
        // closed before (close flushes the kernel's cached writes).
        int fd = ::open((m / p).c_str(), O_RDONLY);
        REQUIRE(fd >= 0);
        REQUIRE(::fsync(fd) == 0);
        ::close(fd);
        for (auto& [q, d] : closed) durable[q] = d;
        closed.clear();
      }
    }
    // A rename and an unlink, then a sync of the directory.
    if (durable.size() > 2) {
      auto victim = durable.begin()->first;
      REQUIRE(::unlink((m / victim).c_str()) == 0);
      durable.erase(victim);
      gone.push_back(victim);
      auto mover = durable.begin()->first;
      const std::string moved = dir + "/moved-" + std::to_string(round);
      REQUIRE(::rename((m / mover).c_str(), (m / moved).c_str()) == 0);
      // A patch closed since the last sync goes along (the sync below commits it).
      durable[moved] = closed.count(mover) ? closed[mover] : durable[mover];
      durable.erase(mover);
      gone.push_back(mover);
      closed.erase(victim);
      closed.erase(mover);
      int dfd = ::open((m / dir).c_str(), O_RDONLY | O_DIRECTORY);
      REQUIRE(dfd >= 0);
      REQUIRE(::fsync(dfd) == 0);
      ::close(dfd);
      for (auto& [q, d] : closed) durable[q] = d;
      closed.clear();
    }
    // Not synced: with commit=0 these are lost.
    const std::string lost = dir + "/unsynced";
    write_file(m / lost, "not synced");
    gone.push_back(lost);
    // A writer busy at the moment of the kill.
    std::atomic<bool> stop{false};
    std::thread writer([&] {
      int fd = ::open((m / (dir + "/busy")).c_str(), O_WRONLY | O_CREAT, 0644);
      if (fd < 0) return;
      std::string chunk(1 << 16, 'b');
      for (off_t off = 0; !stop && off < (64 << 20); off += off_t(chunk.size()))
        if (::pwrite(fd, chunk.data(), chunk.size(), off) < 0) break;
      ::close(fd);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 100));
    m.kill9();
    stop = true;
    writer.join();
    gone.push_back(dir + "/busy");
    // The image is consistent as the last fsync left it.
    require_fsck_clean(img, tmp / "fsck.log");
  }
  Mount m(img, tmp / "mnt", opts);
  m.start();
  check_durable(m);
  int rc = m.unmount();
  INFO(m.log());
  REQUIRE(rc == 0);
  require_fsck_clean(img, tmp / "fsck.log");
}

TEST_CASE("a second mount of a mounted image fails", "[kill]") {
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "64M", tmp / "mkfs.log");
  Mount m(img, tmp / "mnt");
  m.start();
  write_file(m / "f", "first mount");
  ::mkdir((tmp / "mnt2").c_str(), 0755);
  const dev_t before = dev_of(tmp / "mnt2");
  const std::string log = tmp / "second.log";
  int rc = run({plyfs_bin(), img, tmp / "mnt2", "-f"}, log, 60);
  const std::string out = slurp(log);
  INFO("second plyfs exit status " << rc << ", output:\n" << out);
  REQUIRE(rc != 0);
  REQUIRE(rc < 128);  // an exit, not a crash
  REQUIRE(out.find("already mounted") != std::string::npos);
  REQUIRE(dev_of(tmp / "mnt2") == before);  // nothing mounted there
  // Also without -f (the daemonizing parent reports the failure).
  rc = run({plyfs_bin(), img, tmp / "mnt2"}, log, 60);
  INFO("without -f: " << rc << "\n" << slurp(log));
  REQUIRE(rc != 0);
  REQUIRE(rc < 128);
  REQUIRE(dev_of(tmp / "mnt2") == before);
  // The first mount is unharmed.
  REQUIRE_SAME(read_file(m / "f"), "first mount");
  rc = m.unmount();
  REQUIRE(rc == 0);
  require_fsck_clean(img, tmp / "fsck.log");
  // And the image mounts again now.
  Mount m2(img, tmp / "mnt2");
  m2.start();
  REQUIRE_SAME(read_file(m2 / "f"), "first mount");
  REQUIRE(m2.unmount() == 0);
}

// The worker options (-o spin, max_threads, max_idle_threads): bad values
// give one line and exit 1 without mounting; the extremes serve a mount
// (one thread, no spinning; a long spin) and lose nothing.
TEST_CASE("worker thread options: bad values refused, extremes work", "[kill]") {
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "64M", tmp / "mkfs.log");
  ::mkdir((tmp / "mnt").c_str(), 0755);
  const dev_t before = dev_of(tmp / "mnt");
  for (const char* bad : {"spin=100001", "max_threads=0", "max_threads=5000"}) {
    const std::string log = tmp / "bad.log";
    ::unlink(log.c_str());
    const int rc = run({plyfs_bin(), img, tmp / "mnt", "-f", "-o", bad}, log, 60);
    const std::string out = slurp(log);
    INFO(bad << ": exit " << rc << ", output:\n" << out);
    CHECK(rc == 1);
    CHECK(std::count(out.begin(), out.end(), '\n') == 1);
    CHECK(out.find("plyfs: bad") == 0);
    CHECK(dev_of(tmp / "mnt") == before);
  }
  int n = 0;
  for (const char* o : {"spin=0,max_threads=1,max_idle_threads=1", "spin=5000,max_idle_threads=2"}) {
    Mount m(img, tmp / "mnt", {o});
    m.start();
    for (int i = 0; i < 200; i++) write_file(m / ("f" + std::to_string(n * 1000 + i)), "data " + std::to_string(i));
    for (int i = 0; i < 200; i += 2) REQUIRE(::unlink((m / ("f" + std::to_string(n * 1000 + i))).c_str()) == 0);
    REQUIRE(m.unmount() == 0);
    n++;
  }
  require_fsck_clean(img, tmp / "fsck.log");
  Mount m(img, tmp / "mnt");
  m.start();
  for (int k = 0; k < 2; k++)
    for (int i = 1; i < 200; i += 2) REQUIRE_SAME(read_file(m / ("f" + std::to_string(k * 1000 + i))), "data " + std::to_string(i));
  REQUIRE(m.unmount() == 0);
}

// SIGTERM and SIGINT unmount and commit: everything written is there at the
// next mount, though nothing called fsync and periodic commits are off.
TEST_CASE("SIGTERM and SIGINT commit and unmount cleanly", "[kill]") {
  for (int sig : {SIGTERM, SIGINT}) {
    INFO("signal " << sig);
    TempDir tmp;
    const std::string img = tmp / "image";
    mkfs(img, "64M", tmp / "mkfs.log");
    {
      Mount m(img, tmp / "mnt", {"commit=0"});
      m.start();
      write_file(m / "f", std::string(100000, 'x'));
      REQUIRE(::mkdir((m / "d").c_str(), 0755) == 0);
      REQUIRE(kill(m.pid(), sig) == 0);
      REQUIRE(m.wait_exit() == 0);  // it unmounts, commits and exits by itself
      REQUIRE(dev_of(m.path()) == dev_of(tmp.path()));
    }
    require_fsck_clean(img, tmp / "fsck.log");
    Mount m2(img, tmp / "mnt");
    m2.start();
    REQUIRE(read_file(m2 / "f") == std::string(100000, 'x'));
    REQUIRE(S_ISDIR(lstat_of(m2 / "d").st_mode));
    REQUIRE(m2.unmount() == 0);
  }
}

// -o ro: reads work, every change is EROFS, and the image is not written.
TEST_CASE("a read-only mount changes nothing", "[kill]") {
  TempDir tmp;
  const std::string img = tmp / "image";
  mkfs(img, "64M", tmp / "mkfs.log");
  {
    Mount m(img, tmp / "mnt");
    m.start();
    write_file(m / "f", "content");
    REQUIRE(m.unmount() == 0);
  }
  const std::string before = slurp(img);
  Mount m(img, tmp / "mnt", {"ro"});
  m.start();
  REQUIRE(read_file(m / "f") == "content");
  errno = 0;
  CHECK(::open((m / "g").c_str(), O_CREAT | O_WRONLY, 0644) < 0);
  CHECK(errno == EROFS);
  CHECK(::mkdir((m / "d").c_str(), 0755) != 0);
  CHECK(errno == EROFS);
  CHECK(::unlink((m / "f").c_str()) != 0);
  CHECK(errno == EROFS);
  REQUIRE(m.unmount() == 0);
  REQUIRE(slurp(img) == before);
}
