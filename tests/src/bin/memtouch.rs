//! The swap test's workload and its memory hog.
//!
//! `memtouch fill MIB SEED`: maps MIB MiB of anonymous memory, writes every 4 KiB
//! page with words derived from (SEED, page, word), then reads every page back twice
//! (in a different order each time, so pages swapped out in between come back in) and
//! checks each word. Prints `memtouch: N pages checked` and exits 0 when all match;
//! prints the first bad pages and exits 1 otherwise. Run in a memory cgroup whose
//! limit is far below MIB, most of its pages go to swap and back.
//!
//! `memtouch hog MIB`: maps MIB MiB locked in memory (faulted in at once), prints
//! `memtouch: hogging` and sleeps until killed: the rest of the machine is left short
//! of memory.

use std::io::Write;

const PAGE: usize = 4096;
const WORDS: usize = PAGE / 8;
const MIB: usize = 1 << 20;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib = |i: usize| -> usize {
        args.get(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| usage())
    };
    match args.get(1).map(String::as_str) {
        Some("fill") => {
            let seed: u64 = args
                .get(3)
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| usage());
            std::process::exit(fill(mib(2), seed))
        }
        Some("hog") => hog(mib(2)),
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!("usage: memtouch fill MIB SEED | memtouch hog MIB");
    std::process::exit(2)
}

/// An anonymous private mapping of `len` bytes with extra mmap `flags`.
fn map(len: usize, flags: libc::c_int) -> &'static mut [u64] {
    // SAFETY: a fresh anonymous mapping, owned by nothing else, never unmapped (the
    // process exits with it).
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            eprintln!(
                "memtouch: mmap of {} MiB: {}",
                len / MIB,
                std::io::Error::last_os_error()
            );
            std::process::exit(3);
        }
        std::slice::from_raw_parts_mut(p.cast::<u64>(), len / 8)
    }
}

/// The word at `word` of page `page` (splitmix64 of the three).
fn word(seed: u64, page: usize, word: usize) -> u64 {
    let mut z = seed ^ ((page as u64) << 16 | word as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fill(mib: usize, seed: u64) -> i32 {
    let pages = mib * MIB / PAGE;
    let mem = map(mib * MIB, 0);
    for page in 0..pages {
        for w in 0..WORDS {
            mem[page * WORDS + w] = word(seed, page, w);
        }
    }
    let mut bad = Vec::new();
    // Backwards, then with a stride coprime to the page count: each pass touches the
    // pages in an order that defeats a plain LRU, so most come back from swap.
    let stride = (0..)
        .map(|k| 7919 + 2 * k)
        .find(|s| gcd(*s, pages) == 1)
        .unwrap_or(1);
    let orders: [Box<dyn Fn(usize) -> usize>; 2] = [
        Box::new(move |i| pages - 1 - i),
        Box::new(move |i| (i * stride) % pages),
    ];
    for order in &orders {
        for i in 0..pages {
            let page = order(i);
            let ok = (0..WORDS).all(|w| mem[page * WORDS + w] == word(seed, page, w));
            if !ok && !bad.contains(&page) {
                bad.push(page);
            }
        }
    }
    if bad.is_empty() {
        println!("memtouch: {pages} pages checked");
        0
    } else {
        println!(
            "memtouch: {} of {pages} pages differ from what was written, first {:?}",
            bad.len(),
            &bad[..bad.len().min(16)]
        );
        1
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn hog(mib: usize) -> ! {
    let mem = map(mib * MIB, 0);
    // Huge pages where the kernel has them: faulting in gigabytes is several times
    // faster. mlock faults the whole mapping in and keeps it from swap.
    // SAFETY: madvise and mlock on the mapping made above, of that length.
    unsafe {
        libc::madvise(mem.as_mut_ptr().cast(), mib * MIB, libc::MADV_HUGEPAGE);
        if libc::mlock(mem.as_ptr().cast(), mib * MIB) != 0 {
            eprintln!(
                "memtouch: mlock of {mib} MiB: {}",
                std::io::Error::last_os_error()
            );
            std::process::exit(3);
        }
    }
    println!("memtouch: hogging");
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
