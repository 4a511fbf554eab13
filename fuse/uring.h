// FUSE over io_uring (Linux 6.14 and later, `fuse.enable_uring=1`).
//
// With /dev/fuse every request costs the daemon a read(2) and a writev(2),
// and the request goes to whichever worker thread the kernel wakes, often
// on the other core from the caller. Over io_uring the kernel keeps one
// queue per CPU: a request is put in the queue of the CPU its caller runs
// on, and that queue's thread (pinned to the same CPU) gets it as a
// completion and sends the reply and takes the next request with one
// io_uring_enter(2). FORGET, INTERRUPT and the daemon's notifications
// still go through /dev/fuse, which the usual session loop keeps serving.
//
// libfuse 3.14 (Debian 12) has no io_uring transport, so this one sits
// beside kernel_io.cpp: it asks for FUSE_OVER_IO_URING in the INIT reply
// (kernel_io.cpp, when the kernel offered it and `-o uring` asked for it),
// then registers the queues. A request taken from a ring is laid out as
// /dev/fuse would have delivered it and handed to libfuse
// (fuse_session_process_buf); libfuse's reply comes back through
// kernel_io's writev, which gives it to reply() here when its unique id
// belongs to a ring request.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

namespace plyfs::uring {

// Starts one queue per possible CPU, each with up to `depth` entries (64
// in all at most, 2 per queue at least) whose payload buffers hold
// `payload` bytes. Called once, right after the INIT
// reply that asked for io_uring went out. False (with a log line) when
// the kernel refuses; requests then keep coming through /dev/fuse.
bool start(fuse_session* se, int devfd, size_t payload, unsigned depth);

// The reply of a request taken from a ring goes back through its ring; true
// then, with *written the bytes the reply had. False for anything else
// (requests read from /dev/fuse, notifications).
bool reply(const struct iovec* iov, int count, ssize_t* written);

// -o uring asked, but the kernel did not offer io_uring: says so.
void not_offered();

// Stops the queue threads and frees the rings. After the unmount.
void stop();

// Whether the rings are registered, and how many requests they carried.
bool active();
uint64_t requests();

// kernel_io.cpp's hook: notes a request's flags for the thread handling it.
void note_request(const void* buf, size_t len);

// The daemon's logger (syslog once daemonized).
void set_logger(void (*log)(const char* fmt, ...));

}  // namespace plyfs::uring
