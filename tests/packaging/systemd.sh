#!/bin/bash
# The systemd unit examples (contrib/systemd/): systemd-analyze verify finds
# nothing to say about them, and the mount they describe works: mount(8) with
# their What=, Where=, Type= and Options= mounts a plyfs image (the build's
# plyfs, made visible to mount.fuse3 in a private /usr/local/sbin).
# The mount part needs root and /dev/fuse.
# Usage: systemd.sh UNIT_DIR PLYFS MKFS
set -euo pipefail

command -v systemd-analyze >/dev/null || { echo "skipped: systemd-analyze not found"; exit 77; }
if [[ -z ${PLYFS_SD_NS:-} && $(id -u) -eq 0 ]] && command -v unshare >/dev/null; then
  exec env PLYFS_SD_NS=1 unshare --mount --propagation private bash "$0" "$@"
fi
UNITS=$(realpath "$1") PLYFS=$(realpath "$2") MKFS=$(realpath "$3")
T=$(mktemp -d "${TMPDIR:-/tmp}/plyfs_systemd.XXXXXX")
trap 'mountpoint -q "$T/srv/data" 2>/dev/null && umount "$T/srv/data"; rm -rf "$T"' EXIT

fails=0
check() {  # check "what" command...: the command must succeed
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
quiet_verify() {  # exit 0 and not a word (an unknown key is only a warning)
  local out rc=0
  out=$(systemd-analyze verify --man=no "$@" 2>&1) || rc=$?
  [[ $rc -eq 0 && -z $out ]] || { echo "  exit $rc: $out"; return 1; }
}
key() { sed -n "s/^$1=//p" "$UNITS/srv-data.mount"; }

check "srv-data.mount and .automount: systemd-analyze verify is silent" \
  quiet_verify "$UNITS/srv-data.mount" "$UNITS/srv-data.automount"
sed 's/^Type=/Typo=/' "$UNITS/srv-data.mount" >"$T/srv-data.mount"
check "(a misspelt key is noticed)" bash -c "! systemd-analyze verify --man=no '$T/srv-data.mount' >/dev/null 2>&1 || [[ -n \$(systemd-analyze verify --man=no '$T/srv-data.mount' 2>&1) ]]"
check "the unit's name is its escaped mount point" \
  test "$(systemd-escape -p --suffix=mount "$(key Where)")" = srv-data.mount
check "Type=fuse.plyfs" test "$(key Type)" = fuse.plyfs

if [[ -n ${PLYFS_SD_NS:-} && -c /dev/fuse ]]; then
  mount -t tmpfs plyfs-test /usr/local/sbin
  ln -s "$PLYFS" /usr/local/sbin/plyfs
  "$MKFS" -q -s 64M "$T/disk.img"
  mkdir -p "$T/srv/data"
  if mount -t "$(key Type)" -o "$(key Options)" "$T/disk.img" "$T/srv/data" 2>"$T/err"; then
    echo data >"$T/srv/data/f"
    check "What/Type/Options mount a plyfs image" test "$(cat "$T/srv/data/f")" = data
    check "the options reach plyfs (allow_other)" \
      bash -c "findmnt -n -o OPTIONS '$T/srv/data' | grep -q allow_other"
    umount "$T/srv/data"
  else
    check "mount -t $(key Type) -o $(key Options): $(cat "$T/err")" false
  fi
else
  echo "(not root or no /dev/fuse: the mount itself not tried)"
fi

echo "$fails failed"
[[ $fails -eq 0 ]]
