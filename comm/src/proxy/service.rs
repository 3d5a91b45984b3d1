//! The proxy service: port channels over connections.
//!
//! Device code posts triggers into the service's FIFO; the proxy thread carries each one out on
//! the connection of the trigger's semaphore: `DATA` writes from the source memory to the
//! destination memory, `FLAG` then signals the peer's semaphore (ordered after the data by the
//! connection), `SYNC` flushes the connection before the FIFO's tail moves past the trigger, so
//! the device's `flush` returns only once the data has landed.
//!
//! Semaphores and memories are added before [`ProxyService::start`]; the running proxy owns
//! their tables, so the hot loop takes no lock. An observer ([`ProxyService::observe`], once,
//! before or after the start) is told of each trigger; without one the hot path pays one load.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use mscclpp_hal::dev::{PortChannelDeviceHandle, ProxyTrigger, TriggerType};
use mscclpp_hal::{Device, Error, Result};
use mscclpp_transports::{Connection, RegisteredMemory};

use super::{Fifo, Proxy, ProxyHandlerResult, ProxyObserver};
use crate::semaphore::Host2DeviceSemaphore;

/// Index of a semaphore (and its connection) in a proxy service.
pub type SemaphoreId = u32;
/// Index of a registered memory in a proxy service.
pub type MemoryId = u32;

/// How long the proxy lets a `SYNC` trigger's flush take.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// A proxy service and the port channels built on it.
#[derive(Debug)]
pub struct ProxyService {
    fifo: Arc<Fifo>,
    semaphores: Vec<Arc<Host2DeviceSemaphore>>,
    memories: Vec<Arc<RegisteredMemory>>,
    proxy: Option<Proxy>,
    observer: Arc<OnceLock<Arc<dyn ProxyObserver>>>,
}

impl ProxyService {
    /// A service with a FIFO of `fifo_size` slots on `device`.
    pub fn new(device: &Arc<dyn Device>, fifo_size: usize) -> Result<Self> {
        Ok(ProxyService {
            fifo: Arc::new(Fifo::new(device, fifo_size)?),
            semaphores: Vec::new(),
            memories: Vec::new(),
            proxy: None,
            observer: Arc::default(),
        })
    }

    /// Tells `observer` of this service's work from now on (once per service: a second
    /// observer is refused, since the first counts triggers from its start).
    pub fn observe(&self, observer: Arc<dyn ProxyObserver>) -> Result<()> {
        self.observer
            .set(observer.clone())
            .map_err(|_| Error::invalid("the proxy service already has an observer"))?;
        observer.attached();
        Ok(())
    }

    /// The observer, if one was set.
    pub fn observer(&self) -> Option<&Arc<dyn ProxyObserver>> {
        self.observer.get()
    }

    fn check_not_started(&self, what: &str) -> Result<()> {
        if self.proxy.is_some() {
            return Err(Error::invalid(format!(
                "{what} after the proxy service started: add semaphores and memories first"
            )));
        }
        Ok(())
    }

    /// Adds a semaphore (its connection carries the channel's data); returns its id.
    pub fn add_semaphore(&mut self, sem: Arc<Host2DeviceSemaphore>) -> Result<SemaphoreId> {
        self.check_not_started("add_semaphore")?;
        let id = self.semaphores.len() as u32;
        if id > mscclpp_hal::dev::fifo::MAX_SEMAPHORE_ID {
            return Err(Error::invalid(format!(
                "a proxy service holds at most {} semaphores",
                mscclpp_hal::dev::fifo::MAX_SEMAPHORE_ID + 1
            )));
        }
        self.semaphores.push(sem);
        Ok(id)
    }

    /// Adds a registered memory (local source or a peer's destination); returns its id.
    pub fn add_memory(&mut self, mem: Arc<RegisteredMemory>) -> Result<MemoryId> {
        self.check_not_started("add_memory")?;
        let id = self.memories.len() as u32;
        if id > mscclpp_hal::dev::fifo::MAX_MEMORY_ID {
            return Err(Error::invalid(format!(
                "a proxy service holds at most {} memories",
                mscclpp_hal::dev::fifo::MAX_MEMORY_ID + 1
            )));
        }
        self.memories.push(mem);
        Ok(id)
    }

    /// The device handle of a port channel: data from memory `src` to memory `dst` over the
    /// connection of semaphore `sem`, signalling that semaphore.
    pub fn port_channel(
        &self,
        sem: SemaphoreId,
        dst: MemoryId,
        src: MemoryId,
    ) -> Result<PortChannelDeviceHandle> {
        let s = self.semaphores.get(sem as usize).ok_or_else(|| {
            Error::invalid(format!(
                "semaphore id {sem}: the service has {}",
                self.semaphores.len()
            ))
        })?;
        for (what, id) in [("destination", dst), ("source", src)] {
            if id as usize >= self.memories.len() {
                return Err(Error::invalid(format!(
                    "{what} memory id {id}: the service has {}",
                    self.memories.len()
                )));
            }
        }
        let d = &self.memories[dst as usize];
        if d.rank() != s.connection().remote_rank() {
            return Err(Error::invalid(format!(
                "port channel destination belongs to rank {} but semaphore {sem} connects to rank {}",
                d.rank(),
                s.connection().remote_rank()
            )));
        }
        if !self.memories[src as usize].is_local() {
            return Err(Error::invalid(format!(
                "port channel source memory {src} is not local"
            )));
        }
        Ok(PortChannelDeviceHandle {
            semaphore_id: sem,
            dst,
            src,
            _pad: 0,
            semaphore: s.device_handle(),
            fifo: self.fifo.device_handle(),
        })
    }

    /// Starts the proxy thread.
    pub fn start(&mut self) -> Result<()> {
        self.check_not_started("start")?;
        let sems = self.semaphores.clone();
        let mems = self.memories.clone();
        let observer = self.observer.clone();
        let fifo = self.fifo.clone();
        let mut busy = false;
        let proxy = Proxy::start(self.fifo.clone(), move |t, pos| match observer.get() {
            None => handle(&sems, &mems, t),
            Some(o) => observed(&**o, &fifo, &mut busy, pos, &sems, &mems, t),
        })?;
        self.proxy = Some(proxy);
        Ok(())
    }

    /// Stops the proxy thread once the triggers already pushed are carried out (for at most
    /// [`STOP_DRAIN`]); returns the error that stopped it, if one did.
    pub fn stop(&mut self) -> Result<()> {
        match self.proxy.take() {
            Some(p) => {
                if !p.drain(STOP_DRAIN) {
                    tracing::debug!(
                        "proxy stopped with triggers still queued (FIFO tail {}, head {})",
                        self.fifo.tail(),
                        self.fifo.head()
                    );
                }
                p.stop()
            }
            None => Ok(()),
        }
    }
}

/// How long stopping waits for the triggers already pushed (a kernel's last signals) to be
/// carried out.
pub const STOP_DRAIN: Duration = Duration::from_secs(2);

impl Drop for ProxyService {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!("proxy service stopped with an error: {e}");
        }
    }
}

/// [`handle`] with its observer told: the trigger's start and end, and the thread's busy
/// spans (busy from a trigger after an empty FIFO until the FIFO holds none past this one).
fn observed(
    o: &dyn ProxyObserver,
    fifo: &Fifo,
    busy: &mut bool,
    pos: u64,
    sems: &[Arc<Host2DeviceSemaphore>],
    mems: &[Arc<RegisteredMemory>],
    t: ProxyTrigger,
) -> Result<ProxyHandlerResult> {
    if !*busy {
        *busy = true;
        o.busy(true);
    }
    let peer = sems
        .get(t.semaphore_id() as usize)
        .map_or(usize::MAX, |s| s.connection().remote_rank());
    let bytes = if t.kind() & TriggerType::DATA != 0 {
        t.size()
    } else {
        0
    };
    o.trigger_start(peer, bytes);
    let r = handle(sems, mems, t);
    o.trigger_done(peer, bytes, r.is_ok());
    if fifo.head() <= pos + 1 {
        *busy = false;
        o.busy(false);
    }
    r
}

/// Carries out one trigger: the proxy's hot path.
fn handle(
    sems: &[Arc<Host2DeviceSemaphore>],
    mems: &[Arc<RegisteredMemory>],
    t: ProxyTrigger,
) -> Result<ProxyHandlerResult> {
    let sem = sems.get(t.semaphore_id() as usize).ok_or_else(|| {
        Error::invalid(format!(
            "trigger names semaphore {} of {}",
            t.semaphore_id(),
            sems.len()
        ))
    })?;
    let conn = sem.connection();
    let kind = t.kind();
    if kind & TriggerType::DATA != 0 {
        let mem = |id: u32| {
            mems.get(id as usize).ok_or_else(|| {
                Error::invalid(format!("trigger names memory {id} of {}", mems.len()))
            })
        };
        conn.write(
            mem(t.dst_memory())?,
            t.dst_offset(),
            mem(t.src_memory())?,
            t.src_offset(),
            t.size(),
        )?;
    }
    if kind & TriggerType::FLAG != 0 {
        sem.signal()?;
    }
    if kind & TriggerType::SYNC != 0 {
        conn.flush(FLUSH_TIMEOUT)?;
    }
    Ok(ProxyHandlerResult::Continue)
}
