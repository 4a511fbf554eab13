// `plyctl scrub MOUNTPOINT` (the control requests "scrub" and
// "scrub-cancel", format.md#scrub): the scrub of lib/fs/scrub.h on the
// mounted volume, beside the file operations, which it never stops; its
// progress is the "progress" answer's, and a cancel is answered at once.
#include <atomic>

#include "daemon.h"
#include "fs/scrub.h"
#include "snap/model.h"

namespace plyfs::daemon {

namespace {
std::atomic<bool> scrub_cancel{false};
}  // namespace

Result<nlohmann::ordered_json> scrub_online(uint64_t rate_bytes) {
  RunningOp op("scrub", "scrubbing", "bytes");
  scrub_cancel = false;
  ScrubOptions o;
  o.rate_bytes = rate_bytes;
  o.cancel = &scrub_cancel;
  o.progress = [&](uint64_t done, uint64_t total) { op.update(done, total ? double(done) / double(total) : 1.0); };
  const ScrubReport r = PLY_TRY(scrub(*g->vol, o));
  return model::scrub(r);
}

nlohmann::ordered_json cancel_scrub() {
  scrub_cancel = true;
  return nlohmann::ordered_json{{"result", {{"cancelled", true}}}};
}

}  // namespace plyfs::daemon
