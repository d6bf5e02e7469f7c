//! One job: a thread with its own connection that moves one block at a time (as a
//! psync fio job issues one request at a time) until its time is up, and times each.

use crate::pattern::{self, Access, Offsets};
use rmemfs_common::fabric::{Endpoint, RdmaOp, RemoteAddr};
use std::time::Instant;

/// What every job of a run does.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub access: Access,
    pub writes: bool,
    /// Bytes per block: what one fio request moves.
    pub block: usize,
    /// The largest single READ or WRITE: a larger block goes as several operations
    /// posted together, one per fsd block (over tcp they leave as one request, as a
    /// stream of fsd's blocks does).
    pub op_size: usize,
    /// The allocation the jobs work in.
    pub base: RemoteAddr,
    pub size: u64,
}

/// What one job measured between `measure_from` and its last completion.
#[derive(Debug, Default)]
pub struct Measured {
    pub bytes: u64,
    pub ops: u64,
    pub latencies_ns: Vec<u64>,
    /// When its last measured block completed.
    pub last_end: Option<Instant>,
}

/// The operations that move `buf` (one block) to or from `offset` of the allocation.
fn block_ops<'a>(shape: &Shape, buf: &'a mut [u8], offset: u64) -> Vec<RdmaOp<'a>> {
    let mut ops = Vec::with_capacity(buf.len().div_ceil(shape.op_size));
    for (i, local) in buf.chunks_mut(shape.op_size).enumerate() {
        let remote = shape.base.offset(offset as usize + i * shape.op_size);
        ops.push(if shape.writes {
            RdmaOp::Write { local, remote }
        } else {
            RdmaOp::Read { local, remote }
        });
    }
    ops
}

/// Moves `buf` to or from `offset` as `shape` says, in operations of at most
/// `shape.op_size` posted together; Err names the first that failed.
pub fn transfer(
    ep: &dyn Endpoint,
    shape: &Shape,
    buf: &mut [u8],
    offset: u64,
) -> Result<(), String> {
    let mut ops = block_ops(shape, buf, offset);
    for (i, r) in ep.execute(&mut ops).into_iter().enumerate() {
        r.map_err(|e| {
            let at = offset as usize + i * shape.op_size;
            format!(
                "{} at offset {at} failed: {e}",
                if shape.writes { "WRITE" } else { "READ" }
            )
        })?;
    }
    Ok(())
}

/// Moves one block (tagged first when written) and checks that a READ brought back
/// the block that lives at `offset`.
pub fn move_block(
    ep: &dyn Endpoint,
    shape: &Shape,
    buf: &mut [u8],
    offset: u64,
) -> Result<(), String> {
    if shape.writes {
        pattern::tag_block(buf, offset);
    }
    transfer(ep, shape, buf, offset)?;
    if !shape.writes && pattern::tag_of(buf) != offset {
        return Err(format!(
            "READ at offset {offset} brought back the block of offset {}",
            pattern::tag_of(buf)
        ));
    }
    Ok(())
}

/// Runs one job until `stop`, measuring the blocks it starts from `measure_from` on.
/// `seed` picks its random order. Any failed or wrong block ends it with the reason.
pub fn run(
    ep: &dyn Endpoint,
    shape: &Shape,
    seed: u64,
    measure_from: Instant,
    stop: Instant,
) -> Result<Measured, String> {
    let mut buf = pattern::body(shape.block);
    let mut offsets = Offsets::new(shape.access, shape.block as u64, shape.size, seed);
    let mut m = Measured::default();
    loop {
        let start = Instant::now();
        if start >= stop {
            return Ok(m);
        }
        let offset = offsets.next().expect("offsets never end");
        move_block(ep, shape, &mut buf, offset)?;
        if start >= measure_from {
            let end = Instant::now();
            m.latencies_ns.push((end - start).as_nanos() as u64);
            m.bytes += shape.block as u64;
            m.ops += 1;
            m.last_end = Some(end);
        }
    }
}
