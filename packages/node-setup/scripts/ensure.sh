#!/bin/sh
# apply, config, upgrade: the kernel package installed, held (unless hold: false) and GRUB's default
# boot entry. The running kernel changes only with the reboot the gate declares.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
mkdir -p "$state"
# The config moved to another kernel: the previous one loses our hold (the node may run it, so it stays).
if [ -s "$state/package" ] && [ "$(cat "$state/package")" != "$package" ]; then
    previous=$(cat "$state/package")
    if [ ! -e "$held_before" ]; then
        case "$pm" in apt) apt-mark unhold "$previous" >/dev/null ;; dnf) dnf -q versionlock delete "$previous" >/dev/null ;; esac
        echo "$previous no longer held (the config names $package now)"
    fi
    rm -f "$state/hold-recorded" "$held_before" "$installed_by_us"
fi
echo "$package" > "$state/package"
if ! is_installed; then
    echo "$package is not installed on $node: installing it"
    : > "$installed_by_us"   # recorded first: a crash right after must not leave it unowned
    case "$pm" in
        apt) apt-get update -q; DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" ;;
        dnf) dnf install -y -q "$package" ;;
    esac
    is_installed || { echo "$package is still not installed on $node after the install"; exit 1; }
else
    echo "$package is installed on $node"
fi
[ -e "/boot/vmlinuz-$kernel" ] || { echo "$package is installed but /boot/vmlinuz-$kernel is missing on $node"; exit 1; }

if [ ! -e "$state/hold-recorded" ]; then   # once: a rerun must not take our own hold for the host's
    if is_held; then : > "$held_before"; fi
    : > "$state/hold-recorded"
fi
if [ "$hold" = true ]; then hold_kernel; echo "$package held"
elif is_held && [ ! -e "$held_before" ]; then unhold_kernel; echo "$package not held (config hold: false)"; fi

case "$pm" in
    apt)
        regenerate_grub
        path=$(menu_path)
        [ -n "$path" ] || { echo "no entry of $grub_cfg boots /boot/vmlinuz-$kernel on $node"; exit 1; }
        mkdir -p "${drop_in%/*}"
        printf '%s\nGRUB_DEFAULT="%s"\n' "$MARK" "$path" > "$drop_in.tmp"
        mv "$drop_in.tmp" "$drop_in"
        echo "$path" > "$state/menu-path"
        regenerate_grub
        echo "GRUB's default is $path" ;;
    dnf)
        [ -e "$original_default" ] || grubby --default-kernel > "$original_default"
        grubby --set-default "/boot/vmlinuz-$kernel"
        echo "GRUB's default is /boot/vmlinuz-$kernel (grubby)" ;;
esac
echo "$kernel is installed$( [ "$hold" = true ] && echo ", held") and boots by default; running now: $(uname -r)"
