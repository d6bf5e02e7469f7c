use super::*;
use crate::allocator::{Booking, Owner};

const SIZE: u64 = 8 << 20;
const LISTEN: &str = "127.0.0.1:7070";

/// A fresh path in a directory of its own, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("memfile-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Scratch(dir)
    }

    fn file(&self) -> PathBuf {
        self.0.join("memory")
    }

    fn cfg(&self, reset: bool) -> MemoryFileConfig {
        MemoryFileConfig {
            path: self.file(),
            reset,
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(s: &Scratch) -> Result<Opened, MemoryFileError> {
    MemoryFile::open(&s.cfg(false), SIZE, LISTEN)
}

/// Makes the file, writes `bytes` at the start of its region and saves one booking.
fn made_with(s: &Scratch, bytes: &[u8]) -> u64 {
    let mut o = open(s).expect("a new memory file is made");
    assert!(o.saved.is_none(), "a new file has no books");
    assert_eq!(o.boot, 0);
    o.region.write(0, bytes).expect("in the region");
    let mut books = SavedState {
        bookings: vec![Booking {
            owner: Owner::Client(5),
            addr: o.region.base(),
            len: 4096,
        }],
        ..SavedState::default()
    };
    o.file.save(&mut books).expect("the books are saved");
    o.node_id
}

#[test]
fn a_memory_file_comes_back_with_its_id_bytes_books_and_address() {
    let s = Scratch::new("back");
    let id = made_with(&s, b"kept across a restart");
    let o = open(&s).expect("the file opens again");
    assert_eq!(o.node_id, id, "the same memnode instance");
    assert_eq!(o.boot, 1, "the second start");
    let mut back = [0u8; 21];
    o.region.read(0, &mut back).expect("in the region");
    assert_eq!(&back, b"kept across a restart");
    let saved = o.saved.clone().expect("the books were saved");
    assert_eq!(saved.bookings.len(), 1);
    assert_eq!(
        saved.bookings[0].addr,
        o.region.base(),
        "mapped at the address the books name"
    );
    drop(o);
    assert_eq!(open(&s).expect("opens a third time").boot, 2);
}

#[test]
fn the_newer_of_the_two_saved_books_wins_and_a_damaged_one_falls_back_to_the_other() {
    let s = Scratch::new("slots");
    {
        let mut o = open(&s).expect("made");
        for last in [1u64, 2, 3] {
            let mut books = SavedState {
                last_volume_id: last,
                ..SavedState::default()
            };
            o.file.save(&mut books).expect("saved");
        }
    }
    let o = open(&s).expect("opens");
    assert_eq!(o.saved.as_ref().map(|b| b.last_volume_id), Some(3));
    let slot = o.file.header.slot;
    drop(o);
    // Damage the newest (seq 4 went to slot 1: made wrote slot 0 with seq 1).
    let f = OpenOptions::new()
        .write(true)
        .open(s.file())
        .expect("opens");
    f.write_all_at(&[0xff; 16], HEADER + slot + 20)
        .expect("writes");
    drop(f);
    let o = open(&s).expect("the older slot is still whole");
    assert_eq!(o.saved.as_ref().map(|b| b.last_volume_id), Some(2));
}

fn refusal(s: &Scratch) -> String {
    match open(s) {
        Ok(_) => panic!("the memory file should have been refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_damaged_truncated_foreign_or_other_memnodes_file_is_refused_with_a_reason() {
    let s = Scratch::new("refusals");
    made_with(&s, b"x");
    let whole = std::fs::read(s.file()).expect("reads");

    // Another size, another listen address.
    let e = MemoryFile::open(&s.cfg(false), SIZE * 2, LISTEN)
        .err()
        .map(|e| e.to_string());
    assert!(e.as_deref().is_some_and(|e| e.contains("--size")), "{e:?}");
    let e = MemoryFile::open(&s.cfg(false), SIZE, "127.0.0.1:7071")
        .err()
        .map(|e| e.to_string());
    assert!(e.as_deref().is_some_and(|e| e.contains("7070")), "{e:?}");

    // A header byte flipped.
    let mut bad = whole.clone();
    bad[20] ^= 0x40;
    std::fs::write(s.file(), &bad).expect("writes");
    assert!(refusal(&s).contains("damaged"));

    // Both books damaged.
    let mut bad = whole.clone();
    let slot = slot_size(SIZE, system_page_size()) as usize;
    bad[HEADER as usize + 12] ^= 1;
    bad[HEADER as usize + slot + 12] ^= 1;
    std::fs::write(s.file(), &bad).expect("writes");
    let e = refusal(&s);
    assert!(e.contains("damaged") && e.contains("books"), "{e}");

    // Cut short.
    std::fs::write(s.file(), &whole[..whole.len() / 2]).expect("writes");
    assert!(refusal(&s).contains("truncated"));

    // Not a memory file at all: refused, and left as it was.
    std::fs::write(s.file(), b"somebody's notes\n").expect("writes");
    assert!(refusal(&s).contains("not a memnode memory file"));
    assert_eq!(
        std::fs::read(s.file()).expect("reads"),
        b"somebody's notes\n"
    );

    // Reset starts empty, as a new instance.
    std::fs::write(s.file(), &whole).expect("writes");
    let old = open(&s).expect("whole again").node_id;
    let o = MemoryFile::open(&s.cfg(true), SIZE, LISTEN).expect("reset");
    assert!(o.saved.is_none(), "reset has no books");
    assert_ne!(o.node_id, old, "reset is a new memnode instance");
    let mut back = [0xffu8; 1];
    o.region.read(0, &mut back).expect("in the region");
    assert_eq!(back, [0], "reset memory reads as zero");
}

#[test]
fn a_memory_file_in_use_is_refused() {
    let s = Scratch::new("locked");
    let _first = open(&s).expect("made");
    assert!(refusal(&s).contains("in use"));
}

#[test]
fn freed_memory_of_a_file_region_reads_as_zero() {
    let s = Scratch::new("zero");
    let o = open(&s).expect("made");
    let page = o.region.granularity();
    o.region
        .write(0, &vec![7u8; 3 * page as usize])
        .expect("writes");
    o.region.zero(page, page).expect("zeroes");
    let mut all = vec![0u8; 3 * page as usize];
    o.region.read(0, &mut all).expect("reads");
    let page = page as usize;
    assert!(all[..page].iter().all(|&b| b == 7));
    assert!(all[page..2 * page].iter().all(|&b| b == 0));
    assert!(all[2 * page..].iter().all(|&b| b == 7));
    drop(o);
    let o = open(&s).expect("opens");
    let mut again = vec![1u8; page];
    o.region.read(page as u64, &mut again).expect("reads");
    assert!(again.iter().all(|&b| b == 0), "the zeros are in the file");
}
