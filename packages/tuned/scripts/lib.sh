# Shared by the tuned package's scripts (sourced, POSIX sh).
gate=${NODEGATE_GATE:?}
cfg=${NODEGATE_CONFIG_DIR:?}
state=${NODEGATE_STATE_DIR:-/nonexistent}
unit=tuned.service
original=$state/original      # "installed VERSION" or "absent": tuned before the package
saved_profile=$state/profile.saved   # the profile active before the package ("" = none)
written=$state/profiles       # the profiles we wrote, one name a line
MARK="# Managed by NodeGate (gate $gate, package tuned); removed when the package is uninstalled."

# The package manager, from /etc/os-release: apt (Debian, Ubuntu) or dnf (RHEL, Fedora, CentOS,
# Rocky, Amazon Linux); anything else is refused by name.
package_manager() {
    release=${OS_RELEASE:-/etc/os-release}   # OS_RELEASE: for the unit tests of other systems' files
    [ -r "$release" ] || { echo "no $release: cannot tell how to install tuned" >&2; return 1; }
    id=$(. "$release"; echo "${ID:-} ${ID_LIKE:-}")
    case " $id " in
        *" debian "*|*" ubuntu "*) echo apt ;;
        *" rhel "*|*" fedora "*|*" centos "*|*" amzn "*) echo dnf ;;
        *) echo "unsupported OS '$id' (os-release ID and ID_LIKE): tuned installs with apt (Debian, Ubuntu) or dnf (RHEL, Fedora, Amazon Linux)" >&2; return 1 ;;
    esac
}
installed_version() {
    case "$pm" in
        apt) dpkg-query -W -f '${db:Status-Abbrev} ${Version}\n' tuned 2>/dev/null | awk '$1 ~ /^.i/ { print $2 }' ;;
        dnf) rpm -q --qf '%{EPOCHNUM}:%{VERSION}-%{RELEASE}\n' tuned 2>/dev/null | grep -v 'not installed' || true ;;
    esac
}

valid_name() { case "$1" in ''|*[!A-Za-z0-9_.-]*|.*) return 1 ;; esac; }
# The profiles of the config: profile_<name>.conf -> <name>, one a line.
config_profiles() {
    for file in "$cfg"/profile_*.conf; do
        [ -e "$file" ] || continue
        name=$(basename "$file"); name=${name#profile_}; name=${name%.conf}
        valid_name "$name" || { echo "config key $(basename "$file"): '$name' is not a profile name (letters, digits, _ . -)" >&2; return 1; }
        echo "$name"
    done
}
profile_file() { echo "/etc/tuned/$1/tuned.conf"; }
# Whether a profile exists on the host: ours in /etc/tuned, or one tuned ships (/usr/lib/tuned, or
# /usr/lib/tuned/profiles from tuned 2.23).
profile_exists() { for d in /etc/tuned /usr/lib/tuned /usr/lib/tuned/profiles; do [ -f "$d/$1/tuned.conf" ] && return 0; done; return 1; }
# tuned keeps the profile it applies in /etc/tuned/active_profile (empty after `tuned-adm off`).
active_profile() { cat /etc/tuned/active_profile 2>/dev/null | tr -d '[:space:]' || true; }
wanted() { tr -d '[:space:]' < "$cfg/tuned_profile"; }
