#!/usr/bin/env python3
"""The metadata jobs of scripts/bench: many small files created, stat'd and unlinked,
and a source-tree tarball extracted, each timed on one target directory.

    meta.py tarball --out FILE [--flat-out FILE] --info JSON --files N --bytes B
    meta.py create|stat|unlink --dir DIR --files N --per-dir K [--flat] --output JSON
    meta.py untar --dir DIR --tarball FILE --info JSON [--flat] --output JSON

create  makes DIR/rmemfs-meta/dNNN/ (N/K directories, not timed) and then, timed,
        N files of 1 to 4 KiB, K per directory one directory after the other: each
        file is open(O_CREAT|O_EXCL), one write of all its bytes, close.
stat    stat(2)s every file, in the same order, and checks its size afterwards.
unlink  unlink(2)s every file, in the same order; then (not timed) removes the
        directories.
untar   extracts FILE into DIR with GNU tar (`tar -xf FILE --no-same-owner`: the
        modes and times of the archive, the owner of the caller) and checks afterwards
        that every file is there with its size; then (not timed) removes the tree.
tarball writes a reproducible tarball shaped like a source checkout: nested
        directories, many small files (0 to 8 KiB) and a few larger ones that carry
        the rest of the bytes; the same --files, --bytes and --seed give the same
        archive byte for byte (fixed names, contents, modes, times and owner, sorted
        members). --flat-out writes the same files with no directory, every '/' of
        their paths replaced by '%', for a filesystem without directories.

--flat puts every file in DIR itself (names rmemfs-meta-dNNN-fNNNNNN) and makes no
directory: for nullfs, one flat directory. Each run writes one JSON document: the
number of operations, the timed seconds, operations per second, per-operation
latency percentiles (the time around the system calls of one file: create's open,
write and close; one stat; one unlink; untar has none, being one tar run), and the
share of all CPUs' time spent working and stolen by the hypervisor during the timed
part. Exits 1 with a message on stderr when an operation fails or a check does not
hold. Standard library only.
"""

import argparse
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import time

ROOT = "rmemfs-meta"
SRC = "rmemfs-bench-src"
MIN_SIZE = 1 << 10
MAX_SIZE = 4 << 10
# Timestamps of the tarball's members (2020-09-13 onwards, whole seconds).
EPOCH = 1_600_000_000


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tarball")
    t.add_argument("--out", required=True)
    t.add_argument("--flat-out")
    t.add_argument("--info", required=True, help="JSON: the archive's files, dirs, bytes")
    t.add_argument("--files", type=int, required=True)
    t.add_argument("--bytes", type=int, required=True)
    t.add_argument("--seed", type=int, default=1)
    for name in ("create", "stat", "unlink"):
        s = sub.add_parser(name)
        s.add_argument("--dir", required=True)
        s.add_argument("--files", type=int, required=True)
        s.add_argument("--per-dir", type=int, default=100)
        s.add_argument("--flat", action="store_true")
        s.add_argument("--seed", type=int, default=1)
        s.add_argument("--output", required=True)
    u = sub.add_parser("untar")
    u.add_argument("--dir", required=True)
    u.add_argument("--tarball", required=True)
    u.add_argument("--info", required=True)
    u.add_argument("--flat", action="store_true")
    u.add_argument("--output", required=True)
    return p.parse_args()


def fail(message):
    print(f"meta.py: {message}", file=sys.stderr)
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


def plan(files, per_dir, flat, seed):
    """[(path relative to the target dir, size)] and the directories to make, in
    order. The sizes depend on the seed alone, so every job of a run agrees."""
    rng = random.Random(seed)
    dirs = [] if flat else [ROOT] + [f"{ROOT}/d{d:03}" for d in range(-(-files // per_dir))]
    out = []
    for i in range(files):
        d = i // per_dir
        path = f"{ROOT}-d{d:03}-f{i:06}" if flat else f"{ROOT}/d{d:03}/f{i:06}"
        out.append((path, rng.randint(MIN_SIZE, MAX_SIZE)))
    return out, dirs


def remove_leftovers(files, dirs):
    """What an earlier, failed run left (not timed)."""
    for path, _ in files:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    for d in reversed(dirs):
        if os.path.isdir(d):
            shutil.rmtree(d)


def write_result(path, doc):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


def run_files(args):
    args.output = os.path.abspath(args.output)
    os.chdir(args.dir)
    files, dirs = plan(args.files, args.per_dir, args.flat, args.seed)
    payload = memoryview(random.Random(args.seed + 1).randbytes(MAX_SIZE))
    lat = []
    dir_s = 0.0
    if args.cmd == "create":
        remove_leftovers(files, dirs)
        t = time.perf_counter()
        for d in dirs:
            os.mkdir(d, 0o755)
        dir_s = time.perf_counter() - t
    elif not os.path.exists(files[0][0]):
        fail(f"{args.cmd}: no {files[0][0]} in {args.dir}: run create first")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    clock = time.perf_counter_ns
    append = lat.append
    sizes = []
    cpu0 = cpu_line()
    start = clock()
    try:
        if args.cmd == "create":
            for path, size in files:
                t = clock()
                fd = os.open(path, flags, 0o644)
                n = os.write(fd, payload[:size])
                os.close(fd)
                append(clock() - t)
                if n != size:
                    fail(f"create: short write to {path}: {n} of {size} bytes")
        elif args.cmd == "stat":
            stat = os.stat
            for path, _ in files:
                t = clock()
                st = stat(path)
                append(clock() - t)
                sizes.append(st.st_size)
        else:
            unlink = os.unlink
            for path, _ in files:
                t = clock()
                unlink(path)
                append(clock() - t)
    except OSError as e:
        fail(f"{args.cmd}: {e} (after {len(lat)} of {len(files)} files)")
    seconds = (clock() - start) / 1e9
    busy, steal = cpu_shares(cpu0, cpu_line())
    if args.cmd == "stat":
        bad = [(p, s, g) for (p, s), g in zip(files, sizes) if s != g]
        if bad:
            p, s, g = bad[0]
            fail(f"stat: {len(bad)} files with the wrong size, e.g. {p}: {g} bytes, not {s}")
    if args.cmd == "unlink":
        t = time.perf_counter()
        for d in reversed(dirs):
            os.rmdir(d)
        dir_s = time.perf_counter() - t
    write_result(args.output, {
        "kind": "metadata", "job": args.cmd, "tool": "scripts/bench-lib/meta.py (python3 "
        f"{sys.version.split()[0]})", "ops": len(lat), "seconds": seconds,
        "ops_per_s": len(lat) / seconds if seconds > 0 else None,
        "bytes": sum(s for _, s in files), "layout": "flat" if args.flat else "tree",
        "dirs": max(0, len(dirs) - 1), "files_per_dir": args.per_dir,
        "dir_ops_seconds": dir_s, "lat_us": percentiles_us(lat),
        "cpu_busy_pct": busy, "steal_pct": steal,
    })


def tree_members(files, total, seed):
    """The archive's directories and files: [(path, mode, size or None for a dir)]."""
    rng = random.Random(seed)
    dirs = [(SRC, 0)]
    for i in range(max(4, files // 12)):
        while True:
            parent, depth = dirs[rng.randrange(len(dirs))]
            if depth < 6:
                break
        name = f"dir with spaces {i}" if i % 40 == 7 else f"mod_{i}"
        dirs.append((f"{parent}/{name}", depth + 1))
    large = max(1, files // 50)
    sizes = [rng.randint(0, 8 << 10) for _ in range(files - large)]
    rest = max(0, total - sum(sizes))
    weights = [rng.random() + 0.1 for _ in range(large)]
    sizes += [int(rest * w / sum(weights)) for w in weights]
    rng.shuffle(sizes)
    exts = ("rs", "c", "h", "md", "toml", "txt", "py")
    members = [(d, 0o755, None) for d, _ in dirs]
    for n, size in enumerate(sizes):
        d = dirs[rng.randrange(len(dirs))][0]
        mode = 0o755 if n % 23 == 3 else 0o644
        members.append((f"{d}/file_{n}.{exts[n % len(exts)]}", mode, size))
    members.sort(key=lambda m: m[0])
    return members


def write_tarball(path, members, flat, seed):
    rng = random.Random(seed + 2)
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for i, (name, mode, size) in enumerate(members):
            if flat and size is None:
                continue
            info = tarfile.TarInfo(name.replace("/", "%") if flat else name)
            info.mode = mode
            info.mtime = EPOCH + i * 37
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if size is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = size
                tar.addfile(info, io.BytesIO(rng.randbytes(size)))


def run_tarball(args):
    members = tree_members(args.files, args.bytes, args.seed)
    write_tarball(args.out, members, False, args.seed)
    if args.flat_out:
        write_tarball(args.flat_out, members, True, args.seed)
    files = [m for m in members if m[2] is not None]
    write_result(args.info, {
        "files": len(files), "dirs": len(members) - len(files),
        "bytes": sum(m[2] for m in files), "tarball_bytes": os.path.getsize(args.out),
        "seed": args.seed,
    })


def tree_files(top, flat):
    """{relative path: size} of the regular files an extraction made."""
    out = {}
    if flat:
        for e in os.scandir(top):
            if e.name.startswith(SRC + "%") and e.is_file(follow_symlinks=False):
                out[e.name] = e.stat(follow_symlinks=False).st_size
        return out
    for base, _, names in os.walk(os.path.join(top, SRC)):
        for n in names:
            p = os.path.join(base, n)
            out[os.path.relpath(p, top)] = os.lstat(p).st_size
    return out


def remove_tree(top, flat):
    if flat:
        for e in os.scandir(top):
            if e.name.startswith(SRC + "%"):
                os.unlink(e.path)
    elif os.path.lexists(os.path.join(top, SRC)):
        shutil.rmtree(os.path.join(top, SRC))


def run_untar(args):
    with open(args.info, encoding="utf-8") as f:
        info = json.load(f)
    remove_tree(args.dir, args.flat)
    # tar's own pages in the page cache (the bench drops it before every run).
    subprocess.run(["tar", "--version"], stdout=subprocess.DEVNULL, check=True)
    cmd = ["tar", "-xf", os.path.abspath(args.tarball), "--no-same-owner"]
    cpu0 = cpu_line()
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=args.dir, stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - start
    busy, steal = cpu_shares(cpu0, cpu_line())
    if r.returncode != 0:
        fail(f"untar: tar exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    got = tree_files(args.dir, args.flat)
    nbytes = sum(got.values())
    if len(got) != info["files"] or nbytes != info["bytes"]:
        fail(f"untar: extracted {len(got)} files of {nbytes} bytes, the archive has "
             f"{info['files']} of {info['bytes']}")
    remove_tree(args.dir, args.flat)
    tar_version = subprocess.run(["tar", "--version"], stdout=subprocess.PIPE, text=True,
                                 check=False).stdout.splitlines()[:1]
    write_result(args.output, {
        "kind": "metadata", "job": "untar", "tool": "tar -xf TARBALL --no-same-owner"
        f" ({tar_version[0] if tar_version else 'tar'})", "ops": info["files"],
        "seconds": seconds, "ops_per_s": info["files"] / seconds if seconds > 0 else None,
        "bytes": nbytes, "mb_per_s": nbytes / seconds / 1e6 if seconds > 0 else None,
        "layout": "flat" if args.flat else "tree", "dirs": 0 if args.flat else info["dirs"],
        "lat_us": None, "cpu_busy_pct": busy, "steal_pct": steal,
    })


def main():
    args = parse_args()
    if args.cmd == "tarball":
        run_tarball(args)
    elif args.cmd == "untar":
        run_untar(args)
    else:
        if args.files < 1 or args.per_dir < 1:
            fail("--files and --per-dir must be at least 1")
        run_files(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
