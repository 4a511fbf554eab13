# bash completion for plyctl(8): commands, subcommands, options, and the
# branch and view names of the image or mount point already on the line
# (read with plyctl ... --json, or from MOUNTPOINT/.plyfs/layers).
# Installed as share/bash-completion/completions/plyctl.

# The names of an image's branches or views ("branch" or "view"), or of
# the branches a mount point reaches (its views: from its daemon). Names with JSON escapes are skipped:
# they would need quoting anyway.
_plyctl_names() {
    local prog=$1 what=$2 where=$3
    if [[ -d $where && $what == branch ]]; then
        [[ -d $where/.plyfs/layers ]] && command ls -1 -- "$where/.plyfs/layers" 2>/dev/null
        return
    fi
    [[ -n $where && -e $where ]] || return
    "$prog" "$what" list "$where" --json 2>/dev/null |
        grep -o '"name":"[^"\\]*"' | sed -e 's/^"name":"//' -e 's/"$//'
}

# COMPREPLY: the names that start with the word being completed, quoted for
# the shell (a name may hold spaces).
_plyctl_reply_names() {
    local cur=$1 names=$2 IFS=$'\n' m
    COMPREPLY=()
    for m in $(compgen -W "$names" -- "$cur"); do
        COMPREPLY+=("$(printf '%q' "$m")")
    done
}

_plyctl() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local prog=${COMP_WORDS[0]} cmd=${COMP_WORDS[1]-} sub=${COMP_WORDS[2]-}
    local IFS=$'\n'
    COMPREPLY=()

    if ((COMP_CWORD == 1)); then
        COMPREPLY=($(compgen -W $'show\nbranch\nlayer\nview\nsnapshot\nclone\nmerge\nrollback\ndelete\ndiff\nhold\nrelease\nsync\nimport\nexport\nsend\nreceive\ndevice\npolicy\nwhere\ndu\ntrim\nresize\nscrub\ndebug\n--help\n--version' -- "$cur"))
        return
    fi
    # Words that are not options, after the command (and subcommand).
    local first=2
    case $cmd in branch | layer | view | debug | device | policy) first=3 ;; esac
    if ((COMP_CWORD == 2 && first == 3)); then
        local subs
        case $cmd in
            branch) subs=$'list\ncreate\nremove\nset\nadd\nmove' ;;
            layer) subs=$'list\ncreate\ndelete' ;;
            view) subs=$'list\ncreate\ndelete\ndefault' ;;
            debug) subs=$'tree\nfields\ncorrupt' ;;
            device) subs=$'list\nadd\nremove\nreplace' ;;
            policy) subs=$'list\nset\ntest\napply' ;;
        esac
        COMPREPLY=($(compgen -W "$subs" -- "$cur"))
        return
    fi
    local -a args=()
    local i w skip=0
    for ((i = first; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        if ((skip)); then skip=0; continue; fi
        case $w in
            --at | --name | --clone | --parent | --on | --view | --branch | --to | --set | --flip | --add | --format | --compress | --rate | --file | --gid | --mode | --image | --class | --first-class | -o | -f) skip=1 ;;
            -*) ;;
            *) args+=("$w") ;;
        esac
    done
    local target=${args[0]-}

    # The value of an option.
    case $prev in
        --clone | --parent | --on | --branch | --to)
            _plyctl_reply_names "$cur" "$(_plyctl_names "$prog" branch "$target")"; return ;;
        --view)
            _plyctl_reply_names "$cur" "$(_plyctl_names "$prog" view "$target")"; return ;;
        --at | --name | --set | --flip | --add | --rate | --gid | --mode | --class | --first-class) return ;;
        --format)
            [[ $cmd == import ]] && COMPREPLY=($(compgen -W $'dir\ntar\noci-layer\noci\next4' -- "$cur"))
            [[ $cmd == export ]] && COMPREPLY=($(compgen -W $'tar\noci-layer' -- "$cur"))
            return ;;
        --compress)
            if [[ $cmd == send ]]; then COMPREPLY=($(compgen -W $'zstd\nzstd:1\nzstd:3\nzstd:9\nnone' -- "$cur"))
            else COMPREPLY=($(compgen -W $'zstd\ngzip\nnone' -- "$cur")); fi
            return ;;
        -o | -f | --file | --image) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    esac

    local opts="--json"
    case "$cmd $sub" in
        "branch create") opts+=$'\n--clone\n--parent\n--ro' ;;
        "branch list") opts+=$'\n--all' ;;
        "branch set") opts+=$'\n--name\n--ro\n--rw\n--save\n--quota\n--exclusive-quota\n--compress' ;;
        "branch add") opts+=$'\n--at\n--ro\n--save' ;;
        "branch remove" | "branch move") opts+=$'\n--save' ;;
        "layer create") opts+=$'\n--on\n--ro' ;;
        "view create") opts+=$'\n--default' ;;
        "debug corrupt"*) opts+=$'\n--set\n--flip\n--zero\n--add\n--keep-checksum' ;;
        "policy set") opts+=$'\n--file' ;;
        "device add") opts+=$'\n--class\n--first-class\n--force' ;;
        "device replace") opts+=$'\n--force' ;;
        "policy test") opts+=$'\n--gid\n--mode\n--image' ;;
    esac
    case $cmd in
        snapshot) opts+=$'\n--view\n--branch\n--name' ;;
        rollback) opts+=$'\n--to' ;;
        clone) opts+=$'\n--ro' ;;
        diff) opts+=$'\n-z' ;;
        import) opts+=$'\n--parent\n--format\n--ro\n--force' ;;
        export) opts+=$'\n-o\n--format\n--compress' ;;
        send) opts+=$'\n-o\n--parent\n--compress' ;;
        receive) opts+=$'\n-f\n--name' ;;
        trim) opts+=$'\n--minimum' ;;
        scrub) opts+=$'\n--rate' ;;
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
        return
    fi

    # Positional words: the image or mount point first, then names.
    local n=${#args[@]}
    if ((n == 0)); then
        case "$cmd $sub" in
            "debug fields")
                COMPREPLY=($(compgen -W $'superblock\nnode\nspace-item\nroot-record\nfsinfo\ninode\ndirent\nwhiteout\nxattr\nxattr-chunk\nextent\ninline\norphan' -- "$cur")) ;;
            "branch add" | "branch move")
                COMPREPLY=($(compgen -d -- "$cur")) ;;
            *)
                COMPREPLY=($(compgen -f -- "$cur")) ;;
        esac
        return
    fi
    local names=
    case "$cmd $sub" in
        "branch remove" | "branch set" | "branch add" | "branch move" | "layer delete")
            ((n == 1)) && names=branch ;;
        "view delete" | "view default")
            ((n == 1)) && names=view ;;
        "view create")
            ((n == 2)) && names=branch ;;
        "debug tree")
            ((n == 1)) && COMPREPLY=($(compgen -W $'root\nspace' -- "$cur")) ;;
    esac
    case $cmd in
        merge | rollback | delete) ((n == 1)) && names=branch ;;
        hold | release) ((n >= 1)) && names=branch ;;
        clone) ((n == 1)) && names=branch ;;
        diff) ((n == 1 || n == 2)) && names=branch ;;
        export | du | send) ((n == 1)) && names=branch ;;
        import) ((n == 2)) && COMPREPLY=($(compgen -f -- "$cur")) ;;
        scrub) ((n == 1)) && COMPREPLY=($(compgen -W $'status\ncancel' -- "$cur")) ;;
    esac
    [[ -n $names ]] && _plyctl_reply_names "$cur" "$(_plyctl_names "$prog" "$names" "$target")"
    return 0
}

complete -F _plyctl plyctl
