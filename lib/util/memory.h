// How much memory this process may use and how much of it is free: the
// machine's (/proc/meminfo), narrowed to the memory cgroup the process runs
// in when that has a limit (a container's), so that a cache sized from it
// (the daemon's NBD read cache, read_cache.h C8) neither takes an eighth of a
// host it cannot have nor waits for the host to run short while its own
// cgroup is about to be OOM-killed.
#pragma once

#include <cstdint>
#include <optional>

namespace plyfs {

struct Memory {
  uint64_t total = 0;      // bytes; 0: not known
  uint64_t available = 0;  // bytes that can be had without swapping or an OOM kill
};

// MemTotal and MemAvailable of a meminfo file (kB there); total 0 if it
// cannot be read or lacks either (kernels before 3.14 have no MemAvailable).
Memory read_meminfo(const char* path = "/proc/meminfo");

// The memory cgroup of this process, cgroup v2 (memory.max, memory.high,
// memory.current) or v1's memory controller (memory.limit_in_bytes,
// memory.usage_in_bytes), and every ancestor up to its hierarchy's root:
// total is the smallest limit, available the least of limit - usage +
// inactive file pages over the limited ones (what kubelet calls the working
// set: those pages are reclaimed before anything is killed). nullopt when no
// cgroup on the way has a limit or none can be read. The files are found
// through `self_cgroup` (proc's cgroup(7) list) and `mountinfo`.
std::optional<Memory> read_cgroup_memory(const char* self_cgroup = "/proc/self/cgroup",
                                         const char* mountinfo = "/proc/self/mountinfo");

// read_meminfo() narrowed by read_cgroup_memory(): the smaller total, the
// smaller available.
Memory memory_now();

}  // namespace plyfs
