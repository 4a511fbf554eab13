// Result<T>: a value or an Error, for every fallible call in plyfs.
//
// Why not negative errno: fsck and the tests need to know what broke and where
// (a reason and a block number travel with the code), and [[nodiscard]] turns a
// dropped error into a compiler warning. The code is always an errno value so
// that the FUSE layer can reply with it after mapping in exactly one place.
// Exceptions never cross a layer.
#pragma once

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace plyfs {

struct Error {
  int code = EIO;            // an errno value
  std::string reason;        // one plain sentence, no trailing period
  uint64_t block = kNoBlock; // the block concerned, when there is one
  // The code came from a system call (open, pread, ioctl...): its strerror
  // text tells the user something. plyfs's own refusals and findings carry
  // an errno only for the caller's benefit (FUSE replies, exit codes); their
  // reason says it all, so messages do not end in ": Invalid argument".
  bool system = false;

  static constexpr uint64_t kNoBlock = ~uint64_t{0};

  // A damaged image: the structure at `block` does not satisfy the format.
  // EUCLEAN ("Structure needs cleaning") is what Linux filesystems return for
  // detected corruption; the FUSE layer reports it to callers as EIO.
  static Error corrupt(uint64_t block, std::string why) {
    return Error{EUCLEAN, std::move(why), block};
  }
  static Error io(int code, std::string why, uint64_t block = kNoBlock) {
    return Error{code, std::move(why), block};
  }
  // A system call failed with `code` (errno) while doing `what`.
  static Error sys(int code, std::string what, uint64_t block = kNoBlock) {
    return Error{code, std::move(what), block, true};
  }
  static Error invalid(std::string why) { return Error{EINVAL, std::move(why)}; }
  static Error no_space(std::string why) { return Error{ENOSPC, std::move(why)}; }

  bool is_corruption() const { return code == EUCLEAN; }
  // "reason (block N)", and ": strerror" for a system error. Every tool
  // prints errors this way, as one line.
  std::string message() const;
  // What a tool prints: message(), and for a damaged image (EUCLEAN) the
  // advice to check it: "...; the image is damaged: run fsck.plyfs IMAGE".
  std::string user_message(std::string_view image = {}) const;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Error err) : v_(std::move(err)) {}          // NOLINT
  explicit operator bool() const { return v_.index() == 0; }
  bool ok() const { return v_.index() == 0; }
  T& operator*() & { return std::get<0>(v_); }
  T&& operator*() && { return std::get<0>(std::move(v_)); }
  const T& operator*() const& { return std::get<0>(v_); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const Error& error() const& { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error err) : err_(std::move(err)), ok_(false) {}  // NOLINT
  explicit operator bool() const { return ok_; }
  bool ok() const { return ok_; }
  const Error& error() const& { return err_; }
  Error&& error() && { return std::move(err_); }

 private:
  Error err_{};
  bool ok_ = true;
};

inline Result<void> ok() { return {}; }

}  // namespace plyfs

// Propagate an error to the caller; yields the value otherwise.
//   auto node = PLY_TRY(read_node(b));
#define PLY_TRY(expr)                                   \
  ({                                                    \
    auto&& ply_try_r_ = (expr);                         \
    if (!ply_try_r_) return std::move(ply_try_r_).error(); \
    std::move(*ply_try_r_);                             \
  })

// The same for Result<void>.
#define PLY_CHECK(expr)                                 \
  do {                                                  \
    auto&& ply_check_r_ = (expr);                       \
    if (!ply_check_r_) return std::move(ply_check_r_).error(); \
  } while (0)
