#!/bin/sh
# Debian's chrony.conf already reads /etc/chrony/conf.d; other layouts get the line added, marked
# so uninstall removes exactly what we added.
set -eu
conf=/etc/chrony/chrony.conf
[ -e "$conf" ] || { echo "$conf not found: is chrony installed?"; exit 1; }
mkdir -p /etc/chrony/conf.d
if ! grep -qx 'confdir /etc/chrony/conf.d' "$conf"; then
    printf '# Added by NodeGate (package chrony-conf)\nconfdir /etc/chrony/conf.d\n' >> "$conf"
    echo "added confdir /etc/chrony/conf.d to $conf"
fi
