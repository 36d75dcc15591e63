#!/bin/sh
# apply, config, upgrade: the host's bind mounts and fstab entries are exactly the `mounts` key's.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
mkdir -p "$state"; touch "$managed" "$created"
want=$(mktemp)
wanted > "$want"

# Mounts that left the config go first (a target may be reused by a new entry).
while read -r source target options; do
    grep -qxF "$source $target $options" "$want" && continue
    unmount "$source" "$target"
done < "$managed"

while read -r source target options; do
    [ -d "$source" ] || [ -f "$source" ] || { echo "mounts: source $source does not exist on the host"; exit 1; }
    if ! host test -e "$target"; then
        echo "$target" >> "$created"   # recorded first: a crash right after must not leave it unowned
        if [ -d "$source" ]; then host mkdir -p "$target"; else host mkdir -p "$(dirname "$target")"; host touch "$target"; fi
    fi
    if ! is_mounted "$source" "$target"; then
        host mount --bind "$source" "$target"
        echo "mounted $source on $target"
    fi
    case "$options" in *ro*) is_read_only "$target" || host mount -o remount,bind,ro "$target" ;;
        *) ! is_read_only "$target" || host mount -o remount,bind,rw "$target" ;; esac
done < "$want"

awk '{ printf "%s %s none %s 0 0\n", $1, $2, $3 }' "$want" | write_fstab
mv "$want" "$managed"
echo "$(wc -l < "$managed") bind mounts in $fstab"
