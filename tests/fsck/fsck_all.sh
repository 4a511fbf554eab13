#!/bin/bash
# fsck -A (util-linux fsck(8)) over an fstab with plyfs entries (issue 21):
# fsck(8) runs fsck.TYPE for each line whose sixth field is not 0, found in
# /sbin:/sbin/fs.d:/sbin/fs:/etc/fs:/etc and then $PATH; for a `fuse.plyfs`
# line (the type mount(8) needs) that is fsck.fuse.plyfs, the link meson
# installs, and for a `plyfs` line fsck.plyfs. It passes -C only to ext2/3/4
# checkers, so fsck.plyfs shows no progress under it. A directory holding
# the built fsck.plyfs and the link goes first in PATH.
# An image file always; a loop device too when root can make one.
# Usage: fsck_all.sh MKFS FSCK PLYCTL
set -uo pipefail

MKFS=$1
FSCK=$(realpath "$2")
CTL=$3
command -v fsck >/dev/null || { echo "SKIP: no fsck(8)"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/fsck_all.XXXXXX")
LOOP=
trap '[[ -n $LOOP ]] && losetup -d "$LOOP"; rm -rf "$T"' EXIT

fails=0
check() {
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
run_fsck() {  # run_fsck ARGS...: FSTAB_FILE=$T/fstab fsck ARGS; status in $rc, output in $T/out
  FSTAB_FILE=$T/fstab PATH="$T/bin:$PATH" fsck "$@" >"$T/out" 2>&1
  rc=$?
}
rc_is() { [[ $rc -eq $1 ]] || { echo "  exit status $rc, expected $1"; cat "$T/out"; return 1; }; }
out_has() { grep -q -- "$1" "$T/out" || { echo "  output lacks '$1':"; cat "$T/out"; return 1; }; }
out_lacks() { ! grep -q -- "$1" "$T/out" || { echo "  output has '$1':"; cat "$T/out"; return 1; }; }

mkdir -p "$T/bin"
ln -s "$FSCK" "$T/bin/fsck.plyfs"
ln -s fsck.plyfs "$T/bin/fsck.fuse.plyfs"
"$MKFS" -q -s 32M "$T/a.img"
"$MKFS" -q -s 32M "$T/b.img"
"$MKFS" -q -s 32M "$T/skipped.img"
"$MKFS" -q -s 32M "$T/nofail.img"
# fsck(8) takes a source that is not a block device for a missing one: with
# nofail it skips the line (so an image line must not carry nofail).
{
  echo "$T/a.img $T/mnt-a fuse.plyfs defaults 0 2"
  echo "$T/b.img $T/mnt-b plyfs defaults,nofail 0 2"
  echo "$T/skipped.img $T/mnt-s fuse.plyfs defaults 0 0"  # pass 0: never checked
  echo "$T/nofail.img $T/mnt-n fuse.plyfs defaults,nofail 0 2"
} >"$T/fstab"
if [[ $(id -u) -eq 0 ]] && command -v losetup >/dev/null && LOOP=$(losetup -f --show "$T/b.img" 2>/dev/null); then
  sed -i "s|^$T/b.img |$LOOP |" "$T/fstab"
  echo "loop device $LOOP for the plyfs line (with nofail: a block device is checked)"
else
  LOOP=
  echo "no loop device (not root): the plyfs line is an image file"
fi

run_fsck -A -N
check "fsck -A -N: runs fsck.fuse.plyfs for the fuse.plyfs line" out_has "fsck.fuse.plyfs"
check "... and fsck.plyfs for the plyfs line" out_has "fsck.plyfs "
check "... not for a line with pass 0" out_lacks "skipped.img"
check "... not for an image file with nofail" out_lacks "nofail.img"

run_fsck -A -N -C0 -f
check "fsck -A -N -C0 -f: fsck(8) passes -f" out_has "fsck.fuse.plyfs -f "
check "... but not -C0 (it gives -C to ext2/3/4 only)" out_lacks "fsck.plyfs.*-C"

run_fsck -A -T -C0 -f
check "fsck -A -T -C0 -f: clean images (0)" rc_is 0
check "... both checked" test "$(grep -c ": clean, " "$T/out")" = 2

# Damage: a reference count one too high in a.img's space tree.
node=$("$CTL" debug tree "$T/a.img" space | awk '/^node/ {print $2; exit}')
"$CTL" debug corrupt "$T/a.img" space-item "$node" refs --add 1 >/dev/null
run_fsck -A -T -C0 -f
check "damage found: fsck -A exits 4 (fsck.plyfs checks only without -a/-y)" rc_is 4
check "... names the problem" out_has "A3-refs-high"
check "... the other image is clean" out_has ": clean, "
run_fsck -A -T -a
check "fsck -A -a preens it (1)" rc_is 1
run_fsck -A -T
check "then fsck -A is clean (0)" rc_is 0

# A line whose image is missing and has no nofail: fsck.plyfs cannot open it (8).
rm "$T/a.img"
run_fsck -A -T
check "a missing image without nofail: operational error (8)" rc_is 8
check "... said in one line" out_has "fsck.plyfs: cannot open $T/a.img: No such file or directory"

if [[ $fails -ne 0 ]]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"
