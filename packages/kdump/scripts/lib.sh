# Shared by the kdump package's scripts (sourced, POSIX sh).
gate=${NODEGATE_GATE:?}
cfg=${NODEGATE_CONFIG_DIR:?}
state=${NODEGATE_STATE_DIR:-/nonexistent}
drop_in=/etc/default/grub.d/zz-nodegate-kdump-$gate.cfg   # zz: after the distribution's kdump-tools.cfg
original=$state/original        # "installed VERSION" or "absent": the crash-dump tools before the package
saved_conf=$state/kdump.conf.saved     # the distribution's kdump config file as the host had it
boot_crashkernel=$state/crashkernel.booted   # the crashkernel= arguments the host booted with before us
next_crashkernel=$state/crashkernel.next      # ... and those its boot loader gave the next boot
MARK="# Managed by NodeGate (gate $gate, package kdump); removed when the package is uninstalled."

# The host's family, from /etc/os-release: debian (Debian, Ubuntu: kdump-tools, apt, update-grub) or
# rhel (RHEL, Fedora, CentOS, Rocky, Alma, Amazon Linux: kexec-tools, dnf, grubby). Anything else is
# refused by name.
family() {
    release=${OS_RELEASE:-/etc/os-release}   # OS_RELEASE: for the unit tests of other systems' files
    [ -r "$release" ] || { echo "no $release: cannot tell how to install the crash-dump tools" >&2; return 1; }
    id=$(. "$release"; echo "${ID:-} ${ID_LIKE:-}")
    case " $id " in
        *" debian "*|*" ubuntu "*) echo debian ;;
        *" rhel "*|*" fedora "*|*" centos "*|*" amzn "*) echo rhel ;;
        *) echo "unsupported OS '$id' (os-release ID and ID_LIKE): kdump knows Debian and Ubuntu (kdump-tools, apt) and RHEL, Fedora, Amazon Linux (kexec-tools, dnf)" >&2; return 1 ;;
    esac
}

# What each family calls things.
setup() {
    fam=$(family) || return 1
    case "$fam" in
        debian) tools=kdump-tools; unit=kdump-tools.service; conf=/etc/default/kdump-tools ;;
        rhel) tools=kexec-tools; unit=kdump.service; conf=/etc/kdump.conf ;;
    esac
}

dpkg_installed() { dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n' | awk '$1 ~ /^.i/ { print $2 }' | sort; }
installed_version() {
    case "$fam" in
        debian) dpkg-query -W -f '${db:Status-Abbrev} ${Version}\n' "$1" 2>/dev/null | awk '$1 ~ /^.i/ { print $2 }' ;;
        rhel) rpm -q --qf '%{EPOCHNUM}:%{VERSION}-%{RELEASE}\n' "$1" 2>/dev/null | grep -v 'not installed' || true ;;
    esac
}

want_crashkernel() {
    value=$(tr -d '[:space:]' < "$cfg/crashkernel")
    case "$value" in
        ''|*[!0-9A-Za-z:,@-]*) echo "config key crashkernel: '$value' is not a crashkernel= value (e.g. 256M, 384M-:512M, 1G-4G:192M,4G-:256M)" >&2; return 1 ;;
    esac
    echo "$value"
}

# The crashkernel= words of a command line, in order (the kernel takes the last one).
crashkernels() { tr -s '[:space:]' '\n' | grep '^crashkernel=' || true; }
last_crashkernel() { crashkernels | tail -n 1; }

# The kernel command line the boot loader will give the next boot: grub.cfg's default (first)
# entry on Debian, grubby's default entry on RHEL.
next_cmdline() {
    case "$fam" in
        debian) grep -m1 -E '^[[:space:]]*linux(efi)?[[:space:]]' "${KDUMP_GRUB_CFG:-/boot/grub/grub.cfg}" 2>/dev/null || true ;;
        rhel) grubby --info=DEFAULT | sed -n 's/^args="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' ;;
    esac
}

update_grub() {
    if command -v update-grub >/dev/null 2>&1; then update-grub
    elif command -v grub-mkconfig >/dev/null 2>&1; then grub-mkconfig -o "${KDUMP_GRUB_CFG:-/boot/grub/grub.cfg}"
    else echo "this host has neither update-grub nor grub-mkconfig: cannot put crashkernel= in grub.cfg"; return 1
    fi
}
