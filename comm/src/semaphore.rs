//! Semaphores between two ranks: monotonically increasing 64-bit tokens in device memory,
//! never reset (so kernels using them can be replayed, e.g. in CUDA graphs).
//!
//! | type | signalled by | waited on by | path of the signal |
//! | --- | --- | --- | --- |
//! | [`MemoryDevice2DeviceSemaphore`] | device | device | a store into the peer's token, mapped here (CudaIpc only) |
//! | [`Host2DeviceSemaphore`] | host (the proxy) | device | the connection's `update_and_sync` |
//! | [`Host2HostSemaphore`] | host | host | the connection's `update_and_sync` |
//!
//! Each is built by both ranks together (a set-up step of the [`Communicator`]): each side
//! allocates and registers its inbound token and receives the peer's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mscclpp_hal::dev::{
    Host2DeviceSemaphoreDeviceHandle, MemoryDevice2DeviceSemaphoreDeviceHandle,
};
use mscclpp_hal::{DeviceBuffer, Error, MemoryKind, Result};
use mscclpp_transports::{AnyConnection, Connection, RegisteredMemory, Transport, TransportFlags};

use crate::communicator::Communicator;

/// Offsets of the three words of a token block.
const INBOUND: usize = 0;
const OUTBOUND: usize = 8;
const EXPECTED: usize = 16;
const TOKEN_BLOCK: usize = 24;

/// A token block: the local words, the registration of the inbound word (which must live as long
/// as the semaphore: an Ethernet receiver lands the peer's signals only in registered memory) and
/// the peer's inbound word.
#[derive(Debug)]
struct Tokens {
    buf: DeviceBuffer,
    _local: RegisteredMemory,
    remote: RegisteredMemory,
}

/// Allocates a zeroed token block and exchanges its inbound word with the connection's peer.
fn token_block(comm: &Communicator, conn: &AnyConnection, kind: MemoryKind) -> Result<Tokens> {
    let device = comm.device();
    let tokens = device.alloc(TOKEN_BLOCK, kind)?;
    let stream = device.create_stream()?;
    stream.fill(&tokens.full(), 0)?;
    stream.synchronize()?;
    let local = comm.register_memory(
        &tokens.slice(INBOUND..INBOUND + 8)?,
        TransportFlags::single(conn.transport()),
    )?;
    let remote = comm.exchange_memory(&local, conn.remote_rank())?;
    if remote.len() != 8 {
        return Err(Error::Remote {
            rank: conn.remote_rank(),
            message: format!(
                "sent a semaphore token of {} bytes instead of 8",
                remote.len()
            ),
        });
    }
    Ok(Tokens {
        buf: tokens,
        _local: local,
        remote,
    })
}

/// A semaphore signalled and waited on by devices that map each other's memory.
#[derive(Debug)]
pub struct MemoryDevice2DeviceSemaphore {
    _tokens: Tokens,
    handle: MemoryDevice2DeviceSemaphoreDeviceHandle,
    peer: usize,
}

impl MemoryDevice2DeviceSemaphore {
    /// Builds the semaphore with the peer of `conn`, which must be a CudaIpc connection.
    pub fn new(comm: &Communicator, conn: &AnyConnection) -> Result<Self> {
        if conn.transport() != Transport::CudaIpc {
            return Err(Error::invalid(format!(
                "a memory device-to-device semaphore between ranks {} and {} needs a CudaIpc connection, not {}",
                comm.rank(),
                conn.remote_rank(),
                conn.transport()
            )));
        }
        let tokens = token_block(comm, conn, MemoryKind::Uncached)?;
        let remote_inbound = tokens
            .remote
            .mapped_slice()
            .ok_or_else(|| Error::Internal("CudaIpc memory arrived unmapped".into()))?
            .ptr()
            .0;
        let base = tokens.buf.ptr().0;
        Ok(MemoryDevice2DeviceSemaphore {
            handle: MemoryDevice2DeviceSemaphoreDeviceHandle {
                inbound_token: base + INBOUND as u64,
                outbound_token: base + OUTBOUND as u64,
                remote_inbound_token: remote_inbound,
                expected_inbound_token: base + EXPECTED as u64,
            },
            _tokens: tokens,
            peer: conn.remote_rank(),
        })
    }

    /// What device code uses; valid while `self` lives.
    pub fn device_handle(&self) -> MemoryDevice2DeviceSemaphoreDeviceHandle {
        self.handle
    }

    /// The peer's rank.
    pub fn peer(&self) -> usize {
        self.peer
    }
}

/// A semaphore the host signals through a connection and a device waits on.
#[derive(Debug)]
pub struct Host2DeviceSemaphore {
    tokens: Tokens,
    conn: Arc<AnyConnection>,
    outbound: AtomicU64,
}

impl Host2DeviceSemaphore {
    /// Builds the semaphore with the peer of `conn` (any transport).
    pub fn new(comm: &Communicator, conn: Arc<AnyConnection>) -> Result<Self> {
        let tokens = token_block(comm, &conn, MemoryKind::Uncached)?;
        Ok(Host2DeviceSemaphore {
            tokens,
            conn,
            outbound: AtomicU64::new(0),
        })
    }

    /// Signals the peer's device: its token is advanced after every earlier write on the
    /// connection has landed.
    pub fn signal(&self) -> Result<()> {
        let v = self.outbound.fetch_add(1, Ordering::Relaxed) + 1;
        self.conn.update_and_sync(&self.tokens.remote, 0, v)
    }

    /// The connection the signals travel on.
    pub fn connection(&self) -> &Arc<AnyConnection> {
        &self.conn
    }

    /// What device code uses to wait; valid while `self` lives.
    pub fn device_handle(&self) -> Host2DeviceSemaphoreDeviceHandle {
        let base = self.tokens.buf.ptr().0;
        Host2DeviceSemaphoreDeviceHandle {
            inbound_token: base + INBOUND as u64,
            expected_inbound_token: base + EXPECTED as u64,
        }
    }
}

/// A semaphore signalled and waited on by hosts.
#[derive(Debug)]
pub struct Host2HostSemaphore {
    tokens: Tokens,
    conn: Arc<AnyConnection>,
    outbound: AtomicU64,
    expected: AtomicU64,
}

impl Host2HostSemaphore {
    /// Builds the semaphore with the peer of `conn` (any transport); the tokens live in
    /// host-mapped memory so the host can poll them.
    pub fn new(comm: &Communicator, conn: Arc<AnyConnection>) -> Result<Self> {
        let tokens = token_block(comm, &conn, MemoryKind::HostMapped)?;
        if tokens.buf.host_ptr().is_none() {
            return Err(Error::unavailable(
                "host-to-host semaphore",
                format!(
                    "{} host-mapped memory has no host pointer",
                    tokens.buf.backend()
                ),
            ));
        }
        Ok(Host2HostSemaphore {
            tokens,
            conn,
            outbound: AtomicU64::new(0),
            expected: AtomicU64::new(0),
        })
    }

    fn inbound(&self) -> &AtomicU64 {
        let p = self.tokens.buf.host_ptr().unwrap_or(std::ptr::null_mut());
        // SAFETY: `new` checked the host pointer exists; the block is 24 bytes, 8-aligned, alive
        // as long as `self`, and its inbound word is only written atomically (by the peer's
        // `update_and_sync`).
        unsafe { AtomicU64::from_ptr(p.add(INBOUND).cast::<u64>()) }
    }

    /// Signals the peer (after every earlier write on the connection).
    pub fn signal(&self) -> Result<()> {
        let v = self.outbound.fetch_add(1, Ordering::Relaxed) + 1;
        self.conn.update_and_sync(&self.tokens.remote, 0, v)
    }

    /// Consumes a signal if one has arrived.
    pub fn poll(&self) -> bool {
        let next = self.expected.load(Ordering::Relaxed) + 1;
        if self.inbound().load(Ordering::Acquire) >= next {
            self.expected.store(next, Ordering::Relaxed);
            true
        } else {
            false
        }
    }

    /// Waits for the next signal, at most `timeout`.
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        let next = self.expected.fetch_add(1, Ordering::Relaxed) + 1;
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        while self.inbound().load(Ordering::Acquire) < next {
            spins = spins.wrapping_add(1);
            if spins % 256 == 0 {
                if start.elapsed() >= timeout {
                    return Err(Error::Timeout {
                        waiting_for: format!(
                            "signal {next} from rank {} (have {})",
                            self.conn.remote_rank(),
                            self.inbound().load(Ordering::Relaxed)
                        ),
                        after: timeout,
                    });
                }
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
        Ok(())
    }
}
