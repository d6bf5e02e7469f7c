# shellcheck shell=bash
# Shared by the Soft-RoCE harness scripts (sourced, not run).

softroce_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
softroce_repo="$(cd "$softroce_here/../.." && pwd)"

# Fixed guest network identity: guest-init.sh uses the same address, and tests inside
# the guest read it from $SOFTROCE_IP rather than hard-coding it.
# shellcheck disable=SC2034 # used by the scripts that source this file
SOFTROCE_GUEST_IP=10.0.2.15

# usage [STATUS]: prints the running script's header comment (its usage: the lines
# from the second to `set -euo`, without their `# `) and exits with STATUS (2).
usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit "${1:-2}"
}

die() {
    printf 'softroce: %s\n' "$*" >&2
    exit 1
}

# A command that fails under `set -e` ends the script without a word; say which one,
# so a failure in CI can be told from its log. (`set -E` carries the trap into
# functions and subshells.)
set -E
softroce_status=0
trap 'softroce_status=$?; printf "softroce: %s: line %s: \"%s\" failed (status %s)\n" "${0##*/}" "$LINENO" "$BASH_COMMAND" "$softroce_status" >&2' ERR

# The work dir both scripts agree on: $SOFTROCE_DIR, else <cargo target dir>/softroce,
# so `cargo clean` also drops the guest and it never lands in git.
softroce_default_workdir() {
    local target="${CARGO_TARGET_DIR:-$softroce_repo/target}"
    case "$target" in
    /*) ;;
    *) target="$softroce_repo/$target" ;;
    esac
    printf '%s\n' "${SOFTROCE_DIR:-$target/softroce}"
}
