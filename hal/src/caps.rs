//! What a backend and its devices can do, as plain data.

use std::fmt;

/// The compiled-in backends, in the order the registry probes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    /// NVIDIA, through the CUDA driver opened at run time.
    Cuda,
    /// AMD, through libamdhip64 opened at run time.
    Rocm,
    /// The CPU reference backend; always present.
    Host,
}

impl BackendKind {
    /// All kinds, in probe priority order.
    pub const ALL: [BackendKind; 3] = [BackendKind::Cuda, BackendKind::Rocm, BackendKind::Host];

    /// The name used in `MSCCLPP_BACKEND`, logs and encodings.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cuda => "cuda",
            BackendKind::Rocm => "rocm",
            BackendKind::Host => "host",
        }
    }

    /// The one-byte tag used in encodings.
    pub fn code(self) -> u8 {
        match self {
            BackendKind::Cuda => 1,
            BackendKind::Rocm => 2,
            BackendKind::Host => 3,
        }
    }

    /// Inverse of [`BackendKind::code`].
    pub fn from_code(code: u8) -> Option<Self> {
        BackendKind::ALL.into_iter().find(|k| k.code() == code)
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        BackendKind::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                crate::Error::invalid(format!(
                    "unknown backend {s:?}: expected one of host, cuda, rocm"
                ))
            })
    }
}

/// Whether and how a device supports multicast memory (NVLink SHARP on NVIDIA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MulticastSupport {
    /// No multicast; the reason says why (no hardware, disabled by environment, old driver).
    Unsupported(String),
    /// Hardware multicast: one address reaches every member's memory.
    Hardware {
        /// Size and alignment granularity of multicast objects, in bytes.
        granularity: usize,
    },
    /// Emulated multicast (host backend): the mapping exposes every member's memory and the
    /// operations on it are carried out member by member.
    Emulated {
        /// Size and alignment granularity of multicast objects, in bytes.
        granularity: usize,
    },
}

impl MulticastSupport {
    /// Whether multicast objects may be created.
    pub fn is_supported(&self) -> bool {
        !matches!(self, MulticastSupport::Unsupported(_))
    }
}

/// Capabilities of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Allocations can be exported to and imported by another process.
    pub ipc: bool,
    /// Host-mapped memory (visible to both host and device) can be allocated.
    pub host_mapped_memory: bool,
    /// Ordinary device memory can also be read and written by the host through a pointer.
    pub device_memory_host_accessible: bool,
    /// Kernels can be launched.
    pub kernels: bool,
    /// Multicast memory.
    pub multicast: MulticastSupport,
    /// The 16-byte stores of eight neighbouring threads of one instruction into one 128-byte
    /// aligned line of a peer's memory are seen whole by a reader that loads the line the same
    /// way (what LL128 lines rely on: one flag per 120 data bytes). NVIDIA GPUs from Volta on
    /// with a peer reached over NVLink (native peer atomics; NCCL's LL128 protocol rests on the
    /// same property); the host by construction (its kernel orders the flag after the data).
    pub ll128: bool,
}

/// Properties of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Which backend the device belongs to.
    pub backend: BackendKind,
    /// Ordinal within the backend.
    pub ordinal: usize,
    /// Marketing or descriptive name.
    pub name: String,
    /// Architecture the kernels are compiled for: `sm_90`, `gfx90a`, `host`.
    pub arch: String,
    /// Memory in bytes.
    pub total_memory: u64,
    /// Threads that execute in lock-step (32 on NVIDIA, 64 on most AMD, 1 on host).
    pub warp_size: u32,
    /// Streaming multiprocessors / compute units / CPU cores.
    pub multiprocessors: u32,
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// PCI bus id, where there is one.
    pub pci_bus_id: Option<String>,
    /// What the device can do.
    pub caps: Capabilities,
}

/// Which devices of a backend can map each other's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerMatrix {
    n: usize,
    access: Vec<bool>,
}

impl PeerMatrix {
    /// Builds a matrix from a function of (from, to).
    pub fn from_fn(n: usize, f: impl Fn(usize, usize) -> bool) -> Self {
        let access = (0..n * n).map(|i| f(i / n, i % n)).collect();
        PeerMatrix { n, access }
    }

    /// Builds a matrix from a fallible query of (from, to) for `from != to` (a device always
    /// accesses its own memory); the first error ends the build.
    pub fn try_from_peers(
        n: usize,
        mut can_access_peer: impl FnMut(usize, usize) -> crate::error::Result<bool>,
    ) -> crate::error::Result<Self> {
        let mut access = vec![false; n * n];
        for i in 0..n {
            for j in 0..n {
                access[i * n + j] = i == j || can_access_peer(i, j)?;
            }
        }
        Ok(PeerMatrix { n, access })
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the matrix is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Whether device `from` can access memory of device `to`; `false` out of range.
    pub fn can_access(&self, from: usize, to: usize) -> bool {
        from < self.n && to < self.n && self.access[from * self.n + to]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_asked_only_off_the_diagonal_and_errors_end_the_build() {
        let mut asked = Vec::new();
        let m = PeerMatrix::try_from_peers(2, |i, j| {
            asked.push((i, j));
            Ok(i == 0)
        })
        .unwrap();
        assert_eq!(asked, vec![(0, 1), (1, 0)]);
        assert!(m.can_access(0, 0) && m.can_access(1, 1) && m.can_access(0, 1));
        assert!(!m.can_access(1, 0));
        let e = PeerMatrix::try_from_peers(2, |_, _| Err(crate::Error::invalid("x")));
        assert!(e.is_err());
    }
}
