#!/bin/sh
# staged (apply, config, upgrade checks): installed, held as the config says, GRUB's default.
# booted (post-interrupt-check): the same, and the node runs it: `uname -r` is the wanted release.
# removed (uninstall-check): the hold and the GRUB default gone, and a kernel we installed removed
#   unless the node runs it.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
problems=$(mktemp)
bad() { echo "$*" >> "$problems"; }
running=$(uname -r)
if [ "$1" != removed ]; then
    is_installed || bad "$package is not installed on $node"
    if [ "$hold" = true ]; then is_held || bad "$package is not held on $node (an upgrade could replace it)"; fi
    booting=$(default_kernel)
    [ "$booting" = "$kernel" ] || bad "node $node boots ${booting:-nothing known} by default, want $kernel"
    if [ "$1" = booted ] && [ "$running" != "$kernel" ]; then
        bad "node $node runs kernel $running, want $kernel"
    fi
    [ -s "$problems" ] || echo "ok: $kernel installed, boots by default, running $running"
else
    [ ! -e "$drop_in" ] || bad "$drop_in is left behind"
    if [ "$pm" = apt ] && [ -s "$state/menu-path" ] && grep -qF "set default=\"$(cat "$state/menu-path")\"" "$grub_cfg"; then
        bad "$grub_cfg still has the package's default, $(cat "$state/menu-path")"
    fi
    if is_installed && is_held && [ ! -e "$held_before" ]; then bad "$package is still held on $node"; fi
    if [ -e "$installed_by_us" ] && [ "$running" != "$kernel" ] && is_installed; then
        bad "$package, installed by the package and not running, is still installed on $node"
    fi
fi
if [ -s "$problems" ]; then cat "$problems"; rm -f "$problems"; exit 1; fi
rm -f "$problems"
