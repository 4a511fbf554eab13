// A volume on two image files (format.md#multi-device) end to end: made by
// mkfs.plyfs with a class for each, mounted from either device with the
// other named (-o device=) or found in a scanned directory, files written
// and read back, metadata on the fast device and data on the slow one until
// it is full, then on the fast one; plyctl device list online and offline
// (checked against the schema) agreeing on it; fsck clean; and the refusals:
// a device missing, a device of another volume, bad --class values.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <atomic>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "fuse_util.h"
#include "json_schema.h"

using namespace plyfs::fusetest;
using nlohmann::json;

namespace {

int mkfs_status(const TempDir& tmp, std::vector<std::string> args, std::string* out = nullptr) {
  args.insert(args.begin(), mkfs_bin());
  const std::string log = tmp / "mkfs.log";
  ::unlink(log.c_str());
  const int rc = run(args, log);
  if (out) *out = slurp(log);
  UNSCOPED_INFO("mkfs.plyfs: " << slurp(log));
  return rc;
}

// An empty (sparse) file of `bytes` at `path`: a device to add.
void blank_image(const std::string& path, off_t bytes) {
  const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, bytes) == 0);
  ::close(fd);
}

// plyfs IMAGE MNT -f with `opts`, expected to refuse: its status and output.
int refused_mount(const TempDir& tmp, const std::string& img, const std::vector<std::string>& opts,
                  std::string& out) {
  std::vector<std::string> argv{plyfs_bin(), img, tmp / "never", "-f"};
  ::mkdir((tmp / "never").c_str(), 0755);
  for (const auto& o : opts) argv.insert(argv.end(), {"-o", o});
  const int rc = run(argv, tmp / "refused.log", 60);
  out = slurp(tmp / "refused.log");
  return rc;
}

// The volume on `devices` and nothing else: fsck -n clean with them, and a
// mount of the first with the others as -o device= reads back every file.
void require_volume_holds(const TempDir& tmp, const std::vector<std::string>& devices,
                          const std::map<std::string, std::string>& files) {
  std::vector<std::string> fsck{fsck_bin(), "-n"};
  fsck.insert(fsck.end(), devices.begin(), devices.end());
  REQUIRE(run(fsck, tmp / "fsck-holds.log") == 0);
  std::vector<std::string> opts;
  for (size_t i = 1; i < devices.size(); i++) opts.push_back("device=" + devices[i]);
  Mount m(devices[0], tmp / "mnt-holds", opts);
  m.start();
  for (const auto& [name, data] : files) REQUIRE(read_file(m / name) == data);
  REQUIRE(m.unmount() == 0);
}

// A thread that, until stopped (and at least four rounds), rewrites files
// w0..w9 of the mount, reading each back and one of `files` (named
// PREFIX0..PREFIX<n-1>, never changed meanwhile). No Catch2 in it
// (put_file): `bad` counts what went wrong, `written` is the last content
// of each file.
struct Writer {
  Writer(const Mount& mount, const std::map<std::string, std::string>& old, std::string name_prefix, int count,
         uint64_t s)
      : m(mount), files(old), prefix(std::move(name_prefix)), n(count), seed(s) {}
  const Mount& m;
  const std::map<std::string, std::string>& files;
  std::string prefix;
  int n;
  uint64_t seed;
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0}, bad{0};
  std::mutex mu;
  std::map<std::string, std::string> written;
  std::vector<std::thread> ts;
  JoinOnExit join{ts, stop};  // also when a REQUIRE fails

  void start() {
    ts.emplace_back([this] {
      std::mt19937_64 wr(seed);
      for (int i = 0; !stop.load() || i < 4; i++) {
        const std::string name = "w" + std::to_string(i % 10);
        const std::string data = random_bytes(wr, 64 << 10 | (wr() % (512 << 10)));
        if (!put_file(m / name, data) || get_file(m / name) != data) bad++;
        const std::string old = prefix + std::to_string(i % n);
        if (get_file(m / old) != files.at(old)) bad++;
        std::lock_guard lk(mu);
        written[name] = data;
        rounds++;
      }
    });
  }
  void finish() {
    stop = true;
    for (auto& t : ts) t.join();
    ts.clear();
  }
};

json devices(const TempDir& tmp, std::vector<std::string> args) {
  auto r = ctl(tmp, std::move(args));
  REQUIRE(r.rc == 0);
  return schema_checked("device list", r.out);
}

}  // namespace

TEST_CASE("multidev-fuse: one volume on a fast and a slow image, placed by class", "[multidev-fuse]") {
  TempDir tmp;
  const std::string fast = tmp / "fast.img", slow = tmp / "slow.img";
  REQUIRE(mkfs_status(tmp, {"-q", "-s", "192M", "-C", "fast=" + fast, "-C", "slow=" + slow}) == 0);

  std::map<std::string, std::string> files;
  std::mt19937_64 rng(0x6d756c7469ull);
  {
    Mount m(fast, tmp / "mnt", {"device=" + slow});
    m.start();
    ::mkdir((m / "small").c_str(), 0755);
    for (int i = 0; i < 300; i++) {
      const std::string name = "small/f" + std::to_string(i);
      files[name] = random_bytes(rng, 1 + rng() % 16384);
      write_file(m / name, files[name]);
    }
    // 240 MiB of large files: more than the slow device holds.
    for (int i = 0; i < 60; i++) {
      const std::string name = "big" + std::to_string(i);
      files[name] = random_bytes(rng, (4 << 20) - rng() % 4096);
      write_file(m / name, files[name]);
    }
    ::sync();
    const json d = devices(tmp, {"device", "list", m.path(), "--json"});
    INFO(d.dump());
    REQUIRE(d["classes"] == json::array({"fast", "slow"}));
    REQUIRE(d["metadata_class"] == "fast");
    REQUIRE(d["devices"].size() == 2);
    const json& f = d["devices"][0];
    const json& s = d["devices"][1];
    REQUIRE(f["class"] == "fast");
    REQUIRE(f["metadata"] == true);
    REQUIRE(s["metadata"] == false);
    REQUIRE(f["path"].get<std::string>().ends_with("/fast.img"));
    REQUIRE(s["path"].get<std::string>().ends_with("/slow.img"));
    // Metadata only on the fast device; data filled the slow one first.
    REQUIRE(f["metadata_bytes"].get<uint64_t>() > 0);
    REQUIRE(s["metadata_bytes"].get<uint64_t>() == 0);
    REQUIRE(s["data_bytes"].get<uint64_t>() > s["size_bytes"].get<uint64_t>() * 9 / 10);
    REQUIRE(f["data_bytes"].get<uint64_t>() > 0);
    uint64_t data = f["data_bytes"].get<uint64_t>() + s["data_bytes"].get<uint64_t>();
    REQUIRE(data >= 240ull << 20);
    // plyctl where: the first big file on the slow device, the last on the
    // fast one (the slow one was full by then), a tiny file inline.
    write_file(m / "tiny", "tiny");
    auto where = [&](const std::string& name) {
      auto r = ctl(tmp, {"where", m / name, "--json"});
      REQUIRE(r.rc == 0);
      return schema_checked("where", r.out);
    };
    for (const auto& [name, dev] : std::vector<std::pair<std::string, int>>{{"big0", 1}, {"big59", 0}}) {
      const json w = where(name);
      INFO(name << ": " << w.dump());
      REQUIRE(!w["extents"].empty());
      uint64_t covered = 0;
      for (const auto& e : w["extents"]) {
        REQUIRE(e["device"] == dev);
        covered += e["bytes"].get<uint64_t>();
      }
      REQUIRE(covered == files[name].size());
      REQUIRE(w["devices"].size() == 1);
      REQUIRE(w["devices"][0]["class"] == (dev == 0 ? "fast" : "slow"));
    }
    REQUIRE(where("tiny")["extents"].empty());
    auto text = ctl(tmp, {"where", m / "big0"});
    REQUIRE(text.rc == 0);
    REQUIRE(text.out.find("(slow)") != std::string::npos);
    REQUIRE(m.unmount() == 0);
  }
  std::string out;
  REQUIRE(run({fsck_bin(), fast, slow}, tmp / "fsck.log") == 0);
  // Offline, the slow device found by scanning the directory: the same use.
  const json off = devices(tmp, {"--device", tmp.path(), "device", "list", fast, "--json"});
  REQUIRE(off["devices"][1]["data_bytes"].get<uint64_t>() > 0);

  SECTION("mounted from the other device, the first found by a scan: every byte back") {
    Mount m(slow, tmp / "mnt2", {"device=" + tmp.path()});
    m.start();
    for (const auto& [name, content] : files) {
      INFO(name);
      REQUIRE(read_file(m / name) == content);
    }
    REQUIRE(m.unmount() == 0);
    // Every device named, the mounted one among them, one twice (btrfs's
    // fstab lines name every device): each is opened once, where a second
    // open would find its lock held by the first.
    Mount all(fast, tmp / "mnt2", {"device=" + fast, "device=" + slow, "device=" + slow});
    all.start();
    for (const auto& name : {"big0", "big59", "small/f7"}) REQUIRE(read_file(all / name) == files[name]);
    REQUIRE(all.unmount() == 0);
    REQUIRE(run({fsck_bin(), "-n", fast, fast, slow}, tmp / "fsck-twice.log") == 0);
  }
  SECTION("a missing device, or one of another volume, refuses the mount and fsck") {
    REQUIRE(refused_mount(tmp, fast, {}, out) != 0);
    REQUIRE(out.find("is missing") != std::string::npos);
    REQUIRE(out.find("class slow") != std::string::npos);
    const std::string o0 = tmp / "other0.img", o1 = tmp / "other1.img";
    REQUIRE(mkfs_status(tmp, {"-q", "-s", "64M", o0, o1}) == 0);
    REQUIRE(refused_mount(tmp, fast, {"device=" + o1}, out) != 0);
    REQUIRE(out.find("another plyfs volume") != std::string::npos);
    REQUIRE(run({fsck_bin(), fast}, tmp / "fsck2.log") == 8);
    REQUIRE(slurp(tmp / "fsck2.log").find("is missing") != std::string::npos);
    auto r = ctl(tmp, {"device", "list", fast});
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("is missing") != std::string::npos);
    // A device of a volume is not formatted over without -f.
    REQUIRE(mkfs_status(tmp, {"-q", slow}, &out) == 1);
    REQUIRE(out.find("use -f") != std::string::npos);
  }
  SECTION("a device whose device tables are damaged: fsck says so, -y gives it the others' copy") {
    // A byte of the device table (sector 1, format.md#device-table) in both
    // superblock slots of the slow device: their checksums no longer match.
    const int fd = ::open(slow.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    for (off_t off : {off_t(65536 + 600), off_t(131072 + 600)}) {
      char b = 0;
      REQUIRE(::pread(fd, &b, 1, off) == 1);
      b = char(b ^ 0x5a);
      REQUIRE(::pwrite(fd, &b, 1, off) == 1);
    }
    ::close(fd);
    REQUIRE(refused_mount(tmp, fast, {"device=" + slow}, out) != 0);
    REQUIRE(out.find("no superblock in common") != std::string::npos);
    REQUIRE(run({fsck_bin(), "-n", fast, slow}, tmp / "fsck3.log") == 4);
    REQUIRE(slurp(tmp / "fsck3.log").find("S-device") != std::string::npos);
    REQUIRE(slurp(tmp / "fsck3.log").find("-y " + fast + " " + slow) != std::string::npos);
    REQUIRE(run({fsck_bin(), "-y", fast, slow}, tmp / "fsck4.log") == 1);
    REQUIRE(run({fsck_bin(), "-n", "-C", "0", fast, slow}, tmp / "fsck5.log") == 0);
    Mount m(fast, tmp / "mnt3", {"device=" + slow});
    m.start();
    for (const auto& name : {"big0", "big59", "small/f7"}) REQUIRE(read_file(m / name) == files[name]);
    REQUIRE(m.unmount() == 0);
  }
  SECTION("bad classes are one-line usage errors, and nothing is written") {
    const std::string n0 = tmp / "n0.img", n1 = tmp / "n1.img";
    // A dry run shows each device with its class, and creates nothing.
    REQUIRE(mkfs_status(tmp, {"-n", "-s", "64M", "-C", "fast=" + n0, "-C", "slow=" + n1}, &out) == 0);
    REQUIRE(out.find("on 2 devices") != std::string::npos);
    REQUIRE(out.find("class fast (metadata)") != std::string::npos);
    REQUIRE(out.find("class slow") != std::string::npos);
    REQUIRE(::access(n0.c_str(), F_OK) != 0);
    for (const auto& bad : std::vector<std::vector<std::string>>{
             {"-C", "fast", n0},
             {"-C", "Fast=" + n0, n1},
             {"-C", "a=" + n0, "-C", "b=" + n0},
             {"-C", "a=" + n0, "-M", "nosuch", n1}}) {
      std::vector<std::string> args{"-s", "64M"};
      args.insert(args.end(), bad.begin(), bad.end());
      REQUIRE(mkfs_status(tmp, args, &out) == 1);
      REQUIRE(std::count(out.begin(), out.end(), '\n') == 1);
      REQUIRE(::access(n0.c_str(), F_OK) != 0);
      REQUIRE(::access(n1.c_str(), F_OK) != 0);
    }
  }
}

// Placement rules through a mount (format.md#placement-rules, #migration):
// set online, every extent of random files on its rule's first class (the
// rules read here on their own), plyctl policy test agreeing, migration on
// growth, rename and chown, strict ENOSPC while the other device has room,
// fallback for a rule that is not strict, the rules kept across a remount,
// and the refusals.
TEST_CASE("multidev-fuse: placement rules place files and move them when they cross one", "[multidev-fuse]") {
  TempDir tmp;
  const std::string fast = tmp / "fast.img", slow = tmp / "slow.img";
  REQUIRE(mkfs_status(tmp, {"-q", "-s", "128M", "-C", "fast=" + fast, "-C", "slow=" + slow}) == 0);
  std::map<std::string, std::string> files;
  std::mt19937_64 rng(0x706f6cull);
  Mount m(fast, tmp / "mnt", {"device=" + slow});
  m.start();
  {
    auto r = ctl(tmp, {"policy", "set", m.path(), "ext=mp4,MKV to=slow", "size<64K to=fast", "under=/db to=fast strict",
                       "uid=4242 to=fast", "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const json p = schema_checked("policy set", r.out);
    REQUIRE(p["rules"].size() == 4);
    REQUIRE(p["rules"][1]["rule"] == "size<64K to=fast");
    REQUIRE(p["rules"][0]["match"]["ext"] == json::array({"mp4", "mkv"}));
  }
  // The rules as this test reads them: the class a file's data belongs on.
  auto want = [](const std::string& rel, uint64_t size, uint32_t uid) -> std::string {
    const bool video = rel.ends_with(".mp4") || rel.ends_with(".mkv");
    if (video) return "slow";
    if (size < 65536) return "fast";
    if (rel.starts_with("db/")) return "fast";
    if (uid == 4242) return "fast";
    return "slow";
  };
  auto where = [&](const std::string& rel) {
    auto r = ctl(tmp, {"where", m / rel, "--json"});
    INFO(rel << ": " << r.err);
    REQUIRE(r.rc == 0);
    return schema_checked("where", r.out);
  };
  std::map<std::string, uint32_t> owner;
  std::map<std::string, std::string> placed;  // the class check() saw last
  uint64_t moves = 0, moved_blocks = 0;
  auto check = [&](const std::string& rel) {
    const json w = where(rel);
    const std::string cls = want(rel, files[rel].size(), owner[rel]);
    INFO(rel << " (" << files[rel].size() << " bytes) belongs on " << cls << ": " << w.dump());
    for (const auto& e : w["extents"]) REQUIRE(e["class"] == cls);
    REQUIRE(read_file(m / rel) == files[rel]);
    // A file whose data had to change class was moved, all of it.
    if (auto it = placed.find(rel); it != placed.end() && it->second != cls) {
      moves++;
      moved_blocks += (files[rel].size() + 4095) / 4096;
    }
    placed[rel] = cls;
  };
  ::mkdir((m / "db").c_str(), 0755);
  static const char* kExts[] = {".mp4", ".txt", ".mkv", ""};
  for (int i = 0; i < 40; i++) {
    const std::string rel = std::string(i % 3 == 0 ? "db/" : "") + "f" + std::to_string(i) + kExts[rng() % 4];
    files[rel] = random_bytes(rng, rng() % 2 ? 5000 + rng() % 60000 : 70000 + rng() % 900000);
    write_file(m / rel, files[rel]);
  }
  for (const auto& [rel, d] : files) check(rel);
  // plyctl policy test: the same answers, for files that do not exist.
  {
    auto r = ctl(tmp, {"policy", "test", m / "db/new.bin", "1G", "0", "--json"});
    REQUIRE(r.rc == 0);
    const json t = schema_checked("policy test", r.out);
    REQUIRE(t["path"] == "/db/new.bin");
    REQUIRE(t["rule"]["rank"] == 3);
    REQUIRE(t["classes"] == json::array({"fast"}));
    REQUIRE(t["strict"] == true);
    r = ctl(tmp, {"policy", "test", m / "x.MP4", "10K", "--json"});
    REQUIRE(r.rc == 0);
    REQUIRE(schema_checked("policy test", r.out)["classes"] == json::array({"slow", "fast"}));
    r = ctl(tmp, {"policy", "test", m / "big.bin", "10M", "4242"});
    REQUIRE(r.rc == 0);
    REQUIRE(r.out.find("rule 4") != std::string::npos);
    r = ctl(tmp, {"policy", "test", m / "big.bin", "10M", "7"});
    REQUIRE(r.rc == 0);
    REQUIRE(r.out.find("no rule matches") != std::string::npos);
  }
  // Crossing a rule: growth past 64 KiB, a rename into /db or to .mp4, chown.
  std::vector<std::string> names;
  for (const auto& [rel, d] : files) names.push_back(rel);
  for (const auto& rel : names) {
    if (files[rel].size() < 65536 && !rel.ends_with(".mp4") && !rel.ends_with(".mkv")) {
      const std::string more = random_bytes(rng, 100000);
      write_file(m / rel, more, O_APPEND);
      files[rel] += more;
      check(rel);
      break;
    }
  }
  for (const auto& rel : names) {
    if (!rel.starts_with("db/") && files[rel].size() >= 65536 && want(rel, files[rel].size(), 0) == "slow" &&
        !rel.ends_with(".mp4") && !rel.ends_with(".mkv")) {
      // chown to the fast owner, then a rename into /db.
      REQUIRE(::chown((m / rel).c_str(), 4242, 0) == 0);
      owner[rel] = 4242;
      check(rel);
      REQUIRE(::chown((m / rel).c_str(), 0, 0) == 0);
      owner[rel] = 0;
      check(rel);
      const std::string to = "db/moved.bin";
      REQUIRE(::rename((m / rel).c_str(), (m / to).c_str()) == 0);
      files[to] = files[rel];
      files.erase(rel);
      placed[to] = placed[rel];
      check(to);
      const std::string video = "db/moved.mkv";
      REQUIRE(::rename((m / to).c_str(), (m / video).c_str()) == 0);
      files[video] = files[to];
      files.erase(to);
      placed[video] = placed[to];
      check(video);
      break;
    }
  }
  // The mount counts what it moved: each crossing above that changed a
  // file's class (the two chowns and two renames; the growth too unless
  // the file was under /db) moved the whole file once, nothing else moved,
  // and nothing waits once `where` has answered.
  {
    auto r = ctl(tmp, {"policy", "list", m.path(), "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const json l = schema_checked("policy list", r.out);
    REQUIRE(l.contains("migration"));
    INFO(l["migration"].dump());
    INFO(moves << " moves of " << moved_blocks << " blocks expected");
    REQUIRE(moves >= 4);
    CHECK(l["migration"]["files_moved"].get<uint64_t>() == moves);
    CHECK(l["migration"]["moved_bytes"].get<uint64_t>() == moved_blocks * 4096);
    CHECK(l["migration"]["files_failed"] == 0);
    CHECK(l["migration"]["queued"] == 0);
    r = ctl(tmp, {"policy", "list", m.path()});
    REQUIRE(r.rc == 0);
    CHECK(r.out.find("moved since mounted: ") != std::string::npos);
  }
  // Strict: /db fills the fast device, then ENOSPC while the slow one has room.
  {
    // Twice: blocks the first round's generation freed (the migrations'
    // old extents) are free only once it is durable (A2).
    for (int round = 0; round < 2; round++) {
      const int fd = ::open((m / "db/fill").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      REQUIRE(fd >= 0);
      const std::string chunk = random_bytes(rng, round ? 4096 : 1 << 20);
      int err = 0;
      for (int i = 0; i < 40000 && !err; i++)
        if (::write(fd, chunk.data(), chunk.size()) < 0) err = errno;
      if (!err && ::fsync(fd) != 0) err = errno;
      ::close(fd);
      REQUIRE(err == ENOSPC);
      ::sync();
    }
    struct statvfs sv {};
    REQUIRE(::statvfs(m.path().c_str(), &sv) == 0);
    REQUIRE(uint64_t(sv.f_bavail) * sv.f_frsize > (40ull << 20));
    // size<64K goes to fast, but falls back: it lands on slow now.
    write_file(m / "late.txt", random_bytes(rng, 20000));
    const json w = where("late.txt");
    INFO(w.dump());
    REQUIRE(!w["extents"].empty());
    for (const auto& e : w["extents"]) REQUIRE(e["class"] == "slow");
    REQUIRE(::unlink((m / "db/fill").c_str()) == 0);
  }
  // Refusals: one line, conventional status, nothing changed.
  {
    auto r = ctl(tmp, {"policy", "set", m.path(), "to=nowhere"});
    REQUIRE(r.rc == 1);
    REQUIRE(r.err.find("nowhere") != std::string::npos);
    r = ctl(tmp, {"policy", "set", m.path(), "ext=mp4"});
    REQUIRE(r.rc == 2);
    r = ctl(tmp, {"policy", "test", m.path()});
    REQUIRE(r.rc == 2);
    r = ctl(tmp, {"policy", "frobnicate", m.path()});
    REQUIRE(r.rc == 2);
  }
  // A new rule moves nothing by itself; policy apply moves what it covers.
  {
    auto r = ctl(tmp, {"policy", "set", m.path(), "ext=mp4,mkv to=fast"});
    REQUIRE(r.rc == 0);
    std::string video;
    for (const auto& [rel, d] : files)
      if ((rel.ends_with(".mp4") || rel.ends_with(".mkv")) && d.size() > 65536) video = rel;
    REQUIRE(!video.empty());
    const json before = where(video);
    for (const auto& e : before["extents"]) REQUIRE(e["class"] == "slow");
    r = ctl(tmp, {"policy", "apply", m.path(), "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const json a = schema_checked("policy apply", r.out);
    REQUIRE(a["files_moved"].get<uint64_t>() > 0);
    REQUIRE(a["files_failed"] == 0);
    const json after = where(video);
    for (const auto& e : after["extents"]) REQUIRE(e["class"] == "fast");
    r = ctl(tmp, {"policy", "set", m.path(), "ext=mp4,MKV to=slow", "size<64K to=fast", "under=/db to=fast strict",
                  "uid=4242 to=fast"});
    REQUIRE(r.rc == 0);
    r = ctl(tmp, {"policy", "apply", m.path()});
    REQUIRE(r.rc == 0);
    REQUIRE(r.out.find("moved ") == 0);
    for (const auto& [rel, d] : files) check(rel);
  }
  for (const auto& [rel, d] : files) REQUIRE(read_file(m / rel) == d);
  REQUIRE(m.unmount() == 0);
  // Offline: the rules are kept; fsck is clean; a remount reads back every file.
  {
    auto r = ctl(tmp, {"--device", slow, "policy", "list", fast, "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    REQUIRE(schema_checked("policy list", r.out)["rules"].size() == 4);
    REQUIRE_FALSE(json::parse(r.out).contains("migration"));  // a mount's alone
    REQUIRE(run({fsck_bin(), "-n", fast, slow}, tmp / "fsck.log") == 0);
  }
  // An offline import follows the rules too: a video to slow, a large file
  // under /db to fast (strict), mounted on their own to see where they went.
  {
    ::mkdir((tmp / "src").c_str(), 0755);
    ::mkdir((tmp / "src/db").c_str(), 0755);
    write_file(tmp / "src/film.mp4", random_bytes(rng, 300000));
    write_file(tmp / "src/db/big.bin", random_bytes(rng, 300000));
    auto r = ctl(tmp, {"--device", slow, "import", fast, "imported", tmp / "src"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    Mount imp(fast, tmp / "mnt", {"device=" + slow, "branches=imported"});
    imp.start();
    auto cls = [&](const std::string& rel) {
      auto w = ctl(tmp, {"where", imp / rel, "--json"});
      REQUIRE(w.rc == 0);
      const json j = schema_checked("where", w.out);
      std::set<std::string> out;
      for (const auto& e : j["extents"]) out.insert(e["class"].get<std::string>());
      return out;
    };
    REQUIRE(cls("film.mp4") == std::set<std::string>{"slow"});
    REQUIRE(cls("db/big.bin") == std::set<std::string>{"fast"});
    REQUIRE(imp.unmount() == 0);
  }
  Mount again(fast, tmp / "mnt", {"device=" + slow});
  again.start();
  for (const auto& [rel, d] : files) REQUIRE(read_file(again / rel) == d);
  {
    auto r = ctl(tmp, {"policy", "set", again.path()});
    REQUIRE(r.rc == 0);
    REQUIRE(r.out.find("no placement rules") != std::string::npos);
  }
  REQUIRE(again.unmount() == 0);
}

// A staged rule through a mount (format.md#staged-writes): large files are
// written to the fast device first, and the mount moves them to the slow
// one by itself once they have been quiet for its stage delay (5 s), with
// no plyctl where or policy apply to ask it to.
TEST_CASE("multidev-fuse: a staged rule writes to fast and the mount moves the data to slow once quiet",
          "[multidev-fuse]") {
  TempDir tmp;
  const std::string fast = tmp / "fast.img", slow = tmp / "slow.img";
  REQUIRE(mkfs_status(tmp, {"-q", "-s", "128M", "-C", "fast=" + fast, "-C", "slow=" + slow}) == 0);
  std::mt19937_64 rng(0x7374616765ull);
  std::map<std::string, std::string> files;
  uint64_t total = 0;
  {
    Mount m(fast, tmp / "mnt", {"device=" + slow});
    m.start();
    auto r = ctl(tmp, {"policy", "set", m.path(), "size>=64K to=slow stage=fast", "to=fast", "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const json p = schema_checked("policy set", r.out);
    REQUIRE(p["rules"][0]["rule"] == "size>=64K to=slow stage=fast");
    REQUIRE(p["rules"][0]["stage"] == "fast");
    r = ctl(tmp, {"policy", "test", (m / "x.bin"), "1M", "--json"});
    REQUIRE(r.rc == 0);
    const json pt = schema_checked("policy test", r.out);
    REQUIRE(pt["stage"] == "fast");
    REQUIRE(pt["classes"] == json::array({"fast", "slow"}));
    r = ctl(tmp, {"policy", "test", (m / "x.bin"), "1M"});
    REQUIRE(r.out.find("(staged on fast, moved to slow once quiet)") != std::string::npos);
    for (int i = 0; i < 6; i++) {
      const std::string name = "big" + std::to_string(i);
      files[name] = random_bytes(rng, (200 << 10) + rng() % (800 << 10));
      total += files[name].size();
      write_file(m / name, files[name]);
    }
    ::sync();
    // Within the delay: the data is on fast, the files wait.
    {
      const json d = devices(tmp, {"device", "list", m.path(), "--json"});
      INFO(d.dump());
      REQUIRE(d["devices"][0]["data_bytes"].get<uint64_t>() >= total);
    }
    // The mount moves them on its own.
    json mig;
    for (int i = 0; i < 300; i++) {
      auto l = ctl(tmp, {"policy", "list", m.path(), "--json"});
      REQUIRE(l.rc == 0);
      mig = schema_checked("policy list", l.out)["migration"];
      if (mig["queued"] == 0 && mig["files_moved"].get<uint64_t>() >= files.size()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    INFO(mig.dump());
    REQUIRE(mig["queued"] == 0);
    REQUIRE(mig["files_moved"] == files.size());
    REQUIRE(mig["files_failed"] == 0);
    ::sync();
    {
      const json d = devices(tmp, {"device", "list", m.path(), "--json"});
      INFO(d.dump());
      REQUIRE(d["devices"][0]["data_bytes"].get<uint64_t>() < (64u << 10));
      REQUIRE(d["devices"][1]["data_bytes"].get<uint64_t>() >= total);
    }
    for (const auto& [name, d] : files) {
      auto w = ctl(tmp, {"where", m / name, "--json"});
      REQUIRE(w.rc == 0);
      const json wj = schema_checked("where", w.out);
      for (const auto& e : wj["extents"]) REQUIRE(e["class"] == "slow");
      REQUIRE(read_file(m / name) == d);
    }
    REQUIRE(m.unmount() == 0);
  }
  // -o stage_delay: files written under a delay of an hour are still on
  // fast well past the default 5 s; policy apply moves them at once.
  {
    Mount m(fast, tmp / "mnt", {"device=" + slow, "stage_delay=3600"});
    m.start();
    uint64_t late = 0;
    for (int i = 0; i < 2; i++) {
      const std::string name = "late" + std::to_string(i);
      files[name] = random_bytes(rng, 300 << 10);
      late += files[name].size();
      write_file(m / name, files[name]);
    }
    ::sync();
    std::this_thread::sleep_for(std::chrono::milliseconds(6500));
    auto l = ctl(tmp, {"policy", "list", m.path(), "--json"});
    REQUIRE(l.rc == 0);
    const json mig = schema_checked("policy list", l.out)["migration"];
    INFO(mig.dump());
    REQUIRE(mig["queued"] == 2);
    REQUIRE(mig["files_moved"] == 0);
    REQUIRE(devices(tmp, {"device", "list", m.path(), "--json"})["devices"][0]["data_bytes"].get<uint64_t>() >= late);
    auto r = ctl(tmp, {"policy", "apply", m.path(), "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    ::sync();
    REQUIRE(devices(tmp, {"device", "list", m.path(), "--json"})["devices"][0]["data_bytes"].get<uint64_t>() < (64u << 10));
    REQUIRE(m.unmount() == 0);
  }
  require_volume_holds(tmp, {fast, slow}, files);
}

// plyctl device add (format.md#device-add) on an unmounted volume: a third
// image joins the slow class, the volume mounts with it, new data reaches
// it, every old byte reads back, fsck is clean with the three; refusals.
TEST_CASE("multidev-fuse: a device added offline takes data of its class", "[multidev-fuse]") {
  TempDir tmp;
  const std::string fast = tmp / "fast.img", slow = tmp / "slow.img", more = tmp / "more.img";
  REQUIRE(mkfs_status(tmp, {"-q", "-s", "64M", "-C", "fast=" + fast, "-C", "slow=" + slow}) == 0);
  std::map<std::string, std::string> files;
  std::mt19937_64 rng(0x616464ull);
  {
    Mount m(fast, tmp / "mnt", {"device=" + slow});
    m.start();
    for (int i = 0; i < 8; i++) {
      files["a" + std::to_string(i)] = random_bytes(rng, 3 << 20);
      write_file(m / ("a" + std::to_string(i)), files["a" + std::to_string(i)]);
    }
    REQUIRE(m.unmount() == 0);
  }
  blank_image(more, 96 << 20);
  auto r = ctl(tmp, {"--device", slow, "device", "add", fast, more, "--class", "slow", "--json"});
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const json d = schema_checked("device list", r.out);
  REQUIRE(d["devices"].size() == 3);
  REQUIRE(d["devices"][2]["class"] == "slow");
  REQUIRE(d["devices"][2]["path"].get<std::string>().ends_with("/more.img"));
  // Again: it is a device of the volume already.
  r = ctl(tmp, {"--device", slow, "--device", more, "device", "add", fast, more});
  REQUIRE(r.rc == 2);
  REQUIRE(r.err.find("already") != std::string::npos);
  // Without it, the volume is refused (a device is missing).
  std::string out;
  REQUIRE(refused_mount(tmp, fast, {"device=" + slow}, out) != 0);
  REQUIRE(out.find("missing") != std::string::npos);
  {
    Mount m(fast, tmp / "mnt", {"device=" + tmp.path()});
    m.start();
    for (const auto& [name, data] : files) REQUIRE(read_file(m / name) == data);
    // 120 MiB more: past what the first slow device has left.
    for (int i = 0; i < 30; i++) {
      const std::string name = "b" + std::to_string(i);
      files[name] = random_bytes(rng, 4 << 20);
      write_file(m / name, files[name]);
    }
    bool on_new = false;
    for (int i = 0; i < 30 && !on_new; i++) {
      auto w = ctl(tmp, {"where", m / ("b" + std::to_string(i)), "--json"});
      REQUIRE(w.rc == 0);
      const json wj = schema_checked("where", w.out);
      for (const auto& e : wj["extents"]) on_new = on_new || e["device"] == 2;
    }
    REQUIRE(on_new);
    for (const auto& [name, data] : files) REQUIRE(read_file(m / name) == data);
    REQUIRE(m.unmount() == 0);
  }
  REQUIRE(run({fsck_bin(), "-n", fast, slow, more}, tmp / "fsck.log") == 0);
}

// A volume made with one device takes a second (format.md#device-convert),
// offline with the first device's class named: refusals that change
// nothing first; files read back, new data goes to the new device (the
// slowest class), fsck is clean; and the first device can then leave,
// leaving a volume on the new image alone.
TEST_CASE("multidev-fuse: a volume of one device takes a second offline, and the first can leave",
          "[multidev-fuse]") {
  TempDir tmp;
  const std::string one = tmp / "one.img", more = tmp / "more.img";
  REQUIRE(mkfs_status(tmp, {"-q", "-s", "64M", one}) == 0);
  blank_image(more, 128 << 20);
  std::map<std::string, std::string> files;
  std::mt19937_64 rng(0x636f6e76ull);
  {
    Mount m(one, tmp / "mnt");
    m.start();
    ::mkdir((m / "d").c_str(), 0755);
    for (int i = 0; i < 6; i++) {
      files["d/a" + std::to_string(i)] = random_bytes(rng, 1 << 20);
      write_file(m / ("d/a" + std::to_string(i)), files["d/a" + std::to_string(i)]);
    }
    REQUIRE(m.unmount() == 0);
  }
  // Refused before anything changes: a bad class, a device too small, itself.
  auto r = ctl(tmp, {"device", "add", one, more, "--first-class", "Fast"});
  REQUIRE(r.rc == 2);
  const std::string tiny = tmp / "tiny.img";
  blank_image(tiny, 64 << 10);
  r = ctl(tmp, {"device", "add", one, tiny});
  REQUIRE(r.rc != 0);
  REQUIRE(r.err.find("too small") != std::string::npos);
  r = ctl(tmp, {"device", "add", one, one});
  REQUIRE(r.rc != 0);
  r = ctl(tmp, {"device", "list", one, "--json"});
  REQUIRE(r.rc == 0);
  json d = schema_checked("device list", r.out);
  REQUIRE(d["classes"].empty());
  // The one device named by its absolute path, as a mount lists it.
  REQUIRE(d["devices"][0]["path"] == one);
  {
    Mount m(one, tmp / "mnt");
    m.start();
    r = ctl(tmp, {"device", "list", m.path(), "--json"});
    REQUIRE(r.rc == 0);
    REQUIRE(schema_checked("device list", r.out) == d);
    REQUIRE(m.unmount() == 0);
  }
  {
    // Mounted read-only by a relative path (the daemon leaves its working
    // directory): still the absolute path; an add is refused, EROFS.
    const std::string ro = tmp / "ro";
    REQUIRE(::mkdir(ro.c_str(), 0755) == 0);
    const std::string cmd = "cd '" + tmp.path() + "' && '" + plyfs_bin() + "' one.img ro -o ro";
    REQUIRE(std::system(cmd.c_str()) == 0);
    r = ctl(tmp, {"device", "list", ro, "--json"});
    auto added = ctl(tmp, {"device", "add", ro, more});
    const int umounted = std::system(("umount '" + ro + "'").c_str());
    REQUIRE(r.rc == 0);
    REQUIRE(umounted == 0);
    REQUIRE(schema_checked("device list", r.out) == d);
    REQUIRE(added.rc == 1);
    REQUIRE(added.err.find("read-only") != std::string::npos);
  }
  // The add.
  r = ctl(tmp, {"device", "add", one, more, "--first-class", "fast", "--class", "slow", "--json"});
  INFO(r.err);
  REQUIRE(r.rc == 0);
  d = schema_checked("device list", r.out);
  REQUIRE(d["classes"] == json::array({"fast", "slow"}));
  REQUIRE(d["devices"].size() == 2);
  REQUIRE(d["devices"][0]["class"] == "fast");
  REQUIRE(d["devices"][1]["class"] == "slow");
  REQUIRE(d["devices"][1]["path"].get<std::string>().ends_with("/more.img"));
  // --first-class means nothing to a volume of several devices.
  r = ctl(tmp, {"--device", more, "device", "add", one, tiny, "--first-class", "x"});
  REQUIRE(r.rc == 2);
  REQUIRE(run({fsck_bin(), "-n", one, more}, tmp / "fsck.log") == 0);
  {
    Mount m(one, tmp / "mnt", {"device=" + more});
    m.start();
    for (const auto& [name, data] : files) REQUIRE(read_file(m / name) == data);
    files["big"] = random_bytes(rng, 8 << 20);
    write_file(m / "big", files["big"]);
    ::sync();
    auto w = ctl(tmp, {"where", m / "big", "--json"});
    REQUIRE(w.rc == 0);
    const json wj = schema_checked("where", w.out);
    REQUIRE(!wj["extents"].empty());
    for (const auto& e : wj["extents"]) REQUIRE(e["device"] == 1);
    // The first device leaves: its blocks move to the new one.
    r = ctl(tmp, {"device", "remove", m.path(), "0"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    for (const auto& [name, data] : files) REQUIRE(read_file(m / name) == data);
    // The metadata class (fast) has no device left: metadata now goes to the
    // slow device, which holds it, and the listing says so.
    r = ctl(tmp, {"device", "list", m.path(), "--json"});
    REQUIRE(r.rc == 0);
    d = schema_checked("device list", r.out);
    REQUIRE(d["devices"].size() == 1);
    REQUIRE(d["devices"][0]["class"] == "slow");
    REQUIRE(d["devices"][0]["metadata_bytes"].get<uint64_t>() > 0);
    REQUIRE(d["devices"][0]["metadata"] == true);
    REQUIRE(m.unmount() == 0);
  }
  // The volume is the new image alone now.
  require_volume_holds(tmp, {more}, files);
}

// The same on a mount, while a writer rewrites files and reads others
// back: the daemon's volume of one device (held as a set of it alone)
// takes the second; the mount goes on, new data lands on it, the mount's
// online resize is then refused (a volume of several devices grows by a
// device), and after the unmount the volume needs both images and fscks
// clean. Before the add, the mount grows its image online as a volume of
// one device does.
TEST_CASE("multidev-fuse: a mounted volume of one device takes a second while files are written",
          "[multidev-fuse]") {
  TempDir tmp;
  const std::string one = tmp / "one.img", more = tmp / "more.img";
  REQUIRE(mkfs_status(tmp, {"-q", "-s", "48M", one}) == 0);
  blank_image(more, 96 << 20);
  std::map<std::string, std::string> files;
  std::mt19937_64 rng(0x6f6e6cull);
  {
    Mount m(one, tmp / "mnt");
    m.start();
    auto r = ctl(tmp, {"resize", m.path(), "64M"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    struct stat st{};
    REQUIRE(::stat(one.c_str(), &st) == 0);
    REQUIRE(st.st_size == 64 << 20);
    for (int i = 0; i < 8; i++) {
      const std::string name = "a" + std::to_string(i);
      files[name] = random_bytes(rng, (1 + rng() % 3) << 20);
      write_file(m / name, files[name]);
    }
    Writer writer(m, files, "a", 8, 11);
    writer.start();
    r = ctl(tmp, {"device", "add", m.path(), more, "--first-class", "fast", "--class", "slow", "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    json d = schema_checked("device add", r.out);
    REQUIRE(d["classes"] == json::array({"fast", "slow"}));
    REQUIRE(d["devices"].size() == 2);
    REQUIRE(d["devices"][0]["path"].get<std::string>().ends_with("/one.img"));
    REQUIRE(d["devices"][0]["size_bytes"] == 64 << 20);
    REQUIRE(d["devices"][1]["path"].get<std::string>().ends_with("/more.img"));
    REQUIRE(d["devices"][1]["class"] == "slow");
    // Once more: a device of the volume already.
    r = ctl(tmp, {"device", "add", m.path(), more});
    REQUIRE(r.rc == 2);
    REQUIRE(r.err.find("already") != std::string::npos);
    writer.finish();
    INFO("writer rounds " << writer.rounds.load());
    REQUIRE(writer.bad == 0);
    files["big"] = random_bytes(rng, 8 << 20);
    write_file(m / "big", files["big"]);
    ::sync();
    auto w = ctl(tmp, {"where", m / "big", "--json"});
    REQUIRE(w.rc == 0);
    const json wj = schema_checked("where", w.out);
    REQUIRE(!wj["extents"].empty());
    for (const auto& e : wj["extents"]) REQUIRE(e["device"] == 1);
    r = ctl(tmp, {"resize", m.path(), "80M"});
    REQUIRE(r.rc != 0);
    for (const auto& [name, data] : writer.written) files[name] = data;
    for (const auto& [name, data] : files) REQUIRE(read_file(m / name) == data);
    REQUIRE(m.unmount() == 0);
  }
  std::string out;
  REQUIRE(refused_mount(tmp, one, {}, out) != 0);
  REQUIRE(out.find("missing") != std::string::npos);
  require_volume_holds(tmp, {one, more}, files);
}

// A volume of one device moves to another image by `device replace`,
// mounted and then offline (format.md#device-convert): each time the
// volume becomes one of several, takes the new image (class main) and lets
// the old one go (wiped); every byte reads back from the new image alone.
// `device remove` of its only device is refused.
TEST_CASE("multidev-fuse: a volume of one device moves to another image by device replace", "[multidev-fuse]") {
  TempDir tmp;
  const std::string one = tmp / "one.img", two = tmp / "two.img", three = tmp / "three.img";
  REQUIRE(mkfs_status(tmp, {"-q", "-s", "48M", one}) == 0);
  for (const std::string& p : {two, three}) blank_image(p, 64 << 20);
  std::map<std::string, std::string> files;
  std::mt19937_64 rng(0x72706cull);
  auto r = ctl(tmp, {"device", "remove", one, "0"});
  REQUIRE(r.rc == 2);
  r = ctl(tmp, {"device", "replace", one, "1", two});
  REQUIRE(r.rc == 2);
  {
    Mount m(one, tmp / "mnt");
    m.start();
    for (int i = 0; i < 6; i++) {
      files["f" + std::to_string(i)] = random_bytes(rng, (1 + rng() % 4) << 20);
      write_file(m / ("f" + std::to_string(i)), files["f" + std::to_string(i)]);
    }
    r = ctl(tmp, {"device", "replace", m.path(), "0", two, "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    const json d = schema_checked("device replace", r.out);
    REQUIRE(d["devices"].size() == 1);
    REQUIRE(d["devices"][0]["path"].get<std::string>().ends_with("/two.img"));
    REQUIRE(d["devices"][0]["class"] == "main");
    REQUIRE(d["moved_bytes"].get<uint64_t>() >= (6ull << 20));
    for (const auto& [name, data] : files) REQUIRE(read_file(m / name) == data);
    REQUIRE(m.unmount() == 0);
  }
  r = ctl(tmp, {"device", "list", one});
  REQUIRE(r.rc != 0);  // wiped
  require_volume_holds(tmp, {two}, files);
  // Offline, another volume of one device, its device named by its path.
  const std::string four = tmp / "four.img";
  REQUIRE(mkfs_status(tmp, {"-q", "-s", "48M", four}) == 0);
  std::map<std::string, std::string> more;
  {
    Mount m(four, tmp / "mnt");
    m.start();
    for (int i = 0; i < 4; i++) {
      more["g" + std::to_string(i)] = random_bytes(rng, (1 + rng() % 4) << 20);
      write_file(m / ("g" + std::to_string(i)), more["g" + std::to_string(i)]);
    }
    REQUIRE(m.unmount() == 0);
  }
  r = ctl(tmp, {"device", "replace", four, four, three});
  INFO(r.err);
  REQUIRE(r.rc == 0);
  REQUIRE(r.out.find("replaced") != std::string::npos);
  r = ctl(tmp, {"device", "list", four});
  REQUIRE(r.rc != 0);  // wiped
  require_volume_holds(tmp, {three}, more);
}

// plyctl device add|remove|replace on a mounted volume (format.md#device-add,
// format.md#device-remove) while a writer keeps writing and reading: a third
// image joins, the slow image leaves (its blocks moved, the image wiped),
// the fast one is replaced by a new one (device 0 goes: metadata moves).
// Every byte reads back, the volume mounts from the two images it has now,
// fsck is clean; offline, a removal that does not fit is refused and one
// that does moves the data back; refusals in one line.
TEST_CASE("multidev-fuse: devices added, removed and replaced under a mount while files are written",
          "[multidev-fuse]") {
  TempDir tmp;
  const std::string fast = tmp / "fast.img", slow = tmp / "slow.img", more = tmp / "more.img",
                    fast2 = tmp / "fast2.img";
  REQUIRE(mkfs_status(tmp, {"-q", "-s", "48M", "-C", "fast=" + fast, "-C", "slow=" + slow}) == 0);
  for (const std::string& p : {more, fast2}) blank_image(p, p == more ? 96 << 20 : 24 << 20);
  std::map<std::string, std::string> files;
  std::mt19937_64 rng(0x72656dull);
  {
    Mount m(fast, tmp / "mnt", {"device=" + slow});
    m.start();
    for (int i = 0; i < 12; i++) {
      const std::string name = "a" + std::to_string(i);
      files[name] = random_bytes(rng, (1 + rng() % 3) << 20);
      write_file(m / name, files[name]);
    }
    // The writer: rewrites its own files and reads the others back.
    Writer writer(m, files, "a", 12, 7);
    writer.start();
    auto r = ctl(tmp, {"device", "add", m.path(), more, "--class", "slow", "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    json d = schema_checked("device add", r.out);
    REQUIRE(d["devices"].size() == 3);
    REQUIRE(d["devices"][2]["path"].get<std::string>().ends_with("/more.img"));
    // Remove the slow image by its path: its data moves to the others.
    r = ctl(tmp, {"device", "remove", m.path(), slow, "--json"});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    d = schema_checked("device remove", r.out);
    REQUIRE(d["devices"].size() == 2);
    REQUIRE(d["moved_bytes"].get<uint64_t>() >= (8ull << 20));
    for (const auto& e : d["devices"]) REQUIRE(!e["path"].get<std::string>().ends_with("/slow.img"));
    // Replace the fast image (device 0, all the metadata) by a new one: by index.
    r = ctl(tmp, {"device", "replace", m.path(), "0", fast2});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    REQUIRE(r.out.find("replaced") != std::string::npos);
    d = devices(tmp, {"device", "list", m.path(), "--json"});
    REQUIRE(d["devices"].size() == 2);
    REQUIRE(d["devices"][0]["path"].get<std::string>().ends_with("/more.img"));
    REQUIRE(d["devices"][1]["path"].get<std::string>().ends_with("/fast2.img"));
    REQUIRE(d["devices"][1]["class"] == "fast");
    REQUIRE(d["devices"][1]["metadata_bytes"].get<uint64_t>() > 0);
    // Refusals, in one line: a device the volume lacks, a member named to add.
    r = ctl(tmp, {"device", "remove", m.path(), "7"});
    REQUIRE(r.rc == 2);
    REQUIRE(r.err.find("not a device of the volume") != std::string::npos);
    r = ctl(tmp, {"device", "add", m.path(), more});
    REQUIRE(r.rc == 2);
    REQUIRE(r.err.find("already") != std::string::npos);
    writer.finish();
    INFO("writer rounds " << writer.rounds.load());
    REQUIRE(writer.bad.load() == 0);
    REQUIRE(writer.rounds.load() >= 4);
    for (const auto& [name, data] : writer.written) files[name] = data;
    for (const auto& [name, data] : files) REQUIRE(read_file(m / name) == data);
    REQUIRE(m.unmount() == 0);
  }
  // The images that left are wiped: nothing of the volume on them.
  for (const std::string& gone : {fast, slow}) {
    auto r = ctl(tmp, {"device", "list", gone});
    REQUIRE(r.rc != 0);
  }
  REQUIRE(run({fsck_bin(), "-n", more, fast2}, tmp / "fsck.log") == 0);
  // Named again (an fstab line not yet edited): refused, saying to leave it out.
  REQUIRE(run({fsck_bin(), "-n", more, fast2, slow}, tmp / "fsck-gone.log") == 8);
  REQUIRE(slurp(tmp / "fsck-gone.log").find("removed from its volume: leave it out") != std::string::npos);
  {
    Mount m(fast2, tmp / "mnt", {"device=" + tmp.path()});
    m.start();
    for (const auto& [name, data] : files) REQUIRE(read_file(m / name) == data);
    REQUIRE(m.unmount() == 0);
  }
  // Offline: more.img holds more than fast2.img could take: refused, nothing
  // changed; with slow.img added back (as a new device), it goes.
  auto r = ctl(tmp, {"--device", fast2, "device", "remove", more, more});
  REQUIRE(r.rc == 1);
  REQUIRE(r.err.find("cannot remove") != std::string::npos);
  r = ctl(tmp, {"--device", fast2, "device", "add", more, slow, "--class", "slow"});
  INFO(r.err);
  REQUIRE(r.rc == 0);
  r = ctl(tmp, {"--device", fast2, "--device", slow, "device", "remove", more, more, "--json"});
  INFO(r.err);
  REQUIRE(r.rc == 0);
  json d = schema_checked("device remove", r.out);
  REQUIRE(d["devices"].size() == 2);
  require_volume_holds(tmp, {slow, fast2}, files);
}
