#!/bin/sh
# gpu-tuning on the host: apply, prove and undo the profile that gpu_tuning.py assembled into
# $NODEGATE_STATE_DIR/profile (plain line files, so the host needs no Python or JSON parser).
#
#   host.sh apply            sysctls (file + live), kernel arguments (GRUB drop-in + update-grub, or
#                            grubby), CPU settings, services, unit limits, the boot-time unit
#   host.sh check live       prove what is live now (apply-check, config-check, upgrade-check)
#   host.sh check boot       also prove what needs the interrupt: /proc/cmdline, the units' limits
#   host.sh uninstall        put every original back
#   host.sh check-removed    prove it (uninstall-check)
#   host.sh reapply          what the boot-time unit runs: settings that do not survive a reboot
#
# Originals are saved once, the first time a value is changed, so a rerun never takes the
# package's own values for them; a key the profile stops setting gets its original back.
set -eu

TAG=nodegate-gpu-tuning
PROFILE=$NODEGATE_STATE_DIR/profile
ORIG=$NODEGATE_STATE_DIR/orig
SYSCTL_FILE=/etc/sysctl.d/90-$TAG.conf
GRUB_DROP_IN=/etc/default/grub.d/90-$TAG.cfg
GRUB_CFG=/boot/grub/grub.cfg
BOOT_UNIT=/etc/systemd/system/$TAG.service
BOOT_DIR=$NODEGATE_STATE_DIR/boot
DROP_IN_NAME=50-$TAG.conf
CPU=/sys/devices/system/cpu
UNIT_DIRS="/etc/systemd/system /run/systemd/system /usr/lib/systemd/system /lib/systemd/system"

say() { echo "gpu-tuning: $*"; }
fail() { echo "gpu-tuning: $*"; exit 1; }
norm() { echo "$*" | tr -s '[:space:]' ' ' | sed 's/^ //; s/ $//'; }

# write FILE: stdin to FILE through a temporary name, so a node losing power never keeps half a file
write() { cat > "$1.tmp"; mv "$1.tmp" "$1"; }

# remember FILE KEY VALUE: the original of KEY, only if none is saved yet
remember() {
    mkdir -p "$ORIG"
    touch "$ORIG/$1"
    if ! cut -f1 "$ORIG/$1" | grep -qxF -- "$2"; then printf '%s\t%s\n' "$2" "$3" >> "$ORIG/$1"; fi
}
original() { [ -f "$ORIG/$1" ] && awk -F '\t' -v k="$2" '$1 == k { print $2; exit }' "$ORIG/$1"; }

sysctl_path() { echo "/proc/sys/$(echo "$1" | tr . /)"; }

unit_present() {
    for dir in $UNIT_DIRS; do [ -e "$dir/$1" ] && return 0; done
    return 1
}

need_profile() {
    [ -f "$PROFILE/bootloader" ] || fail "no assembled profile in $PROFILE (the assemble step did not run)"
}

# --- sysctls -------------------------------------------------------------------------------------

apply_sysctls() {
    # Keys set before that the profile no longer has: back to their originals.
    if [ -f "$ORIG/sysctl" ]; then
        cut -f1 "$ORIG/sysctl" | while read -r key; do
            grep -q "^$key = " "$PROFILE/sysctl.conf" || restore_sysctl "$key"
        done
    fi
    if [ ! -s "$PROFILE/sysctl.conf" ]; then rm -f "$SYSCTL_FILE"; return 0; fi
    while IFS= read -r line; do
        key=${line%% = *}
        value=${line#* = }
        [ -e "$(sysctl_path "$key")" ] || fail "sysctl $key does not exist in this kernel (exclude it with config exclude=sysctl/$key)"
        remember sysctl "$key" "$(norm "$(sysctl -n "$key")")"
        # procps' sysctl -w reports a refused write (EINVAL: out of the kernel's bounds, such as a
        # network namespace's buffer limit above the host's) but may still exit 0: read it back.
        refused=$(sysctl -w "$key=$value" 2>&1 > /dev/null || true)
        have=$(norm "$(sysctl -n "$key")")
        [ "$have" = "$(norm "$value")" ] ||
            fail "sysctl $key: the kernel refused $value and kept $have${refused:+ ($refused)}; exclude it with config exclude=sysctl/$key"
        say "sysctl $key = $value"
    done < "$PROFILE/sysctl.conf"
    { echo "# Managed by NodeGate (gpu-tuning); removed when the package is uninstalled."; cat "$PROFILE/sysctl.conf"; } |
        write "$SYSCTL_FILE"
}

restore_sysctl() {
    value=$(original sysctl "$1")
    [ -n "$value" ] || return 0
    sysctl -w "$1=$value" > /dev/null && say "sysctl $1 back to $value"
}

check_sysctls() {
    status=0
    [ ! -s "$PROFILE/sysctl.conf" ] || [ -f "$SYSCTL_FILE" ] || { echo "$SYSCTL_FILE is missing"; status=1; }
    while IFS= read -r line; do
        key=${line%% = *}
        want=$(norm "${line#* = }")
        have=$(norm "$(sysctl -n "$key" 2>/dev/null || echo '(unreadable)')")
        if [ "$have" != "$want" ]; then echo "sysctl $key is $have, want $want"; status=1; fi
        grep -qxF -- "$line" "$SYSCTL_FILE" 2>/dev/null || { echo "$SYSCTL_FILE does not set $key = $want"; status=1; }
    done < "$PROFILE/sysctl.conf"
    return $status
}

# --- kernel arguments ----------------------------------------------------------------------------

kernel_args() { tr '\n' ' ' < "$PROFILE/kernel-args" | sed 's/ $//'; }

apply_kernel_args() {
    loader=$(cat "$PROFILE/bootloader")
    args=$(kernel_args)
    mkdir -p "$ORIG"
    case "$loader" in
        update-grub)
            if [ -z "$args" ]; then
                if [ -e "$GRUB_DROP_IN" ]; then rm -f "$GRUB_DROP_IN"; update-grub; fi
                : > "$ORIG/kernel-args"
                return 0
            fi
            mkdir -p /etc/default/grub.d
            new=$(printf '# Managed by NodeGate (gpu-tuning); removed when the package is uninstalled.\nGRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX %s"\n' "$args")
            if [ "$(cat "$GRUB_DROP_IN" 2>/dev/null)" != "$new" ] || ! grub_has_all; then
                printf '%s\n' "$new" | write "$GRUB_DROP_IN"
                update-grub
            fi
            say "kernel arguments in $GRUB_DROP_IN: $args (live after the reboot)" ;;
        grubby)
            # Only what the default entry lacks now is ours to remove later.
            current=" $(grubby_args) "
            for arg in $args; do
                case "$current" in *" $arg "*) ;; *) echo "$arg" >> "$ORIG/kernel-args.added" ;; esac
            done
            [ -z "$args" ] || grubby --update-kernel=ALL --args="$args"
            say "kernel arguments for every kernel (grubby): $args (live after the reboot)" ;;
        none)
            [ -z "$args" ] || fail "this OS has no boot loader to put $args in" ;;
        *) fail "unknown boot loader $loader in the profile" ;;
    esac
    printf '%s\n' $args > "$ORIG/kernel-args"
}

grubby_args() { grubby --info=DEFAULT | sed -n 's/^args="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p'; }
grub_linux_line() { grep -m1 -E '^[[:space:]]*linux[[:space:]]' "$GRUB_CFG" 2>/dev/null || true; }

grub_has_all() {
    line=" $(grub_linux_line) "
    for arg in $(kernel_args); do case "$line" in *" $arg "*) ;; *) return 1 ;; esac; done
}

# check_args WHERE: every argument of the profile is in the boot configuration or in /proc/cmdline
check_args() {
    loader=$(cat "$PROFILE/bootloader")
    [ -s "$PROFILE/kernel-args" ] || return 0
    case "$1" in
        config)
            case "$loader" in
                update-grub) line=" $(grub_linux_line) "; what="the default entry of $GRUB_CFG" ;;
                grubby) line=" $(grubby_args) "; what="grubby's default entry" ;;
                *) return 0 ;;
            esac ;;
        cmdline) line=" $(cat /proc/cmdline) "; what=/proc/cmdline ;;
    esac
    status=0
    for arg in $(kernel_args); do
        case "$line" in *" $arg "*) ;; *) echo "kernel argument $arg is not in $what"; status=1 ;; esac
    done
    return $status
}

# --- CPU -----------------------------------------------------------------------------------------

# cpu_targets NAME VALUE: "file value" lines for what a CPU setting writes
cpu_targets() {
    case "$1" in
        governor)
            for f in "$CPU"/cpu[0-9]*/cpufreq/scaling_governor; do [ -e "$f" ] && echo "$f $2"; done ;;
        max_cstate)
            for f in "$CPU"/cpu[0-9]*/cpuidle/state[0-9]*/disable; do
                [ -e "$f" ] || continue
                index=$(basename "$(dirname "$f")" | sed 's/^state//')
                [ "$index" -gt "$2" ] && echo "$f 1"
            done ;;
    esac
    return 0
}

cpu_available() {
    case "$1" in
        governor) [ -d "$CPU/cpufreq" ] ;;
        max_cstate) [ -d "$CPU/cpuidle" ] ;;
    esac
}

apply_cpu() {
    while read -r name value; do
        if ! cpu_available "$name"; then
            case "$name" in
                governor) say "cpu governor $value skipped: this host has no $CPU/cpufreq (no frequency scaling exposed, as in most VMs)" ;;
                *) say "cpu $name $value skipped: this host has no $CPU/cpuidle (no idle states exposed)" ;;
            esac
            continue
        fi
        cpu_targets "$name" "$value" | while read -r file want; do
            remember cpu "$file" "$(cat "$file")"
            echo "$want" > "$file" || fail "cpu $name: cannot write $want to $file"
        done
        say "cpu $name $value"
    done < "$PROFILE/cpu"
}

check_cpu() {
    status=0
    while read -r name value; do
        cpu_available "$name" || continue
        for pair in $(cpu_targets "$name" "$value" | tr ' ' '='); do
            file=${pair%=*}
            want=${pair##*=}
            have=$(cat "$file")
            [ "$have" = "$want" ] || { echo "cpu $name: $file is $have, want $want"; status=1; }
        done
    done < "$PROFILE/cpu"
    return $status
}

restore_cpu() {
    [ -f "$ORIG/cpu" ] || return 0
    while IFS="$(printf '\t')" read -r file value; do
        [ -e "$file" ] && echo "$value" > "$file"
    done < "$ORIG/cpu"
}

# --- services and unit limits --------------------------------------------------------------------

apply_services() {
    while read -r unit state; do
        if ! unit_present "$unit"; then say "service $unit skipped: not installed on this host"; continue; fi
        remember services "$unit" "$(systemctl is-enabled "$unit" 2>/dev/null || true)"
        case "$state" in
            enabled) systemctl enable --now "$unit" ;;
            disabled) systemctl disable --now "$unit" ;;
        esac
        say "service $unit $state"
    done < "$PROFILE/services"
}

check_services() {
    status=0
    while read -r unit state; do
        unit_present "$unit" || continue
        have=$(systemctl is-enabled "$unit" 2>/dev/null || true)
        [ "$have" = "$state" ] || { echo "service $unit is ${have:-unknown}, want $state"; status=1; }
    done < "$PROFILE/services"
    return $status
}

restore_services() {
    [ -f "$ORIG/services" ] || return 0
    while IFS="$(printf '\t')" read -r unit state; do
        case "$state" in
            enabled) systemctl enable "$unit" ;;
            disabled) systemctl disable "$unit" ;;
        esac
    done < "$ORIG/services"
}

limit_units() { cut -d' ' -f1 "$PROFILE/limits" | sort -u; }

apply_limits() {
    changed=
    for unit in $(limit_units); do
        if ! unit_present "$unit"; then say "limits of $unit skipped: not installed as a systemd unit here"; continue; fi
        dir=/etc/systemd/system/$unit.d
        mkdir -p "$dir"
        new=$(printf '# Managed by NodeGate (gpu-tuning); takes effect when %s restarts.\n[Service]\n' "$unit"
              awk -v u="$unit" '$1 == u { print $2 "=" $3 }' "$PROFILE/limits")
        if [ "$(cat "$dir/$DROP_IN_NAME" 2>/dev/null)" != "$new" ]; then
            printf '%s\n' "$new" | write "$dir/$DROP_IN_NAME"
            changed=yes
        fi
        say "limits of $unit: $(awk -v u="$unit" '$1 == u { printf "%s=%s ", $2, $3 }' "$PROFILE/limits")(live when $unit restarts)"
    done
    # Units this profile no longer limits lose our drop-in.
    for file in /etc/systemd/system/*.service.d/"$DROP_IN_NAME"; do
        [ -e "$file" ] || continue
        unit=$(basename "$(dirname "$file")" .d)
        limit_units | grep -qxF "$unit" || { rm -f "$file"; changed=yes; }
    done
    [ -z "$changed" ] || systemctl daemon-reload
}

# check_limits live|boot: the drop-in is in place; after the interrupt the unit runs with the values
check_limits() {
    status=0
    while read -r unit limit value; do
        unit_present "$unit" || continue
        grep -qxF "$limit=$value" "/etc/systemd/system/$unit.d/$DROP_IN_NAME" 2>/dev/null ||
            { echo "$unit: the drop-in does not set $limit=$value"; status=1; continue; }
        [ "$1" = boot ] || continue
        have=$(systemctl show "$unit" -p "$limit" --value 2>/dev/null || true)
        [ "$have" = "$value" ] || { echo "$unit runs with $limit=${have:-unknown}, want $value"; status=1; }
    done < "$PROFILE/limits"
    return $status
}

# --- the boot-time unit --------------------------------------------------------------------------

install_boot_unit() {
    # What a reboot loses, from the stateful partition (/var): CPU settings everywhere; on a
    # read-only-root OS also the sysctls and the limit drop-ins, whose /etc files are not preserved.
    mkdir -p "$BOOT_DIR"
    for f in sysctl.conf cpu limits bootloader; do cp "$PROFILE/$f" "$BOOT_DIR/$f.tmp"; mv "$BOOT_DIR/$f.tmp" "$BOOT_DIR/$f"; done
    cp "$0" "$BOOT_DIR/host.sh.tmp"
    chmod 0755 "$BOOT_DIR/host.sh.tmp"
    mv "$BOOT_DIR/host.sh.tmp" "$BOOT_DIR/host.sh"
    new=$(cat <<EOF
# Managed by NodeGate (gpu-tuning); removed when the package is uninstalled.
[Unit]
Description=NodeGate gpu-tuning: reapply the GPU tuning profile at boot
DefaultDependencies=no
After=local-fs.target systemd-sysctl.service
Before=containerd.service kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
Environment=NODEGATE_STATE_DIR=$NODEGATE_STATE_DIR GPU_TUNING_PROFILE=$BOOT_DIR
ExecStart=$BOOT_DIR/host.sh reapply

[Install]
WantedBy=multi-user.target
EOF
)
    mkdir -p "$(dirname "$BOOT_UNIT")"
    if [ "$(cat "$BOOT_UNIT" 2>/dev/null)" != "$new" ]; then
        printf '%s\n' "$new" | write "$BOOT_UNIT"
        systemctl daemon-reload
    fi
    mkdir -p /etc/systemd/system/multi-user.target.wants
    ln -sf "$BOOT_UNIT" "/etc/systemd/system/multi-user.target.wants/$TAG.service"
    say "boot-time unit $TAG.service reapplies the profile from $BOOT_DIR"
}

check_boot_unit() {
    status=0
    [ -f "$BOOT_UNIT" ] || { echo "boot-time unit $BOOT_UNIT is missing"; status=1; }
    [ -L "/etc/systemd/system/multi-user.target.wants/$TAG.service" ] || { echo "$TAG.service is not enabled"; status=1; }
    for f in sysctl.conf cpu limits; do
        cmp -s "$PROFILE/$f" "$BOOT_DIR/$f" || { echo "the boot-time copy $BOOT_DIR/$f is not the current profile"; status=1; }
    done
    return $status
}

reapply() {
    # At boot: settings from the boot copy; sysctl.d and GRUB need nothing (they persist where
    # they exist). Failures are reported, not fatal: the node must boot.
    PROFILE=${GPU_TUNING_PROFILE:-$BOOT_DIR}
    if [ "$(cat "$PROFILE/bootloader")" = none ]; then
        while IFS= read -r line; do sysctl -w "${line%% = *}=${line#* = }" || true; done < "$PROFILE/sysctl.conf"
        for unit in $(limit_units); do
            mkdir -p "/etc/systemd/system/$unit.d"
            { echo "[Service]"; awk -v u="$unit" '$1 == u { print $2 "=" $3 }' "$PROFILE/limits"; } \
                > "/etc/systemd/system/$unit.d/$DROP_IN_NAME"
        done
        [ ! -s "$PROFILE/limits" ] || systemctl daemon-reload || true
    fi
    apply_cpu || true
}

# --- stages --------------------------------------------------------------------------------------

cmd_apply() {
    need_profile
    apply_sysctls
    apply_kernel_args
    apply_cpu
    apply_services
    apply_limits
    install_boot_unit
}

cmd_check() {
    # Every check function sets the global `status` (POSIX sh has no locals): collect into `failed`.
    need_profile
    failed=0
    check_sysctls || failed=1
    check_args config || failed=1
    if [ "$1" = boot ]; then check_args cmdline || failed=1; fi
    check_cpu || failed=1
    check_services || failed=1
    check_limits "$1" || failed=1
    check_boot_unit || failed=1
    [ $failed = 0 ] || return 1
    where="in the boot configuration"
    [ "$1" != boot ] || where="in /proc/cmdline"
    say "profile is live: $(grep -c . "$PROFILE/sysctl.conf" || true) sysctls, $(grep -c . "$PROFILE/kernel-args" || true) kernel arguments $where, CPU, services and limits checked"
}

cmd_uninstall() {
    if [ -f "$ORIG/sysctl" ]; then
        cut -f1 "$ORIG/sysctl" | while read -r key; do restore_sysctl "$key"; done
    fi
    rm -f "$SYSCTL_FILE"
    if [ -e "$GRUB_DROP_IN" ]; then rm -f "$GRUB_DROP_IN"; update-grub; fi
    if [ -s "$ORIG/kernel-args.added" ]; then
        grubby --update-kernel=ALL --remove-args="$(sort -u "$ORIG/kernel-args.added" | tr '\n' ' ' | sed 's/ $//')"
    fi
    restore_cpu
    restore_services
    removed=
    for file in /etc/systemd/system/*.service.d/"$DROP_IN_NAME"; do [ -e "$file" ] && { rm -f "$file"; removed=yes; }; done
    rm -f "/etc/systemd/system/multi-user.target.wants/$TAG.service" "$BOOT_UNIT"
    systemctl daemon-reload
    say "originals restored${removed:+, unit limit drop-ins removed (live when the units restart)}"
}

cmd_check_removed() {
    status=0
    for f in "$SYSCTL_FILE" "$GRUB_DROP_IN" "$BOOT_UNIT"; do [ ! -e "$f" ] || { echo "$f is still there"; status=1; }; done
    for file in /etc/systemd/system/*.service.d/"$DROP_IN_NAME"; do [ ! -e "$file" ] || { echo "$file is still there"; status=1; }; done
    if [ -f "$ORIG/sysctl" ]; then
        while IFS="$(printf '\t')" read -r key value; do
            have=$(norm "$(sysctl -n "$key")")
            [ "$have" = "$value" ] || { echo "sysctl $key is $have, its original was $value"; status=1; }
        done < "$ORIG/sysctl"
    fi
    if [ -f "$ORIG/cpu" ]; then
        while IFS="$(printf '\t')" read -r file value; do
            [ ! -e "$file" ] || [ "$(cat "$file")" = "$value" ] || { echo "$file is $(cat "$file"), its original was $value"; status=1; }
        done < "$ORIG/cpu"
    fi
    if [ -s "$ORIG/kernel-args" ] && [ -f "$GRUB_CFG" ] && [ ! -s "$ORIG/kernel-args.added" ]; then
        line=" $(grub_linux_line) "
        while read -r arg; do
            grep -qF -- "$arg" /etc/default/grub 2>/dev/null && continue   # the distribution's own
            case "$line" in *" $arg "*) echo "kernel argument $arg is still in $GRUB_CFG"; status=1 ;; esac
        done < "$ORIG/kernel-args"
    fi
    if [ -s "$ORIG/kernel-args.added" ]; then
        line=" $(grubby_args) "
        while read -r arg; do
            case "$line" in *" $arg "*) echo "kernel argument $arg is still in grubby's default entry"; status=1 ;; esac
        done < "$ORIG/kernel-args.added"
    fi
    [ $status = 0 ] && say "every original is back"
    return $status
}

# Upgrade steps get the previous and the new version first.
if [ "${NODEGATE_STAGE:-}" = upgrade ] && [ $# -gt 2 ]; then
    say "upgrading from $1 to $2"
    shift 2
fi
case "${1:-}" in
    apply) cmd_apply ;;
    check) cmd_check "${2:-live}" ;;
    uninstall) cmd_uninstall ;;
    check-removed) cmd_check_removed ;;
    reapply) reapply ;;
    *) fail "usage: host.sh apply | check live|boot | uninstall | check-removed | reapply" ;;
esac
