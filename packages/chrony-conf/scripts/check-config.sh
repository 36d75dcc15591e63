#!/bin/sh
# Every *.conf key is on disk with the same content, and nothing else of ours is.
set -eu
dir=/etc/chrony/conf.d
status=0
for src in "$NODEGATE_CONFIG_DIR"/*.conf; do
    [ -f "$src" ] || continue
    key=${src##*/}
    if ! cmp -s "$src" "$dir/nodegate-$key"; then
        echo "$dir/nodegate-$key differs from config key $key"
        status=1
    fi
done
for dst in "$dir"/nodegate-*.conf; do
    [ -e "$dst" ] || continue
    key=${dst##*/nodegate-}
    if [ ! -f "$NODEGATE_CONFIG_DIR/$key" ]; then
        echo "$dst is not in the config any more"
        status=1
    fi
done
exit $status
