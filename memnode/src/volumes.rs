//! The volume table: which volumes exist, which chunks each one has, who holds each
//! one, and which clients were fenced. Pure bookkeeping: no locks, no memory, no
//! registrations (the control service does those with the pool and records the
//! result here), so every rule is unit-tested on its own.
//!
//! A volume is a named set of chunks booked to the volume (`Owner::Volume(id)` in
//! the allocator), never to a client: they outlive every connection until the volume
//! is destroyed. It belongs to a tenant (`tenants.rs`), and its name is one of that
//! tenant's: every lookup is by (tenant, name), so two tenants' volumes of one name
//! are two volumes, and a tenant never finds, lists, holds or destroys another's. Its first chunk, the **root**, is one region page, made when the
//! volume is created; it can only go with the volume.
//!
//! At most one client **holds** a volume at a time, and a client holds at most one
//! volume. The holder's client id is **bound** to it: its allocations and frees are
//! the volume's. While a volume is held, every one of its chunks is registered for
//! the holder (each has an rkey); while it is not, none is. A holder is **live**
//! while it was heard from within the lease; opening a volume with a live holder is
//! refused ([`VolumeError::Busy`]) unless it is a takeover. A takeover, or an open
//! after the lease ran out, **fences** the old holder: it loses the volume and is
//! remembered as fenced (its volume requests are refused) until it opens a volume
//! again or its last connection closes.
//!
//! Invariants (checked by [`VolumeTable::check_invariants`] in tests):
//! - `held` maps a client to a volume exactly when that volume's holder is the
//!   client;
//! - a held volume's chunks all have an rkey, an unheld volume's none; except that
//!   a volume put back by a memnode restarted on its memory file is held with none
//!   until its holder's session comes back ([`VolumeTable::hold_unregistered`],
//!   [`VolumeTable::set_rkeys`]): the holder's connection is what registration
//!   needs over verbs;
//! - every volume has its root among its chunks, and `bytes` is the sum of their
//!   lengths;
//! - no client is both a holder and fenced; volume ids are unique.

use crate::tenants::TenantId;
use rmemfs_common::protocol::{Allocation, VolumeSummary};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Bound;
use std::time::{Duration, Instant};
use thiserror::Error;

/// The client holding a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub client: u64,
    /// The address of the connection it opened the volume on, for messages.
    pub peer: String,
    /// When it opened the volume.
    pub since: Instant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct VolumeChunk {
    len: u64,
    /// The registration for the holder; `None` while the volume is not held.
    rkey: Option<u32>,
}

/// A volume's place in the table: its tenant and its name.
type Key = (TenantId, Vec<u8>);

fn key(tenant: TenantId, name: &[u8]) -> Key {
    (tenant, name.to_vec())
}

/// One volume.
#[derive(Debug)]
pub struct Volume {
    id: u64,
    tenant: TenantId,
    name: Vec<u8>,
    root: u64,
    chunks: BTreeMap<u64, VolumeChunk>,
    bytes: u64,
    holder: Option<Holder>,
}

impl Volume {
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn name(&self) -> &[u8] {
        &self.name
    }

    pub fn tenant(&self) -> TenantId {
        self.tenant
    }

    /// Bytes of all chunks, root included.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    #[cfg(test)]
    pub fn holder(&self) -> Option<&Holder> {
        self.holder.as_ref()
    }

    /// Chunks, root included.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// True when `addr` is the root chunk's address.
    pub fn is_root(&self, addr: u64) -> bool {
        addr == self.root
    }

    /// Start addresses of every chunk, root included, in address order.
    pub fn addrs(&self) -> Vec<u64> {
        self.chunks.keys().copied().collect()
    }

    /// The current registrations (empty while the volume is not held).
    #[cfg(test)]
    pub fn rkeys(&self) -> Vec<u32> {
        self.chunks.values().filter_map(|c| c.rkey).collect()
    }

    /// What `VolumeOpened` says about the volume: `None` while it is not held (the
    /// root has no rkey then).
    pub fn info(&self, created: bool) -> Option<rmemfs_common::protocol::VolumeInfo> {
        let root = self.chunks.get(&self.root)?;
        Some(rmemfs_common::protocol::VolumeInfo {
            volume_id: self.id,
            created,
            root: Allocation {
                addr: self.root,
                len: root.len,
                rkey: root.rkey?,
            },
            chunks: u32::try_from(self.chunks.len()).unwrap_or(u32::MAX),
            bytes: self.bytes,
        })
    }

    /// Up to `max` registered chunks with `addr > after`, root excluded, in address
    /// order, and whether more follow.
    pub fn chunks_after(&self, after: u64, max: usize) -> (Vec<Allocation>, bool) {
        let mut page = Vec::new();
        let mut rest = self
            .chunks
            .range((Bound::Excluded(after), Bound::Unbounded))
            .filter(|(&addr, _)| addr != self.root)
            .filter_map(|(&addr, c)| {
                c.rkey.map(|rkey| Allocation {
                    addr,
                    len: c.len,
                    rkey,
                })
            });
        for a in rest.by_ref().take(max) {
            page.push(a);
        }
        let more = rest.next().is_some();
        (page, more)
    }

    pub fn summary(&self) -> VolumeSummary {
        VolumeSummary {
            name: self.name.clone(),
            volume_id: self.id,
            bytes: self.bytes,
            chunks: u32::try_from(self.chunks.len()).unwrap_or(u32::MAX),
            holder: self.holder.as_ref().map_or(0, |h| h.client),
        }
    }

    /// Forgets every registration and the holder; returns the rkeys to deregister.
    fn let_go(&mut self) -> (Option<Holder>, Vec<u32>) {
        let rkeys = self
            .chunks
            .values_mut()
            .filter_map(|c| c.rkey.take())
            .collect();
        (self.holder.take(), rkeys)
    }
}

/// Why a volume request is refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum VolumeError {
    #[error("no volume named {}", show(.0))]
    NotFound(Vec<u8>),
    #[error("this client already holds volume {}; close it before opening {}", show(.held), show(.wanted))]
    HoldsAnother { held: Vec<u8>, wanted: Vec<u8> },
    #[error("{}", busy_message(.name, *.client, .peer, *.held_for, *.last_heard))]
    Busy {
        name: Vec<u8>,
        client: u64,
        peer: String,
        held_for: Duration,
        last_heard: Option<Duration>,
    },
    #[error("this client holds no volume")]
    NotHeld,
    #[error("this client's hold on its volume was taken over by another client")]
    Fenced,
    #[error("the root chunk at {0:#x} goes only with its volume")]
    Root(u64),
    #[error("no chunk of this volume starts at {0:#x}")]
    NoChunk(u64),
}

fn busy_message(
    name: &[u8],
    client: u64,
    peer: &str,
    held_for: Duration,
    last_heard: Option<Duration>,
) -> String {
    let heard = match last_heard {
        Some(d) => format!("{:.1}s ago", d.as_secs_f64()),
        None => "never".into(),
    };
    format!(
        "volume {} is held by client {client:#x} from {peer} for {:.1}s, last heard from {heard}",
        show(name),
        held_for.as_secs_f64()
    )
}

/// A volume name for messages (names are ASCII; anything else is shown escaped).
fn show(name: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(name))
}

/// Why an open takes a volume from its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeoverReason {
    /// The opener asked to take over a live holder.
    Requested,
    /// The holder was not heard from within the lease.
    LeaseExpired,
}

/// What an open has to do, decided by [`VolumeTable::plan_open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenPlan {
    /// The client holds this volume already: answer with its info, change nothing.
    AlreadyHeld,
    /// Create the volume with this id: book its root chunk to it, then
    /// [`VolumeTable::create`].
    Create { id: u64 },
    /// Hold the existing volume `id`: first [`VolumeTable::fence`] `fence` when it
    /// is set, register every chunk for the opener, then [`VolumeTable::hold`].
    Hold {
        id: u64,
        fence: Option<(Holder, TakeoverReason)>,
    },
}

/// What a destroy has to do, decided by [`VolumeTable::plan_destroy`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestroyPlan {
    pub id: u64,
    /// The holder that is not live any more (it is fenced by the destroy).
    pub fence: Option<Holder>,
}

/// Every volume of a memnode; see the module docs.
#[derive(Debug, Default)]
pub struct VolumeTable {
    /// By tenant and name, so a tenant's listing is in name order.
    volumes: BTreeMap<Key, Volume>,
    /// Client -> the volume it holds.
    held: HashMap<u64, Key>,
    fenced: HashSet<u64>,
    /// The last volume id handed out.
    last_id: u64,
}

impl VolumeTable {
    pub fn new() -> VolumeTable {
        VolumeTable::default()
    }

    pub fn get(&self, tenant: TenantId, name: &[u8]) -> Option<&Volume> {
        self.volumes.get(&key(tenant, name))
    }

    /// The volume `client` holds.
    pub fn held_by(&self, client: u64) -> Option<&Volume> {
        self.volumes.get(self.held.get(&client)?)
    }

    pub fn is_fenced(&self, client: u64) -> bool {
        self.fenced.contains(&client)
    }

    /// The volume `client` holds, or why it may not use one: fenced, or holding none.
    pub fn bound(&self, client: u64) -> Result<&Volume, VolumeError> {
        if self.is_fenced(client) {
            return Err(VolumeError::Fenced);
        }
        self.held_by(client).ok_or(VolumeError::NotHeld)
    }

    /// Decides what `client` of `tenant` opening `name` takes. `last_heard(c)` is how
    /// long ago client `c` was last heard from (`None`: it has no connection); a
    /// holder heard from within `lease` is live.
    #[allow(clippy::too_many_arguments)]
    pub fn plan_open(
        &self,
        client: u64,
        tenant: TenantId,
        name: &[u8],
        create: bool,
        takeover: bool,
        lease: Duration,
        last_heard: impl Fn(u64) -> Option<Duration>,
    ) -> Result<OpenPlan, VolumeError> {
        if let Some(held) = self.held.get(&client) {
            if held.0 == tenant && held.1 == name {
                return Ok(OpenPlan::AlreadyHeld);
            }
            return Err(VolumeError::HoldsAnother {
                held: held.1.clone(),
                wanted: name.to_vec(),
            });
        }
        let Some(v) = self.volumes.get(&key(tenant, name)) else {
            if !create {
                return Err(VolumeError::NotFound(name.to_vec()));
            }
            return Ok(OpenPlan::Create {
                id: self.last_id + 1,
            });
        };
        let fence = match &v.holder {
            None => None,
            Some(h) => {
                let heard = last_heard(h.client);
                let live = heard.is_some_and(|d| d <= lease);
                if live && !takeover {
                    return Err(busy(v, h, heard));
                }
                let why = if live {
                    TakeoverReason::Requested
                } else {
                    TakeoverReason::LeaseExpired
                };
                Some((h.clone(), why))
            }
        };
        Ok(OpenPlan::Hold { id: v.id, fence })
    }

    /// Adds a new volume held by `holder`, with its root chunk `root` (booked to
    /// `Owner::Volume(id)` and registered for the holder). `id` comes from
    /// [`VolumeTable::plan_open`]'s `Create`. `None`, changing nothing, when the
    /// name or the id is taken or the holder holds a volume already.
    pub fn create(
        &mut self,
        id: u64,
        tenant: TenantId,
        name: &[u8],
        root: Allocation,
        holder: Holder,
    ) -> Option<&Volume> {
        let k = key(tenant, name);
        if self.volumes.contains_key(&k)
            || self.held.contains_key(&holder.client)
            || id <= self.last_id
        {
            return None;
        }
        self.last_id = id;
        self.fenced.remove(&holder.client);
        self.held.insert(holder.client, k.clone());
        let chunks = BTreeMap::from([(
            root.addr,
            VolumeChunk {
                len: root.len,
                rkey: Some(root.rkey),
            },
        )]);
        Some(self.volumes.entry(k).or_insert(Volume {
            id,
            tenant,
            name: name.to_vec(),
            root: root.addr,
            chunks,
            bytes: root.len,
            holder: Some(holder),
        }))
    }

    /// Takes volume `name` from its holder and remembers the holder as fenced;
    /// returns the holder and the rkeys to deregister.
    pub fn fence(&mut self, tenant: TenantId, name: &[u8]) -> Option<(Holder, Vec<u32>)> {
        let v = self.volumes.get_mut(&key(tenant, name))?;
        let (holder, rkeys) = v.let_go();
        let holder = holder?;
        self.held.remove(&holder.client);
        self.fenced.insert(holder.client);
        Some((holder, rkeys))
    }

    /// Lets go of the volume `client` holds (close, or its last connection closed):
    /// returns the volume's name and the rkeys to deregister. The chunks stay.
    pub fn release(&mut self, client: u64) -> Option<(Vec<u8>, Vec<u32>)> {
        let k = self.held.remove(&client)?;
        let v = self.volumes.get_mut(&k)?;
        let (_, rkeys) = v.let_go();
        Some((k.1, rkeys))
    }

    /// `client`'s last connection closed: releases its volume (as
    /// [`VolumeTable::release`]) and forgets that it was fenced.
    pub fn client_gone(&mut self, client: u64) -> Option<(Vec<u8>, Vec<u32>)> {
        self.fenced.remove(&client);
        self.release(client)
    }

    /// Makes `holder` the holder of the unheld volume `name`, with `rkeys` (chunk
    /// address -> rkey) registered for it, one for every chunk. Returns `false` and
    /// changes nothing when the volume is missing or held, or `rkeys` does not cover
    /// exactly its chunks.
    pub fn hold(
        &mut self,
        tenant: TenantId,
        name: &[u8],
        holder: Holder,
        rkeys: &[(u64, u32)],
    ) -> bool {
        if self.held.contains_key(&holder.client) {
            return false;
        }
        let k = key(tenant, name);
        let Some(v) = self.volumes.get_mut(&k) else {
            return false;
        };
        let covers = rkeys.len() == v.chunks.len()
            && rkeys.iter().all(|(a, _)| v.chunks.contains_key(a))
            && rkeys.iter().map(|(a, _)| a).collect::<HashSet<_>>().len() == rkeys.len();
        if v.holder.is_some() || !covers {
            return false;
        }
        for &(addr, rkey) in rkeys {
            if let Some(c) = v.chunks.get_mut(&addr) {
                c.rkey = Some(rkey);
            }
        }
        self.fenced.remove(&holder.client);
        self.held.insert(holder.client, k);
        v.holder = Some(holder);
        true
    }

    /// Files a chunk allocated by `client` (booked to its volume, registered for it)
    /// in the volume it holds. `false` when it holds none.
    pub fn add_chunk(&mut self, client: u64, chunk: Allocation) -> bool {
        let Some(v) = self.held.get(&client).and_then(|n| self.volumes.get_mut(n)) else {
            return false;
        };
        let old = v.chunks.insert(
            chunk.addr,
            VolumeChunk {
                len: chunk.len,
                rkey: Some(chunk.rkey),
            },
        );
        debug_assert!(old.is_none(), "chunk {:#x} filed twice", chunk.addr);
        if let Some(old) = old {
            v.bytes -= old.len;
        }
        v.bytes += chunk.len;
        true
    }

    /// Checks that `client` may free the chunk at `addr` of the volume it holds (it
    /// exists and is not the root); returns the volume's id.
    pub fn check_free(&self, client: u64, addr: u64) -> Result<u64, VolumeError> {
        let v = self.bound(client)?;
        if v.is_root(addr) {
            return Err(VolumeError::Root(addr));
        }
        if !v.chunks.contains_key(&addr) {
            return Err(VolumeError::NoChunk(addr));
        }
        Ok(v.id)
    }

    /// Forgets the chunk at `addr` of the volume `client` holds (freed by the pool).
    pub fn remove_chunk(&mut self, client: u64, addr: u64) -> bool {
        let Some(v) = self.held.get(&client).and_then(|n| self.volumes.get_mut(n)) else {
            return false;
        };
        if v.is_root(addr) {
            return false;
        }
        match v.chunks.remove(&addr) {
            Some(c) => {
                v.bytes -= c.len;
                true
            }
            None => false,
        }
    }

    /// Decides whether `client` may destroy `name`: not while another client holds it
    /// and is live (see [`VolumeTable::plan_open`] for `lease` and `last_heard`).
    pub fn plan_destroy(
        &self,
        client: u64,
        tenant: TenantId,
        name: &[u8],
        lease: Duration,
        last_heard: impl Fn(u64) -> Option<Duration>,
    ) -> Result<DestroyPlan, VolumeError> {
        let v = self
            .volumes
            .get(&key(tenant, name))
            .ok_or_else(|| VolumeError::NotFound(name.to_vec()))?;
        let fence = match &v.holder {
            Some(h) if h.client != client => {
                let heard = last_heard(h.client);
                if heard.is_some_and(|d| d <= lease) {
                    return Err(busy(v, h, heard));
                }
                Some(h.clone())
            }
            _ => None,
        };
        Ok(DestroyPlan { id: v.id, fence })
    }

    /// Forgets the volume `name`, which must not be held (release or fence it
    /// first). Returns it: its chunks are the caller's to free.
    pub fn remove(&mut self, tenant: TenantId, name: &[u8]) -> Option<Volume> {
        let k = key(tenant, name);
        if self.volumes.get(&k)?.holder.is_some() {
            return None;
        }
        self.volumes.remove(&k)
    }

    /// `tenant`'s volumes whose name sorts after `after`, in name order.
    pub fn after<'a>(
        &'a self,
        tenant: TenantId,
        after: &[u8],
    ) -> impl Iterator<Item = &'a Volume> + 'a {
        self.volumes
            .range((Bound::Excluded(key(tenant, after)), Bound::Unbounded))
            .take_while(move |((t, _), _)| *t == tenant)
            .map(|(_, v)| v)
    }

    /// How many volumes `tenant` has and their bytes.
    pub fn usage_of(&self, tenant: TenantId) -> (u64, u64) {
        self.volumes
            .values()
            .filter(|v| v.tenant == tenant)
            .fold((0, 0), |(n, b), v| (n + 1, b + v.bytes))
    }

    /// What a memory file saves of the table: each volume (id, tenant, name, root,
    /// holder), the fenced clients, the last id handed out. `tenant_name` names a
    /// tenant: the books name tenants, never number them.
    pub fn saved(
        &self,
        tenant_name: impl Fn(TenantId) -> String,
    ) -> (Vec<crate::saved::SavedVolume>, Vec<u64>, u64) {
        let volumes = self
            .volumes
            .values()
            .map(|v| crate::saved::SavedVolume {
                id: v.id,
                tenant: tenant_name(v.tenant),
                name: v.name.clone(),
                root: v.root,
                holder: v.holder.as_ref().map_or(0, |h| h.client),
            })
            .collect();
        (volumes, self.fenced.iter().copied().collect(), self.last_id)
    }

    /// Puts back a saved volume, unheld, with its chunks (address -> length, the
    /// root among them). Refused, changing nothing, when the name or id is taken or
    /// the root is not one of the chunks.
    pub fn restore(
        &mut self,
        id: u64,
        tenant: TenantId,
        name: &[u8],
        root: u64,
        chunks: &BTreeMap<u64, u64>,
    ) -> Result<(), String> {
        if self.volumes.contains_key(&key(tenant, name))
            || self.volumes.values().any(|v| v.id == id)
        {
            return Err(format!("volume {} (id {id}) is saved twice", show(name)));
        }
        if !chunks.contains_key(&root) {
            return Err(format!(
                "volume {}'s root {root:#x} is not among its chunks",
                show(name)
            ));
        }
        let chunks: BTreeMap<u64, VolumeChunk> = chunks
            .iter()
            .map(|(&addr, &len)| (addr, VolumeChunk { len, rkey: None }))
            .collect();
        let bytes = chunks.values().map(|c| c.len).sum();
        self.last_id = self.last_id.max(id);
        self.volumes.insert(
            key(tenant, name),
            Volume {
                id,
                tenant,
                name: name.to_vec(),
                root,
                chunks,
                bytes,
                holder: None,
            },
        );
        Ok(())
    }

    /// Makes `holder` the holder of the restored, unheld volume `name` with no chunk
    /// registered yet (they are registered when its session comes back, see
    /// [`VolumeTable::set_rkeys`]). `false`, changing nothing, when it cannot hold it.
    pub fn hold_unregistered(&mut self, tenant: TenantId, name: &[u8], holder: Holder) -> bool {
        if self.held.contains_key(&holder.client) {
            return false;
        }
        let k = key(tenant, name);
        match self.volumes.get_mut(&k) {
            Some(v) if v.holder.is_none() => {
                self.held.insert(holder.client, k);
                v.holder = Some(holder);
                true
            }
            _ => false,
        }
    }

    /// The id and chunk addresses of the volume `client` holds when none of them is
    /// registered (held by [`VolumeTable::hold_unregistered`]).
    pub fn unregistered_of(&self, client: u64) -> Option<(u64, Vec<u64>)> {
        let v = self.held_by(client)?;
        v.chunks
            .values()
            .all(|c| c.rkey.is_none())
            .then(|| (v.id, v.addrs()))
    }

    /// Files the registrations `rkeys` (address -> rkey, one per chunk) of the volume
    /// `client` holds with none. `false`, changing nothing, when they do not cover
    /// exactly its chunks or some are registered already.
    pub fn set_rkeys(&mut self, client: u64, rkeys: &[(u64, u32)]) -> bool {
        let Some(v) = self.held.get(&client).and_then(|n| self.volumes.get_mut(n)) else {
            return false;
        };
        let covers = rkeys.len() == v.chunks.len()
            && rkeys
                .iter()
                .all(|(a, _)| v.chunks.get(a).is_some_and(|c| c.rkey.is_none()))
            && rkeys.iter().map(|(a, _)| a).collect::<HashSet<_>>().len() == rkeys.len();
        if !covers {
            return false;
        }
        for &(addr, rkey) in rkeys {
            if let Some(c) = v.chunks.get_mut(&addr) {
                c.rkey = Some(rkey);
            }
        }
        true
    }

    /// Puts back the saved fenced clients and last volume id.
    pub fn restore_fences(&mut self, fenced: &[u64], last_id: u64) {
        self.fenced.extend(fenced.iter().copied());
        self.last_id = self.last_id.max(last_id);
    }

    /// Every volume of every tenant, by tenant and name.
    pub fn summaries(&self) -> Vec<(TenantId, VolumeSummary)> {
        self.volumes
            .values()
            .map(|v| (v.tenant, v.summary()))
            .collect()
    }

    /// Checks every invariant in the module docs; returns what is broken.
    #[cfg(test)]
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut ids = HashSet::new();
        for ((tenant, name), v) in &self.volumes {
            if name != &v.name || *tenant != v.tenant {
                return Err(format!("volume {:?} filed under {name:?}", v.name));
            }
            if !ids.insert(v.id) || v.id > self.last_id {
                return Err(format!("volume id {} reused or ahead of the counter", v.id));
            }
            if !v.chunks.contains_key(&v.root) {
                return Err(format!("volume {name:?} lost its root"));
            }
            let sum: u64 = v.chunks.values().map(|c| c.len).sum();
            if sum != v.bytes {
                return Err(format!(
                    "volume {name:?}: bytes {} but chunks {sum}",
                    v.bytes
                ));
            }
            let registered = v.chunks.values().filter(|c| c.rkey.is_some()).count();
            match &v.holder {
                Some(h) => {
                    if registered != v.chunks.len() && registered != 0 {
                        return Err(format!("held volume {name:?} has unregistered chunks"));
                    }
                    if self.held.get(&h.client) != Some(&(*tenant, name.clone())) {
                        return Err(format!("holder {:#x} of {name:?} is not bound", h.client));
                    }
                }
                None if registered != 0 => {
                    return Err(format!("unheld volume {name:?} has registered chunks"))
                }
                None => {}
            }
        }
        for (client, name) in &self.held {
            let holder = self.volumes.get(name).and_then(|v| v.holder.as_ref());
            if holder.map(|h| h.client) != Some(*client) {
                return Err(format!(
                    "client {client:#x} bound to {name:?} without holding it"
                ));
            }
            if self.fenced.contains(client) {
                return Err(format!("client {client:#x} holds a volume and is fenced"));
            }
        }
        Ok(())
    }
}

fn busy(v: &Volume, h: &Holder, last_heard: Option<Duration>) -> VolumeError {
    VolumeError::Busy {
        name: v.name.clone(),
        client: h.client,
        peer: h.peer.clone(),
        held_for: h.since.elapsed(),
        last_heard,
    }
}

#[cfg(test)]
#[path = "volumes_tests.rs"]
mod tests;
