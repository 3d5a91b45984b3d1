//! The bootstrap wire protocol: every byte a bootstrap socket carries.
//!
//! A connection carries *frames*: a fixed-size header ([`FRAME_HEADER_BYTES`], encoded with
//! [`mscclpp_base::wire`]) followed by `len` payload bytes. The header is read and decoded
//! first, and `len` is checked against the receiver's bound before a payload buffer is
//! allocated, so a hostile or corrupted peer can neither crash a rank nor make it allocate
//! unbounded memory. Payloads of the handshake frames (Hello, Table, Error) are themselves
//! `wire` messages with their own magic and version.
//!
//! The decoders here are pure functions over byte slices so they can be property-tested.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use mscclpp_base::wire::{Reader, Writer};
use mscclpp_base::{Error, Result};

/// Version of every bootstrap message this build writes and reads.
pub const PROTOCOL_VERSION: u16 = 2;

const FRAME_MAGIC: [u8; 4] = *b"MSBF";
const HELLO_MAGIC: [u8; 4] = *b"MSHL";
const TABLE_MAGIC: [u8; 4] = *b"MSTB";
const ERROR_MAGIC: [u8; 4] = *b"MSER";
const LOST_MAGIC: [u8; 4] = *b"MSLO";

/// Size of an encoded frame header: magic (4), version (2), kind (1), tag (8), length (8).
pub const FRAME_HEADER_BYTES: usize = 23;

/// Bound on the payload of a frame from a peer that has not yet proven it knows the secret
/// (Hello, and the Error/Ack answers to it): small, so that an unauthenticated client cannot
/// make the root or a rank allocate anything sizeable.
pub const HANDSHAKE_MAX_BYTES: usize = 1024;

/// Bound on the message text of an Error frame.
const ERROR_TEXT_MAX: usize = 900;

/// Size of the secret shared by all ranks of one bootstrap.
pub const SECRET_BYTES: usize = 16;

/// Tags with this bit set belong to collectives; user tags must leave it clear.
pub const RESERVED_TAG_BIT: u64 = 1 << 63;

/// The text of a Crossed refusal, recognised by the dialler.
pub(crate) const CROSSED: &str = "crossed dial: keeping the lower rank's connection";

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A [`Hello`]: the first frame on every connection, from the connecting side.
    Hello,
    /// The root's answer: the listen address of every rank.
    Table,
    /// A tagged user or collective message.
    Data,
    /// A refusal or failure report; the sender closes the connection after it.
    Error,
    /// The acceptor's confirmation that a peer connection's Hello was valid.
    Ack,
    /// A failure report: the sender's operation failed because a rank died; carries that
    /// rank and why, so that ranks waiting on the sender fail naming the cause.
    Lost,
    /// An orderly goodbye: the sender is closing its bootstrap, so the end of this connection
    /// that follows is not a failure.
    Bye,
    /// A finished root's answer to a rank with its (stale) id: the encoded unique id of the
    /// rendezvous that replaced it (see `successor`).
    Moved,
    /// A survey: what was the receiver's last call? (tag: the survey's id; no payload.) The
    /// receiver's event loop answers, whatever its program is doing (see `progress`).
    Status,
    /// The answer to a survey (tag: its id): the receiver's record.
    StatusReply,
}

impl FrameKind {
    fn code(self) -> u8 {
        match self {
            FrameKind::Hello => 1,
            FrameKind::Table => 2,
            FrameKind::Data => 3,
            FrameKind::Error => 4,
            FrameKind::Ack => 5,
            FrameKind::Lost => 6,
            FrameKind::Bye => 7,
            FrameKind::Moved => 8,
            FrameKind::Status => 9,
            FrameKind::StatusReply => 10,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => FrameKind::Hello,
            2 => FrameKind::Table,
            3 => FrameKind::Data,
            4 => FrameKind::Error,
            5 => FrameKind::Ack,
            6 => FrameKind::Lost,
            7 => FrameKind::Bye,
            8 => FrameKind::Moved,
            9 => FrameKind::Status,
            10 => FrameKind::StatusReply,
            _ => return None,
        })
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the payload is.
    pub kind: FrameKind,
    /// The message tag (Data frames; zero otherwise).
    pub tag: u64,
    /// The payload length in bytes, as declared by the sender (not yet checked against a bound).
    pub len: u64,
}

/// Encodes a frame header.
pub fn encode_frame_header(h: &FrameHeader) -> [u8; FRAME_HEADER_BYTES] {
    let mut w = Writer::new(FRAME_MAGIC, PROTOCOL_VERSION);
    w.u8(h.kind.code()).u64(h.tag).u64(h.len);
    let v = w.finish();
    let mut out = [0u8; FRAME_HEADER_BYTES];
    // The layout is fixed, so the lengths always agree; copy defensively anyway.
    let n = v.len().min(FRAME_HEADER_BYTES);
    out[..n].copy_from_slice(&v[..n]);
    out
}

/// Decodes a frame header from exactly [`FRAME_HEADER_BYTES`] bytes.
pub fn decode_frame_header(buf: &[u8]) -> Result<FrameHeader> {
    if buf.len() != FRAME_HEADER_BYTES {
        return Err(Error::malformed(
            "bootstrap frame header",
            format!("expected {FRAME_HEADER_BYTES} bytes, found {}", buf.len()),
        ));
    }
    let mut r = Reader::open(
        "bootstrap frame header",
        buf,
        FRAME_MAGIC,
        PROTOCOL_VERSION,
        PROTOCOL_VERSION,
    )?;
    let code = r.u8()?;
    let tag = r.u64()?;
    let len = r.u64()?;
    r.finish()?;
    let kind = FrameKind::from_code(code).ok_or_else(|| {
        Error::malformed(
            "bootstrap frame header",
            format!("unknown frame kind {code}"),
        )
    })?;
    Ok(FrameHeader { kind, tag, len })
}

/// Checks a declared payload length against a bound; returns it as `usize`.
pub fn check_payload_len(h: &FrameHeader, max: usize) -> Result<usize> {
    match usize::try_from(h.len) {
        Ok(n) if n <= max => Ok(n),
        _ => Err(Error::malformed(
            "bootstrap frame",
            format!(
                "{:?} frame declares a {} byte payload, the limit is {max}",
                h.kind, h.len
            ),
        )),
    }
}

/// How a connection ended in the middle of (or before) a frame: carried as the inner error of
/// an `UnexpectedEof` from [`read_frame`], so that callers can say how far the frame got
/// instead of `std`'s "failed to fill whole buffer".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncated {
    /// Bytes of the frame that arrived (0: the connection ended between frames).
    pub got: usize,
    /// Bytes the frame needs: the header's size until the header has arrived.
    pub want: usize,
    /// The frame's kind, once its header has arrived.
    pub kind: Option<FrameKind>,
}

impl std::fmt::Display for Truncated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.got, self.kind) {
            (0, _) => write!(f, "closed the connection"),
            (got, Some(k)) => write!(
                f,
                "closed the connection after {got} of {} bytes of a {k:?} frame",
                self.want
            ),
            (got, None) => write!(
                f,
                "closed the connection after {got} of the {} bytes of a frame header",
                self.want
            ),
        }
    }
}

impl std::error::Error for Truncated {}

/// `read_exact` that reports how much of the frame arrived when the connection ends.
fn read_part<R: Read + ?Sized>(
    r: &mut R,
    buf: &mut [u8],
    before: usize,
    want: usize,
    kind: Option<FrameKind>,
) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    Truncated {
                        got: before + got,
                        want,
                        kind,
                    },
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads one frame: the header, then (after checking its length against `max`) the payload.
/// A connection that ends early is an `UnexpectedEof` whose inner error is a [`Truncated`].
pub fn read_frame<R: Read + ?Sized>(
    r: &mut R,
    max: usize,
) -> std::io::Result<(FrameHeader, Vec<u8>)> {
    let mut hb = [0u8; FRAME_HEADER_BYTES];
    read_part(r, &mut hb, 0, FRAME_HEADER_BYTES, None)?;
    let h = decode_frame_header(&hb).map_err(to_io)?;
    let len = check_payload_len(&h, max).map_err(to_io)?;
    let mut payload = vec![0u8; len];
    read_part(
        r,
        &mut payload,
        FRAME_HEADER_BYTES,
        FRAME_HEADER_BYTES + len,
        Some(h.kind),
    )?;
    Ok((h, payload))
}

/// How a [`read_frame`] error reads after "the peer" (`"closed the connection after 12 of 40
/// bytes of a Data frame"`, `"closed the connection"`), or the error itself.
pub fn describe_read_error(e: &std::io::Error) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<Truncated>()) {
        Some(t) => t.to_string(),
        None => e.to_string(),
    }
}

/// Writes one frame (header and payload).
pub fn write_frame<W: Write + ?Sized>(
    w: &mut W,
    kind: FrameKind,
    tag: u64,
    payload: &[u8],
) -> std::io::Result<()> {
    let h = FrameHeader {
        kind,
        tag,
        len: payload.len() as u64,
    };
    // One buffer for small frames keeps header and payload in one segment.
    if payload.len() <= 4096 {
        let mut buf = Vec::with_capacity(FRAME_HEADER_BYTES + payload.len());
        buf.extend_from_slice(&encode_frame_header(&h));
        buf.extend_from_slice(payload);
        w.write_all(&buf)?;
    } else {
        w.write_all(&encode_frame_header(&h))?;
        w.write_all(payload)?;
    }
    w.flush()
}

/// Carries a decoding error through `std::io` so that [`read_frame`] has one error type; the
/// original is recovered by [`from_io`].
fn to_io(e: Error) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

/// Turns an I/O error from [`read_frame`]/[`write_frame`] back into a typed error: a wrapped
/// decoding error comes back as itself, anything else as `Error::Io` with `context`.
pub fn from_io(e: std::io::Error, context: impl Into<String>) -> Error {
    if e.kind() == std::io::ErrorKind::InvalidData
        && let Some(Error::Malformed { what, why }) =
            e.get_ref().and_then(|i| i.downcast_ref::<Error>())
    {
        return Error::Malformed {
            what,
            why: why.clone(),
        };
    }
    Error::io(context, e)
}

/// Appends a socket address: family (4 or 6), 16 address bytes, port.
pub(crate) fn put_addr(w: &mut Writer, a: &SocketAddr) {
    let mut ip = [0u8; 16];
    match a.ip() {
        IpAddr::V4(v4) => {
            ip[..4].copy_from_slice(&v4.octets());
            w.u8(4);
        }
        IpAddr::V6(v6) => {
            ip = v6.octets();
            w.u8(6);
        }
    }
    w.raw(&ip).u16(a.port());
}

/// Reads a socket address written by [`put_addr`].
pub(crate) fn get_addr(r: &mut Reader<'_>, what: &'static str) -> Result<SocketAddr> {
    let family = r.u8()?;
    let ip = r.array::<16>()?;
    let port = r.u16()?;
    let ip = match family {
        4 => {
            if ip[4..].iter().any(|&b| b != 0) {
                return Err(Error::malformed(what, "IPv4 address with non-zero padding"));
            }
            IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]))
        }
        6 => IpAddr::V6(Ipv6Addr::from(ip)),
        f => {
            return Err(Error::malformed(
                what,
                format!("address family {f}: expected 4 or 6"),
            ));
        }
    };
    Ok(SocketAddr::new(ip, port))
}

/// Which side a Hello is addressed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HelloRole {
    /// A rank registering with the root.
    Root,
    /// A rank opening a mesh connection to another rank.
    Peer,
}

/// The first message on every bootstrap connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Whom the Hello is for.
    pub role: HelloRole,
    /// The bootstrap's shared secret.
    pub secret: [u8; SECRET_BYTES],
    /// The sender's rank.
    pub rank: usize,
    /// The number of ranks the sender expects.
    pub nranks: usize,
    /// The sender's own listen address (meaningful in Root Hellos).
    pub listen: SocketAddr,
}

/// Encodes a Hello payload.
pub fn encode_hello(h: &Hello) -> Vec<u8> {
    let mut w = Writer::new(HELLO_MAGIC, PROTOCOL_VERSION);
    w.u8(match h.role {
        HelloRole::Root => 0,
        HelloRole::Peer => 1,
    });
    w.raw(&h.secret).u64(h.rank as u64).u64(h.nranks as u64);
    put_addr(&mut w, &h.listen);
    w.finish()
}

/// Upper bound on ranks a bootstrap accepts; keeps tables and per-rank state bounded.
pub const MAX_RANKS: usize = 1 << 20;

/// Decodes a Hello payload.
pub fn decode_hello(buf: &[u8]) -> Result<Hello> {
    const WHAT: &str = "bootstrap hello";
    let mut r = Reader::open(WHAT, buf, HELLO_MAGIC, PROTOCOL_VERSION, PROTOCOL_VERSION)?;
    let role = match r.u8()? {
        0 => HelloRole::Root,
        1 => HelloRole::Peer,
        x => return Err(Error::malformed(WHAT, format!("unknown role {x}"))),
    };
    let secret = r.array::<SECRET_BYTES>()?;
    let rank = r.usize_at_most("rank", MAX_RANKS)?;
    let nranks = r.usize_at_most("nranks", MAX_RANKS)?;
    let listen = get_addr(&mut r, WHAT)?;
    r.finish()?;
    Ok(Hello {
        role,
        secret,
        rank,
        nranks,
        listen,
    })
}

/// Encodes the root's table of listen addresses (index = rank).
pub(crate) fn encode_table(addrs: &[SocketAddr]) -> Vec<u8> {
    let mut w = Writer::new(TABLE_MAGIC, PROTOCOL_VERSION);
    w.u64(addrs.len() as u64);
    for a in addrs {
        put_addr(&mut w, a);
    }
    w.finish()
}

/// Decodes the root's table, which must have exactly `nranks` entries.
pub(crate) fn decode_table(buf: &[u8], nranks: usize) -> Result<Vec<SocketAddr>> {
    const WHAT: &str = "bootstrap address table";
    let mut r = Reader::open(WHAT, buf, TABLE_MAGIC, PROTOCOL_VERSION, PROTOCOL_VERSION)?;
    let n = r.usize_at_most("entry count", MAX_RANKS)?;
    if n != nranks {
        return Err(Error::malformed(
            WHAT,
            format!("{n} entries, expected {nranks}"),
        ));
    }
    let mut out = Vec::with_capacity(n.min(buf.len() / 19 + 1));
    for _ in 0..n {
        out.push(get_addr(&mut r, WHAT)?);
    }
    r.finish()?;
    Ok(out)
}

/// Why an Error frame was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The receiver's Hello was refused (wrong secret, rank, nranks, duplicate).
    Refused,
    /// The root gave up waiting for the missing ranks.
    Timeout,
    /// Both ranks dialled each other at once; the lower rank's connection is kept, and the
    /// refused dialler waits for it instead.
    Crossed,
    /// Anything else.
    Other,
}

pub(crate) fn encode_error(code: ErrorCode, msg: &str) -> Vec<u8> {
    let mut w = Writer::new(ERROR_MAGIC, PROTOCOL_VERSION);
    w.u8(match code {
        ErrorCode::Refused => 1,
        ErrorCode::Timeout => 2,
        ErrorCode::Other => 3,
        ErrorCode::Crossed => 4,
    });
    // Cut on a character boundary so the text stays UTF-8 and within the decoder's bound.
    let mut end = msg.len().min(ERROR_TEXT_MAX);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    w.str(&msg[..end]);
    w.finish()
}

pub(crate) fn decode_error(buf: &[u8]) -> Result<(ErrorCode, String)> {
    const WHAT: &str = "bootstrap error report";
    let mut r = Reader::open(WHAT, buf, ERROR_MAGIC, PROTOCOL_VERSION, PROTOCOL_VERSION)?;
    let code = match r.u8()? {
        1 => ErrorCode::Refused,
        2 => ErrorCode::Timeout,
        4 => ErrorCode::Crossed,
        _ => ErrorCode::Other,
    };
    let msg = r.str("message", ERROR_TEXT_MAX)?.to_owned();
    r.finish()?;
    Ok((code, msg))
}

/// Compares secrets in time independent of where they differ.
pub(crate) fn secrets_equal(a: &[u8; SECRET_BYTES], b: &[u8; SECRET_BYTES]) -> bool {
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Encodes a [`FrameKind::Lost`] payload: the rank whose loss failed the sender, and why.
pub(crate) fn encode_lost(rank: usize, msg: &str) -> Vec<u8> {
    let mut w = Writer::new(LOST_MAGIC, PROTOCOL_VERSION);
    w.u64(rank as u64);
    let mut end = msg.len().min(ERROR_TEXT_MAX);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    w.str(&msg[..end]);
    w.finish()
}

/// Decodes a [`FrameKind::Lost`] payload; the rank must be below `nranks`.
pub(crate) fn decode_lost(buf: &[u8], nranks: usize) -> Result<(usize, String)> {
    const WHAT: &str = "bootstrap failure report";
    let mut r = Reader::open(WHAT, buf, LOST_MAGIC, PROTOCOL_VERSION, PROTOCOL_VERSION)?;
    let rank = r.usize_at_most("rank", nranks.saturating_sub(1))?;
    let msg = r.str("message", ERROR_TEXT_MAX)?.to_owned();
    r.finish()?;
    Ok((rank, msg))
}

/// Bytes of the communicator id that prefixes every Data payload: the views made by
/// `Bootstrap::split`/`shrink` share their parent's connections, and the id keeps their
/// messages apart.
pub const COMM_ID_BYTES: usize = 8;

/// Splits a Data payload into its communicator id and the message.
pub(crate) fn decode_data(mut payload: Vec<u8>) -> Result<(u64, Vec<u8>)> {
    if payload.len() < COMM_ID_BYTES {
        return Err(Error::malformed(
            "bootstrap data frame",
            format!(
                "{} bytes: shorter than its {COMM_ID_BYTES} byte communicator id",
                payload.len()
            ),
        ));
    }
    let mut id = [0u8; COMM_ID_BYTES];
    id.copy_from_slice(&payload[..COMM_ID_BYTES]);
    payload.drain(..COMM_ID_BYTES);
    Ok((u64::from_le_bytes(id), payload))
}
