#!/bin/bash
# The .deb: built from this source tree with dpkg-buildpackage (a release
# build of what the package holds: no tests, no benchmarks), installed with
# dpkg -i, used from the installed paths only (mkfs -t plyfs on a loop device,
# mount -t fuse.plyfs, a file written and read back, fsck -t plyfs, file(1)
# and the udev rule), then purged: nothing of it may be left.
#
# Installing to /usr must not change what the other tests, running at the
# same time, run: mkfs(8) and fsck(8) look in /sbin before PATH, and
# mount.fuse3 in /usr/local and /usr before anything else. So the package is
# installed in a mount namespace of this test's own, where /usr, /etc and /var
# are overlays on a tmpfs: dpkg writes into the real paths as on any system,
# and only this test sees what it wrote. The build itself writes only under a
# temporary directory.
# Needs root, dpkg-buildpackage with the build dependencies, loop devices,
# /dev/fuse and overlayfs; exits 77 and says why without.
# Usage: deb.sh SOURCE_DIR
# PLYFS_DEB=FILE.deb tests that package instead of building one.
set -euo pipefail

skip() { echo "skipped: $*"; exit 77; }
SRC=$(realpath "$1")

if [[ -z ${PLYFS_DEB_NS:-} ]]; then
  [[ $(id -u) -eq 0 ]] || skip "needs root (dpkg -i, loop devices, FUSE)"
  for tool in dpkg-buildpackage dpkg-checkbuilddeps dh losetup unshare mount file; do
    command -v $tool >/dev/null || skip "$tool not found (scripts/install-deps installs it)"
  done
  [[ -c /dev/fuse ]] || skip "no /dev/fuse"
  grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null ||
    skip "no overlayfs (the package is installed into overlays of /usr, /etc, /var)"
  if ! (cd "$SRC" && dpkg-checkbuilddeps 2>"${TMPDIR:-/tmp}/plyfs-deb-deps.$$"); then
    msg=$(cat "${TMPDIR:-/tmp}/plyfs-deb-deps.$$"); rm -f "${TMPDIR:-/tmp}/plyfs-deb-deps.$$"
    skip "build dependencies missing: $msg"
  fi
  rm -f "${TMPDIR:-/tmp}/plyfs-deb-deps.$$"
  exec env PLYFS_DEB_NS=1 unshare --mount --propagation private bash "$0" "$@"
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/plyfs_deb.XXXXXX")
LOOP="" MOUNTED=()
cleanup() {
  mountpoint -q "$T/mnt" 2>/dev/null && umount "$T/mnt"
  [[ -n $LOOP ]] && losetup -d "$LOOP" 2>/dev/null
  # Only this namespace sees these mounts; lazily, as this shell still runs
  # from the overlays.
  local m
  for m in "${MOUNTED[@]}"; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT

fails=0
check() {  # check "what" command...: the command must succeed
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
is_out() {  # is_out EXPECTED command...: the command prints EXPECTED
  local want=$1 got; shift
  got=$("$@" 2>&1) || true
  [[ $got == "$want" ]] || { echo "  '$*' printed '$got', expected '$want'"; return 1; }
}
released() {  # the daemon, which exits after the unmount, let go of its lock
  local i
  for i in $(seq 300); do flock -n "$1" true && return 0; sleep 0.1; done
  echo "  $1 is still locked"; return 1
}

# --- build, from a copy of the tree (dpkg-buildpackage writes beside it)
mkdir -p "$T/src/plyfs"
if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git -C "$SRC" ls-files -z --cached --others --exclude-standard |
    tar -C "$SRC" --null -T - -cf - | tar -C "$T/src/plyfs" -xf -
else
  tar -C "$SRC" --anchored --exclude=./.git --exclude='./build*' --exclude='./obj-*' -cf - . |
    tar -C "$T/src/plyfs" -xf -
fi
TIMEFORMAT='%R s wall, %U s user, %S s system'
# -g off (DEB_CXXFLAGS_STRIP) and no debug symbol package: the same binaries
# once stripped, in less time. noopt (-O0): what this test checks is the
# package (its paths, maintainer scripts, what the installed tools do), which
# the optimisation level does not change; -O2 took 735 s of CPU on 2 cores
# beside the rest of the suite (2026-12-03), most of the test's time.
# PLYFS_DEB_OPT=1 builds the package as a user's dpkg-buildpackage would.
noopt=" noopt"
[[ -n ${PLYFS_DEB_OPT:-} ]] && noopt=""
if [[ -n ${PLYFS_DEB:-} ]]; then
  cp "$PLYFS_DEB" "$T/src/"
  echo "testing $PLYFS_DEB (not built)"
elif ! { time (cd "$T/src/plyfs" &&
      DEB_BUILD_OPTIONS="nocheck parallel=2 noautodbgsym$noopt" DEB_CXXFLAGS_STRIP=-g \
        dpkg-buildpackage -us -uc -b >"$T/build.log" 2>&1); } 2>"$T/time"; then
  tail -40 "$T/build.log"
  check "dpkg-buildpackage -us -uc -b" false
  exit 1
else
  # CPU time too: on a loaded machine the wall time says little.
  echo "built: $(cat "$T/time")"
fi
debs=("$T"/src/plyfs_*.deb)
check "one .deb built" test ${#debs[@]} -eq 1 -a -f "${debs[0]}"
DEB=${debs[0]}
dpkg-deb -c "$DEB" | awk '{print $6}' | sed 's|^\./|/|' >"$T/contents"
has() { grep -qx -- "$1" "$T/contents" || { echo "  the package lacks $1"; return 1; }; }
check "mkfs.plyfs in /usr/sbin" has /usr/sbin/mkfs.plyfs
check "fsck.plyfs in /usr/sbin" has /usr/sbin/fsck.plyfs
check "plyfs in /usr/bin" has /usr/bin/plyfs
check "plyctl in /usr/bin" has /usr/bin/plyctl
check "the udev rule" has /usr/lib/udev/rules.d/64-plyfs.rules
check "plyfs_id beside udev's own helpers" has /usr/lib/udev/plyfs_id
check "the magic entry" has /usr/share/plyfs/plyfs.magic
check "the license (debian/copyright)" has /usr/share/doc/plyfs/copyright
for m in mkfs.plyfs fsck.plyfs plyfs plyctl plyfs_id; do
  check "man page $m(8)" has /usr/share/man/man8/$m.8.gz
done
check "no test or benchmark binary" bash -c "! grep -E 'unit_tests|_bench|crash_tests' '$T/contents'"

# --- install, into overlays only this namespace sees
mkdir "$T/ov"
mount -t tmpfs plyfs-deb "$T/ov"
MOUNTED=("$T/ov")
for d in usr etc var; do
  mkdir -p "$T/ov/$d.up" "$T/ov/$d.work"
  mount -t overlay overlay -o "lowerdir=/$d,upperdir=$T/ov/$d.up,workdir=$T/ov/$d.work" "/$d"
  MOUNTED=("/$d" "${MOUNTED[@]}")
done
# Private /run, /dev/disk and /dev/block for the udev part (see udev_rule.sh).
mkdir -p /dev/disk /dev/block
for d in /run /dev/disk /dev/block; do
  mount -t tmpfs plyfs-deb "$d"
  MOUNTED=("$d" "${MOUNTED[@]}")
done
mkdir -p /run/mount /run/lock
cp /etc/magic "$T/magic.before" 2>/dev/null || : >"$T/magic.before"
# The installed paths only: nothing from the build tree or /usr/local.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin

if ! dpkg -i "$DEB" >"$T/dpkg.log" 2>&1; then
  cat "$T/dpkg.log"
  check "dpkg -i" false
  exit 1
fi
check "dpkg -i: installed" is_out "install ok installed" dpkg-query -W -f='${Status}' plyfs
dpkg -L plyfs >"$T/files"
check "the rule runs the installed plyfs_id" \
  grep -q 'IMPORT{program}="/usr/lib/udev/plyfs_id ' /usr/lib/udev/rules.d/64-plyfs.rules

# --- use it
truncate -s 256M "$T/disk"
LOOP=$(losetup -f --show "$T/disk")
check "mkfs -t plyfs runs /usr/sbin/mkfs.plyfs" mkfs -t plyfs -L pkgtest "$LOOP"
check "file(1), through /etc/magic, names it" \
  bash -c "file -b -s '$LOOP' | grep -q '^plyfs filesystem image, version 1.0, UUID=.*, label \"pkgtest\"'"
mkdir "$T/mnt"
check "mount -t fuse.plyfs (mount.fuse3 runs /usr/bin/plyfs)" mount -t fuse.plyfs "$LOOP" "$T/mnt"
daemon_exe() {  # the executable of the daemon serving $T/mnt
  local p
  for p in $(pgrep -x plyfs); do
    grep -qF "$T/mnt" "/proc/$p/cmdline" 2>/dev/null && readlink "/proc/$p/exe"
  done
}
check "the daemon is the installed one" is_out /usr/bin/plyfs daemon_exe
head -c 3000000 /dev/urandom >"$T/data"
cp "$T/data" "$T/mnt/data"
echo hello >"$T/mnt/hello"
umount "$T/mnt"
check "unmounted: the daemon exits" released "$LOOP"
mount -t fuse.plyfs -o ro "$LOOP" "$T/mnt"
check "after a remount: the file reads back" cmp "$T/data" "$T/mnt/data"
check "after a remount: the small file too" is_out hello cat "$T/mnt/hello"
umount "$T/mnt"
check "unmounted again" released "$LOOP"
check "fsck -t plyfs runs /usr/sbin/fsck.plyfs: clean (0)" fsck -t plyfs "$LOOP"
check "plyctl show" bash -c "plyctl show '$LOOP' | grep -q pkgtest"
UUID=$(/usr/lib/udev/plyfs_id "$LOOP" | sed -n 's/^ID_FS_UUID=//p')
check "plyfs_id reads the UUID" test -n "$UUID"
if command -v udevadm >/dev/null; then
  udevadm test --action=add "/sys/class/block/${LOOP#/dev/}" >"$T/props" 2>"$T/udev.log" || true
  check "udevadm test: the installed rule makes /dev/disk/by-uuid/UUID" \
    test "$(readlink -f "/dev/disk/by-uuid/$UUID")" = "$LOOP"
  udevadm test --action=remove "/sys/class/block/${LOOP#/dev/}" >/dev/null 2>&1 || true
fi
losetup -d "$LOOP"
LOOP=""

# --- purge: nothing left
if ! dpkg --purge plyfs >"$T/purge.log" 2>&1; then
  cat "$T/purge.log"
  check "dpkg --purge" false
fi
check "dpkg --purge: gone from dpkg's database" \
  bash -c "! dpkg-query -W -f='\${Status}' plyfs 2>/dev/null | grep -q installed"
left=0
while read -r f; do
  [[ -d $f && ! -L $f ]] && continue  # directories shared with other packages
  if [[ -e $f || -L $f ]]; then echo "  left: $f"; left=$((left + 1)); fi
done <"$T/files"
check "every file of the package is gone" test $left -eq 0
check "no directory of its own is left" bash -c '! ls -d /usr/share/plyfs /usr/share/doc/plyfs 2>/dev/null'
# In /usr's overlay, whatever dpkg wrote and did not remove.
find "$T/ov/usr.up" -mindepth 1 \( -type f -o -type l \) >"$T/usr-left"
check "nothing it wrote is left under /usr" test ! -s "$T/usr-left"
[[ ! -s $T/usr-left ]] || head "$T/usr-left"
check "/etc/magic is as it was before the install" cmp "$T/magic.before" /etc/magic

echo "$fails failed"
[[ $fails -eq 0 ]]
