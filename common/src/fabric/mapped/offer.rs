//! The memnode's side of the mapped backend: the shared region it offers, the grants
//! it files as the registry registers, and the Unix socket where an authenticated
//! client on this host trades a ticket for the descriptors.
//!
//! How a client gets there: over its tcp connection, after its Hello, it asks for a
//! map ([`MapOffer::issue`], the tcp wire's `OP_MAP`) and gets a one-time ticket (32
//! random bytes, good for [`TICKET_LIFE`]) with the name of an abstract Unix socket.
//! It connects there and sends the ticket; a peer of another user than the memnode's
//! (and not root) is refused (`SO_PEERCRED`). It gets three descriptors: the region,
//! the grant table (read-only mapping) and its own read section. From then on its
//! READs and WRITEs under grants in the table are copies; the rest go over tcp.
//!
//! The connection ends when either side closes the Unix socket or the tcp
//! connection the ticket was issued on ends ([`MapOffer::connection_closed`]): the
//! memnode marks the section closed and waits out copies in flight, so nothing of
//! that client touches the region after.

use super::grants::{Drained, Grant, GrantTable, ReadSection};
use super::pass;
use crate::sync::lock;
use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long a ticket may wait to be redeemed.
pub const TICKET_LIFE: Duration = Duration::from_secs(10);
/// Most tickets outstanding at once; past it the oldest is dropped.
const MAX_TICKETS: usize = 256;
/// How long a revocation waits for a client's copies to leave before it gives up
/// on that client (closing its mapped connection) and goes on.
const DRAIN_DEADLINE: Duration = Duration::from_secs(2);
/// How long a new Unix connection has to send its ticket.
const REDEEM_TIMEOUT: Duration = Duration::from_secs(5);
pub const TICKET_LEN: usize = 32;
/// The offer's layout version (the first byte of an `OP_MAP` reply).
pub const OFFER_VERSION: u8 = 1;

/// Memory of this process backed by a file that can be shared: `[base, base + len)`
/// of the address space is a shared mapping of `fd` from `offset` (a multiple of the
/// file's page size).
#[derive(Debug)]
pub struct SharedRegion {
    pub fd: OwnedFd,
    pub offset: u64,
    pub base: u64,
    pub len: u64,
}

/// What a client needs to redeem its ticket (an `OP_MAP` reply's payload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub socket: Vec<u8>,
    pub ticket: [u8; TICKET_LEN],
    pub offset: u64,
    pub base: u64,
    pub len: u64,
}

impl Offer {
    /// `{version u8, name_len u8, name, ticket [32], offset u64, base u64, len u64}`.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![OFFER_VERSION, self.socket.len() as u8];
        b.extend_from_slice(&self.socket);
        b.extend_from_slice(&self.ticket);
        b.extend_from_slice(&self.offset.to_le_bytes());
        b.extend_from_slice(&self.base.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Offer, String> {
        let bad = || format!("malformed map offer ({} bytes)", b.len());
        match b.first() {
            Some(&OFFER_VERSION) => {}
            Some(v) => {
                return Err(format!(
                    "map offer of version {v}, expected {OFFER_VERSION}"
                ))
            }
            None => return Err(bad()),
        }
        let n = *b.get(1).ok_or_else(bad)? as usize;
        if b.len() != 2 + n + TICKET_LEN + 24 {
            return Err(bad());
        }
        let socket = b[2..2 + n].to_vec();
        let rest = &b[2 + n..];
        let ticket: [u8; TICKET_LEN] = rest[..TICKET_LEN].try_into().map_err(|_| bad())?;
        let offset = crate::le::u64_at(rest, TICKET_LEN).ok_or_else(bad)?;
        let base = crate::le::u64_at(rest, TICKET_LEN + 8).ok_or_else(bad)?;
        let len = crate::le::u64_at(rest, TICKET_LEN + 16).ok_or_else(bad)?;
        Ok(Offer {
            socket,
            ticket,
            offset,
            base,
            len,
        })
    }
}

struct Ticket {
    client: u64,
    conn_id: u64,
    expires: Instant,
}

/// One client's mapped connection.
struct MappedConn {
    client: u64,
    /// The tcp connection its ticket came from.
    conn_id: u64,
    section: ReadSection,
    stream: UnixStream,
    peer: String,
}

impl MappedConn {
    /// True once the client closed its end (it never sends after its ticket).
    fn gone(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents != 0
    }

    /// Marks the section closed, waits out copies in flight and closes the socket:
    /// nothing of this connection touches the region after.
    fn close(&self, why: &str) {
        self.section.close();
        if self
            .section
            .synchronize(Instant::now() + DRAIN_DEADLINE, || self.gone())
            == Drained::TimedOut
        {
            log::warn!(
                "mapped client {} ({}): a copy still in flight {DRAIN_DEADLINE:?} after \
                 its connection closed ({why})",
                self.client,
                self.peer
            );
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// The memnode's offer of its region (see the module docs).
pub struct MapOffer {
    region: SharedRegion,
    table_fd: OwnedFd,
    /// The writer's view; the lock serializes writers.
    table: Mutex<GrantTable>,
    socket: Vec<u8>,
    tickets: Mutex<HashMap<[u8; TICKET_LEN], Ticket>>,
    conns: Mutex<Vec<Arc<MappedConn>>>,
    /// The memnode's user: clients of another (but root) are refused.
    uid: u32,
    stopping: AtomicBool,
}

impl std::fmt::Debug for MapOffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapOffer")
            .field("region", &self.region)
            .field("socket", &String::from_utf8_lossy(&self.socket))
            .finish_non_exhaustive()
    }
}

impl MapOffer {
    /// Offers `region`, listening on a fresh abstract Unix socket.
    pub fn start(region: SharedRegion) -> io::Result<Arc<MapOffer>> {
        let (table_fd, table) = GrantTable::create()?;
        let mut name = [0u8; 12];
        getrandom::fill(&mut name).map_err(|e| io::Error::other(e.to_string()))?;
        let socket = format!(
            "rmemfs-memnode-{}",
            name.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )
        .into_bytes();
        let listener = UnixListener::bind_addr(&UnixAddr::from_abstract_name(&socket)?)?;
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        let offer = Arc::new(MapOffer {
            region,
            table_fd,
            table: Mutex::new(table),
            socket,
            tickets: Mutex::new(HashMap::new()),
            conns: Mutex::new(Vec::new()),
            uid,
            stopping: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&offer);
        std::thread::Builder::new()
            .name("map-offer".into())
            .spawn(move || accept_loop(listener, weak))?;
        Ok(offer)
    }

    /// The region offered.
    pub fn region(&self) -> (u64, u64) {
        (self.region.base, self.region.len)
    }

    /// A ticket for `client`, on tcp connection `conn_id`: the `OP_MAP` reply.
    pub fn issue(&self, client: u64, conn_id: u64) -> Result<Vec<u8>, String> {
        let mut ticket = [0u8; TICKET_LEN];
        getrandom::fill(&mut ticket).map_err(|e| format!("no randomness for a ticket: {e}"))?;
        let now = Instant::now();
        {
            let mut tickets = lock(&self.tickets);
            tickets.retain(|_, t| t.expires > now);
            if tickets.len() >= MAX_TICKETS {
                if let Some(oldest) = tickets
                    .iter()
                    .min_by_key(|(_, t)| t.expires)
                    .map(|(k, _)| *k)
                {
                    tickets.remove(&oldest);
                }
            }
            tickets.insert(
                ticket,
                Ticket {
                    client,
                    conn_id,
                    expires: now + TICKET_LIFE,
                },
            );
        }
        self.prune();
        Ok(Offer {
            socket: self.socket.clone(),
            ticket,
            offset: self.region.offset,
            base: self.region.base,
            len: self.region.len,
        }
        .encode())
    }

    /// The registry registered `[addr, addr + len)` for `owner` under `rkey`: files
    /// the grant if the range lies in the region.
    pub fn granted(&self, rkey: u32, owner: u64, addr: u64, len: u64) {
        let (base, size) = self.region();
        let Some(end) = addr.checked_add(len) else {
            return;
        };
        if addr >= base && end <= base + size {
            lock(&self.table).insert(rkey, Grant { owner, addr, end });
        }
    }

    /// The registry is revoking `rkey`: takes its grant out and waits until no copy
    /// of its owner's mapped connections can still be using it.
    pub fn revoked(&self, rkey: u32) {
        let Some(grant) = lock(&self.table).remove(rkey) else {
            return;
        };
        let conns: Vec<Arc<MappedConn>> = lock(&self.conns)
            .iter()
            .filter(|c| c.client == grant.owner)
            .cloned()
            .collect();
        for c in conns {
            match c
                .section
                .synchronize(Instant::now() + DRAIN_DEADLINE, || c.gone())
            {
                Drained::Yes => {}
                Drained::ClientGone => self.drop_conn(&c, "the client closed it"),
                Drained::TimedOut => {
                    log::warn!(
                        "mapped client {} ({}): a copy still in flight {DRAIN_DEADLINE:?} \
                         after its grant was revoked; closing its mapped connection",
                        c.client,
                        c.peer
                    );
                    self.drop_conn(&c, "a copy outlived a revocation");
                }
            }
        }
    }

    /// The tcp connection `conn_id` ended: so do the mapped connections and tickets
    /// that came from it.
    pub fn connection_closed(&self, conn_id: u64) {
        lock(&self.tickets).retain(|_, t| t.conn_id != conn_id);
        let gone: Vec<Arc<MappedConn>> = {
            let mut conns = lock(&self.conns);
            let (gone, keep) = conns.drain(..).partition(|c| c.conn_id == conn_id);
            *conns = keep;
            gone
        };
        for c in gone {
            c.close("its tcp connection ended");
        }
    }

    /// Mapped connections alive (tests, metrics).
    pub fn connections(&self) -> usize {
        self.prune();
        lock(&self.conns).len()
    }

    /// Stops accepting and closes every mapped connection.
    pub fn shutdown(&self) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the accept loop so it sees `stopping`.
        if let Ok(addr) = UnixAddr::from_abstract_name(&self.socket) {
            let _ = UnixStream::connect_addr(&addr);
        }
        let all: Vec<Arc<MappedConn>> = lock(&self.conns).drain(..).collect();
        for c in all {
            c.close("the memnode is shutting down");
        }
    }

    fn drop_conn(&self, c: &Arc<MappedConn>, why: &str) {
        lock(&self.conns).retain(|x| !Arc::ptr_eq(x, c));
        c.close(why);
    }

    /// Forgets connections whose clients closed them.
    fn prune(&self) {
        let gone: Vec<Arc<MappedConn>> = {
            let mut conns = lock(&self.conns);
            let (gone, keep) = conns.drain(..).partition(|c| c.gone());
            *conns = keep;
            gone
        };
        for c in gone {
            c.close("the client closed it");
        }
    }

    /// Serves one Unix connection: ticket in, descriptors out.
    fn redeem(&self, stream: UnixStream) -> Result<(), String> {
        let cred = pass::peer_credentials(&stream).map_err(|e| format!("no credentials: {e}"))?;
        let peer = format!("pid {} uid {}", cred.pid, cred.uid);
        if cred.uid != self.uid && cred.uid != 0 {
            return Err(format!(
                "{peer}: refused, the region is shared with the memnode's own user ({}) \
                 and root only",
                self.uid
            ));
        }
        stream
            .set_read_timeout(Some(REDEEM_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let mut ticket = [0u8; TICKET_LEN];
        (&stream)
            .read_exact(&mut ticket)
            .map_err(|e| format!("{peer}: no ticket: {e}"))?;
        let t = lock(&self.tickets)
            .remove(&ticket)
            .ok_or_else(|| format!("{peer}: unknown or used ticket"))?;
        if t.expires <= Instant::now() {
            return Err(format!("{peer}: ticket expired"));
        }
        let (section_fd, section) = ReadSection::create().map_err(|e| e.to_string())?;
        // Listed before the client has its descriptors, so that no revocation can
        // miss a connection that is about to copy.
        let conn = Arc::new(MappedConn {
            client: t.client,
            conn_id: t.conn_id,
            section,
            stream,
            peer: peer.clone(),
        });
        lock(&self.conns).push(conn.clone());
        let send = |what: &[u8], fd| pass::send_fd(&conn.stream, what, fd);
        let sent = send(b"region", self.region.fd.as_fd())
            .and_then(|()| send(b"grants", self.table_fd.as_fd()))
            .and_then(|()| send(b"section", section_fd.as_fd()));
        if let Err(e) = sent {
            self.drop_conn(&conn, "its descriptors could not be passed");
            return Err(format!("{peer}: cannot pass descriptors: {e}"));
        }
        log::info!("client {:#x} maps the region ({peer})", t.client);
        Ok(())
    }
}

fn accept_loop(listener: UnixListener, offer: Weak<MapOffer>) {
    for stream in listener.incoming() {
        let Some(offer) = offer.upgrade() else {
            return;
        };
        if offer.stopping.load(Ordering::SeqCst) {
            return;
        }
        match stream {
            Ok(s) => {
                if let Err(e) = offer.redeem(s) {
                    log::warn!("mapped access refused: {e}");
                }
            }
            Err(e) => {
                log::warn!("mapped access: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[cfg(test)]
#[path = "offer_tests.rs"]
mod tests;
