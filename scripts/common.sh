# shellcheck shell=bash
# Shared by scripts/run and scripts/test (sourced, not run): installs what rmemfs needs
# on a Debian 12 machine and makes cargo reachable.

log() { printf '\n==> %s\n' "$*" >&2; }

# Root runs apt-get directly; anyone else goes through sudo.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# apt_install PKG...: installs the packages that are not installed yet (apt-get update
# first, once, and only when something is missing).
apt_install() {
    local missing=() pkg
    for pkg in "$@"; do
        if [ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)" != 'install ok installed' ]; then
            missing+=("$pkg")
        fi
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        return 0
    fi
    if ! command -v apt-get >/dev/null; then
        log "missing packages ${missing[*]} and no apt-get to install them: install them by hand"
        return 1
    fi
    log "installing ${missing[*]}"
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# System packages: fuse3 (fusermount3, /etc/fuse.conf), a C toolchain for crates that
# build C, curl and CA certificates for rustup, and what rdma-sys (the verbs backend,
# built by default) needs: pkg-config, the libibverbs and librdmacm headers, and
# libclang for its bindings; git and sqlite3 for the real-program tests; stress-ng
# for its filesystem stressors (tests/tests/stress_ng.rs); fio for the
# replication tests (crc32c-verified writes through memnode losses); systemd for
# systemd-analyze (the mount helper tests verify the installed unit files) and
# procps for ps (they check that a token stays out of it).
install_system_packages() {
    apt_install fuse3 pkg-config build-essential ca-certificates curl \
        libibverbs-dev librdmacm-dev libclang-dev clang \
        git sqlite3 stress-ng tar fio acl systemd procps
}

# What the Soft-RoCE VM stage (scripts/softroce) needs on the host: qemu, the guest's
# userland taken from Debian packages (busybox, rdma-core's tools and rxe provider,
# iproute2's ip and rdma, fusermount3), the tools that build the initramfs (cpio, kmod
# for depmod and modprobe --show-depends, xz/zstd for compressed modules, binutils for
# strip) and jq for cargo's JSON messages; wireguard-tools for the guest's `wg` (the
# WireGuard test, tests/tests/wireguard.rs; the host's kernel needs no WireGuard).
# perftest is optional (build-guest.sh).
install_softroce_packages() {
    apt_install qemu-system-x86 busybox-static ibverbs-utils rdmacm-utils ibverbs-providers \
        iproute2 cpio kmod xz-utils zstd fuse3 binutils jq wireguard-tools
}

# Puts cargo on PATH, installing a Rust toolchain with rustup if there is none (Debian
# 12's own rustc is older than the workspace's rust-version).
ensure_cargo() {
    if ! command -v cargo >/dev/null && [ -f "$HOME/.cargo/env" ]; then
        # shellcheck disable=SC1091
        . "$HOME/.cargo/env"
    fi
    if ! command -v cargo >/dev/null; then
        log "no cargo: installing a Rust toolchain with rustup"
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
            sh -s -- -y --profile minimal --component clippy,rustfmt
        # shellcheck disable=SC1091
        . "$HOME/.cargo/env"
    fi
    if command -v rustup >/dev/null &&
        ! { cargo fmt --version && cargo clippy --version; } >/dev/null 2>&1; then
        rustup component add rustfmt clippy
    fi
    cargo --version >&2
}

# FUSE needs its device; say so plainly instead of failing later inside a test.
ensure_dev_fuse() {
    if [ ! -e /dev/fuse ]; then
        as_root modprobe fuse 2>/dev/null || true
    fi
    if [ ! -e /dev/fuse ]; then
        log "/dev/fuse does not exist: load the fuse module, or run the container with --device /dev/fuse --cap-add SYS_ADMIN"
        return 1
    fi
}

# enable_fuse_uring: turns FUSE over io_uring on (Linux 6.14+, CONFIG_FUSE_IO_URING)
# when running as root, and says what it did; fsd then serves its mounts through the
# ring (`fsd --fuse-transport auto`, the default) and otherwise falls back to
# /dev/fuse, saying why. Returns non-zero only when the kernel lacks the parameter
# or it could not be set.
enable_fuse_uring() {
    local param=/sys/module/fuse/parameters/enable_uring
    if [ ! -e "$param" ]; then
        log "this kernel has no FUSE over io_uring ($param is missing): fsd serves /dev/fuse"
        return 1
    fi
    if [ "$(cat "$param")" = Y ]; then
        log "FUSE over io_uring is on ($param is Y)"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ]; then
        log "FUSE over io_uring is off and only root turns it on (echo Y > $param): fsd serves /dev/fuse"
        return 1
    fi
    if echo Y >"$param" 2>/dev/null; then
        log "turned FUSE over io_uring on (echo Y > $param): fsd serves mounts through the ring"
    else
        log "could not turn FUSE over io_uring on ($param): fsd serves /dev/fuse"
        return 1
    fi
}
