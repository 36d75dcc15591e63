#!/bin/sh
# apply, config, upgrade: the listed disks are the volume group's physical volumes, the logical
# volume exists with its filesystem, and it is mounted where the config says (and in /etc/fstab).
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
check_config
mkdir -p "$state"; touch "$created"
if [ -s "$provisioned" ]; then
    read -r was_vg was_lv was_mount_point was_disks < "$provisioned"
    if [ "$was_vg/$was_lv" != "$vg/$lv" ]; then
        echo "vg_name/lv_name changed from $was_vg/$was_lv to $vg/$lv: a provisioned volume is not renamed or moved in place; uninstall the package first"
        exit 1
    fi
fi

# Every listed disk must be a block device that holds nothing, or already be ours. Only wipefs and
# blkid (util-linux) are needed to tell, and nothing is written before every disk passed.
new=""; wipe_list=""
for disk in $disks; do
    [ -b "$disk" ] || { echo "disks: $disk is not a block device on $node"; exit 1; }
    if is_pv "$disk"; then
        owner=$(pv_vg "$disk")
        if [ "$owner" = "$vg" ]; then continue; fi
        if [ -n "$owner" ]; then
            echo "disk $disk on $node is a physical volume of another volume group, $owner: refusing to take it"; exit 1
        fi
    fi
    where=$(mounts_of "$disk" | paste -sd' ' -)
    [ -z "$where" ] || { echo "disk $disk on $node is mounted at $where: refusing to use it, even with wipe"; exit 1; }
    [ -z "$(ls -A "/sys/class/block/${disk##*/}/holders" 2>/dev/null)" ] || {
        echo "disk $disk on $node is held by $(ls "/sys/class/block/${disk##*/}/holders" | paste -sd' ' -): refusing to use it"; exit 1; }
    found=$(signatures "$disk")
    if [ -n "$found" ]; then
        if [ "$wipe" != true ]; then
            echo "disk $disk on $node holds data ($found): refusing to use it; set config wipe: true to erase it"
            exit 1
        fi
        wipe_list="$wipe_list $disk"
        echo "disk $disk holds $found: it will be wiped (config wipe: true)"
    fi
    new="$new $disk"
done
command -v lvcreate >/dev/null 2>&1 || { echo "lvm2 is not installed on $node (no lvcreate): install it with the node's image (apt-get install lvm2, dnf install lvm2)"; exit 1; }
command -v "mkfs.$fs" >/dev/null 2>&1 || { echo "mkfs.$fs is not installed on $node (fs_type $fs: e2fsprogs or xfsprogs)"; exit 1; }
for disk in $wipe_list; do wipefs --all --quiet "$disk"; echo "wiped $disk"; done

for disk in $new; do pvcreate --yes "$disk"; done
if vg_exists "$vg"; then
    # A disk that left the config stays: taking it out of the group needs its extents moved (pvmove).
    gone=$(vg_disks "$vg" | while read -r disk; do case " $disks " in *" $disk "*) ;; *) echo "$disk" ;; esac; done | paste -sd' ' -)
    [ -z "$gone" ] || { echo "disks: $gone left the config but is in volume group $vg: removing a disk from a group needs pvmove, which this package does not do"; exit 1; }
    [ -z "$new" ] || vgextend --yes "$vg" $new
else
    vgcreate --yes "$vg" $disks
fi

if ! lv_exists "$vg" "$lv"; then
    case "$size" in *%*) lvcreate --yes --wipesignatures y --name "$lv" --extents "$size" "$vg" ;;
        *) lvcreate --yes --wipesignatures y --name "$lv" --size "$size" "$vg" ;; esac
else
    want=$(bytes_of "$size"); have=$(lv_bytes "$vg" "$lv")
    if [ -n "$want" ] && [ "$want" -gt "$have" ]; then
        echo "$vg/$lv is $have bytes, the config wants $size: growing it and its filesystem"
        lvextend --yes --resizefs --size "$size" "$vg/$lv"
    elif [ -n "$want" ] && [ "$want" -lt "$have" ]; then
        echo "size: $vg/$lv is $have bytes and the config asks for $size: shrinking is not done (a filesystem can lose data)"; exit 1
    fi
fi
[ -b "$device" ] || { echo "$device is not a block device after lvcreate: the logical volume is not active on $node"; exit 1; }

have_fs=$(blkid -p -s TYPE -o value "$device" 2>/dev/null || true)
if [ -z "$have_fs" ]; then
    case "$fs" in ext4) mkfs.ext4 -q "$device" ;; xfs) mkfs.xfs -q "$device" ;; esac
    echo "made an $fs filesystem on $device"
elif [ "$have_fs" != "$fs" ]; then
    echo "$device holds a $have_fs filesystem, the config asks for $fs: refusing to reformat it"; exit 1
fi

# A mount point that left the config is unmounted (and removed when we made it) first.
if [ -s "$provisioned" ] && [ "$was_mount_point" != "$mount_point" ]; then
    if is_mounted "$device" "$was_mount_point"; then host umount "$was_mount_point"; echo "unmounted $was_mount_point"; fi
    if grep -qxF "$was_mount_point" "$created"; then host rmdir "$was_mount_point" && : > "$created"; fi
fi
if ! host test -d "$mount_point"; then
    echo "$mount_point" > "$created"   # recorded first: a crash right after must not leave it unowned
    host mkdir -p "$mount_point"
fi
if ! is_mounted "$device" "$mount_point"; then
    host mount -t "$fs" -o "$options" "$device" "$mount_point"
    echo "mounted $device on $mount_point"
fi
fstab_line | write_fstab
echo "$vg $lv $mount_point $disks" > "$provisioned"
echo "$vg/$lv ($fs, $(lv_bytes "$vg" "$lv") bytes) on $disks, mounted at $mount_point"
