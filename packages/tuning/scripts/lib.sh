# Shared by the tuning package's scripts (sourced, POSIX sh). Every file the package writes is named
# after the gate, so two gates carrying `tuning` never write the same file.
gate=${NODEGATE_GATE:?}
cfg=${NODEGATE_CONFIG_DIR:?}
state=${NODEGATE_STATE_DIR:?}
tag="85-nodegate-tuning-$gate"
sysctl_file=/etc/sysctl.d/$tag.conf
grub_file=/etc/default/grub.d/$tag.cfg
limits_file=/etc/security/limits.d/$tag.conf
grub_cfg=${TUNING_GRUB_CFG:-/boot/grub/grub.cfg}
saved_sysctl=$state/sysctl.saved        # "key = value" the node had before we first set key
services_list=$state/services           # the units we wrote a drop-in for, one a line
grub_args_file=$state/grub.args         # the kernel arguments our drop-in adds
MARK="# Managed by NodeGate (gate $gate, package tuning); removed when the package is uninstalled."

has() { [ -e "$cfg/$1" ]; }

# Lines of a config file without comments and blank lines, leading/trailing blanks trimmed.
content() { sed -e 's/[[:space:]]*#.*$//' -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$1" | grep -v '^$' || true; }

squeeze() { tr -s '[:blank:]' ' ' | sed -e 's/^ //' -e 's/ $//'; }

# sysctl.conf as "key=value" lines, the key with dots, the value with single spaces.
sysctl_pairs() {
    content "$1" | while IFS= read -r line; do
        case "$line" in *=*) ;; *) echo "sysctl.conf: '$line' is not key = value" >&2; return 1 ;; esac
        key=$(printf '%s' "${line%%=*}" | tr -d '[:blank:]' | sed 's/^-//' | tr / .)
        value=$(printf '%s' "${line#*=}" | squeeze)
        case "$key" in ''|*[!a-zA-Z0-9_.:-]*) echo "sysctl.conf: '$key' is not a sysctl name" >&2; return 1 ;; esac
        echo "$key=$value"
    done
}

live_sysctl() { sysctl -n "$1" | squeeze; }

# The kernel arguments of grub.conf, one per line.
grub_args() { content "$1" | tr -s '[:space:]' '\n' | grep -v '^$' || true; }

# service_<unit>.conf -> the unit (".service" added when the name has no unit type).
unit_of() {
    unit=${1#service_}; unit=${unit%.conf}
    case "$unit" in
        ''|*[!A-Za-z0-9:_.@\\-]*) echo "config key $1: '$unit' is not a systemd unit name" >&2; return 1 ;;
        *.service|*.socket|*.timer|*.mount|*.path|*.slice|*.scope|*.target) echo "$unit" ;;
        *) echo "$unit.service" ;;
    esac
}
drop_in_of() { echo "/etc/systemd/system/$1.d/$tag.conf"; }

# Write a file atomically; a file we did not write that sits at our path is saved once, put back later.
put_file() {
    path=$1
    if [ -e "$path" ] && ! grep -qxF "$MARK" "$path" && [ ! -e "$state/backup$path" ]; then
        mkdir -p "$state/backup$(dirname "$path")"
        cp -p "$path" "$state/backup$path"
    fi
    mkdir -p "$(dirname "$path")"
    cat > "$path.nodegate-tmp"
    mv "$path.nodegate-tmp" "$path"
}
remove_file() {
    path=$1
    rm -f "$path"
    if [ -e "$state/backup$path" ]; then mv "$state/backup$path" "$path"; echo "put back the original $path"; fi
}

# The host's way of turning /etc/default/grub(.d) into grub.cfg.
regenerate_grub() {
    if command -v update-grub >/dev/null 2>&1; then update-grub
    elif command -v grub-mkconfig >/dev/null 2>&1; then grub-mkconfig -o "$grub_cfg"
    elif command -v grub2-mkconfig >/dev/null 2>&1; then grub2-mkconfig -o "${TUNING_GRUB_CFG:-/boot/grub2/grub.cfg}"
    else echo "grub.conf: this host has none of update-grub, grub-mkconfig, grub2-mkconfig"; return 1
    fi
}

# The kernel command line of grub.cfg's first (default) entry.
grub_cfg_line() { grep -m1 -E '^[[:space:]]*linux(efi)?[[:space:]]' "$grub_cfg" 2>/dev/null || true; }

in_words() { case " $2 " in *" $1 "*) return 0 ;; esac; return 1; }
