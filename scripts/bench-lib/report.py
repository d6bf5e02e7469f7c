#!/usr/bin/env python3
"""Turns the fio outputs of one scripts/bench run into its table, JSON and chart.

scripts/bench runs every (job, target) pair, once per round (--repeat), and lists
the runs in a manifest, one tab-separated line each:

    job  target  status  fio-json-path  fsd-peak-rss-kib  fsd-rss-kib  memnode-rss-kib
    fsd-stats-before  fsd-stats-after  round  steal-pct  busy-pct

(status "ok" or a short failure text; the memory and stats columns are "-" except for
rmemfs; steal-pct is the share of CPU time the hypervisor took during that run and
busy-pct the share that went to work on this machine, all CPUs together). The
fabric target's outputs are fabricbench's, in the part of fio's JSON read here.
This script reads those fio outputs, keeps for each (job, target) its median run by
throughput, prints the run's settings and one table (MB/s,
IOPS, p99 latency, the CPU time the whole machine spent per request, and rmemfs's
throughput divided by each baseline's: tmpfs, the
local-memory ceiling; sshfs to a tmpfs; nullfs, a FUSE filesystem that keeps no data,
the FUSE ceiling; fabric, the fabric alone with no FUSE, what the network allows),
writes all of it as JSON, and draws a bar chart with gnuplot. Any
subset of the targets works (scripts/bench --only). It reports; it never judges
timings.
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
import time

# What rmemfs is divided by, in the order of the table's and the chart's ratios.
BASELINES = ("tmpfs", "sshfs", "nullfs", "fabric")
COLORS = {"rmemfs": "#d95f02", "tmpfs": "#7f7f7f", "sshfs": "#1f78b4", "nullfs": "#33a02c",
          "fabric": "#6a3d9a"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manifest", required=True)
    p.add_argument("--jobs", required=True, help="comma-separated, in matrix order")
    p.add_argument("--targets", required=True, help="comma-separated")
    p.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                   help="a run setting to record (numbers become numbers)")
    p.add_argument("--fsd-arg", action="append", default=[],
                   help="an extra flag passed to fsd, recorded as is")
    p.add_argument("--fio-arg", action="append", default=[],
                   help="an extra option given to every fio run, recorded as is")
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


def pct_or_none(text):
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
            (job, target, status, fio_json, hwm, rss, mn_rss, stats_before,
             stats_after, round_, steal, busy) = line.split("\t")
            rows.append({
                "job": job, "target": target, "status": status, "fio_json": fio_json,
                "fsd_peak_rss_kib": hwm, "fsd_rss_kib": rss, "memnode_rss_kib": mn_rss,
                "stats_before": stats_before, "stats_after": stats_after,
                "round": int(round_), "steal_pct": pct_or_none(steal),
                "busy_pct": pct_or_none(busy),
            })
    return rows


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
    if row["target"] == "rmemfs":
        result["fsd_peak_rss_bytes"] = kib_to_bytes(row["fsd_peak_rss_kib"])
        result["fsd_rss_bytes"] = kib_to_bytes(row["fsd_rss_kib"])
        result["memnode_rss_bytes"] = kib_to_bytes(row["memnode_rss_kib"])
        result["fsd_traffic"] = fsd_traffic(row)
    if row["status"] != "ok":
        return result
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
    })
    return result


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
        ok = sorted((r for r in runs if r["status"] == "ok"), key=lambda r: r["bw_bytes_per_s"])
        pick = dict(ok[(len(ok) - 1) // 2] if ok else runs[-1])
        pick["runs"] = [{k: r.get(k) for k in ("round", "status", "bw_bytes_per_s", "iops",
                                                "steal_pct", "cpu_busy_pct",
                                                "cpu_us_per_request", "fio_output")}
                        for r in runs]
        chosen.append(pick)
    return chosen


def ratios(results, jobs):
    """rmemfs throughput divided by each baseline's, per job (>1: rmemfs is faster)."""
    by = {(r["job"], r["target"]): r for r in results}
    out = {}
    for job in jobs:
        mine = by.get((job, "rmemfs"))
        if not mine or mine["status"] != "ok":
            continue
        for base in BASELINES:
            other = by.get((job, base))
            if other and other["status"] == "ok" and other["bw_bytes_per_s"] > 0:
                out.setdefault(job, {})[f"vs_{base}"] = (
                    mine["bw_bytes_per_s"] / other["bw_bytes_per_s"])
    return out


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
    print(f"rmemfs benchmark, {doc['date']}, git {s.get('git')}, wall time "
          f"{doc['wall_time_s']:.0f} s")
    print(f"  machine: {m['nproc']} CPUs ({m['cpu_model']}), {mib(m['memory_bytes'])}, "
          f"kernel {m['kernel']}, {m['os']}")
    print(f"  CPUs busy before the run: {fmt(doc['cpu_busy_before_pct'])}%; stolen by the "
          f"hypervisor during it: {fmt(doc['cpu_steal_pct'], 1)}%; load average at start "
          f"{doc['loadavg_start'] or '-'}, at end {doc['loadavg_end']}")
    if "rmemfs" in doc["targets"]:
        extra = " ".join(doc["fsd_extra_args"])
        print(f"  rmemfs: {s.get('memnodes')} memnode on 127.0.0.1, {s.get('fabric')} fabric, "
              f"{mib(s.get('memnode_size_bytes'))}; fsd --cache {s.get('cache')} "
              f"--block-size {s.get('block_size')}{' ' + extra if extra else ''}")
    if "nullfs" in doc["targets"]:
        threads = s.get("nullfs_threads")
        threads = ("its default --threads" if threads in (None, "default")
                   else f"--threads {threads}")
        print(f"  nullfs: no data, fsd's FUSE settings, {threads}")
    if "fabric" in doc["targets"]:
        print(f"  fabric: fabricbench to the memnode, {s.get('fabric')}, jobs shaped like "
              f"fio's (block size, jobs; one block at a time per job), operations of up to "
              f"{s.get('block_size')}, --poll-us {s.get('fabric_poll_us')}")
    print(f"  fio: {s.get('ioengine')}, {s.get('runtime_s')} s per job after a "
          f"{s.get('ramp_s')} s ramp, file {s.get('size')}, in-cache file "
          f"{s.get('incache_size')}, page cache dropped before each run: "
          f"{'yes' if s.get('drop_caches') is True else 'no'}")
    if doc["fio_extra_args"]:
        print(f"  extra fio options: {' '.join(doc['fio_extra_args'])}")
    versions = [s[k] for k in ("fsd_version", "nullfs_version", "fabricbench_version",
                               "fio_version", "sshfs_version", "sshd_version") if k in s]
    print(f"  versions: {'; '.join(str(v) for v in versions)}")


def compared_baselines(doc):
    """The baselines rmemfs is divided by in this run (none without rmemfs)."""
    if "rmemfs" not in doc["targets"]:
        return []
    return [b for b in BASELINES if b in doc["targets"]]


def table_rows(doc):
    """One row of cells per result; a failed run has its status instead of numbers."""
    bases = compared_baselines(doc)
    rows = []
    for r in doc["results"]:
        if r["status"] != "ok":
            rows.append((r["job"], r["target"], "FAILED: " + r["status"]))
            continue
        ratio = doc["ratios"].get(r["job"], {}) if r["target"] == "rmemfs" else {}
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
        ) + tuple(fmt_ratio(ratio.get(f"vs_{b}")) for b in bases))
    return rows


def print_table(doc):
    bases = compared_baselines(doc)
    head = ("job", "target", "MB/s", "IOPS", "p99 us", "busy%", "CPU us/req",
            "steal%") + tuple(f"vs {b}" for b in bases)
    rows = table_rows(doc)
    # Failure texts span the numeric columns instead of widening them.
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
        # The job name once per group of targets.
        print(line(row, row[0] if row[0] != previous else ""))
        previous = row[0]
    print()
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
    if bases:
        print("vs X = rmemfs throughput / X throughput in the same bench run "
              "(>1: rmemfs faster).")


def print_memory(doc):
    peaks = [r.get("fsd_peak_rss_bytes") for r in doc["results"]
             if r["target"] == "rmemfs" and r.get("fsd_peak_rss_bytes")]
    if peaks:
        print(f"fsd peak RSS {mib(max(peaks))} with --cache {doc['settings'].get('cache')}")


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
    """Remote operations fsd made during each rmemfs job (`waited`: chunk allocations
    a write had to wait for, i.e. control round trips on the write path), the bytes
    fsd returned to reads (`MiB served`: those the page cache did not answer) and the
    read amplification (see read_amplification)."""
    rows = [r for r in doc["results"] if r["target"] == "rmemfs" and r.get("fsd_traffic")]
    if not rows:
        return
    block = rows[0]["fsd_traffic"].get("block_size")
    print(f"\nfsd remote traffic per job (block size {block // 1024 if block else '?'} KiB):")
    print(f"{'job':<22}{'READs':>10}{'MiB read':>10}{'WRITEs':>10}{'MiB written':>12}"
          f"{'allocs':>8}{'waited':>8}{'cache hit%':>11}{'MiB served':>11}{'read ampl.':>11}")
    for r in rows:
        t = r["fsd_traffic"]
        lookups = t.get("cache_hits", 0) + t.get("cache_misses", 0)
        hit = f"{100.0 * t.get('cache_hits', 0) / lookups:.0f}" if lookups else "-"
        ampl = read_amplification(t)
        ampl = "-" if ampl is None else f"{ampl:.2f}"
        print(f"{r['job']:<22}{t.get('remote_reads', 0):>10}"
              f"{t.get('remote_read_bytes', 0) / 2**20:>10.0f}{t.get('remote_writes', 0):>10}"
              f"{t.get('remote_write_bytes', 0) / 2**20:>12.0f}{t.get('chunk_allocs', 0):>8}"
              f"{t.get('chunk_allocs_waited', 0):>8}{hit:>11}"
              f"{t.get('file_read_bytes', 0) / 2**20:>11.0f}{ampl:>11}")


def ratio_labels(doc, job):
    """What the chart prints under a job's name: rmemfs's throughput over each
    baseline's, as one quoted column per compared baseline (empty ones last; none
    without rmemfs)."""
    bases = compared_baselines(doc)
    ratio = doc["ratios"].get(job, {})
    labels = [f"{fmt_ratio(ratio[f'vs_{b}'])} {b}" for b in bases if f"vs_{b}" in ratio]
    if labels:
        labels[0] = "rmemfs: " + labels[0]
    labels += [""] * (len(bases) - len(labels))
    return " ".join(f'"{label}"' for label in labels)


def write_chart(doc, chart, script, data_dir):
    """Two panels, throughput and p99 latency, one bar per target in each job group."""
    # A chart of an earlier run must not pass for this one's.
    if os.path.exists(chart):
        os.remove(chart)
    targets = doc["targets"]
    by = {(r["job"], r["target"]): r for r in doc["results"]}
    files = {"bw": os.path.join(data_dir, "chart-throughput.dat"),
             "lat": os.path.join(data_dir, "chart-p99.dat")}
    values = {"bw": [], "lat": []}
    for kind, path in files.items():
        with open(path, "w", encoding="utf-8") as f:
            f.write(" ".join(["job"] + targets +
                             [f"vs_{b}" for b in compared_baselines(doc)]) + "\n")
            for job in doc["jobs"]:
                cells = []
                for t in targets:
                    r = by.get((job, t))
                    v = None
                    if r and r["status"] == "ok":
                        v = r["mb_per_s"] if kind == "bw" else r["lat_us"]["p99"]
                    if v is not None and v > 0:
                        values[kind].append(v)
                    cells.append(f"{v:.6g}" if v else "-")
                f.write(" ".join([job] + cells + [ratio_labels(doc, job)]).rstrip() + "\n")

    def scale(vals):
        # Log scale once bars differ by more than 20x: tmpfs would flatten the rest.
        return "log" if vals and max(vals) / min(vals) > 20 else "linear"

    s = doc["settings"]
    title = (f"rmemfs vs baselines: fio psync, {s.get('runtime_s')} s per job, file "
             f"{s.get('size')}, fsd cache {s.get('cache')}, block {s.get('block_size')}; "
             f"{doc['machine']['nproc']} CPUs, {doc['date'][:10]}")
    colors = " ".join(COLORS.get(t, "#000000") for t in targets)
    if not values["bw"] or not values["lat"]:
        print(f"report: no run succeeded, so no chart ({chart})", file=sys.stderr)
        return False
    cmd = ["gnuplot", "-c", script, chart, files["bw"], files["lat"], str(len(targets)),
           colors, scale(values["bw"]), scale(values["lat"]), title,
           str(len(compared_baselines(doc)))]
    if subprocess.run(cmd, check=False).returncode != 0:
        print(f"report: gnuplot failed to draw {chart} from {data_dir}", file=sys.stderr)
        return False
    return True


def main():
    args = parse_args()
    jobs = args.jobs.split(",")
    targets = args.targets.split(",")
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
        "targets": targets,
        "results": results,
        "ratios": ratios(results, jobs),
    }
    print_header(doc)
    print_table(doc)
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
