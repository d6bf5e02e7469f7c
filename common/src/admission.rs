//! Who may hold a connection slot of a server that anyone can reach: the caps on
//! connections that have not proven who they are, kept apart from the ones that
//! have, so that a flood of the first kind never shuts out the second.
//!
//! A connection is *pending* from accept until it authenticates (a fabric
//! connection's Hello, or for the metrics endpoint never: it stays pending until it
//! is answered) and *authenticated* after. The bounds:
//!
//! - **pending, per source address**: when an address already holds its share, its
//!   own oldest pending connection is closed for the new one. A flood from one
//!   address churns only that address's slots. An IPv6 address counts by its /64, as
//!   one host commonly has a whole /64 to pick from.
//! - **pending, in all**: when full, the oldest pending connection (of any address)
//!   is closed for the new one.
//! - **authenticated**: a connection that authenticates when this is full is refused
//!   (its caller closes it); one that stops being so frees its slot.
//! - **live**, the threads' bound: authenticated and pending connections, plus as
//!   many again pending ones that were closed to make room and whose threads are on
//!   their way out ([`Caps::ceiling`]). A new connection at the ceiling waits a
//!   moment ([`Admission::admit_within`]) for those threads to end, which they are
//!   doing: a flood faster than threads end is slowed to their pace (the rest wait in
//!   the kernel's accept queue) rather than answered by refusing whoever comes next,
//!   a good client included. Only a ceiling still full after that wait refuses.
//!
//! Why close the oldest instead of refusing the newest: refusing lets whoever holds
//! the slots keep everyone out (1024 idle sockets kept a client with the right token
//! out of a memnode, issue 54). Closing the oldest means idle sockets, however many,
//! delay a newcomer not at all; only a flood that opens a whole cap's worth of new
//! connections within a newcomer's handshake (from the newcomer's own address, or
//! from as many addresses as the global cap divided by the per-address one) can push
//! it out, and a deadline of the server's own ends every pending connection soon
//! whatever it does.
//!
//! Evictions and refusals are logged here, each kind at most once per
//! [`LOG_EVERY`](crate::throttle::LOG_EVERY) with a count of the rest.

use crate::sync::{lock, wait_timeout_while};
use crate::throttle::{and_more, Throttle, LOG_EVERY};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use thiserror::Error;

/// The bounds of an [`Admission`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Connections past their authentication.
    pub authenticated: usize,
    /// Connections not yet authenticated, from every address together.
    pub pending: usize,
    /// Connections not yet authenticated from one address (an IPv6 /64).
    pub pending_per_source: usize,
}

impl Caps {
    /// Most connections alive at once in any state: authenticated and pending ones,
    /// and as many again pending ones closed to make room whose threads have not
    /// ended yet.
    pub fn ceiling(&self) -> usize {
        self.authenticated + 2 * self.pending
    }
}

/// Why a connection was refused; the caller closes it.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Refused {
    #[error("{live} connections are open, the most this server keeps")]
    Ceiling { live: usize },
    #[error("{max} authenticated connections are open already")]
    Authenticated { max: usize },
    #[error("it was closed to make room for a newer connection")]
    Evicted,
}

/// An address, as the per-source cap counts it: IPv4 (an IPv4-mapped IPv6 address
/// too) whole, IPv6 by its /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source(IpAddr);

impl Source {
    pub fn of(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(v4) => Source(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source(IpAddr::V4(v4)),
                None => {
                    let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                    Source(IpAddr::V6(Ipv6Addr::from(prefix)))
                }
            },
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// What closes a connection from outside its own thread (shutting its socket down,
/// or raising its close flag); called at most once, never under the admission's lock.
pub type Closer = Box<dyn FnOnce() + Send>;

/// The slots of one server (see the module's comment).
pub struct Admission {
    caps: Caps,
    /// The server, in log lines ("fabric", "metrics").
    name: &'static str,
    /// What "pending" means for this server, in log lines.
    pending_means: &'static str,
    state: Mutex<State>,
    /// Notified when a connection's slot is freed (its ticket dropped).
    freed: Condvar,
    evictions: Throttle,
    refusals: Throttle,
}

#[derive(Default)]
struct State {
    next: u64,
    /// By admission order: the first is the oldest.
    pending: BTreeMap<u64, Pending>,
    per_source: HashMap<Source, usize>,
    authenticated: usize,
    live: usize,
}

struct Pending {
    source: Source,
    since: Instant,
    close: Closer,
}

impl State {
    fn take_pending(&mut self, seq: u64) -> Option<Pending> {
        let p = self.pending.remove(&seq)?;
        if let Some(n) = self.per_source.get_mut(&p.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&p.source);
            }
        }
        Some(p)
    }
}

/// How many connections are in each state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub pending: usize,
    pub authenticated: usize,
    pub live: usize,
}

impl Admission {
    /// An admission with `caps` (each at least 1), for the server `name` whose
    /// pending connections are ones `pending_means` (e.g. "that have not completed
    /// their Hello").
    pub fn new(caps: Caps, name: &'static str, pending_means: &'static str) -> Arc<Admission> {
        let caps = Caps {
            authenticated: caps.authenticated,
            pending: caps.pending.max(1),
            pending_per_source: caps.pending_per_source.max(1),
        };
        Arc::new(Admission {
            caps,
            name,
            pending_means,
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
            evictions: Throttle::new(LOG_EVERY),
            refusals: Throttle::new(LOG_EVERY),
        })
    }

    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// Admits a new connection from `peer` as pending, closing the oldest pending
    /// connection of its address, or of all, when that cap is full. `close` is how
    /// this connection is closed should it be evicted in turn. Refused only at the
    /// ceiling (logged here).
    pub fn admit(self: &Arc<Self>, peer: IpAddr, close: Closer) -> Result<Ticket, Refused> {
        self.admit_within(peer, close, Duration::ZERO)
    }

    /// As [`Admission::admit`], waiting up to `wait` at the ceiling for the threads
    /// of connections closed to make room to end. For a caller whose waiting holds
    /// up nothing that frees slots (an accepting thread, not a server's only one).
    pub fn admit_within(
        self: &Arc<Self>,
        peer: IpAddr,
        close: Closer,
        wait: Duration,
    ) -> Result<Ticket, Refused> {
        let source = Source::of(peer);
        let ceiling = self.caps.ceiling();
        let (evicted, why, seq) = {
            let mut st = lock(&self.state);
            if st.live >= ceiling && !wait.is_zero() {
                st = wait_timeout_while(&self.freed, st, wait, |st| st.live >= ceiling).0;
            }
            if st.live >= ceiling {
                let live = st.live;
                drop(st);
                if let Some(n) = self.refusals.check() {
                    log::warn!(
                        "{}: refusing a connection from {peer}: {live} connections are open, \
                         the most it keeps{}",
                        self.name,
                        and_more(n)
                    );
                }
                return Err(Refused::Ceiling { live });
            }
            let from_source = st.per_source.get(&source).copied().unwrap_or(0);
            let (victim, why) = if from_source >= self.caps.pending_per_source {
                let oldest = st.pending.iter().find(|(_, p)| p.source == source);
                (
                    oldest.map(|(seq, _)| *seq),
                    format!("at most {} per address", self.caps.pending_per_source),
                )
            } else if st.pending.len() >= self.caps.pending {
                (
                    st.pending.keys().next().copied(),
                    format!("at most {} in all", self.caps.pending),
                )
            } else {
                (None, String::new())
            };
            let evicted = victim.and_then(|v| st.take_pending(v));
            let seq = st.next;
            st.next += 1;
            st.pending.insert(
                seq,
                Pending {
                    source,
                    since: Instant::now(),
                    close,
                },
            );
            *st.per_source.entry(source).or_insert(0) += 1;
            st.live += 1;
            (evicted, why, seq)
        };
        if let Some(old) = evicted {
            if let Some(n) = self.evictions.check() {
                log::warn!(
                    "{}: closed a connection from {} open {:.1?} {} ({why}), for a newer one \
                     from {peer}{}",
                    self.name,
                    old.source,
                    old.since.elapsed(),
                    self.pending_means,
                    and_more(n)
                );
            }
            (old.close)();
        }
        Ok(Ticket {
            admission: self.clone(),
            seq,
            authenticated: false,
        })
    }

    /// Closes every pending connection (a server shutting down).
    pub fn close_pending(&self) {
        let closers: Vec<Closer> = {
            let mut st = lock(&self.state);
            let seqs: Vec<u64> = st.pending.keys().copied().collect();
            seqs.into_iter()
                .filter_map(|s| st.take_pending(s))
                .map(|p| p.close)
                .collect()
        };
        for close in closers {
            close();
        }
    }

    pub fn counts(&self) -> Counts {
        let st = lock(&self.state);
        Counts {
            pending: st.pending.len(),
            authenticated: st.authenticated,
            live: st.live,
        }
    }
}

/// One admitted connection's slot, held by its thread; dropping it frees the slot.
pub struct Ticket {
    admission: Arc<Admission>,
    seq: u64,
    authenticated: bool,
}

impl Ticket {
    /// Moves the connection from pending to authenticated. Refused when the
    /// authenticated cap is full (logged here) or the connection was evicted
    /// meanwhile: the caller closes it.
    pub fn authenticate(&mut self) -> Result<(), Refused> {
        if self.authenticated {
            return Ok(());
        }
        let a = &self.admission;
        let mut st = lock(&a.state);
        if !st.pending.contains_key(&self.seq) {
            return Err(Refused::Evicted);
        }
        if st.authenticated >= a.caps.authenticated {
            drop(st);
            if let Some(n) = a.refusals.check() {
                log::warn!(
                    "{}: refusing a connection that authenticated: {} authenticated \
                     connections are open, the most it keeps{}",
                    a.name,
                    a.caps.authenticated,
                    and_more(n)
                );
            }
            return Err(Refused::Authenticated {
                max: a.caps.authenticated,
            });
        }
        st.take_pending(self.seq);
        st.authenticated += 1;
        self.authenticated = true;
        Ok(())
    }

    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }

    /// True when the connection was closed to make room for another (its closer
    /// was called and the eviction logged): its end needs no line of its own.
    pub fn was_evicted(&self) -> bool {
        !self.authenticated && !lock(&self.admission.state).pending.contains_key(&self.seq)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = lock(&self.admission.state);
        if self.authenticated {
            st.authenticated -= 1;
        } else {
            // Its closer, if it is still there, is dropped unused: the connection
            // is ending anyway.
            st.take_pending(self.seq);
        }
        st.live -= 1;
        drop(st);
        self.admission.freed.notify_one();
    }
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
