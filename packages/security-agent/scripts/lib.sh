# Shared by security-agent's scripts (sourced, POSIX sh).
gate=${NODEGATE_GATE:?}
cfg=${NODEGATE_CONFIG_DIR:?}
state=${NODEGATE_STATE_DIR:?}
agent=auditd
unit=auditd.service
rules_file=/etc/audit/rules.d/85-nodegate-$gate.rules
original=$state/original      # "installed VERSION held|unheld" or "absent": the host before the package
MARK="## Managed by NodeGate (gate $gate, package security-agent); removed when the package is uninstalled."

require_apt() {
    id=$(. /etc/os-release 2>/dev/null; echo "${ID:-} ${ID_LIKE:-}")
    case " $id " in *" debian "*|*" ubuntu "*) ;;
        *) echo "unsupported OS '$id': security-agent installs auditd with apt (Debian, Ubuntu)"; return 1 ;; esac
}
installed_version() { dpkg-query -W -f '${db:Status-Abbrev} ${Version}\n' "$1" 2>/dev/null | awk '$1 ~ /^.i/ { print $2 }'; }
is_held() { apt-mark showhold | grep -qx "$1"; }

# The rules of audit.rules (comments and blank lines dropped). Every rule must carry a key
# (-k KEY or -F key=KEY): the check finds the loaded rules by their keys.
rules() { [ -e "$cfg/audit.rules" ] || return 0; sed -e 's/[[:space:]]*#.*$//' "$cfg/audit.rules" | grep -v '^[[:space:]]*$' || true; }
key_of() { printf '%s\n' "$1" | sed -n -e 's/.*-k[[:space:]]\{1,\}\([^[:space:]]*\).*/\1/p' -e 's/.*-F[[:space:]]\{1,\}key=\([^[:space:]]*\).*/\1/p' | head -n1; }
check_rules() {
    rules | while IFS= read -r rule; do
        case "$rule" in -D*|-b*|-f*|-e*|-r*) echo "audit.rules: '$rule' is a control line; the package owns only rules" >&2; return 1 ;;
            -a*|-A*|-w*) ;; *) echo "audit.rules: '$rule' is not a rule (-a, -A or -w)" >&2; return 1 ;; esac
        [ -n "$(key_of "$rule")" ] || { echo "audit.rules: '$rule' has no key (-k KEY): the check finds loaded rules by key" >&2; return 1; }
    done
}
