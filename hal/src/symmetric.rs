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
