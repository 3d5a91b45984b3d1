//! Memory that the processes of one host map at addresses they choose: what a symmetric window
//! (NCCL's device API) is made of. Each rank allocates its part as memory with a shareable
//! handle (a file descriptor), the ranks pass the descriptors to each other (a local socket),
//! and every rank maps every part into one reserved range at a fixed stride, so that the same
//! arithmetic on a base address reaches any rank's part. A backend that can do this answers
//! [`crate::Device::shareable`].

use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};

use crate::{DeviceBuffer, DevicePtr, Result};

/// A device's shareable memory: allocation, export of its handle, and ranges to map handles
/// into.
pub trait Shareable: Send + Sync + fmt::Debug {
    /// The unit of sizes and map offsets (bytes): an allocation's length and every offset given
    /// to [`AddressSpace::map`] are multiples of it.
    fn granularity(&self) -> usize;

    /// Allocates at least `bytes` (rounded up to [`Shareable::granularity`]; the buffer's length
    /// says how many) whose handle [`Shareable::export`] can give to another process. Contents
    /// are unspecified.
    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer>;

    /// A file descriptor for the whole allocation behind `buf` (one of [`Shareable::alloc`]'s),
    /// for another process (or this one) to map with [`AddressSpace::map`].
    fn export(&self, buf: &DeviceBuffer) -> Result<OwnedFd>;

    /// Reserves `bytes` of address space (a multiple of the granularity), mapped nowhere yet.
    /// Released when dropped; mappings still in it are removed first.
    fn reserve(&self, bytes: usize) -> Result<Box<dyn AddressSpace>>;
}

/// The checks every [`AddressSpace::map`] makes: `bytes` at `offset` are whole units of
/// `granularity`, inside a range of `len` bytes, and over none of the `mapped` ones (offset →
/// length); an error naming what is wrong otherwise.
pub fn check_map(
    len: usize,
    granularity: usize,
    mapped: &std::collections::BTreeMap<usize, usize>,
    offset: usize,
    bytes: usize,
) -> Result<()> {
    let fits = granularity > 0
        && offset % granularity == 0
        && bytes % granularity == 0
        && bytes > 0
        && offset.checked_add(bytes).is_some_and(|e| e <= len);
    if !fits {
        return Err(crate::Error::invalid(format!(
            "{bytes} bytes at offset {offset} of a reserved range of {len} bytes: multiples of {granularity} inside the range are needed"
        )));
    }
    let overlaps = mapped
        .range(..offset + bytes)
        .next_back()
        .is_some_and(|(&o, &l)| o + l > offset);
    if overlaps {
        return Err(crate::Error::invalid(format!(
            "{bytes} bytes at offset {offset}: the range holds a mapping there already"
        )));
    }
    Ok(())
}

/// A reserved range of addresses that handles of [`Shareable::export`] are mapped into.
pub trait AddressSpace: Send + Sync + fmt::Debug {
    /// Its first address.
    fn base(&self) -> DevicePtr;

    /// Its length in bytes.
    fn len(&self) -> usize;

    /// Whether it is empty (never: a reservation has a length).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Maps the first `bytes` of the memory behind `handle` at `base + offset`, readable and
    /// writable by the device (and by the host where the backend's memory is the host's).
    /// `offset` and `bytes` are multiples of the granularity and lie inside the range, over no
    /// other mapping.
    fn map(&self, offset: usize, handle: BorrowedFd<'_>, bytes: usize) -> Result<()>;

    /// Removes the mapping of [`AddressSpace::map`] at `offset` (of `bytes`). Work that used it
    /// must have finished.
    fn unmap(&self, offset: usize, bytes: usize) -> Result<()>;
}
