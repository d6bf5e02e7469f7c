#!/usr/bin/env bash
# rmemfs's end-to-end tests over Soft-RoCE: builds the release binaries and the test
# binaries, builds the qemu guest with them, boots it and runs, inside, the fabric-level
# tests (rmemfs-common's `fabric` test binary, when it exists) and the end-to-end data
# tests of rmemfs-tests with RMEMFS_TRANSPORT=verbs, memnode and fsd talking over rxe0
# and fsd mounting with FUSE in the guest.
#
# Usage: e2e.sh [--transport verbs|tcp|auto] [--tests NAME,...] [--timeout SECS] [--mem MB] [--smp N] [--op-timeout SECS]
#               [--watch SECS] [--workdir DIR]
#
#   --transport T     what the tests run over in the guest (default verbs). `tcp` is a
#                     real run of the same pipeline without RDMA (the guest still has
#                     rxe0), useful while the verbs backend is not there.
#   --tests LIST      rmemfs-tests binaries to run, comma-separated (default
#                     round_trip,full_remote_memory,posix,remote_memory_reclaim, the
#                     remote_traffic test of what a 4 KiB request moves over the fabric
#                     (its other two are of fsd's cache and RSS, the same over any
#                     fabric, and run on the host), two
#                     tests of replication, a memnode stalled past the op timeout and
#                     resumed (an rdma_cm disconnect and reconnect), a volume whose
#                     newest metadata is on a memnode that is away at mount (refused,
#                     then --degraded), memnodes restarted on their memory files (two
#                     entries, the two-copy volume alone, so each has its own --watch),
#                     fabricbench, two tests of volumes, volumes_damage,
#                     integrity (page checksums, read repair and scrubbing over verbs) and
#                     wireguard (memnode and fsd over a WireGuard tunnel between two
#                     network namespaces, over tcp whatever the transport: the host's
#                     kernel has no WireGuard, the guest's has; about 20 s), the
#                     handshake over verbs (authentication: a second token holder
#                     cannot act as a volume's holder nor use its rkeys) and a tenant's
#                     quota over verbs (tenants: ENOSPC while another tenant writes);
#                     the 10,000-file tree and fsx of volumes take 390 s and 215 s in the guest,
#                     so they run there only when named). NAME:FILTER runs only the tests of binary
#                     NAME whose names contain FILTER.
#                     rmemfs-common's `fabric` binary always runs first when it exists;
#                     for verbs its absence counts as a failure (the wrong-rkey check
#                     over verbs lives there).
#   --timeout SECS    wall time for the whole guest run (default 1200: the default list took
#                     about 750 to 870 s under TCG on a 2-core Xeon host, more on a slow
#                     one).
#   --mem MB          guest memory (default 2048); --smp N guest CPUs (default 2).
#   --watch SECS      a test binary still running after SECS (default 300; the slowest,
#                     remote_traffic, takes about 125 s) is hung: the guest prints its
#                     threads' kernel stacks, kills it and goes on with the next one.
#   --op-timeout S    fsd's --op-timeout in the tests (default 30; emulated RDMA is
#                     slow and jittery).
#   --workdir DIR     the guest's work dir (see build-guest.sh).
#
# Cargo honours CARGO_TARGET_DIR (the same one as scripts/test, so the workspace build
# is shared). Prints each test binary's result, the timings, the throughput figures the
# tests printed (emulation figures: qemu TCG, not hardware), and a last line
# `N passed, M failed` counting individual tests from libtest's `test result:` lines.
# Exits non-zero unless every test passed and at least one ran.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/../common.sh
. "$here/../common.sh"
# shellcheck source=SCRIPTDIR/lib.sh
. "$here/lib.sh"

transport=verbs
tests=round_trip,full_remote_memory,posix,remote_memory_reclaim,remote_traffic:moves_4k_per_request,replication:two_replicas_survive,replication:one_replica_losing,transient_faults:stalled,transient_faults:not_rolled_back,transient_faults:its_memory_file,transient_faults:their_memory_files,fabricbench,volumes:second_fsd_is_refused_and_takeover_fences,volumes:rmemfs_volume_list_and_destroy,volumes_damage,integrity,wireguard,authentication:second_token_holder,tenants:quota
timeout_s=1200
mem=2048
smp=2
op_timeout=30
watch=300
workdir_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --transport | --tests | --timeout | --mem | --smp | --op-timeout | --watch | --workdir)
        [ $# -ge 2 ] || usage
        case "$1" in
        --transport) transport="$2" ;;
        --tests) tests="$2" ;;
        --timeout) timeout_s="$2" ;;
        --mem) mem="$2" ;;
        --smp) smp="$2" ;;
        --op-timeout) op_timeout="$2" ;;
        --watch) watch="$2" ;;
        --workdir) workdir_args=(--workdir "$2") ;;
        esac
        shift 2
        ;;
    --transport=*) transport="${1#*=}" && shift ;;
    -h | --help) usage 0 ;;
    *)
        echo "e2e: unknown argument: $1" >&2
        usage
        ;;
    esac
done
case "$transport" in
verbs | tcp | auto) ;;
*) die "--transport must be verbs, tcp or auto, not $transport" ;;
esac
for n in "$timeout_s" "$mem" "$smp" "$op_timeout" "$watch"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "not a positive number: $n"
done

cd "$softroce_repo"
target="${CARGO_TARGET_DIR:-$softroce_repo/target}"
case "$target" in
/*) ;;
*) target="$softroce_repo/$target" ;;
esac
install_softroce_packages
ensure_cargo
started=$SECONDS

# ---------------------------------------------------------------------------------
# Binaries. The test binaries' paths come from cargo's JSON messages (a fresh artifact
# is reported too, so a second run finds them without rebuilding).
# --all-targets: the features the test build uses, so nothing is built twice (and
# scripts/test's build is reused as it is).
log "cargo build --release --workspace --all-targets"
cargo build --release --workspace --all-targets
log "test binaries: cargo test --release --workspace --no-run"
artifacts="$(mktemp "${TMPDIR:-/tmp}/softroce-e2e.XXXXXX")"
out="$(mktemp "${TMPDIR:-/tmp}/softroce-e2e.XXXXXX")"
trap 'rm -f "$artifacts" "$out"' EXIT
cargo test --release --workspace --no-run --message-format=json-render-diagnostics |
    jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable != null
                  and (.target.kind | index("test")))
           | "\(.package_id)\t\(.target.name)\t\(.executable)"' >"$artifacts"
built=$SECONDS

# test_binary PACKAGE TARGET: the executable of integration test TARGET of PACKAGE.
# package_id is "path+file:///...#rmemfs-common@0.1.0" (newer cargo) or
# "rmemfs-common 0.1.0 (path+file:///...)" (older).
test_binary() {
    awk -F '\t' -v pkg="$1" -v name="$2" '
        $2 == name && ($1 ~ ("#" pkg "@") || index($1, pkg " ") == 1) { print $3; exit }
    ' "$artifacts"
}

for bin in memnode fsd fabricbench; do
    [ -x "$target/release/$bin" ] || die "$target/release/$bin is missing after the build"
done
specs=()   # NAME=PATH, in run order
missing=() # names with no binary
fabric="$(test_binary rmemfs-common fabric)"
if [ -n "$fabric" ]; then
    specs+=("fabric=$fabric")
else
    missing+=(fabric)
fi
IFS=, read -r -a wanted <<<"$tests"
for wanted_name in "${wanted[@]}"; do
    name="${wanted_name%%:*}"
    path="$(test_binary rmemfs-tests "$name")"
    [ -n "$path" ] || die "rmemfs-tests has no test binary $name (tests/tests/$name.rs)"
    # The guest passes what follows `@` to the binary as a test-name filter.
    case "$wanted_name" in
    *:*) specs+=("$wanted_name=$path@${wanted_name#*:}") ;;
    *) specs+=("$name=$path") ;;
    esac
done

# ---------------------------------------------------------------------------------
# The guest: memnode, fsd, rmemfs and fabricbench in /usr/local/bin, test binaries at their
# host paths.
adds=(--strip --add "$target/release/memnode:/usr/local/bin/" --add "$target/release/fsd:/usr/local/bin/"
    --add "$target/release/fabricbench:/usr/local/bin/" --add "$target/release/rmemfs:/usr/local/bin/")
for spec in "${specs[@]}"; do
    path="${spec#*=}"
    adds+=(--add "${path%@*}")
done
"$here/build-guest.sh" "${workdir_args[@]}" "${adds[@]}"
imaged=$SECONDS

log "booting the guest: ${specs[*]%%=*} over $transport (timeout $timeout_s s)"
guest_rc=0
"$here/run-guest.sh" "${workdir_args[@]}" --timeout "$timeout_s" --mem "$mem" --smp "$smp" -- \
    sh -c "$(cat "$here/guest-watch.sh" "$here/e2e-guest.sh")" e2e-guest "$transport" "$op_timeout" "$watch" "${specs[@]}" |
    tee "$out" || guest_rc=$?
finished=$SECONDS

# ---------------------------------------------------------------------------------
# Results, counted by the host from the console: libtest's `test result:` lines between
# each binary's E2E-BEGIN and E2E-END. A binary that never finished (crash, timeout)
# counts as one failed test, so a broken run cannot look green.
passed=0
failed=0
echo
echo "==> Soft-RoCE end-to-end results (transport $transport)"
for spec in "${specs[@]}"; do
    name="${spec%%=*}"
    read -r p f rc secs < <(awk -v name="$name" '
        { sub(/\r$/, "") }
        $0 == "E2E-BEGIN " name { inside = 1; p = 0; f = 0; oks = 0; results = 0; next }
        inside && index($0, "E2E-END " name " ") == 1 {
            split($3, a, "="); rc = a[2]; split($4, b, "="); secs = b[2]; inside = 0; done = 1; next
        }
        inside && match($0, /test result: [A-Za-z]+\. [0-9]+ passed; [0-9]+ failed/) {
            split(substr($0, RSTART, RLENGTH), w, " ")
            p += w[4]; f += w[6]; results++
        }
        # A binary killed mid-run prints no result line: its tests that passed are
        # counted from their own lines instead.
        inside && /^test .* \.\.\. ok$/ { oks++ }
        END {
            if (!done) { rc = "none"; secs = "?" }
            if (!results) p = oks
            print p + 0, f + 0, rc, secs
        }
    ' "$out")
    if [ "$rc" = none ]; then
        echo "FAIL $name: did not finish ($p passed, $f failed before the guest stopped)"
        f=$((f + 1))
    elif [ "$rc" -eq 124 ]; then
        echo "FAIL $name: hung, killed after $watch s ($p passed before; its threads' kernel stacks are above)"
        f=$((f + 1))
    elif [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $name: exited with status $rc after $p passed tests (${secs} s)"
        f=1
    elif [ "$f" -ne 0 ]; then
        echo "FAIL $name: $p passed, $f failed (${secs} s)"
    else
        echo "ok   $name: $p passed (${secs} s)"
    fi
    passed=$((passed + p))
    failed=$((failed + f))
done
for name in "${missing[@]}"; do
    if [ "$transport" = verbs ]; then
        echo "FAIL $name: rmemfs-common has no test binary '$name' (common/tests/$name.rs)"
        failed=$((failed + 1))
    else
        echo "skip $name: rmemfs-common has no test binary '$name' (common/tests/$name.rs)"
    fi
done
if [ "$guest_rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
    echo "FAIL guest run: run-guest.sh exited with status $guest_rc"
    failed=$((failed + 1))
fi

figures="$(grep -aE '^(wrote|read back) [0-9]+ MiB in ' "$out" || true)"
if [ -n "$figures" ]; then
    echo "emulation figures (qemu TCG on this host, transport $transport; not hardware figures):"
    printf '%s\n' "$figures" | sed 's/^/  /'
fi
echo "timing: cargo build $((built - started)) s, guest image $((imaged - built)) s, boot + tests + power-off $((finished - imaged)) s, total $((finished - started)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
