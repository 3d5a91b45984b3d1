//! [`RegisteredMemory`]: a byte range of device memory made reachable by transports, and its
//! descriptor for other ranks.

use std::fmt;
use std::sync::Arc;

use mscclpp_hal::wire::{Reader, Writer};
use mscclpp_hal::{BufferSlice, Error, IpcHandle, Result};

use crate::context::TransportContext;
use crate::flags::TransportFlags;
use crate::ib::memory::IbMr;
use crate::transport::Transport;

const MAGIC: [u8; 4] = *b"MSRM";
const VERSION: u16 = 1;
/// Longest host id accepted from a peer.
pub(crate) const MAX_HOST_ID: usize = 256;
/// Largest encoded IPC handle accepted (the HAL bounds its payload at 512 bytes).
const MAX_IPC_HANDLE: usize = 1024;
/// Highest rank number accepted from a peer: far above any real job, low enough that a rank
/// never overflows arithmetic.
pub(crate) const MAX_RANK: usize = 1 << 24;

/// Memory registered with the transports: local (made by [`RegisteredMemory::register`]) or a
/// peer's (decoded by [`RegisteredMemory::from_bytes`]). Cheap to clone; clones share the
/// registration and, for a peer's CudaIpc memory, the one mapping.
#[derive(Clone)]
pub struct RegisteredMemory {
    inner: Arc<Inner>,
}

struct Inner {
    rank: usize,
    host_id: String,
    transports: TransportFlags,
    /// Offset of the range within the exported allocation (what the IPC handle maps).
    offset: u64,
    len: u64,
    ipc: Option<IpcHandle>,
    ethernet_id: Option<u64>,
    /// One per IB transport registered for, in transport order.
    ib: Vec<IbRegion>,
    place: Place,
}

/// The memory as one HCA sees it: the address and key a peer writes with and, for local
/// memory, the registration itself (its lkey is the source key of writes).
struct IbRegion {
    index: u8,
    addr: u64,
    rkey: u32,
    mr: Option<IbMr>,
}

enum Place {
    Local {
        slice: BufferSlice,
        ctx: Arc<TransportContext>,
    },
    Remote {
        mapped: Option<BufferSlice>,
    },
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let (Place::Local { ctx, .. }, Some(id)) = (&self.place, self.ethernet_id) {
            ctx.deregister_ethernet(id);
        }
    }
}

impl fmt::Debug for RegisteredMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.inner;
        f.debug_struct("RegisteredMemory")
            .field("rank", &i.rank)
            .field("local", &self.is_local())
            .field("len", &i.len)
            .field("offset", &i.offset)
            .field("transports", &i.transports)
            .field("ethernet_id", &i.ethernet_id)
            .field("mapped", &self.mapped_slice().is_some())
            .finish()
    }
}

impl RegisteredMemory {
    /// Registers `slice` of this rank's memory for `transports`: exports it over IPC for
    /// CudaIpc, enters it in the context's landing registry for Ethernet.
    pub fn register(
        ctx: &Arc<TransportContext>,
        slice: &BufferSlice,
        transports: TransportFlags,
    ) -> Result<Self> {
        if slice.is_empty() {
            return Err(Error::invalid(
                "registering an empty memory range: there is nothing a peer could write",
            ));
        }
        if transports.is_empty() {
            return Err(Error::invalid(
                "registering memory for no transport: name at least one",
            ));
        }
        for t in transports.iter() {
            t.built()?;
        }
        let ipc = if transports.contains(Transport::CudaIpc) {
            Some(ctx.device().ipc_export(slice.buffer())?)
        } else {
            None
        };
        let mut ib = Vec::new();
        for t in transports.iter() {
            if let Transport::Ib(n) = t {
                let dev = ctx.ib_device(n)?;
                // Atomics where the HCA takes them; writes only otherwise (no-atomic mode).
                let mr = crate::ib::memory::register(&dev, slice, true)
                    .or_else(|_| crate::ib::memory::register(&dev, slice, false))?;
                ib.push(IbRegion {
                    index: n,
                    addr: mr.addr,
                    rkey: mr.keys.rkey,
                    mr: Some(mr),
                });
            }
        }
        let ethernet_id = transports
            .lands_by_id()
            .then(|| ctx.register_ethernet(slice.clone()));
        Ok(RegisteredMemory {
            inner: Arc::new(Inner {
                rank: ctx.rank(),
                host_id: ctx.host_id().to_owned(),
                transports,
                offset: slice.offset() as u64,
                len: slice.len() as u64,
                ipc,
                ethernet_id,
                ib,
                place: Place::Local {
                    slice: slice.clone(),
                    ctx: ctx.clone(),
                },
            }),
        })
    }

    /// The descriptor other ranks decode with [`RegisteredMemory::from_bytes`].
    pub fn to_bytes(&self) -> Vec<u8> {
        let i = &self.inner;
        let mut w = Writer::new(MAGIC, VERSION);
        w.u32(i.rank as u32)
            .str(&i.host_id)
            .u64(i.len)
            .u64(i.offset)
            .u16(i.transports.bits());
        if i.transports.contains(Transport::CudaIpc) {
            w.bytes(&i.ipc.as_ref().map(IpcHandle::to_bytes).unwrap_or_default());
        }
        if i.transports.lands_by_id() {
            w.u64(i.ethernet_id.unwrap_or(0));
        }
        for r in &i.ib {
            w.u64(r.addr).u32(r.rkey);
        }
        w.finish()
    }

    /// Decodes a peer's descriptor. For CudaIpc memory of a rank on this host (equal host ids)
    /// it maps the memory through the device's IPC import, once; the mapping lives as long as
    /// the returned value and its clones.
    pub fn from_bytes(ctx: &Arc<TransportContext>, bytes: &[u8]) -> Result<Self> {
        const WHAT: &str = "registered memory descriptor";
        let mut r = Reader::open(WHAT, bytes, MAGIC, VERSION, VERSION)?;
        let rank = r.u32()? as usize;
        if rank > MAX_RANK {
            return Err(Error::malformed(
                WHAT,
                format!("rank {rank} exceeds {MAX_RANK}"),
            ));
        }
        let host_id = r.str("host id", MAX_HOST_ID)?.to_owned();
        let len = r.u64()?;
        let offset = r.u64()?;
        let transports = TransportFlags::from_bits(r.u16()?)?;
        let ipc = if transports.contains(Transport::CudaIpc) {
            Some(IpcHandle::from_bytes(
                r.bytes("IPC handle", MAX_IPC_HANDLE)?,
            )?)
        } else {
            None
        };
        let ethernet_id = if transports.lands_by_id() {
            Some(r.u64()?)
        } else {
            None
        };
        let mut ib = Vec::new();
        for t in transports.iter() {
            if let Transport::Ib(index) = t {
                let addr = r.u64()?;
                let rkey = r.u32()?;
                if addr.checked_add(len).is_none() {
                    return Err(Error::malformed(
                        WHAT,
                        format!("IB{index} region {addr:#x}+{len} wraps the address space"),
                    ));
                }
                ib.push(IbRegion {
                    index,
                    addr,
                    rkey,
                    mr: None,
                });
            }
        }
        r.finish()?;
        if len == 0 || transports.is_empty() {
            return Err(Error::malformed(
                WHAT,
                format!("length {len} with transports {transports}: nothing is reachable"),
            ));
        }
        if let Some(h) = &ipc {
            let end = offset.checked_add(len);
            if end.is_none_or(|e| e > h.len) {
                return Err(Error::malformed(
                    WHAT,
                    format!(
                        "range {offset}+{len} lies outside the exported allocation of {} bytes",
                        h.len
                    ),
                ));
            }
        }
        let mapped = match &ipc {
            Some(h) if host_id == ctx.host_id() => {
                let buf = ctx.device().ipc_import(h).map_err(|e| Error::Remote {
                    rank,
                    message: format!(
                        "mapping its CudaIpc memory ({len} bytes at offset {offset}) on rank {}: {e}",
                        ctx.rank()
                    ),
                })?;
                // Both bounds were checked against the handle's length above; the import
                // checks the handle's length against the mapping.
                Some(buf.slice(offset as usize..(offset + len) as usize)?)
            }
            _ => None,
        };
        Ok(RegisteredMemory {
            inner: Arc::new(Inner {
                rank,
                host_id,
                transports,
                offset,
                len,
                ipc,
                ethernet_id,
                ib,
                place: Place::Remote { mapped },
            }),
        })
    }

    /// The rank that owns the memory.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The owner's host id.
    pub fn host_id(&self) -> &str {
        &self.inner.host_id
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Whether the length is zero (never: registration refuses empty ranges).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The transports it was registered for.
    pub fn transports(&self) -> TransportFlags {
        self.inner.transports
    }

    /// Whether this rank registered it (rather than decoding a peer's descriptor).
    pub fn is_local(&self) -> bool {
        matches!(self.inner.place, Place::Local { .. })
    }

    /// The registered range, for local memory.
    pub fn local_slice(&self) -> Option<BufferSlice> {
        match &self.inner.place {
            Place::Local { slice, .. } => Some(slice.clone()),
            Place::Remote { .. } => None,
        }
    }

    /// This process's mapping of a peer's CudaIpc memory (same host only).
    pub fn mapped_slice(&self) -> Option<BufferSlice> {
        match &self.inner.place {
            Place::Remote { mapped } => mapped.clone(),
            Place::Local { .. } => None,
        }
    }

    /// The id its owner's Ethernet receiver knows it by, if registered for Ethernet.
    pub fn ethernet_id(&self) -> Option<u64> {
        self.inner.ethernet_id
    }

    /// The address and remote key peers write to over IBn, if registered for it.
    pub(crate) fn ib_remote(&self, n: u8) -> Option<(u64, u32)> {
        self.inner
            .ib
            .iter()
            .find(|r| r.index == n)
            .map(|r| (r.addr, r.rkey))
    }

    /// The address and local key of this rank's own memory registered for IBn.
    pub(crate) fn ib_local(&self, n: u8) -> Option<(u64, u32)> {
        self.inner
            .ib
            .iter()
            .find(|r| r.index == n)
            .and_then(|r| r.mr.as_ref().map(|m| (m.addr, m.keys.lkey)))
    }
}

/// Checks `off..off+len` against a memory of `size` bytes, naming both on failure.
pub(crate) fn check_range(what: &str, off: u64, len: u64, size: u64) -> Result<()> {
    match off.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Error::invalid(format!(
            "{what} range: offset {off} + length {len} exceeds its {size} bytes"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::host_ctx;
    use mscclpp_hal::MemoryKind;
    use proptest::prelude::*;

    #[test]
    fn local_round_trip_maps_the_same_bytes() {
        let ctx = host_ctx(0);
        let buf = ctx.device().alloc(4096, MemoryKind::Device).unwrap();
        let slice = buf.slice(1024..3072).unwrap();
        let m = RegisteredMemory::register(&ctx, &slice, Transport::CudaIpc | Transport::Ethernet)
            .unwrap();
        assert!(m.is_local() && m.local_slice().is_some() && m.mapped_slice().is_none());
        let id = m.ethernet_id().unwrap();
        assert!(ctx.ethernet_memory(id).is_some());

        let peer = host_ctx(1);
        let r = RegisteredMemory::from_bytes(&peer, &m.to_bytes()).unwrap();
        assert!(!r.is_local());
        assert_eq!((r.rank(), r.len(), r.ethernet_id()), (0, 2048, Some(id)));
        assert_eq!(r.transports(), m.transports());
        // The mapping is of the registered range, not of the whole allocation.
        let mapped = r.mapped_slice().unwrap();
        let s = peer.device().create_stream().unwrap();
        s.write_from_host(&mapped, &vec![7u8; 2048]).unwrap();
        let mut whole = vec![0u8; 4096];
        s.read_to_host(&mut whole, &buf.full()).unwrap();
        assert!(whole[..1024].iter().all(|&b| b == 0));
        assert!(whole[1024..3072].iter().all(|&b| b == 7));
        assert!(whole[3072..].iter().all(|&b| b == 0));
        // Re-encoding a peer's memory gives the same descriptor.
        assert_eq!(r.to_bytes(), m.to_bytes());

        drop(m);
        assert!(ctx.ethernet_memory(id).is_none());
    }

    #[test]
    fn other_host_is_not_mapped_and_bad_registrations_are_refused() {
        let ctx = host_ctx(0);
        let buf = ctx.device().alloc(64, MemoryKind::Device).unwrap();
        let m = RegisteredMemory::register(&ctx, &buf.full(), Transport::CudaIpc.into()).unwrap();
        let far = TransportContext::with_host_id(1, ctx.device().clone(), "elsewhere".to_owned());
        let r = RegisteredMemory::from_bytes(&far, &m.to_bytes()).unwrap();
        assert!(r.mapped_slice().is_none());

        ctx.use_verbs(crate::ib::fake::FakeVerbs::with_devices(&["mlx5_0"]));
        let e = RegisteredMemory::register(&ctx, &buf.full(), Transport::Ib(2).into())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("IB2") && e.contains("no RDMA device found (") && e.contains("mlx5_0"),
            "{e}"
        );
        let empty = buf.slice(3..3).unwrap();
        assert!(RegisteredMemory::register(&ctx, &empty, Transport::Ethernet.into()).is_err());
        assert!(RegisteredMemory::register(&ctx, &buf.full(), TransportFlags::NONE).is_err());
    }

    #[test]
    fn range_outside_the_handle_is_refused() {
        let ctx = host_ctx(0);
        let buf = ctx.device().alloc(64, MemoryKind::Device).unwrap();
        let m = RegisteredMemory::register(&ctx, &buf.full(), Transport::CudaIpc.into()).unwrap();
        let mut bytes = m.to_bytes();
        // rank (4) and host id (4 + n) precede the length; grow the length past the handle.
        let at = 6 + 4 + 4 + ctx.host_id().len();
        bytes[at..at + 8].copy_from_slice(&65u64.to_le_bytes());
        let e = RegisteredMemory::from_bytes(&ctx, &bytes)
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside the exported allocation"), "{e}");
    }

    #[test]
    fn check_range_names_offsets_and_sizes() {
        assert!(check_range("destination", 8, 8, 16).is_ok());
        let e = check_range("destination", 9, 8, 16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("offset 9") && e.contains("length 8") && e.contains("16 bytes"));
        assert!(check_range("source", u64::MAX, 2, 16).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = RegisteredMemory::from_bytes(&host_ctx(0), &buf);
        }

        #[test]
        fn mutated_descriptors_never_panic(at in 0usize..200, x in 1u8..=255) {
            let ctx = host_ctx(0);
            let buf = ctx.device().alloc(64, MemoryKind::Device).unwrap();
            let m = RegisteredMemory::register(&ctx, &buf.full(), Transport::CudaIpc | Transport::Ethernet).unwrap();
            let mut bytes = m.to_bytes();
            let at = at % bytes.len();
            bytes[at] ^= x;
            let _ = RegisteredMemory::from_bytes(&ctx, &bytes);
        }
    }
}
