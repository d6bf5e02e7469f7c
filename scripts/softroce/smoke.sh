#!/usr/bin/env bash
# Smoke test of the Soft-RoCE harness: builds the guest, boots it once and checks, on
# rxe0, ibv_devinfo (PORT_ACTIVE), ibv_rc_pingpong, rping, ib_write_bw / ib_read_bw with
# and without rdma_cm, and that FUSE is usable (/dev/fuse, fusermount3 -V).
#
# Usage: smoke.sh [--timeout SECS] [build-guest.sh options, e.g. --workdir DIR]
#
# Prints one line per check and a final `N passed, M failed` line; exits non-zero
# unless every check passed. The guest side of the checks is smoke-guest.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/lib.sh
. "$here/lib.sh"

timeout_s=240
build_args=()
run_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --timeout)
        [ $# -ge 2 ] || die "--timeout needs a value"
        timeout_s="$2"
        shift 2
        ;;
    --workdir)
        [ $# -ge 2 ] || die "--workdir needs a value"
        build_args+=("$1" "$2")
        run_args+=("$1" "$2")
        shift 2
        ;;
    -h | --help)
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
        exit 0
        ;;
    *)
        build_args+=("$1")
        shift
        ;;
    esac
done

started=$SECONDS
"$here/build-guest.sh" "${build_args[@]}"
built=$SECONDS

out="$(mktemp "${TMPDIR:-/tmp}/softroce-smoke.XXXXXX")"
trap 'rm -f "$out"' EXIT

echo "==> booting the guest for the smoke suite (timeout ${timeout_s} s)" >&2
guest_rc=0
"$here/run-guest.sh" "${run_args[@]}" --timeout "$timeout_s" -- \
    sh -c "$(cat "$here/smoke-guest.sh")" smoke-guest | tee "$out" || guest_rc=$?
finished=$SECONDS

# The summary is the host's own count of the guest's SMOKE lines, so a guest that died
# halfway still yields a failing summary instead of a missing one.
passed=0
failed=0
echo
echo "==> Soft-RoCE smoke results"
while IFS= read -r line; do
    case "$line" in
    "SMOKE PASS "*) passed=$((passed + 1)) ;;
    "SMOKE FAIL "*) failed=$((failed + 1)) ;;
    "SMOKE SKIP "*) ;;
    *) continue ;;
    esac
    echo "${line#SMOKE }"
done <"$out"
# The guest's exit status is its failure count; anything else (timeout 124, setup
# failure or crash 125, a check that never reported) is one more failure.
if [ "$guest_rc" -ne "$failed" ] || [ "$passed" -eq 0 ]; then
    echo "FAIL guest run: run-guest.sh exited with status $guest_rc after $passed passed and $failed failed checks"
    failed=$((failed + 1))
fi
echo "timing: build $((built - started)) s, boot + checks + power-off $((finished - built)) s, total $((finished - started)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
