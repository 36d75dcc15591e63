#!/bin/sh
# uninstall: the profile the host had active comes back (tuned reverts ours as it switches), our
# profiles go (putting back any they replaced), and tuned is purged when the host had none.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
pm=$(package_manager)
[ -e "$original" ] || { echo "nothing recorded: apply never ran here"; exit 0; }
read -r was version < "$original" || true
before=$(cat "$saved_profile" 2>/dev/null | tr -d '[:space:]')
if [ -n "$before" ]; then tuned-adm profile "$before"; echo "the host's profile $before is active again"
else tuned-adm off; echo "tuning off: the host had no active profile"; fi
if [ -e "$written" ]; then
    while IFS= read -r name; do
        [ -n "$name" ] || continue
        rm -f "$(profile_file "$name")"; rmdir "/etc/tuned/$name" 2>/dev/null || true
        if [ -e "$state/backup/$name.conf" ]; then mkdir -p "/etc/tuned/$name"; mv "$state/backup/$name.conf" "$(profile_file "$name")"; fi
        echo "profile $name removed"
    done < "$written"
    rm -f "$written"
fi
if [ "$was" = absent ]; then
    systemctl disable "$unit" || true
    case "$pm" in
        apt) DEBIAN_FRONTEND=noninteractive apt-get purge -y -q tuned ;;
        dnf) dnf remove -y -q tuned ;;
    esac
    echo "tuned removed: the host had none"
fi
