// The daemon's end of /dev/fuse, between the kernel and libfuse.
//
// libfuse 3.14 (Debian 12) negotiates the connection's features itself and
// knows nothing of FUSE_HANDLE_KILLPRIV_V2 (protocol 7.33). Without it the
// kernel keeps no "no setuid bits, no capability" mark on a FUSE inode
// (SB_NOSEC), so every write(2) first asks the daemon for the file's
// security.capability: one GETXATTR round trip per write, a fifth of all
// requests under PostMark (docs/benchmarks.md). With it, the filesystem
// clears setuid/setgid itself, told by flags in the requests.
//
// So the daemon passes the session's reads and writes through here
// (fuse_session_custom_io): the INIT reply gains FUSE_HANDLE_KILLPRIV_V2
// when the kernel offered it, and each request's "clear setuid/setgid"
// flag is noted for the thread that handles it (libfuse's worker threads
// read a request and handle it on the same thread). Nothing else changes:
// requests and replies pass through byte for byte.
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

namespace plyfs {

// Route a mounted session's I/O through here. False if libfuse refused, in
// which case the session goes on without KILLPRIV_V2.
bool install_kernel_io(fuse_session* se);

// Ask for FUSE over io_uring (uring.h) in the INIT reply when the kernel
// offers it, with `depth` entries per CPU queue. Before the mount.
void want_uring(bool on, unsigned depth);

// -o spin=MICROSECONDS: before a worker thread sleeps in read(2) for the
// next request, one thread at a time polls /dev/fuse for up to this long.
// A program that issues one request after another (rm -r, tar, a
// single-threaded build) then finds a thread awake and running: the
// kernel's wakeup of a sleeping thread on another CPU (an inter-processor
// interrupt, dear in a VM) is saved on each request. 0 turns it off.
void set_spin(unsigned microseconds);

// Whether the kernel agreed to FUSE_HANDLE_KILLPRIV_V2 (known after INIT).
bool killpriv_v2();

// Whether the request being handled on this thread asks the filesystem to
// clear setuid, and setgid when the file is group-executable: a WRITE with
// FUSE_WRITE_KILL_SUIDGID, a SETATTR with FATTR_KILL_SUIDGID, an OPEN with
// FUSE_OPEN_KILL_SUIDGID. The kernel sets them when the caller lacks
// CAP_FSETID, as the VFS would decide for a local filesystem.
bool request_kills_setid();

}  // namespace plyfs
