#!/bin/sh
# Write the blocklist for $MODULES. `install <module> /bin/false` also stops the module from being
# pulled in as another module's dependency, which `blacklist` alone does not.
set -eu
conf=/etc/modprobe.d/nodegate-blocklist.conf
[ -n "${MODULES:-}" ] || { echo "MODULES is empty: nothing to block"; exit 1; }

# Staged on a serving node (NODEGATE_PART=serving): keep what this replaces for the undo
# (scripts/unstage-blocklist.sh), once per staging: a rerun must not save its own work as the original.
if [ "${NODEGATE_PART:-whole}" = serving ] && [ ! -e "$NODEGATE_STAGED_DIR/saved" ]; then
    rm -f "$NODEGATE_STAGED_DIR/blocklist"
    [ ! -f "$conf" ] || cp "$conf" "$NODEGATE_STAGED_DIR/blocklist"
    : > "$NODEGATE_STAGED_DIR/saved"
fi

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
