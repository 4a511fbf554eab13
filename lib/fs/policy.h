// Placement rules (format.md#placement-rules): UmbrellaFS's policy module.
// On a volume of several devices, each rule matches files by name glob or
// extension, size, owner, directory subtree and access type, and names the
// device classes a file's data goes to, in order, falling back to the next
// when one is full, or strict (ENOSPC when the first is full). Rules are
// tried in order; the first that matches decides. A file no rule matches
// goes where the volume puts data by default (format.md#placement).
//
// A rule's text is its stored form (the catalog keeps one item per rule)
// and what plyctl policy set takes:
//   [name=GLOB] [ext=E[,E...]] [size<N|size<=N|size>N|size>=N]...
//   [uid=N] [gid=N] [under=/DIR] [access=ro|rw] to=CLASS[,CLASS...]
//   [stage=CLASS] [strict]
// stage= (bcachefs's foreground_target): new data is written to that class
// first and moved to the first of `to` in the background once the file has
// had no write for a while (format.md#staged-writes).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "alloc/space.h"
#include "util/result.h"

namespace plyfs {

inline constexpr size_t kMaxPlacementRules = 64;   // a rule set fits one bit mask
inline constexpr size_t kMaxRuleBytes = 1024;     // a rule's text

struct PlacementRule {
  enum class Access : uint8_t { Any, ReadOnly, Written };
  std::string name_glob;              // fnmatch(3) on the file's name; empty: any
  std::vector<std::string> exts;      // the name's suffix after its last '.', any case
  uint64_t size_min = 0;              // size >= size_min
  std::optional<uint64_t> size_below; // size < size_below
  std::optional<uint32_t> uid, gid;
  std::string under;                  // "/a/b": files below that directory
  Access access = Access::Any;        // ReadOnly: no write permission bit
  std::vector<std::string> to;        // classes, 1 to 8, in order
  std::string stage;                  // written here first, then moved to to[0]; empty: none
  bool strict = false;

  bool has_size() const { return size_min > 0 || size_below.has_value(); }
};

// EINVAL with a message naming the token at fault.
Result<PlacementRule> parse_rule(std::string_view text);
// The canonical text: what is stored and listed; parse_rule reads it back
// to an equal rule.
std::string format_rule(const PlacementRule& r);

// A rule set bound to a volume's classes (names to class ids).
class PlacementPolicy {
 public:
  // EINVAL: more than kMaxPlacementRules rules, or a rule naming a class
  // the volume does not have (or a class twice).
  static Result<PlacementPolicy> compile(std::vector<PlacementRule> rules,
                                         const std::vector<std::string>& classes);
  const std::vector<PlacementRule>& rules() const { return rules_; }
  bool empty() const { return rules_.empty(); }
  // The rules whose conditions other than size hold for a file at `path`
  // (from the branch's root, "/a/b") with that owner and mode: bit i for
  // rule i. A file's size changes on every write; the rest rarely.
  uint64_t candidates(std::string_view path, uint32_t uid, uint32_t gid, uint32_t mode) const;
  // The first rule of `cand` whose size condition holds; -1: none.
  int choose(uint64_t cand, uint64_t size) const;
  // Where rule `i` keeps its data: its `to` classes; -1: the default order
  // (n == 0). A migration moves data to the first.
  Placement placement(int i) const;
  // Where a write under rule `i` puts new data: for a staged rule its stage
  // class, then its `to` classes; else placement(i).
  Placement write_placement(int i) const;
  // Rule `i` writes to a stage class first.
  bool staged(int i) const;
  bool any_staged() const { return stage_mask_ != 0; }
  // Bit c: some rule stages on class c.
  uint32_t stage_classes() const { return stage_mask_; }

 private:
  std::vector<PlacementRule> rules_;
  std::vector<Placement> places_, staged_places_;
  uint32_t stage_mask_ = 0;
};

// The rules in force on a volume (a Volume::extension): installed by whoever
// opens the volume from the catalog (load_placement_rules, union/view.h) and
// replaced online by plyctl policy set. version() changes with every set(),
// so that what a filesystem cached about its files under older rules is
// known to be stale.
class PolicyState {
 public:
  std::shared_ptr<const PlacementPolicy> get() const {
    std::lock_guard lk(mu_);
    return p_;
  }
  void set(std::shared_ptr<const PlacementPolicy> p) {
    std::lock_guard lk(mu_);
    active_.store(p && !p->empty(), std::memory_order_release);
    p_ = std::move(p);
    version_++;
  }
  // Any rule in force: one load, for the paths every operation takes.
  bool active() const { return active_.load(std::memory_order_acquire); }
  uint64_t version() const {
    std::lock_guard lk(mu_);
    return version_;
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const PlacementPolicy> p_;
  uint64_t version_ = 0;
  std::atomic<bool> active_{false};
};

}  // namespace plyfs
