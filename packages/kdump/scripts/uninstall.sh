#!/bin/sh
# uninstall: crashkernel= as the host had it, its kdump config file back, the tools purged when the
# host had none (its service disabled first). The reboot that follows frees the reserved memory.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
setup
[ -e "$original" ] || { echo "nothing recorded: apply never ran here"; exit 0; }
read -r was version < "$original" || true

if [ -e "$saved_conf" ]; then mv "$saved_conf" "$conf"; echo "$conf: put back the host's"
elif [ -e "$saved_conf.absent" ]; then rm -f "$conf" "$saved_conf.absent"; fi

if [ "$was" = absent ]; then
    systemctl disable "$unit" || true
    case "$fam" in
        debian) DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "$tools"
                # Of what the install added, what nothing needs any more (apt's own autoremove answer):
                # a dependency that something installed since relies on stays.
                leftover=$(apt-get -s autoremove 2>/dev/null | awk '/^Remv / { print $2 }' |
                           grep -xF -f "$state/packages.added" 2>/dev/null | tr '\n' ' ' || true)
                # shellcheck disable=SC2086  # one package a word
                [ -z "$leftover" ] || DEBIAN_FRONTEND=noninteractive apt-get purge -y -q $leftover ;;
        rhel) dnf remove -y -q "$tools" ;;
    esac
    echo "$tools removed: the host had none"
else
    [ "$(cat "$state/unit.enabled" 2>/dev/null)" = enabled ] || systemctl disable "$unit" || true
    echo "$tools $version stays: the host had it"
fi

case "$fam" in
    debian)
        rm -f "$drop_in"
        update_grub ;;
    rhel)
        host=$(tail -n 1 "$next_crashkernel" 2>/dev/null || true)
        if [ -n "$host" ]; then grubby --update-kernel=ALL --args="$host"
        else grubby --update-kernel=ALL --remove-args=crashkernel; fi ;;
esac
echo "the next boot gets the host's crashkernel= ($(next_cmdline | crashkernels | tr '\n' ' ')); the reboot frees the reserved memory"
