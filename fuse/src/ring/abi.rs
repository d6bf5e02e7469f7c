//! The kernel's side of FUSE over io_uring (include/uapi/linux/fuse.h, protocol
//! 7.42): the layout of a ring entry's header buffer, the command in the SQE, the
//! opcodes and request/reply structs the ring carries. Read and written as bytes in
//! native order, with every length checked: nothing here trusts a size it is given.

/// `sqe->cmd_op` values.
pub const CMD_REGISTER: u32 = 1;
pub const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_req_header`: `in_out` (the request's `fuse_in_header`, then
/// the reply's `fuse_out_header`), `op_in` (the opcode's fixed struct), and
/// `fuse_uring_ent_in_out` (commit id and payload size).
pub const IN_OUT_LEN: usize = 128;
pub const OP_IN_LEN: usize = 128;
pub const ENT_IN_OUT_LEN: usize = 32;
pub const HEADER_LEN: usize = IN_OUT_LEN + OP_IN_LEN + ENT_IN_OUT_LEN;
pub const OP_IN_AT: usize = IN_OUT_LEN;
pub const ENT_AT: usize = IN_OUT_LEN + OP_IN_LEN;
/// In `fuse_uring_ent_in_out`: `u64 flags; u64 commit_id; u32 payload_sz; ...`.
pub const COMMIT_ID_AT: usize = ENT_AT + 8;
pub const PAYLOAD_SZ_AT: usize = ENT_AT + 16;

/// Opcodes (`enum fuse_opcode`) the ring may carry.
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const CREATE: u32 = 35;
    pub const FALLOCATE: u32 = 43;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
}

/// `fuse_write_in.write_flags`: clear setuid/setgid (FUSE_HANDLE_KILLPRIV_V2).
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_fsync_in.fsync_flags`: fdatasync.
pub const FSYNC_FDATASYNC: u32 = 1;

/// Sizes of the reply structs.
pub const ATTR_LEN: usize = 88;
pub const ENTRY_OUT_LEN: usize = 40 + ATTR_LEN;
pub const ATTR_OUT_LEN: usize = 16 + ATTR_LEN;
pub const OPEN_OUT_LEN: usize = 16;
pub const OUT_HEADER_LEN: usize = 16;
pub const DIRENT_LEN: usize = 24;

/// Reads fixed-size fields in order from a byte slice; `None` once it runs out.
pub struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Fields<'a> {
    pub fn new(bytes: &'a [u8]) -> Fields<'a> {
        Fields { bytes, at: 0 }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(s)
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_ne_bytes(self.take(4)?.try_into().ok()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_ne_bytes(self.take(8)?.try_into().ok()?))
    }

    pub fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }

    /// A NUL-terminated string (without its NUL).
    pub fn cstr(&mut self) -> Option<&'a [u8]> {
        let rest = self.bytes.get(self.at..)?;
        let len = rest.iter().position(|&b| b == 0)?;
        self.at += len + 1;
        Some(&rest[..len])
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = self.bytes.get(self.at..).unwrap_or(&[]);
        self.at = self.bytes.len();
        s
    }
}

/// Writes fields in order into a byte slice; the caller sizes the slice first.
pub struct Put<'a> {
    bytes: &'a mut [u8],
    at: usize,
}

impl<'a> Put<'a> {
    pub fn new(bytes: &'a mut [u8]) -> Put<'a> {
        Put { bytes, at: 0 }
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.bytes[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_ne_bytes())
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_ne_bytes())
    }

    pub fn len(&self) -> usize {
        self.at
    }
}

/// `struct fuse_in_header`, the first 40 bytes of `in_out`.
#[derive(Clone, Copy, Debug, Default)]
pub struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl InHeader {
    pub fn parse(in_out: &[u8]) -> Option<InHeader> {
        let mut f = Fields::new(in_out);
        let _len = f.u32()?;
        let opcode = f.u32()?;
        let unique = f.u64()?;
        let nodeid = f.u64()?;
        let uid = f.u32()?;
        let gid = f.u32()?;
        let pid = f.u32()?;
        Some(InHeader {
            opcode,
            unique,
            nodeid,
            uid,
            gid,
            pid,
        })
    }
}

/// `struct fuse_out_header` into the first 16 bytes of `in_out`.
pub fn put_out_header(in_out: &mut [u8], error: i32, unique: u64, payload_len: usize) {
    Put::new(&mut in_out[..OUT_HEADER_LEN])
        .u32((OUT_HEADER_LEN + payload_len) as u32)
        .u32(error as u32)
        .u64(unique);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_stop_at_the_end_instead_of_reading_past_it() {
        let b = [1u8, 0, 0, 0, b'a', b'b', 0, b'c'];
        let mut f = Fields::new(&b);
        assert_eq!(f.u32(), Some(1));
        assert_eq!(f.cstr(), Some(&b"ab"[..]));
        assert_eq!(f.cstr(), None, "no NUL: not a string");
        assert_eq!(f.u64(), None);
        assert_eq!(f.rest(), b"c");
        assert_eq!(f.u32(), None);
    }

    #[test]
    fn the_header_buffer_is_laid_out_as_the_kernel_expects() {
        assert_eq!(HEADER_LEN, 288);
        assert_eq!(COMMIT_ID_AT, 264);
        assert_eq!(PAYLOAD_SZ_AT, 272);
        let mut h = [0u8; 40];
        Put::new(&mut h)
            .u32(40)
            .u32(op::READ)
            .u64(77)
            .u64(5)
            .u32(1000)
            .u32(100)
            .u32(42);
        let p = InHeader::parse(&h).unwrap();
        assert_eq!(
            (p.opcode, p.unique, p.nodeid, p.uid, p.gid, p.pid),
            (op::READ, 77, 5, 1000, 100, 42)
        );
        assert!(InHeader::parse(&h[..35]).is_none());
    }
}
