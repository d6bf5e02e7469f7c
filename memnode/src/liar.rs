//! A memnode that lies, for the tests of what its clients believe (fsd's
//! `remote/checked.rs` tests, `tests/tests/hostile_memnode.rs`): a real memnode whose
//! control service is wrapped ([`Memnode::start_wrapped`]) so that, while a lie is
//! set ([`Liar::tell`]), every reply frame is decoded and rewritten by it. The
//! Welcome is never rewritten: what a client does with the handshake is not what a
//! lie here tests.
//!
//! Built with the `test-support` feature only: a memnode serving clients never lies.

use crate::{Memnode, MemnodeConfig, MemnodeError};
use rmemfs_common::fabric::{ConnectionState, ControlHandler, ControlReply};
use rmemfs_common::protocol::Response;
use rmemfs_common::sync::lock;
use std::sync::{Arc, Mutex};

/// What the liar does to a reply.
pub type Lie = fn(Response) -> Response;

/// The switch of a lying memnode's lie.
#[derive(Clone, Default)]
pub struct Liar {
    lie: Arc<Mutex<Option<Lie>>>,
}

impl Liar {
    /// Starts a memnode as [`Memnode::start`] does, telling the truth until told
    /// otherwise.
    pub fn start(cfg: MemnodeConfig) -> Result<(Memnode, Liar), MemnodeError> {
        let liar = Liar::default();
        let lie = liar.lie.clone();
        let node = Memnode::start_wrapped(cfg, move |inner| Arc::new(Lying { inner, lie }))?;
        Ok((node, liar))
    }

    /// From now on, every reply but the Welcome goes through `lie` (`None`: the
    /// truth again).
    pub fn tell(&self, lie: Option<Lie>) {
        *lock(&self.lie) = lie;
    }
}

struct Lying {
    inner: Arc<dyn ControlHandler>,
    lie: Arc<Mutex<Option<Lie>>>,
}

impl ControlHandler for Lying {
    fn handle(&self, conn: &mut ConnectionState, frame: &[u8]) -> ControlReply {
        let mut reply = self.inner.handle(conn, frame);
        if let (Some(lie), Ok(r)) = (*lock(&self.lie), Response::decode(&reply.frame)) {
            if !matches!(r, Response::Welcome { .. }) {
                reply.frame = lie(r).encode();
            }
        }
        reply
    }

    fn disconnected(&self, conn: &ConnectionState) {
        self.inner.disconnected(conn)
    }
}
