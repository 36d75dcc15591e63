#!/bin/sh
# uninstall: the hold (unless the host had it) and the GRUB default go; a kernel the package
# installed is removed, unless the node runs it now (then it stays, and the next boot takes the
# distribution's default again).
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
if is_installed && is_held && [ ! -e "$held_before" ]; then unhold_kernel; echo "$package no longer held"; fi
case "$pm" in
    apt) if [ -e "$drop_in" ]; then rm -f "$drop_in"; regenerate_grub; fi ;;
    dnf) if [ -s "$original_default" ]; then grubby --set-default "$(cat "$original_default")"; fi ;;
esac
if [ -e "$installed_by_us" ] && is_installed; then
    if [ "$(uname -r)" = "$kernel" ]; then
        echo "$package stays: $node runs it now (the next boot takes the distribution's default)"
    else
        case "$pm" in
            apt) DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "$package" ;;
            dnf) dnf remove -y -q "$package" ;;
        esac
        echo "$package removed (the package installed it)"
    fi
fi
echo "node-setup removed from $node"
