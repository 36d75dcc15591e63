#!/bin/sh
# Prove what the package claims, and say everything that is wrong (last).
#   config   (apply, config, upgrade checks): the tools installed, the config file as the config
#            says, the boot loader's default entry with our crashkernel= last.
#   boot     (post-interrupt-check): all of that, and the running kernel booted with it, the
#            service enabled and active, and the crash kernel loaded (/sys/kernel/kexec_crash_loaded is 1).
#   removed  (uninstall-check): the drop-in gone, the host's files and tools back, the boot
#            loader's entry with the host's crashkernel= (none when it had none).
#   removed-boot (post-uninstall-check): the running kernel booted with the host's crashkernel=.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
setup
mode=$1
problems=$(mktemp)
bad() { echo "$*" >> "$problems"; }
ok() { echo "ok: $*"; }
words() { tr '\n' ' ' | sed 's/ $//'; }

if [ "$mode" = config ] || [ "$mode" = boot ]; then
    crash=crashkernel=$(want_crashkernel)
    have=$(installed_version "$tools")
    if [ -n "$have" ]; then ok "$tools $have installed"; else bad "$tools is not installed"; fi
    if [ -e "$cfg/kdump.conf" ]; then
        if cmp -s "$cfg/kdump.conf" "$conf"; then ok "$conf holds the config's kdump.conf"
        else bad "$conf does not hold the config's kdump.conf"; fi
    fi
    next=$(next_cmdline | last_crashkernel)
    if [ "$next" = "$crash" ]; then ok "the boot loader's default entry has $crash"
    else bad "the boot loader's default entry has ${next:-no crashkernel=}, want $crash"; fi
    if [ "$mode" = boot ]; then
        if [ "$(systemctl is-enabled "$unit" 2>/dev/null)" = enabled ]; then
            ok "$unit enabled"; else bad "$unit is not enabled"; fi
        booted=$(last_crashkernel < /proc/cmdline)
        if [ "$booted" = "$crash" ]; then ok "the running kernel booted with $crash"
        else bad "the running kernel booted with ${booted:-no crashkernel=} (/proc/cmdline), want $crash"; fi
        if systemctl is-active --quiet "$unit"; then ok "$unit active"; else bad "$unit is not active"; fi
        loaded=/sys/kernel/kexec_crash_loaded
        if [ ! -e "$loaded" ]; then bad "$loaded is missing: this kernel cannot load a crash kernel (no kexec support)"
        elif [ "$(cat "$loaded")" = 1 ]; then ok "a crash kernel is loaded ($loaded is 1)"
        else bad "no crash kernel is loaded ($loaded is $(cat "$loaded"))"; fi
    fi
else
    if [ "$mode" = removed-boot ]; then
        # The agent has forgotten the package's state by now; uninstall-check proved the boot loader's
        # default entry is the host's again, so the proof is that the running kernel booted from it.
        now=$(crashkernels < /proc/cmdline | words)
        host=$(next_cmdline | crashkernels | words)
        if [ "$now" = "$host" ]; then ok "the running kernel booted with the host's crashkernel= (${host:-none})"
        else bad "the running kernel booted with '${now:-no crashkernel=}' (/proc/cmdline), the host's boot entry has '${host:-none}'"; fi
    else
        [ ! -e "$drop_in" ] || bad "$drop_in is left behind"
        [ ! -e "$saved_conf" ] || bad "$saved_conf was not put back to $conf"
        if [ -e "$original" ]; then
            read -r was version < "$original" || true
            have=$(installed_version "$tools")
            if [ "$was" = absent ]; then [ -z "$have" ] || bad "$tools $have is still installed; the host had none"
            else [ -n "$have" ] || bad "$tools is gone; the host had $version"; fi
        fi
        # The boot loader's default entry gives the next boot what it gave before us (none when it gave none).
        host=$(next_cmdline | crashkernels | words)
        had=$(words < "$next_crashkernel" 2>/dev/null || true)
        if [ "$host" = "$had" ]; then ok "the boot loader's default entry has the host's crashkernel= (${had:-none})"
        else bad "the boot loader's default entry has '${host:-no crashkernel=}', the host's had '${had:-none}'"; fi
    fi
fi

if [ -s "$problems" ]; then cat "$problems"; rm -f "$problems"; exit 1; fi
rm -f "$problems"
echo "kdump: every check passed ($mode)"
