#!/bin/sh
# uninstall: every mount we made unmounted, its fstab entry and any target we created removed.
set -eu
. "$NODEGATE_PACKAGE_DIR/scripts/lib.sh"
touch "$managed" "$created"
while read -r source target options; do unmount "$source" "$target"; done < "$managed"
: | write_fstab
echo "bind mounts removed"
