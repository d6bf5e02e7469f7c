//! Little-endian fields, the one codec every binary format of rmemfs is written in:
//! the control protocol, the tcp fabric's headers, a volume's records and log, and a
//! memnode's memory file and books.
//!
//! [`Reader`] is a cursor over bytes from outside (a peer, remote memory, a file) that
//! fails with [`Truncated`] where a field would run past the end, never panics; each
//! format maps that to its own error and adds its own checks (lengths, flags) on top.
//! [`put`] appends a field to a `Vec<u8>`. [`u16_at`], [`u32_at`] and [`u64_at`] read a
//! field at a fixed offset of a fixed-size header, and [`put_at`] writes one there.

/// A field would have run past the end of the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated {
    /// How many bytes the field needed from the start.
    pub needed: usize,
    /// How many there are.
    pub have: usize,
}

/// Reads little-endian fields from the front of `buf`.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    /// The next `n` bytes.
    #[inline]
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        match self.pos.checked_add(n).filter(|&e| e <= self.buf.len()) {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(Truncated {
                needed: self.pos.saturating_add(n),
                have: self.buf.len(),
            }),
        }
    }

    /// The next `N` bytes, as an array.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    #[inline]
    pub fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.take(1)?[0])
    }

    #[inline]
    pub fn u16(&mut self) -> Result<u16, Truncated> {
        self.array().map(u16::from_le_bytes)
    }

    #[inline]
    pub fn u32(&mut self) -> Result<u32, Truncated> {
        self.array().map(u32::from_le_bytes)
    }

    #[inline]
    pub fn u64(&mut self) -> Result<u64, Truncated> {
        self.array().map(u64::from_le_bytes)
    }

    /// How many bytes were read.
    #[inline]
    pub fn position(&self) -> usize {
        self.pos
    }

    /// How many bytes are left.
    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// The whole buffer read from.
    #[inline]
    pub fn len(&self) -> usize {
        self.buf.len()
    }
}

/// An integer written as its little-endian bytes.
pub trait Field: Copy {
    /// Appends the bytes to `out`.
    fn put(self, out: &mut Vec<u8>);
    /// Writes the bytes at the start of `out`, which must hold them.
    fn put_into(self, out: &mut [u8]);
}

macro_rules! field {
    ($($t:ty),*) => {$(
        impl Field for $t {
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn put_into(self, out: &mut [u8]) {
                out[..size_of::<$t>()].copy_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
field!(u8, u16, u32, u64);

impl<T: Field> Field for &T {
    #[inline]
    fn put(self, out: &mut Vec<u8>) {
        (*self).put(out);
    }
    #[inline]
    fn put_into(self, out: &mut [u8]) {
        (*self).put_into(out);
    }
}

/// Appends `v` to `out` as little-endian bytes.
#[inline]
pub fn put<T: Field>(out: &mut Vec<u8>, v: T) {
    v.put(out);
}

/// Writes `v` at offset `at` of a fixed-size header `b`: for headers built on the data
/// path without allocating. The offsets are the format's constants, so one past the
/// end is a bug in rmemfs, and panics.
#[inline]
pub fn put_at<T: Field>(b: &mut [u8], at: usize, v: T) {
    v.put_into(&mut b[at..]);
}

/// The `u16` at `at`, or None when it runs past the end.
#[inline]
pub fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

/// The `u32` at `at`, or None when it runs past the end.
#[inline]
pub fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// The `u64` at `at`, or None when it runs past the end.
#[inline]
pub fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fields_are_little_endian() {
        let mut w = Vec::new();
        put(&mut w, 1u8);
        put(&mut w, 0x0302u16);
        put(&mut w, 0x0706_0504u32);
        put(&mut w, 0x0f0e_0d0c_0b0a_0908u64);
        assert_eq!(w, (1..=15).collect::<Vec<u8>>());
        assert_eq!(u16_at(&w, 1), Some(0x0302));
        assert_eq!(u32_at(&w, 3), Some(0x0706_0504));
        assert_eq!(u64_at(&w, 7), Some(0x0f0e_0d0c_0b0a_0908));
        assert_eq!(u64_at(&w, 8), None);
        assert_eq!(u16_at(&w, usize::MAX), None);
        let mut fixed = [0u8; 15];
        put_at(&mut fixed, 0, 1u8);
        put_at(&mut fixed, 1, 0x0302u16);
        put_at(&mut fixed, 3, 0x0706_0504u32);
        put_at(&mut fixed, 7, 0x0f0e_0d0c_0b0a_0908u64);
        assert_eq!(&fixed[..], &w[..]);
    }

    #[test]
    fn a_short_buffer_is_truncated_not_a_panic() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u16(), Ok(0x0201));
        assert_eq!(r.u32(), Err(Truncated { needed: 6, have: 3 }));
        assert_eq!(r.position(), 2, "a failed read consumes nothing");
        assert_eq!(r.take(usize::MAX).unwrap_err().needed, usize::MAX);
        assert_eq!(r.u8(), Ok(3));
        assert!(r.is_empty());
    }

    proptest! {
        #[test]
        fn what_is_written_reads_back(a: u8, b: u16, c: u32, d: u64, tail: Vec<u8>) {
            let mut w = Vec::new();
            put(&mut w, a);
            put(&mut w, b);
            put(&mut w, c);
            put(&mut w, d);
            w.extend_from_slice(&tail);
            let mut r = Reader::new(&w);
            prop_assert_eq!(r.u8(), Ok(a));
            prop_assert_eq!(r.u16(), Ok(b));
            prop_assert_eq!(r.u32(), Ok(c));
            prop_assert_eq!(r.u64(), Ok(d));
            prop_assert_eq!(r.remaining(), tail.len());
            prop_assert_eq!(r.take(tail.len()), Ok(&tail[..]));
            prop_assert!(r.is_empty());
        }
    }
}
