//! Local memory registration on the active side (fsd).
//!
//! All of a process's connections on one device share one protection domain, so
//! memory registered once (fsd's page-cache slab, announced with
//! [`register_local`]) serves every connection: RDMA READ lands straight in a cache
//! page and RDMA WRITE sends straight from one. A buffer outside every registered slab
//! is registered for the one operation ([`LocalPd::lkey_for`] says None, the endpoint
//! registers it and deregisters it after the completion).

use super::sys::{Mr, Pd, LOCAL_ONLY};
use crate::fabric::FabricError;
use crate::sync::{lock, read, write};
use rdma_sys::ibv_context;
use std::sync::{Arc, Mutex, RwLock};

/// A protection domain of one device with the slabs registered in it.
pub struct LocalPd {
    // Field order: the slabs' MRs go before the PD (they also hold it alive).
    slabs: RwLock<Vec<(usize, usize, Mr)>>,
    pub pd: Arc<Pd>,
}

impl LocalPd {
    /// The lkey covering `[ptr, ptr + len)`, if a registered slab holds it whole.
    pub fn lkey_for(&self, ptr: *const u8, len: usize) -> Option<u32> {
        let start = ptr as usize;
        let end = start.checked_add(len)?;
        let slabs = read(&self.slabs);
        slabs
            .iter()
            .find(|(s, l, _)| start >= *s && end <= s + l)
            .map(|(_, _, mr)| mr.lkey())
    }

    fn add(&self, start: usize, len: usize) -> Result<(), FabricError> {
        // SAFETY: register_local's contract: the slab stays mapped for the
        // process's life.
        let mr = unsafe { Mr::register(&self.pd, start as *mut u8, len, LOCAL_ONLY)? };
        write(&self.slabs).push((start, len, mr));
        Ok(())
    }
}

struct Registry {
    /// Slabs announced so far (registered in every PD, present and future).
    slabs: Vec<(usize, usize)>,
    /// One PD per device context.
    pds: Vec<(usize, Arc<LocalPd>)>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    slabs: Vec::new(),
    pds: Vec::new(),
});

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    lock(&REGISTRY)
}

/// The shared protection domain of device context `ctx`, created (with every slab
/// registered in it) on first use.
pub fn local_pd(ctx: *mut ibv_context) -> Result<Arc<LocalPd>, FabricError> {
    let mut reg = registry();
    if let Some((_, pd)) = reg.pds.iter().find(|(c, _)| *c == ctx as usize) {
        return Ok(pd.clone());
    }
    let pd = Arc::new(LocalPd {
        slabs: RwLock::new(Vec::new()),
        pd: Pd::new(ctx)?,
    });
    for &(start, len) in &reg.slabs {
        pd.add(start, len)?;
    }
    reg.pds.push((ctx as usize, pd.clone()));
    Ok(pd)
}

/// See [`crate::fabric::register_local`].
///
/// # Safety
/// The memory must stay mapped for the rest of the process's life.
pub unsafe fn register_local(ptr: *mut u8, len: usize) -> Result<(), FabricError> {
    let mut reg = registry();
    for (_, pd) in &reg.pds {
        pd.add(ptr as usize, len)?;
    }
    reg.slabs.push((ptr as usize, len));
    Ok(())
}
