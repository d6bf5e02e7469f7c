//! Alloc and Free. A client bound to a volume allocates and frees that volume's
//! chunks (booked to it, under `volumes` so the table and the pool change
//! together); any other client allocates scratch memory of its session, checked
//! again afterwards against a volume opened meanwhile by another of its
//! connections. Either way the memory is the client's tenant's: charged to it
//! before it is booked, credited when it is freed (`tenancy.rs`).

use super::reply::{alloc_error, pool_error_code, volume_error};
use super::ControlService;
use crate::allocator::Owner;
use crate::tenants::TenantId;
use crate::volumes::VolumeError;
use rmemfs_common::protocol::{ErrorCode, Response};

impl ControlService {
    /// Alloc of `client` of `tenant`: charged first (the bytes as the pool rounds
    /// them), settled with what was booked.
    pub(super) fn alloc(&self, client: u64, tenant: TenantId, bytes: u64) -> Response {
        let charged = self.pool.rounded(bytes);
        if let Err(over) = self.charge(tenant, charged, 0) {
            return over;
        }
        let answer = self.alloc_charged(client, bytes);
        self.settle(tenant, charged, &answer);
        answer
    }

    fn alloc_charged(&self, client: u64, bytes: u64) -> Response {
        {
            let mut vols = self.volumes();
            match vols.bound(client) {
                Ok(v) => {
                    let id = v.id();
                    return match self.pool.alloc_for(Owner::Volume(id), client, bytes) {
                        Ok(c) => {
                            vols.add_chunk(client, c.to_wire());
                            log::debug!(
                                "client {client:#x}: volume {id} alloc {bytes} -> {:#x}+{:#x} rkey {:#x}",
                                c.addr,
                                c.len,
                                c.rkey
                            );
                            Response::Allocated(c.to_wire())
                        }
                        Err(e) => alloc_error(client, bytes, e),
                    };
                }
                Err(VolumeError::NotHeld) => {}
                Err(e) => return volume_error(&e),
            }
        }
        let c = match self.pool.alloc(client, bytes) {
            Ok(c) => c,
            Err(e) => return alloc_error(client, bytes, e),
        };
        // Another connection of this client may have opened a volume meanwhile; the
        // chunk is filed already, so that open either saw it (and was refused) or
        // bound the client before this check.
        let vols = self.volumes();
        if vols.held_by(client).is_some() || vols.is_fenced(client) {
            if let Err(e) = self.pool.free(client, c.addr, c.rkey) {
                log::error!("client {client:#x}: cannot take back chunk {c:?}: {e}");
            }
            return Response::error(
                ErrorCode::BadRequest,
                "a volume was opened by this client while the allocation ran; allocate again",
            );
        }
        log::debug!(
            "client {client:#x}: alloc {bytes} -> {:#x}+{:#x} rkey {:#x}",
            c.addr,
            c.len,
            c.rkey
        );
        Response::Allocated(c.to_wire())
    }

    /// Free of `client` of `tenant`: what goes back is credited to the tenant.
    pub(super) fn free(&self, client: u64, tenant: TenantId, addr: u64, rkey: u32) -> Response {
        let (answer, freed) = self.free_chunk(client, addr, rkey);
        self.credit(tenant, freed, 0);
        answer
    }

    /// Frees the chunk; returns the answer and the bytes freed.
    fn free_chunk(&self, client: u64, addr: u64, rkey: u32) -> (Response, u64) {
        {
            let mut vols = self.volumes();
            match vols.bound(client) {
                Ok(_) => {
                    let id = match vols.check_free(client, addr) {
                        Ok(id) => id,
                        Err(e) => return (volume_error(&e), 0),
                    };
                    return match self.pool.free_as(Owner::Volume(id), client, addr, rkey) {
                        Ok(c) => {
                            vols.remove_chunk(client, addr);
                            log::debug!(
                                "client {client:#x}: volume {id} freed {:#x}+{:#x}",
                                c.addr,
                                c.len
                            );
                            (Response::Freed, c.len)
                        }
                        Err(e) => (Response::error(pool_error_code(&e), e.to_string()), 0),
                    };
                }
                Err(VolumeError::NotHeld) => {}
                Err(e) => return (volume_error(&e), 0),
            }
        }
        match self.pool.free(client, addr, rkey) {
            Ok(c) => {
                log::debug!("client {client:#x}: freed {:#x}+{:#x}", c.addr, c.len);
                (Response::Freed, c.len)
            }
            Err(e) => (Response::error(pool_error_code(&e), e.to_string()), 0),
        }
    }
}
