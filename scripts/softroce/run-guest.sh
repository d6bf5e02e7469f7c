#!/usr/bin/env bash
# Boots the Soft-RoCE guest built by build-guest.sh, runs one command inside it with
# rxe0 up, and exits with that command's exit status.
#
# Usage: run-guest.sh [options] -- COMMAND [ARG]...
#
#   --timeout SECS   kill the guest after SECS seconds of wall time (default 300)
#   --mem MB         guest memory (default 1024)
#   --smp N          guest CPUs (default 2; qemu runs one host thread per CPU)
#   --workdir DIR    where build-guest.sh put the guest (same default as there)
#   --qemu-arg ARG   one extra qemu argument (repeatable), e.g. a virtio NIC
#   --interactive    attach the terminal to the command (default COMMAND: sh); no
#                    timeout unless --timeout is given
#
# COMMAND runs as root in /root with stdin from /dev/null, after the guest has loaded
# the modules, put 10.0.2.15/24 on dummy0, created rxe0 on it and seen its GID
# ::ffff:10.0.2.15. It gets SOFTROCE_DEV=rxe0, SOFTROCE_NETDEV=dummy0,
# SOFTROCE_IP=10.0.2.15 and SOFTROCE_GID_INDEX (normally 1) in its environment.
# Arguments are passed as they are (no shell in between); for pipelines use
# `-- sh -c '...'`. The guest console (kernel messages and the command's output) is
# streamed to stdout.
#
# Exit status: COMMAND's own; 124 if the timeout expired; 125 if the guest failed to
# set up Soft-RoCE or stopped without reporting a result (crash, panic).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/lib.sh
. "$here/lib.sh"

timeout_s=
mem=1024
smp=2
work=
interactive=
qemu_extra=()
while [ $# -gt 0 ]; do
    case "$1" in
    --timeout | --mem | --smp | --workdir | --qemu-arg)
        [ $# -ge 2 ] || usage
        case "$1" in
        --timeout) timeout_s="$2" ;;
        --mem) mem="$2" ;;
        --smp) smp="$2" ;;
        --workdir) work="$2" ;;
        --qemu-arg) qemu_extra+=("$2") ;;
        esac
        shift 2
        ;;
    --interactive)
        interactive=1
        shift
        ;;
    --)
        shift
        break
        ;;
    -h | --help) usage 0 ;;
    *)
        echo "run-guest: unknown argument: $1 (the command goes after --)" >&2
        usage
        ;;
    esac
done
for n in "$mem" "$smp" ${timeout_s:+"$timeout_s"}; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "not a positive number: $n"
done
if [ $# -eq 0 ]; then
    [ -n "$interactive" ] || usage
    set -- sh
fi
[ -n "$interactive" ] || timeout_s="${timeout_s:-300}"
work="${work:-$(softroce_default_workdir)}"
kernel="$work/vmlinuz"
initrd="$work/initrd.cpio.gz"
if [ ! -f "$kernel" ] || [ ! -f "$initrd" ]; then
    die "no guest in $work: run scripts/softroce/build-guest.sh first"
fi
command -v qemu-system-x86_64 >/dev/null ||
    die "qemu-system-x86_64 is missing: run scripts/softroce/build-guest.sh (it installs qemu-system-x86)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/softroce-run.XXXXXX")"
qemu_pid=
stream_pid=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    # Never leave a guest behind, whatever ended this script (^C, TERM, set -e).
    if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
        kill -TERM "$qemu_pid" 2>/dev/null || true
        # timeout(1) forwards the TERM to qemu and sends KILL 5 s later if needed.
        wait "$qemu_pid" 2>/dev/null || true
    fi
    # The console streamer ends by itself within 0.2 s of qemu; let it flush.
    if [ -n "$stream_pid" ]; then
        wait "$stream_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The command travels as a second cpio archive appended to the initramfs (the kernel
# unpacks concatenated archives in order): no kernel command line length or quoting
# limits. Each argument is single-quoted for the guest's sh, with ' written as '\''.
# (No $(...) here: it would drop an argument's trailing newlines.)
mkdir -p "$tmp/overlay/etc/softroce"
{
    printf 'set --'
    for arg in "$@"; do
        printf " '%s'" "${arg//\'/\'\\\'\'}"
    done
    printf '\n'
} >"$tmp/overlay/etc/softroce/cmd"
overlay_files=(etc/softroce/cmd)
if [ -n "$interactive" ]; then
    : >"$tmp/overlay/etc/softroce/interactive"
    overlay_files+=(etc/softroce/interactive)
fi
cp "$initrd" "$tmp/initrd.cpio.gz"
# Only the files, not their directories: the base image has those already.
(cd "$tmp/overlay" && printf '%s\n' "${overlay_files[@]}" |
    cpio -o -H newc -R 0:0 --quiet) | gzip -1 >>"$tmp/initrd.cpio.gz"

# shellcheck disable=SC2054 # the commas are qemu's, not array separators
qemu=(qemu-system-x86_64
    -accel tcg,thread=multi # KVM is unusable on these machines
    -cpu max -smp "$smp" -m "$mem"
    -nographic -no-reboot
    -kernel "$kernel" -initrd "$tmp/initrd.cpio.gz"
    -nic none # Soft-RoCE runs on dummy0 inside the guest; no NIC needed
    -append "console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off"
    "${qemu_extra[@]}")

echo "run-guest: booting Debian kernel $(cat "$work/kernel-version" 2>/dev/null || echo '?') (TCG, $smp CPUs, $mem MB)${timeout_s:+, timeout $timeout_s s}" >&2
started=$SECONDS

if [ -n "$interactive" ]; then
    # The terminal goes straight to the guest console (^A x quits qemu).
    if [ -n "$timeout_s" ]; then
        timeout --foreground -k 5 "$timeout_s" "${qemu[@]}" | tee "$tmp/console.log" || true
    else
        "${qemu[@]}" | tee "$tmp/console.log" || true
    fi
else
    # qemu writes the console to a file that tail streams to stdout, without the serial
    # line's \r and SeaBIOS's terminal resets (they garble CI logs); timeout(1) bounds
    # the run and qemu_pid lets cleanup stop it.
    : >"$tmp/console.log" # exists before tail opens it
    timeout -k 5 "$timeout_s" "${qemu[@]}" </dev/null >>"$tmp/console.log" 2>&1 &
    qemu_pid=$!
    # In the background too: bash runs a signal trap only once the foreground job ends,
    # but interrupts `wait` at once, so a TERM or ^C stops the guest without delay.
    tail -n +1 -s 0.2 -f --pid="$qemu_pid" "$tmp/console.log" |
        sed -u -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\x1bc//g' -e 's/\r$//' &
    stream_pid=$!
    qemu_rc=0
    wait "$qemu_pid" || qemu_rc=$?
    qemu_pid=
    wait "$stream_pid" || true # tail prints the rest and ends within 0.2 s of qemu
    stream_pid=
    elapsed=$((SECONDS - started))
    # 124: timeout(1) sent TERM; 137: qemu ignored it and got KILL 5 s later.
    if [ "$qemu_rc" -eq 124 ] || { [ "$qemu_rc" -eq 137 ] && [ "$elapsed" -ge "$timeout_s" ]; }; then
        echo "run-guest: TIMEOUT: the guest did not finish within $timeout_s s; qemu was killed (console above)" >&2
        exit 124
    fi
fi
elapsed=$((SECONDS - started))
qemu_rc="${qemu_rc:-}"

console="$(sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\x1bc//g' -e 's/\r$//' "$tmp/console.log")"
if setup="$(grep -a -m1 '^SOFTROCE-SETUP-FAILED' <<<"$console")"; then
    echo "run-guest: the guest could not set up Soft-RoCE: ${setup#SOFTROCE-SETUP-FAILED: }" >&2
    exit 125
fi
result="$(grep -a '^SOFTROCE-RESULT rc=[0-9]*$' <<<"$console" | tail -n 1 || true)"
if [ -z "$result" ]; then
    echo "run-guest: the guest stopped after ${elapsed} s without printing its SOFTROCE-RESULT line (qemu exit status ${qemu_rc:-?}; kernel panic or crash? console above)" >&2
    exit 125
fi
rc="${result#SOFTROCE-RESULT rc=}"
echo "run-guest: command exited with status $rc; guest ran ${elapsed} s from qemu start to power-off" >&2
exit "$rc"
