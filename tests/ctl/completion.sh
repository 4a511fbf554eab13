#!/bin/bash
# plyctl's bash completion (ctl/plyctl.bash), sourced and called as bash
# calls it: COMP_WORDS and COMP_CWORD set, _plyctl run, COMPREPLY checked.
# Usage: completion.sh COMPLETION_FILE MKFS PLYCTL
set -u
export LC_ALL=C  # sort's order
COMPLETION=$1 MKFS=$2 PLYCTL=$3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0

# shellcheck source=/dev/null
source "$COMPLETION"
complete -p plyctl >/dev/null || { echo "FAIL: the file does not register _plyctl for plyctl"; exit 1; }

# complete WORD... : COMPREPLY for the last word, one per line, sorted.
complete_line() {
    COMP_WORDS=("$PLYCTL" "$@")
    COMP_CWORD=$#
    COMP_LINE="${COMP_WORDS[*]}"
    COMP_POINT=${#COMP_LINE}
    _plyctl
    printf '%s\n' "${COMPREPLY[@]}" | sort
}
expect() {
    local what=$1 want=$2
    shift 2
    local got
    got=$(complete_line "$@")
    if [[ $got == "$want" ]]; then
        echo "ok: $what"
    else
        echo "FAIL: $what: plyctl $*"
        echo "  want: $(printf '%q' "$want")"
        echo "  got:  $(printf '%q' "$got")"
        fails=$((fails + 1))
    fi
}

IMG=$T/disk.img
truncate -s 64M "$IMG"
"$MKFS" "$IMG" >/dev/null || { echo "FAIL: mkfs"; exit 1; }
"$PLYCTL" layer create "$IMG" work --on main >/dev/null
"$PLYCTL" branch create "$IMG" "my branch" >/dev/null
"$PLYCTL" view create "$IMG" dev work=rw:main=ro >/dev/null

expect "commands" $'branch' br
expect "commands starting with d" $'debug\ndelete\ndevice\ndiff\ndu' d
expect "commands starting with p" 'policy' p
expect "branch subcommands" $'add\ncreate\nlist\nmove\nremove\nset' branch ''
expect "device subcommands" $'add\nlist\nremove\nreplace' device ''
expect "options of device add" $'--class\n--first-class\n--force\n--json' device add "$IMG" x -
expect "policy subcommands" $'apply\nlist\nset\ntest' policy ''
expect "options of policy test" $'--gid\n--image\n--json\n--mode' policy test /mnt/x 1M -
expect "options of policy set" $'--file\n--json' policy set "$IMG" -
expect "commands starting with w" 'where' w
expect "layer subcommands" $'create\ndelete\nlist' layer ''
expect "options of branch create" $'--clone\n--json\n--parent\n--ro' branch create "$IMG" x -
expect "options of diff" $'--json\n-z' diff "$IMG" a b -
expect "the image as a file" "$IMG" branch list "$T/di"
expect "branch names of the image" $'main\nmy\\ branch\nwork' branch remove "$IMG" ''
expect "branch names by prefix" 'my\ branch' delete "$IMG" m'y'
expect "hold and release take branch names, one after another" 'my\ branch' hold "$IMG" work m'y'
expect "commands starting with r" $'receive\nrelease\nresize\nrollback' r
expect "commands starting with h" $'hold' h
expect "commands starting with s" $'scrub\nsend\nshow\nsnapshot\nsync' s
expect "options of send" $'--compress\n--json\n--parent\n-o' send "$IMG" main -
expect "send --parent takes a branch" $'work' send "$IMG" main --parent w
expect "options of receive" $'--json\n--name\n-f' receive "$IMG" -
expect "scrub: status and cancel after the mount point" $'cancel\nstatus' scrub "$T/mnt" ''
expect "options of scrub" $'--json\n--rate' scrub "$IMG" -
expect "--parent takes a branch" $'work' branch create "$IMG" new --parent w
expect "diff: both names are branches" $'main\nmy\\ branch\nwork' diff "$IMG" main ''
expect "view names" $'dev' view delete "$IMG" ''
expect "no names for a new branch" '' branch create "$IMG" ''
expect "debug tree" $'root\nspace' debug tree "$IMG" ''
mkdir -p "$T/mnt/.plyfs/layers/a" "$T/mnt/.plyfs/layers/b"  # what a mount point shows there
expect "a mount point's branches (.plyfs/layers)" $'a\nb' branch add "$T/mnt" ''
if ((fails)); then
    echo "$fails failed"
    exit 1
fi
