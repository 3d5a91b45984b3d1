//! A custom proxy (MSCCL++'s custom-proxy tutorial): triggers are posted into a FIFO with the
//! device-side push (the FIFO lives in host-mapped memory, so this program posts from a host
//! thread; a kernel would call `fifo.push` from `fifo.cuh`) and a user-written handler on the
//! host acts on each — here, signalling the peer through a connection, which the peer waits on.
//!
//! `cargo run --release -p mscclpp-perf --example custom_proxy`

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use mscclpp::comm::proxy::{Fifo, Proxy, ProxyHandlerResult};
use mscclpp::comm::semaphore::Host2HostSemaphore;
use mscclpp::hal::dev::{DEFAULT_WAIT, ProxyTrigger, TriggerType};
use mscclpp::transports::{EndpointConfig, Transport};

const N: u64 = 10_000;

fn main() -> mscclpp::Result<()> {
    let Some(comm) = common::two_ranks()? else {
        return Ok(());
    };
    let peer = 1 - comm.rank();
    // Ethernet: host-to-host semaphores keep their tokens in host-mapped memory, which CUDA IPC
    // cannot export; a TCP connection lands the peer's signals there through the HAL.
    let conn = comm.connect(peer, EndpointConfig::new(Transport::Ethernet))?;
    // The handler signals the peer through this semaphore; the peer waits on it.
    let sem = Arc::new(Host2HostSemaphore::new(&comm, conn)?);
    let fifo = Arc::new(Fifo::new(comm.device(), 64)?);
    let handled = Arc::new(AtomicU64::new(0));
    let (sem2, handled2) = (sem.clone(), handled.clone());
    let proxy = Proxy::start(fifo.clone(), move |trigger, _pos| {
        if trigger.kind() & TriggerType::FLAG != 0 {
            sem2.signal()?;
        }
        handled2.fetch_add(1, Ordering::Relaxed);
        Ok(ProxyHandlerResult::Continue)
    })?;
    let fh = fifo.device_handle();
    comm.bootstrap().barrier()?;
    let t = Instant::now();
    for i in 0..N {
        let trig = ProxyTrigger::new(TriggerType::FLAG, 0, 0, 0, 0, i, 0)?;
        // SAFETY: the FIFO lives (in `fifo`) until the end of main.
        unsafe { fh.push(trig, DEFAULT_WAIT)? };
        sem.wait(DEFAULT_WAIT)?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / N as f64;
    if comm.rank() == 0 {
        println!(
            "custom proxy: {N} triggers handled ({} here), {us:.2} us per trigger and peer signal",
            handled.load(Ordering::Relaxed)
        );
    }
    comm.bootstrap().barrier()?;
    proxy.stop()?;
    Ok(())
}
