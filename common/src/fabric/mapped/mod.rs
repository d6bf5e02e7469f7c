//! The mapped backend (issue 55, being built): one-sided READ and WRITE as copies
//! into and out of a mapping of the memnode's region file, for memnodes on the same
//! host and CXL pools, where the "NIC" is the CPU's own memory path. Control (Hello,
//! Alloc, Free, volumes) stays on the existing control path.
//!
//! Built so far:
//! - [`guard::GuardedMap`]: the mapping, whose copies turn pages lost under them (a
//!   file cut short, a hugetlbfs pool run dry) into an error instead of a SIGBUS that
//!   ends fsd; faults elsewhere go to the handler that was there before.
//! - [`pass`]: a descriptor and a header over a Unix socket (`SCM_RIGHTS`), and the
//!   peer's credentials (`SO_PEERCRED`).
//!
//! The plan, and the questions it has to answer:
//! - **Who can reach what.** A descriptor of a file reaches the whole file: Linux
//!   has no descriptor for part of one. A client given the region's file could read
//!   and write every chunk, every tenant's, and an old volume holder could keep
//!   writing after a takeover, where the tcp and verbs backends refuse it (rkeys). So
//!   the file a client is given must hold only what it may touch: one file per chunk
//!   (files in a memory directory on tmpfs or hugetlbfs, which also gives the
//!   restart-surviving `--memory-file` its one-mechanism form), mapped by the memnode
//!   at the chunk's address with `MAP_FIXED`. A freed chunk's file is never reused
//!   for another client; a takeover fences by moving the volume's chunks to fresh
//!   files (a copy, at memory speed) and dropping the old ones, whose mappings in the
//!   old holder then reach memory no one else sees. A DAX device (CXL) cannot be cut
//!   into files: there the trust boundary is the device, which the docs must say.
//! - **Revocation.** The memnode cannot take a mapping out of another process, so
//!   `MemoryRegistry::deregister` cannot promise "no access in flight" as it does
//!   for tcp and verbs; with a file per chunk it does not need to, as above. The
//!   registry is where this fits without changing the pool: `register` moves the
//!   range into a file of its own (a fresh chunk is all zeros, so nothing to copy;
//!   a volume chunk given to a new holder is copied in) mapped over the region with
//!   `MAP_FIXED`, and `deregister` maps the region's own memory back over it (copying
//!   a volume chunk's bytes back) and drops the file: whatever the old client still
//!   maps then reaches memory no one else sees. For a memnode with `--memory-file`
//!   those files must live beside it on the same filesystem (a memory directory),
//!   or a memnode crash would lose registered chunks.
//! - **Who gets a descriptor.** Only a connection that has finished the Hello (the
//!   same proofs as over tcp), on the Unix socket beside the memnode's tcp port;
//!   `SO_PEERCRED` names the process in the logs.
//! - **`--transport auto`** picks mapped when the memnode is on this host (its Unix
//!   socket answers) and the embedded memnode of `scripts/run` uses it.

pub mod endpoint;
pub mod grants;
pub mod guard;
pub mod offer;
pub mod pass;
pub mod shared;

pub use endpoint::MappedEndpoint;
