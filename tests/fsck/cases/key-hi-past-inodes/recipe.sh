# The reproducer of issue 21 (shared/repro/fsck-segv-key-hi.img.zst, 6.8 MB
# compressed, so only this recipe is kept): an image with two branches,
# files, xattrs (one out of line), hard links, symlinks and a copy-up layer,
# committed twice, so that the older generation holds the same leaf; then
# the last item of the leaf holding a file's items gets a key far past
# every inode, 0x10000000000001fb, with the leaf's checksum recomputed.
needs_fuse
"$MKFS" -q -s 64M "$IMG"
mount_img "$IMG" "$MNT"
mkdir "$MNT/dir"
for i in $(seq 1 300); do echo "file $i" >"$MNT/dir/f$i"; done
head -c 200000 /dev/urandom >"$MNT/big"
ln "$MNT/dir/f1" "$MNT/hard"
ln -s dir/f2 "$MNT/sym"
setfattr -n user.small -v hello "$MNT/dir/f3"
setfattr -n user.large -v "$(head -c 2400 /dev/zero | tr '\0' a)" "$MNT/big"
ino=$(stat -c %i "$MNT/dir/f20")
umount_img "$MNT"
"$CTL" layer create "$IMG" work --on main
mount_img "$IMG" "$MNT" layer=work
echo changed >>"$MNT/dir/f5"   # copied up into work
echo new >"$MNT/new"
umount_img "$MNT"
"$CTL" debug corrupt "$IMG" inode main "$ino" leaf.last.key.hi --set 0x10000000000001fb
