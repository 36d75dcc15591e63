#!/bin/sh
# $1 = present | absent, $2 = /boot/grub/grub.cfg (its default entry) or /proc/cmdline.
# absent skips arguments the distribution's own /etc/default/grub already sets.
set -eu
want=$1
file=$2
args=$(cat "$NODEGATE_STATE_DIR/args" 2>/dev/null || echo "$KERNEL_ARGS")

case "$file" in
    */grub.cfg) line=$(grep -m1 -E '^[[:space:]]*linux[[:space:]]' "$file" || true) ;;
    *) line=$(cat "$file") ;;
esac
[ -n "$line" ] || { echo "no kernel command line in $file"; exit 1; }

status=0
for arg in $args; do
    case " $line " in *" $arg "*) have=present ;; *) have=absent ;; esac
    if [ "$want" = absent ] && grep -qF -- "$arg" /etc/default/grub 2>/dev/null; then
        continue
    fi
    if [ "$have" != "$want" ]; then
        echo "$arg is $have in $file, want $want"
        status=1
    fi
done
exit $status
