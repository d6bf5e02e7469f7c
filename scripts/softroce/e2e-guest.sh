#!/bin/sh
# shellcheck shell=dash
# The guest side of e2e.sh: e2e.sh passes this file's text to `sh -c` inside the
# Soft-RoCE guest, with arguments
#
#   TRANSPORT OP_TIMEOUT WATCH NAME=TEST_BINARY[@FILTER]...
#
# after the text of guest-watch.sh, and it runs each test binary in turn (libtest, one
# test at a time, captured output shown; with FILTER only the tests whose names
# contain it; one still running after WATCH seconds is hung: where its threads are is
# printed, it is killed with status 124 and the next binary runs) with the environment the harness and common/tests/fabric.rs read:
# RMEMFS_TRANSPORT, RMEMFS_BIN_DIR (memnode, fsd, rmemfs and fabricbench are in /usr/local/bin),
# RMEMFS_TEST_OP_TIMEOUT (fsd's --op-timeout), RMEMFS_TEST_HOST (where test servers
# and memnodes listen: rxe0's IPv4 address, since RoCE cannot reach loopback) and
# RMEMFS_TEST_WIREGUARD=required (the WireGuard test runs here, never skips).
# Around each binary it prints `E2E-BEGIN NAME` and `E2E-END NAME rc=N seconds=S`;
# e2e.sh counts libtest's own `test result:` lines between them.
# Exit status: the number of test binaries that failed.

transport="$1"
op_timeout="$2"
watch="$3"
shift 3

export RMEMFS_TRANSPORT="$transport"
export RMEMFS_BIN_DIR=/usr/local/bin
export RMEMFS_TEST_OP_TIMEOUT="$op_timeout"
export RMEMFS_TEST_HOST="${SOFTROCE_IP:-10.0.2.15}"
# The guest has WireGuard (build-guest.sh): tests/tests/wireguard.rs, which skips on a
# host without it, must run here, and fails if it cannot.
export RMEMFS_TEST_WIREGUARD=required
export RUST_BACKTRACE=1

now() {
    local up
    read -r up _ </proc/uptime
    echo "$up"
}

echo "e2e-guest: transport $transport, op timeout $op_timeout s, listen on $RMEMFS_TEST_HOST, $(grep MemTotal /proc/meminfo | tr -s ' ')"
failed=0
for spec in "$@"; do
    name="${spec%%=*}"
    bin="${spec#*=}"
    filter=""
    case "$bin" in
    *@*)
        filter="${bin#*@}"
        bin="${bin%%@*}"
        ;;
    esac
    echo "E2E-BEGIN $name"
    t0="$(now)"
    # shellcheck disable=SC2086 # no filter: no argument
    "$bin" $filter --test-threads 1 --show-output &
    rc=0
    watch_run $! "$watch" || rc=$?
    t1="$(now)"
    echo "E2E-END $name rc=$rc seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')"
    if [ "$rc" -ne 0 ]; then
        failed=$((failed + 1))
        # What a failing test may have left, shown and then cleared so that the
        # next binary starts as the first did: daemons (a hung binary, killed by
        # the watch, leaves its fixtures' memnodes and fsds running), then mounts.
        # (busybox here has no pgrep)
        for p in /proc/[0-9]*; do
            cmd="$(tr '\0' ' ' 2>/dev/null <"$p"/cmdline)"
            case "${cmd%% *}" in
            */memnode | */fsd)
                echo "  proc: ${p#/proc/} $cmd (killed)"
                kill -9 "${p#/proc/}" 2>/dev/null || true
                ;;
            esac
        done
        while read -r _ dir type _; do
            case "$type" in
            fuse | fuse.*)
                echo "  mount: $dir $type (unmounted)"
                umount -l "$dir" 2>/dev/null || true
                ;;
            esac
        done </proc/mounts
    fi
done
exit "$failed"
