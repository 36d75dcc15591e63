#!/bin/sh
# Every key of a sysctl file must have its value live in the kernel.
# $1: the file, or "saved" for the values apply saved (after uninstall).
set -eu
file=$1
[ "$file" = saved ] && file="$NODEGATE_STATE_DIR/saved.conf"
[ -r "$file" ] || { echo "missing $file"; exit 1; }

status=0
for line in $(grep -E '^[[:space:]]*[a-z]' "$file" | tr -d '[:blank:]'); do
    key=${line%%=*}
    want=${line#*=}
    have=$(sysctl -n "$key" | tr -d '[:blank:]')
    if [ "$have" != "$want" ]; then
        echo "$key is $have, want $want"
        status=1
    fi
done
exit $status
