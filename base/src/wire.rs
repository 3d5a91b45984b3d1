//! The one encoding used for every byte that crosses a process boundary.
//!
//! Little-endian fixed-width integers and length-prefixed byte strings, each message opened by
//! a 4-byte magic and a 16-bit version. Decoding never panics and never allocates more than the
//! caller's stated bound: a length field is checked against both the bound and the bytes that
//! are actually present before anything is copied.

use crate::error::{Error, Result};

/// Builds an encoded message.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// Starts a message with its magic and version.
    pub fn new(magic: [u8; 4], version: u16) -> Self {
        let mut w = Writer {
            buf: Vec::with_capacity(64),
        };
        w.buf.extend_from_slice(&magic);
        w.u16(version);
        w
    }

    /// Appends one byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    /// Appends a little-endian `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a little-endian `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a little-endian `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends raw bytes with no length prefix (fixed-size fields).
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }

    /// Appends a `u32` length followed by the bytes.
    ///
    /// # Panics
    /// Never in practice: slices over 4 GiB are not encoded by this crate, and the assertion
    /// guards against a silent truncation if one ever is.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        let len = u32::try_from(v.len()).expect("wire::Writer::bytes: field longer than 4 GiB");
        self.u32(len);
        self.raw(v)
    }

    /// Appends a length-prefixed UTF-8 string.
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }

    /// The encoded message.
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads an encoded message, checking every step.
#[derive(Debug)]
pub struct Reader<'a> {
    what: &'static str,
    buf: &'a [u8],
    pos: usize,
    version: u16,
}

impl<'a> Reader<'a> {
    /// Opens a message, checking its magic and that its version is one we understand
    /// (`min_version..=max_version`).
    pub fn open(
        what: &'static str,
        buf: &'a [u8],
        magic: [u8; 4],
        min_version: u16,
        max_version: u16,
    ) -> Result<Self> {
        let mut r = Reader {
            what,
            buf,
            pos: 0,
            version: 0,
        };
        let found = r.array::<4>()?;
        if found != magic {
            return Err(Error::malformed(
                what,
                format!("bad magic: expected {magic:02x?}, found {found:02x?}"),
            ));
        }
        let version = r.u16()?;
        if !(min_version..=max_version).contains(&version) {
            return Err(Error::malformed(
                what,
                format!(
                    "unsupported version {version}: this build understands {min_version}..={max_version}"
                ),
            ));
        }
        r.version = version;
        Ok(r)
    }

    /// The version the message declared.
    pub fn version(&self) -> u16 {
        self.version
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let remaining = self.buf.len() - self.pos;
        if n > remaining {
            return Err(Error::malformed(
                self.what,
                format!(
                    "truncated: needed {n} more bytes at offset {}, only {remaining} present",
                    self.pos
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Reads a fixed-size array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    /// Reads one byte.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    /// Reads a little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    /// Reads a little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// Reads a little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Reads a `u64` that must fit a `usize` and be at most `max`.
    pub fn usize_at_most(&mut self, field: &str, max: usize) -> Result<usize> {
        let v = self.u64()?;
        match usize::try_from(v) {
            Ok(v) if v <= max => Ok(v),
            _ => Err(Error::malformed(
                self.what,
                format!("{field} = {v} exceeds the limit of {max}"),
            )),
        }
    }

    /// Reads a length-prefixed byte string of at most `max` bytes.
    pub fn bytes(&mut self, field: &str, max: usize) -> Result<&'a [u8]> {
        let len = self.u32()? as usize;
        if len > max {
            return Err(Error::malformed(
                self.what,
                format!("{field} is {len} bytes, the limit is {max}"),
            ));
        }
        self.take(len)
    }

    /// Reads a length-prefixed UTF-8 string of at most `max` bytes.
    pub fn str(&mut self, field: &str, max: usize) -> Result<&'a str> {
        let b = self.bytes(field, max)?;
        std::str::from_utf8(b)
            .map_err(|e| Error::malformed(self.what, format!("{field} is not UTF-8: {e}")))
    }

    /// Checks that nothing follows the last field.
    pub fn finish(self) -> Result<()> {
        let extra = self.buf.len() - self.pos;
        if extra != 0 {
            return Err(Error::malformed(
                self.what,
                format!("{extra} unexpected trailing bytes"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAGIC: [u8; 4] = *b"TEST";

    fn decode(buf: &[u8]) -> Result<(u8, u64, Vec<u8>, String)> {
        let mut r = Reader::open("test message", buf, MAGIC, 1, 2)?;
        let a = r.u8()?;
        let b = r.u64()?;
        let c = r.bytes("payload", 64)?.to_vec();
        let d = r.str("name", 16)?.to_owned();
        r.finish()?;
        Ok((a, b, c, d))
    }

    #[test]
    fn round_trip() {
        let mut w = Writer::new(MAGIC, 2);
        w.u8(7).u64(u64::MAX - 3).bytes(b"hello").str("rank0");
        let buf = w.finish();
        let got = decode(&buf).unwrap();
        assert_eq!(
            got,
            (7, u64::MAX - 3, b"hello".to_vec(), "rank0".to_string())
        );
    }

    #[test]
    fn rejects_bad_magic_version_length_and_trailing() {
        let mut w = Writer::new(*b"XXXX", 1);
        w.u8(0);
        assert!(matches!(decode(&w.finish()), Err(Error::Malformed { .. })));

        let w = Writer::new(MAGIC, 3);
        let e = decode(&w.finish()).unwrap_err().to_string();
        assert!(e.contains("unsupported version 3"), "{e}");

        let mut w = Writer::new(MAGIC, 1);
        w.u8(0).u64(0).u32(1_000_000);
        let e = decode(&w.finish()).unwrap_err().to_string();
        assert!(e.contains("limit is 64"), "{e}");

        let mut w = Writer::new(MAGIC, 1);
        w.u8(0).u64(0).bytes(b"").str("").u8(9);
        let e = decode(&w.finish()).unwrap_err().to_string();
        assert!(e.contains("trailing"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = decode(&buf);
        }

        #[test]
        fn every_truncation_is_an_error(cut in 0usize..30) {
            let mut w = Writer::new(MAGIC, 1);
            w.u8(1).u64(2).bytes(b"abc").str("de");
            let buf = w.finish();
            prop_assume!(cut < buf.len());
            prop_assert!(decode(&buf[..cut]).is_err());
        }
    }
}
