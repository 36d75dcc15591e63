#!/bin/sh
# The undo of write-drop-in staged on a serving node (update-grub's undo, before it, does nothing of its
# own): put back the drop-in, the remembered arguments and grub.cfg as they were before the staging
# (none: remove them), so the next boot is the one the node had. Nothing saved: the staging stopped
# before it wrote anything.
set -eu
drop_in=/etc/default/grub.d/90-nodegate.cfg
saved="$NODEGATE_STAGED_DIR"
if [ ! -e "$saved/saved" ]; then
    echo "write-drop-in saved nothing in $saved: it changed nothing to undo"
    exit 0
fi
restore() {  # restore SAVED TARGET: the saved copy back in place (written aside, then renamed), or none
    if [ -f "$1" ]; then
        cp -p "$1" "$2.nodegate-tmp"
        mv "$2.nodegate-tmp" "$2"
    else
        rm -f "$2"
    fi
}
restore "$saved/drop-in" "$drop_in"
restore "$saved/args" "$NODEGATE_STATE_DIR/args"
restore "$saved/grub.cfg" /boot/grub/grub.cfg
rm -f "$saved/saved"
echo "restored $drop_in and /boot/grub/grub.cfg as they were before the staging"
