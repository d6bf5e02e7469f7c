//! The volume requests: open (create, hold, take over), close and destroy.
//!
//! A client that opens a volume becomes its holder and is bound to it: its Alloc
//! books chunks to the volume and its Free frees volume chunks. The volume's chunks
//! are registered for the holder only, and deregistered (never freed) when it
//! closes the volume, its last connection closes, or another client takes the
//! volume over (fencing it). Only VolumeDestroy frees them. The bookkeeping and its
//! rules are in `volumes.rs`; this module applies them to the pool.
//!
//! A volume is its creator's tenant's, found by (tenant, name): a client of another
//! tenant is answered as if it did not exist. Creating one charges the tenant a
//! volume and the root page; destroying it credits what it held.

use super::reply::{alloc_error, internal, pool_error_code, volume_error};
use super::{show, ControlService};
use crate::allocator::Owner;
use crate::tenants::TenantId;
use crate::volumes::{Holder, OpenPlan, TakeoverReason, VolumeError, VolumeTable};
use rmemfs_common::protocol::{ErrorCode, Response};
use rmemfs_common::size::format_size;
use std::time::Instant;

impl ControlService {
    pub(super) fn volume_open(
        &self,
        client: u64,
        tenant: TenantId,
        peer: &str,
        name: &[u8],
        create: bool,
        takeover: bool,
    ) -> Response {
        let mut vols = self.volumes();
        let plan = vols.plan_open(client, tenant, name, create, takeover, self.lease, |c| {
            self.last_heard(c)
        });
        let plan = match plan {
            Ok(OpenPlan::AlreadyHeld) => {
                return match vols.held_by(client).and_then(|v| v.info(false)) {
                    Some(info) => Response::VolumeOpened(info),
                    None => internal("the held volume has no registered root"),
                };
            }
            Ok(plan) => plan,
            Err(e) => {
                log::info!(
                    "client {client:#x}: open of volume {} refused: {e}",
                    show(name)
                );
                return volume_error(&e);
            }
        };
        if self.pool.has_scratch(client) {
            return Response::error(
                ErrorCode::BadRequest,
                "this client has scratch chunks; a client opens its volume before it allocates",
            );
        }
        let holder = Holder {
            client,
            peer: peer.to_string(),
            since: Instant::now(),
        };
        match plan {
            OpenPlan::AlreadyHeld => internal("unreachable open plan"),
            OpenPlan::Create { id } => {
                let page = self.pool.page();
                if let Err(over) = self.charge(tenant, page, 1) {
                    return over;
                }
                let root = match self.pool.alloc_for(Owner::Volume(id), client, page) {
                    Ok(c) => c,
                    Err(e) => {
                        self.credit(tenant, page, 1);
                        return alloc_error(client, page, e);
                    }
                };
                match vols
                    .create(id, tenant, name, root.to_wire(), holder)
                    .and_then(|v| v.info(true))
                {
                    Some(info) => {
                        log::info!(
                            "client {client:#x} of tenant {:?} from {peer} created volume {} (id {id})",
                            self.tenants().name(tenant),
                            show(name)
                        );
                        Response::VolumeOpened(info)
                    }
                    None => {
                        let _ = self
                            .pool
                            .free_as(Owner::Volume(id), client, root.addr, root.rkey);
                        self.credit(tenant, page, 1);
                        internal("the volume table refused a planned create")
                    }
                }
            }
            OpenPlan::Hold { id, fence } => {
                if let Some((old, why)) = fence {
                    self.fence(&mut vols, tenant, name, &old, client, "takes it over", &why);
                }
                let addrs = vols
                    .get(tenant, name)
                    .map(|v| v.addrs())
                    .unwrap_or_default();
                let mut rkeys = Vec::with_capacity(addrs.len());
                for addr in addrs {
                    match self.pool.register(Owner::Volume(id), client, addr) {
                        Ok(c) => rkeys.push((addr, c.rkey)),
                        Err(e) => {
                            log::error!(
                                "client {client:#x}: cannot register chunk {addr:#x} of volume {}: {e}",
                                show(name)
                            );
                            for (_, rkey) in rkeys {
                                self.pool.deregister(rkey);
                            }
                            return Response::error(pool_error_code(&e), e.to_string());
                        }
                    }
                }
                if !vols.hold(tenant, name, holder, &rkeys) {
                    for (_, rkey) in rkeys {
                        self.pool.deregister(rkey);
                    }
                    return internal("the volume table refused a planned hold");
                }
                match vols.held_by(client).and_then(|v| v.info(false)) {
                    Some(info) => {
                        log::info!(
                            "client {client:#x} from {peer} opened volume {} (id {id}, {} chunks, {})",
                            show(name),
                            info.chunks,
                            format_size(info.bytes)
                        );
                        Response::VolumeOpened(info)
                    }
                    None => internal("the held volume has no registered root"),
                }
            }
        }
    }

    /// Takes volume `name` from `old` for `by` (who then does `action`): every
    /// registration of `old` is revoked (its READs and WRITEs fail from now on) and
    /// `old` is fenced.
    #[allow(clippy::too_many_arguments)]
    fn fence(
        &self,
        vols: &mut VolumeTable,
        tenant: TenantId,
        name: &[u8],
        old: &Holder,
        by: u64,
        action: &str,
        why: &TakeoverReason,
    ) {
        let Some((_, rkeys)) = vols.fence(tenant, name) else {
            return;
        };
        for rkey in &rkeys {
            self.pool.deregister(*rkey);
        }
        let heard = match self.last_heard(old.client) {
            Some(d) => format!("last heard {:.1}s ago", d.as_secs_f64()),
            None => "no longer connected".into(),
        };
        log::warn!(
            "volume {}: client {by:#x} {action}, fencing client {:#x} ({}, held for {:.1}s from {}, {heard}); {} chunks revoked",
            show(name),
            old.client,
            match why {
                TakeoverReason::Requested => "takeover requested",
                TakeoverReason::LeaseExpired => "lease expired",
            },
            old.since.elapsed().as_secs_f64(),
            old.peer,
            rkeys.len()
        );
    }

    pub(super) fn volume_close(&self, client: u64) -> Response {
        let mut vols = self.volumes();
        if let Err(e) = vols.bound(client) {
            return volume_error(&e);
        }
        let Some((name, rkeys)) = vols.release(client) else {
            return volume_error(&VolumeError::NotHeld);
        };
        for rkey in &rkeys {
            self.pool.deregister(*rkey);
        }
        log::info!(
            "client {client:#x} closed volume {} ({} chunks kept)",
            show(&name),
            rkeys.len()
        );
        Response::VolumeClosed
    }

    pub(super) fn volume_destroy(&self, client: u64, tenant: TenantId, name: &[u8]) -> Response {
        let mut vols = self.volumes();
        let plan = match vols.plan_destroy(client, tenant, name, self.lease, |c| self.last_heard(c))
        {
            Ok(p) => p,
            Err(e) => {
                log::info!(
                    "client {client:#x}: destroy of volume {} refused: {e}",
                    show(name)
                );
                return volume_error(&e);
            }
        };
        if let Some(old) = &plan.fence {
            self.fence(
                &mut vols,
                tenant,
                name,
                old,
                client,
                "destroys it",
                &TakeoverReason::LeaseExpired,
            );
        } else if vols
            .held_by(client)
            .is_some_and(|v| v.tenant() == tenant && v.name() == name)
        {
            for rkey in vols.release(client).map(|(_, r)| r).unwrap_or_default() {
                self.pool.deregister(rkey);
            }
        }
        let Some(v) = vols.remove(tenant, name) else {
            return internal("the volume table refused a planned destroy");
        };
        self.credit(tenant, v.bytes(), 1);
        let bytes = self
            .pool
            .release_unregistered(Owner::Volume(plan.id), &v.addrs());
        log::info!(
            "client {client:#x} destroyed volume {} (id {}): {} chunks, {} freed",
            show(name),
            plan.id,
            v.chunk_count(),
            format_size(bytes)
        );
        Response::VolumeDestroyed { bytes }
    }
}
