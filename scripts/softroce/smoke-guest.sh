#!/bin/sh
# shellcheck shell=dash
# The smoke suite's guest side: smoke.sh passes this file's text to `sh -c` inside the
# Soft-RoCE guest. One `SMOKE PASS|FAIL|SKIP name: detail` line per check; smoke.sh
# counts them. Every server and client runs under timeout(1), and every wait for a
# server to listen is bounded, so a hung tool fails its check instead of the run.
# Exit status: the number of failed checks (0 when all passed).

dev="${SOFTROCE_DEV:-rxe0}"
gidx="${SOFTROCE_GID_INDEX:-1}"
ip="${SOFTROCE_IP:-10.0.2.15}"
logs=/tmp/smoke
mkdir -p "$logs"
failed=0

pass() { echo "SMOKE PASS $*"; }
skip() { echo "SMOKE SKIP $*"; }
fail() {
    echo "SMOKE FAIL $*"
    failed=$((failed + 1))
}
# The last lines of a tool's output, indented, after a failure.
show() {
    for f in "$@"; do
        [ -s "$f" ] || continue
        echo "  --- ${f##*/} (last 15 lines):"
        tail -n 15 "$f" | sed 's/^/  | /'
    done
}

now() {
    local up
    read -r up _ </proc/uptime
    echo "$up"
}

# wait_listen KIND PORT SECS PID: until something listens on PORT, either a TCP socket
# (KIND tcp, the side channel of ibv_rc_pingpong and of perftest without -R) or an
# rdma_cm id (KIND cm, rping and perftest -R). Polls every 0.1 s, at most SECS, and
# gives up at once if the server (PID) has exited.
wait_listen() {
    local kind="$1" port="$2" secs="$3" pid="$4" hex i=0
    hex=$(printf '%04X' "$port")
    while [ "$i" -lt $((secs * 10)) ]; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "  the server exited before listening on port $port"
            return 1
        fi
        case "$kind" in
        tcp) grep -q ":$hex [0-9A-F:]* 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0 ;;
        cm) rdma resource show cm_id 2>/dev/null | grep -q "state LISTEN .*:$port " && return 0 ;;
        esac
        i=$((i + 1))
        sleep 0.1
    done
    echo "  waited ${secs} s for a $kind listener on port $port; none appeared"
    return 1
}

# pair NAME KIND PORT "SERVER CMD" "CLIENT CMD": starts the server, waits until it
# listens, runs the client, then waits for the server to finish. Both must exit 0.
# Sets client_secs to the client's run time and pair_log to its logs' path prefix
# (.server, .client). The commands are word-split on purpose (fixed strings below).
client_secs=0
pair_log=
pair() {
    local name="$1" kind="$2" port="$3" server="$4" client="$5" spid src=0 crc=0 t0 log
    log="$logs/$(echo "$name" | tr -c 'A-Za-z0-9_\n' _)"
    pair_log="$log"
    # shellcheck disable=SC2086
    timeout 60 $server >"$log.server" 2>&1 &
    spid=$!
    if ! wait_listen "$kind" "$port" 15 "$spid"; then
        kill "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
        fail "$name: server never listened"
        show "$log.server"
        return 1
    fi
    t0=$(now)
    # shellcheck disable=SC2086
    timeout 60 $client >"$log.client" 2>&1 || crc=$?
    client_secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
    wait "$spid" || src=$?
    if [ "$crc" -ne 0 ] || [ "$src" -ne 0 ]; then
        fail "$name: client exit $crc, server exit $src"
        show "$log.server" "$log.client"
        return 1
    fi
    return 0
}

# 1. The device is there and its port is up.
if timeout 20 ibv_devinfo -d "$dev" >"$logs/devinfo" 2>&1 &&
    grep -q "hca_id:[[:space:]]*$dev" "$logs/devinfo" &&
    grep -q 'PORT_ACTIVE' "$logs/devinfo"; then
    pass "ibv_devinfo: $dev $(grep -o 'active_mtu:.*' "$logs/devinfo" | tr -s '\t ' ' '), PORT_ACTIVE"
else
    fail "ibv_devinfo: no $dev with PORT_ACTIVE"
    show "$logs/devinfo"
fi

# 2. RC send/recv between two processes over rxe0 (the TCP side channel on loopback).
if pair ibv_rc_pingpong tcp 18515 \
    "ibv_rc_pingpong -d $dev -g $gidx -n 200" \
    "ibv_rc_pingpong -d $dev -g $gidx -n 200 127.0.0.1"; then
    pass "ibv_rc_pingpong: $(grep -m1 'bytes in' "$pair_log.client")"
fi

# 3. rdma_cm connection setup plus RDMA READ/WRITE with data verification (-V).
if pair "rping -C 10 -V" cm 7174 \
    "rping -s -a $ip -C 10" \
    "rping -c -a $ip -C 10 -V"; then
    pass "rping -C 10 -V: 10 ping-pongs verified"
fi

# 4. Bandwidth with perftest: RDMA WRITE and READ, with the TCP side channel and with
# rdma_cm (-R). 64 KiB messages, few iterations: this checks function, not speed.
# -F: do not fail on the CPU frequency checks, which mean nothing under emulation.
# perftest converts cycles to time with a clock rate it calibrates at start-up; under
# TCG that calibration sometimes fails ("Correlation coefficient r^2 < 0.9") and the
# figures come out as 0.00 although the transfer completed. So the line also gives the
# client's wall time (connection setup and calibration included), always meaningful.
iters=1000
bw() {
    local tool="$1" cm="$2" name kind opts figures
    name="$tool${cm:+ -R}"
    if ! command -v "$tool" >/dev/null; then
        skip "$name: perftest is not in the guest"
        return 0
    fi
    kind=tcp
    [ -n "$cm" ] && kind=cm
    opts="-d $dev -x $gidx -s 65536 -n $iters -F $cm"
    if pair "$name" "$kind" 18515 "$tool $opts" "$tool $opts $ip"; then
        # perftest's result row: bytes, iterations, peak and average MB/sec (MiB), Mpps.
        figures=$(awk '$1 == 65536 && NF >= 5 && $4 > 0 {print "perftest average " $4 " MB/s, peak " $3 " MB/s"}' "$pair_log.client")
        if [ -z "$figures" ]; then
            figures="perftest gave no figure ($(grep -m1 -o 'Correlation coefficient.*' "$pair_log.client" || echo 'no result row'))"
        fi
        pass "$name: $iters x 64 KiB; $figures; client wall $client_secs s = $(awk -v n="$iters" -v t="$client_secs" 'BEGIN { printf "%.1f", n / 16 / t }') MB/s incl. setup"
    fi
}
bw ib_write_bw ""
bw ib_write_bw -R
bw ib_read_bw ""
bw ib_read_bw -R

# 5. FUSE is usable: the device node exists and opens read-write, fusermount3 runs.
# The open runs in a subshell: a failed redirection on `exec` would end this shell.
if [ -c /dev/fuse ] && (exec 3<>/dev/fuse) 2>"$logs/fuse" &&
    fusermount3 -V >>"$logs/fuse" 2>&1; then
    pass "fuse: /dev/fuse opens, $(head -n 1 "$logs/fuse")"
else
    fail "fuse: /dev/fuse missing or unusable, or fusermount3 -V failed"
    show "$logs/fuse"
fi

exit "$failed"
