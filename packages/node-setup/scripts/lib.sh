# Shared by node-setup's scripts (sourced, POSIX sh).
gate=${NODEGATE_GATE:?}
cfg=${NODEGATE_CONFIG_DIR:?}
state=${NODEGATE_STATE_DIR:?}
node=${NODEGATE_NODE:-$(cat /etc/hostname 2>/dev/null || echo unknown)}
kernel=$(tr -d '[:space:]' < "$cfg/kernel")
hold=$(tr -d '[:space:]' < "$cfg/hold")
grub_cfg=${NODE_SETUP_GRUB_CFG:-/boot/grub/grub.cfg}
drop_in=/etc/default/grub.d/86-nodegate-node-setup-$gate.cfg
installed_by_us=$state/installed      # present when the package installed the kernel
held_before=$state/held-before        # present when the kernel was already held
original_default=$state/original-default   # grubby's default kernel before the package (dnf systems)
MARK="# Managed by NodeGate (gate $gate, package node-setup); removed when the package is uninstalled."

# The host's package manager, from /etc/os-release: apt (Debian, Ubuntu) or dnf (RHEL and its
# rebuilds, Fedora, Amazon Linux). Anything else is refused by name.
package_manager() {
    release=${OS_RELEASE:-/etc/os-release}   # OS_RELEASE: for the unit tests of other systems' files
    [ -r "$release" ] || { echo "no $release: cannot tell the package manager" >&2; return 1; }
    id=$(. "$release"; echo "${ID:-} ${ID_LIKE:-}")
    case " $id " in
        *" debian "*|*" ubuntu "*) echo apt ;;
        *" rhel "*|*" fedora "*|*" centos "*|*" amzn "*) echo dnf ;;
        *) echo "unsupported OS '$id' (os-release ID and ID_LIKE): node-setup manages kernels with apt (Debian, Ubuntu) or dnf and grubby (RHEL, Fedora, Amazon Linux)" >&2; return 1 ;;
    esac
}
pm=$(package_manager)

# The kernel's package: linux-image-RELEASE (Debian, Ubuntu), kernel-RELEASE as a NEVRA (dnf).
case "$pm" in apt) package=linux-image-$kernel ;; dnf) package=kernel-$kernel ;; esac

is_installed() {
    case "$pm" in
        apt) dpkg-query -W -f '${db:Status-Abbrev}\n' "$package" 2>/dev/null | grep -q '^.i' ;;
        dnf) rpm -q "$package" >/dev/null 2>&1 ;;
    esac
}
is_held() {
    case "$pm" in
        apt) apt-mark showhold | grep -qxF "$package" ;;
        # versionlock keeps NAME-EPOCH:VERSION-RELEASE.*; the release here has its arch at the end.
        dnf) dnf -q versionlock list 2>/dev/null | grep -qF "kernel-0:${kernel%.*}.*" ;;
    esac
}
hold_kernel() {
    case "$pm" in apt) apt-mark hold "$package" >/dev/null ;; dnf) dnf -q versionlock add "$package" >/dev/null ;; esac
}
unhold_kernel() {
    case "$pm" in apt) apt-mark unhold "$package" >/dev/null ;; dnf) dnf -q versionlock delete "$package" >/dev/null ;; esac
}

regenerate_grub() {
    if command -v update-grub >/dev/null 2>&1; then update-grub
    elif command -v grub-mkconfig >/dev/null 2>&1; then grub-mkconfig -o "$grub_cfg"
    else echo "neither update-grub nor grub-mkconfig on $node: cannot regenerate $grub_cfg" >&2; return 1; fi
}

# Debian's grub.cfg: the menu path GRUB_DEFAULT takes to the entry that boots $kernel (not its
# recovery entry): "SUBMENU_ID>ENTRY_ID", or "ENTRY_ID" at the top level (GRUB_DISABLE_SUBMENU).
# Never the top "gnulinux-simple-" entry: it boots whichever kernel is newest, and a later kernel
# upgrade would take the boot over. Empty when there is none.
menu_path() {
    awk -v k="$kernel" '
        function id_of(line) { n = split(line, q, "\047"); return q[n - 1] }
        /^[[:space:]]*submenu / { sub_id = id_of($0) }
        /^[[:space:]]*menuentry / { entry = id_of($0); top = ($0 !~ /^[[:space:]]/)
                                    if (entry ~ /^gnulinux-simple-/) entry = "" }
        /^[[:space:]]*linux[[:space:]]/ && entry != "" && $0 !~ /[[:space:]]single([[:space:]]|$)/ {
            # Compared as a string, not a regex: a release may hold a plus (Debian 13: 6.12.117+deb13-...).
            image = $2; sub(/.*\//, "", image)
            if (image == "vmlinuz-" k) { print (top || sub_id == "" ? entry : sub_id ">" entry); exit }
            entry = ""
        }' "$grub_cfg" 2>/dev/null
}
# The kernel grub.cfg boots by default: its `set default` (not the next_entry/saved_entry ones)
# followed to its menu entry's linux line.
default_kernel() {
    case "$pm" in
        dnf) grubby --default-kernel 2>/dev/null | sed 's|.*/vmlinuz-||'; return ;;
    esac
    default=$(sed -n 's/^[[:space:]]*set default="\([^$"]*\)"$/\1/p' "$grub_cfg" 2>/dev/null | tail -n1)
    awk -v d="$default" '
        function id_of(line) { n = split(line, q, "\047"); return q[n - 1] }
        BEGIN { want = d; sub(/.*>/, "", want); number = (want ~ /^[0-9]+$/) }
        /^menuentry / { top++ }
        /^[[:space:]]*menuentry / { here = number ? (top - 1 == want && $0 !~ /^[[:space:]]/) : (id_of($0) == want) }
        /^[[:space:]]*linux[[:space:]]/ && here { v = $2; sub(/.*vmlinuz-/, "", v); print v; exit }
    ' "$grub_cfg" 2>/dev/null
}
