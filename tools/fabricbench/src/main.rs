//! `fabricbench --memnode HOST:PORT --rw read|write|randread|randwrite --bs SIZE ...`:
//! the fabric alone, for the benchmark. It allocates remote memory on a memnode as fsd
//! does, lays it out, then runs jobs shaped like fio's psync jobs (one block at a time
//! per job, each job on its own connection) with one-sided READs or WRITEs and nothing
//! else: no FUSE, no cache, no file. So `scripts/bench` can show, in the same run,
//! what the fabric itself gives on this host (over tcp on loopback: what the kernel's
//! TCP costs on the CPUs the filesystem shares) beside what FUSE gives (nullfs).
//!
//! Every READ is checked (the block's tag), and remote memory is verified at the end,
//! so a fast number is never a number for data that did not move. The result goes out
//! in the part of fio's JSON that the bench reads (see [`summary`]).

mod job;
mod pattern;
mod summary;

use anyhow::{bail, Context};
use clap::{Parser, ValueEnum};
use job::Shape;
use pattern::Access;
use rmemfs_common::control;
use rmemfs_common::fabric::{self, Endpoint, RemoteAddr, Transport, MAX_DATA_OP};
use rmemfs_common::protocol::Allocation;
use rmemfs_common::size::parse_size;
use rmemfs_common::sync::lock;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use summary::Summary;

/// Deadline of each fabric operation and of connection setup.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Blocks read back and compared in full after the jobs (plus the first and last).
const VERIFY_SAMPLES: u64 = 64;
/// Bytes per batch while laying the allocation out.
const LAYOUT_BATCH: usize = 1 << 20;

/// How the jobs access remote memory (fio's rw names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Rw {
    Read,
    Write,
    Randread,
    Randwrite,
}

/// One-sided READs or WRITEs against a memnode, shaped like fio jobs: the fabric
/// alone, for benchmarks.
#[derive(Debug, Parser)]
#[command(name = "fabricbench", version)]
struct Options {
    /// The memnode (HOST:PORT).
    #[arg(long)]
    memnode: String,
    /// Fabric: verbs (RDMA), tcp, mapped, or auto (as fsd's --transport).
    #[arg(long, default_value = "auto", value_parser = clap::value_parser!(Transport))]
    transport: Transport,
    /// The memnode's --token, if it has one.
    #[arg(long)]
    token: Option<String>,
    /// Sequential or random, reads or writes.
    #[arg(long, value_enum)]
    rw: Rw,
    /// Bytes per block, what one request of a job moves (e.g. 4K, 1M).
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    bs: u64,
    /// The largest single READ or WRITE; a larger block goes as several, posted
    /// together (fsd's --block-size).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    op_size: u64,
    /// Remote memory allocated, laid out and used by the jobs.
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    size: u64,
    /// Jobs at once, each a thread with its own connection.
    #[arg(long, default_value_t = 1,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    numjobs: usize,
    /// Seconds measured.
    #[arg(long, default_value_t = 5.0)]
    runtime: f64,
    /// Seconds run before measuring.
    #[arg(long, default_value_t = 1.0)]
    ramp: f64,
    /// Microseconds a thread polls for its completion before it sleeps, over tcp
    /// (as fsd's --poll-us).
    #[arg(long, value_name = "MICROS", default_value_t = fabric::DEFAULT_POLL.as_micros() as u64,
          value_parser = clap::value_parser!(u64).range(0..=fabric::MAX_POLL_US))]
    poll_us: u64,
    /// Write the JSON result here instead of standard output.
    #[arg(long)]
    output: Option<PathBuf>,
}

impl Options {
    fn validate(&self) -> anyhow::Result<()> {
        if self.bs < 8 {
            bail!(
                "--bs {} is too small: a block needs 8 bytes for its tag",
                self.bs
            );
        }
        if self.op_size == 0 || self.op_size as usize > MAX_DATA_OP {
            bail!("--op-size must be between 1 byte and {MAX_DATA_OP} bytes");
        }
        if self.size < self.bs {
            bail!(
                "--size {} is smaller than one block (--bs {})",
                self.size,
                self.bs
            );
        }
        for (name, v) in [("--runtime", self.runtime), ("--ramp", self.ramp)] {
            if !(0.0..=86_400.0).contains(&v) {
                bail!("{name} {v} is not a number of seconds between 0 and 86400");
            }
        }
        if self.runtime == 0.0 {
            bail!("--runtime must be more than 0 seconds");
        }
        Ok(())
    }

    fn shape(&self, base: RemoteAddr, size: u64) -> Shape {
        Shape {
            access: match self.rw {
                Rw::Read | Rw::Write => Access::Sequential,
                Rw::Randread | Rw::Randwrite => Access::Random,
            },
            writes: matches!(self.rw, Rw::Write | Rw::Randwrite),
            block: self.bs as usize,
            op_size: self.op_size as usize,
            base,
            size,
        }
    }
}

/// Connections to the memnode as this client, greeted: the first starts the
/// client's session, the others join it with its secret.
struct Client<'a> {
    opts: &'a Options,
    id: u64,
    session: std::sync::Mutex<rmemfs_common::protocol::SessionSecret>,
}

impl Client<'_> {
    fn connect(&self) -> anyhow::Result<Box<dyn Endpoint>> {
        let poll = Duration::from_micros(self.opts.poll_us);
        let ep = fabric::connect(
            self.opts.transport,
            &self.opts.memnode,
            self.id,
            TIMEOUT,
            poll,
        )?;
        let token = self.opts.token.as_deref().unwrap_or("").as_bytes();
        let mut session = lock(&self.session);
        let welcome = control::hello_in_session(ep.as_ref(), self.id, token, *session)
            .with_context(|| format!("memnode {} refused hello", self.opts.memnode))?;
        *session = welcome.session;
        Ok(ep)
    }
}

/// User and system CPU time of this process so far.
fn cpu_times() -> (Duration, Duration) {
    // SAFETY: a zeroed rusage is a valid out-parameter; RUSAGE_SELF cannot fail.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let t = |tv: libc::timeval| Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000);
    (t(ru.ru_utime), t(ru.ru_stime))
}

/// Writes every block of the allocation, so reads find data and writes overwrite it.
fn lay_out(ep: &dyn Endpoint, shape: &Shape) -> anyhow::Result<()> {
    let body = pattern::body(shape.block);
    let per_batch = (LAYOUT_BATCH / shape.block).max(1) * shape.block;
    let blocks_bytes = shape.size / shape.block as u64 * shape.block as u64;
    let mut buf = vec![0u8; per_batch];
    let write = Shape {
        writes: true,
        ..*shape
    };
    let mut offset = 0u64;
    while offset < blocks_bytes {
        let len = per_batch.min((blocks_bytes - offset) as usize);
        pattern::fill_blocks(&mut buf[..len], offset, &body);
        job::transfer(ep, &write, &mut buf[..len], offset).map_err(anyhow::Error::msg)?;
        offset += len as u64;
    }
    Ok(())
}

/// Reads back the first, the last and [`VERIFY_SAMPLES`] random blocks and compares
/// them in full with what was written.
fn verify(ep: &dyn Endpoint, shape: &Shape) -> anyhow::Result<()> {
    let body = pattern::body(shape.block);
    let blocks = shape.size / shape.block as u64;
    let read = Shape {
        writes: false,
        ..*shape
    };
    let mut buf = vec![0u8; shape.block];
    let random = pattern::Offsets::new(Access::Random, shape.block as u64, shape.size, 99);
    let offsets = [0, (blocks - 1) * shape.block as u64]
        .into_iter()
        .chain(random.take(VERIFY_SAMPLES as usize));
    for offset in offsets {
        job::move_block(ep, &read, &mut buf, offset).map_err(anyhow::Error::msg)?;
        pattern::check_block(&buf, offset, &body).map_err(anyhow::Error::msg)?;
    }
    Ok(())
}

/// Runs the jobs on their own connections and adds up what they measured.
fn run_jobs(client: &Client, shape: &Shape) -> anyhow::Result<Summary> {
    let opts = client.opts;
    let eps = (0..opts.numjobs)
        .map(|_| client.connect())
        .collect::<anyhow::Result<Vec<_>>>()?;
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(opts.ramp);
    let stop = measure_from + Duration::from_secs_f64(opts.runtime);
    let (results, cpu) = std::thread::scope(|s| {
        let handles: Vec<_> = eps
            .iter()
            .enumerate()
            .map(|(i, ep)| {
                s.spawn(move || job::run(ep.as_ref(), shape, i as u64 + 1, measure_from, stop))
            })
            .collect();
        std::thread::sleep(measure_from.saturating_duration_since(Instant::now()));
        let cpu_start = cpu_times();
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a job thread panicked".into()))
            })
            .collect();
        let cpu_end = cpu_times();
        (results, (cpu_end.0 - cpu_start.0, cpu_end.1 - cpu_start.1))
    });
    let mut sum = Summary {
        name: format!("{:?}", opts.rw).to_lowercase(),
        writes: shape.writes,
        bytes: 0,
        ops: 0,
        elapsed: Duration::ZERO,
        latencies_ns: Vec::new(),
        usr_cpu_pct: 0.0,
        sys_cpu_pct: 0.0,
    };
    for r in results {
        let m = r.map_err(anyhow::Error::msg)?;
        sum.bytes += m.bytes;
        sum.ops += m.ops;
        sum.latencies_ns.extend(m.latencies_ns);
        if let Some(end) = m.last_end {
            sum.elapsed = sum.elapsed.max(end - measure_from);
        }
    }
    if sum.ops == 0 {
        bail!("no block completed within the measured {} s", opts.runtime);
    }
    let wall = sum.elapsed.as_secs_f64();
    sum.usr_cpu_pct = 100.0 * cpu.0.as_secs_f64() / wall;
    sum.sys_cpu_pct = 100.0 * cpu.1.as_secs_f64() / wall;
    Ok(sum)
}

fn run(opts: &Options) -> anyhow::Result<()> {
    opts.validate()?;
    let client = Client {
        opts,
        id: control::random_id(),
        session: Default::default(),
    };
    let control_ep = client.connect()?;
    let Allocation { addr, len, rkey } = control::alloc(control_ep.as_ref(), opts.size)
        .with_context(|| format!("memnode {} refused {} bytes", opts.memnode, opts.size))?;
    let shape = opts.shape(RemoteAddr { addr, rkey }, opts.size.min(len));
    let outcome = lay_out(control_ep.as_ref(), &shape)
        .context("laying the allocation out")
        .and_then(|()| run_jobs(&client, &shape))
        .and_then(|sum| {
            verify(control_ep.as_ref(), &shape).context("verifying remote memory")?;
            Ok(sum)
        });
    // Given back whatever happened, so a failed run leaves the memnode as it was.
    let freed = control::free(control_ep.as_ref(), addr, rkey)
        .with_context(|| format!("freeing the allocation on {}", opts.memnode));
    let sum = outcome?;
    freed?;
    let json = sum.to_json();
    match &opts.output {
        Some(path) => {
            std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?
        }
        None => print!("{json}"),
    }
    eprintln!(
        "fabricbench: {} --bs {} x{}: {:.1} MB/s, {:.0} IOPS over {:.2} s",
        sum.name,
        opts.bs,
        opts.numjobs,
        sum.bytes_per_second() / 1e6,
        sum.iops(),
        sum.elapsed.as_secs_f64()
    );
    Ok(())
}

fn main() {
    let opts = Options::parse();
    if let Err(e) = run(&opts) {
        eprintln!("fabricbench: {e:#}");
        std::process::exit(1);
    }
}
