#!/bin/sh
# uninstall: unmounted, the fstab entry gone, the logical volume, the volume group and the physical
# volumes removed (the data on them is gone), and a mount point made for the mount removed.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
touch "$created"
[ -s "$provisioned" ] || { : | write_fstab; echo "nothing provisioned here: nothing to remove"; exit 0; }
read -r vg lv mount_point was_disks < "$provisioned"
device=/dev/$vg/$lv
if host cat /proc/self/mountinfo | awk -v t="$mount_point" '$5 == t { found = 1 } END { exit !found }'; then
    host umount "$mount_point"; echo "unmounted $mount_point"
fi
: | write_fstab
if lv_exists "$vg" "$lv"; then lvremove --yes "$vg/$lv"; fi
if vg_exists "$vg"; then
    others=$(lvs --noheadings -o lv_name "$vg" 2>/dev/null | tr -s '[:space:]' ' ' | sed 's/^ //;s/ $//')
    [ -z "$others" ] || { echo "volume group $vg holds logical volumes the package did not make ($others): leaving the group and its disks"; exit 1; }
    vgremove --yes "$vg"
fi
for disk in $was_disks; do
    if is_pv "$disk"; then pvremove --yes "$disk"; fi
done
if grep -qxF "$mount_point" "$created" && host test -d "$mount_point"; then
    host rmdir "$mount_point" && : > "$created" && echo "removed $mount_point (created for the mount)"
fi
echo "removed $vg/$lv, volume group $vg and the physical volumes on $was_disks"
