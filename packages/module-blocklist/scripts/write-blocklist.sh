#!/bin/sh
# Write the blocklist for $MODULES. `install <module> /bin/false` also stops the module from being
# pulled in as another module's dependency, which `blacklist` alone does not.
set -eu
conf=/etc/modprobe.d/nodegate-blocklist.conf
[ -n "${MODULES:-}" ] || { echo "MODULES is empty: nothing to block"; exit 1; }

mkdir -p /etc/modprobe.d
{
    echo "# Managed by NodeGate (package module-blocklist); removed when the package is uninstalled."
    for module in $MODULES; do
        echo "blacklist $module"
        echo "install $module /bin/false"
    done
} > "$conf.tmp"
mv "$conf.tmp" "$conf"
echo "blocked: $MODULES"
