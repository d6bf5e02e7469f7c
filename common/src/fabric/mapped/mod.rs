//! The mapped backend: one-sided READ and WRITE as copies into and out of a mapping
//! of the region of a memnode on this host, where the "NIC" is the CPU's own memory
//! path. Control (Hello, Alloc, Free, volumes) stays on the tcp connection, and so does
//! whatever cannot be copied; `docs/reference.md` ("The mapped fabric") is the user's
//! view.
//!
//! - [`offer`]: the memnode's side. Its region is a file (a memfd, or its memory
//!   file); after a Hello a client asks for it over tcp (`OP_MAP`), gets a one-time
//!   ticket and an abstract Unix socket's name, and trades the ticket there for the
//!   descriptors ([`pass`]): the region, the grant table and its read section.
//! - [`grants`]: the grant table (the tcp registry's registrations in the region,
//!   which a client checks as a NIC would before it copies; a cache whose misses go
//!   over tcp) and the read section (what lets deregistration wait out copies in
//!   flight, so memory is zeroed and reused at once as over tcp and verbs).
//! - [`endpoint`]: the client's [`MappedEndpoint`]; [`guard::GuardedMap`] turns pages
//!   lost under the mapping (a file cut short, a hugetlbfs pool run dry) into an
//!   error instead of a SIGBUS that ends fsd.
//!
//! **The trust boundary** is the memnode's user on its host. Linux has no descriptor
//! for part of a file, so a client given the region can reach every chunk in it, and
//! the grants are kept by the client's own code. The memnode therefore hands the
//! descriptors only to processes of its own user or root (`SO_PEERCRED`), which could
//! read its memory through `/proc` anyway, after the same proofs as over tcp; and a
//! memnode whose region a tenants file divides shares nothing. Giving each tenant (or
//! each chunk) a file of its own, mapped by the memnode over its place in the region,
//! would move the boundary to the tenant; it is not built. A DAX device (a CXL pool)
//! is one file by nature: there the boundary would be the device.

pub mod endpoint;
pub mod grants;
pub mod guard;
pub mod offer;
pub mod pass;
pub mod shared;

pub use endpoint::MappedEndpoint;
