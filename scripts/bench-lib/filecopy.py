#!/usr/bin/env python3
"""The copy jobs of scripts/bench: one large file copied on one target directory,
with copy_file_range(2) or through read(2) and write(2), timed.

    filecopy.py range|rw --dir DIR --bytes N --output JSON [--seed S] [--drop-caches]

range  copies with os.copy_file_range, asking each call for the rest of the file, as
       newer GNU cp does (the kernel and the filesystem copy less per call; the loop
       asks again): the filesystem may copy without the bytes passing through the
       caller (rmemfs: the memnodes copy whole blocks in their own memory).
rw     copies with os.read and os.write of 1 MiB, as Debian 12's cp (coreutils 9.1,
       which never calls copy_file_range) does: every byte goes through the kernel
       and the filesystem twice.

Both copy DIR/rmemfs-copy-src.dat to DIR/rmemfs-copy-dst.dat. Not timed first: the
destination of an earlier run is removed, and the source is laid out (N random
bytes from --seed, 1 MiB writes, fsync) unless an earlier run left it there with N
bytes, as the next copy job on the same target does; then, with --drop-caches, sync
and `echo 3 > /proc/sys/vm/drop_caches`. Timed: the copy loop and one fsync of the
destination (the two files are open before and closed after). Then, not timed: the
destination must have N bytes and, read back after dropping the page cache again
(with --drop-caches), the same sha256 as the source read back; the destination is
removed, the source kept for the next copy job.

Each run writes one JSON document, with the fields of meta.py's: the system calls of
the copy (`ops`: copy_file_range calls, or read and write pairs), the timed seconds,
bytes and MB/s, per-call latency percentiles, and the share of all CPUs' time spent
working and stolen by the hypervisor during the timed part; and how the source came
to be and what the check found. Exits 1 with a message on stderr when a system call
fails or the check does not hold. Standard library only.
"""

import argparse
import hashlib
import json
import os
import random
import sys
import time

SRC = "rmemfs-copy-src.dat"
DST = "rmemfs-copy-dst.dat"
# read(2)/write(2) size of the rw job, the random source's write size and the
# check's read size.
STEP = 1 << 20
METHODS = {
    "range": "os.copy_file_range, the rest of the file per call",
    "rw": "os.read and os.write of 1 MiB",
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in METHODS:
        s = sub.add_parser(name)
        s.add_argument("--dir", required=True)
        s.add_argument("--bytes", type=int, required=True, help="the file's size")
        s.add_argument("--seed", type=int, default=1, help="of the source's bytes")
        s.add_argument("--drop-caches", action="store_true",
                       help="drop the page cache before the copy and before the check")
        s.add_argument("--output", required=True)
    return p.parse_args()


def fail(message):
    print(f"filecopy.py: {message}", file=sys.stderr)
    sys.exit(1)


def cpu_line():
    with open("/proc/stat", encoding="ascii") as f:
        return [int(v) for v in f.readline().split()[1:9]]


def cpu_shares(before, after):
    """(busy %, steal %) of all CPUs' time between two cpu lines of /proc/stat, as
    scripts/bench counts them: busy is user, nice, system, irq and softirq."""
    d = [b - a for a, b in zip(before, after)]
    total = sum(d)
    if total <= 0:
        return None, None
    busy = d[0] + d[1] + d[2] + d[5] + d[6]
    return round(100.0 * busy / total, 1), round(100.0 * d[7] / total, 1)


def percentiles_us(lat_ns):
    if not lat_ns:
        return None
    s = sorted(lat_ns)

    def rank(p):
        # Nearest rank: the smallest sample with at least p% of them at or below it.
        i = max(0, min(len(s) - 1, -(-len(s) * p // 100) - 1))
        return s[int(i)] / 1000.0

    return {"mean": sum(s) / len(s) / 1000.0, "p50": rank(50), "p99": rank(99),
            "p99.9": rank(99.9), "max": s[-1] / 1000.0}


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as f:
        f.write("3\n")


def remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_all(fd, view):
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])


def lay_out_source(nbytes, seed):
    """Writes the source (to a temporary name, renamed once whole and synced, so a
    run cut short never leaves a source that looks complete); returns its seconds."""
    tmp = SRC + ".tmp"
    remove(tmp)
    rng = random.Random(seed)
    start = time.perf_counter()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        left = nbytes
        while left:
            n = min(STEP, left)
            write_all(fd, memoryview(rng.randbytes(n)))
            left -= n
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, SRC)
    return time.perf_counter() - start


def copy_range(src, dst, nbytes, lat):
    left = nbytes
    clock = time.perf_counter_ns
    while left:
        t = clock()
        n = os.copy_file_range(src, dst, left)
        lat.append(clock() - t)
        if n == 0:
            fail(f"copy_file_range returned 0 with {left} of {nbytes} bytes left")
        left -= n


def copy_rw(src, dst, nbytes, lat):
    buf = bytearray(STEP)
    view = memoryview(buf)
    left = nbytes
    clock = time.perf_counter_ns
    while left:
        t = clock()
        n = os.readv(src, [buf])
        if n == 0:
            fail(f"read returned 0 with {left} of {nbytes} bytes left")
        write_all(dst, view[:n])
        lat.append(clock() - t)
        left -= n


def sha256_of(path):
    h = hashlib.sha256()
    buf = bytearray(STEP)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(memoryview(buf)[:n])
    return h.hexdigest()


def first_difference(a, b):
    """The offset of the first MiB where files a and b differ, or None."""
    with open(a, "rb", buffering=0) as fa, open(b, "rb", buffering=0) as fb:
        off = 0
        while True:
            x, y = fa.read(STEP), fb.read(STEP)
            if x != y:
                return off
            if not x:
                return None
            off += len(x)


def main():
    args = parse_args()
    if args.bytes < 1:
        fail("--bytes must be at least 1")
    args.output = os.path.abspath(args.output)
    os.chdir(args.dir)
    remove(DST)
    laid_out, layout_s = False, None
    try:
        st = os.stat(SRC)
        reuse = st.st_size == args.bytes
    except FileNotFoundError:
        reuse = False
    if not reuse:
        remove(SRC)
        try:
            layout_s = lay_out_source(args.bytes, args.seed)
        except OSError as e:
            fail(f"laying out {SRC} in {args.dir}: {e}")
        laid_out = True
    if args.drop_caches:
        drop_caches()

    lat = []
    src = os.open(SRC, os.O_RDONLY | os.O_CLOEXEC)
    dst = os.open(DST, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    run = copy_range if args.cmd == "range" else copy_rw
    cpu0 = cpu_line()
    start = time.perf_counter()
    try:
        run(src, dst, args.bytes, lat)
        copied = time.perf_counter()
        os.fsync(dst)
    except OSError as e:
        fail(f"{args.cmd}: {e} (after {len(lat)} calls)")
    end = time.perf_counter()
    busy, steal = cpu_shares(cpu0, cpu_line())
    seconds = end - start
    size = os.fstat(dst).st_size
    os.close(src)
    os.close(dst)
    if size != args.bytes:
        fail(f"{args.cmd}: the copy has {size} bytes, the source {args.bytes}")

    t = time.perf_counter()
    if args.drop_caches:
        drop_caches()
    want, got = sha256_of(SRC), sha256_of(DST)
    if want != got:
        off = first_difference(SRC, DST)
        fail(f"{args.cmd}: the copy differs from the source (sha256 {got}, source {want}; "
             f"first in the MiB at offset {off})")
    verify_s = time.perf_counter() - t
    remove(DST)

    with open(args.output, "w", encoding="utf-8") as f:
        json.dump({
            "kind": "copy", "job": f"copy-{args.cmd}",
            "tool": f"scripts/bench-lib/filecopy.py (python3 {sys.version.split()[0]}): "
            f"{METHODS[args.cmd]}, then fsync",
            "ops": len(lat), "seconds": seconds,
            "ops_per_s": len(lat) / seconds if seconds > 0 else None,
            "bytes": args.bytes, "mb_per_s": args.bytes / seconds / 1e6 if seconds > 0 else None,
            "copy_seconds": copied - start, "fsync_seconds": end - copied,
            "lat_us": percentiles_us(lat),
            "source_laid_out": laid_out, "layout_seconds": layout_s, "seed": args.seed,
            "verified": True, "sha256": want, "verify_seconds": verify_s,
            "drop_caches": args.drop_caches,
            "cpu_busy_pct": busy, "steal_pct": steal,
        }, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except OSError as e:
        fail(str(e))
