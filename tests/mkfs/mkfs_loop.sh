#!/bin/bash
# mkfs.plyfs on loop block devices. Needs root and loop devices; exits 77
# (skipped) without them and says why.
# Usage: mkfs_loop.sh MKFS SUPER_DUMP
set -euo pipefail

MKFS=$1
DUMP=$2

if [[ $(id -u) -ne 0 ]]; then
  echo "skipped: needs root for loop devices"
  exit 77
fi
for tool in losetup mkfs.ext4 blkid mount umount; do
  if ! command -v $tool >/dev/null; then
    echo "skipped: $tool not found"
    exit 77
  fi
done

T=$(mktemp -d "${TMPDIR:-/tmp}/mkfs_loop.XXXXXX")
LOOPS=()
MNT=$T/mnt
cleanup() {
  mountpoint -q "$MNT" 2>/dev/null && umount "$MNT"
  for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT

# attach VAR FILE [losetup options]: sets VAR to a new loop device over FILE.
# Not called in $(...): the subshell would lose LOOPS, and the trap with it.
attach() {
  local var=$1 f=$2; shift 2
  local dev
  if ! dev=$(losetup -f --show "$@" "$f" 2>"$T/losetup.err"); then
    echo "skipped: losetup failed: $(cat "$T/losetup.err")"
    exit 77
  fi
  LOOPS+=("$dev")
  printf -v "$var" %s "$dev"
}

fails=0
check() {  # check "what" command...: the command must succeed
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
run() {  # exit status in $rc, output in $T/out and $T/err
  set +e
  "$MKFS" "$@" >"$T/out" 2>"$T/err"
  rc=$?
  set -e
}
one_line_error() {  # exit 1, one line "mkfs.plyfs: ..." containing $1
  [[ $rc -eq 1 ]] || { echo "  exit status $rc, expected 1"; return 1; }
  [[ $(wc -l <"$T/err") -eq 1 ]] || { echo "  stderr is not one line:"; cat "$T/err"; return 1; }
  grep -q '^mkfs.plyfs: ' "$T/err" || { echo "  stderr lacks the prefix:"; cat "$T/err"; return 1; }
  sed 's/^mkfs.plyfs: //' "$T/err" | grep -qi -- "$1" ||
    { echo "  stderr lacks '$1':"; cat "$T/err"; return 1; }
}
is_dump() {  # is_dump DEVICE KEY VALUE
  local v; v=$("$DUMP" "$1" | sed -n "s/^$2=//p") || return 1
  [[ $v == "$3" ]] || { echo "  $2=$v, expected $3"; return 1; }
}
fs_type() { blkid -p -o value -s TYPE "$1" || true; }

truncate -s 64M "$T/disk"
attach L "$T/disk"
echo "using $L"

# --- a block device
run -L loopfs "$L"
check "format $L" test $rc -eq 0
check "read back through the device: generation 3" is_dump "$L" generation 3
check "slot 0 valid" is_dump "$L" slot0 valid
check "slot 1 valid" is_dump "$L" slot1 valid
check "the whole device: 16384 blocks" is_dump "$L" total_blocks 16384
check "label" is_dump "$L" label loopfs
check "the backing file holds it too" is_dump "$T/disk" label loopfs
run "$L"
check "plyfs on the device refused without -f" one_line_error "contains a plyfs file system"

# --- -s may shrink the filesystem, never exceed the device
run -f -s 128M "$L"
check "-s larger than the device refused" one_line_error "larger than the device"
check "... and the old filesystem is intact" is_dump "$L" label loopfs
run -f -s 32M "$L"
check "-s smaller than the device" is_dump "$L" total_blocks 8192
check "the device keeps its size" test "$(blockdev --getsize64 "$L")" -eq $((64 << 20))

# --- an ext4 filesystem on the device
mkfs.ext4 -q -F -L data "$L" >/dev/null
run "$L"
check "ext4 refused without -f" one_line_error "contains an ext4 file system"
check "refusal names the label" grep -q "'data'" "$T/err"
check "ext4 still there" test "$(fs_type "$L")" = ext4
run -f -q "$L"
check "ext4 overwritten with -f" test $rc -eq 0
check "blkid no longer sees ext4" test -z "$(fs_type "$L")"
check "plyfs after ext4" is_dump "$L" generation 3

# --- mounted: refused even with -f, and nothing is wiped
mkfs.ext4 -q -F "$L" >/dev/null
mkdir -p "$MNT"
if mount "$L" "$MNT" 2>"$T/mount.err"; then
  run -f "$L"
  check "a mounted device is refused" one_line_error busy
  check "the mounted ext4 keeps its signature" test "$(fs_type "$L")" = ext4
  run -n -f "$L"
  check "-n refuses a mounted device as a real run would" one_line_error busy
  umount "$MNT"
  run -f -q "$L"
  check "after umount it formats" test $rc -eq 0
else
  echo "FAIL cannot mount ext4 on $L: $(cat "$T/mount.err")"
  fails=$((fails + 1))
fi

# --- 4096-byte logical sectors
truncate -s 64M "$T/disk4k"
attach L4 "$T/disk4k" --sector-size 4096
check "$L4 has 4096-byte sectors" test "$(blockdev --getss "$L4")" -eq 4096
run -q "$L4"
check "format a 4k-sector device" test $rc -eq 0
check "4k: generation 3" is_dump "$L4" generation 3
check "4k: sector size recorded" is_dump "$L4" sector_size 4096
check "4k: both slots valid" is_dump "$L4" slot1 valid

if [[ $fails -ne 0 ]]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"
