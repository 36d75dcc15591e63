#!/bin/sh
# After the reboot none of the blocked modules may be loaded.
set -eu
status=0
for module in $MODULES; do
    if grep -q "^$module " /proc/modules; then
        echo "$module is loaded"
        status=1
    fi
done
exit $status
