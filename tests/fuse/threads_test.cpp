// Concurrency through the mount, and a sparse file larger than the image.
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "fuse_util.h"

using namespace plyfs::fusetest;

TEST_CASE("8 threads write and read back their own files", "[threads]") {
  const uint64_t s = seed("threads");
  Fixture fx("1G");
  constexpr int kThreads = 8;
  const int files_per_thread = int(3 * scale());
  std::vector<std::map<std::string, std::string>> written(kThreads);
  std::mutex err_mu;
  std::vector<std::string> errors;
  auto error = [&](const std::string& e) {
    std::lock_guard lk(err_mu);
    errors.push_back(e);
  };
  // Catch2's assertions are not thread-safe: the workers report errors as
  // strings and the main thread checks them.
  auto worker = [&](int t) {
    std::mt19937_64 rng(s + uint64_t(t) * 7919);
    const std::string dir = fx / ("t" + std::to_string(t));
    if (::mkdir(dir.c_str(), 0755) != 0) return error("mkdir " + dir + ": " + std::strerror(errno));
    for (int i = 0; i < files_per_thread; i++) {
      const std::string p = dir + "/f" + std::to_string(i);
      const size_t size = rng() % 4 == 0 ? rng() % 3000 : rng() % (3 << 20);
      const std::string data = random_bytes(rng, size);
      int fd = ::open(p.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) return error("open " + p + ": " + std::strerror(errno));
      // Random-sized chunks, in a shuffled order.
      std::vector<std::pair<size_t, size_t>> chunks;
      for (size_t off = 0; off < size;) {
        size_t n = std::min<size_t>(size - off, 1 + rng() % (300 << 10));
        chunks.push_back({off, n});
        off += n;
      }
      std::shuffle(chunks.begin(), chunks.end(), rng);
      for (auto [off, n] : chunks) {
        ssize_t w = ::pwrite(fd, data.data() + off, n, off_t(off));
        if (w != ssize_t(n)) {
          ::close(fd);
          return error("pwrite " + p + ": " + std::strerror(errno));
        }
      }
      if (rng() % 2 && ::fsync(fd) != 0) error("fsync " + p + ": " + std::strerror(errno));
      std::string back(size, '\0');
      size_t got = 0;
      while (got < size) {
        ssize_t r = ::pread(fd, back.data() + got, size - got, off_t(got));
        if (r <= 0) break;
        got += size_t(r);
      }
      ::close(fd);
      if (got != size || back != data) error(p + ": read back differs");
      written[size_t(t)][p.substr(fx.root().size() + 1)] = data;
      // Some churn: rewrite the start of an earlier file.
      if (i > 0 && rng() % 2) {
        auto it = written[size_t(t)].begin();
        std::string& d = it->second;
        if (d.size() > 100) {
          std::string patch = random_bytes(rng, 1 + rng() % 50000);
          patch.resize(std::min(patch.size(), d.size()));
          int fd2 = ::open((fx / it->first).c_str(), O_WRONLY);
          if (fd2 < 0) return error("open " + it->first + ": " + std::strerror(errno));
          if (::pwrite(fd2, patch.data(), patch.size(), 0) != ssize_t(patch.size()))
            error("pwrite " + it->first + ": " + std::strerror(errno));
          ::close(fd2);
          d.replace(0, patch.size(), patch);
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) threads.emplace_back(worker, t);
  // Meanwhile the main thread reads directories and stats.
  for (int i = 0; i < 50; i++) {
    struct statvfs v;
    REQUIRE(::statvfs(fx.root().c_str(), &v) == 0);
    (void)list_dir(fx.root());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& th : threads) th.join();
  {
    std::string all;
    for (auto& e : errors) all += e + "\n";
    INFO(all);
    REQUIRE(errors.empty());
  }
  auto check = [&] {
    for (const auto& files : written)
      for (const auto& [p, data] : files) {
        INFO(p);
        REQUIRE(lstat_of(fx / p).st_size == off_t(data.size()));
        REQUIRE_SAME(read_file(fx / p), data);
      }
  };
  check();
  fx.remount();
  // Read back concurrently too.
  std::atomic<int> bad{0};
  threads.clear();
  for (int t = 0; t < kThreads; t++)
    threads.emplace_back([&, t] {
      for (const auto& [p, data] : written[size_t(t)]) {
        int fd = ::open((fx / p).c_str(), O_RDONLY);
        if (fd < 0) {
          bad++;
          continue;
        }
        std::string back(data.size() + 1, '\0');
        size_t got = 0;
        for (;;) {
          ssize_t r = ::read(fd, back.data() + got, back.size() - got);
          if (r <= 0) break;
          got += size_t(r);
        }
        ::close(fd);
        back.resize(got);
        if (back != data) bad++;
      }
    });
  for (auto& th : threads) th.join();
  REQUIRE(bad == 0);
  check();
  fx.unmount();
}

TEST_CASE("a sparse file larger than 4 GiB on a 256 MiB image", "[threads]") {
  Fixture fx("256M");
  const std::string f = fx / "sparse";
  const off_t kOffs[] = {0, off_t(2) << 30, (off_t(4) << 30) + (1 << 20)};
  std::vector<std::string> blocks;
  for (int i = 0; i < 3; i++) blocks.push_back(std::string(3 * 4096, char('A' + i)));
  int fd = ::open(f.c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  for (int i = 0; i < 3; i++) pwrite_all(fd, blocks[size_t(i)].data(), blocks[size_t(i)].size(), kOffs[i]);
  // And a few bytes at an unaligned offset past the last block.
  const off_t tail_off = kOffs[2] + off_t(blocks[2].size()) + 1000;
  pwrite_all(fd, "tail", 4, tail_off);
  ::close(fd);
  const off_t size = tail_off + 4;
  auto check = [&] {
    struct stat st = lstat_of(f);
    REQUIRE(st.st_size == size);
    REQUIRE(st.st_size > (off_t(4) << 30));
    INFO("st_blocks " << st.st_blocks);
    REQUIRE(st.st_blocks <= 8 * 16);  // a handful of 4 KiB blocks, in 512-byte units
    REQUIRE(st.st_blocks >= 8 * 9);
    int fd = ::open(f.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    for (int i = 0; i < 3; i++) REQUIRE_SAME(pread_n(fd, blocks[size_t(i)].size(), kOffs[i]), blocks[size_t(i)]);
    REQUIRE_SAME(pread_n(fd, 1004, tail_off - 1000), std::string(1000, '\0') + "tail");
    // Holes read as zeros, here and there.
    for (off_t o : {off_t(12288), off_t(1) << 30, (off_t(2) << 30) - 8192, (off_t(2) << 30) + 12288,
                    off_t(3) << 30, (off_t(4) << 30) - 1, off_t(4) << 30})
      REQUIRE_SAME(pread_n(fd, 8192, o), std::string(8192, '\0'));
    REQUIRE_SAME(pread_n(fd, 100, size), "");
    REQUIRE(::lseek(fd, 12288, SEEK_DATA) == kOffs[1]);
    REQUIRE(::lseek(fd, kOffs[1], SEEK_HOLE) == kOffs[1] + 12288);
    REQUIRE(::lseek(fd, kOffs[1] + 12288, SEEK_DATA) == kOffs[2]);
    ::close(fd);
  };
  check();
  struct statvfs v;
  REQUIRE(::statvfs(fx.root().c_str(), &v) == 0);
  REQUIRE(v.f_blocks * v.f_frsize < uint64_t(size));
  fx.remount();
  check();
  // Truncating to 3 GiB drops the last blocks; growing back reads zeros.
  REQUIRE(::truncate(f.c_str(), off_t(3) << 30) == 0);
  REQUIRE(::truncate(f.c_str(), size) == 0);
  fx.remount();
  fd = ::open(f.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE_SAME(pread_n(fd, blocks[1].size(), kOffs[1]), blocks[1]);
  REQUIRE_SAME(pread_n(fd, blocks[2].size(), kOffs[2]), std::string(blocks[2].size(), '\0'));
  REQUIRE_SAME(pread_n(fd, 4, tail_off), std::string(4, '\0'));
  ::close(fd);
  REQUIRE(lstat_of(f).st_blocks <= 8 * 8);
  fx.unmount();
}
