#!/bin/sh
# Run the gate's script for one step list: $NODEGATE_CONFIG_DIR/<list>.sh (upgrade: $1 previous, $2 new).
# A script with a #! line runs as it says; one without runs with `/bin/sh -eu`.
#
# Unlike a runner that passes when a check is missing, a stage whose script ran must have its check:
#   <stage>.sh given, <stage>-check.sh missing  -> the check fails, naming the missing key;
#   neither given                                -> nothing changed, nothing to prove: passes, saying so;
#   post-interrupt-check.sh missing              -> apply-check.sh runs instead (the install must still
#                                                   hold after the reboot or restart).
set -eu
list=${NODEGATE_STAGE:?}
cfg=${NODEGATE_CONFIG_DIR:?}
work=${NODEGATE_STATE_DIR:?}/scripts

run_script() {
    key=$1; shift
    mkdir -p "$work"
    cp "$cfg/$key" "$work/$key"
    chmod 0700 "$work/$key"
    echo "running $key from the gate's config"
    if [ "$(head -c 2 "$work/$key")" = "#!" ]; then exec "$work/$key" "$@"; fi
    exec /bin/sh -eu "$work/$key" "$@"
}

case "$list" in
    *-check)
        stage=${list%-check}
        if [ -e "$cfg/$list.sh" ]; then run_script "$list.sh" "$@"; fi
        if [ "$stage" = post-interrupt ]; then
            echo "no post-interrupt-check.sh: proving the install still holds with apply-check.sh"
            run_script apply-check.sh "$@"
        fi
        if [ -e "$cfg/$stage.sh" ]; then
            echo "$stage.sh ran, but the config has no $list.sh to prove it worked: a missing check is a failure"
            exit 1
        fi
        echo "no $stage.sh and no $list.sh in the config: nothing changed, nothing to prove" ;;
    *)
        if [ -e "$cfg/$list.sh" ]; then run_script "$list.sh" "$@"; fi
        echo "no $list.sh in the config: nothing to do" ;;
esac
