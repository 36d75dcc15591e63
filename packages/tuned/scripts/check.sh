#!/bin/sh
# active  (apply, config, upgrade and post-interrupt checks): tuned installed and running, the
#         config's profiles in place, tuned_profile active, and `tuned-adm verify` passes (the
#         profile's settings are live on the host).
# removed (uninstall-check): our profiles gone, the host's profile active again (or tuned gone when
#         the host had none).
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
pm=$(package_manager)
problems=$(mktemp)
bad() { echo "$*" >> "$problems"; }
ok() { echo "ok: $*"; }
have=$(installed_version)

if [ "$1" = active ]; then
    want=$(wanted)
    if [ -n "$have" ]; then ok "tuned $have installed"; else bad "tuned is not installed"; fi
    if systemctl is-active --quiet "$unit"; then ok "$unit active"; else bad "$unit is not active"; fi
    for name in $(config_profiles); do
        if [ "$(tail -n +2 "$(profile_file "$name")" 2>/dev/null)" = "$(cat "$cfg/profile_$name.conf")" ]; then
            ok "profile $name in $(profile_file "$name")"
        else bad "$(profile_file "$name") does not hold the config's profile_$name.conf"; fi
    done
    now=$(tuned-adm active 2>&1 | sed -n 's/^Current active profile: //p')
    if [ "$now" = "$want" ]; then ok "tuned-adm active: $now"
    else bad "the active profile is '${now:-none}' (tuned-adm active), want $want"; fi
    if out=$(tuned-adm verify 2>&1); then ok "tuned-adm verify: $(echo "$out" | head -n 1)"
    else bad "tuned-adm verify failed: the host's settings differ from profile $want: $out"; fi
    [ -s "$problems" ] || echo "tuned: profile $want active and verified"
else
    if [ -e "$written" ]; then
        while IFS= read -r name; do
            [ -n "$name" ] || continue
            if grep -qxF "$MARK" "$(profile_file "$name")" 2>/dev/null; then bad "$(profile_file "$name") is left behind"; fi
        done < "$written"
    fi
    read -r was version < "$original" 2>/dev/null || was=""
    if [ "$was" = absent ]; then
        [ -z "$have" ] || bad "tuned $have is still installed; the host had none"
    elif [ "$was" = installed ]; then
        before=$(cat "$saved_profile" 2>/dev/null | tr -d '[:space:]')
        now=$(active_profile)
        if [ "$now" = "$before" ]; then ok "the host's profile is active again (${before:-none})"
        else bad "the active profile is '${now:-none}', the host had '${before:-none}'"; fi
    fi
fi
if [ -s "$problems" ]; then cat "$problems"; rm -f "$problems"; exit 1; fi
rm -f "$problems"
