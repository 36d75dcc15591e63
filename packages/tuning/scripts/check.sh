#!/bin/sh
# Prove each config key's effect on the live system, and say what is wrong last.
#   config   (config-check, upgrade-check): files as the config says, sysctls live, grub.cfg has the
#            arguments, new sessions get the limits, drop-ins in place.
#   boot     (post-interrupt-check): the same, but the kernel arguments in /proc/cmdline and each
#            unit running with its drop-in loaded.
#   removed  (uninstall-check): nothing of ours left, the saved sysctl values live again.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
mode=$1
problems=$(mktemp)
bad() { echo "$*" >> "$problems"; }
ok() { echo "ok: $*"; }
# A file of ours where none should be (a file that was there before us may be back, and is not ours).
left_behind() { if [ -e "$1" ] && grep -qxF "$MARK" "$1"; then bad "$1 is left behind"; fi; }

# --- sysctl
if [ "$mode" != removed ] && has sysctl.conf; then
    sysctl_pairs "$cfg/sysctl.conf" | while IFS= read -r pair; do
        key=${pair%%=*}; want=${pair#*=}
        have=$(live_sysctl "$key" 2>&1) || { bad "sysctl $key: cannot read it: $have"; continue; }
        if [ "$have" = "$want" ]; then ok "sysctl $key = $have"; else bad "sysctl $key is $have, want $want"; fi
    done
    [ -e "$sysctl_file" ] || bad "$sysctl_file is missing (the value would not survive a reboot)"
else
    left_behind "$sysctl_file"
    if [ "$mode" = removed ] && [ -e "$saved_sysctl" ]; then
        while IFS= read -r line; do
            key=${line%% = *}; want=${line#* = }
            have=$(live_sysctl "$key")
            if [ "$have" = "$want" ]; then ok "sysctl $key back to $have"; else bad "sysctl $key is $have, want the original $want"; fi
        done < "$saved_sysctl"
    fi
fi

# --- grub
if [ "$mode" != removed ] && has grub.conf; then
    if [ "$mode" = boot ]; then where=/proc/cmdline; line=$(cat /proc/cmdline); else where=$grub_cfg; line=$(grub_cfg_line); fi
    [ -n "$line" ] || bad "no kernel command line in $where"
    for arg in $(grub_args "$cfg/grub.conf"); do
        if in_words "$arg" "$line"; then ok "kernel argument $arg in $where"; else bad "kernel argument $arg is not in $where"; fi
    done
elif [ -e "$grub_args_file" ] || [ "$mode" = removed ]; then
    line=$(grub_cfg_line)
    for arg in $(cat "$grub_args_file" 2>/dev/null); do
        grep -qF -- "$arg" /etc/default/grub 2>/dev/null && continue   # the distribution's own
        if in_words "$arg" "$line"; then bad "kernel argument $arg is still in $grub_cfg"; fi
    done
fi
if [ "$mode" = removed ] || ! has grub.conf; then left_behind "$grub_file"; fi

# --- ulimit: a new session's limits, as pam_limits sets them (runuser opens a PAM session).
limit_flag() {
    case "$1" in
        nofile) echo n ;; nproc) echo p ;; memlock) echo l ;; stack) echo s ;; data) echo d ;; as) echo v ;;
        rss) echo m ;; locks) echo w ;; rtprio) echo r ;; *) echo "" ;;
    esac
}
if [ "$mode" != removed ] && has ulimit.conf; then
    [ -e "$limits_file" ] || bad "$limits_file is missing"
    content "$cfg/ulimit.conf" | while read -r domain type item value; do
        flag=$(limit_flag "$item")
        case "$domain" in root) user=root ;; '*') user=nobody ;; @*|%*|*:*) user="" ;; *) user=$domain ;; esac
        if [ -z "$flag" ] || [ -z "$user" ]; then
            echo "note: $domain $type $item: in $limits_file, not checkable live (item or domain)"; continue
        fi
        if ! command -v runuser >/dev/null 2>&1; then bad "runuser is missing: cannot prove the limits a session gets"; break; fi
        case "$value" in -1|infinity|unlimited) value=unlimited ;; esac
        for kind in soft hard; do
            [ "$type" = - ] || [ "$type" = "$kind" ] || continue
            opt=$([ "$kind" = soft ] && echo S || echo H)
            have=$(runuser -u "$user" -- /bin/sh -c "ulimit -$opt$flag" 2>&1) || { bad "runuser -u $user failed: $have"; continue; }
            if [ "$have" = "$value" ]; then ok "$user's $kind $item is $have"; else bad "$user's $kind $item is $have, want $value"; fi
        done
    done
else
    left_behind "$limits_file"
fi

# --- service drop-ins
for file in "$cfg"/service_*.conf; do
    [ "$mode" != removed ] || break
    [ -e "$file" ] || continue
    unit=$(unit_of "$(basename "$file")")
    drop_in=$(drop_in_of "$unit")
    if [ "$(tail -n +2 "$drop_in" 2>/dev/null)" != "$(cat "$file")" ]; then bad "$drop_in does not hold the config's $(basename "$file")"; continue; fi
    ok "$drop_in written"
    if [ "$mode" = boot ]; then
        loaded=$(systemctl show -p DropInPaths --value "$unit" 2>&1) || { bad "$unit: systemctl show failed: $loaded"; continue; }
        if in_words "$drop_in" "$loaded"; then ok "$unit has the drop-in loaded"; else bad "$unit has not loaded $drop_in (DropInPaths: $loaded)"; fi
        if systemctl is-active --quiet "$unit"; then ok "$unit is active"; else bad "$unit is not active"; fi
    fi
done
if [ -e "$services_list" ]; then
    while IFS= read -r unit; do
        key="service_${unit%.service}.conf"
        if [ "$mode" = removed ] || { [ ! -e "$cfg/$key" ] && [ ! -e "$cfg/service_$unit.conf" ]; }; then
            left_behind "$(drop_in_of "$unit")"
        fi
    done < "$services_list"
fi

if [ -s "$problems" ]; then
    cat "$problems"; rm -f "$problems"; exit 1
fi
rm -f "$problems"
echo "tuning: every check passed ($mode)"
