#!/bin/bash
# The udev rule (udev/64-plyfs.rules.in) and plyfs_id on loop devices, through
# `udevadm test`: the variables, the /dev/disk/by-uuid and by-label links, and
# what they make work: findfs (libblkid's tag lookup), lsblk -f (udev's
# database), and mount -t fuse.plyfs UUID=... from an fstab.
#
# udevd need not run: `udevadm test --action=add` evaluates every rule file,
# runs the IMPORT programs, writes the database and makes the links itself.
# The test runs in a mount namespace of its own where /run (the rule, udev's
# database), /dev/disk and /dev/block (the links) and /usr/local/sbin (where
# mount.fuse3 finds plyfs) are private tmpfs mounts: nothing it makes is seen
# by the rest of the machine, and all of it is gone when the test ends.
# Needs root, loop devices, udevadm and unshare; exits 77 and says why without.
# Usage: udev_rule.sh PLYFS_ID MKFS RULE_IN PLYFS
set -euo pipefail

skip() { echo "skipped: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root (loop devices, udevadm test)"
for tool in losetup udevadm unshare findfs lsblk flock mkfs.ext4 mount umount; do
  command -v $tool >/dev/null || skip "$tool not found"
done
[[ -d /sys/class/block ]] || skip "no /sys/class/block"

if [[ -z ${PLYFS_UDEV_NS:-} ]]; then
  exec env PLYFS_UDEV_NS=1 unshare --mount --propagation private bash "$0" "$@"
fi

PROBE=$(realpath "$1") MKFS=$(realpath "$2") RULE_IN=$(realpath "$3") PLYFS=$(realpath "$4")
T=$(mktemp -d "${TMPDIR:-/tmp}/plyfs_udev.XXXXXX")
LOOPS=()
cleanup() {
  mountpoint -q "$T/mnt" 2>/dev/null && umount "$T/mnt"
  for l in "${LOOPS[@]}"; do
    udevadm test --action=remove "/sys/class/block/${l#/dev/}" >/dev/null 2>&1 || true
    losetup -d "$l" 2>/dev/null || true
  done
  rm -rf "$T"
}
trap cleanup EXIT

mkdir -p /dev/disk /dev/block  # as udev would; the tmpfs mounts below hide what goes in
mount -t tmpfs plyfs-test /run
mount -t tmpfs plyfs-test /dev/disk
mount -t tmpfs plyfs-test /dev/block
mount -t tmpfs plyfs-test /usr/local/sbin
mkdir -p /run/udev/rules.d /run/mount
sed "s|@PLYFS_ID@|$PROBE|" "$RULE_IN" >/run/udev/rules.d/64-plyfs.rules
ln -s "$PLYFS" /usr/local/sbin/plyfs

fails=0
check() {  # check "what" command...: the command must succeed
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
attach() {  # attach VAR FILE: sets VAR to a new loop device over FILE
  local dev
  dev=$(losetup -f --show "$2" 2>"$T/losetup.err") ||
    skip "losetup failed: $(cat "$T/losetup.err")"
  LOOPS+=("$dev")
  printf -v "$1" %s "$dev"
}
utest() {  # utest ACTION DEVICE: properties in $T/props, the log in $T/log
  udevadm test --action="$1" "/sys/class/block/${2#/dev/}" >"$T/props" 2>"$T/log"
}
prop() { sed -n "s/^$1=//p" "$T/props"; }
is_prop() {
  local v; v=$(prop "$1")
  [[ $v == "$2" ]] || { echo "  $1='$v', expected '$2'"; return 1; }
}
links_to() {  # links_to LINK DEVICE
  local t; t=$(readlink -f "$1" 2>/dev/null) || { echo "  no $1"; return 1; }
  [[ $t == "$2" ]] || { echo "  $1 -> $t, expected $2"; return 1; }
}
is_out() {  # is_out EXPECTED command...: the command prints EXPECTED
  local want=$1 got; shift
  got=$("$@" 2>&1) || true
  [[ $got == "$want" ]] || { echo "  '$*' printed '$got', expected '$want'"; return 1; }
}
probe_ran() { grep -q "$PROBE" "$T/log"; }
released() {  # the daemon, which exits after the unmount, let go of its lock
  local i
  for i in $(seq 300); do flock -n "$1" true && return 0; sleep 0.1; done
  echo "  $1 is still locked"; return 1
}

U=3f2504e0-4f89-41d3-9a0c-0305e82c3301
truncate -s 64M "$T/p.img" "$T/e.img" "$T/z.img"
"$MKFS" -q -L 'my data' -U $U "$T/p.img"
mkfs.ext4 -q -F -L extfs "$T/e.img"
attach P "$T/p.img"
attach E "$T/e.img"
attach Z "$T/z.img"
echo "plyfs $P, ext4 $E, empty $Z"

check "no link yet: findfs UUID= finds nothing" bash -c "! findfs UUID=$U >/dev/null 2>&1"
utest add "$P"
check "udevadm test reads the rule" grep -q "/run/udev/rules.d/64-plyfs.rules" "$T/log"
check "the rule runs plyfs_id on the plyfs device" probe_ran
check "ID_FS_TYPE=plyfs" is_prop ID_FS_TYPE plyfs
check "ID_FS_USAGE=filesystem" is_prop ID_FS_USAGE filesystem
check "ID_FS_VERSION=1.0" is_prop ID_FS_VERSION 1.0
check "ID_FS_UUID" is_prop ID_FS_UUID $U
check "ID_FS_UUID_ENC" is_prop ID_FS_UUID_ENC $U
check "ID_FS_LABEL" is_prop ID_FS_LABEL my_data
check "ID_FS_LABEL_ENC" is_prop ID_FS_LABEL_ENC 'my\x20data'
check "DEVLINKS names the by-uuid link" grep -q "^DEVLINKS=.*/dev/disk/by-uuid/$U" "$T/props"
check "/dev/disk/by-uuid/UUID -> the device" links_to "/dev/disk/by-uuid/$U" "$P"
check "/dev/disk/by-label/my\\x20data -> the device" links_to '/dev/disk/by-label/my\x20data' "$P"
check "findfs UUID= (libblkid through the udev link)" is_out "$P" findfs UUID=$U
check "findfs LABEL= with a space in the label" is_out "$P" findfs 'LABEL=my data'
check "blkid -U" is_out "$P" blkid -U $U
check "blkid -L" is_out "$P" blkid -L 'my data'
check "lsblk -f reads the type, UUID and label from udev's database" \
  is_out "FSTYPE=\"plyfs\" UUID=\"$U\" LABEL=\"my data\"" lsblk -nP -o FSTYPE,UUID,LABEL "$P"

# mount(8) resolves UUID= of an fstab line through the same link and runs
# mount.fuse3, which runs plyfs with the device.
mkdir "$T/mnt"
echo "UUID=$U $T/mnt fuse.plyfs defaults 0 0" >"$T/fstab"
if mount --fstab "$T/fstab" "$T/mnt" 2>"$T/mount.err"; then
  check "mount UUID= through fstab: the device is mounted" \
    bash -c "findmnt -n -o SOURCE,FSTYPE '$T/mnt' | grep -q '^$P *fuse.plyfs'"
  echo written >"$T/mnt/f"
  umount "$T/mnt"
  check "unmounted: the daemon exits" released "$P"
  mount -t fuse.plyfs "UUID=$U" "$T/mnt"
  check "mount -t fuse.plyfs UUID=: the file reads back" is_out written cat "$T/mnt/f"
  umount "$T/mnt"
  check "unmounted again" released "$P"
else
  check "mount UUID= through fstab ($(cat "$T/mount.err"))" false
fi

utest add "$E"
check "ext4: blkid's answer stands" is_prop ID_FS_TYPE ext4
check "ext4: plyfs_id is not run" bash -c "! grep -q '$PROBE' '$T/log'"

utest add "$Z"
check "no filesystem: plyfs_id runs" probe_ran
check "no filesystem: no ID_FS_TYPE" is_prop ID_FS_TYPE ""
check "no filesystem: no by-uuid link" bash -c "! grep -q '^DEVLINKS=.*by-uuid' '$T/props'"

# mkfs.plyfs over the empty device, then the change event udev's watch
# (60-block.rules) sends when mkfs closes it.
"$MKFS" -q -L second "$Z"
utest change "$Z"
check "after mkfs: ID_FS_TYPE=plyfs" is_prop ID_FS_TYPE plyfs
check "after mkfs: /dev/disk/by-label/second" links_to /dev/disk/by-label/second "$Z"
check "the first device keeps its links" links_to "/dev/disk/by-uuid/$U" "$P"

echo "$fails failed"
[[ $fails -eq 0 ]]
