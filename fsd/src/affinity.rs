//! Which CPU a thread is pinned to, under fsd's old path: the module lives in the
//! `rmemfs-fuse` crate (`rmemfs_fuse::affinity`), whose ring pins its serving
//! threads; fsd's remote store asks the same thread-local which CPU that is.

pub use rmemfs_fuse::affinity::{pin_current_thread, pinned_cpu};
