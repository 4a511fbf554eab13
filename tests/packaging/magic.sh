#!/bin/bash
# The magic(5) entry (contrib/magic/plyfs): file(1) names plyfs images with
# their version, UUID, label and block size, from slot 1 when slot 0 holds no
# superblock, and nothing else as plyfs; etc-magic adds it to /etc/magic (here
# a copy) and takes it out again, leaving the file as it was.
# Usage: magic.sh MKFS PLYCTL MAGIC ETC_MAGIC
set -euo pipefail

MKFS=$1 CTL=$2 MAGIC=$3 ETC_MAGIC=$4
command -v file >/dev/null || { echo "skipped: file(1) not found"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/plyfs_magic.XXXXXX")
trap 'rm -rf "$T"' EXIT

fails=0
check() {  # check "what" command...: the command must succeed
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
says() {  # says EXPECTED file-arguments...: file -b prints EXPECTED
  local want=$1 got; shift
  got=$(file -b "$@" 2>/dev/null) || true
  [[ $got == "$want" ]] || { echo "  file said '$got', expected '$want'"; return 1; }
}
not_plyfs() {
  local got; got=$(file -b "$@" 2>/dev/null) || true
  [[ $got != *plyfs* ]] || { echo "  file said '$got'"; return 1; }
}

U=3f2504e0-4f89-41d3-9a0c-0305e82c3301
WANT="plyfs filesystem image, version 1.0, UUID=$U, label \"my data\", blocksize 4096"
"$MKFS" -q -L 'my data' -U $U -s 16M "$T/a.img"
check "file -m: version, UUID, label, block size" says "$WANT" -m "$MAGIC" "$T/a.img"
SYSTEM=/etc/magic:/usr/share/misc/magic
check "with the system's database too, plyfs wins" says "$WANT" -m "$SYSTEM:$MAGIC" "$T/a.img"
check "without the entry, file does not know plyfs (what this fixes)" not_plyfs -m "$SYSTEM" "$T/a.img"

"$MKFS" -q -U $U -b 16K -s 16M "$T/nolabel.img"
check "no label, 16 KiB blocks" \
  says "plyfs filesystem image, version 1.0, UUID=$U, blocksize 16384" -m "$MAGIC" "$T/nolabel.img"
L64=$(printf 'x%.0s' $(seq 64))
"$MKFS" -q -L "$L64" -U $U -s 16M "$T/long.img"
check "a 64-byte label (no NUL) stops at 64 bytes" \
  says "plyfs filesystem image, version 1.0, UUID=$U, label \"$L64\", blocksize 4096" \
  -m "$MAGIC" "$T/long.img"

cp "$T/a.img" "$T/slot1.img"
"$CTL" debug corrupt "$T/slot1.img" superblock 0 magic --zero >/dev/null
check "slot 0 without its magic: slot 1 is shown" says "$WANT" -m "$MAGIC" "$T/slot1.img"
"$CTL" debug corrupt "$T/slot1.img" superblock 1 magic --zero >/dev/null
check "neither slot has the magic: not plyfs" not_plyfs -m "$MAGIC" "$T/slot1.img"

truncate -s 16M "$T/zero.img"
check "zeroes: not plyfs" not_plyfs -m "$SYSTEM:$MAGIC" "$T/zero.img"
if command -v mkfs.ext4 >/dev/null; then
  truncate -s 16M "$T/ext4.img"
  mkfs.ext4 -q -F "$T/ext4.img"
  check "ext4: not plyfs" not_plyfs -m "$SYSTEM:$MAGIC" "$T/ext4.img"
fi

# etc-magic on a copy of /etc/magic.
if [[ -f /etc/magic ]]; then cp /etc/magic "$T/etc-magic"; else echo "# local" >"$T/etc-magic"; fi
cp "$T/etc-magic" "$T/etc-magic.orig"
sh "$ETC_MAGIC" add "$MAGIC" "$T/etc-magic"
check "etc-magic add: file names plyfs through it" says "$WANT" -m "$T/etc-magic" "$T/a.img"
sh "$ETC_MAGIC" add "$MAGIC" "$T/etc-magic"
check "etc-magic add twice: one block" test "$(grep -c '^# BEGIN plyfs' "$T/etc-magic")" -eq 1
sh "$ETC_MAGIC" remove "$MAGIC" "$T/etc-magic"
check "etc-magic remove: the file is as it was" cmp "$T/etc-magic" "$T/etc-magic.orig"
DESTDIR=$T/stage sh "$ETC_MAGIC" add "$MAGIC" "$T/etc-magic" >/dev/null
check "etc-magic add with DESTDIR (a staged install): untouched" cmp "$T/etc-magic" "$T/etc-magic.orig"

if [[ $(id -u) -eq 0 ]] && L=$(losetup -f --show "$T/a.img" 2>/dev/null); then
  check "file -s on a loop device" says "$WANT" -s -m "$MAGIC" "$L"
  losetup -d "$L"
else
  echo "(not root or no loop device: file -s on a block device not run)"
fi

echo "$fails failed"
[[ $fails -eq 0 ]]
