#!/bin/sh
# shellcheck shell=dash
# /init of the Soft-RoCE guest (run by busybox sh as PID 1; build-guest.sh installs it).
#
# Loads the kernel modules in the order build-guest.sh computed (Soft-RoCE's, then the
# tests' own), brings up Soft-RoCE (rxe0 on dummy0), waits until rxe0 has its
# IPv4-mapped GID, runs the command that run-guest.sh put in /etc/softroce/cmd, prints
# `SOFTROCE-RESULT rc=N` and powers off.
# If the setup itself fails it prints `SOFTROCE-SETUP-FAILED: why` instead, so the host
# can tell a broken harness from a failing test.

# SeaBIOS leaves the console mid-line ("Booting from ROM.."): start on a fresh one.
echo
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root

# What tests inside the guest should use instead of hard-coding (see README.md).
export SOFTROCE_DEV=rxe0
export SOFTROCE_NETDEV=dummy0
export SOFTROCE_IP=10.0.2.15
# The GID rxe derives from SOFTROCE_IP (::ffff:10.0.2.15), as sysfs spells it.
want_gid=0000:0000:0000:0000:0000:ffff:0a00:020f

uptime_s() {
    local up
    read -r up _ </proc/uptime
    echo "$up"
}

power_off() {
    sync
    # -f: no init to signal, just the reboot syscall. The kernel powers the machine off
    # through ACPI, which makes qemu exit. If that ever fails, reboot: run-guest.sh
    # passes -no-reboot, so a reset ends qemu too.
    poweroff -f
    sleep 5
    reboot -f
}

setup_failed() {
    echo "softroce-init: $*"
    echo "softroce-init: last kernel messages:"
    dmesg | tail -n 20
    echo "SOFTROCE-SETUP-FAILED: $*"
    power_off
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
# devtmpfs creates /dev/fuse, /dev/infiniband/uverbs0 and /dev/infiniband/rdma_cm by
# itself as the modules register them, so no mdev/udev is needed.
mount -t devtmpfs devtmpfs /dev || setup_failed "cannot mount devtmpfs on /dev"
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# /tmp and /run stay on the initramfs's own root (already in RAM and writable): a tmpfs
# mounted over them would hide files that build-guest.sh --add put there.
chmod 1777 /tmp
hostname softroce
# Root may lock any amount of memory anyway (CAP_IPC_LOCK); this keeps programs that
# check the limit before registering memory happy.
ulimit -l unlimited 2>/dev/null || true

# One module per line, dependencies first (build-guest.sh ran modprobe --show-depends).
while read -r mod; do
    insmod "$mod" || setup_failed "insmod $mod failed"
done </etc/softroce/modules
# The tests' own modules (WireGuard, veth): one that fails to load is said, not fatal,
# so it cannot stop the Soft-RoCE tests; the test that needs it fails naming it.
if [ -r /etc/softroce/test-modules ]; then
    while read -r mod; do
        insmod "$mod" || echo "softroce-init: insmod $mod failed: the tests that need it will fail"
    done </etc/softroce/test-modules
fi

# devtmpfs should have made it; mknod is the fallback (misc device 10:229). devtmpfs
# makes it 0600; udev would make it 0666, which non-root FUSE mounts need.
[ -c /dev/fuse ] || mknod /dev/fuse c 10 229 || setup_failed "no /dev/fuse"
chmod 0666 /dev/fuse

# dummy.ko created dummy0 when it loaded; creating it again would fail with EEXIST.
ip link set lo up || setup_failed "ip link set lo up failed"
ip link set "$SOFTROCE_NETDEV" up || setup_failed "no $SOFTROCE_NETDEV (dummy.ko not loaded?)"
ip addr add "$SOFTROCE_IP/24" dev "$SOFTROCE_NETDEV" || setup_failed "ip addr add failed"
rdma link add "$SOFTROCE_DEV" type rxe netdev "$SOFTROCE_NETDEV" ||
    setup_failed "rdma link add $SOFTROCE_DEV failed (crc32_generic missing from the modules?)"

# The IPv4-mapped GID shows up shortly after the device; tests that pick a GID index
# before it exists fail in confusing ways, so wait for it (and for the port to be
# ACTIVE), at most 10 s. The GID table is long; the entry is in the first few slots.
port=/sys/class/infiniband/$SOFTROCE_DEV/ports/1
tries=0
gid_index=
while :; do
    state=
    [ -r "$port/state" ] && read -r state <"$port/state"
    case "$state" in
    *ACTIVE*)
        for i in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
            gid=
            read -r gid <"$port/gids/$i" 2>/dev/null || continue
            if [ "$gid" = "$want_gid" ]; then
                gid_index=$i
                break
            fi
        done
        ;;
    esac
    [ -n "$gid_index" ] && break
    tries=$((tries + 1))
    if [ "$tries" -ge 100 ]; then
        setup_failed "waited 10 s for $SOFTROCE_DEV port 1 to be ACTIVE with GID ::ffff:$SOFTROCE_IP (state: '${state:-none}')"
    fi
    sleep 0.1
done
export SOFTROCE_GID_INDEX="$gid_index"
echo "softroce-init: $SOFTROCE_DEV ready on $SOFTROCE_NETDEV, GID index $gid_index = ::ffff:$SOFTROCE_IP, guest uptime $(uptime_s) s"

# /etc/softroce/cmd is `set -- 'arg' 'arg' ...`, every argument single-quoted by
# run-guest.sh, so spaces and quotes in the command survive unchanged.
[ -r /etc/softroce/cmd ] || setup_failed "no /etc/softroce/cmd (boot the guest with run-guest.sh)"
# shellcheck disable=SC1091
. /etc/softroce/cmd
cd /root || setup_failed "no /root"
if [ -e /etc/softroce/interactive ]; then
    # A controlling terminal on the console, so ^C and job control work in a shell.
    setsid cttyhack "$@"
else
    "$@" </dev/null
fi
rc=$?
echo "softroce-init: command finished, guest uptime $(uptime_s) s"
echo "SOFTROCE-RESULT rc=$rc"
power_off
