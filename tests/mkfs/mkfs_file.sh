#!/bin/bash
# mkfs.plyfs on image files (no root needed).
# Usage: mkfs_file.sh MKFS SUPER_DUMP
set -euo pipefail

MKFS=$1
DUMP=$2
T=$(mktemp -d "${TMPDIR:-/tmp}/mkfs_file.XXXXXX")
NODEV=/dev/plyfs-mkfs-test-no-such-device  # must never be created
# rm -f "$NODEV": a broken mkfs.plyfs run as root must not leave it behind.
trap 'rm -rf "$T"; rm -f "$NODEV" 2>/dev/null || true' EXIT

fails=0
check() {  # check "what" command...: the command must succeed
  local what=$1; shift
  if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}

# run ARGS...: runs mkfs.plyfs, leaving its exit status in $rc, stdout in
# $T/out and stderr in $T/err.
run() {
  set +e
  "$MKFS" "$@" >"$T/out" 2>"$T/err"
  rc=$?
  set -e
}
# The key's value in super_dump's output for an image.
field() { "$DUMP" "$1" | sed -n "s/^$2=//p"; }
sum() { sha256sum "$1" | cut -d' ' -f1; }
# Exit 1 and exactly one line on stderr, starting "mkfs.plyfs: " (and
# containing $1 if given, case-insensitively).
one_line_error() {
  [[ $rc -eq 1 ]] || { echo "  exit status $rc, expected 1"; return 1; }
  [[ $(wc -l <"$T/err") -eq 1 ]] || { echo "  stderr is not one line:"; cat "$T/err"; return 1; }
  grep -q '^mkfs.plyfs: ' "$T/err" || { echo "  stderr lacks the prefix:"; cat "$T/err"; return 1; }
  [[ -z ${1:-} ]] || sed 's/^mkfs.plyfs: //' "$T/err" | grep -qi -- "$1" ||
    { echo "  stderr lacks '$1':"; cat "$T/err"; return 1; }
}
# A usage error: exit 1, the first line starts "mkfs.plyfs: ", at most two lines.
usage_error() {
  [[ $rc -eq 1 ]] && [[ $(wc -l <"$T/err") -le 2 ]] && head -1 "$T/err" | grep -q '^mkfs.plyfs: '
}
is_dump() {  # is_dump IMAGE KEY VALUE
  local v; v=$(field "$1" "$2") || return 1
  [[ $v == "$3" ]] || { echo "  $2=$v, expected $3"; return 1; }
}

IMG=$T/img
UUID=0f1e2d3c-4b5a-4678-9a0b-1c2d3e4f5a6b

# --- a new sparse image
run -s 64M -L mydata -U "$UUID" "$IMG"
check "create a 64 MiB image" test $rc -eq 0
check "apparent size is 64 MiB" test "$(stat -c %s "$IMG")" -eq $((64 << 20))
alloc_kib=$(du -k "$IMG" | cut -f1)
check "the image is sparse ($alloc_kib KiB allocated)" test "$alloc_kib" -lt 4096
check "generation 3" is_dump "$IMG" generation 3
check "slot 0 valid" is_dump "$IMG" slot0 valid
check "slot 1 valid" is_dump "$IMG" slot1 valid
check "block size 4096" is_dump "$IMG" block_size 4096
check "16384 blocks" is_dump "$IMG" total_blocks 16384
check "label" is_dump "$IMG" label mydata
check "uuid from -U" is_dump "$IMG" uuid "$UUID"
check "summary names the uuid" grep -q "UUID *$UUID" "$T/out"
check "summary names the label" grep -q "Label *mydata" "$T/out"
check "summary names the size" grep -q "Size *64.00 MiB (16384 blocks of 4096 bytes)" "$T/out"
check "summary names the generation" grep -q "Generation *3" "$T/out"
check "nothing on stderr" test ! -s "$T/err"

# --- an existing plyfs filesystem is kept without -f
before=$(sum "$IMG")
run "$IMG"
check "refuses an existing plyfs without -f" one_line_error "contains a plyfs file system"
check "refusal names the label" grep -q "mydata" "$T/err"
check "refused image unchanged" test "$(sum "$IMG")" = "$before"
run -s 64M "$IMG"
check "refuses with -s too" one_line_error "contains a plyfs file system"
check "still unchanged" test "$(sum "$IMG")" = "$before"

# --- -n writes nothing
run -n -s 64M "$T/new"
check "-n on a new path succeeds" test $rc -eq 0
check "-n creates no file" test ! -e "$T/new"
check "-n says it is a dry run" grep -q "Would create" "$T/out"
run -n -f -s 128M -L other "$IMG"
check "-n -f on an existing image succeeds" test $rc -eq 0
check "-n -f changes nothing" test "$(sum "$IMG")" = "$before"
check "-n -f does not extend" test "$(stat -c %s "$IMG")" -eq $((64 << 20))
run -n "$IMG"
check "-n without -f refuses as a real run would" one_line_error "contains a plyfs file system"

# --- -f overwrites, with a fresh uuid
run -f -q "$IMG"
check "-f succeeds" test $rc -eq 0
check "-q prints nothing" test ! -s "$T/out"
new_uuid=$(field "$IMG" uuid)
check "-f gives a new uuid" test "$new_uuid" != "$UUID"
check "-f: generation 3" is_dump "$IMG" generation 3
check "-f: no label" is_dump "$IMG" label ""
check "-f: same size" is_dump "$IMG" total_blocks 16384

# --- sizes of an existing file: grow to -s, or span only -s
truncate -s 1M "$T/small"
run -s 8MiB "$T/small"
check "grow a small file to -s" test $rc -eq 0
check "grown to 8 MiB" test "$(stat -c %s "$T/small")" -eq $((8 << 20))
check "grown: 2048 blocks" is_dump "$T/small" total_blocks 2048
truncate -s 32M "$T/big"
run -s 16M "$T/big"
check "-s smaller than the file" test $rc -eq 0
check "the file keeps its size" test "$(stat -c %s "$T/big")" -eq $((32 << 20))
check "the filesystem spans -s" is_dump "$T/big" total_blocks 4096
truncate -s 32M "$T/whole"
run "$T/whole"
check "no -s: the whole file" is_dump "$T/whole" total_blocks 8192

# --- block sizes
run -b 16384 -s 32M "$T/b16k"
check "-b 16384" test $rc -eq 0
check "-b 16384 block size" is_dump "$T/b16k" block_size 16384
check "-b 16384 blocks" is_dump "$T/b16k" total_blocks 2048
for bs in 1000 3000 131072 0 x; do
  run -b $bs -s 32M "$T/bad_b$bs"
  check "-b $bs refused" one_line_error "block size"
  check "-b $bs creates nothing" test ! -e "$T/bad_b$bs"
done

# --- bad sizes
for s in 12Q '' 100K 12KB 64Mx 64MiBs '64 M' 0x4000000 -5M +5M 0 \
    99999999999999999999G 17179869184T; do
  run -s "$s" "$T/bad_size"
  check "-s '$s' refused" one_line_error "size\|small"
  check "-s '$s' creates nothing" test ! -e "$T/bad_size"
done
run -s 33554432 "$T/plain_bytes"
check "-s in plain bytes" is_dump "$T/plain_bytes" total_blocks 8192
run -s 32768K "$T/kib"
check "-s with K" is_dump "$T/kib" total_blocks 8192
run -s 1GiB "$T/gib"
check "-s with GiB" is_dump "$T/gib" total_blocks 262144
check "summary in GiB" grep -q "Size *1.00 GiB (262144 blocks of 4096 bytes)" "$T/out"
# One size rule for every tool (util/parse.h): plyfs -o cache=1g takes 1g.
run -s 1g "$T/g"
check "-s 1g: units in any case" is_dump "$T/g" total_blocks 262144
run -s 1.5G "$T/g15"
check "-s 1.5G: a decimal size" is_dump "$T/g15" total_blocks 393216
run -s 64MB "$T/mb"
check "-s 64MB: powers of 1000 (64,000,000 bytes)" is_dump "$T/mb" total_blocks 15625
run -s 64mib "$T/mib"
check "-s 64mib" is_dump "$T/mib" total_blocks 16384
run -b 16k -s 32M "$T/b16"
check "-b 16k: the block size takes the same units" is_dump "$T/b16" block_size 16384
run -s 8M "$T/no_such_dir/img"
check "a missing directory: strerror ends the line" one_line_error "cannot create $T/no_such_dir/img: No such file or directory"
run "$T/no_such_file"
check "a missing file without -s" one_line_error "-s"
check "... creates nothing" test ! -e "$T/no_such_file"
mkdir "$T/dir"
run -s 8M "$NODEV"
check "a missing /dev path is not created as a file" one_line_error "no such device"
check "... and nothing appears in /dev" test ! -e "$NODEV"
# /dev/shm is a tmpfs of its own: an image there is an ordinary file.
SHM=/dev/shm/plyfs-mkfs-test-$$.img
if [[ -d /dev/shm && -w /dev/shm ]] && [[ $(stat -c %d /dev/shm) != $(stat -c %d /dev) ]]; then
  run -s 8M "$SHM"
  check "an image in /dev/shm is created" test $rc -eq 0
  check "... and is plyfs" is_dump "$SHM" generation 3
  rm -f "$SHM"
else
  echo "note: no writable /dev/shm of its own; that check did not run"
fi
run -f "$T/dir"
check "a directory is refused" one_line_error "regular file"

# --- other arguments
run -L "$(printf 'x%.0s' {1..65})" -s 32M "$T/long_label"
check "a 65-byte label is refused" one_line_error label
check "... and creates nothing" test ! -e "$T/long_label"
run -L "$(printf 'x%.0s' {1..64})" -s 32M "$T/label64"
check "a 64-byte label is accepted" is_dump "$T/label64" label "$(printf 'x%.0s' {1..64})"
run -U not-a-uuid -s 32M "$T/bad_uuid"
check "a bad uuid is refused" one_line_error uuid
run -U random -s 32M "$T/random_uuid"
check "-U random" test $rc -eq 0
run
check "no device: usage error" usage_error
run -Z "$T/x"
check "unknown option: usage error" usage_error
run --bogus "$T/x"
check "unknown long option: usage error" usage_error
run "$T/a" "$T/b"
check "two devices: usage error" usage_error
run -s
check "-s without a value: usage error" usage_error
check "usage errors create nothing" test ! -e "$T/x" -a ! -e "$T/a" -a ! -e "$T/b"
run -h
check "-h exits 0" test $rc -eq 0
check "-h prints usage" grep -q '^Usage: mkfs.plyfs' "$T/out"
run -V
check "-V exits 0" test $rc -eq 0
check "-V prints the version" grep -qx 'mkfs.plyfs (plyfs) [0-9][0-9.]*' "$T/out"

# --- a foreign filesystem (ext4) in an image file
if command -v mkfs.ext4 >/dev/null && command -v blkid >/dev/null; then
  mkfs.ext4 -q -F -L extdata "$T/ext4" 16M >/dev/null
  before=$(sum "$T/ext4")
  run "$T/ext4"
  check "ext4 refused without -f" one_line_error "contains an ext4 file system"
  check "refusal names the ext4 label" grep -q "extdata" "$T/err"
  check "ext4 image unchanged" test "$(sum "$T/ext4")" = "$before"
  run -n -f "$T/ext4"
  check "-n -f on ext4 succeeds" test $rc -eq 0
  check "-n -f leaves ext4 alone" test "$(sum "$T/ext4")" = "$before"
  run -f "$T/ext4"
  check "ext4 formatted with -f" test $rc -eq 0
  check "blkid no longer sees ext4" test -z "$(blkid -p -o value -s TYPE "$T/ext4" || true)"
  check "plyfs after ext4" is_dump "$T/ext4" generation 3
else
  echo "note: mkfs.ext4 or blkid not found; the ext4 checks did not run"
fi

# --- a partition table (an MBR with one Linux partition, written by hand so
# that no partitioning tool is needed)
truncate -s 16M "$T/parted"
printf '\x00\x20\x21\x00\x83\x00\x00\x00\x00\x08\x00\x00\x00\x78\x00\x00' |
  dd of="$T/parted" bs=1 seek=446 conv=notrunc status=none
printf '\x55\xaa' | dd of="$T/parted" bs=1 seek=510 conv=notrunc status=none
before=$(sum "$T/parted")
run "$T/parted"
check "a partition table is refused" one_line_error "dos partition table"
check "... and left unchanged" test "$(sum "$T/parted")" = "$before"
run -f -q "$T/parted"
check "-f formats over a partition table" test $rc -eq 0
check "-f wiped the MBR signature" test "$(od -An -tx1 -j510 -N2 "$T/parted" | tr -d ' ')" != 55aa

# --- a signature that formatting itself would not overwrite: RAID 0.90
# metadata, whose magic sits 64 KiB before the end. Only the libblkid wipe
# of -f removes it.
md_off=$(((16 << 20) - 65536))
truncate -s 16M "$T/md"
printf '\xfc\x4e\x2b\xa9' | dd of="$T/md" bs=1 seek=$md_off conv=notrunc status=none
before=$(sum "$T/md")
run "$T/md"
check "a RAID member is refused" one_line_error linux_raid_member
check "... and left unchanged" test "$(sum "$T/md")" = "$before"
run -f -q "$T/md"
check "-f formats over a RAID member" test $rc -eq 0
check "-f wiped the RAID magic" test "$(od -An -tx1 -j$md_off -N4 "$T/md" | tr -d ' ')" = 00000000
check "plyfs after the RAID member" is_dump "$T/md" generation 3

# --- one device by two names (a path and ./path, a symlink) is one device
# given twice: refused in one line, nothing written.
truncate -s 64M "$T/two0" "$T/two1"
ln -sf "$T/two0" "$T/two0.link"
before=$(sum "$T/two0")
run -q "$T/two0" "$T/two0.link"
check "a device and a symlink to it: refused" one_line_error "are the same device"
run -q -C "fast=$T/two0" -C "slow=$T/./two0"
check "a device with two classes by two names: refused" one_line_error "given a class twice"
check "... nothing written" test "$(sum "$T/two0")" = "$before"
run -q -s 64M "$T/new0" "$T/./new0"
check "a file not made yet by two names: refused" one_line_error "are the same device"
check "... and not made" test ! -e "$T/new0"
run "$T/./two0" -C "fast=$T/two0" -C "slow=$T/two1"
check "a positional device and its --class by another name: one device" test $rc -eq 0
check "... of class fast, and two devices in all" \
  test "$(grep -c '^  Device [0-9]' "$T/out")" -eq 2 -a "$(grep -c "two0: 64.00 MiB, class fast" "$T/out")" -eq 1

# --- discard: an existing image's blocks become holes (mke2fs does the
# same); -K keeps them. On a terminal a progress line shows how far it is.
head -c $((8 << 20)) /dev/urandom >"$T/full"
run -f -q -s 8M "$T/full"
check "discarded: the image is sparse again" test "$(du -k "$T/full" | cut -f1)" -lt 1024
head -c $((8 << 20)) /dev/urandom >"$T/kept"
run -f -q -K -s 8M "$T/kept"
check "-K: no discard" test "$(du -k "$T/kept" | cut -f1)" -ge 7000
check "-K: plyfs all the same" is_dump "$T/kept" generation 3
if command -v script >/dev/null; then
  truncate -s 3G "$T/large"
  script -qec "$MKFS -f $T/large" /dev/null >"$T/tty" 2>&1
  check "on a terminal, discarding a large image shows the progress line" \
    grep -q "discarding $T/large: [0-9.]* GiB / 3.00 GiB ([0-9]*%)" "$T/tty"
  script -qec "$MKFS -f -q $T/large" /dev/null >"$T/tty" 2>&1
  check "... not with -q" test ! -s "$T/tty"
  run -f "$T/large"
  check "... nor when stderr is no terminal" test ! -s "$T/err"
else
  echo "note: script(1) not found; the progress line was not checked"
fi

if [[ $fails -ne 0 ]]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"
