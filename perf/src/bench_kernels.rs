//! The benchmark and example kernels: a memory-channel put and a port-channel put (bandwidth,
//! `mscclpp-perf`'s channel benchmarks and the `bidir_*` examples) and a signal/wait ping-pong
//! (the `gpu_ping_pong` example). Their device source is `kernels/bench/bench_kernels.cu`, their
//! argument structs are mirrored in `kernels/bench/args.cuh` (checked by the generated
//! `kernels/bench/args_check.h`), and the host backend runs the Rust functions below.
//!
//! Load one with [`mscclpp::hal::DynKernel::load`]`(device, &MODULE, MEMORY_CHANNEL_PUT)`.

use mscclpp::hal::dev::{
    BaseMemoryChannelDeviceHandle, DEFAULT_WAIT, MemoryChannelDeviceHandle,
    PortChannelDeviceHandle, for_each_block,
};
use mscclpp::hal::{Error, KernelArgs, KernelDef, KernelId, KernelModule, LaunchConfig, Result};

/// Bandwidth benchmark: `iters` times, every block puts its share of `bytes` through a memory
/// channel, then one thread signals the peer and waits for the peer's signal (args:
/// [`MemoryChannelPutArgs`]).
pub const MEMORY_CHANNEL_PUT: KernelId = KernelId("mscclpp_bench_memory_channel_put");
/// Bandwidth benchmark: `iters` times, `put_with_signal` of `bytes` through a port channel, then
/// wait for the peer's signal (args: [`PortChannelPutArgs`]).
pub const PORT_CHANNEL_PUT: KernelId = KernelId("mscclpp_bench_port_channel_put");
/// Example: `rounds` signal/wait round trips between two ranks over a base memory channel, the
/// initiator signalling first (args: [`PingPongArgs`]).
pub const PING_PONG: KernelId = KernelId("mscclpp_example_ping_pong");

/// Arguments of [`MEMORY_CHANNEL_PUT`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryChannelPutArgs {
    /// The channel (its `src` is sent to its `dst`).
    pub chan: MemoryChannelDeviceHandle,
    /// Bytes per put.
    pub bytes: u64,
    /// Number of put/signal/wait rounds.
    pub iters: u64,
}

// SAFETY: repr(C) of integer-only structs, no implicit padding; every bit pattern is valid.
unsafe impl KernelArgs for MemoryChannelPutArgs {}

/// Arguments of [`PORT_CHANNEL_PUT`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortChannelPutArgs {
    /// The channel.
    pub chan: PortChannelDeviceHandle,
    /// Bytes per put.
    pub bytes: u64,
    /// Number of put-with-signal/wait rounds.
    pub iters: u64,
}

// SAFETY: as above.
unsafe impl KernelArgs for PortChannelPutArgs {}

/// Arguments of [`PING_PONG`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingPongArgs {
    /// The channel.
    pub chan: BaseMemoryChannelDeviceHandle,
    /// Number of round trips.
    pub rounds: u64,
    /// Nonzero on the rank that signals first.
    pub initiator: u32,
    /// Nonzero to use the relaxed signal/wait.
    pub relaxed: u32,
}

// SAFETY: as above.
unsafe impl KernelArgs for PingPongArgs {}

/// The benchmark kernels' module.
pub static MODULE: KernelModule = KernelModule {
    name: "bench/bench_kernels.cu",
    source: include_str!("../../kernels/bench/bench_kernels.cu"),
    headers: &[
        (
            "bench/args.cuh",
            include_str!("../../kernels/bench/args.cuh"),
        ),
        (
            "bench/args_check.h",
            include_str!("../../kernels/bench/args_check.h"),
        ),
    ],
    kernels: &[
        KernelDef::new::<MemoryChannelPutArgs>(MEMORY_CHANNEL_PUT.0, memory_channel_put),
        KernelDef::new::<PortChannelPutArgs>(PORT_CHANNEL_PUT.0, port_channel_put),
        KernelDef::new::<PingPongArgs>(PING_PONG.0, ping_pong),
    ],
};

fn memory_channel_put(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = MemoryChannelPutArgs::from_bytes(args)?;
    let blocks = cfg.num_blocks() as usize;
    let bytes = usize::try_from(a.bytes)
        .map_err(|_| Error::invalid(format!("{} bytes do not fit this host", a.bytes)))?;
    for _ in 0..a.iters {
        for_each_block(cfg, |b| {
            // SAFETY: the launcher vouches that the channel's memories hold `bytes` (launch
            // contract); each block copies its own share.
            unsafe { a.chan.put(0, 0, bytes, b as usize, blocks) };
            Ok(())
        })?;
        // SAFETY: the channel's semaphore tokens are live (launch contract).
        unsafe {
            a.chan.signal();
            a.chan.wait(DEFAULT_WAIT)?;
        }
    }
    Ok(())
}

fn port_channel_put(_cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = PortChannelPutArgs::from_bytes(args)?;
    for _ in 0..a.iters {
        // SAFETY: the channel's FIFO and semaphore are live (launch contract).
        unsafe {
            a.chan.put_with_signal(0, 0, a.bytes, DEFAULT_WAIT)?;
            a.chan.wait(DEFAULT_WAIT)?;
        }
    }
    Ok(())
}

fn ping_pong(_cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = PingPongArgs::from_bytes(args)?;
    let (c, relaxed) = (a.chan, a.relaxed != 0);
    for _ in 0..a.rounds {
        // SAFETY: the channel's semaphore tokens are live (launch contract).
        unsafe {
            if a.initiator != 0 {
                if relaxed {
                    c.relaxed_signal()
                } else {
                    c.signal()
                }
            }
            if relaxed {
                c.relaxed_wait(DEFAULT_WAIT)?
            } else {
                c.wait(DEFAULT_WAIT)?
            }
            if a.initiator == 0 {
                if relaxed {
                    c.relaxed_signal()
                } else {
                    c.signal()
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use mscclpp::hal::dev::layout::{check_header, header};
    use mscclpp::hal::layout_entry;

    use super::*;

    #[test]
    fn committed_args_check_header_matches_the_rust_layouts() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/bench/args_check.h");
        let expected = header(
            "perf/src/bench_kernels.rs (regenerate with MSCCLPP_BLESS_LAYOUT=1 cargo test -p \
             mscclpp-perf --lib bench_kernels)",
            &[
                layout_entry!(MemoryChannelPutArgs { chan, bytes, iters }),
                layout_entry!(PortChannelPutArgs { chan, bytes, iters }),
                layout_entry!(PingPongArgs {
                    chan,
                    rounds,
                    initiator,
                    relaxed
                }),
            ],
        );
        if let Err(e) = check_header(&path, &expected) {
            panic!("{e}");
        }
    }
}
