#!/bin/sh
# uninstall: the gate's rules unloaded, and auditd back as the host had it (absent, or its version
# and hold state).
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
rm -f "$rules_file"
# The kernel keeps loaded rules when the daemon goes: load what is left in rules.d first.
if command -v augenrules >/dev/null 2>&1; then augenrules --load; fi
[ -e "$original" ] || { echo "nothing recorded: apply never ran here"; exit 0; }
read -r was version hold < "$original" || true
apt-mark unhold "$agent" >/dev/null 2>&1 || true
if [ "$was" = absent ]; then
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -q "$agent"
    echo "auditd purged: the host had none"
else
    if [ "$(installed_version "$agent")" != "$version" ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades "$agent=$version"
    fi
    [ "$hold" != held ] || apt-mark hold "$agent" >/dev/null
    echo "auditd back to the host's $version ($hold)"
fi
