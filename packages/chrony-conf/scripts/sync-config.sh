#!/bin/sh
# Make /etc/chrony/conf.d/nodegate-*.conf exactly the gate's *.conf config keys: add and update
# what is there, remove what the gate no longer has.
set -eu
dir=/etc/chrony/conf.d
mkdir -p "$dir"
for src in "$NODEGATE_CONFIG_DIR"/*; do
    [ -f "$src" ] || continue
    key=${src##*/}
    case "$key" in
        *.conf) ;;
        *) echo "ignoring config key $key: only *.conf keys are chrony settings"; continue ;;
    esac
    dst="$dir/nodegate-$key"
    if ! cmp -s "$src" "$dst" 2>/dev/null; then
        cp "$src" "$dst.tmp"
        mv "$dst.tmp" "$dst"
        echo "wrote $dst"
    fi
done
for dst in "$dir"/nodegate-*.conf; do
    [ -e "$dst" ] || continue
    key=${dst##*/nodegate-}
    if [ ! -f "$NODEGATE_CONFIG_DIR/$key" ]; then
        rm -f "$dst"
        echo "removed $dst"
    fi
done
