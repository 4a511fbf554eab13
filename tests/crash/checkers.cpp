#include "checkers.h"

#include <algorithm>

#include "btree/btree.h"
#include "btree/disk_node.h"
#include "commit/disk_superblock.h"
#include "commit/verify.h"

namespace plyfs::crash {

namespace {

bool is_super(const Log& log, size_t pos) {
  for (const auto& s : log.supers)
    if (s.pos == pos) return true;
  return false;
}

// The previous and next entries that are not marks.
long prev_call(const Log& log, size_t pos) {
  for (long i = static_cast<long>(pos) - 1; i >= 0; i--)
    if (log.entries[i].kind != Kind::Mark) return i;
  return -1;
}
long next_call(const Log& log, size_t pos) {
  for (size_t i = pos + 1; i < log.entries.size(); i++)
    if (log.entries[i].kind != Kind::Mark) return static_cast<long>(i);
  return -1;
}

// The state right before log entry crash_at: what the last flush made
// durable, and with `all_landed` every write since then too.
Spec state_at(const Run& run, size_t crash_at, const char* tier, bool all_landed) {
  Spec spec;
  spec.crash_at = crash_at;
  spec.tier = tier;
  if (all_landed) {
    const long last = run.log.last_flush_before(crash_at);
    for (size_t p : run.log.writes)
      if (long(p) > last && p < crash_at) spec.kept.push_back(p);
  }
  return spec;
}

// Reach(G): every extent generation G reaches, from the image as it was when
// G was durable (a crash state right after the flush that followed its
// superblock, or the base image).
// With `all_landed`, every write since the last flush landed too (data_of).
std::vector<std::pair<uint64_t, uint64_t>> reach_of(const Run& run, size_t crash_at,
                                                    bool all_landed = false) {
  StateDevice dev(run.log, state_at(run, crash_at, "P3", all_landed), 0);
  VerifyOptions vo;
  vo.kinds = kinds();
  vo.collect_reachable = true;
  auto rep = verify_image(dev, vo);
  if (!rep) return {};
  return rep->reachable;
}

// Data blocks: every extent the values of some generation's trees reference
// (a filesystem's file data), as the image was when it was durable. Data is
// not a node, so P4 leaves these blocks alone.
// With `all_landed`, every write since the last flush before crash_at
// landed too (a generation whose flush after the superblock failed: it may
// be durable anyway, D4).
void data_of(const Run& run, size_t crash_at, std::vector<std::pair<uint64_t, uint64_t>>& out,
             bool all_landed = false) {
  StateDevice dev(run.log, state_at(run, crash_at, "P4", all_landed), 0);
  VolumeOptions vo;
  vo.read_only = true;
  vo.kinds = kinds();
  vo.cache_bytes = 2 << 20;
  auto vol = Volume::open(dev, vo);
  if (!vol) return;
  auto txn = (*vol)->begin();
  if (!txn) return;
  auto trees = txn->list_trees();
  if (!trees) return;
  const auto k = kinds();
  for (const auto& t : *trees) {
    auto refs = k.find(t.kind);
    if (refs == k.end()) continue;
    std::vector<ExtentRef> ext;
    (void)txn->scan(t.id, Key::min(), Key::max(), [&](Key key, std::span<const std::byte> v) {
      refs->second(key, v, ext);
      return true;
    });
    for (const auto& e : ext) out.emplace_back(e.start.v, e.nblocks);
  }
}

}  // namespace

std::vector<Violation> check_protocol(const Run& run) {
  const Log& log = run.log;
  std::vector<Violation> out;
  auto bad = [&](const char* check, size_t pos, std::string what) {
    out.push_back(Violation{check, pos, std::move(what)});
  };

  // P1, P2.
  uint64_t last_gen = run.base_gen;
  for (const auto& s : log.supers) {
    const long before = prev_call(log, s.pos);
    if (before < 0 || log.entries[before].kind != Kind::Flush)
      bad("P1", s.pos, "the superblock of generation " + std::to_string(s.gen) +
                           " is not preceded by a flush");
    const long after = next_call(log, s.pos);
    if (after >= 0 && log.entries[after].kind != Kind::Flush &&
        log.entries[after].kind != Kind::FlushFailed)
      bad("P1", s.pos, "the superblock of generation " + std::to_string(s.gen) +
                           " shares its epoch with a later write");
    if (static_cast<uint64_t>(s.slot) != s.gen % 2)
      bad("P2", s.pos, "generation " + std::to_string(s.gen) + " written to slot " +
                           std::to_string(s.slot));
    if (s.gen != last_gen + 1)
      bad("P2", s.pos, "generation " + std::to_string(s.gen) + " follows " +
                           std::to_string(last_gen));
    last_gen = s.gen;
  }

  // P3: reachable sets of every generation that may be selected, by the
  // position from which it may be.
  struct Protected {
    size_t from;          // writes at or after this position must avoid it
    size_t until;         // ...until the next generation is durable
    std::vector<std::pair<uint64_t, uint64_t>> reach;
    uint64_t gen;
  };
  std::vector<Protected> prot;
  {
    // The base generation is selectable until the first later one is durable.
    std::vector<std::pair<size_t, uint64_t>> durable_at;  // position, generation
    for (const auto& s : log.supers) {
      auto f = std::upper_bound(log.flushes.begin(), log.flushes.end(), s.pos);
      if (f != log.flushes.end()) durable_at.emplace_back(*f, s.gen);
    }
    size_t base_until = durable_at.empty() ? log.entries.size() : durable_at.front().first;
    prot.push_back(Protected{0, base_until, reach_of(run, 0), run.base_gen});
    for (size_t i = 0; i < log.supers.size(); i++) {
      const auto& s = log.supers[i];
      auto f = std::upper_bound(log.flushes.begin(), log.flushes.end(), s.pos);
      if (f == log.flushes.end()) {
        // Never made durable here, but selectable from its superblock write on.
        continue;
      }
      size_t until = log.entries.size();
      for (const auto& [pos, g] : durable_at)
        if (g > s.gen) {
          until = pos;
          break;
        }
      prot.push_back(Protected{s.pos, until, reach_of(run, *f + 1), s.gen});
    }
  }
  const uint64_t bs = log.block_size;
  for (size_t pos : log.writes) {
    if (is_super(log, pos)) continue;
    const Entry& e = log.entries[pos];
    const uint64_t first = e.offset / bs, last = (e.offset + e.length - 1) / bs;
    for (const auto& p : prot) {
      if (pos < p.from || pos >= p.until) continue;
      auto it = std::upper_bound(p.reach.begin(), p.reach.end(),
                                 std::pair<uint64_t, uint64_t>(last, ~0ull));
      if (it != p.reach.begin()) {
        --it;
        if (it->first + it->second > first)
          bad("P3", pos, "a write to blocks " + std::to_string(first) + "-" + std::to_string(last) +
                             " hits block " + std::to_string(it->first) + " of generation " +
                             std::to_string(p.gen) + ", which recovery may still select");
      }
    }
  }

  // P7: a discard never covers a block of a generation that recovery may
  // still select (A6): discarded content is zeros or old bytes (D7), so
  // such a discard is lost data whichever the device does.
  for (size_t pos : log.discards) {
    const Entry& e = log.entries[pos];
    if (e.length == 0) continue;
    const uint64_t first = e.offset / bs, last = (e.offset + e.length - 1) / bs;
    for (const auto& p : prot) {
      if (pos < p.from || pos >= p.until) continue;
      auto it = std::upper_bound(p.reach.begin(), p.reach.end(), std::pair<uint64_t, uint64_t>(last, ~0ull));
      // Extents do not overlap: the last one starting at or before `last`
      // is the only one that can end after `first`... unless it starts
      // before `first`; then nothing before it reaches further.
      while (it != p.reach.begin()) {
        --it;
        if (it->first + it->second <= first) break;
        bad("P7", pos, "a discard of blocks " + std::to_string(first) + "-" + std::to_string(last) +
                           " hits block " + std::to_string(std::max(it->first, first)) + " of generation " +
                           std::to_string(p.gen) + ", which recovery may still select");
        break;
      }
    }
  }

  // P4: blocks written by a commit are nodes of the generation it commits,
  // or data blocks (file data of the filesystem workloads, written before
  // the commit that makes the items referencing them durable).
  std::vector<std::pair<uint64_t, uint64_t>> data;
  data_of(run, 0, data);
  for (const auto& s : log.supers) {
    auto f = std::upper_bound(log.flushes.begin(), log.flushes.end(), s.pos);
    if (f != log.flushes.end()) data_of(run, *f + 1, data);
    else data_of(run, log.entries.size(), data, true);  // its flush failed (fault runs)
  }
  std::sort(data.begin(), data.end());
  auto is_data = [&](uint64_t b) {
    auto it = std::upper_bound(data.begin(), data.end(), std::pair<uint64_t, uint64_t>(b, ~0ull));
    while (it != data.begin()) {
      --it;
      if (it->first + it->second > b) return true;
      if (b - it->first > (1u << 20)) break;  // extents are shorter than this
    }
    return false;
  };
  // A generation whose flush after the superblock failed (fault runs) may be
  // durable anyway (D4): what it reaches, with everything written landed.
  std::vector<Protected> unflushed;
  for (const auto& s : log.supers)
    if (std::upper_bound(log.flushes.begin(), log.flushes.end(), s.pos) == log.flushes.end())
      unflushed.push_back(Protected{s.pos, log.entries.size(), reach_of(run, log.entries.size(), true), s.gen});
  auto reached = [&](uint64_t gen, uint64_t b) {
    for (const auto* ps : {&prot, &unflushed})
      for (const auto& p : *ps) {
        if (p.gen != gen) continue;
        auto it = std::upper_bound(p.reach.begin(), p.reach.end(), std::pair<uint64_t, uint64_t>(b, ~0ull));
        return it != p.reach.begin() && std::prev(it)->first + std::prev(it)->second > b;
      }
    return true;  // not durable in this log: judge it as a node
  };
  const auto ch = read_superblocks(*log.base);
  const uint64_t fs_id = ch ? ch->info.fs_id : 0;
  for (size_t pos : log.writes) {
    if (is_super(log, pos) || log.entries[pos].kind == Kind::WriteFailed) continue;
    const Entry& e = log.entries[pos];
    if (e.offset < disk::kReservedBytes) continue;  // mkfs wiping the reserved area
    uint64_t gen = 0;
    for (const auto& s : log.supers)
      if (s.pos > pos) {
        gen = s.gen;
        break;
      }
    if (!gen) continue;  // a commit cut short before its superblock
    for (uint64_t off = 0; off + bs <= e.length; off += bs) {
      const uint64_t b = (e.offset + off) / bs;
      if (is_data(b)) continue;
      // A block no generation reaches, without a node's magic: data written
      // and freed again before the commit (a file written twice in one
      // generation). It cannot harm the commit.
      const auto* h = reinterpret_cast<const disk::NodeHeader*>(e.data->data() + off);
      if (h->magic.get() != disk::kNodeMagic && !reached(gen, b)) continue;
      auto r = verify_node(std::span<const std::byte>(e.data->data() + off, bs), BlockNo{b}, fs_id,
                           Generation{gen},
                           static_cast<int>(static_cast<uint8_t>((*e.data)[off + 12])));
      if (!r) bad("P4", pos, "block " + std::to_string(b) + ": " + r.error().reason);
    }
  }

  // P5.
  for (size_t i = 0; i < log.entries.size(); i++) {
    const Entry& e = log.entries[i];
    if (e.kind != Kind::Mark || e.label != "ack") continue;
    bool durable = e.arg <= run.base_gen;  // nothing to commit: already durable
    for (const auto& s : log.supers)
      if (s.gen == e.arg && s.pos < i)
        for (size_t f : log.flushes)
          if (f > s.pos && f < i) durable = true;
    if (!durable)
      bad("P5", i, "generation " + std::to_string(e.arg) +
                       " was acknowledged before its superblock was flushed");
  }
  return out;
}

}  // namespace plyfs::crash
