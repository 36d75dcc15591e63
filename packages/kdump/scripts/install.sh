#!/bin/sh
# apply, config, upgrade: the crash-dump tools installed, the gate's kdump config written,
# crashkernel= for the next boot, the kdump service enabled. The reboot (the gate's interrupt)
# reserves the memory, and the service then loads the crash kernel into it.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
setup
crash=$(want_crashkernel)
mkdir -p "$state"

if [ ! -e "$original" ]; then   # once: a rerun must not take our own install for the host's
    have=$(installed_version "$tools")
    if [ -n "$have" ]; then echo "installed $have"; else echo absent; fi > "$original"
    crashkernels < /proc/cmdline > "$boot_crashkernel"
    next_cmdline | crashkernels > "$next_crashkernel"
    [ -z "$have" ] || systemctl is-enabled "$unit" > "$state/unit.enabled" 2>/dev/null || true
    echo "the host had: $tools $(cat "$original"); booted with: $(tr '\n' ' ' < "$boot_crashkernel")"
fi

if [ -z "$(installed_version "$tools")" ]; then
    echo "installing $tools"
    case "$fam" in
        debian) dpkg_installed > "$state/packages.before"
                apt-get update -q
                DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$tools"
                # What this install added (the tools and their dependencies): uninstall purges exactly these.
                dpkg_installed | grep -vxF -f "$state/packages.before" > "$state/packages.added" || true
                echo "apt added: $(tr '\n' ' ' < "$state/packages.added")" ;;
        rhel) dnf install -y -q "$tools" ;;   # dnf remove takes the dependencies it added away again
    esac
fi
echo "$tools $(installed_version "$tools")"

# The distribution's config file, saved once as the host had it (after the package put its own there).
if [ -e "$cfg/kdump.conf" ]; then
    if [ ! -e "$saved_conf" ] && [ ! -e "$saved_conf.absent" ]; then
        if [ -e "$conf" ]; then cp -p "$conf" "$saved_conf"; else touch "$saved_conf.absent"; fi
    fi
    cat "$cfg/kdump.conf" > "$conf.nodegate-tmp"
    mv "$conf.nodegate-tmp" "$conf"
    echo "$conf written from the config"
elif [ -e "$saved_conf" ]; then   # kdump.conf left the config: the host's file comes back
    mv "$saved_conf" "$conf"; echo "$conf: put back the host's"
elif [ -e "$saved_conf.absent" ]; then
    rm -f "$conf" "$saved_conf.absent"
fi

case "$fam" in
    debian)
        # A sourced shell fragment: drop every crashkernel= the host's files set (the kernel would
        # take the last one, and Debian's own kdump-tools.cfg sets one), then add ours.
        new=$(printf '%s\n%s\n%s\n%s\n' "$MARK" \
            'GRUB_CMDLINE_LINUX=$(echo " $GRUB_CMDLINE_LINUX " | sed -e "s/ crashkernel=[^ ]*//g" -e "s/^ *//" -e "s/ *$//")' \
            'GRUB_CMDLINE_LINUX_DEFAULT=$(echo " $GRUB_CMDLINE_LINUX_DEFAULT " | sed -e "s/ crashkernel=[^ ]*//g" -e "s/^ *//" -e "s/ *$//")' \
            "GRUB_CMDLINE_LINUX=\"\$GRUB_CMDLINE_LINUX crashkernel=$crash\"")
        if [ ! -e "$drop_in" ] || [ "$(cat "$drop_in")" != "$new" ] || ! next_cmdline | last_crashkernel | grep -qxF "crashkernel=$crash"; then
            mkdir -p /etc/default/grub.d
            printf '%s\n' "$new" > "$drop_in.tmp"
            mv "$drop_in.tmp" "$drop_in"
            update_grub
        fi ;;
    rhel)
        # RHEL's grub2-mkconfig reads no /etc/default/grub.d and its boot entries (BLS) carry their own
        # arguments: grubby is the tool that sets them, for every installed kernel.
        grubby --update-kernel=ALL --args="crashkernel=$crash" ;;
esac
echo "the next boot gets crashkernel=$crash ($(next_cmdline | last_crashkernel) in the boot loader's default entry)"

systemctl enable "$unit"
echo "$unit enabled: it loads the crash kernel at boot, into the memory crashkernel= reserves"
