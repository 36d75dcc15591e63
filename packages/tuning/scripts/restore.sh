#!/bin/sh
# uninstall: take every change away and put back what it replaced.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"

[ -e "$sysctl_file" ] && remove_file "$sysctl_file"
if [ -e "$saved_sysctl" ]; then
    while IFS= read -r line; do
        sysctl -w "${line%% = *}=${line#* = }" >/dev/null
        echo "sysctl ${line%% = *}: put back ${line#* = }"
    done < "$saved_sysctl"
fi
if [ -e "$grub_file" ]; then
    remove_file "$grub_file"
    regenerate_grub
fi
[ -e "$limits_file" ] && remove_file "$limits_file"
if [ -e "$services_list" ]; then
    while IFS= read -r unit; do
        remove_file "$(drop_in_of "$unit")"
        rmdir "/etc/systemd/system/$unit.d" 2>/dev/null || true
        echo "drop-in for $unit removed"
    done < "$services_list"
fi
echo "tuning removed"
