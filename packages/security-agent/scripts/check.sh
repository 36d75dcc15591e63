#!/bin/sh
# installed (apply, config, upgrade, post-interrupt checks): the pinned version, held, the service
# active, and every rule of the gate loaded in the kernel (auditctl -l, by key).
# removed (uninstall-check): the host as it was before the package.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
problems=$(mktemp)
bad() { echo "$*" >> "$problems"; }
have=$(installed_version "$agent")
if [ "$1" = installed ]; then
    pinned=$(cat "$cfg/version")
    [ "$have" = "$pinned" ] || bad "auditd is ${have:-not installed}, pinned $pinned"
    is_held "$agent" || bad "auditd is not held at $pinned (an unattended upgrade could move it)"
    systemctl is-active --quiet "$unit" || bad "$unit is not active"
    loaded=$(auditctl -l 2>&1) || bad "auditctl -l failed: $loaded"
    rules | while IFS= read -r rule; do
        key=$(key_of "$rule")
        want=$(rules | while IFS= read -r r; do [ "$(key_of "$r")" = "$key" ] && echo x; done | wc -l)
        got=$(printf '%s\n' "$loaded" | while IFS= read -r l; do [ "$(key_of "$l")" = "$key" ] && echo x; done | wc -l)
        [ "$got" -ge "$want" ] || bad "rule with key $key is not loaded ($got of $want): $rule"
    done
    [ -s "$problems" ] || echo "auditd $have held and active, $(rules | wc -l) rules loaded"
else
    [ ! -e "$rules_file" ] || bad "$rules_file is left behind"
    if command -v auditctl >/dev/null 2>&1; then
        loaded=$(auditctl -l 2>/dev/null || true)
        rules | while IFS= read -r rule; do
            key=$(key_of "$rule")
            if printf '%s\n' "$loaded" | while IFS= read -r l; do [ "$(key_of "$l")" = "$key" ] && echo x; done | grep -q x; then
                bad "a rule with key $key is still loaded"
            fi
        done
    fi
    read -r was version hold < "$original" || true
    if [ "$was" = absent ]; then
        [ -z "$have" ] || bad "auditd $have is still installed; the host had none"
    else
        [ "$have" = "$version" ] || bad "auditd is ${have:-not installed}; the host had $version"
        if [ "$hold" = held ]; then is_held "$agent" || bad "auditd is no longer held, as it was"
        else ! is_held "$agent" || bad "auditd is still held; it was not"; fi
    fi
fi
if [ -s "$problems" ]; then cat "$problems"; rm -f "$problems"; exit 1; fi
rm -f "$problems"
