"""Kernels for packages/node-setup in the chroot tier: FAKE update-grub, boot loader and uname.

What is real: the package's scripts, dpkg-query over the test root's dpkg status file, and the GRUB
menu they parse, laid out as Debian's grub-mkconfig writes it (a top entry, then an "Advanced
options" submenu with an entry per kernel, ids `gnulinux-<release>-advanced-<uuid>`). What is FAKE,
each appending its command line to /var/log/fake-calls.log:

* `update-grub` writes that menu for every /boot/vmlinuz-*, newest first, with
  `set default="$GRUB_DEFAULT"` from /etc/default/grub and its grub.d drop-ins;
* `apt-get install linux-image-R` (over the test root's fake apt-get) also puts /boot/vmlinuz-R
  there and runs update-grub, as the Debian package and its postinst hook do; `purge` removes it;
* the reboot (over the test root's fake reboot) boots the entry `set default` names, as GRUB does,
  and `uname -r` answers the release of the image the fake boot put in /proc/cmdline (BOOT_IMAGE).
"""

from __future__ import annotations

from pathlib import Path

from tests.agent.rootfs import FAKE_DIR, KERNEL

NEW_KERNEL = "6.2.0-1-fake"  # newer than the root's: the top entry boots it

FAKE_UPDATE_GRUB = r"""#!/bin/sh
# FAKE update-grub (tests/agent/fake_kernels.py): Debian's menu layout for every /boot/vmlinuz-*.
echo "update-grub $*" >> /var/log/fake-calls.log
GRUB_DEFAULT=0
[ -f /etc/default/grub ] && . /etc/default/grub
for f in /etc/default/grub.d/*.cfg; do [ -f "$f" ] && . "$f"; done
uuid=6e6f6465-6761-7465-0000-66616b650000
kernels=$(ls /boot/vmlinuz-* 2>/dev/null | sed 's|.*/vmlinuz-||' | sort -rV)
newest=$(echo "$kernels" | head -n1)
mkdir -p /boot/grub
{
    echo "# FAKE grub.cfg rendered by fake_kernels.py's update-grub"
    echo 'if [ "${next_entry}" ] ; then'
    echo '   set default="${next_entry}"'
    echo 'else'
    echo "   set default=\"$GRUB_DEFAULT\""
    echo 'fi'
    echo "menuentry 'Debian GNU/Linux' --class debian \$menuentry_id_option 'gnulinux-simple-$uuid' {"
    printf '\tlinux\t/boot/vmlinuz-%s root=/dev/sda1 ro quiet\n}\n' "$newest"
    echo "submenu 'Advanced options for Debian GNU/Linux' \$menuentry_id_option 'gnulinux-advanced-$uuid' {"
    for k in $kernels; do
        entry="\tmenuentry 'Debian GNU/Linux, with Linux %s%s' \$menuentry_id_option 'gnulinux-%s-%s-%s' {\n"
        printf "$entry" "$k" "" "$k" advanced "$uuid"
        printf '\t\tlinux\t/boot/vmlinuz-%s root=/dev/sda1 ro quiet\n\t}\n' "$k"
        printf "$entry" "$k" " (recovery mode)" "$k" recovery "$uuid"
        printf '\t\tlinux\t/boot/vmlinuz-%s root=/dev/sda1 ro single\n\t}\n' "$k"
    done
    echo "}"
} > /boot/grub/grub.cfg.new
mv /boot/grub/grub.cfg.new /boot/grub/grub.cfg
echo "Generating grub configuration file ... done"
"""

FAKE_APT_GET_KERNELS = r"""#!/bin/sh
# FAKE apt-get for kernels (tests/agent/fake_kernels.py), over the test root's fake apt-get.
/usr/libexec/nodegate-fakes/fake-apt-get-base "$@" || exit $?
verb=""; for arg; do case "$arg" in -*) ;; install|purge) verb=$arg ;; *) target=$arg ;; esac; done
case "$target" in linux-image-[0-9]*) release=${target#linux-image-}; release=${release%%=*} ;; *) exit 0 ;; esac
case "$verb" in install) : > "/boot/vmlinuz-$release" ;; purge) rm -f "/boot/vmlinuz-$release" ;; *) exit 0 ;; esac
update-grub >/dev/null
"""

FAKE_BOOT_DEFAULT = r"""#!/bin/sh
# FAKE reboot (tests/agent/fake_kernels.py): the test root's fake reboot, then GRUB's part: the
# kernel line of the entry `set default` names (an id path or a top-level number) goes to /proc/cmdline.
/usr/libexec/nodegate-fakes/fake-reboot-base "$@" || exit $?
cfg=/boot/grub/grub.cfg
[ -f "$cfg" ] || exit 0
default=$(sed -n 's/^[[:space:]]*set default="\([^$"]*\)"$/\1/p' "$cfg" | tail -n1)
line=$(awk -v d="${default##*>}" '
    function id_of(l) { n = split(l, q, "\047"); return q[n - 1] }
    BEGIN { number = (d ~ /^[0-9]+$/) }
    /^menuentry / { top++ }
    /^[[:space:]]*menuentry / { here = number ? (top - 1 == d && $0 !~ /^[[:space:]]/) : (id_of($0) == d) }
    /^[[:space:]]*linux[[:space:]]/ && here { $1 = ""; print; exit }' "$cfg")
[ -z "$line" ] || echo "BOOT_IMAGE=${line# }" > /proc/cmdline
"""

FAKE_UNAME = r"""#!/bin/sh
# FAKE uname (tests/agent/fake_kernels.py): -r is the release of the image the fake boot booted.
echo "uname $*" >> /var/log/fake-calls.log
if [ "${1:-}" = -r ]; then sed -n 's|^BOOT_IMAGE=[^ ]*/vmlinuz-\([^ ]*\).*|\1|p' /proc/cmdline; exit 0; fi
exec /usr/libexec/nodegate-fakes/uname-real "$@"
"""


def _fake(root: Path, name: str, text: str) -> Path:
    path = root / FAKE_DIR / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def _over(root: Path, command: str, text: str) -> None:
    """A fake in front of COMMAND's fake in the test root (which stays, as fake-COMMAND-base)."""
    base = root / FAKE_DIR / f"fake-{command}"
    base.rename(root / FAKE_DIR / f"fake-{command}-base")
    _fake(root, f"fake-{command}", text)


def install(root: Path, available: str = NEW_KERNEL) -> None:
    """The fakes in the test root; the running kernel is the root's own, linux-image-`available` is
    what apt can install."""
    _fake(root, "fake-update-grub", FAKE_UPDATE_GRUB)
    _over(root, "apt-get", FAKE_APT_GET_KERNELS)
    _over(root, "reboot", FAKE_BOOT_DEFAULT)
    (root / "usr/bin/uname").rename(root / FAKE_DIR / "uname-real")
    uname = _fake(root, "fake-uname", FAKE_UNAME)
    (root / "usr/bin/uname").symlink_to(f"../libexec/nodegate-fakes/{uname.name}")
    with open(root / "var/lib/dpkg/status", "a") as status:
        status.write(f"Package: linux-image-{KERNEL}\nStatus: install ok installed\nArchitecture: amd64\n"
                     "Version: 6.1.0-1\n\n")
    with open(root / "etc/fake-apt/candidates", "a") as candidates:
        candidates.write(f"linux-image-{available} 6.1.999-1\n")
