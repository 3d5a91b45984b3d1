//! Frames of the Ethernet transport: a fixed-size header (a [`mscclpp_hal::wire`] message)
//! followed by a payload whose length the header states and the decoder bounds before anything
//! is allocated.

use mscclpp_hal::wire::{Reader, Writer};
use mscclpp_hal::{Error, Result};

use crate::offer::MAX_FRAME_PAYLOAD;

const MAGIC: [u8; 4] = *b"MSEF";
const VERSION: u16 = 1;
/// Bytes of every header: magic 4, version 2, kind 1, three u64 fields, payload length u32.
pub(crate) const HEADER_LEN: usize = 4 + 2 + 1 + 3 * 8 + 4;
/// Longest error message a peer may send.
pub(crate) const MAX_ERROR: usize = 4096;

/// What a frame says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Frame {
    /// `len` bytes of payload for `offset` of the receiver's memory `mem`.
    Write { mem: u64, offset: u64, len: u64 },
    /// A 64-bit token for `offset` of memory `mem`, after all earlier data.
    Update { mem: u64, offset: u64, value: u64 },
    /// Answer with `FlushAck { seq }` once everything before has landed.
    FlushReq { seq: u64 },
    /// Everything before the `FlushReq { seq }` has landed.
    FlushAck { seq: u64 },
    /// The sender failed the connection; the payload (`len` bytes of UTF-8) says why.
    Error { len: u64 },
}

impl Frame {
    /// Payload bytes that follow the header.
    pub(crate) fn payload_len(self) -> u64 {
        match self {
            Frame::Write { len, .. } | Frame::Error { len } => len,
            _ => 0,
        }
    }

    /// The encoded header.
    pub(crate) fn header(self) -> [u8; HEADER_LEN] {
        let (kind, a, b, c) = match self {
            Frame::Write { mem, offset, len } => (1, mem, offset, len),
            Frame::Update { mem, offset, value } => (2, mem, offset, value),
            Frame::FlushReq { seq } => (3, seq, 0, 0),
            Frame::FlushAck { seq } => (4, seq, 0, 0),
            Frame::Error { len } => (5, 0, 0, len),
        };
        let mut w = Writer::new(MAGIC, VERSION);
        // Payloads are bounded far below 4 GiB (checked when frames are made and decoded).
        w.u8(kind)
            .u64(a)
            .u64(b)
            .u64(c)
            .u32(self.payload_len() as u32);
        let v = w.finish();
        let mut out = [0u8; HEADER_LEN];
        out.copy_from_slice(&v);
        out
    }

    /// Decodes and validates a header from the peer.
    pub(crate) fn decode(h: &[u8]) -> Result<Frame> {
        const WHAT: &str = "Ethernet frame header";
        let mut r = Reader::open(WHAT, h, MAGIC, VERSION, VERSION)?;
        let kind = r.u8()?;
        let (a, b, c) = (r.u64()?, r.u64()?, r.u64()?);
        let payload = r.u32()? as u64;
        r.finish()?;
        let f = match kind {
            1 => Frame::Write {
                mem: a,
                offset: b,
                len: c,
            },
            2 => Frame::Update {
                mem: a,
                offset: b,
                value: c,
            },
            3 => Frame::FlushReq { seq: a },
            4 => Frame::FlushAck { seq: a },
            5 => Frame::Error { len: c },
            k => return Err(Error::malformed(WHAT, format!("unknown frame kind {k}"))),
        };
        let limit = match f {
            Frame::Write { .. } => MAX_FRAME_PAYLOAD as u64,
            Frame::Error { .. } => MAX_ERROR as u64,
            _ => 0,
        };
        if payload != f.payload_len() || payload > limit {
            return Err(Error::malformed(
                WHAT,
                format!(
                    "{f:?} with a payload of {payload} bytes (expected {}, at most {limit})",
                    f.payload_len()
                ),
            ));
        }
        if matches!(f, Frame::Write { len: 0, .. }) {
            return Err(Error::malformed(WHAT, "empty write"));
        }
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn headers_round_trip_and_bounds_hold() {
        for f in [
            Frame::Write {
                mem: 3,
                offset: 17,
                len: 4096,
            },
            Frame::Update {
                mem: 1,
                offset: 8,
                value: u64::MAX,
            },
            Frame::FlushReq { seq: 9 },
            Frame::FlushAck { seq: 9 },
            Frame::Error { len: 12 },
        ] {
            assert_eq!(Frame::decode(&f.header()).unwrap(), f);
        }
        let big = Frame::Write {
            mem: 1,
            offset: 0,
            len: MAX_FRAME_PAYLOAD as u64 + 1,
        };
        let e = Frame::decode(&big.header()).unwrap_err().to_string();
        assert!(e.contains("at most"), "{e}");
        let mut h = Frame::FlushReq { seq: 1 }.header();
        h[HEADER_LEN - 4] = 1; // a payload on a frame that has none
        assert!(Frame::decode(&h).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn arbitrary_headers_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Frame::decode(&buf);
        }

        #[test]
        fn mutated_headers_never_panic(at in 0usize..HEADER_LEN, x in 1u8..=255, kind in 1u8..=5) {
            let mut h = Frame::Write { mem: 1, offset: 2, len: 3 }.header();
            h[6] = kind;
            h[at] ^= x;
            if let Ok(f) = Frame::decode(&h) {
                prop_assert!(f.payload_len() <= MAX_FRAME_PAYLOAD as u64);
            }
        }
    }
}
