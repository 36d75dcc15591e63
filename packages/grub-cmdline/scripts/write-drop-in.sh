#!/bin/sh
# grub-mkconfig sources /etc/default/grub.d/*.cfg after /etc/default/grub, so a drop-in adds our
# arguments without editing the distribution's file, and removing it takes exactly them away.
set -eu
drop_in=/etc/default/grub.d/90-nodegate.cfg
[ -n "${KERNEL_ARGS:-}" ] || { echo "KERNEL_ARGS is empty: nothing to add"; exit 1; }
case "$KERNEL_ARGS" in *[\"\$\`\\]*) echo "KERNEL_ARGS must not contain quotes, \$, \` or \\"; exit 1;; esac

# Staged on a serving node (NODEGATE_PART=serving): keep what this replaces for the undo
# (scripts/unstage-drop-in.sh), once per staging: a rerun must not save its own work as the original.
# grub.cfg too: update-grub, staged after this step, rewrites it.
if [ "${NODEGATE_PART:-whole}" = serving ] && [ ! -e "$NODEGATE_STAGED_DIR/saved" ]; then
    rm -f "$NODEGATE_STAGED_DIR/drop-in" "$NODEGATE_STAGED_DIR/args" "$NODEGATE_STAGED_DIR/grub.cfg"
    [ ! -f "$drop_in" ] || cp "$drop_in" "$NODEGATE_STAGED_DIR/drop-in"
    [ ! -f "$NODEGATE_STATE_DIR/args" ] || cp "$NODEGATE_STATE_DIR/args" "$NODEGATE_STAGED_DIR/args"
    [ ! -f /boot/grub/grub.cfg ] || cp -p /boot/grub/grub.cfg "$NODEGATE_STAGED_DIR/grub.cfg"
    : > "$NODEGATE_STAGED_DIR/saved"
fi

mkdir -p /etc/default/grub.d
{
    echo "# Managed by NodeGate (package grub-cmdline); removed when the package is uninstalled."
    echo "GRUB_CMDLINE_LINUX=\"\$GRUB_CMDLINE_LINUX $KERNEL_ARGS\""
} > "$drop_in.tmp"
mv "$drop_in.tmp" "$drop_in"
# Remembered for uninstall-check: the gate's KERNEL_ARGS may have changed by then.
echo "$KERNEL_ARGS" > "$NODEGATE_STATE_DIR/args"
