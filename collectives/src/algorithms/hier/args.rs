//! The argument struct of the inter-host exchange kernel (`spec.md`).

use mscclpp_hal::KernelArgs;

/// Hosts a hierarchical communicator spans at most (the per-peer arrays of [`HierArgs`]).
pub const MAX_HOSTS: usize = 64;

/// Arguments of `mscclpp_hier_xchg`: one exchange among the ranks of a rail (the ranks of one
/// local rank on every host), through this rank's port channels to them.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HierArgs {
    /// Device address of `nranks` `PortChannelDeviceHandle`s (entry `rank` unused).
    pub chans: u64,
    /// This rank's send scratch: `nranks` slots of `slot_bytes` (slot `p`: what goes to `p`).
    pub send: u64,
    /// This rank's receive scratch: `nranks` slots (slot `p`: what came from `p`).
    pub recv: u64,
    /// Bytes of one slot (a multiple of 16): two halves, used by alternate rounds.
    pub slot_bytes: u64,
    /// Bytes of the piece exchanged with each peer.
    pub bytes: u64,
    /// This rank in the rail, and the rail's size (the number of hosts).
    pub rank: u32,
    pub nranks: u32,
    /// 1: `dst[0]` = the reduction, in rail order, of `src[rank]` and what every peer sent;
    /// 0: `dst[p]` = what `p` sent (`src[rank]` for this rank itself).
    pub reduce: u32,
    /// Element type and operator codes (reductions).
    pub dtype: u32,
    pub op: u32,
    pub _pad: u32,
    /// The communicator's abort word (device kernels' waits give up once it is set; 0: none).
    pub abort: u64,
    /// Device address of the rail's round counter (8 bytes, zeroed at set-up; the kernel
    /// advances it by the rounds of each call).
    pub counter: u64,
    /// Per peer: where the piece for it starts (0: nothing is sent to it, only the signals).
    pub src: [u64; MAX_HOSTS],
    /// Per peer: where its piece is stored (0: dropped); `dst[0]` is the result of a reduction.
    pub dst: [u64; MAX_HOSTS],
}

// SAFETY: `#[repr(C)]` of integers only, no implicit padding (`_pad` fills the gap), valid for
// every bit pattern.
unsafe impl KernelArgs for HierArgs {}

impl Default for HierArgs {
    fn default() -> Self {
        HierArgs {
            chans: 0,
            send: 0,
            recv: 0,
            slot_bytes: 0,
            bytes: 0,
            rank: 0,
            nranks: 0,
            reduce: 0,
            dtype: 0,
            op: 0,
            _pad: 0,
            abort: 0,
            counter: 0,
            src: [0; MAX_HOSTS],
            dst: [0; MAX_HOSTS],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The layout `kernels/collectives/hier.cu` asserts.
    #[test]
    fn layout_matches_the_device_source() {
        assert_eq!(std::mem::size_of::<HierArgs>(), 1104);
        assert_eq!(offset_of!(HierArgs, rank), 40);
        assert_eq!(offset_of!(HierArgs, abort), 64);
        assert_eq!(offset_of!(HierArgs, counter), 72);
        assert_eq!(offset_of!(HierArgs, src), 80);
        assert_eq!(offset_of!(HierArgs, dst), 592);
        let src = include_str!("../../../../kernels/collectives/hier.cu");
        for line in [
            "sizeof(HierArgs) == 1104",
            "MSCCLPP_LAYOUT_OFFSETOF(HierArgs, counter) == 72",
            "MSCCLPP_LAYOUT_OFFSETOF(HierArgs, rank) == 40",
            "MSCCLPP_LAYOUT_OFFSETOF(HierArgs, abort) == 64",
            "MSCCLPP_LAYOUT_OFFSETOF(HierArgs, src) == 80",
            "MSCCLPP_LAYOUT_OFFSETOF(HierArgs, dst) == 592",
        ] {
            assert!(src.contains(line), "hier.cu lacks {line}");
        }
    }
}
