//! What each tenant holds, against its quota: bytes (its sessions' scratch chunks
//! and its volumes' chunks, as booked, so rounded up to pages) and volumes.
//!
//! The control service charges a tenant before it books memory or makes a volume
//! ([`Ledger::charge`]), so two requests of one tenant racing each other can never
//! both pass a check that only one of them fits, and credits it when memory goes
//! back or a charge was not used. Pure bookkeeping under the service's `ledger`
//! lock, a leaf: nothing else is locked or called while it is held. Tests check
//! it against the books (`control/tests/tenants.rs`).

use crate::tenants::{Quota, TenantId};

/// What one tenant holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub bytes: u64,
    pub volumes: u64,
    /// Requests refused for its quota (a counter, for the metrics).
    pub refused: u64,
}

/// Why a charge was refused: what the tenant holds, its quota and what was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverQuota {
    Bytes { used: u64, quota: u64, asked: u64 },
    Volumes { used: u64, quota: u64 },
}

/// Every tenant's usage, by [`TenantId`].
#[derive(Debug, Default)]
pub struct Ledger {
    usage: Vec<Usage>,
}

impl Ledger {
    /// A ledger of `tenants` tenants holding nothing.
    pub fn new(tenants: usize) -> Ledger {
        Ledger {
            usage: vec![Usage::default(); tenants],
        }
    }

    pub fn usage(&self, t: TenantId) -> Usage {
        self.usage.get(t).copied().unwrap_or_default()
    }

    fn entry(&mut self, t: TenantId) -> &mut Usage {
        if t >= self.usage.len() {
            self.usage.resize(t + 1, Usage::default());
        }
        &mut self.usage[t]
    }

    /// Adds `bytes` and `volumes` to `t`'s usage if they fit `quota`; else changes
    /// nothing (but the refusal count) and says what did not fit.
    pub fn charge(
        &mut self,
        t: TenantId,
        quota: Quota,
        bytes: u64,
        volumes: u64,
    ) -> Result<(), OverQuota> {
        let u = self.entry(t);
        if let Some(q) = quota.volumes {
            if volumes > 0 && u.volumes.saturating_add(volumes) > q {
                u.refused += 1;
                return Err(OverQuota::Volumes {
                    used: u.volumes,
                    quota: q,
                });
            }
        }
        if let Some(q) = quota.bytes {
            if bytes > 0 && u.bytes.saturating_add(bytes) > q {
                u.refused += 1;
                return Err(OverQuota::Bytes {
                    used: u.bytes,
                    quota: q,
                    asked: bytes,
                });
            }
        }
        u.bytes = u.bytes.saturating_add(bytes);
        u.volumes = u.volumes.saturating_add(volumes);
        Ok(())
    }

    /// Adds to `t`'s usage whatever its quota: memory it holds already (put back
    /// after a restart, or a chunk booked a little larger than charged).
    pub fn add(&mut self, t: TenantId, bytes: u64, volumes: u64) {
        let u = self.entry(t);
        u.bytes = u.bytes.saturating_add(bytes);
        u.volumes = u.volumes.saturating_add(volumes);
    }

    /// Sets what `t` holds (counted from the books), keeping its refusal count.
    pub fn set(&mut self, t: TenantId, bytes: u64, volumes: u64) {
        let u = self.entry(t);
        u.bytes = bytes;
        u.volumes = volumes;
    }

    /// Takes `bytes` and `volumes` off `t`'s usage (memory given back, a charge not
    /// used).
    pub fn credit(&mut self, t: TenantId, bytes: u64, volumes: u64) {
        let u = self.entry(t);
        if u.bytes < bytes || u.volumes < volumes {
            log::error!(
                "tenant {t}: crediting {bytes} bytes and {volumes} volumes to a usage of {} bytes and {} volumes",
                u.bytes,
                u.volumes
            );
        }
        u.bytes = u.bytes.saturating_sub(bytes);
        u.volumes = u.volumes.saturating_sub(volumes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: Quota = Quota {
        bytes: Some(100),
        volumes: Some(2),
    };

    #[test]
    fn a_charge_that_fits_is_added_and_one_that_does_not_changes_nothing() {
        let mut l = Ledger::new(2);
        assert_eq!(l.charge(0, Q, 60, 1), Ok(()));
        assert_eq!(l.charge(0, Q, 40, 0), Ok(()), "exactly the quota fits");
        assert_eq!(
            l.charge(0, Q, 1, 0),
            Err(OverQuota::Bytes {
                used: 100,
                quota: 100,
                asked: 1
            })
        );
        assert_eq!(l.charge(0, Q, 0, 1), Ok(()), "a volume charged apart");
        assert_eq!(
            l.charge(0, Q, 0, 1),
            Err(OverQuota::Volumes { used: 2, quota: 2 })
        );
        let u = l.usage(0);
        assert_eq!((u.bytes, u.volumes, u.refused), (100, 2, 2));
        assert_eq!(l.usage(1), Usage::default(), "tenants are apart");
        l.credit(0, 30, 1);
        assert_eq!(l.charge(0, Q, 30, 1), Ok(()), "credited room is usable");
    }

    #[test]
    fn no_quota_is_no_limit_and_add_ignores_the_quota() {
        let mut l = Ledger::new(1);
        assert_eq!(l.charge(0, Quota::default(), u64::MAX / 2, 1000), Ok(()));
        let mut q = Ledger::new(1);
        q.add(0, 500, 5);
        assert_eq!(q.usage(0).bytes, 500, "memory held already counts");
        assert!(q.charge(0, Q, 1, 0).is_err(), "and leaves no room");
        q.credit(0, 1000, 10);
        let u = q.usage(0);
        assert_eq!((u.bytes, u.volumes), (0, 0), "never below zero");
        // A tenant added after the ledger was made (a removed one) has a row too.
        q.add(5, 1, 0);
        assert_eq!(q.usage(5).bytes, 1);
    }
}
