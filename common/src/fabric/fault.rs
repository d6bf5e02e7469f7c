//! A fabric wrapper that injects failures and delays, for tests of the layers above:
//! it turns chosen operations into the errors a real fabric gives (remote access
//! error, timeout, lost connection) without needing a misbehaving peer.

use crate::fabric::{Endpoint, FabricError, RdmaOp};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Which faults are switched on; shared, so a test can flip them while the wrapped
/// endpoint is in use.
#[derive(Debug, Default)]
pub struct Faults {
    /// Fail every READ.
    pub fail_reads: AtomicBool,
    /// Fail every WRITE.
    pub fail_writes: AtomicBool,
    /// Fail every control call.
    pub fail_calls: AtomicBool,
    /// Delay every operation by this many milliseconds.
    pub delay_ms: AtomicU64,
}

pub struct FaultyEndpoint {
    inner: Box<dyn Endpoint>,
    faults: Arc<Faults>,
}

impl FaultyEndpoint {
    pub fn new(inner: Box<dyn Endpoint>, faults: Arc<Faults>) -> FaultyEndpoint {
        FaultyEndpoint { inner, faults }
    }

    fn delay(&self) {
        let ms = self.faults.delay_ms.load(Ordering::Relaxed);
        if ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }

    fn injected(&self) -> FabricError {
        FabricError::Disconnected {
            peer: self.inner.peer().to_string(),
            reason: "injected fault".into(),
        }
    }
}

impl Endpoint for FaultyEndpoint {
    fn execute(&self, ops: &mut [RdmaOp<'_>]) -> Vec<Result<(), FabricError>> {
        self.delay();
        let fail_r = self.faults.fail_reads.load(Ordering::Relaxed);
        let fail_w = self.faults.fail_writes.load(Ordering::Relaxed);
        if !fail_r && !fail_w {
            return self.inner.execute(ops);
        }
        // Run the operations that are not failed, one by one, and fail the others.
        ops.iter_mut()
            .map(|op| {
                let fail = match op {
                    RdmaOp::Read { .. } => fail_r,
                    RdmaOp::Write { .. } => fail_w,
                };
                if fail {
                    return Err(self.injected());
                }
                self.inner
                    .execute(std::slice::from_mut(op))
                    .pop()
                    .unwrap_or_else(|| Err(FabricError::Invalid("no completion".into())))
            })
            .collect()
    }

    fn call(&self, frame: &[u8]) -> Result<Vec<u8>, FabricError> {
        self.delay();
        if self.faults.fail_calls.load(Ordering::Relaxed) {
            return Err(self.injected());
        }
        self.inner.call(frame)
    }

    fn peer(&self) -> &str {
        self.inner.peer()
    }

    fn is_connected(&self) -> bool {
        self.inner.is_connected()
    }

    fn is_busy(&self) -> bool {
        self.inner.is_busy()
    }
}
