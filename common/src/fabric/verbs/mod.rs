//! The verbs backend: the fabric on real RDMA (rdma-sys over libibverbs and librdmacm).
//!
//! - [`client::VerbsEndpoint`]: an RC queue pair to a memnode; one-sided READ/WRITE
//!   posted in batches with signalled completions; SEND/RECV for control frames.
//! - [`server::VerbsListener`] / [`server::VerbsRegistry`]: the memnode side; each
//!   chunk is its own memory region (its own rkey) in its owner's protection domain.
//! - [`local`]: fsd's long-lived buffers (the page cache) registered once per device.
//! - [`sys`]: owning wrappers of the verbs objects, released on drop in order.
//!
//! Connection requests carry [`PRIVATE_MAGIC`] and the client id in their private
//! data, so the memnode can place the queue pair in the client's protection domain.

pub mod client;
mod local;
mod messages;
pub mod server;
mod sys;

pub use client::VerbsEndpoint;
pub use local::register_local;
pub use server::{VerbsListener, VerbsRegistry};

use crate::fabric::FabricError;

/// First bytes of a connection request's private data: "rmemfs verbs, version 1".
pub const PRIVATE_MAGIC: &[u8; 4] = b"RMV1";

/// The first RDMA device's name, or an error that says none exists and what to do.
pub fn first_device_name() -> Result<String, FabricError> {
    sys::device_names().into_iter().next().ok_or_else(|| {
        FabricError::NoDevice(
            "no RDMA device found (ibv_get_device_list lists none; the kernel may lack \
             RDMA support or no driver is loaded, e.g. rdma_rxe for Soft-RoCE); use \
             --transport tcp"
                .into(),
        )
    })
}

/// The IPv4 address of the first RDMA device's port 1, from its GID table (RoCE v2
/// GIDs of IPv4 interfaces are IPv4-mapped IPv6 addresses): the address this host
/// reaches itself on over verbs.
pub fn device_ipv4() -> Option<std::net::Ipv4Addr> {
    let dev = sys::device_names().into_iter().next()?;
    let dir = format!("/sys/class/infiniband/{dev}/ports/1/gids");
    let mut entries: Vec<_> = std::fs::read_dir(dir).ok()?.flatten().collect();
    entries.sort_by_key(|e| {
        e.file_name()
            .to_string_lossy()
            .parse::<u32>()
            .unwrap_or(u32::MAX)
    });
    entries.iter().find_map(|e| {
        let text = std::fs::read_to_string(e.path()).ok()?;
        let ip: std::net::Ipv6Addr = text.trim().parse().ok()?;
        ip.to_ipv4_mapped().filter(|v4| !v4.is_unspecified())
    })
}
