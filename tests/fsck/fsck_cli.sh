#!/bin/bash
# fsck.plyfs and plyctl as a user runs them: options, exit codes (fsck(8)),
# messages, --json, damage made with plyctl debug corrupt, fsck -t plyfs.
# Usage: fsck_cli.sh MKFS FSCK PLYCTL
set -euo pipefail

MKFS=$1
FSCK=$2
CTL=$3
T=$(mktemp -d "${TMPDIR:-/tmp}/fsck_cli.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$T"' EXIT

fails=0
check() {  # check "what" command...
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
# run PROG ARGS...: exit status in $rc, stdout in $T/out, stderr in $T/err.
run() {
  set +e
  "$@" >"$T/out" 2>"$T/err"
  rc=$?
  set -e
}
rc_is() { [[ $rc -eq $1 ]] || { echo "  exit status $rc, expected $1"; cat "$T/out" "$T/err"; return 1; }; }
out_has() { grep -q -- "$1" "$T/out" || { echo "  stdout lacks '$1':"; cat "$T/out"; return 1; }; }
err_has() { grep -q -- "$1" "$T/err" || { echo "  stderr lacks '$1':"; cat "$T/err"; return 1; }; }
sum() { sha256sum "$1" | cut -d' ' -f1; }
fresh() { rm -f "$1"; "$MKFS" -q -s 32M "$1"; }
json_field() { python3 -c "import json,sys; print(json.load(open('$T/out'))['$1'])"; }

IMG=$T/img
fresh "$IMG"

# --- usage (exit 16), and what is not a plyfs filesystem (exit 8)
run "$FSCK"
check "no device: usage error 16" rc_is 16
run "$FSCK" -n -y "$IMG"
check "-n with -y: usage error 16" rc_is 16
run "$FSCK" -x "$IMG"
check "unknown option: 16" rc_is 16
# Several devices are a multi-device volume's (format.md#multi-device): a
# single-device image with another is an operational error, said in one line.
run "$FSCK" "$IMG" "$IMG"
check "a second device for a single-device image: 8" rc_is 8
check "... said in one line" grep -q "not a device of a multi-device" "$T/err"
run "$FSCK" -h
check "-h exits 0" rc_is 0
run "$FSCK" -V
check "-V exits 0" rc_is 0
run "$FSCK" "$T/missing"
check "a missing image: operational error 8" rc_is 8
truncate -s 32M "$T/zeros"
run "$FSCK" "$T/zeros"
check "not plyfs: 8" rc_is 8
check "... says so" err_has "no plyfs filesystem found"

# --- a clean image
run "$FSCK" "$IMG"
check "a fresh image is clean (0)" rc_is 0
check "... and says clean" out_has "clean"
run "$FSCK" -f -C 0 -v "$IMG"
check "-f -C 0 -v: clean" rc_is 0
check "-C 0 draws the passes on standard output" out_has ": pass 2, metadata blocks, B-trees and space: 0 / 3 blocks (0%)"
check "... on a line that rewrites itself" grep -q $'\r' "$T/out"
run "$FSCK" -C0 "$IMG"
check "-C0 (fsck(8)'s spelling) is -C 0" rc_is 0
run "$FSCK" -C0 --json "$IMG"
check "-C0 --json: the report alone on standard output" test "$(json_field exit_code)" = 0
check "... the progress line on standard error" err_has ": pass 2, metadata blocks"
run "$FSCK" -C 1 "$IMG"
check "-C 1: e2fsck's lines \"PASS DONE TOTAL DEVICE\" on descriptor 1" \
  grep -qE "^2 [0-9]+ [0-9]+ $IMG\$" "$T/out"
check "... pass 1 starts at 0 of 2 blocks" grep -qx "1 0 2 $IMG" "$T/out"
run "$FSCK" -C 7 "$IMG" 7>"$T/progress"
check "-C 7: the lines go to descriptor 7" grep -qE "^2 [0-9]+ [0-9]+ $IMG\$" "$T/progress"
check "... and the report to standard output" out_has "clean"
run "$FSCK" -C 9 "$IMG"
check "-C on a closed descriptor: 8" rc_is 8
check "... says so in one line" err_has "^fsck.plyfs: -C 9: cannot write progress there: Bad file descriptor\$"
run "$FSCK" -C-1 "$IMG"
check "-C-1 (fsck(8): another checker has the bar): no progress" rc_is 0
check "... nothing but the report" test "$(grep -c . "$T/out")" = 2
run "$FSCK" -C
check "-C without a descriptor: usage error 16" rc_is 16
check "... says what -C takes" err_has "option -C needs a file descriptor"
run "$FSCK" -C x "$IMG"
check "-C x: usage error 16" rc_is 16
run "$FSCK" -n "$IMG"
check "no progress on a pipe without -C" test "$(grep -c . "$T/out")" = 2
run "$FSCK" --json "$IMG"
check "--json: clean" rc_is 0
check "--json is JSON with exit_code 0" test "$(json_field exit_code)" = 0
check "--json has no problems" test "$(json_field problems)" = "[]"
before=$(sum "$IMG")
run "$FSCK" -p "$IMG"
check "-p on a clean image: 0" rc_is 0
run "$FSCK" -y "$IMG"
check "-y on a clean image: 0" rc_is 0
check "... and writes nothing" test "$(sum "$IMG")" = "$before"

# --- plyctl
run "$CTL" show "$IMG"
check "plyctl show" rc_is 0
check "plyctl show: generation" out_has "Generation   3"
run "$CTL" show "$IMG" --json
check "plyctl show --json" test "$(json_field generation)" = 3
run "$CTL" debug fields node
check "plyctl debug fields node" out_has "nitems"
run "$CTL" debug tree "$IMG" space
check "plyctl debug tree space" rc_is 0
run "$CTL" debug corrupt "$IMG" nosuch 1 refs --zero
check "plyctl: unknown structure is a usage error (2)" rc_is 2
run "$CTL" debug corrupt "$IMG" space-item 48 nosuch --zero
check "plyctl: unknown field fails (1)" rc_is 1
check "... and names it" err_has "nosuch"
run "$CTL" frobnicate
check "plyctl: unknown command (2)" rc_is 2
check "plyctl refused changes nothing" test "$(sum "$IMG")" = "$before"

# --- a leak: reference count too high. -n reports, -p repairs, -n is clean.
SPACE_NODE=$("$CTL" debug tree "$IMG" space | awk '/^node/ {print $2; exit}')
run "$CTL" debug corrupt "$IMG" space-item "$SPACE_NODE" refs --add 1
check "damage a reference count" rc_is 0
before=$(sum "$IMG")
run "$FSCK" -n "$IMG"
check "-n reports it (4)" rc_is 4
check "... as A3-refs-high" out_has "A3-refs-high"
check "-n changed nothing" test "$(sum "$IMG")" = "$before"
run "$FSCK" -p "$IMG"
check "-p repairs it (1)" rc_is 1
check "... and says so" out_has "corrected"
run "$FSCK" -n "$IMG"
check "then clean (0)" rc_is 0

# --- a damaged superblock copy: -p rewrites it.
gen=$("$CTL" show "$IMG" --json | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['generation'])")
other=$(( (gen + 1) % 2 ))
run "$CTL" debug corrupt "$IMG" superblock $other checksum --flip 3 --keep-checksum
run "$FSCK" -v "$IMG"
check "a copy with a bad checksum is what a cut-short commit leaves (0)" rc_is 0
check "... noted" out_has "S-cut-short"
run "$CTL" debug corrupt "$IMG" superblock $other block_size --set 3000
run "$FSCK" "$IMG"
check "a copy with a right checksum but a wrong field: 4" rc_is 4
check "... S-slot" out_has "S-slot"
run "$FSCK" -p "$IMG"
check "-p rewrites it (1)" rc_is 1
run "$FSCK" "$IMG"
check "then clean" rc_is 0

# --- a torn copy, as a crash during a superblock write leaves it: no error.
gen=$("$CTL" show "$IMG" --json | python3 -c "import json,sys; print(json.load(sys.stdin)['generation'])")
other=$(( (gen + 1) % 2 ))
run "$CTL" debug corrupt "$IMG" superblock $other stamp.5 --set $((gen - 3)) --keep-checksum
run "$FSCK" -v "$IMG"
check "a torn copy is not an error (0)" rc_is 0
check "... it is noted" out_has "S-cut-short"

# --- an unreadable node: preen refuses (data would be lost), -y repairs.
fresh "$IMG"
root=$("$CTL" debug tree "$IMG" root | sed -n 's/^ *node \([0-9]*\).*/\1/p' | head -1)
run "$CTL" debug corrupt "$IMG" node "$root" nitems --set 9999
check "damage the root tree's node" rc_is 0
run "$FSCK" -p "$IMG"
check "-p refuses a lossy repair (4)" rc_is 4
check "... and says to run -y" out_has "RUN fsck.plyfs -y MANUALLY"
run "$FSCK" -y "$IMG"
check "-y repairs (1)" rc_is 1
run "$FSCK" "$IMG"
check "then clean" rc_is 0

# --- in use by another plyfs program (the lock a mount holds): 8
fresh "$IMG"
if command -v flock >/dev/null; then
  flock -x "$IMG" sleep 30 &
  sleep 0.3
  run "$FSCK" "$IMG"
  check "an image in use: 8" rc_is 8
  check "... says it is in use" err_has "in use"
  kill %1 2>/dev/null || true
  wait 2>/dev/null || true
fi

# --- through fsck(8)
if command -v fsck >/dev/null; then
  fresh "$T/img2"
  set +e
  PATH="$(dirname "$FSCK"):$PATH" fsck -t plyfs -n "$T/img2" >"$T/out" 2>"$T/err"
  rc=$?
  set -e
  check "fsck -t plyfs runs fsck.plyfs (0)" rc_is 0
  check "... and prints its report" out_has "clean"
fi

# --- SIGINT: exit 32, nothing changed. fsck's standard output is a pipe
# filled to the brim, so it blocks in its first progress line; the signal
# arrives there (after its handler is installed: /proc says it is in
# write(2) on fd 1), and it stops at the next check between passes.
fresh "$T/img3"
before=$(sum "$T/img3")
set +e
python3 - "$FSCK" "$T/img3" >"$T/out" 2>"$T/err" <<'PY'
import fcntl, os, signal, subprocess, sys, time
fsck, img = sys.argv[1], sys.argv[2]
r, w = os.pipe()
fcntl.fcntl(w, fcntl.F_SETFL, os.O_NONBLOCK)
for chunk in (b"x" * 4096, b"x"):
    try:
        while True:
            os.write(w, chunk)
    except BlockingIOError:
        pass
fcntl.fcntl(w, fcntl.F_SETFL, 0)
p = subprocess.Popen([fsck, "-n", "-f", "-C", "1", img], stdout=w, stderr=subprocess.DEVNULL)
os.close(w)
deadline = time.time() + 60
while time.time() < deadline:
    try:
        call = open(f"/proc/{p.pid}/syscall").read().split()
    except OSError:
        call = []
    if len(call) > 1 and call[0] == "1" and int(call[1], 16) == 1:  # write(1, ...)
        break
    time.sleep(0.01)
else:
    sys.exit("fsck never blocked writing its progress")
p.send_signal(signal.SIGINT)
time.sleep(0.2)
out = b""
while True:
    b = os.read(r, 1 << 16)
    if not b:
        break
    out += b
print(p.wait())
print(out.replace(b"x", b"").decode())
PY
set -e
check "SIGINT: exit 32" grep -qx 32 <(head -1 "$T/out")
check "... says it was cancelled" out_has "cancelled; nothing was changed"
check "... and changed nothing" test "$(sum "$T/img3")" = "$before"

if [[ $fails -ne 0 ]]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"
