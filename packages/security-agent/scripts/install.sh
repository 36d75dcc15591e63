#!/bin/sh
# apply, config, upgrade: auditd at exactly the pinned version (held there), the gate's rules loaded.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
require_apt
pinned=$(cat "$cfg/version")
check_rules
mkdir -p "$state"
if [ ! -e "$original" ]; then   # once: a rerun must not take our own install for the original
    have=$(installed_version "$agent")
    if [ -n "$have" ]; then echo "installed $have $(is_held "$agent" && echo held || echo unheld)"; else echo absent; fi > "$original"
    echo "the host had: $(cat "$original")"
fi
have=$(installed_version "$agent")
if [ "$have" != "$pinned" ]; then
    echo "auditd ${have:-not installed}: installing the pinned $pinned"
    apt-mark unhold "$agent" >/dev/null 2>&1 || true
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades "$agent=$pinned"
fi
apt-mark hold "$agent" >/dev/null
mkdir -p /etc/audit/rules.d
{ echo "$MARK"; rules; } > "$rules_file.tmp"
mv "$rules_file.tmp" "$rules_file"
augenrules --load
echo "auditd $(installed_version "$agent"), held; $(rules | wc -l) rules from the gate in $rules_file"
