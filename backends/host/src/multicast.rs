//! Emulated multicast for the host backend.
//!
//! A group is a small shared-memory table with one slot per member. Binding writes the member's
//! memory handle into its slot and publishes it with a release store; mapping waits (with a
//! deadline) until every slot is published and then imports every member's memory, so the
//! mapping exposes all members' buffers. Switch-channel reduce and broadcast are carried out
//! member by member on those addresses.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use mscclpp_hal::{
    BackendKind, BufferSlice, DeviceBuffer, Error, IpcHandle, IpcHandleKind, MemoryKind,
    MulticastAddress, MulticastGroup, MulticastMapping, Result,
};

use crate::memory::{ShmAllocation, host_allocation, into_buffer};

/// Most members a host multicast group may have.
pub const MAX_MEMBERS: usize = 64;
/// Granularity of group sizes (one page).
pub const GRANULARITY: usize = 4096;
const SLOT_HANDLE_BYTES: usize = 448;
const GROUP_MAGIC: u64 = u64::from_le_bytes(*b"MSMCGRP1");

const EMPTY: u32 = 0;
const WRITING: u32 = 1;
const BOUND: u32 = 2;

#[repr(C)]
struct Header {
    magic: u64,
    size: u64,
    members: u64,
}

#[repr(C)]
struct Slot {
    state: AtomicU32,
    handle_len: u32,
    offset: u64,
    handle: [u8; SLOT_HANDLE_BYTES],
}

fn table_bytes(members: usize) -> usize {
    std::mem::size_of::<Header>() + members * std::mem::size_of::<Slot>()
}

/// A host multicast group (the table, created here or imported).
#[derive(Debug)]
pub struct HostMulticastGroup {
    table: DeviceBuffer,
    size: usize,
    members: usize,
    device: usize,
}

impl HostMulticastGroup {
    /// Creates a group of `members` buffers of `size` bytes.
    pub fn create(size: usize, members: usize, device: usize) -> Result<Self> {
        if size == 0 || size % GRANULARITY != 0 {
            return Err(Error::invalid(format!(
                "multicast size {size} must be a positive multiple of {GRANULARITY} bytes"
            )));
        }
        if !(1..=MAX_MEMBERS).contains(&members) {
            return Err(Error::invalid(format!(
                "multicast group of {members} members: the host emulation supports 1 to {MAX_MEMBERS}"
            )));
        }
        let table = into_buffer(ShmAllocation::new(
            table_bytes(members),
            MemoryKind::HostMapped,
            device,
        )?);
        let g = HostMulticastGroup {
            table,
            size,
            members,
            device,
        };
        let h = g.header();
        // SAFETY: the table is fresh, zeroed, at least a header long and page-aligned; no other
        // process can see it before it is exported.
        unsafe {
            h.write(Header {
                magic: GROUP_MAGIC,
                size: size as u64,
                members: members as u64,
            })
        };
        Ok(g)
    }

    /// Opens a group exported by [`MulticastGroup::export`].
    pub fn import(handle: &IpcHandle, device: usize) -> Result<Self> {
        handle.expect(BackendKind::Host, IpcHandleKind::Multicast)?;
        let alloc = ShmAllocation::import(&handle.payload, device)?;
        if mscclpp_hal::Allocation::len(&alloc) < std::mem::size_of::<Header>() {
            return Err(Error::malformed("host multicast handle", "table too small"));
        }
        let table = into_buffer(alloc);
        let header_ptr = table
            .host_ptr()
            .ok_or_else(|| Error::Internal("host table without host pointer".into()))?
            as *const Header;
        // SAFETY: the mapping is at least a header long (checked) and page-aligned; the header
        // was written before the group was exported and is never written again.
        let h = unsafe { header_ptr.read() };
        let members = h.members as usize;
        if h.magic != GROUP_MAGIC
            || !(1..=MAX_MEMBERS).contains(&members)
            || table.len() < table_bytes(members)
            || h.size == 0
            || h.size % GRANULARITY as u64 != 0
        {
            return Err(Error::malformed(
                "host multicast handle",
                "the shared table does not describe a multicast group",
            ));
        }
        Ok(HostMulticastGroup {
            table,
            size: h.size as usize,
            members,
            device,
        })
    }

    fn header(&self) -> *mut Header {
        self.table.host_ptr().unwrap_or(std::ptr::null_mut()).cast()
    }

    fn slot(&self, i: usize) -> &Slot {
        debug_assert!(i < self.members);
        // SAFETY: the table holds `members` slots after the header (checked at create/import),
        // it lives as long as `self`, and the slot's shared fields are only mutated through the
        // atomic state protocol (the writer owns the slot while it is WRITING).
        unsafe {
            &*(self
                .header()
                .cast::<u8>()
                .add(std::mem::size_of::<Header>() + i * std::mem::size_of::<Slot>())
                as *const Slot)
        }
    }
}

impl MulticastGroup for HostMulticastGroup {
    fn size(&self) -> usize {
        self.size
    }

    fn num_members(&self) -> usize {
        self.members
    }

    fn export(&self) -> Result<IpcHandle> {
        let mut h = host_allocation(&self.table)?.export()?;
        h.kind = IpcHandleKind::Multicast;
        Ok(h)
    }

    fn bind(&self, member: usize, buf: &BufferSlice) -> Result<()> {
        if member >= self.members {
            return Err(Error::invalid(format!(
                "member {member} out of range for a multicast group of {} members",
                self.members
            )));
        }
        if buf.len() != self.size {
            return Err(Error::invalid(format!(
                "multicast member buffer of {} bytes; the group binds {} bytes per member",
                buf.len(),
                self.size
            )));
        }
        let handle = host_allocation(buf.buffer())?.export()?.to_bytes();
        if handle.len() > SLOT_HANDLE_BYTES {
            return Err(Error::Internal(format!(
                "memory handle of {} bytes does not fit a multicast slot",
                handle.len()
            )));
        }
        let slot = self.slot(member);
        slot.state
            .compare_exchange(EMPTY, WRITING, Ordering::Acquire, Ordering::Relaxed)
            .map_err(|_| Error::invalid(format!("multicast member {member} is already bound")))?;
        let slot_ptr = slot as *const Slot as *mut Slot;
        // SAFETY: winning the EMPTY→WRITING exchange gives this thread exclusive ownership of the
        // slot's plain fields until the release store below; they lie within the table mapping.
        unsafe {
            std::ptr::addr_of_mut!((*slot_ptr).handle_len).write(handle.len() as u32);
            std::ptr::addr_of_mut!((*slot_ptr).offset).write(buf.offset() as u64);
            std::ptr::copy_nonoverlapping(
                handle.as_ptr(),
                std::ptr::addr_of_mut!((*slot_ptr).handle).cast::<u8>(),
                handle.len(),
            );
        }
        slot.state.store(BOUND, Ordering::Release);
        tracing::debug!(member, size = self.size, "host multicast member bound");
        Ok(())
    }

    fn map(&self, timeout: Duration) -> Result<MulticastMapping> {
        let deadline = Instant::now() + timeout;
        for i in 0..self.members {
            while self.slot(i).state.load(Ordering::Acquire) != BOUND {
                if Instant::now() >= deadline {
                    return Err(Error::Timeout {
                        waiting_for: format!(
                            "multicast member {i} of {} to bind its memory",
                            self.members
                        ),
                        after: timeout,
                    });
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let mut ptrs = Vec::with_capacity(self.members);
        let mut keep = Vec::with_capacity(self.members + 1);
        for i in 0..self.members {
            let slot = self.slot(i);
            let len = (slot.handle_len as usize).min(SLOT_HANDLE_BYTES);
            let bytes = slot.handle[..len].to_vec();
            let offset = slot.offset as usize;
            let handle = IpcHandle::from_bytes(&bytes)?;
            handle.expect(BackendKind::Host, IpcHandleKind::Memory)?;
            let buf = into_buffer(ShmAllocation::import(&handle.payload, self.device)?);
            let view = buf
                .slice(offset..offset.saturating_add(self.size))
                .map_err(|_| {
                    Error::malformed(
                        "host multicast slot",
                        format!("member {i} bound a range outside its allocation"),
                    )
                })?;
            ptrs.push(view.ptr());
            keep.push(buf);
        }
        keep.push(self.table.clone());
        Ok(MulticastMapping {
            address: MulticastAddress::Emulated(ptrs),
            keep_alive: Arc::new(keep),
        })
    }
}
