# Shared by lvm's scripts (sourced, POSIX sh).
gate=${NODEGATE_GATE:?}
cfg=${NODEGATE_CONFIG_DIR:?}
state=${NODEGATE_STATE_DIR:?}
node=${NODEGATE_NODE:-$(cat /etc/hostname 2>/dev/null || echo unknown)}
fstab=/etc/fstab
begin="# BEGIN NodeGate lvm (gate $gate): managed, removed when the package is uninstalled"
end="# END NodeGate lvm (gate $gate)"
provisioned=$state/provisioned   # "VG LV MOUNT_POINT DISK..." as the last successful sync left them
created=$state/created           # the mount point, when the package created it

# One word of a config key (the agent wrote declared defaults into the config directory).
value() { tr -d '[:space:]' < "$cfg/$1"; }
vg=$(value vg_name); lv=$(value lv_name); size=$(value size); fs=$(value fs_type)
mount_point=$(value mount_point); options=$(value mount_options); wipe=$(value wipe)
# Disks by their device names, as LVM reports them (a /dev/disk/by-id/ link is followed).
disks=$(for disk in $(cat "$cfg/disks"); do readlink -f "$disk" 2>/dev/null || echo "$disk"; done | paste -sd' ' -)
device=/dev/$vg/$lv

# Mounts made in the stage pod's mount namespace would vanish with it: mount, umount and the
# mountinfo read happen in the namespace of the host's PID 1 (hostPID).
host() { nsenter --mount=/proc/1/ns/mnt -- "$@"; }

# Without a udev daemon (containers, the dev real nodes) libdevmapper must not wait for udev to make
# the device nodes: it makes them itself.
[ -S /run/udev/control ] || export DM_DISABLE_UDEV=1

check_config() {
    case "$mount_point" in /|/etc|/proc|/sys|/dev|/run|/usr|/var|/boot|/home|/tmp)
        echo "mount_point: will not mount over $mount_point" >&2; return 1 ;; esac
    case "$mount_point" in */../*|*/..|*/./*|*/.) echo "mount_point: $mount_point is not a plain absolute path" >&2; return 1 ;; esac
    seen=""
    for disk in $disks; do
        case " $seen " in *" $disk "*) echo "disks: $disk is listed twice" >&2; return 1 ;; esac
        seen="$seen $disk"
    done
}

# MAJOR:MINOR (decimal) of a block device, empty when it is none.
dev_number() { [ -b "$1" ] || return 0; printf '%d:%d\n' "0x$(stat -L -c %t "$1")" "0x$(stat -L -c %T "$1")"; }

# The host's mount of DEVICE at MOUNT_POINT, "ok" when it is live (mountinfo: field 3 is the device
# number, field 5 the mount point).
is_mounted() {
    number=$(dev_number "$1")
    [ -n "$number" ] || return 1
    host cat /proc/self/mountinfo | awk -v n="$number" -v t="$2" '$3 == n && $5 == t { found = 1 } END { exit !found }'
}
# Where the host has DISK (or a partition of it) mounted, one mount point a line.
mounts_of() {
    number=$(dev_number "$1")
    [ -n "$number" ] || return 0
    host cat /proc/self/mountinfo | awk -v n="$number" '$3 == n { print $5 }'
}

# The signatures on a disk, as "TYPE at OFFSET" phrases separated by ", " (empty: a blank disk).
signatures() {
    found=$(wipefs --no-act --noheadings --output TYPE,OFFSET "$1" 2>/dev/null | awk '{ printf "%s%s at offset %s", sep, $1, $2; sep = ", " }')
    if [ -z "$found" ]; then   # blkid's low-level probe also sees what wipefs may not list
        found=$(blkid -p -o export "$1" 2>/dev/null | sed -n -e 's/^TYPE=\(.*\)/\1 filesystem/p' -e 's/^PTTYPE=\(.*\)/\1 partition table/p' | paste -sd, - | sed 's/,/, /g')
    fi
    echo "$found"
}

# LVM's view: whether DISK is a physical volume, the volume group it is in ("" for none), ...
is_pv() { pvs --noheadings -o pv_name "$1" >/dev/null 2>&1; }
pv_vg() { pvs --noheadings -o vg_name "$1" 2>/dev/null | tr -d '[:space:]'; }
vg_exists() { vgs --noheadings -o vg_name "$1" >/dev/null 2>&1; }
lv_exists() { lvs --noheadings -o lv_name "$1/$2" >/dev/null 2>&1; }
vg_disks() { pvs --noheadings -o pv_name,vg_name 2>/dev/null | awk -v v="$1" '$2 == v { print $1 }' | sort; }
lv_bytes() { lvs --noheadings --units b --nosuffix -o lv_size "$1/$2" 2>/dev/null | tr -d '[:space:]'; }

# An absolute size (64M, 500G) in bytes; empty for a share of the group (%FREE, %VG).
bytes_of() {
    case "$1" in *%*) return 0 ;; esac
    number=${1%?}
    case "$1" in *[Kk]) echo $((number * 1024)) ;; *[Mm]) echo $((number * 1048576)) ;;
        *[Gg]) echo $((number * 1073741824)) ;; *[Tt]) echo $((number * 1099511627776)) ;; esac
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
fstab_line() { echo "$device $mount_point $fs $options 0 2"; }
