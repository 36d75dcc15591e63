#!/bin/sh
# The undo of write-drop-in staged on a serving node: put back the drop-in and the remembered
# arguments as they were before the staging (none: remove them), then regenerate grub.cfg from them,
# so the next boot is the one the node had. Nothing saved: the staging stopped before it wrote anything.
set -eu
drop_in=/etc/default/grub.d/90-nodegate.cfg
saved="$NODEGATE_STAGED_DIR"
if [ ! -e "$saved/saved" ]; then
    echo "write-drop-in saved nothing in $saved: it changed nothing to undo"
    exit 0
fi
if [ -f "$saved/drop-in" ]; then
    cp "$saved/drop-in" "$drop_in.tmp"
    mv "$drop_in.tmp" "$drop_in"
else
    rm -f "$drop_in"
fi
if [ -f "$saved/args" ]; then
    cp "$saved/args" "$NODEGATE_STATE_DIR/args"
else
    rm -f "$NODEGATE_STATE_DIR/args"
fi
update-grub
rm -f "$saved/saved"
echo "restored $drop_in as it was before the staging"
