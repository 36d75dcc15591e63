#!/bin/sh
# The undo of write-blocklist staged on a serving node: put back the blocklist as it was before the
# staging (none: remove it), then rebuild the initramfs with it, so the next boot is the one the node
# had. Nothing saved: the staging stopped before it wrote anything.
set -eu
conf=/etc/modprobe.d/nodegate-blocklist.conf
saved="$NODEGATE_STAGED_DIR"
if [ ! -e "$saved/saved" ]; then
    echo "write-blocklist saved nothing in $saved: it changed nothing to undo"
    exit 0
fi
if [ -f "$saved/blocklist" ]; then
    cp "$saved/blocklist" "$conf.tmp"
    mv "$conf.tmp" "$conf"
else
    rm -f "$conf"
fi
"$NODEGATE_PACKAGE_DIR/scripts/update-initramfs.sh"
rm -f "$saved/saved"
echo "restored $conf as it was before the staging"
