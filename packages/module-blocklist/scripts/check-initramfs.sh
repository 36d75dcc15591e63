#!/bin/sh
# $1 = present: the blocklist is on disk and in every initramfs; absent: in neither.
# Either way the last initramfs rebuild must have seen the blocklist as it is now.
set -eu
want=$1
conf=/etc/modprobe.d/nodegate-blocklist.conf

if [ "$want" = present ] && [ ! -e "$conf" ]; then echo "$conf is missing"; exit 1; fi
if [ "$want" = absent ] && [ -e "$conf" ]; then echo "$conf is still there"; exit 1; fi

if [ -e "$conf" ]; then now=$(sha256sum "$conf" | cut -c1-64); else now=absent; fi
built=$(cat "$NODEGATE_STATE_DIR/initramfs-built-with" 2>/dev/null || echo never)
if [ "$built" != "$now" ]; then
    echo "the initramfs was not rebuilt since the blocklist changed"
    exit 1
fi

found=0
for image in /boot/initrd.img-*; do
    [ -e "$image" ] || continue
    found=1
    if lsinitramfs "$image" | grep -q 'etc/modprobe.d/nodegate-blocklist.conf$'; then inside=present; else inside=absent; fi
    if [ "$inside" != "$want" ]; then
        echo "$image: blocklist $inside, want $want"
        exit 1
    fi
done
[ "$found" = 1 ] || { echo "no initramfs in /boot"; exit 1; }
echo "initramfs current, blocklist $want"
