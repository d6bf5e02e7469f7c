//! The books on a memory file: saved after every change, put back at start.
//!
//! **When.** After every request that changes them (a new session, Alloc, Free,
//! the volume requests) the books are saved before the reply goes out, so a client
//! never holds a chunk, a session or a volume that a restart would not bring back.
//! A session reclaimed (its grace ran out, or it ended) is saved after it is zeroed
//! and freed; a crash in between brings it back, to be reclaimed again. A chunk is
//! zeroed before its booking goes, so every range the saved books call free reads
//! as zero: a restart never lends someone's old bytes.
//!
//! **Restoring.** Each booking is booked again where it was; each session comes
//! back with its secret and no connection, its grace running from the restart; each
//! volume comes back, held again by its holder when the holder's session came back
//! (its lease running from the restart). No chunk is registered yet: over verbs a
//! registration goes into the protection domain of its client's connection, so a
//! session's chunks (and its volume's) are registered anew when its first Hello
//! after the restart comes ([`ControlService::register_restored`]). Their rkeys
//! change (a NIC hands out its own), and the boot count in Welcome tells the
//! resuming client to fetch them again. Scratch chunks of a session that did not
//! come back (it was ending) are zeroed and freed; those of a session that is not
//! resumed within its grace are reclaimed as any session's.
//!
//! **Tenants.** The books name each session's and volume's tenant; each comes back
//! its tenant's, and what each tenant holds is counted again from them. A tenant the
//! tenants file no longer lists is kept as a removed tenant (`tenants.rs`): its
//! volumes keep their memory and no client can reach them (no token is that
//! tenant's), its sessions can be resumed by no one and are reclaimed after their
//! grace. The log names each such tenant and what it holds; listing the tenant again
//! (with its token) gives it all back.
//!
//! Lock order: the store, then `clients`, then `volumes`, then the pool, so a save
//! sees one moment of the books. Nothing takes the store while holding another
//! lock; [`ControlService::books_full`] is an atomic for that reason.

use super::{ControlService, Session};
use crate::allocator::Owner;
use crate::saved::SavedState;
use crate::tenants::TenantId;
use crate::volumes::Holder;
use rmemfs_common::protocol::Request;
use rmemfs_common::sync::lock;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// True for the requests whose effects the memory file must keep.
pub fn changes_books(req: &Request) -> bool {
    matches!(
        req,
        Request::Alloc { .. }
            | Request::Free { .. }
            | Request::VolumeOpen { .. }
            | Request::VolumeClose
            | Request::VolumeDestroy { .. }
    )
}

/// True for the requests that add to the books (refused once they are nearly full).
pub fn grows_books(req: &Request) -> bool {
    matches!(
        req,
        Request::Alloc { .. } | Request::VolumeOpen { create: true, .. }
    )
}

/// What [`ControlService::restore`] put back, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    pub sessions: usize,
    pub volumes: usize,
    pub chunks: usize,
    pub bytes: u64,
    /// Chunks of sessions that did not come back, freed.
    pub freed: usize,
}

impl ControlService {
    pub(super) fn books_full(&self) -> bool {
        self.books_full.load(Ordering::Relaxed)
    }

    /// Registers, for `client` whose session came back after a restart (its first
    /// Hello, on a connection of its own), its scratch chunks and those of the volume
    /// it holds. On an error nothing stays registered, and the Hello is refused.
    pub(super) fn register_restored(&self, client: u64) -> Result<(), String> {
        let mut vols = self.volumes();
        let mut done: Vec<u32> = Vec::new();
        let undo = |done: &[u32], e: String| {
            for rkey in done {
                self.pool.deregister(*rkey);
            }
            Err(e)
        };
        for addr in self.pool.unregistered_of(Owner::Client(client)) {
            match self.pool.register(Owner::Client(client), client, addr) {
                Ok(c) => done.push(c.rkey),
                Err(e) => return undo(&done, format!("chunk {addr:#x}: {e}")),
            }
        }
        let scratch = done.len();
        if let Some((id, addrs)) = vols.unregistered_of(client) {
            let mut rkeys = Vec::with_capacity(addrs.len());
            for addr in addrs {
                match self.pool.register(Owner::Volume(id), client, addr) {
                    Ok(c) => {
                        done.push(c.rkey);
                        rkeys.push((addr, c.rkey));
                    }
                    Err(e) => return undo(&done, format!("chunk {addr:#x} of volume {id}: {e}")),
                }
            }
            if !vols.set_rkeys(client, &rkeys) {
                return undo(&done, format!("volume {id} refused its registrations"));
            }
        }
        log::info!(
            "client {client:#x} is back after the memnode restarted: {scratch} scratch and {} volume chunks registered anew",
            done.len() - scratch
        );
        Ok(())
    }

    /// Saves the books to the memory file, if there is one.
    pub(super) fn save(&self) {
        let Some(store) = &self.store else { return };
        let mut file = lock(store);
        let mut books = self.books();
        match file.save(&mut books) {
            Ok(()) => self.books_full.store(file.nearly_full(), Ordering::Relaxed),
            Err(e) => {
                // Nothing more may be lent that a restart would not know of.
                self.books_full.store(true, Ordering::Relaxed);
                log::error!(
                    "cannot save the books to memory file {}: {e}; refusing new sessions and allocations",
                    file.path().display()
                );
            }
        }
    }

    /// The books now (sessions that are ending are left out: a restart frees their
    /// memory, as their last connection closing would).
    pub(super) fn books(&self) -> SavedState {
        let clients = self.clients();
        let vols = self.volumes();
        let name = |t: TenantId| self.tenants().name(t).to_string();
        let (volumes, fenced, last_volume_id) = vols.saved(name);
        let sessions = clients
            .iter()
            .filter(|(_, s)| !s.ending)
            .map(|(&client, s)| crate::saved::SavedSession {
                client,
                secret: s.secret,
                tenant: name(s.tenant),
            })
            .collect();
        let bookings = self.pool.bookings();
        SavedState {
            seq: 0,
            last_volume_id,
            sessions,
            volumes,
            fenced,
            bookings,
        }
    }

    /// Puts back the books a memory file saved, before serving (see the module
    /// docs), and saves them again. An error means the saved books do not fit this
    /// region: nothing should be served from it.
    pub fn restore(&mut self, saved: &SavedState) -> Result<Restored, String> {
        self.add_removed_tenants(saved);
        for b in &saved.bookings {
            self.pool.rebook(*b).map_err(|e| {
                format!(
                    "chunk {:#x}+{:#x} cannot be booked again: {e}",
                    b.addr, b.len
                )
            })?;
        }
        let now = Instant::now();
        let mut clients = self.clients();
        for s in &saved.sessions {
            clients.insert(
                s.client,
                Session {
                    secret: s.secret,
                    tenant: self.tenant_named(&s.tenant)?,
                    connections: 0,
                    idle_since: Some(now),
                    ending: false,
                    unregistered: true,
                },
            );
        }
        let mut vols = self.volumes();
        vols.restore_fences(&saved.fenced, saved.last_volume_id);
        let mut by_volume: HashMap<u64, BTreeMap<u64, u64>> = HashMap::new();
        for b in &saved.bookings {
            if let Owner::Volume(id) = b.owner {
                by_volume.entry(id).or_default().insert(b.addr, b.len);
            }
        }
        let empty = BTreeMap::new();
        for v in &saved.volumes {
            vols.restore(
                v.id,
                self.tenant_named(&v.tenant)?,
                &v.name,
                v.root,
                by_volume.get(&v.id).unwrap_or(&empty),
            )?;
        }
        let volume_ids: std::collections::HashSet<u64> =
            saved.volumes.iter().map(|v| v.id).collect();
        let mut restored = Restored {
            sessions: clients.len(),
            volumes: saved.volumes.len(),
            chunks: 0,
            bytes: 0,
            freed: 0,
        };
        let mut orphans = Vec::new();
        for b in &saved.bookings {
            let kept = match b.owner {
                Owner::Client(c) => clients.contains_key(&c),
                Owner::Volume(id) => volume_ids.contains(&id),
            };
            if kept {
                restored.chunks += 1;
                restored.bytes += b.len;
            } else {
                orphans.push(*b);
            }
        }
        for v in &saved.volumes {
            if v.holder == 0 || !clients.contains_key(&v.holder) {
                continue;
            }
            let holder = Holder {
                client: v.holder,
                peer: "(before the memnode restarted)".into(),
                since: now,
            };
            if !vols.hold_unregistered(self.tenant_named(&v.tenant)?, &v.name, holder) {
                return Err(format!("volume {} cannot be held again", v.id));
            }
            self.heard().insert(v.holder, now);
        }
        drop(vols);
        drop(clients);
        for b in &orphans {
            restored.freed += 1;
            self.pool.release_unregistered(b.owner, &[b.addr]);
        }
        self.recount();
        self.log_removed_tenants();
        self.save();
        Ok(restored)
    }

    /// Adds as removed every tenant the books name and the tenants do not.
    fn add_removed_tenants(&mut self, saved: &SavedState) {
        let named = saved
            .sessions
            .iter()
            .map(|s| &s.tenant)
            .chain(saved.volumes.iter().map(|v| &v.tenant));
        for name in named {
            if self.tenants.by_name(name).is_none() {
                std::sync::Arc::make_mut(&mut self.tenants).add_removed(name);
            }
        }
    }

    fn tenant_named(&self, name: &str) -> Result<TenantId, String> {
        self.tenants()
            .by_name(name)
            .ok_or_else(|| format!("the books name tenant {name:?}, which was not added"))
    }

    /// Says, for each tenant the books name and the tenants file does not, what it
    /// holds and that no one can reach it.
    fn log_removed_tenants(&self) {
        for t in self.tenant_views().into_iter().filter(|t| t.removed) {
            log::warn!(
                "tenant {:?} is in this memory file's books but not among the tenants: its {} volumes and {} of memory are kept and no client can reach them; list it again (with its token) to give them back",
                t.name,
                t.usage.volumes,
                rmemfs_common::size::format_size(t.usage.bytes)
            );
        }
    }
}
