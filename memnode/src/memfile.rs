//! The memory file (`memnode --memory-file PATH`): the region and the memnode's books
//! kept in a file that outlives the process, on tmpfs or hugetlbfs, so that a crash
//! or an upgrade of the memnode process (not of its host) loses nothing. memcached's
//! restartable cache (`-e`) is the precedent.
//!
//! Layout (offsets in bytes):
//!
//! ```text
//! 0            header: magic, version, region size and page, the region's address,
//!              state slot size, memnode id, boot count, listen address, CRC
//! 4096         state slot A  } the books (`saved::SavedState`), written in turn;
//! 4096 + S     state slot B  } the valid one with the higher sequence number wins
//! R            the region: R a multiple of 2 MiB (and of the file's page)
//! ```
//!
//! Why two slots: a save interrupted by a crash leaves the other, older one whole.
//! Why the region's address is recorded: clients hold remote addresses, which are
//! virtual addresses of the region, so a restarted memnode maps the file at the same
//! address (`MAP_FIXED_NOREPLACE`; the address is picked at random between 16 and
//! 64 TiB, where a process's own mappings do not go).
//!
//! The file is locked (`flock`) while a memnode uses it, and its room is reserved
//! up front (`fallocate`), so a client's write can never find the filesystem full.
//! The header and the books are written through a shared mapping of their own
//! (hugetlbfs files cannot be written with `write`).
//! Opening refuses, with a message that says which, a file that is not a memory
//! file, whose header or both state slots are damaged, that is shorter than its
//! header says, that holds a region of another size or page, that was another
//! listen address's, or that another memnode has open. `--memory-file-reset`
//! starts it empty (a new memnode id) instead.

use crate::region::{system_page_size, Region, RegionError};
use crate::saved::SavedState;
use rmemfs_common::crc32c::crc32c;
use rmemfs_common::le;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use thiserror::Error;

const MAGIC: &[u8; 8] = b"RMEMFSMF";
const VERSION: u32 = 1;
const HEADER: u64 = 4096;
/// The region starts on a multiple of this (a huge page).
const REGION_ALIGN: u64 = 2 << 20;
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// `memnode --memory-file` and `--memory-file-reset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryFileConfig {
    pub path: PathBuf,
    /// Start empty, as a new memnode, whatever the file holds.
    pub reset: bool,
}

#[derive(Debug, Error)]
pub enum MemoryFileError {
    #[error("memory file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("memory file {path} is in use by another memnode (it is locked)")]
    Locked { path: PathBuf },
    #[error("memory file {path} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error("memory file {path} is not a memnode memory file ({why}); refusing to overwrite it (--memory-file-reset starts it empty)")]
    Foreign { path: PathBuf, why: String },
    #[error("memory file {path} is damaged: {why}; refusing to serve from it (--memory-file-reset starts it empty, losing what it held)")]
    Damaged { path: PathBuf, why: String },
    #[error("memory file {path} is truncated: {have} bytes, its header says {want}; refusing to serve from it (--memory-file-reset starts it empty, losing what it held)")]
    Truncated { path: PathBuf, have: u64, want: u64 },
    #[error("memory file {path} holds a region of {have} bytes and --size asks for {want}: start with the size it was made with, or --memory-file-reset to start empty")]
    OtherSize { path: PathBuf, have: u64, want: u64 },
    #[error("memory file {path} was made on {have}-byte pages and its filesystem now has {want}-byte pages")]
    OtherPage { path: PathBuf, have: u64, want: u64 },
    #[error("memory file {path} is the memnode listening on {have}'s, not this one's ({want}): clients of that address hold its memory; start this memnode with --listen {have}, or --memory-file-reset")]
    OtherListen {
        path: PathBuf,
        have: String,
        want: String,
    },
    #[error(
        "memory file {path}: its filesystem has no room for the {size}-byte region ({source})"
    )]
    NoRoom {
        path: PathBuf,
        size: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("memory file {path}: {source}")]
    Region {
        path: PathBuf,
        #[source]
        source: RegionError,
    },
}

/// The fixed part of the file: where everything is and whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Header {
    region_len: u64,
    page: u64,
    base: u64,
    slot: u64,
    region_at: u64,
    node_id: u64,
    boot: u64,
    listen: String,
}

impl Header {
    fn encode(&self) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        le::put(&mut b, VERSION);
        for v in [
            self.region_len,
            self.page,
            self.base,
            self.slot,
            self.region_at,
            self.node_id,
            self.boot,
        ] {
            le::put(&mut b, v);
        }
        let listen = &self.listen.as_bytes()[..self.listen.len().min(1024)];
        le::put(&mut b, listen.len() as u16);
        b.extend_from_slice(listen);
        let crc = crc32c(&b);
        le::put(&mut b, crc);
        b
    }

    /// `Err(true)`: no magic (not a memory file); `Err(false)`: damaged.
    fn decode(b: &[u8]) -> Result<Header, (bool, String)> {
        if b.len() < 8 || &b[..8] != MAGIC {
            return Err((true, "it does not start with a memory file's header".into()));
        }
        let fixed = 8 + 4 + 7 * 8 + 2;
        let damaged = |why: &str| (false, why.to_string());
        if b.len() < fixed + 4 {
            return Err(damaged("its header is cut short"));
        }
        let n = le::u16_at(b, fixed - 2).unwrap_or_default() as usize;
        let end = fixed + n;
        let Some(crc) = le::u32_at(b, end) else {
            return Err(damaged("its header is cut short"));
        };
        if crc32c(&b[..end]) != crc {
            return Err(damaged("its header's checksum does not match"));
        }
        let version = le::u32_at(b, 8).unwrap_or_default();
        if version != VERSION {
            return Err(damaged(&format!(
                "its header is of version {version}; this memnode reads {VERSION}"
            )));
        }
        let v = |i: usize| le::u64_at(b, 12 + 8 * i).unwrap_or_default();
        Ok(Header {
            region_len: v(0),
            page: v(1),
            base: v(2),
            slot: v(3),
            region_at: v(4),
            node_id: v(5),
            boot: v(6),
            listen: String::from_utf8_lossy(&b[fixed..end]).into_owned(),
        })
    }
}

/// An open memory file, locked for this memnode; saves its books.
#[derive(Debug)]
pub struct MemoryFile {
    /// Held open for its lock (`flock`), which goes with it.
    _file: File,
    path: PathBuf,
    header: Header,
    /// `[0, region_at)` of the file, mapped: the header and the state slots.
    meta: Region,
    /// The slot the next save goes to (0 or 1).
    next: u64,
    seq: u64,
    /// Bytes of the last save.
    last_len: usize,
}

/// A memory file opened: its region mapped, and what it held.
pub struct Opened {
    pub file: MemoryFile,
    pub region: Region,
    pub node_id: u64,
    /// How many times a memnode started on this file before (0: it was just made).
    pub boot: u64,
    /// The books saved last (`None`: the file was just made).
    pub saved: Option<SavedState>,
}

/// Bytes of one state slot for a region of `len` bytes in `page`-byte pages: room
/// for a booking per page (33 bytes each) or 1 MiB, whichever is more, and as much
/// again for sessions and volumes.
fn slot_size(len: u64, page: u64) -> u64 {
    let per_page = len / page.max(1) * 33;
    (per_page.max(1 << 20) * 2).next_multiple_of(4096)
}

impl MemoryFile {
    /// Opens (or makes) the memory file for a memnode of `size` bytes listening on
    /// `listen` (the address bound: clients reach it there), and maps its region.
    pub fn open(
        cfg: &MemoryFileConfig,
        size: u64,
        listen: &str,
    ) -> Result<Opened, MemoryFileError> {
        let path = cfg.path.clone();
        let io = |source: std::io::Error| MemoryFileError::Io {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.file_type().is_file() {
            return Err(MemoryFileError::NotAFile { path });
        }
        lock_file(&file, &path)?;
        let page = fs_page(&file).map_err(io)?;
        let region_len = size - size % page;
        if region_len == 0 {
            return Err(MemoryFileError::Region {
                path,
                source: RegionError::TooSmall { size, page },
            });
        }
        if cfg.reset || meta.len() == 0 {
            if cfg.reset && meta.len() > 0 {
                log::warn!(
                    "memory file {}: --memory-file-reset: starting empty, as a new memnode",
                    path.display()
                );
            }
            return MemoryFile::make(file, path, region_len, page, listen);
        }
        let mut head = vec![0u8; HEADER as usize];
        let got = read_up_to(&file, &mut head, 0).map_err(io)?;
        let header = Header::decode(&head[..got]).map_err(|(foreign, why)| {
            if foreign {
                MemoryFileError::Foreign {
                    path: path.clone(),
                    why,
                }
            } else {
                MemoryFileError::Damaged {
                    path: path.clone(),
                    why,
                }
            }
        })?;
        let want_len = header.region_at + header.region_len;
        if meta.len() < want_len {
            return Err(MemoryFileError::Truncated {
                path,
                have: meta.len(),
                want: want_len,
            });
        }
        if header.page != page {
            return Err(MemoryFileError::OtherPage {
                path,
                have: header.page,
                want: page,
            });
        }
        if header.region_len != region_len {
            return Err(MemoryFileError::OtherSize {
                path,
                have: header.region_len,
                want: region_len,
            });
        }
        if header.listen != listen {
            return Err(MemoryFileError::OtherListen {
                path,
                have: header.listen,
                want: listen.to_string(),
            });
        }
        if header.slot != slot_size(region_len, page)
            || header.region_at != region_offset(header.slot, page)
        {
            return Err(MemoryFileError::Damaged {
                path,
                why: "its layout does not match its size".into(),
            });
        }
        let meta = map_meta(&file, &header, &path)?;
        let (saved, slot) = read_state(&meta, &header).map_err(|why| MemoryFileError::Damaged {
            path: path.clone(),
            why,
        })?;
        let region = Region::map_file(
            &file,
            header.region_at,
            header.region_len,
            Some(header.base),
            page,
        )
        .map_err(|source| MemoryFileError::Region {
            path: path.clone(),
            source,
        })?;
        let mut header = header;
        header.boot += 1;
        write_header(&meta, &header);
        let boot = header.boot;
        let node_id = header.node_id;
        Ok(Opened {
            file: MemoryFile {
                _file: file,
                path,
                header,
                meta,
                next: 1 - slot,
                seq: saved.seq,
                last_len: 0,
            },
            region,
            node_id,
            boot,
            saved: Some(saved),
        })
    }

    /// Makes the file anew: empty, with a new memnode id.
    fn make(
        file: File,
        path: PathBuf,
        region_len: u64,
        page: u64,
        listen: &str,
    ) -> Result<Opened, MemoryFileError> {
        let at = path.clone();
        let io = |source: std::io::Error| MemoryFileError::Io {
            path: at.clone(),
            source,
        };
        let slot = slot_size(region_len, page);
        let region_at = region_offset(slot, page);
        // Emptied first, so nothing of what it held survives into the new region.
        file.set_len(0).map_err(io)?;
        file.set_len(region_at + region_len).map_err(io)?;
        reserve(&file, region_at + region_len).map_err(|source| MemoryFileError::NoRoom {
            path: path.clone(),
            size: region_len,
            source,
        })?;
        let region =
            Region::map_file(&file, region_at, region_len, None, page).map_err(|source| {
                MemoryFileError::Region {
                    path: path.clone(),
                    source,
                }
            })?;
        let node_id = crate::random_node_id().map_err(|e| MemoryFileError::Io {
            path: path.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let header = Header {
            region_len,
            page,
            base: region.base(),
            slot,
            region_at,
            node_id,
            boot: 0,
            listen: listen.to_string(),
        };
        let meta = map_meta(&file, &header, &path)?;
        let mut mf = MemoryFile {
            _file: file,
            path,
            header,
            meta,
            next: 0,
            seq: 0,
            last_len: 0,
        };
        mf.save(&mut SavedState::default()).map_err(io)?;
        write_header(&mf.meta, &mf.header);
        Ok(Opened {
            file: mf,
            region,
            node_id,
            boot: 0,
            saved: None,
        })
    }

    /// Writes `state` (given the next sequence number) to the older slot. It
    /// reaches the file's pages before this returns, so a crash of the process
    /// after it keeps it (a crash of the host does not: the file is memory).
    pub fn save(&mut self, state: &mut SavedState) -> std::io::Result<()> {
        state.seq = self.seq + 1;
        let record = state.encode();
        if record.len() as u64 > self.header.slot {
            return Err(std::io::Error::other(format!(
                "the books ({} bytes) outgrew their slot ({} bytes)",
                record.len(),
                self.header.slot
            )));
        }
        self.meta
            .write(HEADER + self.next * self.header.slot, &record)
            .map_err(std::io::Error::other)?;
        self.seq = state.seq;
        self.next = 1 - self.next;
        self.last_len = record.len();
        Ok(())
    }

    /// True when the books fill over three quarters of their slot: then the memnode
    /// refuses what would grow them (a new session, an allocation) rather than find
    /// one day it cannot save them. A quarter of a slot is at least 512 KiB, far more
    /// than any one request adds.
    pub fn nearly_full(&self) -> bool {
        self.last_len as u64 > self.header.slot / 4 * 3
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Where the region starts for slots of `slot` bytes on `page`-byte pages.
fn region_offset(slot: u64, page: u64) -> u64 {
    (HEADER + 2 * slot).next_multiple_of(REGION_ALIGN.max(page))
}

/// Maps the header and the state slots, `[0, region_at)` of the file.
fn map_meta(file: &File, h: &Header, path: &Path) -> Result<Region, MemoryFileError> {
    Region::map_file(file, 0, h.region_at, None, h.page).map_err(|source| MemoryFileError::Region {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes the header at the start of the mapped metadata (always in bounds: the
/// header is far smaller than its 4 KiB).
fn write_header(meta: &Region, h: &Header) {
    if let Err(e) = meta.write(0, &h.encode()) {
        log::error!("the memory file's header does not fit its place: {e}");
    }
}

/// The newer valid slot and its index, or why neither is.
fn read_state(meta: &Region, h: &Header) -> Result<(SavedState, u64), String> {
    let mut best: Option<(SavedState, u64)> = None;
    let mut why = Vec::new();
    for i in 0..2u64 {
        let mut buf = vec![0u8; h.slot as usize];
        if let Err(e) = meta.read(HEADER + i * h.slot, &mut buf) {
            why.push(format!("slot {i}: {e}"));
            continue;
        }
        match SavedState::decode(&buf) {
            Ok(s) if best.as_ref().is_none_or(|(b, _)| s.seq > b.seq) => best = Some((s, i)),
            Ok(_) => {}
            Err(e) => why.push(format!("slot {i}: {e}")),
        }
    }
    best.ok_or_else(|| {
        format!(
            "both copies of its books are unreadable ({})",
            why.join("; ")
        )
    })
}

/// Reads up to `buf.len()` bytes at `at`; returns how many there were.
fn read_up_to(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], at + got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

fn lock_file(file: &File, path: &Path) -> Result<(), MemoryFileError> {
    // SAFETY: flock on an fd we own has no memory-safety preconditions.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(MemoryFileError::Locked {
            path: path.to_path_buf(),
        });
    }
    Err(MemoryFileError::Io {
        path: path.to_path_buf(),
        source: e,
    })
}

/// The page the file's filesystem maps in: its huge page on hugetlbfs.
fn fs_page(file: &File) -> std::io::Result<u64> {
    // SAFETY: a zeroed statfs is a valid out-parameter; the fd is open.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable statfs for the call.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if st.f_type as i64 == HUGETLBFS_MAGIC {
        return Ok((st.f_bsize as u64).max(system_page_size()));
    }
    Ok(system_page_size())
}

/// Reserves the file's room (`fallocate`), where the filesystem supports it.
fn reserve(file: &File, len: u64) -> std::io::Result<()> {
    let n = libc::off_t::try_from(len).map_err(std::io::Error::other)?;
    // SAFETY: fallocate on an fd we own has no memory-safety preconditions.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, n) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => {
            log::warn!("the memory file's filesystem cannot reserve room up front (fallocate): a write may fail once it is full");
            Ok(())
        }
        _ => Err(e),
    }
}

#[cfg(test)]
#[path = "memfile_tests.rs"]
mod tests;
