# Shared by bind-mount's scripts (sourced, POSIX sh).
gate=${NODEGATE_GATE:?}
cfg=${NODEGATE_CONFIG_DIR:?}
state=${NODEGATE_STATE_DIR:?}
fstab=/etc/fstab
begin="# BEGIN NodeGate bind-mount (gate $gate): managed, removed when the package is uninstalled"
end="# END NodeGate bind-mount (gate $gate)"
managed=$state/mounts        # "SOURCE TARGET OPTIONS" of every mount we made, one a line
created=$state/created       # targets we created (removed again with their mount)

# The stage runs chrooted in the agent's pod, whose mount namespace is the pod's: a mount made there
# would vanish with the pod. The host's PID 1 (hostPID) holds the node's mount namespace.
host() { nsenter --mount=/proc/1/ns/mnt -- "$@"; }

# The `mounts` key as "SOURCE TARGET OPTIONS" lines (OPTIONS: bind, or bind,ro).
wanted() {
    [ -e "$cfg/mounts" ] || return 0
    sed -e 's/[[:space:]]*#.*$//' "$cfg/mounts" | while read -r source target mode extra; do
        [ -n "$source" ] || continue
        if [ -z "$target" ] || [ -n "$extra" ]; then echo "mounts: '$source $target $mode $extra' is not 'SOURCE TARGET [ro|rw]'" >&2; return 1; fi
        case "$source$target" in *[!A-Za-z0-9/._@+-]*) echo "mounts: '$source' or '$target' has characters fstab cannot hold" >&2; return 1 ;; esac
        case "$source" in /*) ;; *) echo "mounts: source '$source' is not an absolute path" >&2; return 1 ;; esac
        case "$target" in /*) ;; *) echo "mounts: target '$target' is not an absolute path" >&2; return 1 ;; esac
        case "$target" in /|/etc|/proc|/sys|/dev|/run|/usr|/var) echo "mounts: will not mount over $target" >&2; return 1 ;; esac
        case "${mode:-rw}" in rw) echo "$source $target bind" ;; ro) echo "$source $target bind,ro" ;;
            *) echo "mounts: '$mode' is not ro or rw" >&2; return 1 ;; esac
    done
}

# Whether TARGET is a mount point in the host's mount namespace, showing SOURCE's directory.
is_mounted() {
    host cat /proc/self/mountinfo | awk -v t="$2" '$5 == t { found = 1 } END { exit !found }' || return 1
    [ ! -L "$2" ] && [ "$(stat -L -c %d:%i "$1")" = "$(stat -L -c %d:%i "$2")" ]
}
is_read_only() {
    host cat /proc/self/mountinfo | awk -v t="$1" '$5 == t { opts = $6 } END { exit !(opts ~ /(^|,)ro(,|$)/) }'
}

# /etc/fstab with our block replaced by stdin (an empty stdin removes the block), written atomically.
write_fstab() {
    block=$(cat)
    tmp=$fstab.nodegate-tmp
    touch "$fstab"
    awk -v b="$begin" -v e="$end" '$0 == b { skip = 1 } !skip { print } $0 == e { skip = 0 }' "$fstab" > "$tmp"
    if [ -n "$block" ]; then printf '%s\n%s\n%s\n' "$begin" "$block" "$end" >> "$tmp"; fi
    chmod --reference="$fstab" "$tmp" 2>/dev/null || chmod 0644 "$tmp"
    mv "$tmp" "$fstab"
}

unmount() {   # SOURCE TARGET
    if is_mounted "$1" "$2"; then host umount "$2"; echo "unmounted $2"; fi
    # A target made for the mount goes with it, removed where it was made (the host's namespace). It
    # stays on the list until it is gone, so the uninstall check can see one left behind.
    if grep -qxF "$2" "$created" 2>/dev/null; then
        if [ -d "$2" ]; then host rmdir "$2" || echo "could not remove $2"; else host rm -f "$2"; fi
        if ! host test -e "$2"; then
            echo "removed $2 (created for the mount)"
            grep -vxF "$2" "$created" > "$created.tmp" || true; mv "$created.tmp" "$created"
        fi
    fi
}
