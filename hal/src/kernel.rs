//! Kernels: identified by name, launched with one `#[repr(C)]` argument struct.
//!
//! The HAL names no kernel of the library: whoever owns a kernel describes it in a
//! [`crate::KernelModule`] (device source, entry points, host functions) and loads it with
//! [`crate::Device::load`]; the CUDA and ROCm backends compile the module's source, the host
//! backend runs the module's Rust function of the same name.

use std::fmt;

use crate::error::{Error, Result};

/// The name of a kernel, the same on every backend.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelId(pub &'static str);

impl KernelId {
    /// The kernel's name.
    pub fn name(self) -> &'static str {
        self.0
    }
}

impl fmt::Debug for KernelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KernelId({})", self.0)
    }
}

impl fmt::Display for KernelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Grid and block shape of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A one-dimensional launch.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
            shared_mem_bytes: 0,
        }
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> u64 {
        self.grid.iter().map(|&g| u64::from(g)).product()
    }

    /// Threads per block.
    pub fn threads_per_block(&self) -> u64 {
        self.block.iter().map(|&b| u64::from(b)).product()
    }

    /// Checks the shape against a device's limit on threads per block.
    pub fn validate(&self, max_threads_per_block: u32) -> Result<()> {
        if self.num_blocks() == 0 || self.threads_per_block() == 0 {
            return Err(Error::invalid(format!(
                "launch with an empty grid or block: grid {:?}, block {:?}",
                self.grid, self.block
            )));
        }
        if self.threads_per_block() > u64::from(max_threads_per_block) {
            return Err(Error::invalid(format!(
                "block of {} threads exceeds the device limit of {max_threads_per_block}",
                self.threads_per_block()
            )));
        }
        Ok(())
    }
}

/// Checks a launch of kernel `id` on a GPU backend before the vendor call: the shape against
/// `max_threads_per_block`, and the argument bytes against the kernel's argument struct size
/// where it is known (`param_size`).
pub fn check_launch(
    id: KernelId,
    cfg: &LaunchConfig,
    max_threads_per_block: u32,
    param_size: Option<usize>,
    args: &[u8],
) -> Result<()> {
    cfg.validate(max_threads_per_block)?;
    if let Some(expected) = param_size {
        if expected != args.len() {
            return Err(Error::invalid(format!(
                "kernel {id} takes a {expected}-byte argument struct; {} bytes were given",
                args.len()
            )));
        }
    }
    Ok(())
}

/// The argument bytes in 8-byte aligned words (at least one word, zero-padded): a copy with
/// the layout a kernel expects of its one struct parameter, whatever the caller's alignment.
pub fn aligned_args(args: &[u8]) -> Vec<u64> {
    let mut words = vec![0u64; args.len().div_ceil(8).max(1)];
    for (word, chunk) in words.iter_mut().zip(args.chunks(8)) {
        let mut bytes = [0u8; 8];
        bytes[..chunk.len()].copy_from_slice(chunk);
        *word = u64::from_ne_bytes(bytes);
    }
    words
}

/// A `#[repr(C)]` kernel argument struct that is plain old data.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain no padding bytes that the device reads, no
/// references or pointers into host memory the device cannot see, and be valid for every bit
/// pattern (so that [`KernelArgs::from_bytes`] may rebuild one from bytes).
pub unsafe trait KernelArgs: Copy + Send + 'static {
    /// The bytes of the struct, exactly as the device sees them.
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `Self` is plain old data (trait contract), so viewing it as
        // `size_of::<Self>()` initialised bytes is sound.
        unsafe {
            std::slice::from_raw_parts(
                (self as *const Self).cast::<u8>(),
                std::mem::size_of::<Self>(),
            )
        }
    }

    /// Rebuilds the struct from bytes, checking the length.
    fn from_bytes(bytes: &[u8]) -> Result<Self> {
        if bytes.len() != std::mem::size_of::<Self>() {
            return Err(Error::invalid(format!(
                "kernel arguments of {} bytes where {} bytes of {} were expected",
                bytes.len(),
                std::mem::size_of::<Self>(),
                std::any::type_name::<Self>()
            )));
        }
        // SAFETY: the length matches, and every bit pattern is a valid `Self` (trait contract);
        // `read_unaligned` copes with the byte slice's alignment.
        Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }
}

/// A loaded kernel, ready to launch on a stream of the device that loaded it.
pub trait Kernel: Send + Sync + fmt::Debug {
    /// Which kernel this is.
    fn id(&self) -> KernelId;
    /// Backend-specific access for downcasting by the stream that launches it.
    fn as_any(&self) -> &dyn std::any::Any;
    /// The most threads per block this kernel can be launched with (its register use limits
    /// it), where the backend knows; `None`: the device's limit applies.
    fn max_threads_per_block(&self) -> Option<u32> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_args_keep_the_bytes_in_order_and_pad_with_zeros() {
        let words = aligned_args(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(words.len(), 2);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(&bytes[..9], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert!(bytes[9..].iter().all(|&b| b == 0));
        assert_eq!(aligned_args(&[]), vec![0]);
    }

    #[test]
    fn launches_are_checked_against_the_limit_and_the_struct_size() {
        let cfg = LaunchConfig::linear(1, 64);
        let id = KernelId("k");
        assert!(check_launch(id, &cfg, 64, Some(3), &[0; 3]).is_ok());
        assert!(check_launch(id, &cfg, 64, None, &[0; 5]).is_ok());
        assert!(check_launch(id, &cfg, 32, None, &[]).is_err());
        let e = check_launch(id, &cfg, 64, Some(24), &[0; 8]).unwrap_err();
        assert!(e.to_string().contains("24-byte argument struct"), "{e}");
    }
}
