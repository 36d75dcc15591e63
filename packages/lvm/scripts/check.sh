#!/bin/sh
# $1 = present (apply, config, upgrade and post-interrupt checks) or absent (uninstall-check).
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
problems=$(mktemp)
bad() { echo "$*" >> "$problems"; }
if [ "$1" = present ]; then
    if ! vg_exists "$vg"; then bad "volume group $vg does not exist on $node"
    else
        have=$(vg_disks "$vg" | paste -sd' ' -); want=$(echo $disks | tr ' ' '\n' | sort | paste -sd' ' -)
        [ "$have" = "$want" ] || bad "volume group $vg is on ${have:-no disk}, the config lists $want"
    fi
    if ! lv_exists "$vg" "$lv"; then bad "logical volume $vg/$lv does not exist on $node"
    elif [ ! -b "$device" ]; then bad "logical volume $vg/$lv is not active ($device is no block device)"
    else
        want=$(bytes_of "$size"); have=$(lv_bytes "$vg" "$lv")
        [ -z "$want" ] || [ "$have" -ge "$want" ] || bad "logical volume $vg/$lv is $have bytes, the config asks for $size"
        have_fs=$(blkid -p -s TYPE -o value "$device" 2>/dev/null || true)
        [ "$have_fs" = "$fs" ] || bad "$device holds ${have_fs:-no filesystem}, want $fs"
        is_mounted "$device" "$mount_point" || bad "$device is not mounted at $mount_point on $node"
    fi
    grep -qxF "$(fstab_line)" "$fstab" 2>/dev/null || bad "$fstab has no entry '$(fstab_line)' (the mount would not come back after a reboot)"
    [ -s "$problems" ] || echo "ok: $vg/$lv ($fs) on $disks, mounted at $mount_point"
else
    if [ -s "$provisioned" ]; then
        read -r vg lv mount_point was_disks < "$provisioned"
        device=/dev/$vg/$lv
        ! host cat /proc/self/mountinfo | awk -v t="$mount_point" '$5 == t { found = 1 } END { exit !found }' || bad "$mount_point is still mounted on $node"
        ! grep -qxF "$mount_point" "$created" 2>/dev/null || ! host test -e "$mount_point" || bad "$mount_point, created for the mount, is left behind"
        ! lv_exists "$vg" "$lv" || bad "logical volume $vg/$lv is still there"
        ! vg_exists "$vg" || bad "volume group $vg is still there"
        for disk in $was_disks; do
            ! is_pv "$disk" || bad "$disk is still a physical volume"
        done
    fi
    ! grep -qxF "$begin" "$fstab" 2>/dev/null || bad "$fstab still holds NodeGate's block"
fi
if [ -s "$problems" ]; then cat "$problems"; rm -f "$problems"; exit 1; fi
rm -f "$problems"
echo "the volume as the config says ($1)"
