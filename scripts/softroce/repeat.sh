#!/usr/bin/env bash
# Runs rmemfs-common's fabric test binary over Soft-RoCE many times in one guest, to
# find what fails or hangs only now and then (a race in the verbs backend or in rxe).
#
# Usage: repeat.sh [--runs N] [--watch SECS] [--timeout SECS] [--workdir DIR] [FILTER]
#
#   --runs N        how many runs of the binary (default 100; a run takes 4-5 s)
#   --watch SECS    a run still going after SECS (default 60) counts as hung: the
#                   kernel stacks of its threads and of every task in D state are
#                   printed, then it is killed and the loop stops
#   --timeout SECS  wall time for the whole guest (default: enough for every run)
#   --workdir DIR   the guest's work dir (see build-guest.sh)
#   FILTER          only the tests whose names contain FILTER (libtest's filter)
#
# Each run is `fabric [FILTER] --test-threads 1` with RMEMFS_TRANSPORT=verbs, the
# output of a failed run is shown, and the last line says `N runs: P passed, F failed,
# H hung`. Exits non-zero unless every run passed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/../common.sh
. "$here/../common.sh"
# shellcheck source=SCRIPTDIR/lib.sh
. "$here/lib.sh"

runs=100
watch=60
timeout_s=
filter=
workdir_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --runs | --watch | --timeout | --workdir)
        [ $# -ge 2 ] || usage
        case "$1" in
        --runs) runs="$2" ;;
        --watch) watch="$2" ;;
        --timeout) timeout_s="$2" ;;
        --workdir) workdir_args=(--workdir "$2") ;;
        esac
        shift 2
        ;;
    -h | --help) usage 0 ;;
    -*)
        echo "repeat: unknown option: $1" >&2
        usage
        ;;
    *)
        filter="$1"
        shift
        ;;
    esac
done
for n in "$runs" "$watch" ${timeout_s:+"$timeout_s"}; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "not a positive number: $n"
done
# Runs take 4-5 s under TCG; a hung one takes its watch time.
timeout_s="${timeout_s:-$((runs * 8 + watch + 120))}"

cd "$softroce_repo"
install_softroce_packages
ensure_cargo
log "cargo build --release -p memnode; the fabric test binary"
cargo build --release -p memnode
fabric="$(cargo test --release -p rmemfs-common --test fabric --no-run --message-format=json-render-diagnostics |
    jq -r 'select(.reason == "compiler-artifact" and .executable != null and .target.name == "fabric") | .executable' |
    tail -n 1)"
[ -x "$fabric" ] || die "no fabric test binary after the build"
"$here/build-guest.sh" "${workdir_args[@]}" --strip --add "$fabric:/usr/local/bin/fabric"

# The guest side: one run at a time, each watched.
# shellcheck disable=SC2016 # expanded in the guest
guest='
export RMEMFS_TRANSPORT=verbs RMEMFS_TEST_HOST="${SOFTROCE_IP:-10.0.2.15}" RMEMFS_TEST_OP_TIMEOUT=30 RUST_BACKTRACE=1
runs="$1"; watch="$2"; filter="$3"
passed=0; failed=0; hung=0; i=0
while [ "$i" -lt "$runs" ]; do
    i=$((i + 1))
    # shellcheck disable=SC2086 # no filter: no argument
    /usr/local/bin/fabric $filter --test-threads 1 >/tmp/run.out 2>&1 &
    status=0
    watch_run $! "$watch" >/tmp/watch.out 2>&1 || status=$?
    if [ "$status" -eq 124 ]; then
        hung=$((hung + 1))
        echo "run $i: its output so far:"
        cat /tmp/run.out /tmp/watch.out
        break
    elif [ "$status" -eq 0 ]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "run $i: FAILED; its output:"
        grep -v "^test .* ok$" /tmp/run.out
    fi
done
echo "REPEAT-RESULT $i runs: $passed passed, $failed failed, $hung hung"
[ "$failed" -eq 0 ] && [ "$hung" -eq 0 ]
'
log "booting the guest: $runs runs of the fabric tests${filter:+ matching $filter} over verbs (timeout $timeout_s s)"
out="$(mktemp "${TMPDIR:-/tmp}/softroce-repeat.XXXXXX")"
trap 'rm -f "$out"' EXIT
rc=0
"$here/run-guest.sh" "${workdir_args[@]}" --timeout "$timeout_s" --mem 2048 -- \
    sh -c "$(cat "$here/guest-watch.sh")$guest" repeat "$runs" "$watch" "$filter" | tee "$out" || rc=$?
result="$(grep -a '^REPEAT-RESULT' "$out" | tail -n 1 | sed 's/^REPEAT-RESULT //; s/\r$//')"
[ -n "$result" ] || die "the guest stopped before the runs finished (run-guest.sh status $rc)"
echo "$result"
exit "$rc"
