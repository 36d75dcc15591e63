#!/bin/sh
# apply, config, upgrade: tuned installed and running, the config's profiles in /etc/tuned, the
# gate's tuned_profile active. The profile active before is saved once, for uninstall.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
pm=$(package_manager)
profiles=$(config_profiles)
want=$(wanted)
valid_name "$want" || { echo "config key tuned_profile: '$want' is not a profile name"; exit 1; }
mkdir -p "$state"

if [ ! -e "$original" ]; then   # once: a rerun must not take our own install for the host's
    have=$(installed_version)
    if [ -n "$have" ]; then echo "installed $have"; else echo absent; fi > "$original"
    if [ -n "$have" ]; then active_profile; fi > "$saved_profile"
    echo "the host had: tuned $(cat "$original"), active profile: $(cat "$saved_profile" | grep . || echo none)"
fi
if [ -z "$(installed_version)" ]; then
    echo "installing tuned"
    case "$pm" in
        apt) apt-get update -q; DEBIAN_FRONTEND=noninteractive apt-get install -y -q tuned ;;
        dnf) dnf install -y -q tuned ;;
    esac
fi
systemctl enable "$unit"
systemctl is-active --quiet "$unit" || systemctl start "$unit"
echo "tuned $(installed_version), $unit active"

# The config's profiles; a file we did not write at one of their paths is saved once, put back later.
touch "$written"
for name in $profiles; do
    path=$(profile_file "$name")
    if [ -e "$path" ] && ! grep -qxF "$MARK" "$path" && [ ! -e "$state/backup/$name.conf" ]; then
        mkdir -p "$state/backup"; cp -p "$path" "$state/backup/$name.conf"
    fi
    mkdir -p "/etc/tuned/$name"
    { echo "$MARK"; cat "$cfg/profile_$name.conf"; } > "$path.nodegate-tmp"
    mv "$path.nodegate-tmp" "$path"
    echo "profile $name written to $path"
done
profile_exists "$want" || { echo "tuned_profile '$want' is neither in the config (profile_$want.conf) nor shipped by tuned"; exit 1; }
tuned-adm profile "$want"
echo "tuned profile $want active"

# Profiles that left the config go (after the switch: tuned reverts a profile only while it has it).
while IFS= read -r name; do
    echo " $profiles " | tr '\n' ' ' | grep -q " $name " && continue
    rm -f "$(profile_file "$name")"; rmdir "/etc/tuned/$name" 2>/dev/null || true
    if [ -e "$state/backup/$name.conf" ]; then mkdir -p "/etc/tuned/$name"; mv "$state/backup/$name.conf" "$(profile_file "$name")"; fi
    echo "profile $name removed: it left the config"
done < "$written"
printf '%s\n' $profiles > "$written"
