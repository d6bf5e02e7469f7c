//! The client's side of the mapped backend: a tcp connection for control and for
//! whatever cannot be copied, and, once the Hello is done and the memnode on this
//! host has passed its descriptors, READ and WRITE as copies into the region.
//!
//! Every copy is made inside the connection's read section (`grants.rs`), under a
//! grant found in the table with the same checks a NIC makes (rkey, owner, bounds);
//! an rkey the table does not hold goes over tcp, so the memnode's registry answers
//! for it. A memnode that goes away (its Unix socket ends) or closes the connection
//! fails every later operation with [`FabricError::Disconnected`], as over tcp.

use super::grants::{GrantTable, ReadSection};
use super::guard::{GuardedMap, MapError};
use super::offer::Offer;
use super::pass;
use crate::fabric::tcp::wire::OP_MAP;
use crate::fabric::tcp::TcpEndpoint;
use crate::fabric::{Endpoint, FabricError, RdmaOp, MAX_DATA_OP};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The mapping of one memnode's region, with what guards it.
struct Mapping {
    region: GuardedMap,
    base: u64,
    grants: GrantTable,
    section: ReadSection,
    /// Set when the memnode's end of the Unix socket closes (it exited) or the
    /// region lost pages.
    dead: Arc<AtomicBool>,
    /// To close the socket (and end the watcher) when the endpoint goes.
    sock: UnixStream,
}

/// One connection to a memnode, mapped where the memnode is on this host.
pub struct MappedEndpoint {
    tcp: TcpEndpoint,
    client: u64,
    /// `--transport mapped`: a memnode that cannot be mapped is an error, not tcp.
    required: bool,
    timeout: Duration,
    mapping: OnceLock<Mapping>,
}

impl MappedEndpoint {
    /// Connects over tcp to `peer` as client `client`; the mapping is made by
    /// [`Endpoint::after_hello`]. With `required`, a memnode that cannot be mapped
    /// fails that call; otherwise the endpoint stays on tcp.
    pub fn connect(
        peer: &str,
        client: u64,
        timeout: Duration,
        poll: Duration,
        required: bool,
    ) -> Result<MappedEndpoint, FabricError> {
        Ok(MappedEndpoint {
            tcp: TcpEndpoint::connect(peer, timeout)?.with_poll(poll),
            client,
            required,
            timeout,
            mapping: OnceLock::new(),
        })
    }

    fn map(&self) -> Result<Mapping, String> {
        let reply = self
            .tcp
            .request(OP_MAP, &[])
            .map_err(|e| format!("the memnode offers no mapping: {e}"))?;
        let offer = Offer::decode(&reply)?;
        let addr = UnixAddr::from_abstract_name(&offer.socket).map_err(|e| e.to_string())?;
        let mut sock = UnixStream::connect_addr(&addr)
            .map_err(|e| format!("the memnode is not on this host ({e})"))?;
        sock.set_read_timeout(Some(self.timeout))
            .and_then(|()| sock.set_write_timeout(Some(self.timeout)))
            .and_then(|()| sock.write_all(&offer.ticket))
            .map_err(|e| format!("cannot send the ticket: {e}"))?;
        let next = |what: &[u8]| match pass::recv_fd(&sock) {
            Ok((header, fd)) if header == what => Ok(fd),
            Ok((header, _)) => Err(format!(
                "expected the {} descriptor, got {:?}",
                String::from_utf8_lossy(what),
                String::from_utf8_lossy(&header)
            )),
            Err(e) => Err(format!(
                "no {} descriptor (refused; the memnode's log says why): {e}",
                String::from_utf8_lossy(what)
            )),
        };
        let region_fd = next(b"region")?;
        let grants_fd = next(b"grants")?;
        let section_fd = next(b"section")?;
        let len = usize::try_from(offer.len).map_err(|_| "region too large".to_string())?;
        let region = GuardedMap::map(region_fd.as_fd(), offer.offset, len)
            .map_err(|e| format!("cannot map the region: {e}"))?;
        let grants = GrantTable::open(grants_fd.as_fd())
            .map_err(|e| format!("cannot map the grant table: {e}"))?;
        let section = ReadSection::open(section_fd.as_fd())
            .map_err(|e| format!("cannot map the read section: {e}"))?;
        sock.set_read_timeout(None).map_err(|e| e.to_string())?;
        let dead = Arc::new(AtomicBool::new(false));
        let watcher = sock.try_clone().map_err(|e| e.to_string())?;
        {
            let dead = dead.clone();
            let peer = self.tcp.peer().to_string();
            std::thread::Builder::new()
                .name("map-watch".into())
                .spawn(move || watch(watcher, &dead, &peer))
                .map_err(|e| e.to_string())?;
        }
        Ok(Mapping {
            region,
            base: offer.base,
            grants,
            section,
            dead,
            sock,
        })
    }

    fn gone(&self, reason: &str) -> FabricError {
        FabricError::Disconnected {
            peer: self.tcp.peer().to_string(),
            reason: reason.to_string(),
        }
    }

    /// Copies `op` through the mapping if the table grants it; `None` when it must
    /// go over tcp.
    fn copy(&self, m: &Mapping, op: &mut RdmaOp<'_>) -> Option<Result<(), FabricError>> {
        if m.dead.load(Ordering::Relaxed) {
            return Some(Err(self.gone("the memnode's mapped connection ended")));
        }
        let remote = op.remote();
        let len = op.len();
        let refused = FabricError::RemoteAccess {
            addr: remote.addr,
            rkey: remote.rkey,
            len,
        };
        let inside = m.section.enter();
        let result = (|| {
            if m.section.is_closed() {
                return Some(Err(self.gone("the memnode closed the mapped connection")));
            }
            let grant = m.grants.lookup(remote.rkey)?;
            let end = remote.addr.checked_add(len as u64);
            if grant.owner != self.client
                || remote.addr < grant.addr
                || end.is_none_or(|end| end > grant.end)
            {
                return Some(Err(refused.clone()));
            }
            let at = usize::try_from(remote.addr.wrapping_sub(m.base)).ok()?;
            let copied = match op {
                RdmaOp::Read { local, .. } => m.region.read(at, local),
                RdmaOp::Write { local, .. } => m.region.write(at, local),
            };
            Some(match copied {
                Ok(()) => Ok(()),
                // A grant outside the region (a memnode's mistake): tcp answers.
                Err(MapError::OutOfRange { .. }) => return None,
                Err(MapError::Broken) => {
                    m.dead.store(true, Ordering::Relaxed);
                    Err(self.gone("the memnode's memory file lost pages under the mapping"))
                }
            })
        })();
        m.section.leave(inside);
        result
    }
}

/// Waits for the memnode's end of the socket to close (it never sends after the
/// descriptors), then marks the mapping dead.
fn watch(mut sock: UnixStream, dead: &AtomicBool, peer: &str) {
    let mut byte = [0u8; 1];
    let why = match sock.read(&mut byte) {
        Ok(0) => "closed".to_string(),
        Ok(_) => "sent bytes it never should".to_string(),
        Err(e) => e.to_string(),
    };
    if !dead.swap(true, Ordering::SeqCst) {
        log::debug!("mapped connection to {peer} ended: {why}");
    }
}

impl Endpoint for MappedEndpoint {
    fn execute(&self, ops: &mut [RdmaOp<'_>]) -> Vec<Result<(), FabricError>> {
        let Some(m) = self.mapping.get() else {
            return self.tcp.execute(ops);
        };
        if let Some(op) = ops.iter().find(|op| op.len() > MAX_DATA_OP) {
            let e = FabricError::Invalid(format!(
                "operation of {} bytes exceeds {MAX_DATA_OP}",
                op.len()
            ));
            return ops.iter().map(|_| Err(e.clone())).collect();
        }
        let mut results: Vec<Option<Result<(), FabricError>>> =
            ops.iter_mut().map(|op| self.copy(m, op)).collect();
        if results.iter().any(Option::is_none) {
            let mut rest: Vec<RdmaOp<'_>> = ops
                .iter_mut()
                .zip(&results)
                .filter(|(_, r)| r.is_none())
                .map(|(op, _)| op.reborrow())
                .collect();
            let mut answers = self.tcp.execute(&mut rest).into_iter();
            for r in results.iter_mut().filter(|r| r.is_none()) {
                *r = answers.next();
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(self.gone("no completion"))))
            .collect()
    }

    fn call(&self, frame: &[u8]) -> Result<Vec<u8>, FabricError> {
        self.tcp.call(frame)
    }

    fn after_hello(&self) -> Result<(), FabricError> {
        if self.is_mapped() {
            return Ok(());
        }
        match self.map() {
            Ok(m) => {
                log::debug!("{}: READ and WRITE are copies into its region", self.peer());
                let _ = self.mapping.set(m);
                Ok(())
            }
            Err(reason) if self.required => Err(FabricError::Connect {
                peer: self.peer().to_string(),
                reason: format!("cannot map the memnode's memory: {reason}"),
            }),
            Err(reason) => {
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    log::info!(
                        "{}: not mapped ({reason}); READ and WRITE go over tcp",
                        self.peer()
                    );
                } else {
                    log::debug!("{}: not mapped ({reason})", self.peer());
                }
                Ok(())
            }
        }
    }

    fn peer(&self) -> &str {
        self.tcp.peer()
    }

    fn is_mapped(&self) -> bool {
        self.mapping.get().is_some()
    }

    fn is_connected(&self) -> bool {
        let mapped_ok = self
            .mapping
            .get()
            .is_none_or(|m| !m.dead.load(Ordering::Relaxed) && !m.section.is_closed());
        mapped_ok && self.tcp.is_connected()
    }

    fn is_busy(&self) -> bool {
        self.tcp.is_busy()
    }
}

impl Drop for MappedEndpoint {
    fn drop(&mut self) {
        if let Some(m) = self.mapping.get() {
            let _ = m.sock.shutdown(std::net::Shutdown::Both);
        }
    }
}
