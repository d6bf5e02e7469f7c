//! SEND/RECV buffers of one connection: `RECV_DEPTH` receive slots posted ahead (so a
//! peer's SEND always finds a buffer; an RC SEND without one would stall in RNR
//! retries) and one send slot, all in one memory region of the connection's
//! protection domain. Control frames are small (at most MAX_CONTROL_FRAME bytes), so a
//! copy in and out of these slots costs nothing worth avoiding.

use super::sys::{local_err, Mr, Pd, LOCAL_ONLY};
use crate::fabric::FabricError;
use crate::protocol::MAX_CONTROL_FRAME;
use rdma_sys::*;
use std::sync::Arc;

/// Receive slots posted ahead on every connection.
pub const RECV_DEPTH: usize = 8;
/// Work-request ids of receives carry this bit (plus the slot index); sends carry
/// SEND_TAG; everything else is a one-sided operation.
pub const RECV_TAG: u64 = 1 << 63;
pub const SEND_TAG: u64 = 1 << 62;

pub struct Messages {
    // Field order: the MR is deregistered before its buffer is freed.
    mr: Mr,
    buf: Box<[u8]>,
}

impl Messages {
    pub fn new(pd: &Arc<Pd>) -> Result<Messages, FabricError> {
        let mut buf = vec![0u8; (RECV_DEPTH + 1) * MAX_CONTROL_FRAME].into_boxed_slice();
        // SAFETY: the buffer is owned by this struct and freed only after the MR
        // (field order), and a Box's heap memory does not move.
        let mr = unsafe { Mr::register(pd, buf.as_mut_ptr(), buf.len(), LOCAL_ONLY)? };
        Ok(Messages { mr, buf })
    }

    fn slot_addr(&self, slot: usize) -> u64 {
        self.buf.as_ptr() as u64 + (slot * MAX_CONTROL_FRAME) as u64
    }

    /// Posts receive slot `slot` on `qp`.
    pub fn post_recv(&self, qp: *mut ibv_qp, slot: usize) -> Result<(), FabricError> {
        let mut sge = ibv_sge {
            addr: self.slot_addr(slot),
            length: MAX_CONTROL_FRAME as u32,
            lkey: self.mr.lkey(),
        };
        let mut wr = ibv_recv_wr {
            wr_id: RECV_TAG | slot as u64,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: valid QP; the sge points into our registered buffer, which
        // outlives the QP (the owners destroy the QP first).
        if unsafe { ibv_post_recv(qp, &mut wr, &mut bad) } != 0 {
            return Err(local_err("ibv_post_recv"));
        }
        Ok(())
    }

    pub fn post_all_recvs(&self, qp: *mut ibv_qp) -> Result<(), FabricError> {
        (0..RECV_DEPTH).try_for_each(|slot| self.post_recv(qp, slot))
    }

    /// The frame a completed receive of `len` bytes left in `slot`.
    pub fn received(&self, slot: usize, len: usize) -> &[u8] {
        let start = slot * MAX_CONTROL_FRAME;
        &self.buf[start..start + len.min(MAX_CONTROL_FRAME)]
    }

    /// Copies `frame` into the send slot and posts a signalled SEND. The caller must
    /// not post another SEND before this one's completion (the slot is reused).
    pub fn post_send(&mut self, qp: *mut ibv_qp, frame: &[u8]) -> Result<(), FabricError> {
        if frame.len() > MAX_CONTROL_FRAME {
            return Err(FabricError::Invalid(format!(
                "control frame of {} bytes exceeds {MAX_CONTROL_FRAME}",
                frame.len()
            )));
        }
        let start = RECV_DEPTH * MAX_CONTROL_FRAME;
        self.buf[start..start + frame.len()].copy_from_slice(frame);
        let mut sge = ibv_sge {
            addr: self.slot_addr(RECV_DEPTH),
            length: frame.len() as u32,
            lkey: self.mr.lkey(),
        };
        // SAFETY: all-zero is a valid ibv_send_wr; the fields used are set below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = SEND_TAG;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad = std::ptr::null_mut();
        // SAFETY: valid QP; the sge points into our registered buffer.
        if unsafe { ibv_post_send(qp, &mut wr, &mut bad) } != 0 {
            return Err(local_err("ibv_post_send (SEND)"));
        }
        Ok(())
    }
}
