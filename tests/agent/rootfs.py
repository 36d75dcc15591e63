"""A minimal root filesystem for the agent's chroot tests, made from the machine's own binaries.

No download: `/bin/sh`, coreutils, grep, sed and friends are copied from the host together with the
shared libraries `ldd` names, into a merged-/usr layout. What a real node would do through systemd,
the kernel or the boot loader is played by fakes, installed as `/usr/libexec/nodegate-fakes/fake-*`
with the real command names symlinked to them. Every fake appends its command line to
`/var/log/fake-calls.log`, so tests assert on what the agent and the packages asked the host to do.

The fakes keep just enough state to make the example packages' checks meaningful:

* sysctl keys are files under `/proc/sys` (as in the real kernel), pre-filled with defaults;
* `update-initramfs` writes `/boot/initrd.img-<kernel>` as the list of files it would contain, which
  the fake `lsinitramfs` prints;
* `update-grub` renders `/boot/grub/grub.cfg` from `/etc/default/grub` and `/etc/default/grub.d/*.cfg`;
* a reboot (`reboot` or `systemctl reboot`) "boots" the root: `/proc/cmdline` becomes grub.cfg's
  kernel line and blocklisted modules disappear from `/proc/modules`;
* `systemctl daemon-reload` notes each unit's drop-ins in /etc/systemd/system/<unit>.d, which
  `systemctl show -p DropInPaths --value UNIT` then reports (a drop-in written after the last reload
  is not loaded, as with systemd);
* the real `dpkg-query` and `dpkg` read a small `/var/lib/dpkg/status`; the fake `apt-get install
  --only-upgrade PKG` moves PKG to its candidate in `/etc/fake-apt/candidates`;
* `apt-get install PKG=VERSION` and `purge PKG` edit that status file (a package with a unit in
  `/etc/fake-apt/unit-PKG` starts and stops it, as its maintainer scripts would); `apt-mark` keeps
  holds in a file; `augenrules --load` "loads" /etc/audit/rules.d into a file `auditctl -l` lists;
* `apt-get install PKG` also copies the files under `/etc/fake-apt/files-PKG/` onto the root (the
  package's own files, e.g. kdump-tools' GRUB drop-in), and `purge` removes them;
* a boot with `crashkernel=` on its command line and an enabled kdump unit (`kdump-tools.service`,
  `kdump.service`) "loads" a crash kernel: `/sys/kernel/kexec_crash_loaded` (a file here) becomes 1;
* `tuned-adm profile|off|active|verify` keeps the active profile in /etc/tuned/active_profile (as
  tuned does), applies a profile's `[sysctl]` section (and its `include=`) to the fake /proc/sys,
  putting the values back when the profile goes, and `verify` compares them; it fails while
  tuned.service is not running, as the real one does without its daemon;
* `modprobe -r M` drops M from `/proc/modules` (unless `/etc/fake-modules/in-use-M`);
* `nsenter ... -- CMD` runs CMD in place (there is no host PID 1 to enter);
* `runuser -u USER -- CMD` runs CMD with the limits pam_limits would give USER's session from
  /etc/security/limits.conf and limits.d (nofile, nproc, memlock, stack);
* `systemctl` starts units (adding them to `/etc/fake-systemd/running`), restarts units listed there
  (a restart loads the unit's drop-ins, which `systemctl show UNIT -p PROP --value` then reports),
  enables and disables units (`is-enabled` answers from `/etc/fake-systemd/enabled`), and fails on request: a file
  `/etc/fake-systemd/fail-<what>` makes that operation fail; `shutdown-kills-caller` makes a reboot
  send SIGTERM to its caller, as systemd stopping the agent's pod would.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Final

REQUIRED: Final = ("sh", "cat", "grep", "sed", "mkdir", "rm", "cp", "mv", "tr", "cut", "sha256sum", "cmp", "test")
OPTIONAL: Final = (
    "echo", "printf", "rmdir", "ls", "chmod", "touch", "date", "head", "tail", "wc", "env", "sleep", "ln",
    "readlink", "basename", "dirname", "id", "true", "false", "stat", "sort", "uniq", "mktemp", "tee", "awk",
    "diff", "find", "uname", "xargs", "[", "mount", "umount", "dpkg", "dpkg-query",
)
FAKE_DIR: Final = "usr/libexec/nodegate-fakes"
CALLS: Final = "var/log/fake-calls.log"
KERNEL: Final = "6.1.0-fake"

_LIB = re.compile(r"(/\S+)")

FAKE_SYSTEMCTL = r"""#!/bin/sh
# FAKE systemctl for NodeGate's agent tests: records its calls and plays a tiny systemd.
echo "systemctl $*" >> /var/log/fake-calls.log
state=/etc/fake-systemd
case "$1" in
    reboot)
        exec /usr/libexec/nodegate-fakes/fake-reboot --from-systemctl ;;
    daemon-reload)
        if [ -e "$state/fail-daemon-reload" ]; then echo "Failed to reload daemon: fake failure" >&2; exit 1; fi
        # What systemd would load now: every unit's drop-ins, as `show -p DropInPaths` reports them.
        rm -rf "$state/loaded"; mkdir -p "$state/loaded"
        for dir in /etc/systemd/system/*.d; do
            [ -d "$dir" ] || continue
            unit=${dir##*/}; unit=${unit%.d}
            for f in "$dir"/*.conf; do [ -e "$f" ] && printf '%s ' "$f"; done > "$state/loaded/$unit"
        done
        true ;;  # a unit's drop-in directory may be empty: that is no failure
    show)
        if [ "$2" = -p ]; then
            # show -p DropInPaths --value UNIT: the drop-ins loaded at the last daemon-reload.
            [ "$3" = DropInPaths ] && [ "$4" = --value ] || { echo "fake systemctl: show $*" >&2; exit 1; }
            cat "$state/loaded/$5" 2>/dev/null | sed 's/ $//'; echo
        else
            # show UNIT -p PROPERTY --value: the property as the unit's drop-ins set it at its last restart
            sed -n "s/^$4=//p" "$state/loaded-$2" 2>/dev/null | tail -n 1
        fi ;;
    restart)
        shift
        for unit in "$@"; do
            if [ -e "$state/fail-restart-$unit" ]; then
                echo "Job for $unit failed because the control process exited with error code." >&2
                exit 1
            fi
            echo "$unit" >> /var/log/fake-restarts.log
            # what the unit runs with from now on: its drop-ins as they are at this restart
            cat /etc/systemd/system/"$unit".d/*.conf > "$state/loaded-$unit" 2>/dev/null || true
        done ;;
    start)
        shift
        for unit in "$@"; do
            grep -q "^$unit " "$state/running" || echo "$unit loaded active running $unit" >> "$state/running"
        done ;;
    enable|disable)
        verb=$1
        shift
        if [ "$1" = --now ]; then shift; fi
        for unit in "$@"; do
            grep -vxF "$unit" "$state/enabled" > "$state/enabled.new" 2>/dev/null || true
            mv "$state/enabled.new" "$state/enabled"
            if [ "$verb" = enable ]; then echo "$unit" >> "$state/enabled"; fi
        done ;;
    is-enabled)
        if grep -qxF "$2" "$state/enabled" 2>/dev/null; then echo enabled; else echo disabled; exit 1; fi ;;
    list-units)
        if [ -e "$state/fail-list-units" ]; then echo "Failed to list units: fake failure" >&2; exit 1; fi
        cat "$state/running" ;;
    is-active)
        shift
        [ "$1" = --quiet ] && shift
        grep -q "^$1 " "$state/running" ;;
esac
"""

FAKE_REBOOT = r"""#!/bin/sh
# FAKE reboot for NodeGate's agent tests: records the call and "boots" the test root.
[ "${1:-}" = --from-systemctl ] || echo "reboot $*" >> /var/log/fake-calls.log
state=/etc/fake-systemd
if [ -e "$state/fail-reboot" ]; then echo "Failed to reboot: fake failure" >&2; exit 1; fi
if [ -f /boot/grub/grub.cfg ]; then
    line=$(grep -m1 -E '^[[:space:]]*linux[[:space:]]' /boot/grub/grub.cfg)
    set -- $line
    shift
    echo "BOOT_IMAGE=$*" > /proc/cmdline
fi
for module in $(cat /etc/modprobe.d/*.conf 2>/dev/null | sed -n 's/^blacklist[[:space:]][[:space:]]*//p'); do
    grep -v "^$module " /proc/modules > /proc/modules.new || true
    mv /proc/modules.new /proc/modules
done
echo "fake-boot-$$" > /proc/sys/kernel/random/boot_id
# A booting systemd loads every unit's drop-ins (what the fake `systemctl show -p DropInPaths` reports).
rm -rf "$state/loaded"; mkdir -p "$state/loaded"
for dir in /etc/systemd/system/*.d; do
    [ -d "$dir" ] || continue
    unit=${dir##*/}; unit=${unit%.d}
    for f in "$dir"/*.conf; do [ -e "$f" ] && printf '%s ' "$f"; done > "$state/loaded/$unit"
done
# A booting kdump service loads the crash kernel when the kernel reserved memory for it.
loaded=0
if grep -q 'crashkernel=' /proc/cmdline 2>/dev/null &&
        grep -qxE 'kdump(-tools)?\.service' "$state/enabled" 2>/dev/null; then
    loaded=1
fi
[ ! -d /sys/kernel ] || echo "$loaded" > /sys/kernel/kexec_crash_loaded
if [ -e "$state/shutdown-kills-caller" ]; then kill -TERM "$PPID"; fi
if [ -e "$state/shutdown-kills-self" ]; then kill -TERM "$$"; fi
exit 0
"""

FAKE_SYSCTL = r"""#!/bin/sh
# FAKE sysctl for NodeGate's agent tests: records its calls; keys are files under /proc/sys.
echo "sysctl $*" >> /var/log/fake-calls.log
path() { echo "/proc/sys/$(echo "$1" | tr . /)"; }
set_kv() {
    key=$(echo "$1" | tr -d '[:blank:]')
    value=$(echo "$2" | sed 's/^[[:blank:]]*//; s/[[:blank:]]*$//')
    p=$(path "$key")
    if [ ! -e "$p" ]; then echo "sysctl: cannot stat $p: No such file or directory" >&2; return 1; fi
    echo "$value" > "$p"
    echo "$key = $value"
}
load() {
    status=0
    while IFS='=' read -r k v; do
        case "$k" in ''|'#'*|';'*) continue ;; esac
        set_kv "$k" "$v" || status=1
    done < "$1"
    return $status
}
case "$1" in
    -n) p=$(path "$2"); [ -e "$p" ] || { echo "sysctl: cannot stat $p" >&2; exit 255; }; cat "$p" ;;
    -p) load "${2:-/etc/sysctl.conf}" ;;
    --system)
        status=0
        for f in /etc/sysctl.d/*.conf /etc/sysctl.conf; do
            [ -f "$f" ] && { load "$f" || status=1; }
        done
        exit $status ;;
    -w) set_kv "${2%%=*}" "${2#*=}" ;;
    *=*) set_kv "${1%%=*}" "${1#*=}" ;;
    *) echo "$1 = $(cat "$(path "$1")")" ;;
esac
"""

FAKE_RUNUSER = r"""#!/bin/sh
# FAKE runuser for NodeGate's agent tests: `runuser -u USER -- CMD...` with the limits pam_limits would
# set for USER's session from /etc/security/limits.conf and limits.d (items with a sh ulimit flag;
# `*` lines apply to every user but root, as with pam_limits).
echo "runuser $*" >> /var/log/fake-calls.log
[ "$1" = -u ] && [ "$3" = -- ] || { echo "fake runuser: only -u USER -- CMD" >&2; exit 1; }
user=$2; shift 3
grep -q "^$user:" /etc/passwd || { echo "runuser: user $user does not exist" >&2; exit 1; }
for f in /etc/security/limits.conf /etc/security/limits.d/*.conf; do
    [ -f "$f" ] || continue
    sed -e 's/#.*//' "$f" | while read -r domain type item value; do
        [ -n "$value" ] || continue
        { [ "$domain" = "$user" ] || { [ "$domain" = '*' ] && [ "$user" != root ]; }; } || continue
        case "$item" in nofile) flag=n ;; nproc) flag=p ;; memlock) flag=l ;; stack) flag=s ;; *) continue ;; esac
        case "$value" in -1|infinity) value=unlimited ;; esac
        case "$type" in soft) echo "ulimit -S$flag $value" ;; hard) echo "ulimit -H$flag $value" ;;
            -) echo "ulimit -$flag $value" ;; esac   # both at once (sh sets soft and hard)
    done
done > /tmp/.fake-runuser-limits.$$
# Hard limits first (raising a soft limit may need the hard one raised before it).
limits=$(grep -- ' -H' /tmp/.fake-runuser-limits.$$; grep -v -- ' -H' /tmp/.fake-runuser-limits.$$)
rm -f /tmp/.fake-runuser-limits.$$
eval "$limits" || { echo "runuser: cannot open session: Operation not permitted" >&2; exit 1; }
exec "$@"
"""

FAKE_NSENTER = r"""#!/bin/sh
# FAKE nsenter for NodeGate's agent tests: the test root has no host PID 1 whose namespaces a step
# could enter, so `nsenter [options] -- CMD` runs CMD where it is (run the agent in a private mount
# namespace, tests.agent.conftest.in_private_mounts, to let mounts really happen).
echo "nsenter $*" >> /var/log/fake-calls.log
while [ $# -gt 0 ] && [ "$1" != -- ]; do shift; done
[ "${1:-}" = -- ] && shift
exec "$@"
"""

FAKE_APT_GET = r"""#!/bin/sh
# FAKE apt-get for NodeGate's agent tests, over the real dpkg status file (/var/lib/dpkg/status, which
# the real dpkg-query reads):
#   install [--only-upgrade] PKG     PKG to its candidate in /etc/fake-apt/candidates ("PKG VERSION")
#   install PKG=VERSION              PKG at VERSION, which /etc/fake-apt/available must list ("PKG VERSION")
#   purge PKG                        PKG gone (`autoremove` removes nothing)
# A package with a unit in /etc/fake-apt/unit-PKG starts it on install and stops it on purge, as a
# Debian postinst and prerm do; `update` does nothing.
echo "apt-get $*" >> /var/log/fake-calls.log
status=/var/lib/dpkg/status
verb=""
for arg; do case "$arg" in -*) ;; update|install|purge|autoremove) verb=$arg ;; *) target=$arg ;; esac; done
[ "$verb" = update ] && exit 0
[ "$verb" = autoremove ] && exit 0   # no package here was installed as a dependency
package=${target%%=*}
unit=$(cat "/etc/fake-apt/unit-$package" 2>/dev/null || true)
running=/etc/fake-systemd/running
drop() {
    awk -v p="$package" '/^Package: / { here = ($2 == p) } !here { print }' "$status" > "$status.new"
    mv "$status.new" "$status"
}
files=/etc/fake-apt/files-$package
if [ "$verb" = purge ]; then
    drop
    [ ! -d "$files" ] || (cd "$files" && find . -type f) | while read -r f; do rm -f "/${f#./}"; done
    [ -z "$unit" ] || { grep -v "^$unit " "$running" > "$running.new" || true; mv "$running.new" "$running"; }
    echo "Removing $package ..."; exit 0
fi
case "$target" in
    *=*) version=${target#*=}
         grep -qx "$package $version" /etc/fake-apt/available 2>/dev/null || {
             echo "E: Version '$version' for '$package' was not found" >&2; exit 100; } ;;
    *) version=$(awk -v p="$package" '$1 == p { print $2 }' /etc/fake-apt/candidates 2>/dev/null)
       [ -n "$version" ] || { echo "E: Unable to locate package $package" >&2; exit 100; } ;;
esac
drop
[ ! -d "$files" ] || cp -R "$files/." /
printf 'Package: %s\nStatus: install ok installed\nArchitecture: amd64\nVersion: %s\n\n' \
    "$package" "$version" >> "$status"
[ -z "$unit" ] || grep -q "^$unit " "$running" || echo "$unit loaded active running $package" >> "$running"
echo "Setting up $package ($version) ..."
"""

FAKE_APT_MARK = r"""#!/bin/sh
# FAKE apt-mark for NodeGate's agent tests: holds are the lines of /var/lib/fake-apt/holds.
echo "apt-mark $*" >> /var/log/fake-calls.log
holds=/var/lib/fake-apt/holds
mkdir -p "${holds%/*}"; touch "$holds"
case "$1" in
    showhold) cat "$holds" ;;
    hold) grep -qx "$2" "$holds" || echo "$2" >> "$holds"; echo "$2 set on hold." ;;
    unhold) grep -vx "$2" "$holds" > "$holds.new" || true; mv "$holds.new" "$holds"; echo "Canceled hold on $2." ;;
    *) echo "fake apt-mark: $1" >&2; exit 1 ;;
esac
"""

FAKE_AUGENRULES = r"""#!/bin/sh
# FAKE augenrules for NodeGate's agent tests: `--load` "loads" /etc/audit/rules.d/*.rules into the
# fake kernel (/run/fake-audit/loaded), replacing what was loaded.
echo "augenrules $*" >> /var/log/fake-calls.log
mkdir -p /run/fake-audit
cat /etc/audit/rules.d/*.rules 2>/dev/null | sed -e 's/[[:space:]]*#.*$//' | grep -v '^[[:space:]]*$' \
    > /run/fake-audit/loaded || true
"""

FAKE_AUDITCTL = r"""#!/bin/sh
# FAKE auditctl for NodeGate's agent tests: `-l` lists what the fake augenrules loaded, keys spelled
# the way the kernel reports them (-F key=KEY for syscall rules).
echo "auditctl $*" >> /var/log/fake-calls.log
[ "$1" = -l ] || { echo "fake auditctl: $*" >&2; exit 1; }
[ -s /run/fake-audit/loaded ] || { echo "No rules"; exit 0; }
sed -e '/^-a/s/-k \([^ ]*\)/-F key=\1/' /run/fake-audit/loaded
"""

FAKE_TUNED_ADM = r"""#!/bin/sh
# FAKE tuned-adm for NodeGate's agent tests: the active profile in /etc/tuned/active_profile, a
# profile's [sysctl] settings (and those of the profiles it includes) applied to the fake /proc/sys,
# the values they replaced kept in /run/fake-tuned/saved and put back when the profile goes.
echo "tuned-adm $*" >> /var/log/fake-calls.log
active=/etc/tuned/active_profile
saved=/run/fake-tuned/saved
mkdir -p /run/fake-tuned /etc/tuned
daemon() {
    grep -q '^tuned.service ' /etc/fake-systemd/running 2>/dev/null && return 0
    echo "Cannot talk to TuneD daemon via DBus. Is TuneD daemon running?" >&2; exit 1
}
profile_file() {
    for d in /etc/tuned /usr/lib/tuned; do [ -f "$d/$1/tuned.conf" ] && { echo "$d/$1/tuned.conf"; return 0; }; done
    return 1
}
sysctls() (   # key=value lines of a profile, included profiles first (a subshell: it recurses)
    file=$(profile_file "$1") || exit 0
    inc=$(sed -n 's/^include[[:space:]]*=[[:space:]]*//p' "$file")
    for i in $inc; do sysctls "$i"; done
    awk '/^\[/ { s = ($0 == "[sysctl]"); next }
         s && /=/ { k = $0; sub(/[[:space:]]*=.*/, "", k); v = $0; sub(/^[^=]*=[[:space:]]*/, "", v)
                    print k "=" v }' "$file"
)
path() { echo "/proc/sys/$(echo "$1" | tr . /)"; }
revert() {
    [ -f "$saved" ] && while IFS='=' read -r k v; do echo "$v" > "$(path "$k")"; done < "$saved"
    rm -f "$saved"
}
case "$1" in
    profile)
        daemon
        [ -n "${2:-}" ] || { echo "usage: tuned-adm profile PROFILE" >&2; exit 1; }
        profile_file "$2" >/dev/null || {
            echo "Unable to switch profile: Requested profile '$2' doesn't exist." >&2; exit 1; }
        revert
        sysctls "$2" | while IFS='=' read -r k v; do
            p=$(path "$k"); [ -e "$p" ] || continue
            grep -q "^$k=" "$saved" 2>/dev/null || echo "$k=$(cat "$p")" >> "$saved"
            echo "$v" > "$p"
        done
        echo "$2" > "$active" ;;
    off) daemon; revert; : > "$active" ;;
    active)
        daemon
        if [ -s "$active" ]; then echo "Current active profile: $(cat "$active")"
        else echo "No current active profile."; fi ;;
    verify)
        daemon
        status=0
        [ -s "$active" ] && sysctls "$(cat "$active")" | while IFS='=' read -r k v; do
            p=$(path "$k"); [ -e "$p" ] || continue
            [ "$(cat "$p")" = "$v" ] || { echo "$k: $(cat "$p"), profile $v" >> /var/log/fake-tuned.log; exit 1; }
        done || status=1
        # (sic: tuned 2.20, Debian 12's, spells it so)
        if [ $status = 0 ]; then echo "Verfication succeeded, current system settings match the preset profile."
        else echo "Verification failed, current system settings differ from the preset profile."; fi
        echo "See TuneD log file ('/var/log/tuned/tuned.log') for details."
        exit $status ;;
    *) echo "fake tuned-adm: $*" >&2; exit 1 ;;
esac
"""

FAKE_MODPROBE = r"""#!/bin/sh
# FAKE modprobe for NodeGate's agent tests: loaded modules are the lines of /proc/modules.
# `-r M` fails while /etc/fake-modules/in-use-M exists; loading honours `install M /bin/false`.
echo "modprobe $*" >> /var/log/fake-calls.log
if [ "$1" = -r ]; then
    module=$2
    [ ! -e "/etc/fake-modules/in-use-$module" ] || { echo "modprobe: FATAL: Module $module is in use." >&2; exit 1; }
    grep -v "^$module " /proc/modules > /proc/modules.new || true; mv /proc/modules.new /proc/modules
    exit 0
fi
module=$1
if grep -qx "install $module /bin/false" /etc/modprobe.d/*.conf 2>/dev/null; then exit 1; fi
grep -q "^$module " /proc/modules || echo "$module 16384 0 - Live 0x0000000000000000" >> /proc/modules
"""

FAKE_UPDATE_INITRAMFS = r"""#!/bin/sh
# FAKE update-initramfs for NodeGate's agent tests: records its calls; an "initramfs" is the list
# of files it would contain (what the fake lsinitramfs prints).
echo "update-initramfs $*" >> /var/log/fake-calls.log
if [ -e /etc/fake-systemd/fail-update-initramfs ]; then echo "update-initramfs: fake failure" >&2; exit 1; fi
for dir in /lib/modules/*; do
    version=${dir##*/}
    {
        echo .
        echo "usr/lib/modules/$version"
        for f in /etc/modprobe.d/*; do [ -e "$f" ] && echo "${f#/}"; done
    } > "/boot/initrd.img-$version"
    echo "update-initramfs: Generating /boot/initrd.img-$version"
done
"""

FAKE_LSINITRAMFS = r"""#!/bin/sh
# FAKE lsinitramfs for NodeGate's agent tests: prints what the fake update-initramfs put in.
echo "lsinitramfs $*" >> /var/log/fake-calls.log
cat "$1"
"""

FAKE_UPDATE_GRUB = r"""#!/bin/sh
# FAKE update-grub for NodeGate's agent tests: records its calls and renders a one-entry grub.cfg
# the way grub-mkconfig would, from /etc/default/grub and /etc/default/grub.d/*.cfg.
echo "update-grub $*" >> /var/log/fake-calls.log
GRUB_CMDLINE_LINUX=""
GRUB_CMDLINE_LINUX_DEFAULT=""
[ -f /etc/default/grub ] && . /etc/default/grub
for f in /etc/default/grub.d/*.cfg; do [ -f "$f" ] && . "$f"; done
mkdir -p /boot/grub
cat > /boot/grub/grub.cfg.new <<EOF
# FAKE grub.cfg rendered by the test root's fake update-grub
menuentry 'Debian GNU/Linux' {
	linux	/boot/vmlinuz-__KERNEL__ root=/dev/sda1 ro $GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT
	initrd	/boot/initrd.img-__KERNEL__
}
EOF
mv /boot/grub/grub.cfg.new /boot/grub/grub.cfg
echo "Generating grub configuration file ... done"
""".replace("__KERNEL__", KERNEL)

FAKES: Final = {
    "systemctl": ("usr/bin", FAKE_SYSTEMCTL),
    "reboot": ("usr/sbin", FAKE_REBOOT),
    "sysctl": ("usr/sbin", FAKE_SYSCTL),
    "update-initramfs": ("usr/sbin", FAKE_UPDATE_INITRAMFS),
    "lsinitramfs": ("usr/bin", FAKE_LSINITRAMFS),
    "update-grub": ("usr/sbin", FAKE_UPDATE_GRUB),
    "runuser": ("usr/sbin", FAKE_RUNUSER),
    "nsenter": ("usr/bin", FAKE_NSENTER),
    "apt-get": ("usr/bin", FAKE_APT_GET),
    "apt-mark": ("usr/bin", FAKE_APT_MARK),
    "augenrules": ("usr/sbin", FAKE_AUGENRULES),
    "auditctl": ("usr/sbin", FAKE_AUDITCTL),
    "modprobe": ("usr/sbin", FAKE_MODPROBE),
    "tuned-adm": ("usr/sbin", FAKE_TUNED_ADM),
}

FILES: Final = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
    "etc/os-release": 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nNAME="Debian GNU/Linux"\nVERSION_ID="12"\n'
                      'VERSION_CODENAME=bookworm\nID=debian\n',
    "etc/hostname": "fake-node\n",
    "var/lib/dpkg/status": (
        "Package: openssh-server\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1:9.2p1-2+deb12u2\n\n"
        "Package: libfoo1\nStatus: deinstall ok config-files\nArchitecture: amd64\nVersion: 1.0-1\n\n"
    ),
    "etc/fake-apt/candidates": "openssh-server 1:9.2p1-2+deb12u3\nkdump-tools 1:1.8.1\ntuned 2.19.0-2\n",
    "etc/fake-apt/available": "auditd 1:3.0.9-1\nauditd 1:3.1.2-2\n",
    "etc/fake-apt/unit-auditd": "auditd.service",
    "etc/fake-apt/unit-kdump-tools": "kdump-tools.service",
    "etc/fake-apt/unit-tuned": "tuned.service",
    # Debian's kdump-tools ships these two (the GRUB drop-in sets Debian's default crashkernel=).
    "etc/fake-apt/files-kdump-tools/etc/default/kdump-tools": "USE_KDUMP=1\nKDUMP_COREDIR=\"/var/crash\"\n",
    "etc/fake-apt/files-kdump-tools/etc/default/grub.d/kdump-tools.cfg":
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT crashkernel=384M-:128M"\n',
    "etc/fake-apt/files-tuned/usr/lib/tuned/balanced/tuned.conf":
        "[main]\nsummary=General non-specialized tuned profile\n",
    "sys/kernel/kexec_crash_loaded": "0\n",
    "etc/default/grub": 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n',
    "etc/chrony/chrony.conf": "pool 2.debian.pool.ntp.org iburst\ndriftfile /var/lib/chrony/chrony.drift\n",
    "etc/fake-systemd/running": (
        "chrony.service loaded active running chrony, an NTP client/server\n"
        "cron.service loaded active running Regular background program processing daemon\n"
        "dbus.service loaded active running D-Bus System Message Bus\n"
        "ssh.service loaded active running OpenBSD Secure Shell server\n"
        "systemd-journald.service loaded active running Journal Service\n"
        "getty@tty1.service loaded active running Getty on tty1\n"
    ),
    "proc/cmdline": f"BOOT_IMAGE=/boot/vmlinuz-{KERNEL} root=/dev/sda1 ro quiet\n",
    "proc/modules": (
        "nouveau 2433024 0 - Live 0x0000000000000000\n"
        "drm_kms_helper 200704 1 nouveau, Live 0x0000000000000000\n"
        "ext4 1007616 1 - Live 0x0000000000000000\n"
    ),
    "proc/sys/net/core/somaxconn": "4096\n",
    "proc/sys/net/ipv4/tcp_keepalive_time": "7200\n",
    "proc/sys/vm/swappiness": "60\n",
    "proc/sys/vm/max_map_count": "65530\n",
    "proc/sys/vm/nr_hugepages": "0\n",
    "proc/sys/vm/dirty_ratio": "20\n",
    "proc/sys/vm/dirty_background_ratio": "10\n",
    "proc/sys/kernel/random/boot_id": "fake-boot-0\n",
    f"boot/vmlinuz-{KERNEL}": "",
}
DIRS: Final = ("etc/modprobe.d", "etc/sysctl.d", "etc/default/grub.d", f"usr/lib/modules/{KERNEL}", "var/lib",
               "var/log", "run", "root", "dev")


def _shared_libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        match = _LIB.search(line.split("=>")[-1])
        if match and os.path.exists(match.group(1)):
            libs.append(match.group(1))
    return libs


def _copy_into(root: Path, source: str, where: str | None = None) -> None:
    target = root / (where or source).lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        shutil.copy2(source, target)  # follows symlinks: sh -> dash arrives as a real sh


def build(root: Path) -> Path:
    """Build the test root filesystem at `root` (an empty or missing directory)."""
    root.mkdir(parents=True, exist_ok=True)
    for top in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", FAKE_DIR, "tmp"):
        (root / top).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    for link in ("bin", "sbin", "lib", "lib64"):
        (root / link).symlink_to(f"usr/{link}")
    libraries: set[str] = set()
    for name in REQUIRED + OPTIONAL:
        found = shutil.which(name)
        if found is None:
            if name in REQUIRED:
                raise RuntimeError(f"the test root needs `{name}` from the host, and it has none")
            continue
        _copy_into(root, found, f"/usr/bin/{name}")
        libraries.update(_shared_libraries(found))
    for library in sorted(libraries):
        _copy_into(root, library)
    for directory in DIRS:
        (root / directory).mkdir(parents=True, exist_ok=True)
    for path, text in FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    for name, (directory, script) in FAKES.items():
        fake = root / FAKE_DIR / f"fake-{name}"
        fake.write_text(script)
        fake.chmod(0o755)
        (root / directory / name).symlink_to(os.path.relpath(fake, root / directory))
    for name, minor in (("null", 3), ("zero", 5), ("urandom", 9)):
        os.mknod(root / "dev" / name, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
    return root


def copy_host_tools(root: Path, *names: str) -> None:
    """This machine's NAMES (and their shared libraries) into a built root, for a test that needs more
    real tools than the base root carries (packages/lvm: wipefs, blkid, mkfs.ext4)."""
    for name in names:
        found = shutil.which(name)
        if found is None:
            raise RuntimeError(f"the test needs `{name}` from this machine, and it has none")
        _copy_into(root, found, f"/usr/bin/{name}")
        for library in _shared_libraries(found):
            _copy_into(root, library)


def clone(base: Path, dest: Path) -> Path:
    """A private copy of a built root (device nodes included, hence cp -a)."""
    subprocess.run(["cp", "-a", str(base), str(dest)], check=True)
    return dest


def fake_calls(root: Path) -> list[str]:
    """The command lines the fakes recorded, oldest first."""
    path = root / CALLS
    return path.read_text().splitlines() if path.exists() else []


def restarted_units(root: Path) -> list[str]:
    path = root / "var/log/fake-restarts.log"
    return path.read_text().splitlines() if path.exists() else []


def make_fail(root: Path, what: str) -> None:
    """Make one fake operation fail from now on, e.g. "restart-chrony.service" or "reboot"."""
    (root / "etc/fake-systemd" / f"fail-{what}").write_text("")


def installed_version(root: Path, package: str) -> str:
    """The version of `package` installed in the test root (the real dpkg-query on its status file); "" if none."""
    out = subprocess.run(["dpkg-query", "--admindir", str(root / "var/lib/dpkg"), "-W", "-f",
                          "${db:Status-Abbrev} ${Version}", package], capture_output=True, text=True)
    return out.stdout.split()[-1] if out.returncode == 0 and out.stdout.startswith("ii") else ""
