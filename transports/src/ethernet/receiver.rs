//! The receiving half of an Ethernet connection: one thread that lands the peer's writes and
//! token updates in this rank's registered memory, in order, and answers its flushes.

use std::io::{ErrorKind, Read};
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Duration;

use mscclpp_hal::Stream;

use super::frame::{Frame, HEADER_LEN, MAX_ERROR};
use super::{Out, Pipe};
use crate::context::TransportContext;
use crate::link::{self, Health};
use crate::memory::check_range;

/// Everything the receiving thread owns.
pub(super) struct Receiver {
    pub ctx: Arc<TransportContext>,
    /// Lands data and tokens; one stream, so a token is ordered after the data before it.
    pub stream: Arc<dyn Stream>,
    pub sock: Box<dyn Pipe>,
    /// The connection's send queue, for acknowledgements and the error frame. Unbounded, so
    /// that this thread never waits for the sending side (which could wait for the peer's
    /// receiver, which could wait for ours: a deadlock).
    pub tx: Sender<Out>,
    pub health: Arc<Health>,
    pub peer: usize,
    pub io_timeout: Duration,
}

impl Receiver {
    /// Runs until the peer closes, fails, or sends something this rank refuses.
    pub(super) fn run(mut self) {
        let me = self.ctx.rank();
        let mut header = [0u8; HEADER_LEN];
        let mut data = Vec::new();
        loop {
            match read_header(&mut *self.sock, &mut header) {
                Ok(true) => {}
                Ok(false) => {
                    return self
                        .health
                        .mark_dead(link::describe_end(self.peer, me, None));
                }
                Err(e) => {
                    return self
                        .health
                        .mark_dead(link::describe_end(self.peer, me, Some(e)));
                }
            }
            let frame = match Frame::decode(&header) {
                Ok(f) => f,
                Err(e) => return self.fail(format!("rank {} sent a bad frame: {e}", self.peer)),
            };
            // Payloads were bounded by `decode` before this allocation.
            data.resize(frame.payload_len() as usize, 0);
            if let Err(e) = self.sock.read_exact(&mut data) {
                return self.health.mark_dead(format!(
                    "rank {} stopped in the middle of a frame to rank {me}: {e}",
                    self.peer
                ));
            }
            let landed = match frame {
                Frame::Write { mem, offset, len } => self.land(mem, offset, len, &data),
                Frame::Update { mem, offset, value } => self.token(mem, offset, value),
                Frame::FlushReq { seq } => self.answer_flush(seq),
                Frame::FlushAck { seq } => {
                    self.health.update(|s| s.acked = s.acked.max(seq));
                    Ok(())
                }
                Frame::Error { .. } => {
                    let why = String::from_utf8_lossy(&data);
                    self.health.mark_dead(format!(
                        "rank {} failed its connection to rank {me}: {why}",
                        self.peer
                    ));
                    self.sock.shutdown();
                    return;
                }
            };
            if let Err(why) = landed {
                return self.fail(why);
            }
        }
    }

    fn land(&self, mem: u64, offset: u64, len: u64, data: &[u8]) -> Result<(), String> {
        let slice = self.memory(mem)?;
        check_range(
            &format!("Ethernet write into memory {mem}"),
            offset,
            len,
            slice.len() as u64,
        )
        .map_err(|e| format!("rank {}'s {e}", self.peer))?;
        // Range checked just above against the slice's own length.
        let dst = slice
            .slice(offset as usize..(offset + len) as usize)
            .map_err(|e| e.to_string())?;
        self.stream
            .write_from_host(&dst, data)
            .map_err(|e| format!("landing {len} bytes at offset {offset} of memory {mem}: {e}"))
    }

    fn token(&self, mem: u64, offset: u64, value: u64) -> Result<(), String> {
        let slice = self.memory(mem)?;
        if offset % 8 != 0 {
            return Err(format!(
                "rank {}'s token update at offset {offset} of memory {mem} is not 8-byte aligned",
                self.peer
            ));
        }
        check_range(
            &format!("token update of memory {mem}"),
            offset,
            8,
            slice.len() as u64,
        )
        .map_err(|e| format!("rank {}'s {e}", self.peer))?;
        let dst = slice
            .slice(offset as usize..offset as usize + 8)
            .map_err(|e| e.to_string())?;
        self.stream
            .write_value64(&dst, value)
            .map_err(|e| format!("storing a token at offset {offset} of memory {mem}: {e}"))
    }

    fn answer_flush(&self, seq: u64) -> Result<(), String> {
        self.stream
            .synchronize_timeout(self.io_timeout)
            .map_err(|e| format!("completing the writes before flush {seq}: {e}"))?;
        // The sending side may be gone already (the connection is being dropped): then there is
        // nobody to acknowledge to, and the read loop ends at the socket's shutdown.
        let _ = self.tx.send(Out::control(Frame::FlushAck { seq }));
        Ok(())
    }

    fn memory(&self, mem: u64) -> Result<mscclpp_hal::BufferSlice, String> {
        self.ctx.ethernet_memory(mem).ok_or_else(|| {
            format!(
                "rank {} wrote into memory id {mem}, which rank {} has not registered for Ethernet (or has deregistered)",
                self.peer,
                self.ctx.rank()
            )
        })
    }

    /// Fails the connection: this side's operations return `why` from now on, and the peer is
    /// told before the socket closes.
    fn fail(&self, why: String) {
        self.health.mark_dead(why.clone());
        let msg = link::truncate(&why, MAX_ERROR).as_bytes().to_vec();
        let mut bytes = Frame::Error {
            len: msg.len() as u64,
        }
        .header()
        .to_vec();
        bytes.extend_from_slice(&msg);
        if self
            .tx
            .send(Out {
                bytes,
                counted: 0,
                last: true,
            })
            .is_err()
        {
            self.sock.shutdown();
        }
    }
}

/// Reads one header; `Ok(false)` when the peer closed cleanly between frames.
fn read_header(sock: &mut dyn Pipe, h: &mut [u8; HEADER_LEN]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < HEADER_LEN {
        match sock.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
