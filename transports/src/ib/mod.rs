//! IB0..IB7: RDMA over InfiniBand or RoCE through libibverbs, opened at run time.
//!
//! - [`ffi`]: the hand-written verbs FFI (and why it is not the `ibverbs` crate);
//!   [`verbs`]: the table of calls the layers below use, real or (in tests) fake.
//! - [`device`]: IBn → HCA (`MSCCLPP_HCA_DEVICES`), port state and GID.
//! - [`qp`]: RC queue pairs; the QP's address travels inside the [`crate::Endpoint`] through
//!   the bootstrap, and [`crate::connect`] takes both QPs INIT→RTR→RTS.
//! - [`memory`]: registration of host memory and of device memory (peer memory).
//! - [`cq`]: completion polling; a failed completion is an error naming the peer rank.
//!
//! A connection posts every request signaled on one RC QP: `write` is an RDMA write,
//! `update_and_sync` an atomic fetch-and-add of the difference to the last value this connection
//! sent to that address (as MSCCL++ does: the peer's token ends at `new_value` when it started
//! at 0 and this connection is its only writer, which is how semaphores are used), or in
//! no-atomic mode an 8-byte RDMA write with immediate data of `new_value` (the peer keeps
//! receives posted; the immediate carries the low 32 bits for its receive thread). `flush` polls the send CQ, from the
//! proxy thread that calls it, until every request has completed.

pub(crate) mod cq;
pub(crate) mod device;
pub(crate) mod error;
pub(crate) mod ffi;
pub(crate) mod memory;
pub(crate) mod qp;
pub(crate) mod verbs;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_hal::{Error, Result};

use crate::link::{self, Health};
use crate::memory::RegisteredMemory;
use crate::offer::{Endpoint, LocalEndpoint};
use crate::ops::{Connection, check_dst, check_token, check_write};
use crate::transport::Transport;
use qp::Qp;
use verbs::{Completion, SendOp, SendRequest};

pub use qp::QpInfo;

/// Largest single RDMA write; longer writes are split (the IB limit is 2 GiB).
const MAX_WRITE: u64 = 1 << 30;

/// Per-connection state behind one lock: the proxy is the only caller in practice, so it is
/// never contended.
struct State {
    posted: u64,
    completed: u64,
    dead: Option<Error>,
    /// The value last sent per token address: atomic mode adds the difference.
    tokens: HashMap<u64, u64>,
    wcs: Vec<Completion>,
}

/// An IB connection (see the module documentation).
pub struct IbConnection {
    local_rank: usize,
    remote_rank: usize,
    index: u8,
    qp: Arc<Qp>,
    atomics: bool,
    max_send_wr: u32,
    poll_num: usize,
    io_timeout: Duration,
    // Deregistered before the buffer it covers is freed (fields drop in order).
    scratch_mr: memory::IbMr,
    /// 8-byte slots for atomic results and immediate values, one per send request in flight.
    scratch: Box<[u64]>,
    state: Mutex<State>,
    stop: Arc<AtomicBool>,
    receiver: Option<JoinHandle<()>>,
    /// The TCP link of the handshake, kept open: its end is how a dead peer is noticed at once
    /// rather than after the QP's retries run out.
    health: Arc<Health>,
    /// Marks `health` dead when the link ends; taken in drop (shuts the link).
    watcher: Option<link::Watcher>,
}

impl fmt::Debug for IbConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IbConnection")
            .field("local_rank", &self.local_rank)
            .field("remote_rank", &self.remote_rank)
            .field("qp", &*self.qp)
            .field("atomics", &self.atomics)
            .finish()
    }
}

/// Creates this rank's QP for an IB endpoint.
pub(crate) fn prepare(
    local: &crate::context::TransportContext,
    cfg: &crate::EndpointConfig,
    n: u8,
) -> Result<Qp> {
    let dev = local.ib_device(n)?;
    let psn = u32::from_le_bytes([local.rank() as u8, n, 0x5a, 0]);
    Qp::create(
        &dev,
        cfg.ib_gid_index,
        cfg.ib_max_cq_size.max(cfg.ib_max_send_wr),
        cfg.ib_max_send_wr.max(1),
        if cfg.ib_no_atomic {
            cfg.ib_max_recv_wr.max(1)
        } else {
            0
        },
        !cfg.ib_no_atomic,
        psn,
    )
}

impl IbConnection {
    /// The number of this side's QP.
    pub fn qpn(&self) -> u32 {
        self.qp.info.qpn
    }

    pub(crate) fn connect(mut local: LocalEndpoint, remote: &Endpoint) -> Result<Self> {
        let Transport::Ib(n) = remote.transport else {
            return Err(Error::Internal("IB connect for a non-IB endpoint".into()));
        };
        let (me, peer) = (local.endpoint.rank, remote.rank);
        let Some(qp) = local.ib.take() else {
            return Err(Error::Internal(format!(
                "IB{n} endpoint of rank {me} has no QP"
            )));
        };
        let Some(rinfo) = remote.ib else {
            return Err(Error::malformed(
                "endpoint",
                format!("rank {peer}'s IB{n} endpoint carries no QP address"),
            ));
        };
        qp.connect(&rinfo, peer)?;
        let cfg = local.cfg.clone();
        let atomics = qp.info.atomics;
        let qp = Arc::new(qp);
        let slots = cfg.ib_max_send_wr.max(1) as usize;
        let scratch = vec![0u64; slots].into_boxed_slice();
        let scratch_mr = {
            let v = &qp.dev.verbs;
            let keys = v.reg_mr(
                qp.dev.pd,
                scratch.as_ptr() as u64,
                slots * 8,
                ffi::IBV_ACCESS_LOCAL_WRITE,
            )?;
            memory::IbMr {
                dev: qp.dev.clone(),
                keys,
                addr: scratch.as_ptr() as u64,
                len: slots * 8,
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let receiver = if atomics {
            None
        } else {
            for i in 0..cfg.ib_max_recv_wr.max(1) {
                qp.dev.verbs.post_recv(qp.qp, u64::from(i))?;
            }
            let (q, s) = (qp.clone(), stop.clone());
            Some(
                std::thread::Builder::new()
                    .name(format!("mscclpp-ib-recv-{me}-{peer}"))
                    .spawn(move || receive_loop(&q, peer, &s))
                    .map_err(|e| Error::io("spawning the IB receive thread", e))?,
            )
        };
        // Both QPs are in RTS before either side returns: the link's handshake needs both.
        let stop_receiver = |receiver: Option<JoinHandle<()>>| {
            stop.store(true, Ordering::Relaxed);
            if let Some(r) = receiver {
                let _ = r.join();
            }
        };
        let sock = match link::establish(&local, remote) {
            Ok(s) => s,
            Err(e) => {
                stop_receiver(receiver);
                return Err(e);
            }
        };
        let health = Arc::new(Health::new(peer));
        let watcher = match link::Watcher::start(sock, Transport::Ib(n), (me, peer), health.clone())
        {
            Ok(w) => w,
            Err(e) => {
                stop_receiver(receiver);
                return Err(e);
            }
        };
        Ok(IbConnection {
            local_rank: me,
            remote_rank: peer,
            index: n,
            qp,
            atomics,
            max_send_wr: slots as u32,
            poll_num: cfg.ib_max_cq_poll_num.max(1) as usize,
            io_timeout: cfg.io_timeout,
            scratch_mr,
            scratch,
            state: Mutex::new(State {
                posted: 0,
                completed: 0,
                dead: None,
                tokens: HashMap::new(),
                wcs: Vec::new(),
            }),
            stop,
            receiver,
            health,
            watcher: Some(watcher),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Polls once; a failure marks the connection dead.
    fn poll(&self, s: &mut State) -> Result<()> {
        let mut wcs = std::mem::take(&mut s.wcs);
        let r = cq::poll_send(&self.qp, self.remote_rank, self.poll_num, &mut wcs);
        s.wcs = wcs;
        match r {
            Ok(n) => {
                s.completed += n;
                Ok(())
            }
            Err(e) => {
                s.dead = Some(clone_err(&e));
                Err(e)
            }
        }
    }

    fn check(&self, s: &State) -> Result<()> {
        match &s.dead {
            Some(e) => Err(clone_err(e)),
            None => self.health.check(),
        }
    }

    /// Posts `wr` (its id set here) once the send queue has room.
    fn post(&self, s: &mut State, mut wr: SendRequest) -> Result<()> {
        self.room(s)?;
        wr.wr_id = s.posted;
        self.post_now(s, wr)
    }

    /// Polls until fewer than `max_send_wr` requests are in flight.
    fn room(&self, s: &mut State) -> Result<()> {
        let deadline = Instant::now() + self.io_timeout;
        while s.posted - s.completed >= u64::from(self.max_send_wr) {
            self.poll(s)?;
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    waiting_for: format!(
                        "room in the IB{} send queue to rank {} ({} requests outstanding)",
                        self.index,
                        self.remote_rank,
                        s.posted - s.completed
                    ),
                    after: self.io_timeout,
                });
            }
        }
        Ok(())
    }

    fn post_now(&self, s: &mut State, wr: SendRequest) -> Result<()> {
        self.qp
            .dev
            .verbs
            .post_send(self.qp.qp, &wr)
            .map_err(|e| Error::Remote {
                rank: self.remote_rank,
                message: format!("posting to IB{} QP {}: {e}", self.index, self.qp.info.qpn),
            })?;
        s.posted += 1;
        Ok(())
    }

    /// The scratch slot the next request may use (free: at most `max_send_wr` are in flight).
    fn slot(&self, s: &State) -> (usize, u64) {
        let i = (s.posted % u64::from(self.max_send_wr)) as usize;
        (i, self.scratch_mr.addr + 8 * i as u64)
    }

    fn remote_region(&self, dst: &RegisteredMemory) -> Result<(u64, u32)> {
        check_dst(self.remote_rank, dst)?;
        dst.ib_remote(self.index).ok_or_else(|| {
            Error::invalid(format!(
                "destination memory of rank {} was registered for {}, not IB{}",
                dst.rank(),
                dst.transports(),
                self.index
            ))
        })
    }
}

/// Errors are not `Clone`; a dead connection repeats its cause as a `Remote` error.
fn clone_err(e: &Error) -> Error {
    match e {
        Error::Remote { rank, message } => Error::Remote {
            rank: *rank,
            message: message.clone(),
        },
        other => Error::Internal(other.to_string()),
    }
}

/// Keeps receives posted for writes with immediate data (no-atomic mode) until told to stop.
fn receive_loop(qp: &Qp, peer: usize, stop: &AtomicBool) {
    let mut wcs = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        wcs.clear();
        match qp.dev.verbs.poll_cq(qp.recv_cq, 16, &mut wcs) {
            Ok(0) => std::thread::sleep(Duration::from_micros(50)),
            Ok(_) => {
                for c in &wcs {
                    if c.status != 0 {
                        tracing::warn!("{}", cq::completion_error(qp, peer, c));
                        return;
                    }
                    if let Err(e) = qp.dev.verbs.post_recv(qp.qp, c.wr_id) {
                        tracing::warn!("reposting an IB receive for rank {peer}: {e}");
                        return;
                    }
                }
            }
            Err(e) => {
                tracing::warn!("polling the IB receive queue for rank {peer}: {e}");
                return;
            }
        }
    }
}

impl Connection for IbConnection {
    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        len: u64,
    ) -> Result<()> {
        let (raddr, rkey) = self.remote_region(dst)?;
        check_write(
            self.local_rank,
            self.remote_rank,
            dst,
            dst_off,
            src,
            src_off,
            len,
        )?;
        let Some((laddr, lkey)) = src.ib_local(self.index) else {
            return Err(Error::invalid(format!(
                "write source of rank {} was registered for {}, not IB{}",
                self.local_rank,
                src.transports(),
                self.index
            )));
        };
        let mut s = self.lock();
        self.check(&s)?;
        let mut off = 0;
        while off < len {
            let n = (len - off).min(MAX_WRITE);
            self.post(
                &mut s,
                SendRequest {
                    wr_id: 0,
                    op: SendOp::Write,
                    local_addr: laddr + src_off + off,
                    len: n as u32,
                    lkey,
                    remote_addr: raddr + dst_off + off,
                    rkey,
                },
            )?;
            off += n;
        }
        Ok(())
    }

    fn update_and_sync(&self, dst: &RegisteredMemory, dst_off: u64, new_value: u64) -> Result<()> {
        let (raddr, rkey) = self.remote_region(dst)?;
        check_token(dst, dst_off)?;
        let target = raddr + dst_off;
        let mut s = self.lock();
        self.check(&s)?;
        // Room first: the slot of the next request is free only once it is in the queue's window.
        self.room(&mut s)?;
        let (i, laddr) = self.slot(&s);
        let op = if self.atomics {
            let old = s.tokens.get(&target).copied().unwrap_or(0);
            SendOp::FetchAdd(new_value.wrapping_sub(old))
        } else {
            // SAFETY: slot `i` is not in use by any request in flight (see `slot`), and the
            // HCA reads it only after the post below.
            unsafe {
                self.scratch
                    .as_ptr()
                    .add(i)
                    .cast_mut()
                    .write_volatile(new_value)
            };
            SendOp::WriteImm(new_value as u32)
        };
        self.post(
            &mut s,
            SendRequest {
                wr_id: 0,
                op,
                local_addr: laddr,
                len: 8,
                lkey: self.scratch_mr.keys.lkey,
                remote_addr: target,
                rkey,
            },
        )?;
        s.tokens.insert(target, new_value);
        Ok(())
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        let mut s = self.lock();
        self.check(&s)?;
        while s.completed < s.posted {
            self.poll(&mut s)?;
            self.health.check()?;
            if s.completed < s.posted && started.elapsed() > timeout {
                return Err(Error::Timeout {
                    waiting_for: format!(
                        "{} IB{} requests to rank {} to complete",
                        s.posted - s.completed,
                        self.index,
                        self.remote_rank
                    ),
                    after: timeout,
                });
            }
        }
        Ok(())
    }

    fn transport(&self) -> Transport {
        Transport::Ib(self.index)
    }

    fn local_rank(&self) -> usize {
        self.local_rank
    }

    fn remote_rank(&self) -> usize {
        self.remote_rank
    }
}

impl Drop for IbConnection {
    fn drop(&mut self) {
        // Requests in flight read the scratch buffer and the sources: wait for them (bounded)
        // before the QP and the buffer go.
        if let Err(e) = self.flush(Duration::from_secs(2)) {
            tracing::debug!(
                peer = self.remote_rank,
                "IB connection dropped unflushed: {e}"
            );
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(r) = self.receiver.take() {
            let _ = r.join();
        }
        // Shuts the link (which tells the peer this side is gone) and joins its watcher.
        drop(self.watcher.take());
    }
}
