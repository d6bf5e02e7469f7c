#!/usr/bin/env python3
"""Turns the fio outputs of one scripts/bench run into its table, JSON and chart.

scripts/bench runs every (job, target) pair, once per round (--repeat), and lists
the runs in a manifest, one tab-separated line each:

    job  target  status  fio-json-path  fsd-peak-rss-kib  fsd-rss-kib  memnode-rss-kib
    fsd-stats-before  fsd-stats-after  round  steal-pct  busy-pct  wall-s
    daemon-ticks  memnode-ticks

(status "ok" or a short failure text; the memory and stats columns are "-" except for
the fsd targets (rmemfs, rmemfs-classic, rmemfs-mapped, rmemfs-vol); steal-pct is the share of CPU
time the hypervisor took during that run and busy-pct the share that went to work on
this machine, all CPUs together; wall-s the run's length in seconds; daemon-ticks
and memnode-ticks "USER,SYS", the clock ticks of CPU time the target's daemon (fsd,
nullfs) and the memnode it uses (also the fabric's) spent during the run, "-" where
there is none; manifests of before those three columns are read too). The
fabric target's outputs are fabricbench's, in the part of fio's JSON read here.
The metadata jobs (create, stat, unlink, untar) write scripts/bench-lib/meta.py's
JSON instead (its "kind" is "metadata"): files (or stats) per second, timed seconds,
per-file latency percentiles. The rmemfs-vol target (fsd on a durable volume) runs
only those. The copy jobs (copy-range: a copy_file_range(2) loop; copy-rw: 1 MiB
read(2)/write(2)) write scripts/bench-lib/filecopy.py's JSON ("kind" "copy"): one file
copied and fsync'ed, bytes per second and timed seconds; they run on rmemfs,
rmemfs-classic, tmpfs and sshfs.
This script reads those outputs, keeps for each (job, target) its median run by
throughput, prints the run's settings (with the FUSE transport that served each FUSE
target) and two tables: the fio jobs (MB/s, IOPS, p99 latency, the CPU time the whole
machine spent per request, and the ratios that matter: rmemfs's throughput over its
bound, the ring ceiling nullfs (FUSE over io_uring, no data), or for the random reads
that miss the cache the lower of nullfs and the fabric alone; over sshfs to a tmpfs;
over rmemfs-classic, the same fsd on /dev/fuse (the ring's gain), and nullfs's over
nullfs-classic; then whether rmemfs reaches 0.6x of its bound, and 5x sshfs where the
bound is 5.5x sshfs or more, and for a job below 0.6x what bounds it: the fabric alone
over nullfs, rmemfs over the fabric alone, rmemfs's CPU time per request over the
fabric's and nullfs's added; and rmemfs-mapped, fsd over the mapped fabric (the
memnode's region mapped in fsd: no fabric under it), over its bound, nullfs, and over
rmemfs (tcp), with whether it reaches 0.8x of nullfs) and the metadata jobs (files/s,
seconds, latency, rmemfs over tmpfs, sshfs, nullfs and rmemfs-classic, plus
rmemfs-vol's over rmemfs's: what durable metadata costs, and rmemfs-mapped's over
the same and rmemfs's, with whether it reaches 0.8x of nullfs), and the copy jobs (MB/s, seconds, each target's copy-range
over its copy-rw, which on rmemfs is what serving copy_file_range in remote memory
gives, and rmemfs over tmpfs, sshfs and rmemfs-classic), writes all of it as JSON
(rmemfs and rmemfs-mapped over every other target too), and draws a bar chart with gnuplot. Any subset of the targets works
(scripts/bench --only). It reports; it never judges timings: the exit status says
only whether every run and the chart worked.
Standard library only, so a stock python3 runs it.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
import time

# What rmemfs is divided by in the JSON's ratios (vs_<target>), in this order.
BASELINES = ("tmpfs", "sshfs", "nullfs", "nullfs-classic", "fabric", "rmemfs-classic")
# The same fsd and nullfs on /dev/fuse: X / CLASSIC[X] is what the ring gains.
CLASSIC = {"rmemfs": "rmemfs-classic", "nullfs": "nullfs-classic"}
# The bar rmemfs is held to (scripts/bench reports it, never judges it): in each of
# these jobs at least BAR_BOUND of its bound, and at least BAR_SSHFS of sshfs where
# the bound is at least BAR_SSHFS_IF of sshfs.
BAR_JOBS = ("seq-write-1m", "seq-read-1m", "rand-read-4k", "rand-write-4k",
            "rand-read-4k-4jobs")
BAR_BOUND, BAR_SSHFS, BAR_SSHFS_IF = 0.6, 5.0, 5.5
# A job's bound: the lowest of these targets that ran. nullfs is the ring ceiling
# (FUSE over io_uring, no data); the random reads miss fsd's cache, so the fabric
# alone bounds them too. Any other job: nullfs.
BOUND_OF = {"rand-read-4k": ("nullfs", "fabric"), "rand-read-4k-4jobs": ("nullfs", "fabric")}
DEFAULT_BOUND = ("nullfs",)
# rmemfs on a durable volume (fsd --volume): metadata jobs only, compared with the
# same baselines and with scratch rmemfs.
VOLUME = "rmemfs-vol"
# What each metadata job counts per second (the table's files/s column).
META_UNITS = {"create": "files/s", "stat": "stats/s", "unlink": "files/s",
              "untar": "files/s"}
# rmemfs over the mapped fabric (fsd --transport mapped: the memnode's region mapped
# in fsd, READ and WRITE copies into it, control over tcp). No fabric under it, so its
# bound is the ring ceiling, MAPPED_BOUND, in every job; issue 55 holds it to
# MAPPED_BAR of that in every fio job and in create, stat, unlink and untar (reported,
# never judged). The JSON divides it by each of MAPPED_BASELINES (mapped_ratios).
MAPPED = "rmemfs-mapped"
MAPPED_BOUND = "nullfs"
MAPPED_BAR = 0.8
MAPPED_BASELINES = ("nullfs", "rmemfs", "rmemfs-classic", "tmpfs", "sshfs",
                    "nullfs-classic", "fabric")
COLORS = {"rmemfs": "#d95f02", "rmemfs-classic": "#fdae6b", "rmemfs-vol": "#e7298a",
          MAPPED: "#e6ab02", "tmpfs": "#7f7f7f", "sshfs": "#1f78b4", "nullfs": "#33a02c",
          "nullfs-classic": "#b2df8a", "fabric": "#6a3d9a"}
# The targets an fsd serves (memory and fsd traffic in the manifest).
RMEMFS_TARGETS = ("rmemfs", "rmemfs-classic", MAPPED, VOLUME)
# The copy jobs: with copy_file_range(2), and the same copy through read(2) and
# write(2). COPY_RANGE / COPY_RW on one target is what copy_file_range gives there.
COPY_RANGE, COPY_RW = "copy-range", "copy-rw"
# The targets that run them (the bench's copy_runs_on), and what rmemfs's copies are
# divided by in their table.
COPY_TARGETS = ("rmemfs", "rmemfs-classic", "tmpfs", "sshfs")
COPY_BASELINES = ("tmpfs", "sshfs")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manifest", required=True)
    p.add_argument("--jobs", required=True, help="comma-separated, in matrix order")
    p.add_argument("--targets", required=True, help="comma-separated")
    p.add_argument("--metadata-jobs", default="",
                   help="comma-separated: which of --jobs are metadata jobs (meta.py)")
    p.add_argument("--copy-jobs", default="",
                   help="comma-separated: which of --jobs are copy jobs (filecopy.py)")
    p.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                   help="a run setting to record (numbers become numbers)")
    p.add_argument("--fsd-arg", action="append", default=[],
                   help="an extra flag passed to fsd, recorded as is")
    p.add_argument("--fio-arg", action="append", default=[],
                   help="an extra option given to every fio run, recorded as is")
    p.add_argument("--transport", action="append", default=[], metavar="TARGET=TEXT",
                   help="the FUSE transport that served TARGET, as its daemon logged it")
    p.add_argument("--fabric", action="append", default=[], metavar="TARGET=TEXT",
                   help="the fabric TARGET's fsd reached the memnode over, as its log and "
                   "the memnode's said it")
    p.add_argument("--started", type=float, required=True, help="epoch seconds")
    p.add_argument("--loadavg-start", default="")
    p.add_argument("--busy-start", type=float, help="%% of CPU busy just before the run")
    p.add_argument("--stat-start", default="", help="the cpu line of /proc/stat at start")
    p.add_argument("--out-json", required=True)
    p.add_argument("--latest", required=True, help="copy of the JSON under a fixed name")
    p.add_argument("--chart", required=True, help="PNG to draw")
    p.add_argument("--chart-script", required=True, help="the gnuplot script")
    p.add_argument("--chart-data-dir", required=True, help="where the plotted data goes")
    return p.parse_args()


def number_or_text(value):
    if value in ("true", "false"):
        return value == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def read_file(path, default=""):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return default


def machine():
    """Where the numbers were measured: they mean little without it."""
    cpu = "unknown"
    for line in read_file("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = 0
    for line in read_file("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) * 1024
    os_name = "unknown"
    for line in read_file("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            os_name = line.split("=", 1)[1].strip('"')
    return {
        "hostname": platform.node(),
        "nproc": len(os.sched_getaffinity(0)),
        "memory_bytes": mem,
        "kernel": platform.release(),
        "cpu_model": cpu,
        "os": os_name,
    }


def steal_pct(stat_start):
    """Share of CPU time the hypervisor gave to others during the run, in percent: a
    virtual machine's neighbours are noise the load average does not show."""
    start = stat_start.split()[1:9]
    end = read_file("/proc/stat").splitlines()[0].split()[1:9]
    if len(start) != 8 or len(end) != 8:
        return None
    delta = [int(e) - int(s) for s, e in zip(start, end)]
    return round(100.0 * delta[7] / sum(delta), 1) if sum(delta) > 0 else None


def float_or_none(text):
    try:
        return float(text)
    except ValueError:
        return None


def online_cpus():
    """The CPUs /proc/stat counts (its cpuN lines): what busy-pct is a share of."""
    lines = read_file("/proc/stat").splitlines()
    return sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit()) or 1


def read_manifest(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            fields = line.split("\t")
            (job, target, status, fio_json, hwm, rss, mn_rss, stats_before,
             stats_after, round_, steal, busy) = fields[:12]
            wall, daemon_ticks, memnode_ticks = (fields[12:15] + ["-"] * 3)[:3]
            rows.append({
                "job": job, "target": target, "status": status, "fio_json": fio_json,
                "fsd_peak_rss_kib": hwm, "fsd_rss_kib": rss, "memnode_rss_kib": mn_rss,
                "stats_before": stats_before, "stats_after": stats_after,
                "round": int(round_), "steal_pct": float_or_none(steal),
                "busy_pct": float_or_none(busy),
                "wall_s": float_or_none(wall),
                "daemon_ticks": ticks_or_none(daemon_ticks),
                "memnode_ticks": ticks_or_none(memnode_ticks),
            })
    return rows


def ticks_or_none(text):
    """(user, sys) clock ticks from "USER,SYS"; None for "-" or anything else."""
    user, _, sys_ = text.partition(",")
    try:
        return int(user), int(sys_)
    except ValueError:
        return None


def cpu_parts_us(row, iops):
    """Where a request's CPU time went, in microseconds: the target's daemon in user
    and in kernel mode, and the memnode (both modes), from their clock ticks over the
    run's wall time (tick accounting: good to a tick per process and run). Like
    cpu_us_per_request, it takes the run as steady from set-up to end. None without
    the ticks or a rate."""
    wall = row.get("wall_s")
    if not wall or not iops:
        return None
    per_tick = 1e6 / os.sysconf("SC_CLK_TCK") / wall / iops
    parts = {}
    if row.get("daemon_ticks"):
        user, sys_ = row["daemon_ticks"]
        parts["daemon_user"] = user * per_tick
        parts["daemon_sys"] = sys_ * per_tick
    if row.get("memnode_ticks"):
        parts["memnode"] = sum(row["memnode_ticks"]) * per_tick
    return parts or None


def kib_to_bytes(value):
    return int(value) * 1024 if value not in ("", "-") else None


def fio_job(path):
    """The one job result of a fio JSON output (numjobs>1 uses group_reporting)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # fio may print warnings before the JSON document.
    data = json.loads(text[text.index("{"):])
    jobs = data.get("jobs") or []
    if len(jobs) != 1:
        raise ValueError(f"{path}: expected one (grouped) job, found {len(jobs)}")
    return data, jobs[0]


def percentile_us(section, which):
    for key in ("clat_ns", "lat_ns"):
        pct = (section.get(key) or {}).get("percentile") or {}
        if which in pct:
            return pct[which] / 1000.0
    return None


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fsd_traffic(row):
    """fsd's counters over one job (after minus before), or None without them."""
    before, after = read_json(row["stats_before"]), read_json(row["stats_after"])
    if not before or not after:
        return None
    delta = {k: after[k] - before.get(k, 0) for k in after
             if k not in ("cache_pages", "cache_capacity_pages", "block_size")}
    delta["block_size"] = after.get("block_size")
    return delta


def cpu_us_per_request(busy_pct, cpus, iops):
    """CPU time the whole machine spent per request, in microseconds: every process
    and the kernel, the target's daemons and fio (or fabricbench) alike. busy_pct was
    measured over the whole tool run (set-up and ramp included) and iops over its
    measured seconds, so this assumes the run was steady throughout. Threads that poll
    for an answer count as busy while they spin."""
    if busy_pct is None or not iops:
        return None
    return busy_pct / 100.0 * cpus * 1e6 / iops


def measure(row, cpus):
    """One (job, target) result; a failed run keeps its status and no numbers."""
    result = {
        "job": row["job"], "target": row["target"], "status": row["status"],
        "fio_output": row["fio_json"], "round": row["round"], "steal_pct": row["steal_pct"],
        "cpu_busy_pct": row["busy_pct"],
    }
    if row["target"] in RMEMFS_TARGETS:
        result["fsd_peak_rss_bytes"] = kib_to_bytes(row["fsd_peak_rss_kib"])
        result["fsd_rss_bytes"] = kib_to_bytes(row["fsd_rss_kib"])
        result["memnode_rss_bytes"] = kib_to_bytes(row["memnode_rss_kib"])
        result["fsd_traffic"] = fsd_traffic(row)
    if row["status"] != "ok":
        return result
    meta = read_json(row["fio_json"])
    if isinstance(meta, dict) and meta.get("kind") == "metadata":
        return measure_metadata(result, meta, row, cpus)
    if isinstance(meta, dict) and meta.get("kind") == "copy":
        return measure_copy(result, meta, row, cpus)
    result["kind"] = "data"
    try:
        data, job = fio_job(row["fio_json"])
    except (OSError, ValueError) as e:
        result["status"] = f"unreadable fio output: {e}"
        return result
    # The direction that moved data is the one measured (jobs are read- or write-only).
    rw = max(("read", "write"), key=lambda d: job[d]["io_bytes"])
    sec = job[rw]
    if job.get("error"):
        result["status"] = f"fio error {job['error']}"
    result.update({
        "direction": rw,
        "fio_version": data.get("fio version"),
        "bw_bytes_per_s": sec["bw_bytes"],
        "mb_per_s": sec["bw_bytes"] / 1e6,
        "iops": sec["iops"],
        "io_bytes": sec["io_bytes"],
        "runtime_ms": sec["runtime"],
        "lat_us": {
            "mean": (sec.get("clat_ns") or {}).get("mean", 0) / 1000.0,
            "p50": percentile_us(sec, "50.000000"),
            "p99": percentile_us(sec, "99.000000"),
            "p99.9": percentile_us(sec, "99.900000"),
        },
        "usr_cpu_pct": job.get("usr_cpu"),
        "sys_cpu_pct": job.get("sys_cpu"),
        "cpu_us_per_request": cpu_us_per_request(row["busy_pct"], cpus, sec["iops"]),
        "cpu_us_per_request_parts": cpu_parts_us(row, sec["iops"]),
    })
    return result


def measure_metadata(result, meta, row, cpus):
    """One metadata job's result, from meta.py's output. Its CPU shares were taken
    over the timed part alone; the bench's, over the whole helper run, are the
    fallback."""
    busy = meta.get("cpu_busy_pct")
    if busy is None:
        busy = row["busy_pct"]
    steal = meta.get("steal_pct")
    result.update({
        "kind": "metadata",
        "tool": meta.get("tool"),
        "unit": META_UNITS.get(row["job"], "ops/s"),
        "ops": meta.get("ops"),
        "ops_per_s": meta.get("ops_per_s"),
        "seconds": meta.get("seconds"),
        "bytes": meta.get("bytes"),
        "layout": meta.get("layout"),
        "dirs": meta.get("dirs"),
        "lat_us": meta.get("lat_us"),
        "cpu_busy_pct": busy,
        "steal_pct": row["steal_pct"] if steal is None else steal,
        "cpu_us_per_op": cpu_us_per_request(busy, cpus, meta.get("ops_per_s")),
    })
    for key in ("files_per_dir", "dir_ops_seconds", "mb_per_s"):
        if key in meta:
            result[key] = meta[key]
    if not meta.get("ops_per_s"):
        result["status"] = "no operation timed"
    return result


def measure_copy(result, copy, row, cpus):
    """One copy job's result, from filecopy.py's output: the copy and the fsync of the
    copy, timed together. CPU shares as for a metadata job (the timed part's, else
    the whole run's); CPU s/GB = the whole machine's CPU seconds per 10^9 bytes
    copied."""
    busy = copy.get("cpu_busy_pct")
    if busy is None:
        busy = row["busy_pct"]
    steal = copy.get("steal_pct")
    seconds, nbytes = copy.get("seconds"), copy.get("bytes")
    bw = nbytes / seconds if seconds and nbytes else None
    result.update({
        "kind": "copy",
        "tool": copy.get("tool"),
        "ops": copy.get("ops"),
        "ops_per_s": copy.get("ops_per_s"),
        "seconds": seconds,
        "copy_seconds": copy.get("copy_seconds"),
        "fsync_seconds": copy.get("fsync_seconds"),
        "bytes": nbytes,
        "bw_bytes_per_s": bw,
        "mb_per_s": bw / 1e6 if bw else None,
        "lat_us": copy.get("lat_us"),
        "source_laid_out": copy.get("source_laid_out"),
        "layout_seconds": copy.get("layout_seconds"),
        "verified": copy.get("verified"),
        "sha256": copy.get("sha256"),
        "verify_seconds": copy.get("verify_seconds"),
        "cpu_busy_pct": busy,
        "steal_pct": row["steal_pct"] if steal is None else steal,
        "cpu_s_per_gb": (busy / 100.0 * cpus * 1e9 / bw
                         if busy is not None and bw else None),
    })
    if not bw:
        result["status"] = "no copy timed"
    elif copy.get("verified") is not True:
        result["status"] = "copy not verified"
    return result


def rate(r):
    """What a result is ranked and divided by: bytes/s of a fio or copy job,
    operations/s of a metadata job."""
    if r.get("kind") == "metadata":
        return r.get("ops_per_s") or 0
    return r.get("bw_bytes_per_s") or 0


def is_metadata(doc, job):
    return job in doc.get("metadata_jobs", ())


def is_copy(doc, job):
    return job in doc.get("copy_jobs", ())


def median_runs(results):
    """One result per (job, target), in the order first run: the run whose throughput
    is the median of its successful runs (the lower middle one of an even count), so
    its latencies and fsd traffic come from the same run. It lists every run under
    "runs" (round, status, throughput, steal). A (job, target) with no successful run
    keeps its last failure."""
    groups = {}
    for r in results:
        groups.setdefault((r["job"], r["target"]), []).append(r)
    chosen = []
    for runs in groups.values():
        ok = sorted((r for r in runs if r["status"] == "ok"), key=rate)
        pick = dict(ok[(len(ok) - 1) // 2] if ok else runs[-1])
        keys = ("round", "status", "bw_bytes_per_s", "iops", "steal_pct", "cpu_busy_pct",
                "cpu_us_per_request", "cpu_us_per_request_parts", "fio_output")
        if pick.get("kind") == "metadata":
            keys = ("round", "status", "ops_per_s", "seconds", "steal_pct", "cpu_busy_pct",
                    "cpu_us_per_op", "fio_output")
        elif pick.get("kind") == "copy":
            keys = ("round", "status", "bw_bytes_per_s", "seconds", "steal_pct",
                    "cpu_busy_pct", "cpu_s_per_gb", "source_laid_out", "fio_output")
        pick["runs"] = [{k: r.get(k) for k in keys} for r in runs]
        chosen.append(pick)
    return chosen


def ratios(results, jobs, subject="rmemfs", bases=BASELINES):
    """subject's throughput (bytes/s; files/s for a metadata job) divided by each
    baseline's, per job (>1: subject is faster)."""
    by = {(r["job"], r["target"]): r for r in results}
    out = {}
    for job in jobs:
        mine = by.get((job, subject))
        if not mine or mine["status"] != "ok":
            continue
        for base in bases:
            other = by.get((job, base))
            if other and other["status"] == "ok" and rate(other) > 0:
                out.setdefault(job, {})[f"vs_{base}"] = rate(mine) / rate(other)
    return out


def ok_rate(by, job, target):
    """target's throughput in job, or None when it did not run or failed."""
    r = by.get((job, target))
    if r and r["status"] == "ok" and rate(r) > 0:
        return rate(r)
    return None


def transport_gains(results, jobs):
    """Per job, each target's throughput over its /dev/fuse twin's (CLASSIC): what
    FUSE over io_uring gains, for rmemfs and for the ceiling nullfs."""
    by = {(r["job"], r["target"]): r for r in results}
    out = {}
    for job in jobs:
        for ring, classic in CLASSIC.items():
            a, b = ok_rate(by, job, ring), ok_rate(by, job, classic)
            if a and b:
                out.setdefault(job, {})[ring] = a / b
    return out


def copy_speedups(results, targets):
    """Per target, its copy-range throughput over its copy-rw throughput: what
    copy_file_range(2) gives there against a copy through read(2) and write(2)."""
    by = {(r["job"], r["target"]): r for r in results}
    out = {}
    for t in targets:
        a, b = ok_rate(by, COPY_RANGE, t), ok_rate(by, COPY_RW, t)
        if a and b:
            out[t] = a / b
    return out


def what_bounds(by, job):
    """The figures that say what bounds rmemfs in job, from the same run: the fabric
    alone over the ring ceiling (nullfs), rmemfs over the fabric alone, and the CPU
    time of one of rmemfs's requests over that of the fabric's and nullfs's added.
    rmemfs does both the fabric's work and the ring's on CPUs that all the processes
    share, so where the fabric alone is near or below the bar, or rmemfs's CPU time
    is about the two added, those two bound it. None where a number is missing."""
    mine, fabric, nullfs = (ok_rate(by, job, t) for t in ("rmemfs", "fabric", "nullfs"))
    cpu = {t: (by.get((job, t)) or {}).get("cpu_us_per_request")
           for t in ("rmemfs", "fabric", "nullfs")}
    parts = cpu["fabric"] + cpu["nullfs"] if cpu["fabric"] and cpu["nullfs"] else None
    return {
        "fabric_vs_nullfs": fabric / nullfs if fabric and nullfs else None,
        "rmemfs_vs_fabric": mine / fabric if mine and fabric else None,
        "rmemfs_cpu_vs_fabric_plus_nullfs":
            cpu["rmemfs"] / parts if mine and cpu["rmemfs"] and parts else None,
    }


def bounds(results, jobs, targets):
    """Per fio job, rmemfs's bound and where rmemfs stands against the bar: the
    bound's target and throughput (the lowest of BOUND_OF's targets that ran), the
    candidates that did not run, rmemfs / bound, rmemfs / sshfs, bound / sshfs, and
    the two indications (True, False, or None where a number is missing or, for
    sshfs, where the bound is below BAR_SSHFS_IF x sshfs: the rule does not apply).
    Only the jobs of BAR_JOBS are in the bar; the others get the ratios alone."""
    by = {(r["job"], r["target"]): r for r in results}
    out = {}
    for job in jobs:
        wanted = BOUND_OF.get(job, DEFAULT_BOUND)
        have = [(ok_rate(by, job, t), t) for t in wanted]
        have = [(v, t) for v, t in have if v]
        mine, sshfs = ok_rate(by, job, "rmemfs"), ok_rate(by, job, "sshfs")
        entry = {
            "in_bar": job in BAR_JOBS,
            "bound_of": list(wanted),
            "bound_missing": [t for t in wanted if not ok_rate(by, job, t)],
            "bound_target": None, "bound_bytes_per_s": None,
            "rmemfs_vs_bound": None, "rmemfs_vs_sshfs": None, "bound_vs_sshfs": None,
            "meets_bound": None, "sshfs_rule_applies": None, "meets_sshfs": None,
        }
        entry.update(what_bounds(by, job))
        if have:
            value, target = min(have)
            entry["bound_target"], entry["bound_bytes_per_s"] = target, value
            if sshfs:
                entry["bound_vs_sshfs"] = value / sshfs
                entry["sshfs_rule_applies"] = value / sshfs >= BAR_SSHFS_IF
            if mine:
                entry["rmemfs_vs_bound"] = mine / value
        if mine and sshfs:
            entry["rmemfs_vs_sshfs"] = mine / sshfs
        if entry["in_bar"]:
            if entry["rmemfs_vs_bound"] is not None:
                entry["meets_bound"] = entry["rmemfs_vs_bound"] >= BAR_BOUND
            if entry["sshfs_rule_applies"] and entry["rmemfs_vs_sshfs"] is not None:
                entry["meets_sshfs"] = entry["rmemfs_vs_sshfs"] >= BAR_SSHFS
        if "rmemfs" in targets:
            out[job] = entry
    return out


def bar_summary(doc):
    """The bar in a few numbers: of the jobs of BAR_JOBS that ran, those where rmemfs
    met it, missed it, or could not be told (a missing run); for sshfs also those
    where the rule does not apply (bound below BAR_SSHFS_IF x sshfs)."""
    summary = {"bound": {"at_least": BAR_BOUND, "met": [], "missed": [], "unknown": []},
               "sshfs": {"at_least": BAR_SSHFS, "where_bound_at_least": BAR_SSHFS_IF,
                         "met": [], "missed": [], "not_applicable": [], "unknown": []}}
    for job, b in doc["bounds"].items():
        if not b["in_bar"]:
            continue
        key = {True: "met", False: "missed", None: "unknown"}[b["meets_bound"]]
        summary["bound"][key].append(job)
        if b["sshfs_rule_applies"] is False:
            key = "not_applicable"
        else:
            key = {True: "met", False: "missed", None: "unknown"}[b["meets_sshfs"]]
        summary["sshfs"][key].append(job)
    return summary


def mapped_summary(doc):
    """Issue 55's figure for rmemfs-mapped, reported and never judged: per fio job and
    metadata job that ran, rmemfs-mapped over its bound (nullfs, the ring ceiling) and
    whether that is at least MAPPED_BAR (None where a run is missing or failed); and
    the jobs where it is met, missed or unknown. None when rmemfs-mapped did not run."""
    if MAPPED not in doc["targets"]:
        return None
    jobs = [j for j in doc["jobs"] if not is_copy(doc, j)]
    out = {"bound": MAPPED_BOUND, "at_least": MAPPED_BAR, "jobs": {}, "met": [],
           "missed": [], "unknown": []}
    for job in jobs:
        v = doc["mapped_ratios"].get(job, {}).get(f"vs_{MAPPED_BOUND}")
        meets = None if v is None else v >= MAPPED_BAR
        out["jobs"][job] = {f"vs_{MAPPED_BOUND}": v, "meets": meets}
        out[{True: "met", False: "missed", None: "unknown"}[meets]].append(job)
    return out


def print_mapped_bar(doc, jobs):
    """One paragraph: where rmemfs-mapped reached MAPPED_BAR x nullfs among jobs."""
    summary = doc.get("mapped_bar")
    if not summary or MAPPED_BOUND not in doc["targets"]:
        return
    jobs = [j for j in jobs if j in summary["jobs"]]
    if not jobs:
        return
    met = [j for j in jobs if j in summary["met"]]
    missed = [j for j in jobs if j in summary["missed"]]
    unknown = [j for j in jobs if j in summary["unknown"]]
    key = f"vs_{MAPPED_BOUND}"
    text = (f"{MAPPED} >= {MAPPED_BAR:g}x {MAPPED_BOUND} (issue 55's figure, reported and "
            f"never judged): {len(met)} of {len(jobs)} job(s)")
    if missed:
        text += "; below in " + ", ".join(
            f"{j} {fmt_ratio(summary['jobs'][j][key])}" for j in missed)
    if unknown:
        text += f"; no number for {', '.join(unknown)}"
    print(textwrap.fill(text, width=92, break_on_hyphens=False))


def fmt(value, digits=0):
    if value is None:
        return "-"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def fmt_ratio(value):
    if value is None:
        return ""
    return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"


def mib(n):
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def print_header(doc):
    m, s = doc["machine"], doc["settings"]
    targets = doc["targets"]
    print(f"rmemfs benchmark, {doc['date']}, git {s.get('git')}, wall time "
          f"{doc['wall_time_s']:.0f} s")
    print(f"  machine: {m['nproc']} CPUs ({m['cpu_model']}), {mib(m['memory_bytes'])}, "
          f"kernel {m['kernel']}, {m['os']}")
    print(f"  CPUs busy before the run: {fmt(doc['cpu_busy_before_pct'])}%; stolen by the "
          f"hypervisor during it: {fmt(doc['cpu_steal_pct'], 1)}%; load average at start "
          f"{doc['loadavg_start'] or '-'}, at end {doc['loadavg_end']}")
    if any(t in targets for t in RMEMFS_TARGETS):
        extra = " ".join(doc["fsd_extra_args"])
        print(f"  rmemfs: {s.get('memnodes')} memnode on 127.0.0.1, {s.get('fabric')} fabric, "
              f"{mib(s.get('memnode_size_bytes'))}; fsd --transport {s.get('fabric')} "
              f"--cache {s.get('cache')} "
              f"--block-size {s.get('block_size')}{' ' + extra if extra else ''} "
              "(--fuse-transport auto, the default)")
    if "rmemfs-classic" in targets:
        print("  rmemfs-classic: the same fsd flags plus --fuse-transport classic "
              "(/dev/fuse), on the same memnode")
    if MAPPED in targets:
        print(f"  {MAPPED}: rmemfs's fsd flags but --transport mapped, on the same memnode: "
              "its region (a memfd) mapped in fsd, READ and WRITE copies into it, control "
              f"over tcp; its bound is {MAPPED_BOUND} (the ring ceiling)")
    if VOLUME in targets:
        print(f"  rmemfs-vol: the same fsd flags on the durable volume "
              f"'{s.get('volume')}' (--volume) on that memnode, metadata jobs only: "
              "what durable metadata costs")
    if "nullfs" in targets or "nullfs-classic" in targets:
        threads = s.get("nullfs_threads")
        threads = ("its default --threads" if threads in (None, "default")
                   else f"--threads {threads}")
        ring_threads = s.get("nullfs_ring_threads")
        ring_threads = ("its default --ring-threads" if ring_threads in (None, "default")
                        else f"--ring-threads {ring_threads}")
        print(f"  nullfs: no data, fsd's FUSE settings, {threads}, {ring_threads}, --fuse-transport "
              "io-uring (the ring ceiling); nullfs-classic: the same with "
              "--fuse-transport classic")
    if "fabric" in targets:
        print(f"  fabric: fabricbench to the memnode, {s.get('fabric')}, jobs shaped like "
              f"fio's (block size, jobs; one block at a time per job), operations of up to "
              f"{s.get('block_size')}, --poll-us {s.get('fabric_poll_us')}")
    if data_jobs(doc):
        print(f"  fio: {s.get('ioengine')}, {s.get('runtime_s')} s per job after a "
              f"{s.get('ramp_s')} s ramp, file {s.get('size')}, in-cache file "
              f"{s.get('incache_size')}, page cache dropped before each run: "
              f"{'yes' if s.get('drop_caches') is True else 'no'}")
    meta = doc.get("metadata_jobs") or []
    if any(j in meta for j in ("create", "stat", "unlink")):
        print(f"  create/stat/unlink: {fmt(s.get('meta_files'))} files of 1-4 KiB, "
              f"{s.get('meta_files_per_dir')} per directory, one process, one file at a "
              f"time (scripts/bench-lib/meta.py), page cache dropped before each: "
              f"{'yes' if s.get('drop_caches') is True else 'no'}")
    if "untar" in meta:
        print(f"  untar: GNU tar -x of a generated source tree, {fmt(s.get('untar_files'))} "
              f"files in {fmt(s.get('untar_dirs'))} directories, "
              f"{mib(s.get('untar_bytes'))} (seed {s.get('untar_seed')})")
    if doc.get("copy_jobs"):
        print(f"  copy-range/copy-rw: a file of {s.get('copy_size')} (random bytes, laid out "
              "untimed) copied with a copy_file_range(2) loop / 1 MiB read(2)+write(2), then "
              "fsync'ed (scripts/bench-lib/filecopy.py), page cache dropped before each: "
              f"{'yes' if s.get('drop_caches') is True else 'no'}")
    if meta and ("nullfs" in targets or "nullfs-classic" in targets):
        print("  nullfs has no directories: its metadata jobs put the same files flat in "
              "its root")
    if doc["fio_extra_args"]:
        print(f"  extra fio options: {' '.join(doc['fio_extra_args'])}")
    transports = doc.get("fuse_transports") or {}
    if transports:
        ring = s.get("fuse_uring")
        before = s.get("fuse_enable_uring_before")
        state = (f"on (enable_uring Y for the run, {before} before)" if ring is True
                 else "off (no enable_uring, or it could not be set)")
        print(f"  FUSE over io_uring: {state}; the transport that served each FUSE target "
              "(from its log):")
        width = max(len(t) for t in transports)
        for t in targets:
            if t in transports:
                print(f"    {t:<{width}}  {transports[t]}")
    fabrics = doc.get("fsd_fabrics") or {}
    if fabrics:
        print("  the fabric each fsd reached the memnode over (from its log, checked "
              "against the memnode's):")
        width = max(len(t) for t in fabrics)
        for t in targets:
            if t in fabrics:
                print(f"    {t:<{width}}  {fabrics[t]}")
    versions = [s[k] for k in ("fsd_version", "nullfs_version", "fabricbench_version",
                               "fio_version", "tar_version", "sshfs_version",
                               "sshd_version") if k in s]
    print(f"  versions: {'; '.join(str(v) for v in versions)}")


def data_jobs(doc):
    return [j for j in doc["jobs"] if not is_metadata(doc, j) and not is_copy(doc, j)]


def has_classic_pair(targets):
    return any(ring in targets and classic in targets for ring, classic in CLASSIC.items())


BOUND_COL = f"{BAR_BOUND:g}x bound"
SSHFS_COL = f"{BAR_SSHFS:g}x sshfs"
# rmemfs-mapped's columns in the fio table (its row only): over its bound, over
# rmemfs (tcp), and issue 55's figure.
MAPPED_VS_BOUND_COL = f"mapped/{MAPPED_BOUND}"
MAPPED_VS_TCP_COL = "mapped/tcp"
MAPPED_BAR_COL = f"{MAPPED_BAR:g}x {MAPPED_BOUND}"


def data_columns(doc):
    """The ratio and bar columns of the fio table this run has numbers for: rmemfs's
    bound (which target) and rmemfs / bound, rmemfs / sshfs, bound / sshfs, each
    target over its /dev/fuse twin (rmemfs's and nullfs's rows), and the two
    indications of the bar; then rmemfs-mapped / nullfs, rmemfs-mapped / rmemfs and
    whether the first is at least MAPPED_BAR (rmemfs-mapped's row)."""
    t = doc["targets"]
    cols = []
    bound = "rmemfs" in t and any(b in t for b in ("nullfs", "fabric"))
    if bound:
        cols += ["bound", "vs bound"]
    if "rmemfs" in t and "sshfs" in t:
        cols.append("vs sshfs")
        if bound:
            cols.append("bound/sshfs")
    if has_classic_pair(t):
        cols.append("vs classic")
    if bound:
        cols.append(BOUND_COL)
        if "sshfs" in t:
            cols.append(SSHFS_COL)
    if MAPPED in t and MAPPED_BOUND in t:
        cols.append(MAPPED_VS_BOUND_COL)
    if MAPPED in t and "rmemfs" in t:
        cols.append(MAPPED_VS_TCP_COL)
    if MAPPED in t and MAPPED_BOUND in t:
        cols.append(MAPPED_BAR_COL)
    return cols


def yes_no(value):
    return {True: "yes", False: "no", None: "-"}[value]


def data_cells(doc, r, cols):
    """The cells of cols for result r: rmemfs's row carries the bound, sshfs and bar
    columns, rmemfs's and nullfs's rows their gain over /dev/fuse, rmemfs-mapped's its
    own columns."""
    b = doc["bounds"].get(r["job"], {}) if r["target"] == "rmemfs" else {}
    mapped = {}
    if r["target"] == MAPPED:
        mapped = doc["mapped_ratios"].get(r["job"], {})
        figure = (doc.get("mapped_bar") or {}).get("jobs", {}).get(r["job"], {})
    bar = b.get("in_bar")
    sshfs = ""
    if bar:
        sshfs = "n/a" if b.get("sshfs_rule_applies") is False else yes_no(b.get("meets_sshfs"))
    cells = {
        "bound": (b.get("bound_target") or "-") if b else "",
        "vs bound": fmt_ratio(b.get("rmemfs_vs_bound")),
        "vs sshfs": fmt_ratio(b.get("rmemfs_vs_sshfs")),
        "bound/sshfs": fmt_ratio(b.get("bound_vs_sshfs")),
        "vs classic": fmt_ratio(doc["transport_gains"].get(r["job"], {}).get(r["target"])),
        BOUND_COL: yes_no(b.get("meets_bound")) if bar else "",
        SSHFS_COL: sshfs,
        MAPPED_VS_BOUND_COL: fmt_ratio(mapped.get(f"vs_{MAPPED_BOUND}")),
        MAPPED_VS_TCP_COL: fmt_ratio(mapped.get("vs_rmemfs")),
        MAPPED_BAR_COL: yes_no(figure.get("meets")) if r["target"] == MAPPED else "",
    }
    return tuple(cells[c] for c in cols)


def meta_columns(doc):
    """The ratio columns of the metadata table: rmemfs (and rmemfs-vol and
    rmemfs-mapped) over the baselines with files that ran, each target over its
    /dev/fuse twin, and rmemfs-vol and rmemfs-mapped over rmemfs."""
    t = doc["targets"]
    cols = []
    if "rmemfs" in t or VOLUME in t or MAPPED in t:
        cols = [b for b in ("tmpfs", "sshfs", "nullfs") if b in t]
    if has_classic_pair(t):
        cols.append("classic")
    if (VOLUME in t or MAPPED in t) and "rmemfs" in t:
        cols.append("rmemfs")
    return cols


def meta_bar_column(doc):
    """Whether the metadata table has rmemfs-mapped's column of issue 55's figure."""
    t = doc["targets"]
    return MAPPED in t and MAPPED_BOUND in t


def table_rows(doc):
    """One row of cells per fio result; a failed run has its status instead of
    numbers."""
    cols = data_columns(doc)
    rows = []
    for r in doc["results"]:
        if is_metadata(doc, r["job"]) or is_copy(doc, r["job"]):
            continue
        if r["status"] != "ok":
            rows.append((r["job"], r["target"], "FAILED: " + r["status"]))
            continue
        p99 = r["lat_us"]["p99"]
        cpu = r.get("cpu_us_per_request")
        rows.append((
            r["job"], r["target"],
            fmt(r["mb_per_s"], 1 if r["mb_per_s"] < 100 else 0),
            fmt(r["iops"]),
            fmt(p99, 1 if p99 is not None and p99 < 100 else 0),
            fmt(r.get("cpu_busy_pct")),
            fmt(cpu, 1 if cpu is not None and cpu < 100 else 0),
            fmt(r.get("steal_pct"), 1),
        ) + data_cells(doc, r, cols))
    return rows


def meta_rows(doc):
    """One row of cells per metadata result, as table_rows."""
    cols = meta_columns(doc)
    rows = []
    for r in doc["results"]:
        if not is_metadata(doc, r["job"]):
            continue
        if r["status"] != "ok":
            rows.append((r["job"], r["target"], "FAILED: " + r["status"]))
            continue
        ratio = {}
        if r["target"] == "rmemfs":
            ratio = {k: v for k, v in doc["ratios"].get(r["job"], {}).items()
                     if k != "vs_rmemfs"}
        elif r["target"] == VOLUME:
            ratio = dict(doc["volume_ratios"].get(r["job"], {}))
        elif r["target"] == MAPPED:
            ratio = dict(doc["mapped_ratios"].get(r["job"], {}))
        ratio.pop("vs_classic", None)
        gain = doc["transport_gains"].get(r["job"], {}).get(r["target"])
        if gain is not None:
            ratio["vs_classic"] = gain
        lat = r.get("lat_us") or {}
        cpu = r.get("cpu_us_per_op")

        def us(v):
            return fmt(v, 1 if v is not None and v < 100 else 0)

        figure = ()
        if meta_bar_column(doc):
            meets = (doc.get("mapped_bar") or {}).get("jobs", {}).get(r["job"], {})
            figure = (yes_no(meets.get("meets")) if r["target"] == MAPPED else "",)
        rows.append((
            r["job"], r["target"], fmt(r["ops_per_s"]), fmt(r["seconds"], 3),
            us(lat.get("p50")), us(lat.get("p99")), fmt(r.get("cpu_busy_pct")), us(cpu),
            fmt(r.get("steal_pct"), 1),
        ) + tuple(fmt_ratio(ratio.get(f"vs_{c}")) for c in cols) + figure)
    return rows


def print_rows(head, rows):
    """A table: the job name once per group of targets; failure texts span the
    numeric columns instead of widening them."""
    full = [head] + [r for r in rows if len(r) == len(head)]
    widths = [max(len(r[i]) for r in full) for i in range(len(head))]
    for i in (0, 1):
        widths[i] = max([widths[i]] + [len(r[i]) for r in rows])

    def line(row, shown_job):
        left = f"{shown_job:<{widths[0]}}  {row[1]:<{widths[1]}}"
        if len(row) == 3 and row[2].startswith("FAILED"):
            return f"{left}  {row[2]}"
        right = "  ".join(f"{v:>{w}}" for v, w in zip(row[2:], widths[2:]))
        return f"{left}  {right}".rstrip()

    print()
    print(line(head, head[0]))
    previous = None
    for row in rows:
        print(line(row, row[0] if row[0] != previous else ""))
        previous = row[0]
    print()


def print_bar(doc):
    """One paragraph on the bar: where rmemfs met it, missed it, or could not be
    told, with the ratios of the misses."""
    if "bound" not in data_columns(doc) or not any(b["in_bar"]
                                                  for b in doc["bounds"].values()):
        return
    bar, bounds = doc["bar"], doc["bounds"]

    def listed(jobs, key):
        return ", ".join(f"{j} {fmt_ratio(bounds[j][key])}" if bounds[j][key] is not None
                         else j for j in jobs)

    def line(part, what, key):
        n = sum(len(part[k]) for k in ("met", "missed", "unknown"))
        text = f"  rmemfs {what}: {len(part['met'])} of {n} job(s)"
        if part["missed"]:
            text += f"; below in {listed(part['missed'], key)}"
        if part["unknown"]:
            text += f"; no number for {', '.join(part['unknown'])}"
        return text

    ran = [j for j in BAR_JOBS if doc["bounds"].get(j, {}).get("in_bar")]
    print(f"The bar, reported and never judged, over the {len(ran)} of its "
          f"{len(BAR_JOBS)} jobs that ran ({', '.join(ran)}):")
    print(line(bar["bound"], f">= {BAR_BOUND:g}x its bound", "rmemfs_vs_bound"))
    if "sshfs" in doc["targets"]:
        text = line(bar["sshfs"], f">= {BAR_SSHFS:g}x sshfs where the bound is >= "
                    f"{BAR_SSHFS_IF:g}x sshfs", "rmemfs_vs_sshfs")
        if bar["sshfs"]["not_applicable"]:
            text += (f"; not applicable (bound below {BAR_SSHFS_IF:g}x sshfs) in "
                     f"{listed(bar['sshfs']['not_applicable'], 'bound_vs_sshfs')}")
        print(text)
    for job in bar["bound"]["missed"]:
        b = bounds[job]
        said = []
        if b.get("fabric_vs_nullfs") is not None:
            said.append(f"the fabric alone does {fmt_ratio(b['fabric_vs_nullfs'])} of nullfs")
        if b.get("rmemfs_vs_fabric") is not None:
            said.append(f"rmemfs {fmt_ratio(b['rmemfs_vs_fabric'])} of the fabric alone")
        if b.get("rmemfs_cpu_vs_fabric_plus_nullfs") is not None:
            said.append("a request costs rmemfs "
                        f"{fmt_ratio(b['rmemfs_cpu_vs_fabric_plus_nullfs'])} the CPU time "
                        "of the fabric's and nullfs's added")
        if said:
            print(f"  {job}: {'; '.join(said)}")
    for t in sorted({t for b in bounds.values() if b["in_bar"] for t in b["bound_missing"]}):
        jobs = [j for j, b in bounds.items() if b["in_bar"] and t in b["bound_missing"]]
        print(f"  {t} did not run or failed, so the bound of {', '.join(jobs)} leaves it "
              "out")


def print_table(doc):
    if not data_jobs(doc):
        return
    cols = data_columns(doc)
    head = ("job", "target", "MB/s", "IOPS", "p99 us", "busy%", "CPU us/req",
            "steal%") + tuple(cols)
    print_rows(head, table_rows(doc))
    print("MB/s = 10^6 bytes/s; p99 = 99th percentile completion latency of one request;")
    print(f"busy% = share of all {doc['machine']['cpus_online']} CPUs' time spent working "
          "during that run (every process")
    print("and the kernel; threads polling for an answer count as busy); CPU us/req = "
          "busy% x CPUs / IOPS,")
    print("the whole machine's CPU time per request (comparable across targets when "
          "their busy% is high);")
    print("steal% = CPU time the hypervisor took during that run (high: a noisy figure).")
    if doc["settings"].get("repeat", 1) > 1:
        print(f"Each row is the median of {doc['settings']['repeat']} runs by throughput "
              "(every run is in the JSON).")
    notes = []
    if "bound" in cols:
        notes.append("bound = rmemfs's bound: nullfs (FUSE over io_uring, no data: the ring "
                     "ceiling), for rand-read-4k and rand-read-4k-4jobs (which miss fsd's "
                     "cache) the lower of nullfs and the fabric alone; vs bound = rmemfs / "
                     "bound;")
    if "vs sshfs" in cols:
        notes.append("vs sshfs = rmemfs / sshfs;")
    if "bound/sshfs" in cols:
        notes.append("bound/sshfs = bound / sshfs;")
    if "vs classic" in cols:
        notes.append("vs classic = rmemfs / rmemfs-classic and nullfs / nullfs-classic "
                     "(what FUSE over io_uring gains);")
    if notes:
        notes.append("throughputs of the same bench run (>1: faster).")
    if "bound" in cols:
        notes.append(f"{BOUND_COL}: rmemfs >= {BAR_BOUND:g} x bound;")
        if SSHFS_COL in cols:
            notes.append(f"{SSHFS_COL}: rmemfs >= {BAR_SSHFS:g} x sshfs, n/a where the bound "
                         f"is below {BAR_SSHFS_IF:g}x sshfs;")
        notes.append("the bar's jobs only (not the in-cache one); - = a run missing.")
    if MAPPED_VS_BOUND_COL in cols or MAPPED_VS_TCP_COL in cols:
        notes.append(f"On {MAPPED}'s row (fsd over the mapped fabric, no fabric under it: "
                     f"its bound is {MAPPED_BOUND}, the ring ceiling, in every job):")
        if MAPPED_VS_BOUND_COL in cols:
            notes.append(f"{MAPPED_VS_BOUND_COL} = {MAPPED} / {MAPPED_BOUND};")
        if MAPPED_VS_TCP_COL in cols:
            notes.append(f"{MAPPED_VS_TCP_COL} = {MAPPED} / rmemfs (the tcp fabric): what "
                         "mapping gains;")
        if MAPPED_BAR_COL in cols:
            notes.append(f"{MAPPED_BAR_COL}: {MAPPED} >= {MAPPED_BAR:g} x {MAPPED_BOUND} "
                         "(issue 55's figure), every fio job.")
    if notes:
        print(textwrap.fill(" ".join(notes), width=92, break_on_hyphens=False))
    print_bar(doc)
    print_mapped_bar(doc, data_jobs(doc))


def print_cpu_parts(doc):
    """Where each fio job's CPU time went on the targets with a daemon: the rows of
    the bound analysis (what part of the machine's time per request is rmemfs's own,
    what is the memnode's, what is FUSE's and fio's)."""
    rows = []
    for r in doc["results"]:
        parts = r.get("cpu_us_per_request_parts")
        if r["status"] != "ok" or not parts or is_metadata(doc, r["job"]) \
                or is_copy(doc, r["job"]):
            continue
        total = r.get("cpu_us_per_request")
        known = [parts.get(k) for k in ("daemon_user", "daemon_sys", "memnode")]
        rest = total - sum(v for v in known if v) if total is not None else None

        def us(v):
            return fmt(v, 2 if v is not None and v < 10 else 1 if v is not None and v < 100
                       else 0)

        rows.append((r["job"], r["target"], us(total)) + tuple(us(v) for v in known)
                    + (us(rest),))
    if not rows:
        return
    print("Where the CPU time of a request went (us per request):")
    print_rows(("job", "target", "all", "daemon usr", "daemon sys", "memnode", "rest"),
               rows)
    print(textwrap.fill(
        "all = CPU us/req above; daemon = the target's fsd or nullfs (fabric: fabricbench "
        "is in rest), in user and kernel mode; memnode = the memnode it reads and writes, "
        f"both modes ({MAPPED}: the memnode serves its control alone, fsd copies the data "
        "itself); rest = all - the others: fio (or fabricbench), the kernel's FUSE, "
        "network and softirq work on their behalf, everything else. From each "
        "process's clock ticks over the run, as busy% is.", width=92,
        break_on_hyphens=False))
    print()


def print_meta_table(doc):
    if not doc.get("metadata_jobs"):
        return
    cols = meta_columns(doc)
    head = ("job", "target", "files/s", "seconds", "p50 us", "p99 us", "busy%",
            "CPU us/op", "steal%") + tuple(f"vs {c}" for c in cols)
    if meta_bar_column(doc):
        head += (MAPPED_BAR_COL,)
    print_rows(head, meta_rows(doc))
    print("Metadata jobs, one process, one file at a time: files/s = files created "
          "(create: open, write of")
    print("1-4 KiB, close), stat'd (stat: stats/s), unlinked (unlink) or extracted "
          "(untar) per second of the")
    print("timed seconds; p50/p99 = percentiles of one file's system calls (untar: none, "
          "one tar run);")
    print("busy% and steal% over the timed seconds; CPU us/op = busy% x CPUs / files/s.")
    if doc["settings"].get("repeat", 1) > 1:
        print(f"Each row is the median of {doc['settings']['repeat']} runs by files/s.")
    if cols:
        print("vs X = rmemfs (or rmemfs-vol, rmemfs-mapped) files/s / X files/s in the same "
              "bench run (>1: faster);")
        if "classic" in cols:
            print("vs classic = rmemfs / rmemfs-classic and nullfs / nullfs-classic: what "
                  "FUSE over io_uring gains;")
        if "rmemfs" in cols and VOLUME in doc["targets"]:
            print("rmemfs-vol's vs rmemfs = durable volume / scratch mount: below 1, "
                  "what durable metadata costs;")
        if "rmemfs" in cols and MAPPED in doc["targets"]:
            print(f"{MAPPED}'s vs rmemfs = the mapped fabric / the tcp fabric: what mapping "
                  "gains;")
    if meta_bar_column(doc):
        print(f"{MAPPED_BAR_COL}: {MAPPED} >= {MAPPED_BAR:g} x {MAPPED_BOUND} "
              "(issue 55's figure), on its row.")
    print_mapped_bar(doc, doc["metadata_jobs"])


def copy_columns(doc):
    """The ratio columns of the copy table this run can fill: copy-range over copy-rw
    (each target's copy-range row), rmemfs over the copy baselines and over
    rmemfs-classic (rmemfs's rows)."""
    t, jobs = doc["targets"], doc.get("copy_jobs") or []
    cols = []
    if COPY_RANGE in jobs and COPY_RW in jobs:
        cols.append("range/rw")
    if "rmemfs" in t:
        cols += [f"vs {b}" for b in COPY_BASELINES if b in t]
        if "rmemfs-classic" in t:
            cols.append("vs classic")
    return cols


def copy_rows(doc):
    """One row of cells per copy result, as table_rows."""
    cols = copy_columns(doc)
    rows = []
    for r in doc["results"]:
        if not is_copy(doc, r["job"]):
            continue
        if r["status"] != "ok":
            rows.append((r["job"], r["target"], "FAILED: " + r["status"]))
            continue
        ratio = {}
        if r["job"] == COPY_RANGE:
            ratio["range/rw"] = doc["copy_range_vs_rw"].get(r["target"])
        if r["target"] == "rmemfs":
            mine = doc["ratios"].get(r["job"], {})
            for b in COPY_BASELINES:
                ratio[f"vs {b}"] = mine.get(f"vs_{b}")
            ratio["vs classic"] = doc["transport_gains"].get(r["job"], {}).get("rmemfs")
        cpu = r.get("cpu_s_per_gb")
        rows.append((
            r["job"], r["target"], fmt(r["mb_per_s"], 1 if r["mb_per_s"] < 100 else 0),
            fmt(r["seconds"], 3), fmt(r.get("ops")), fmt(r.get("cpu_busy_pct")),
            fmt(cpu, 2), fmt(r.get("steal_pct"), 1),
        ) + tuple(fmt_ratio(ratio.get(c)) for c in cols))
    return rows


def print_copy_table(doc):
    if not doc.get("copy_jobs"):
        return
    cols = copy_columns(doc)
    head = ("job", "target", "MB/s", "seconds", "calls", "busy%", "CPU s/GB",
            "steal%") + tuple(cols)
    print_rows(head, copy_rows(doc))
    s = doc["settings"]
    notes = [
        f"Copy jobs, one process: a file of {s.get('copy_size')} copied with a "
        "copy_file_range(2) loop, as newer cp (copy-range), or with 1 MiB read(2)/write(2), "
        "as Debian 12's cp 9.1 (copy-rw); MB/s = 10^6 bytes/s and seconds = the time of "
        "the copy and an fsync of it; calls = copy_file_range calls or read/write pairs;",
        "each copy read back equal to its source (sha256) afterwards; busy% and steal% "
        "over the timed seconds; CPU s/GB = busy% x CPUs / GB/s.",
    ]
    if doc["settings"].get("repeat", 1) > 1:
        notes.append(f"Each row is the median of {s['repeat']} runs by MB/s.")
    if "range/rw" in cols:
        notes.append("range/rw = copy-range / copy-rw on that target: what "
                     "copy_file_range gives there (rmemfs: the memnodes copy whole blocks "
                     "in their own memory);")
    if any(c.startswith("vs ") for c in cols):
        notes.append("vs X = rmemfs / X in the same job of the same bench run (>1: "
                     "faster)" + ("; vs classic = rmemfs / rmemfs-classic." if "vs classic"
                                  in cols else "."))
    print(textwrap.fill(" ".join(notes), width=92, break_on_hyphens=False))
    by = {(r["job"], r["target"]): r for r in doc["results"]}
    for t in ("rmemfs", "rmemfs-classic"):
        a, b = by.get((COPY_RANGE, t)), by.get((COPY_RW, t))
        speedup = doc["copy_range_vs_rw"].get(t)
        if speedup is None:
            continue
        text = (f"{t}: copy-range {fmt(a['mb_per_s'])} MB/s against copy-rw "
                f"{fmt(b['mb_per_s'])} MB/s: {fmt_ratio(speedup)}")
        traffic = a.get("fsd_traffic") or {}
        if "memnode_copy_bytes" in traffic and traffic.get("file_copy_bytes"):
            n = traffic.get("file_copies") or 0
            text += (f"; fsd copied {mib(traffic['file_copy_bytes'])} in {n} "
                     f"copy_file_range request{'' if n == 1 else 's'}, the memnodes "
                     f"{mib(traffic['memnode_copy_bytes'])} in their own memory "
                     "(fsd's file_copy_bytes, memnode_copy_bytes)")
        print(text)


def print_memory(doc):
    for target in RMEMFS_TARGETS:
        peaks = [r.get("fsd_peak_rss_bytes") for r in doc["results"]
                 if r["target"] == target and r.get("fsd_peak_rss_bytes")]
        if peaks:
            print(f"{target}: fsd peak RSS {mib(max(peaks))} with --cache "
                  f"{doc['settings'].get('cache')}"
                  + (" (with the pages of the memnode's region it touched through its "
                     "mapping, which the memnode holds too)" if target == MAPPED else ""))


def read_amplification(traffic):
    """Bytes fsd read from remote memory per byte it returned to read requests, both
    counted by fsd over the same interval (1.0 when every remote byte read was asked
    for; reads the kernel's page cache answers never reach fsd and count in neither).
    None when fsd returned nothing or the counters are missing."""
    served = traffic.get("file_read_bytes")
    if not served:
        return None
    return traffic.get("remote_read_bytes", 0) / served


def print_traffic(doc):
    """Remote operations fsd made during each rmemfs (rmemfs-classic, rmemfs-vol) job
    (`waited`: chunk allocations a write had to wait for, i.e. control round trips on
    the write path), the bytes fsd returned to reads (`MiB served`: those the page
    cache did not answer), the read amplification (see read_amplification) and the
    FUSE requests the io_uring transport answered (`ring reqs`: 0 on /dev/fuse)."""
    rows = [r for r in doc["results"]
            if r["target"] in RMEMFS_TARGETS and r.get("fsd_traffic")]
    if not rows:
        return
    block = rows[0]["fsd_traffic"].get("block_size")
    print(f"\nfsd remote traffic per job (block size {block // 1024 if block else '?'} KiB):")
    print(f"{'job':<22}{'target':<16}{'READs':>10}{'MiB read':>10}{'WRITEs':>10}"
          f"{'MiB written':>12}{'allocs':>8}{'waited':>8}{'cache hit%':>11}"
          f"{'MiB served':>11}{'read ampl.':>11}{'ring reqs':>11}")
    for r in rows:
        t = r["fsd_traffic"]
        lookups = t.get("cache_hits", 0) + t.get("cache_misses", 0)
        hit = f"{100.0 * t.get('cache_hits', 0) / lookups:.0f}" if lookups else "-"
        ampl = read_amplification(t)
        ampl = "-" if ampl is None else f"{ampl:.2f}"
        ring = t.get("fuse_ring_requests")
        ring = "-" if ring is None else str(ring)
        print(f"{r['job']:<22}{r['target']:<16}{t.get('remote_reads', 0):>10}"
              f"{t.get('remote_read_bytes', 0) / 2**20:>10.0f}{t.get('remote_writes', 0):>10}"
              f"{t.get('remote_write_bytes', 0) / 2**20:>12.0f}{t.get('chunk_allocs', 0):>8}"
              f"{t.get('chunk_allocs_waited', 0):>8}{hit:>11}"
              f"{t.get('file_read_bytes', 0) / 2**20:>11.0f}{ampl:>11}{ring:>11}")


def ratio_labels(doc, job):
    """What the chart prints under a job's name, as one quoted column per ratio this
    run has (empty ones last): for a fio job rmemfs over its bound, over sshfs and
    over rmemfs-classic, and nullfs over nullfs-classic; for a metadata job rmemfs
    over tmpfs, sshfs, nullfs and rmemfs-classic, rmemfs-vol over rmemfs, and nullfs
    over nullfs-classic; for both, rmemfs-mapped over nullfs; for a copy job rmemfs's
    copy-range over its copy-rw (copy-range only) and rmemfs over tmpfs, sshfs and
    rmemfs-classic."""
    t = doc["targets"]
    gains = doc["transport_gains"].get(job, {})
    groups = []
    if is_copy(doc, job):
        if "rmemfs" in t:
            ratio = doc["ratios"].get(job, {})
            speedup = doc["copy_range_vs_rw"].get("rmemfs") if job == COPY_RANGE else None
            mine = [None if speedup is None else f"{fmt_ratio(speedup)} rw"]
            mine += [f"{fmt_ratio(ratio[f'vs_{b}'])} {b}" if f"vs_{b}" in ratio else None
                     for b in COPY_BASELINES if b in t]
            if "rmemfs-classic" in t:
                mine.append(f"{fmt_ratio(gains['rmemfs'])} classic" if "rmemfs" in gains
                            else None)
            groups.append(("rmemfs: ", mine))
    elif is_metadata(doc, job):
        ratio = doc["ratios"].get(job, {})
        if "rmemfs" in t:
            cells = [(f"vs_{b}", b) for b in ("tmpfs", "sshfs", "nullfs") if b in t]
            mine = [f"{fmt_ratio(ratio[k])} {b}" if k in ratio else None for k, b in cells]
            if "rmemfs-classic" in t:
                mine.append(f"{fmt_ratio(gains['rmemfs'])} classic" if "rmemfs" in gains
                            else None)
            groups.append(("rmemfs: ", mine))
        if VOLUME in t and "rmemfs" in t:
            vol = doc["volume_ratios"].get(job, {}).get("vs_rmemfs")
            groups.append(("vol: ", [None if vol is None else f"{fmt_ratio(vol)} rmemfs"]))
    elif "rmemfs" in t:
        b = doc["bounds"].get(job, {})
        mine = []
        if "nullfs" in t or "fabric" in t:
            v = b.get("rmemfs_vs_bound")
            mine.append(None if v is None else f"{fmt_ratio(v)} bound")
        if "sshfs" in t:
            v = b.get("rmemfs_vs_sshfs")
            mine.append(None if v is None else f"{fmt_ratio(v)} sshfs")
        if "rmemfs-classic" in t:
            mine.append(f"{fmt_ratio(gains['rmemfs'])} classic" if "rmemfs" in gains
                        else None)
        groups.append(("rmemfs: ", mine))
    if MAPPED in t and MAPPED_BOUND in t and not is_copy(doc, job):
        v = doc["mapped_ratios"].get(job, {}).get(f"vs_{MAPPED_BOUND}")
        groups.append(("mapped: ", [None if v is None
                                    else f"{fmt_ratio(v)} {MAPPED_BOUND}"]))
    if "nullfs" in t and "nullfs-classic" in t and not is_copy(doc, job):
        groups.append(("nullfs: ", [f"{fmt_ratio(gains['nullfs'])} classic"
                                    if "nullfs" in gains else None]))
    labels, slots = [], 0
    for prefix, cells in groups:
        slots += len(cells)
        shown = [c for c in cells if c]
        if shown:
            shown[0] = prefix + shown[0]
        labels += shown
    labels += [""] * (slots - len(labels))
    return slots, " ".join(f'"{label}"' for label in labels)


def gp_string(text):
    """A gnuplot single-quoted string (a quote doubled inside)."""
    return "'" + str(text).replace("'", "''") + "'"


def write_chart(doc, chart, script, data_dir):
    """Two panels per kind of job that ran, throughput and latency, one bar per
    target in each job group: MB/s and p99 for the fio jobs, files/s and p99 for the
    metadata jobs (rmemfs-vol only there, the fabric only in the fio ones); one panel,
    MB/s, for the copy jobs (on the targets that run them)."""
    # A chart of an earlier run must not pass for this one's.
    if os.path.exists(chart):
        os.remove(chart)
    by = {(r["job"], r["target"]): r for r in doc["results"]}
    kinds = [
        ("data", data_jobs(doc), [t for t in doc["targets"] if t != VOLUME],
         [("bw", "throughput, MB/s (higher is better)",
           lambda r: r["mb_per_s"]),
          ("lat", "p99 latency, us (lower is better)",
           lambda r: r["lat_us"]["p99"])]),
        ("meta", doc.get("metadata_jobs") or [], [t for t in doc["targets"] if t != "fabric"],
         [("bw", "metadata jobs: files/s (stat: stats/s; higher is better)",
           lambda r: r["ops_per_s"]),
          ("lat", "metadata jobs: p99 latency of one file's system calls, us (lower is "
           "better)",
           lambda r: (r.get("lat_us") or {}).get("p99"))]),
        ("copy", doc.get("copy_jobs") or [], [t for t in doc["targets"] if t in COPY_TARGETS],
         [("bw", "copy jobs: MB/s of one file copied and fsync'ed (higher is better)",
           lambda r: r["mb_per_s"])]),
    ]
    panels = []
    for kind, all_jobs, targets, measures in kinds:
        for which, title, get in measures:
            # untar has no latency of its own (one tar run): no empty group for it.
            jobs = [j for j in all_jobs if not (kind == "meta" and which == "lat" and
                                                 j == "untar")]
            if not jobs:
                continue
            path = os.path.join(data_dir, f"chart-{kind}-{which}.dat")
            values = []
            slots = 0
            with open(path, "w", encoding="utf-8") as f:
                lines = []
                for job in jobs:
                    cells = []
                    for t in targets:
                        r = by.get((job, t))
                        v = get(r) if r and r["status"] == "ok" else None
                        if v is not None and v > 0:
                            values.append(v)
                        cells.append(f"{v:.6g}" if v else "-")
                    slots, labels = ratio_labels(doc, job)
                    lines.append(" ".join([job] + cells + [labels]).rstrip())
                f.write(" ".join(["job"] + targets + [f"r{i}" for i in range(slots)]) + "\n")
                f.write("\n".join(lines) + "\n")
            if not values:
                continue
            # Log scale once bars differ by more than 20x: tmpfs would flatten the rest.
            scale = "log" if max(values) / min(values) > 20 else "linear"
            panels.append({"file": path, "title": title, "n": len(targets),
                           "colors": " ".join(COLORS.get(t, "#000000") for t in targets),
                           "scale": scale, "m": slots, "labels": int(which == "bw")})
    if not panels:
        print(f"report: no run succeeded, so no chart ({chart})", file=sys.stderr)
        return False
    s = doc["settings"]
    parts = []
    if data_jobs(doc):
        parts.append(f"fio psync, {s.get('runtime_s')} s per job, file {s.get('size')}")
    meta = doc.get("metadata_jobs") or []
    if any(j in meta for j in ("create", "stat", "unlink")):
        parts.append(f"{fmt(s.get('meta_files'))} small files")
    if "untar" in meta:
        parts.append(f"untar of {fmt(s.get('untar_files'))} files")
    if doc.get("copy_jobs"):
        parts.append(f"copy of {s.get('copy_size')}")
    title = (f"rmemfs vs baselines: {'; '.join(parts)}; fsd cache {s.get('cache')}, block "
             f"{s.get('block_size')}; {doc['machine']['nproc']} CPUs, {doc['date'][:10]}")
    params = os.path.join(data_dir, "chart-params.gp")
    with open(params, "w", encoding="utf-8") as f:
        f.write(f"png = {gp_string(chart)}\ntitle = {gp_string(title)}\n"
                f"npanels = {len(panels)}\n")
        for i, p in enumerate(panels, 1):
            for key, value in p.items():
                text = gp_string(value) if isinstance(value, str) else str(value)
                f.write(f"p{i}_{key} = {text}\n")
    if subprocess.run(["gnuplot", "-c", script, params], check=False).returncode != 0:
        print(f"report: gnuplot failed to draw {chart} from {data_dir}", file=sys.stderr)
        return False
    return True


def main():
    args = parse_args()
    jobs = args.jobs.split(",")
    targets = args.targets.split(",")
    metadata_jobs = [j for j in jobs if j in (args.metadata_jobs or "").split(",")]
    copy_jobs = [j for j in jobs if j in (args.copy_jobs or "").split(",")]
    rows = read_manifest(args.manifest)
    cpus = online_cpus()
    every_run = [measure(row, cpus) for row in rows]
    results = median_runs(every_run)
    settings = {}
    for item in args.setting:
        key, _, value = item.partition("=")
        settings[key] = number_or_text(value)
    now = time.time()
    doc = {
        "schema": 1,
        "date": datetime.datetime.fromtimestamp(args.started, datetime.timezone.utc)
        .isoformat(timespec="seconds"),
        "wall_time_s": round(now - args.started, 1),
        "machine": dict(machine(), cpus_online=cpus),
        "loadavg_start": args.loadavg_start,
        "loadavg_end": " ".join(read_file("/proc/loadavg").split()[:3]),
        "cpu_busy_before_pct": args.busy_start,
        "cpu_steal_pct": steal_pct(args.stat_start),
        "settings": settings,
        "fsd_extra_args": args.fsd_arg,
        "fio_extra_args": args.fio_arg,
        "jobs": jobs,
        "metadata_jobs": metadata_jobs,
        "copy_jobs": copy_jobs,
        "targets": targets,
        "results": results,
        "fuse_transports": dict(t.partition("=")[::2] for t in args.transport),
        "fsd_fabrics": dict(t.partition("=")[::2] for t in args.fabric),
        "ratios": ratios(results, jobs),
        "volume_ratios": ratios(results, metadata_jobs, VOLUME,
                                ("rmemfs",) + tuple(b for b in BASELINES if b != "fabric")),
        "transport_gains": transport_gains(results, jobs),
        "bounds": bounds(results, [j for j in jobs if j not in metadata_jobs + copy_jobs],
                         targets),
        "copy_range_vs_rw": copy_speedups(results, targets),
        "mapped_ratios": ratios(results, [j for j in jobs if j not in copy_jobs], MAPPED,
                                MAPPED_BASELINES),
    }
    doc["bar"] = bar_summary(doc)
    doc["mapped_bar"] = mapped_summary(doc)
    print_header(doc)
    print_table(doc)
    print_cpu_parts(doc)
    print_meta_table(doc)
    print_copy_table(doc)
    print_memory(doc)
    print_traffic(doc)
    os.makedirs(os.path.dirname(os.path.abspath(args.out_json)), exist_ok=True)
    with open(args.out_json, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    shutil.copyfile(args.out_json, args.latest)
    drawn = write_chart(doc, args.chart, args.chart_script, args.chart_data_dir)
    failed = [f"{r['job']} on {r['target']} (round {r['round']})"
              for r in every_run if r["status"] != "ok"]
    if failed:
        print(f"report: {len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 0 if drawn and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
