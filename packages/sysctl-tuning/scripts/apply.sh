#!/bin/sh
# Load the tuning file now, after saving the values it replaces (once: a rerun must not save
# our own values as the originals).
set -eu
conf=/etc/sysctl.d/90-nodegate-tuning.conf
saved="$NODEGATE_STATE_DIR/saved.conf"

if [ ! -e "$saved" ]; then
    tmp="$saved.tmp"
    : > "$tmp"
    grep -E '^[[:space:]]*[a-z]' "$conf" | while IFS='=' read -r key _; do
        key=$(echo "$key" | tr -d '[:space:]')
        echo "$key = $(sysctl -n "$key")" >> "$tmp"
    done
    mv "$tmp" "$saved"
    echo "saved the previous values in $saved"
fi
sysctl -p "$conf"
