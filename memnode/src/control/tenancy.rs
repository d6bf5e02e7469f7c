//! Tenants in the control service: which tenant a client is of, the charges and
//! credits of the [`Ledger`] at each booking and release, the `OverQuota` answer,
//! and what the metrics show per tenant.
//!
//! Where the ledger changes, and why there: Alloc charges the tenant the bytes
//! rounded up to pages before booking (its scratch chunk or its volume's chunk,
//! either is its memory) and credits what was not booked; a VolumeOpen that creates
//! charges a volume and the root page the same way; Free, VolumeDestroy and the end
//! of a session (its scratch chunks reclaimed) credit what went back. Copy moves
//! bytes between chunks the client holds already: it books nothing, so it charges
//! nothing. A restart on a memory file counts every kept booking again
//! (`saved_books.rs`). A volume's tenant is its creator's, and only that tenant's
//! clients hold it, so its chunks are always charged to the tenant of the client
//! that allocates them.

use super::reply::{refuse_and_close, Answer};
use super::ControlService;
use crate::allocator::Owner;
use crate::quota::{Ledger, OverQuota, Usage};
use crate::tenants::{Quota, TenantId, Tenants};
use rmemfs_common::fabric::ConnectionState;
use rmemfs_common::protocol::{ErrorCode, Response};
use rmemfs_common::size::format_size;
use rmemfs_common::sync::lock;
use std::sync::MutexGuard;

/// One tenant as the metrics show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantView {
    pub name: String,
    pub quota: Quota,
    pub usage: Usage,
    /// Sessions with a connection now.
    pub clients: u64,
    /// Only the books name it: the tenants file does not any more.
    pub removed: bool,
}

impl ControlService {
    // Every change is one call that leaves the ledger whole; poisoning is ignored.
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        lock(&self.ledger)
    }

    pub(super) fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    /// The tenant of `client`'s session (`None`: it has none, which an
    /// authenticated connection never lacks). Every request asks, so it is kept
    /// apart from `clients`, which a Hello registering a restored session's memory
    /// or the end of a session deregistering it may hold a while; the entry goes with
    /// the session ([`ControlService::forget_tenant_of`]), and none is made while the
    /// client has no connection, so none outlives its session.
    pub(super) fn tenant_of(&self, client: u64) -> Option<TenantId> {
        if let Some(t) = lock(&self.client_tenants).get(&client) {
            return Some(*t);
        }
        let t = self.clients().get(&client).map(|s| s.tenant)?;
        lock(&self.client_tenants).insert(client, t);
        Some(t)
    }

    /// The session of `client` ended.
    pub(super) fn forget_tenant_of(&self, client: u64) {
        lock(&self.client_tenants).remove(&client);
    }

    /// The answer to a Hello of `tenant` naming a client id whose session is tenant
    /// `owner`'s: refused as a wrong secret is, since another tenant's session is
    /// not this client's to join, nor to learn of. The log says whose it is.
    pub(super) fn refuse_foreign_session(
        &self,
        conn: &ConnectionState,
        client_id: u64,
        owner: TenantId,
        tenant: TenantId,
    ) -> Answer {
        log::warn!(
            "refusing {} (conn {}): client {client_id:#x} has a session of tenant {:?}{} and this Hello is tenant {:?}'s",
            conn.peer,
            conn.conn_id,
            self.tenants.name(owner),
            if self.tenants.is_listed(owner) {
                ""
            } else {
                " (no longer in the tenants file: its memory is kept and no one may use it)"
            },
            self.tenants.name(tenant)
        );
        refuse_and_close(
            ErrorCode::AuthFailed,
            "this client id belongs to a session whose secret the Hello did not carry".into(),
        )
    }

    /// Charges `tenant` for `bytes` and `volumes` about to be booked, or answers
    /// `OverQuota` naming the tenant, its quota and its use.
    pub(super) fn charge(
        &self,
        tenant: TenantId,
        bytes: u64,
        volumes: u64,
    ) -> Result<(), Response> {
        let quota = self.tenants.quota(tenant);
        let refused = self.ledger().charge(tenant, quota, bytes, volumes);
        refused.map_err(|over| {
            let name = self.tenants.name(tenant);
            let message = match over {
                OverQuota::Bytes { used, quota, asked } => format!(
                    "tenant {name:?} is over its quota: it holds {} of its {}, and this asks {} more",
                    format_size(used),
                    format_size(quota),
                    format_size(asked)
                ),
                OverQuota::Volumes { used, quota } => format!(
                    "tenant {name:?} is over its quota: it has {used} volumes of its {quota}"
                ),
            };
            log::info!("refused: {message}");
            Response::error(ErrorCode::OverQuota, message)
        })
    }

    /// Gives `tenant` back `bytes` and `volumes` (released, or charged and not used).
    pub(super) fn credit(&self, tenant: TenantId, bytes: u64, volumes: u64) {
        self.ledger().credit(tenant, bytes, volumes);
    }

    /// After a charge of `charged` bytes: `answer` booked a chunk (its length is
    /// what the tenant holds now) or nothing (the charge goes back).
    pub(super) fn settle(&self, tenant: TenantId, charged: u64, answer: &Response) {
        let mut ledger = self.ledger();
        match answer {
            Response::Allocated(a) if a.len >= charged => ledger.add(tenant, a.len - charged, 0),
            Response::Allocated(a) => ledger.credit(tenant, charged - a.len, 0),
            _ => ledger.credit(tenant, charged, 0),
        }
    }

    /// What each tenant holds by the books: its sessions' scratch bookings and its
    /// volumes, as (bytes, volumes) by tenant.
    fn count_books(&self) -> Vec<(u64, u64)> {
        let clients = self.clients();
        let vols = self.volumes();
        let mut held: Vec<(u64, u64)> = (0..self.tenants.len())
            .map(|t| {
                let (volumes, bytes) = vols.usage_of(t);
                (bytes, volumes)
            })
            .collect();
        for b in self.pool.bookings() {
            if let Owner::Client(c) = b.owner {
                if let Some(h) = clients.get(&c).and_then(|s| held.get_mut(s.tenant)) {
                    h.0 += b.len;
                }
            }
        }
        held
    }

    /// Counts again what each tenant holds, from the books (a restart on a memory
    /// file).
    pub(super) fn recount(&self) {
        let held = self.count_books();
        let mut ledger = self.ledger();
        for (t, (bytes, volumes)) in held.into_iter().enumerate() {
            ledger.set(t, bytes, volumes);
        }
    }

    /// Every tenant, for the metrics.
    pub fn tenant_views(&self) -> Vec<TenantView> {
        let mut clients = vec![0u64; self.tenants.len()];
        for s in self.clients().values().filter(|s| s.connections > 0) {
            if let Some(n) = clients.get_mut(s.tenant) {
                *n += 1;
            }
        }
        let ledger = self.ledger();
        (0..self.tenants.len())
            .map(|t| TenantView {
                name: self.tenants.name(t).to_string(),
                quota: self.tenants.quota(t),
                usage: ledger.usage(t),
                clients: clients[t],
                removed: !self.tenants.is_listed(t),
            })
            .collect()
    }

    /// What the ledger says of `tenant` (tests).
    #[cfg(test)]
    pub(super) fn usage(&self, tenant: TenantId) -> Usage {
        self.ledger().usage(tenant)
    }

    /// Checks the ledger against the books: each tenant's bytes are its sessions'
    /// scratch bookings plus its volumes' bytes, its volumes its volumes' count.
    #[cfg(test)]
    pub(super) fn check_ledger(&self) -> Result<(), String> {
        for (t, (bytes, volumes)) in self.count_books().into_iter().enumerate() {
            let u = self.ledger().usage(t);
            if (u.bytes, u.volumes) != (bytes, volumes) {
                return Err(format!(
                    "tenant {}: the ledger says {} bytes and {} volumes, the books {bytes} and {volumes}",
                    self.tenants.name(t),
                    u.bytes,
                    u.volumes,
                ));
            }
        }
        Ok(())
    }
}
