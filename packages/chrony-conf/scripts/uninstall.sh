#!/bin/sh
set -eu
rm -f /etc/chrony/conf.d/nodegate-*.conf
conf=/etc/chrony/chrony.conf
if [ -e "$conf" ] && grep -q '^# Added by NodeGate' "$conf"; then
    # The marker line and the confdir line after it.
    sed -i '/^# Added by NodeGate (package chrony-conf)$/,+1d' "$conf"
fi
