#!/bin/bash
# plyfs_id (the udev probe) on image files: what it exports, the slot it
# trusts, and that nothing that is not a valid plyfs filesystem makes it print
# anything or crash (random files, damaged superblocks). No root needed.
# Usage: probe.sh PLYFS_ID MKFS PLYCTL
# PLYFS_SEED=N replays the random part.
set -euo pipefail

PROBE=$1 MKFS=$2 CTL=$3
T=$(mktemp -d "${TMPDIR:-/tmp}/plyfs_probe.XXXXXX")
trap 'rm -rf "$T"' EXIT

fails=0
check() {  # check "what" command...: the command must succeed
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
probe() {  # exit status in $rc, stdout in $T/out, stderr in $T/err
  set +e
  "$PROBE" "$@" >"$T/out" 2>"$T/err"
  rc=$?
  set -e
}
var() { sed -n "s/^$1=//p" "$T/out"; }
is_var() {  # is_var NAME VALUE: the last probe printed NAME=VALUE
  local v; v=$(var "$1")
  [[ $v == "$2" ]] || { echo "  $1='$v', expected '$2'"; return 1; }
}
silent_no() {  # the last probe said "not plyfs": exit 1, nothing printed
  [[ $rc -eq 1 ]] || { echo "  exit status $rc, expected 1"; cat "$T/err"; return 1; }
  [[ ! -s $T/out && ! -s $T/err ]] || { echo "  it printed:"; cat "$T/out" "$T/err"; return 1; }
}
corrupt() { "$CTL" debug corrupt "$@" >/dev/null; }

U=3f2504e0-4f89-41d3-9a0c-0305e82c3301
"$MKFS" -q -L 'my data' -U $U -s 16M "$T/a.img"
probe "$T/a.img"
check "a plyfs image: exit 0" test $rc -eq 0
check "ID_FS_TYPE" is_var ID_FS_TYPE plyfs
check "ID_FS_USAGE" is_var ID_FS_USAGE filesystem
check "ID_FS_VERSION" is_var ID_FS_VERSION 1.0
check "ID_FS_UUID" is_var ID_FS_UUID $U
check "ID_FS_UUID_ENC" is_var ID_FS_UUID_ENC $U
check "ID_FS_LABEL: white space as udev makes it safe" is_var ID_FS_LABEL my_data
check "ID_FS_LABEL_ENC: encoded as udev encodes link names" is_var ID_FS_LABEL_ENC 'my\x20data'
check "exactly those seven lines" test "$(wc -l <"$T/out")" -eq 7

# Each device of a multi-device volume (format.md#device-label): the volume's
# uuid and label, and its own uuid as ID_FS_UUID_SUB (as btrfs's members).
"$MKFS" -q -L pair -U $U -s 16M -C fast="$T/m0.img" -C slow="$T/m1.img"
subs=()
for m in m0 m1; do
  probe "$T/$m.img"
  check "device $m of a volume: exit 0" test $rc -eq 0
  check "device $m: the volume's uuid" is_var ID_FS_UUID $U
  check "device $m: the volume's label" is_var ID_FS_LABEL pair
  check "device $m: its own uuid" test -n "$(var ID_FS_UUID_SUB)"
  subs+=("$(var ID_FS_UUID_SUB)")
done
check "the two devices' own uuids differ" test "${subs[0]}" != "${subs[1]}"
# A damaged label: not a device anyone should mount by.
printf 'X' | dd of="$T/m1.img" bs=1 seek=$((32768 + 20)) conv=notrunc status=none
probe "$T/m1.img"
check "a device with a damaged label: nothing" silent_no
check "nothing on stderr" test ! -s "$T/err"

"$MKFS" -q -U $U -s 16M "$T/nolabel.img"
probe "$T/nolabel.img"
check "no label: exit 0" test $rc -eq 0
check "no label: no ID_FS_LABEL lines" bash -c "! grep -q LABEL '$T/out'"

# The encodings must be exactly udev's: blkid -o udev prints the same
# variables for an ext4 image with the same label, through the same libblkid
# functions the udev builtin uses.
if command -v mkfs.ext4 >/dev/null && command -v blkid >/dev/null; then
  for label in 'my data' 'a  b ' ' lead' 'caf'$'\xc3\xa9''/x y' 'tab'$'\t''x' 'q"u\o#+:=@' \
               $'\xff\xfe''bad' 'x*?[y]'; do
    rm -f "$T/l.img" "$T/e.img"
    "$MKFS" -q -L "$label" -U $U -s 16M "$T/l.img"
    truncate -s 4M "$T/e.img"
    mkfs.ext4 -q -F -L "$label" -U $U "$T/e.img" 2>/dev/null
    blkid -p -o udev "$T/e.img" | grep -E '^ID_FS_(LABEL|LABEL_ENC|UUID|UUID_ENC)=' | sort >"$T/want"
    probe "$T/l.img"
    grep -E '^ID_FS_(LABEL|LABEL_ENC|UUID|UUID_ENC)=' "$T/out" | sort >"$T/got" || true
    check "label $(printf %q "$label") encoded as blkid encodes it" diff "$T/want" "$T/got"
  done
else
  echo "(mkfs.ext4 or blkid missing: encoding comparison not run)"
fi

# I1: the slot a mount uses. mkfs leaves generation 2 in slot 0 and 3 in
# slot 1; give the older copy another label (checksum recomputed, so it stays
# valid) and see which one is exported, then damage the newer copy.
cp "$T/a.img" "$T/s.img"
corrupt "$T/s.img" superblock 0 label --set 0x4c4542414c444c4f  # "OLDLABEL", little-endian
probe "$T/s.img"
check "both slots valid: the newer generation's label" is_var ID_FS_LABEL my_data
cp "$T/s.img" "$T/torn.img"
corrupt "$T/torn.img" superblock 1 stamp.5 --set 1
probe "$T/torn.img"
check "newer slot torn: the older slot's label" is_var ID_FS_LABEL OLDLABEL
cp "$T/s.img" "$T/sum.img"
corrupt "$T/sum.img" superblock 1 checksum --flip 3 --keep-checksum
probe "$T/sum.img"
check "newer slot's checksum wrong: the older slot's label" is_var ID_FS_LABEL OLDLABEL
cp "$T/s.img" "$T/fields.img"
corrupt "$T/fields.img" superblock 1 fs_id --add 1
probe "$T/fields.img"
check "newer slot's fields wrong (checksum right): the older slot" is_var ID_FS_LABEL OLDLABEL

# I2: nothing, silently.
corrupt "$T/sum.img" superblock 0 checksum --flip 0 --keep-checksum
probe "$T/sum.img"
check "both slots damaged: exit 1, silent" silent_no
cp "$T/a.img" "$T/v2.img"
corrupt "$T/v2.img" superblock 1 version_major --set 2
probe "$T/v2.img"
check "a newer format version (a mount refuses it): exit 1, silent" silent_no
truncate -s 16M "$T/zero.img"
probe "$T/zero.img"
check "all zeroes: exit 1, silent" silent_no
probe "$T/missing.img"
check "no such file: exit 1, silent" silent_no
probe "$T"
check "a directory: exit 1, silent" silent_no
probe /dev/null
check "a character device: exit 1, silent" silent_no
: >"$T/empty.img"
probe "$T/empty.img"
check "an empty file: exit 1, silent" silent_no
if command -v mkfs.ext4 >/dev/null; then
  truncate -s 16M "$T/ext4.img"
  mkfs.ext4 -q -F "$T/ext4.img"
  probe "$T/ext4.img"
  check "ext4: exit 1, silent" silent_no
fi
probe
check "no argument: usage error (2)" test $rc -eq 2
probe -x "$T/a.img"
check "an option: usage error (2)" test $rc -eq 2

# Random and damaged inputs: exit 0 or 1, never a crash; 1 prints nothing,
# 0 prints only ID_FS_ lines that name plyfs.
seed=${PLYFS_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
echo "random inputs: seed $seed (PLYFS_SEED=$seed replays them)"
python3 - "$T" "$T/a.img" "$seed" <<'PY'
import os, random, sys
d, base, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rnd = random.Random(seed)
img = open(base, 'rb').read(256 * 1024)
full = os.path.getsize(base)
n = 0
def put(data, size=None):  # size: the file's length, sparse past the data
    global n
    with open(f"{d}/r{n:03d}.bin", 'wb') as f:
        f.write(data)
        if size: f.truncate(size)
    n += 1
for size in (1, 511, 4096, 65536 + 100, 196607, 196608, 262144):
    put(rnd.randbytes(size))
for _ in range(30):  # the magic in both slots, the rest random
    b = bytearray(rnd.randbytes(rnd.choice((196608, 262144))))
    for off in (65536, 131072):
        b[off:off + 8] = b'PLYFSSB1'
    put(bytes(b))
for _ in range(80):  # a valid image, bytes of its superblocks flipped or zeroed
    b = bytearray(img)
    slots = rnd.choice(((65536,), (131072,), (65536, 131072)))
    for _ in range(rnd.randint(1, 8)):
        off = rnd.choice(slots) + rnd.randrange(4096)
        b[off] = 0 if rnd.random() < 0.3 else b[off] ^ (1 << rnd.randrange(8))
    put(bytes(b), full)
for _ in range(10):  # cut short
    put(img[:rnd.randrange(len(img))])
PY
bad=0 found=0
for f in "$T"/r*.bin; do
  probe "$f"
  if [[ $rc -eq 1 ]]; then
    [[ ! -s $T/out && ! -s $T/err ]] || { echo "  $f: exit 1 but printed output"; bad=$((bad + 1)); }
  elif [[ $rc -eq 0 ]]; then
    found=$((found + 1))
    if ! is_var ID_FS_TYPE plyfs >/dev/null || grep -qv '^ID_FS_[A-Z_]*=' "$T/out"; then
      echo "  $f: malformed output"; bad=$((bad + 1))
    fi
  else
    echo "  $f: exit status $rc"; cat "$T/err"; bad=$((bad + 1))
  fi
done
echo "  $(ls "$T"/r*.bin | wc -l) inputs, $found read as plyfs (a damaged slot beside a good one)"
check "random and damaged inputs: no crash, no stray output" test $bad -eq 0

echo "$fails failed"
[[ $fails -eq 0 ]]
