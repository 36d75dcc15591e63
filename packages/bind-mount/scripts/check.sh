#!/bin/sh
# $1 = present (apply, config, upgrade and post-interrupt checks) or absent (uninstall-check).
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
problems=$(mktemp)
bad() { echo "$*" >> "$problems"; }
if [ "$1" = present ]; then
    wanted | while read -r source target options; do
        if ! is_mounted "$source" "$target"; then bad "$target is not a bind mount of $source on the host"; continue; fi
        case "$options" in *ro*) is_read_only "$target" || bad "$target is mounted read-write, want ro" ;;
            *) ! is_read_only "$target" || bad "$target is mounted read-only, want rw" ;; esac
        grep -qxF "$source $target none $options 0 0" "$fstab" || bad "$fstab has no entry for $target (it would not come back after a reboot)"
        echo "ok: $source on $target ($options)"
    done
else
    [ -e "$managed" ] && while read -r source target options; do
        ! is_mounted "$source" "$target" || bad "$target is still mounted"
        ! grep -qF " $target none " "$fstab" || bad "$fstab still has an entry for $target"
        ! grep -qxF "$target" "$created" 2>/dev/null || ! host test -e "$target" || bad "$target, created for the mount, is left behind"
    done < "$managed"
    ! grep -qxF "$begin" "$fstab" || bad "$fstab still holds NodeGate's block"
fi
if [ -s "$problems" ]; then cat "$problems"; rm -f "$problems"; exit 1; fi
rm -f "$problems"
echo "bind mounts as the config says ($1)"
