//! The mapped backend (issue 55, being built): one-sided READ and WRITE as copies
//! into and out of a mapping of the memnode's region file, for memnodes on the same
//! host and CXL pools, where the "NIC" is the CPU's own memory path. Control (Hello,
//! Alloc, Free, volumes) stays on the existing control path.
//!
//! What is here so far: [`guard::GuardedMap`], the mapping whose copies turn a file
//! cut short under them into an error instead of a SIGBUS that ends fsd.

pub mod guard;
