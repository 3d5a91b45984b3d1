//! The names of the algorithms ([`AlgorithmId`]): what a call may ask for, what the policy
//! chooses and what every algorithm answers to. Apart from `base.rs` because the call
//! description (`call.rs`) names an algorithm while the trait there takes a checked call: in one
//! file, the two would depend on each other.

/// Which algorithm serves a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgorithmId {
    /// LL packets through scratch: data and flag written together into the peers' scratch, in
    /// rounds when a message exceeds a slot (every collective; small messages).
    Ll,
    /// The LL protocol in one round with a thread per packet of a rank block (all-reduce,
    /// reduce-scatter, all-gather, all-to-all): chosen instead of [`AlgorithmId::Ll`] wherever
    /// it fits, and interoperable with it.
    LlShort,
    /// LL128 lines through the same scratch: 120 data bytes per 128 instead of 8 per 16
    /// (all-reduce of one round, on devices with `Capabilities::ll128`).
    Ll128,
    /// Plain stores into the peers' scratch, pipelined (every collective; large messages).
    Direct,
    /// Every rank reads the peers' inputs where they lie — registered windows, or a staging
    /// copy — and reduces locally (all-reduce).
    Read,
    /// No data kernel: the copy engines move the data through the peers' mapped scratch, ordered
    /// by stream flag writes and waits (all-gather, broadcast, all-to-all; reduce-scatter with a
    /// reduction on a few blocks; only when forced or asked by a call).
    Ce,
    /// Communicators that span hosts: the others within each host, port channels between
    /// hosts (every collective; `hier/spec.md`). Chosen for every call of such a communicator.
    Hier,
}

impl AlgorithmId {
    /// Every algorithm.
    pub const ALL: [AlgorithmId; 6] = [
        AlgorithmId::Ll,
        AlgorithmId::LlShort,
        AlgorithmId::Ll128,
        AlgorithmId::Direct,
        AlgorithmId::Read,
        AlgorithmId::Ce,
    ];

    /// Its name (as `MSCCLPP_ALGO_*` spells the ones that can be forced).
    pub fn name(self) -> &'static str {
        match self {
            AlgorithmId::Ll => "ll",
            AlgorithmId::LlShort => "ll-short",
            AlgorithmId::Ll128 => "ll128",
            AlgorithmId::Direct => "direct",
            AlgorithmId::Read => "read",
            AlgorithmId::Ce => "ce",
            AlgorithmId::Hier => "hier",
        }
    }
}

impl std::fmt::Display for AlgorithmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
