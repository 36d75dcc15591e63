#!/bin/sh
# config (and upgrade): make the host hold exactly what the gate's config says, saving what it
# replaces first. A key removed from the config takes its change away (and restores the original).
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
mkdir -p "$state"

# --- sysctl.conf: /etc/sysctl.d, loaded live; originals saved once per key.
want=$(mktemp)
if has sysctl.conf; then sysctl_pairs "$cfg/sysctl.conf" > "$want"; fi
touch "$saved_sysctl"
# Keys no longer wanted: their original values go back.
while IFS= read -r line; do
    key=${line%% = *}
    if ! grep -q "^$key=" "$want"; then
        sysctl -w "$key=${line#* = }" >/dev/null
        echo "sysctl $key: put back ${line#* = }"
        grep -v "^$key = " "$saved_sysctl" > "$saved_sysctl.tmp" || true
        mv "$saved_sysctl.tmp" "$saved_sysctl"
    fi
done < "$saved_sysctl"
while IFS= read -r pair; do
    key=${pair%%=*}
    if ! grep -q "^$key = " "$saved_sysctl"; then
        echo "$key = $(live_sysctl "$key")" >> "$saved_sysctl"
    fi
done < "$want"
if [ -s "$want" ]; then
    { echo "$MARK"; sed 's/=/ = /' "$want"; } | put_file "$sysctl_file"
    sysctl -p "$sysctl_file"
elif [ -e "$sysctl_file" ]; then
    remove_file "$sysctl_file"
fi
rm -f "$want"

# --- grub.conf: a GRUB drop-in adding the arguments; grub.cfg regenerated only when it changed.
if has grub.conf; then
    args=$(grub_args "$cfg/grub.conf" | tr '\n' ' ' | sed 's/ $//')
    case "$args" in *[\"\'\$\`\\]*) echo "grub.conf: kernel arguments must not hold quotes, \$, \` or \\"; exit 1 ;; esac
    new=$(printf '%s\nGRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX %s"\n' "$MARK" "$args")
    if [ ! -e "$grub_file" ] || [ "$(cat "$grub_file")" != "$new" ]; then
        printf '%s\n' "$new" | put_file "$grub_file"
        echo "$args" > "$grub_args_file"
        regenerate_grub
        echo "grub.conf: the kernel gets '$args' from the next boot (the gate's interrupt reboots the node)"
    else
        echo "grub.conf: drop-in unchanged"
    fi
elif [ -e "$grub_file" ]; then
    remove_file "$grub_file"
    regenerate_grub
fi

# --- ulimit.conf: limits.d (new sessions get the limits).
if has ulimit.conf; then
    content "$cfg/ulimit.conf" | while read -r domain type item value extra; do
        if [ -z "$value" ] || [ -n "$extra" ]; then
            echo "ulimit.conf: '$domain $type $item $value $extra' is not 'domain type item value'"; exit 1
        fi
        case "$type" in soft|hard|-) ;; *) echo "ulimit.conf: type '$type' is not soft, hard or -"; exit 1 ;; esac
    done
    { echo "$MARK"; content "$cfg/ulimit.conf"; } | put_file "$limits_file"
elif [ -e "$limits_file" ]; then
    remove_file "$limits_file"
fi

# --- service_<unit>.conf: a systemd drop-in per unit; the gate's configInterrupts restart the unit.
touch "$services_list"
wanted_units=$(mktemp)
for file in "$cfg"/service_*.conf; do
    [ -e "$file" ] || continue
    key=$(basename "$file")
    unit=$(unit_of "$key")
    echo "$unit" >> "$wanted_units"
    { echo "$MARK"; cat "$file"; } | put_file "$(drop_in_of "$unit")"
    echo "$key: drop-in for $unit written"
done
while IFS= read -r unit; do
    if ! grep -qxF "$unit" "$wanted_units"; then
        remove_file "$(drop_in_of "$unit")"
        rmdir "/etc/systemd/system/$unit.d" 2>/dev/null || true
        echo "drop-in for $unit removed"
    fi
done < "$services_list"
mv "$wanted_units" "$services_list"
