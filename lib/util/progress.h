// One progress style for every long task of every tool (fsck, merge,
// delete, diff, mkfs of a large image, import, scrub...), on one line that
// rewrites itself on a terminal:
//
//   merging work: 12,345 / 40,000 entries (30%), 2,100/s, ETA 0:00:13
//   writing: 1.20 GiB / 4.00 GiB (30%), 310 MiB/s, ETA 0:00:09
//   deleting old: 52,000 nodes (30%), 9,100/s, ETA 0:00:13
//
// A task that cannot count its total beforehand says what share of it is
// done instead (the second update()), and the percentage and ETA follow
// from that.
// Without a known total it shows what was done and the rate. Nothing is
// printed unless the stream is a terminal (or `force`), so that scripts and
// logs see only the result; --json output never carries it. Updates are
// cheap (a clock read) and drawn at most 5 times a second.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace plyfs {

class Progress {
 public:
  enum class Unit { Count, Bytes };
  // `noun`: what a Count counts ("entries", "nodes"); ignored for Bytes.
  Progress(std::string what, uint64_t total, Unit unit = Unit::Count,
           std::string noun = "", FILE* out = stderr, bool force = false);
  ~Progress();  // erases an unfinished line
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set_total(uint64_t total) { total_ = total; }
  void update(uint64_t done);
  // Without a total: `fraction` (0 to 1) of the work is done, as far as the
  // task can tell (the share of a tree walked), for the percentage and ETA.
  void update(uint64_t done, double fraction);
  void add(uint64_t n) { update(done_ + n); }
  // Prints the final line ("what: 40,000 entries in 0:00:19") and a newline.
  void finish();
  bool shown() const { return on_; }

  // The pieces, for other renderings (fsck -C, tests).
  static std::string eta(double seconds);         // "H:MM:SS"
  static std::string count(uint64_t n);           // "12,345"

 private:
  std::string line(bool final) const;
  void draw(bool final);

  std::string what_, noun_;
  uint64_t total_, done_ = 0;
  double fraction_ = -1;  // < 0: not known
  Unit unit_;
  FILE* out_;
  bool on_, finished_ = false;
  size_t last_len_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace plyfs
