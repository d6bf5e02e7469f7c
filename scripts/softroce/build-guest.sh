#!/usr/bin/env bash
# Builds the Soft-RoCE test guest from Debian packages only: a stock Debian 6.1 kernel
# (which ships rdma_rxe) and a small initramfs with busybox, iproute2 (ip, rdma),
# rdma-core's tools and rxe provider, perftest, fusermount3, wg, and the kernel modules
# for Soft-RoCE, FUSE, WireGuard and veth. run-guest.sh boots it with qemu.
#
# Usage: build-guest.sh [--workdir DIR] [--kernel-package NAME] [--strip]
#                       [--add HOST[:GUEST]]...
#
#   --add HOST[:GUEST]   put HOST (a file or a directory) into the image at GUEST, with
#                        the shared libraries it needs (ldd). GUEST defaults to HOST's
#                        own absolute path (so paths baked into test binaries, such as
#                        CARGO_BIN_EXE_*, still hold); a GUEST ending in / is a directory
#                        to put it in, e.g. --add target/release/fsd:/usr/local/bin/.
#                        HOST is split from GUEST at its first colon.
#   --workdir DIR        where the kernel, the initramfs and the caches go; default
#                        $SOFTROCE_DIR, else ${CARGO_TARGET_DIR:-target}/softroce.
#   --strip              strip debug info from the ELF files that --add puts in (the
#                        host's files are untouched): release builds with debug = 1
#                        are mostly DWARF, and a smaller image boots faster.
#   --kernel-package N   e.g. linux-image-6.1.0-56-amd64; default: the newest
#                        linux-image-6.1.0-*-amd64 that apt knows (or $SOFTROCE_KERNEL_PKG).
#
# Outputs in the work dir: vmlinuz, initrd.cpio.gz, kernel-version. The kernel .deb
# and its unpacked tree are cached there, so a rebuild takes 2-3 s.
# Installs the Debian packages it needs on the host (apt-get) when they are missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/../common.sh
. "$here/../common.sh"
# shellcheck source=SCRIPTDIR/lib.sh
. "$here/lib.sh"

work=
kernel_pkg="${SOFTROCE_KERNEL_PKG:-}"
adds=()
strip_adds=
while [ $# -gt 0 ]; do
    case "$1" in
    --add)
        [ $# -ge 2 ] || usage
        adds+=("$2")
        shift 2
        ;;
    --add=*)
        adds+=("${1#--add=}")
        shift
        ;;
    --strip)
        strip_adds=1
        shift
        ;;
    --workdir)
        [ $# -ge 2 ] || usage
        work="$2"
        shift 2
        ;;
    --kernel-package)
        [ $# -ge 2 ] || usage
        kernel_pkg="$2"
        shift 2
        ;;
    -h | --help) usage 0 ;;
    *)
        echo "build-guest: unknown argument: $1" >&2
        usage
        ;;
    esac
done
work="${work:-$(softroce_default_workdir)}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
started=$SECONDS

# ---------------------------------------------------------------------------------
# Host packages. rdma-core (the daemon package) is not needed: the userland the guest
# runs is libibverbs1/librdmacm1 (pulled in by the utils), the providers, and
# iproute2's `rdma`.
install_softroce_packages
# perftest is optional (the smoke test skips the bandwidth checks without it).
if ! command -v ib_write_bw >/dev/null; then
    if ! apt-cache show perftest >/dev/null 2>&1; then
        as_root apt-get update -q # maybe the lists are just missing
    fi
    if apt-cache show perftest >/dev/null 2>&1; then
        apt_install perftest
    else
        log "perftest is not in the package lists: building the guest without ib_*_bw"
    fi
fi

# ---------------------------------------------------------------------------------
# Kernel: the newest Debian 6.1 kernel package, downloaded (not installed) and unpacked.
newest_kernel_pkg() {
    apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' |
        awk '{print $1}' | sort -V | tail -n 1
}
if [ -z "$kernel_pkg" ]; then
    kernel_pkg="$(newest_kernel_pkg)"
    if [ -z "$kernel_pkg" ]; then
        # Fresh machine: apt has no package lists yet.
        log "apt knows no linux-image-6.1.0-*-amd64: running apt-get update"
        as_root apt-get update -q
        kernel_pkg="$(newest_kernel_pkg)"
    fi
    [ -n "$kernel_pkg" ] || die "no linux-image-6.1.0-*-amd64 package in the apt lists"
fi
kver="${kernel_pkg#linux-image-}"
kdir="$work/kernel/$kver"
mkdir -p "$work/debs" "$work/kernel"

if [ ! -e "$kdir/.unpacked" ]; then
    deb="$(find "$work/debs" -maxdepth 1 -name "${kernel_pkg}_*.deb" | sort -V | tail -n 1)"
    if [ -z "$deb" ]; then
        log "downloading $kernel_pkg (about 70 MB, once)"
        # apt-get download writes into the current directory. The sandbox option keeps
        # apt from complaining that its _apt user cannot write there.
        if ! (cd "$work/debs" && apt-get download -q -o APT::Sandbox::User=root "$kernel_pkg"); then
            # Stale lists can name a version the mirror has already replaced.
            log "download failed: refreshing apt lists and trying again"
            as_root apt-get update -q
            (cd "$work/debs" && apt-get download -q -o APT::Sandbox::User=root "$kernel_pkg")
        fi
        deb="$(find "$work/debs" -maxdepth 1 -name "${kernel_pkg}_*.deb" | sort -V | tail -n 1)"
        [ -n "$deb" ] || die "apt-get download $kernel_pkg left no .deb in $work/debs"
    fi
    log "unpacking $(basename "$deb")"
    rm -rf "$kdir.tmp"
    dpkg-deb -x "$deb" "$kdir.tmp"
    [ -d "$kdir.tmp/lib/modules/$kver" ] || die "$deb has no lib/modules/$kver"
    [ -f "$kdir.tmp/boot/vmlinuz-$kver" ] || die "$deb has no boot/vmlinuz-$kver"
    depmod -b "$kdir.tmp" "$kver"
    touch "$kdir.tmp/.unpacked"
    rm -rf "$kdir"
    mv "$kdir.tmp" "$kdir"
    # Only one kernel is ever used: drop the trees and .debs of older ones.
    find "$work/kernel" -mindepth 1 -maxdepth 1 ! -name "$kver" -exec rm -rf {} +
    find "$work/debs" -maxdepth 1 -name 'linux-image-*.deb' ! -name "${kernel_pkg}_*" -delete
fi

# ---------------------------------------------------------------------------------
# Module load order. crc32_generic is not a declared dependency of rdma_rxe, but rxe
# computes its ICRC with the "crc32" crypto algorithm and without it `rdma link add`
# fails with ENOENT. dummy provides dummy0, the netdev rxe0 sits on (no NIC needed).
# ib_uverbs and rdma_ucm give userspace /dev/infiniband/{uverbs0,rdma_cm}; rdma_ucm
# pulls in rdma_cm, ib_cm, iw_cm and configfs. fuse gives /dev/fuse.
wanted_modules=(dummy crc32_generic rdma_rxe ib_uverbs rdma_ucm fuse)
# Modules for tests rather than for Soft-RoCE: wireguard and veth (tests/tests/wireguard.rs
# joins two network namespaces with a veth pair and a WireGuard tunnel over it; its
# dependencies are udp_tunnel, which rdma_rxe loads anyway, and the curve25519, chacha
# and poly1305 libraries). guest-init.sh loads them after the others and only warns
# when one fails, so a test's module cannot stop the Soft-RoCE tests; the test that
# needs it fails saying what is missing.
test_modules=(wireguard veth)
module_order=()
test_module_order=()
declare -A seen_module=()
# add_module NAME ARRAY: appends NAME's module files, dependencies first, that no
# earlier module brought in, to the array named ARRAY.
add_module() {
    local m="$1" deps kind path _
    local -n order="$2"
    deps="$(modprobe -d "$kdir" -S "$kver" --show-depends "$m")" ||
        die "modprobe --show-depends $m failed against $kdir"
    while read -r kind path _; do
        case "$kind" in
        insmod)
            if [ -z "${seen_module[$path]:-}" ]; then
                seen_module[$path]=1
                order+=("$path")
            fi
            ;;
        builtin) ;; # built into the kernel: nothing to load
        *) die "unexpected modprobe --show-depends line for $m: $kind $path" ;;
        esac
    done <<<"$deps"
}
for m in "${wanted_modules[@]}"; do
    add_module "$m" module_order
done
for m in "${test_modules[@]}"; do
    add_module "$m" test_module_order
done

# ---------------------------------------------------------------------------------
# The initramfs tree, rebuilt from scratch every time (about a second) so nothing stale
# survives. Merged /usr like the host, so the paths ldd prints are valid as they are.
root="$work/root"
rm -rf "$root"
mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib,usr/lib64,usr/local/bin,etc/softroce}
mkdir -p "$root"/{dev,proc,sys,tmp,run,root,mnt}
ln -s usr/bin "$root/bin"
ln -s usr/sbin "$root/sbin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"

# Copies one host file to a guest path, replacing whatever is there. rm first: the path
# may be a busybox applet link, and cp would write through it into busybox.
put_file() {
    local src="$1" dst="$2"
    mkdir -p "$(dirname "$root$dst")"
    rm -f "$root$dst"
    cp -L "$src" "$root$dst"
}

# Copies the shared libraries a binary needs (ldd lists the whole closure, including
# the dynamic loader). Libraries keep their host paths; the guest layout matches.
declare -A seen_lib=()
put_closure() {
    local bin="$1" out line lib
    # ldd says "not a dynamic executable" (and fails) for static binaries and scripts.
    if ! out="$(LC_ALL=C ldd "$bin" 2>&1)"; then
        case "$out" in
        *"not a dynamic executable"* | *"statically linked"*) return 0 ;;
        *) die "ldd $bin failed: $out" ;;
        esac
    fi
    while read -r line; do
        case "$line" in
        *"=> not found"*) die "$bin needs ${line%% *}, which this host does not have" ;;
        *"=> /"*)
            lib="${line#*=> }"
            lib="${lib%% (*}"
            ;;
        /*) lib="${line%% (*}" ;;
        *) continue ;; # linux-vdso.so.1, "statically linked"
        esac
        if [ -z "${seen_lib[$lib]:-}" ]; then
            seen_lib[$lib]=1
            put_file "$lib" "$lib"
        fi
    done <<<"$out"
}

# A host file into the guest at the same path, with its closure.
put_binary() {
    local path
    path="$(command -v "$1")" || die "$1 is not installed on the host"
    put_file "$path" "$path"
    put_closure "$path"
}

# busybox first, so the real tools copied after it replace its applets of the same name
# (ip, modprobe, ...).
busybox="$(command -v busybox)"
put_file "$busybox" /usr/bin/busybox
while read -r applet; do
    [ -n "$applet" ] || continue
    case "$applet" in
    linuxrc | init | sbin/init) continue ;; # our /init is the only init
    esac
    if [ ! -e "$root/$applet" ] && [ ! -L "$root/$applet" ]; then
        # Applets live in bin, sbin, usr/bin and usr/sbin, which all exist already.
        ln -s /usr/bin/busybox "$root/$applet"
    fi
done < <("$busybox" --list-full)

# wg (wireguard-tools) makes the keys of tests/tests/wireguard.rs and sets up its tunnel.
tools=(ip rdma fusermount3 ibv_devinfo ibv_devices ibv_rc_pingpong rping wg)
if command -v ib_write_bw >/dev/null; then
    tools+=(ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_read_lat)
fi
# fio, for the tests that run a verify job across a fault (CI installs it).
if command -v fio >/dev/null; then
    tools+=(fio)
fi
for t in "${tools[@]}"; do
    put_binary "$t"
done

# The rxe provider: libibverbs dlopens it after reading /etc/libibverbs.d/rxe.driver,
# so ldd of the tools never lists it. Only rxe's .driver file goes in, so libibverbs
# does not try (and warn about) the other providers.
# The filters read all their input (no `head`, no awk `exit`): a reader that stops
# early makes the writer die of SIGPIPE, which pipefail turns into a failure.
provider="$(dpkg -L ibverbs-providers | awk '/\/librxe-rdmav[0-9]*\.so$/ && !n++')"
if [ -z "$provider" ] || [ ! -f "$provider" ]; then
    die "ibverbs-providers has no librxe-rdmav*.so"
fi
put_file "$provider" "$provider"
put_closure "$provider"
put_file /etc/libibverbs.d/rxe.driver /etc/libibverbs.d/rxe.driver

# glibc dlopens libgcc_s.so.1 when a thread exits (pthread_exit/cancel unwinding);
# ldd does not list it, and without it threaded programs abort at exit.
libgcc="$(ldconfig -p | awk '/libgcc_s\.so\.1 .*x86-64/ && !n++ {print $NF}')"
[ -n "$libgcc" ] || die "libgcc_s.so.1 not found on the host (package libgcc-s1)"
put_file "$libgcc" "$libgcc"

# Kernel modules, decompressed on the host: the initramfs is gzipped anyway, and
# busybox insmod then needs no decompression support. One list for Soft-RoCE's
# modules and one for the tests' (guest-init.sh treats their failures differently).
# put_modules LIST PATH...: the modules into the image, their guest paths into LIST.
put_modules() {
    local list="$1" path name dst
    shift
    : >"$root/etc/softroce/$list"
    for path in "$@"; do
        name="$(basename "$path")"
        dst="/lib/modules/$kver/${name%.ko*}.ko"
        mkdir -p "$root/lib/modules/$kver"
        case "$name" in
        *.ko) cp "$path" "$root$dst" ;;
        *.ko.xz) xz -dc "$path" >"$root$dst" ;;
        *.ko.zst) zstd -qdc "$path" >"$root$dst" ;;
        *.ko.gz) gzip -dc "$path" >"$root$dst" ;;
        *) die "unknown module file type: $path" ;;
        esac
        echo "$dst" >>"$root/etc/softroce/$list"
    done
}
put_modules modules "${module_order[@]}"
put_modules test-modules "${test_module_order[@]}"

# Minimal /etc: enough for getpwuid, localhost, and fusermount3's mount table.
cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$root/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
printf '127.0.0.1 localhost\n%s softroce\n::1 localhost\n' "$SOFTROCE_GUEST_IP" >"$root/etc/hosts"
printf 'passwd: files\ngroup: files\nhosts: files\n' >"$root/etc/nsswitch.conf"
ln -s /proc/self/mounts "$root/etc/mtab"
# Lets non-root users in tests use allow_other, as on a configured host.
echo user_allow_other >"$root/etc/fuse.conf"

cp "$here/guest-init.sh" "$root/init"
chmod 0755 "$root/init"

# strip_in_image GUEST_PATH: strips debug info from the image's copy if it is ELF.
strip_in_image() {
    local f="$root$1" magic
    [ -n "$strip_adds" ] && [ -f "$f" ] || return 0
    magic="$(head -c 4 "$f" | od -An -c | tr -d ' ')"
    if [ "$magic" = '177ELF' ]; then
        strip --strip-debug "$f"
    fi
}

# Extra files from --add, each with its library closure.
for spec in "${adds[@]}"; do
    src="${spec%%:*}"
    if [ "$src" = "$spec" ]; then dst=""; else dst="${spec#*:}"; fi
    [ -e "$src" ] || die "--add $spec: $src does not exist"
    src="$(realpath "$src")"
    [ -n "$dst" ] || dst="$src"
    case "$dst" in
    /*) ;;
    *) die "--add $spec: the guest path must be absolute" ;;
    esac
    case "$dst" in
    */) dst="$dst$(basename "$src")" ;;
    esac
    if [ -d "$src" ]; then
        mkdir -p "$(dirname "$root$dst")"
        rm -rf "${root:?}$dst"
        cp -rL "$src" "$root$dst"
        while IFS= read -r -d '' f; do
            put_closure "$f"
            strip_in_image "$dst${f#"$src"}"
        done < <(find "$src" -type f -perm -u+x -print0)
    else
        put_file "$src" "$dst"
        if [ -x "$src" ]; then
            put_closure "$src"
            strip_in_image "$dst"
        fi
    fi
    echo "build-guest: added $src as $dst" >&2
done

# ---------------------------------------------------------------------------------
# Pack. Sorted and owned by root so the image does not depend on the host's users;
# written to a temporary name first so a failed build never leaves half an image.
(cd "$root" && find . -mindepth 1 | LC_ALL=C sort |
    cpio -o -H newc -R 0:0 --quiet) | gzip -6 >"$work/initrd.cpio.gz.tmp"
mv "$work/initrd.cpio.gz.tmp" "$work/initrd.cpio.gz"
ln -sfn "kernel/$kver/boot/vmlinuz-$kver" "$work/vmlinuz"
echo "$kver" >"$work/kernel-version"

size="$(du -k "$work/initrd.cpio.gz" | cut -f1)"
log "guest ready in $((SECONDS - started)) s: kernel $kver ($kernel_pkg), initramfs ${size} KiB gzipped, ${#module_order[@]} modules (+ ${#test_module_order[@]} for tests)"
printf '  %s\n' "$work/vmlinuz" "$work/initrd.cpio.gz" >&2
