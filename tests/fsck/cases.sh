#!/bin/bash
# The corruption cases of tests/fsck/cases/ (docs/testing.md, "Corruption
# cases"): each folder holds
#   recipe.sh  builds a good image at $IMG with the real tools, then damages
#              named fields with `plyctl debug corrupt` (never raw offsets);
#   expected   one fsck run per line, in order, on the same image:
#              "OPTIONS EXIT [CODE...]": fsck.plyfs OPTIONS -f IMAGE must exit
#              with EXIT and report every CODE (text output);
#   about      one line: what is broken, and where the case came from.
# A recipe that needs what the machine lacks (root, /dev/fuse) exits 77 and
# the case is skipped; the test is skipped only if every case is.
# Usage: cases.sh CASES_DIR MKFS FSCK PLYCTL PLYFS
set -uo pipefail

CASES=$(cd "$1" && pwd)
MKFS=$(realpath "$2") FSCK=$(realpath "$3") CTL=$(realpath "$4") PLYFS=$(realpath "$5")
export MKFS FSCK CTL PLYFS
T=$(mktemp -d "${TMPDIR:-/tmp}/fsck_cases.XXXXXX")
trap 'for m in "$T"/*/mnt; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done; rm -rf "$T"' EXIT

# What recipes may call (exported for their bash).
# mount_img IMAGE MNT [OPTIONS]: the daemon in the foreground, in the background.
mount_img() {
  local img=$1 mnt=$2 opts=${3:-}
  [[ -n $opts ]] && opts="-o $opts"
  mkdir -p "$mnt"
  # shellcheck disable=SC2086
  "$PLYFS" -f $opts "$img" "$mnt" 2>"$mnt.log" &
  echo $! >"$mnt.pid"
  for _ in $(seq 500); do
    mountpoint -q "$mnt" && return 0
    kill -0 "$(cat "$mnt.pid")" 2>/dev/null || { cat "$mnt.log"; return 1; }
    sleep 0.02
  done
  echo "plyfs did not mount $img"; return 1
}
# umount_img MNT: unmount and wait for the daemon, which commits on its way out.
umount_img() {
  local mnt=$1 pid
  pid=$(cat "$mnt.pid")
  for _ in $(seq 300); do umount "$mnt" 2>/dev/null && break; sleep 0.1; done
  wait "$pid"
}
# needs_fuse: exits 77 unless FUSE mounts can be made here.
needs_fuse() {
  [[ $(id -u) -eq 0 && -c /dev/fuse ]] || { echo "needs root and /dev/fuse"; exit 77; }
}
export -f mount_img umount_img needs_fuse

ran=0 skipped=0 failed=0
for dir in "$CASES"/*/; do
  name=$(basename "$dir")
  work=$T/$name
  mkdir -p "$work"
  export IMG=$work/img MNT=$work/mnt
  (cd "$work" && bash -euo pipefail "$dir/recipe.sh") >"$work/recipe.log" 2>&1
  rc=$?
  if [[ $rc -eq 77 ]]; then
    echo "skip $name: $(tail -1 "$work/recipe.log")"
    skipped=$((skipped + 1))
    continue
  fi
  if [[ $rc -ne 0 ]]; then
    echo "FAIL $name: the recipe failed ($rc)"; cat "$work/recipe.log"
    failed=$((failed + 1))
    continue
  fi
  ran=$((ran + 1))
  ok=1 step=0
  while read -r opts want codes; do
    [[ -z $opts || $opts == \#* ]] && continue
    step=$((step + 1))
    "$FSCK" "$opts" -f "$IMG" >"$work/out.$step" 2>&1
    got=$?
    if [[ $got -ne $want ]]; then
      echo "FAIL $name: fsck.plyfs $opts exited $got, expected $want"; ok=0
    fi
    for c in $codes; do
      grep -q " $c[ :]" "$work/out.$step" || { echo "FAIL $name: fsck.plyfs $opts did not report $c"; ok=0; }
    done
    [[ $ok -eq 1 ]] || { cat "$work/out.$step"; break; }
  done <"$dir/expected"
  if [[ $ok -eq 1 ]]; then echo "ok   $name: $(cat "$dir/about")"; else failed=$((failed + 1)); fi
done
echo "$ran ran, $skipped skipped, $failed failed"
[[ $failed -eq 0 ]] || exit 1
[[ $ran -gt 0 ]] || exit 77
exit 0
