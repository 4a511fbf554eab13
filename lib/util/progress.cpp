// See progress.h.
#include "util/progress.h"

#include <unistd.h>

#include <algorithm>

#include "util/parse.h"

namespace plyfs {

using Clock = std::chrono::steady_clock;

Progress::Progress(std::string what, uint64_t total, Unit unit, std::string noun, FILE* out,
                   bool force)
    : what_(std::move(what)), noun_(std::move(noun)), total_(total), unit_(unit), out_(out),
      on_(force || (out && ::isatty(::fileno(out)))), start_(Clock::now()) {}

Progress::~Progress() {
  if (on_ && !finished_ && last_len_) {
    std::fprintf(out_, "\r\033[K");
    std::fflush(out_);
  }
}

std::string Progress::count(uint64_t n) {
  const std::string d = std::to_string(n);
  std::string s;
  for (size_t i = 0; i < d.size(); i++) {
    if (i && (d.size() - i) % 3 == 0) s += ',';
    s += d[i];
  }
  return s;
}

std::string Progress::eta(double seconds) {
  if (!(seconds >= 0) || seconds > 359999) return "--:--:--";
  const auto t = static_cast<uint64_t>(seconds + 0.5);
  char b[32];
  std::snprintf(b, sizeof b, "%llu:%02llu:%02llu", static_cast<unsigned long long>(t / 3600),
                static_cast<unsigned long long>(t / 60 % 60), static_cast<unsigned long long>(t % 60));
  return b;
}

std::string Progress::line(bool final) const {
  const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
  auto amount = [&](uint64_t n) {
    return unit_ == Unit::Bytes ? format_size(n) : count(n);
  };
  // Appended piece by piece: GCC 12 warns (-Wrestrict) about a literal
  // concatenated with a temporary.
  std::string s = what_;
  s += ": ";
  s += amount(done_);
  if (total_ && !final) {
    s += " / ";
    s += amount(total_);
  }
  if (unit_ == Unit::Count && !noun_.empty()) {
    s += ' ';
    s += noun_;
  }
  if (final) {
    s += " in ";
    s += eta(secs);
    return s;
  }
  if (total_) {
    s += " (";
    s += std::to_string(std::min<uint64_t>(100, done_ * 100 / total_));
    s += "%)";
  } else if (fraction_ >= 0) {
    s += " (";
    s += std::to_string(static_cast<int>(std::min(fraction_, 1.0) * 100));
    s += "%)";
  }
  if (secs >= 0.5) {
    const double rate = static_cast<double>(done_) / secs;
    s += ", ";
    s += unit_ == Unit::Bytes ? format_size(static_cast<uint64_t>(rate))
                              : count(static_cast<uint64_t>(rate));
    s += "/s";
    if (total_ && done_ && done_ < total_) {
      s += ", ETA ";
      s += eta(static_cast<double>(total_ - done_) / rate);
    } else if (!total_ && fraction_ > 0 && fraction_ < 1) {
      s += ", ETA ";
      s += eta(secs * (1 - fraction_) / fraction_);
    }
  }
  return s;
}

void Progress::draw(bool final) {
  const std::string s = line(final);
  // "\033[K" erases the rest of the line a longer earlier line left.
  std::fprintf(out_, "\r%s\033[K%s", s.c_str(), final ? "\n" : "");
  std::fflush(out_);
  last_len_ = s.size();
}

void Progress::update(uint64_t done) {
  done_ = done;
  if (!on_ || finished_) return;
  const auto now = Clock::now();
  if (last_len_ && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  draw(false);
}

void Progress::update(uint64_t done, double fraction) {
  fraction_ = fraction;
  update(done);
}

void Progress::finish() {
  if (finished_) return;
  if (on_) draw(true);
  finished_ = true;
}

}  // namespace plyfs
