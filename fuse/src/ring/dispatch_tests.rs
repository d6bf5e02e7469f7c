use super::*;
use crate::ops::Statfs;
use fuser::{FopenFlags, INodeNo, KernelConfig};
use std::sync::Mutex;

/// Answers from fixed data and records what it was asked.
#[derive(Default)]
struct Fake {
    calls: Mutex<Vec<String>>,
}

fn attr(ino: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 5,
        blocks: 1,
        atime: UNIX_EPOCH + Duration::new(10, 1),
        mtime: UNIX_EPOCH + Duration::new(20, 2),
        ctime: UNIX_EPOCH + Duration::new(30, 3),
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0o644,
        nlink: 1,
        uid: 1000,
        gid: 100,
        rdev: 0,
        blksize: 65536,
        flags: 0,
    }
}

impl FuseOps for Fake {
    fn configure(&self, _config: &mut KernelConfig) {}

    fn lookup(&self, req: &Req, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        self.calls.lock().unwrap().push(format!(
            "lookup {parent} {} uid {}",
            name.to_string_lossy(),
            req.uid
        ));
        if name == "missing" {
            return Err(Errno::ENOENT);
        }
        Ok(attr(7))
    }

    fn getattr(&self, _req: &Req, ino: u64) -> Result<FileAttr, Errno> {
        Ok(attr(ino))
    }

    fn copy_file_range(&self, _req: &Req, c: &CopyRange) -> Result<u32, Errno> {
        self.calls.lock().unwrap().push(format!("{c:?}"));
        Ok(4096)
    }

    fn setattr(&self, _req: &Req, ino: u64, c: &SetAttrIn) -> Result<FileAttr, Errno> {
        self.calls.lock().unwrap().push(format!(
            "setattr {ino} mode {:?} size {:?} uid {:?} mtime_now {}",
            c.mode,
            c.size,
            c.uid,
            matches!(c.mtime, Some(TimeOrNow::Now))
        ));
        Ok(attr(ino))
    }

    fn read(
        &self,
        _req: &Req,
        _ino: u64,
        _fh: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Errno> {
        let n = buf.len().min(3);
        buf[..n].fill(b'a' + offset as u8);
        Ok(n)
    }

    fn write(
        &self,
        _req: &Req,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> Result<u32, Errno> {
        self.calls.lock().unwrap().push(format!(
            "write {ino} fh {fh} at {offset} {:?} kill {kill_suidgid}",
            String::from_utf8_lossy(data)
        ));
        Ok(data.len() as u32)
    }

    fn readdir(
        &self,
        _req: &Req,
        _ino: u64,
        offset: u64,
        out: &mut dyn DirSink,
    ) -> Result<(), Errno> {
        for i in offset..10 {
            let name = format!("entry{i}");
            if out.add(100 + i, i + 1, FileType::Directory, OsStr::new(&name)) {
                break;
            }
        }
        Ok(())
    }

    fn statfs(&self, _req: &Req, _ino: u64) -> Result<Statfs, Errno> {
        Ok(Statfs::default())
    }

    fn create(
        &self,
        _req: &Req,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(FileAttr, Opened), Errno> {
        self.calls.lock().unwrap().push(format!(
            "create {parent} {} mode {mode:o} umask {umask:o} flags {flags}",
            name.to_string_lossy()
        ));
        Ok((
            attr(9),
            Opened {
                fh: 42,
                flags: FopenFlags::FOPEN_DIRECT_IO,
            },
        ))
    }
}

/// A ring entry as the kernel fills it: in header, op struct, payload.
struct Entry {
    header: [u8; abi::HEADER_LEN],
    payload: Vec<u8>,
}

fn entry(opcode: u32, nodeid: u64, op_in: &[u8], payload_in: &[u8]) -> Entry {
    let mut header = [0u8; abi::HEADER_LEN];
    Put::new(&mut header[..40])
        .u32(40)
        .u32(opcode)
        .u64(0x1234) // unique
        .u64(nodeid)
        .u32(1000)
        .u32(100)
        .u32(77);
    header[abi::OP_IN_AT..abi::OP_IN_AT + op_in.len()].copy_from_slice(op_in);
    Put::new(&mut header[abi::ENT_AT..])
        .u64(0)
        .u64(0x1234) // commit id
        .u32(payload_in.len() as u32);
    let mut payload = vec![0xEEu8; 64 << 10];
    payload[..payload_in.len()].copy_from_slice(payload_in);
    Entry { header, payload }
}

/// Runs the entry; returns (error, reply bytes).
fn run(ops: &Fake, e: &mut Entry) -> (i32, Vec<u8>) {
    let commit = answer(ops, &mut e.header, &mut e.payload).expect("a readable header");
    assert_eq!(commit, 0x1234);
    let mut out = Fields::new(&e.header[..16]);
    let len = out.u32().unwrap() as usize;
    let error = out.u32().unwrap() as i32;
    assert_eq!(out.u64().unwrap(), 0x1234, "the reply names the request");
    let payload_sz = Fields::new(&e.header[abi::PAYLOAD_SZ_AT..]).u32().unwrap() as usize;
    assert_eq!(len, abi::OUT_HEADER_LEN + payload_sz);
    (error, e.payload[..payload_sz].to_vec())
}

#[test]
fn lookup_reads_the_name_from_the_payload_and_answers_an_entry() {
    let ops = Fake::default();
    let mut e = entry(op::LOOKUP, 1, &[], b"hello\0");
    let (error, reply) = run(&ops, &mut e);
    assert_eq!(error, 0);
    assert_eq!(reply.len(), abi::ENTRY_OUT_LEN);
    let mut f = Fields::new(&reply);
    assert_eq!(f.u64(), Some(7), "nodeid");
    f.skip(8 + 16 + 8).unwrap(); // generation, validity
    assert_eq!(f.u64(), Some(7), "attr.ino");
    assert_eq!(f.u64(), Some(5), "attr.size");
    f.skip(8).unwrap(); // blocks
    assert_eq!((f.u64(), f.u64(), f.u64()), (Some(10), Some(20), Some(30)));
    assert_eq!((f.u32(), f.u32(), f.u32()), (Some(1), Some(2), Some(3)));
    assert_eq!(f.u32(), Some(libc::S_IFREG | 0o644), "mode");
    assert_eq!(ops.calls.lock().unwrap()[0], "lookup 1 hello uid 1000");
}

#[test]
fn an_error_is_a_negative_errno_with_no_payload() {
    let ops = Fake::default();
    let mut e = entry(op::LOOKUP, 1, &[], b"missing\0");
    assert_eq!(run(&ops, &mut e), (-libc::ENOENT, vec![]));
}

#[test]
fn a_name_without_its_nul_is_refused_not_read_past() {
    let ops = Fake::default();
    let mut e = entry(op::LOOKUP, 1, &[], b"abc");
    assert_eq!(run(&ops, &mut e).0, -libc::EINVAL);
    assert!(ops.calls.lock().unwrap().is_empty());
}

#[test]
fn write_takes_its_data_from_the_payload_and_answers_the_count() {
    let ops = Fake::default();
    let mut op_in = [0u8; 40];
    Put::new(&mut op_in)
        .u64(5) // fh
        .u64(4096) // offset
        .u32(4) // size
        .u32(abi::WRITE_KILL_SUIDGID);
    let mut e = entry(op::WRITE, 3, &op_in, b"datamore");
    let (error, reply) = run(&ops, &mut e);
    assert_eq!(error, 0);
    assert_eq!(Fields::new(&reply).u32(), Some(4));
    assert_eq!(
        ops.calls.lock().unwrap()[0],
        "write 3 fh 5 at 4096 \"data\" kill true"
    );
    // A size past the payload the kernel sent is refused.
    let mut op_in = [0u8; 40];
    Put::new(&mut op_in).u64(5).u64(0).u32(100).u32(0);
    let mut e = entry(op::WRITE, 3, &op_in, b"short");
    assert_eq!(run(&ops, &mut e).0, -libc::EINVAL);
}

#[test]
fn read_answers_in_the_payload_no_longer_than_asked() {
    let ops = Fake::default();
    let mut op_in = [0u8; 40];
    Put::new(&mut op_in).u64(0).u64(1).u32(2);
    let mut e = entry(op::READ, 3, &op_in, &[]);
    assert_eq!(run(&ops, &mut e), (0, b"bb".to_vec()));
}

/// A READ answered with others: its bytes are in the payload already, and the
/// reply says how many, as `answer` would have; the header gives what it asks.
#[test]
fn a_read_answered_together_replies_with_the_bytes_it_got() {
    let mut op_in = [0u8; 40];
    Put::new(&mut op_in).u64(0).u64(8192).u32(4096);
    let mut e = entry(op::READ, 3, &op_in, &[]);
    let at = read_of(&e.header).expect("a READ");
    assert_eq!((at.ino, at.offset, at.len), (3, 8192, 4096));
    e.payload[..3].copy_from_slice(b"abc");
    assert_eq!(answered_read(&mut e.header, 3), Some(0x1234));
    let mut out = Fields::new(&e.header[..16]);
    assert_eq!(out.u32(), Some((abi::OUT_HEADER_LEN + 3) as u32));
    assert_eq!(out.u32(), Some(0), "no error");
    assert_eq!(out.u64(), Some(0x1234), "the reply names the request");
    let payload_sz = Fields::new(&e.header[abi::PAYLOAD_SZ_AT..]).u32();
    assert_eq!(payload_sz, Some(3));
    assert!(read_of(&entry(op::WRITE, 3, &op_in, &[]).header).is_none());
}

#[test]
fn setattr_decodes_only_the_fields_marked_valid() {
    let ops = Fake::default();
    let mut op_in = [0u8; 88];
    let mut p = Put::new(&mut op_in);
    p.u32(fattr::SIZE | fattr::MTIME | fattr::MTIME_NOW).u32(0);
    p.u64(0).u64(123).u64(0); // fh, size, lock_owner
    p.u64(0).u64(0).u64(0).u32(0).u32(0).u32(0); // times
    p.u32(0o777).u32(0).u32(55).u32(66); // mode, unused, uid, gid
    let mut e = entry(op::SETATTR, 4, &op_in, &[]);
    let (error, reply) = run(&ops, &mut e);
    assert_eq!((error, reply.len()), (0, abi::ATTR_OUT_LEN));
    assert_eq!(
        ops.calls.lock().unwrap()[0],
        "setattr 4 mode None size Some(123) uid None mtime_now true"
    );
}

#[test]
fn readdir_packs_aligned_dirents_and_stops_when_the_reply_is_full() {
    let ops = Fake::default();
    let mut op_in = [0u8; 40];
    // Each "entryN" dirent is 24 + 6 bytes, padded to 32: room for three in 100.
    Put::new(&mut op_in).u64(0).u64(2).u32(100);
    let mut e = entry(op::READDIR, 1, &op_in, &[]);
    let (error, reply) = run(&ops, &mut e);
    assert_eq!((error, reply.len()), (0, 96));
    for (k, d) in reply.chunks(32).enumerate() {
        let i = 2 + k as u64;
        let mut f = Fields::new(d);
        assert_eq!(f.u64(), Some(100 + i));
        assert_eq!(f.u64(), Some(i + 1), "offset of the next entry");
        assert_eq!(f.u32(), Some(6));
        assert_eq!(f.u32(), Some(libc::DT_DIR as u32));
        assert_eq!(&d[24..30], format!("entry{i}").as_bytes());
        assert_eq!(&d[30..32], &[0, 0], "padding is zeroed");
    }
}

#[test]
fn create_answers_an_entry_then_the_open_handle() {
    let ops = Fake::default();
    let mut op_in = [0u8; 16];
    Put::new(&mut op_in)
        .u32(libc::O_WRONLY as u32)
        .u32(0o100644)
        .u32(0o022)
        .u32(0);
    let mut e = entry(op::CREATE, 1, &op_in, b"new\0");
    let (error, reply) = run(&ops, &mut e);
    assert_eq!(error, 0);
    assert_eq!(reply.len(), abi::ENTRY_OUT_LEN + abi::OPEN_OUT_LEN);
    let mut f = Fields::new(&reply[abi::ENTRY_OUT_LEN..]);
    assert_eq!(f.u64(), Some(42));
    assert_eq!(f.u32(), Some(FopenFlags::FOPEN_DIRECT_IO.bits()));
    assert_eq!(
        ops.calls.lock().unwrap()[0],
        "create 1 new mode 100644 umask 22 flags 1"
    );
}

#[test]
fn copy_file_range_decodes_both_files_and_answers_the_count() {
    let ops = Fake::default();
    let mut op_in = [0u8; 56];
    Put::new(&mut op_in)
        .u64(3) // fh_in
        .u64(100) // off_in
        .u64(9) // nodeid_out
        .u64(4) // fh_out
        .u64(200) // off_out
        .u64(1 << 20) // len
        .u64(0); // flags
    let mut e = entry(op::COPY_FILE_RANGE, 8, &op_in, &[]);
    let (error, reply) = run(&ops, &mut e);
    assert_eq!(error, 0);
    let mut f = Fields::new(&reply);
    assert_eq!((f.u32(), f.u32(), reply.len()), (Some(4096), Some(0), 8));
    let want = CopyRange {
        ino_in: 8,
        fh_in: 3,
        off_in: 100,
        ino_out: 9,
        fh_out: 4,
        off_out: 200,
        len: 1 << 20,
        flags: 0,
    };
    assert_eq!(ops.calls.lock().unwrap()[0], format!("{want:?}"));
}

#[test]
fn an_opcode_not_served_answers_enosys() {
    let ops = Fake::default();
    for opcode in [31, 39, 48, 9999] {
        let mut e = entry(opcode, 1, &[], &[]);
        assert_eq!(
            run(&ops, &mut e),
            (-libc::ENOSYS, vec![]),
            "opcode {opcode}"
        );
    }
}

#[test]
fn a_payload_size_past_the_buffer_is_clamped_to_it() {
    let ops = Fake::default();
    let mut e = entry(op::LOOKUP, 1, &[], b"x\0");
    Put::new(&mut e.header[abi::PAYLOAD_SZ_AT..abi::PAYLOAD_SZ_AT + 4]).u32(u32::MAX);
    let (error, _) = run(&ops, &mut e);
    assert_eq!(error, 0);
}
