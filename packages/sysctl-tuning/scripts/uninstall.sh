#!/bin/sh
# The overlay file is already gone (the agent removes it first); put back the values apply saved.
set -eu
saved="$NODEGATE_STATE_DIR/saved.conf"
if [ -e "$saved" ]; then
    sysctl -p "$saved"
else
    echo "nothing saved: apply never ran here"
fi
