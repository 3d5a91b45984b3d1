//! Which algorithm serves a call, and the settings read from the environment.
//!
//! By default: LL128 for all-reduces of 256 KiB up to 2 MiB per rank where it runs; the direct
//! algorithm from a size per collective on; LL below (its short kernels wherever a call fits
//! them). The read and copy-engine algorithms only when forced (or asked by a call,
//! [`crate::CollectiveCall::algorithm`]), except that `MSCCLPP_CE_AUTO_BYTES` lets the choice by
//! size take the copy-engine path from that many bytes per rank block on: whether the copy
//! engines pay depends on what else occupies the SMs, which only the caller knows.
//! `MSCCLPP_ALGO_<COLLECTIVE>=auto|ll|direct` (and `ll128`,
//! `read` for all-reduce; `ce` for every collective) forces one per collective;
//! a forced algorithm that cannot serve a call (too large, or not set up here) leaves that call
//! to the default choice. The thresholds are where the measurements in docs/performance.md
//! cross over, per backend ([`Tuning`]): the above is the GPUs' choice; on the host backend the
//! direct algorithm serves every non-empty call (its LL packets cost a CPU several times what a
//! copy does, at every size measured).

use std::ops::Range;

use mscclpp_hal::{BackendKind, Error, Result};

use crate::CollectiveKind;

use crate::algorithms::id::AlgorithmId;

/// Per collective: a forced algorithm, or by size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    Auto,
    Forced(AlgorithmId),
}

/// Whose measurements the choice by size follows: a GPU's and a CPU's costs differ too much
/// for one set of thresholds (the GPUs' made the host backend up to 36x slower than it can be).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tuning {
    /// CUDA and ROCm: LL, LL128 for mid-size all-reduces, direct from a size per collective
    /// (2 x H200; docs/performance.md, "Figures formerly in code comments").
    Gpu,
    /// The host backend (ranks as CPU threads): direct for every non-empty call; LL and LL128
    /// only when forced (docs/performance.md, "Host backend: the choice by size").
    Host,
}

impl Tuning {
    /// The tuning for a communicator on `backend`.
    pub(crate) fn of(backend: BackendKind) -> Tuning {
        match backend {
            BackendKind::Host => Tuning::Host,
            BackendKind::Cuda | BackendKind::Rocm => Tuning::Gpu,
        }
    }
}

/// Rank-block bytes from which the direct algorithm serves `kind` when not forced.
pub(crate) fn direct_threshold(kind: CollectiveKind, tuning: Tuning) -> u64 {
    match (tuning, kind) {
        (
            Tuning::Gpu,
            CollectiveKind::AllReduce | CollectiveKind::AllGather | CollectiveKind::ReduceScatter,
        ) => 2 << 20,
        (Tuning::Gpu, CollectiveKind::Broadcast) => 512 << 10,
        (Tuning::Gpu, CollectiveKind::AllToAll) => 1 << 20,
        // On a CPU an LL packet (a flag beside every data word: twice the bytes stored and
        // polled) costs several times a copy: direct was the fastest or within the noise at
        // every size measured, every collective (2 ranks 1 KiB - 16 MiB, 4 ranks 1 KiB -
        // 1 MiB; docs/performance.md). Empty calls stay with LL, as on the GPUs.
        (Tuning::Host, _) => 1,
    }
}

/// All-reduce rank-block bytes LL128 serves when not forced (where it fits: one round). Below,
/// its per-line agreement costs more latency than its 94 % payload saves. GPUs only: on the
/// host backend LL128 took 1.1 to 4.6 times direct's time at every size it fits (2, 4 ranks).
pub(crate) const LL128_RANGE: Range<u64> = (256 << 10)..(2 << 20);

/// All-reduce rank-block bytes for which a registered input takes the read algorithm (zero copy)
/// when the caller promises registration is symmetric ([`crate::CollectiveCall::registered`]):
/// from where direct takes over from LL128 up to what read's staging area bounds anyway. Below,
/// LL and LL128 beat reading in place (docs/performance.md, "Read all-reduce with registered
/// buffers").
pub(crate) const REGISTERED_READ_RANGE: std::ops::RangeInclusive<u64> = (2 << 20)..=(4 << 20);

/// The environment variable forcing `kind`'s algorithm.
fn algo_var(kind: CollectiveKind) -> String {
    format!("MSCCLPP_ALGO_{}", kind.name().to_ascii_uppercase())
}

/// `MSCCLPP_ALGO_<KIND>`'s value `value` (unset: `None`).
pub(crate) fn parse_choice(kind: CollectiveKind, value: Option<&str>) -> Result<Choice> {
    let Some(v) = value else {
        return Ok(Choice::Auto);
    };
    let all_reduce = kind == CollectiveKind::AllReduce;
    Ok(match v.to_ascii_lowercase().as_str() {
        "auto" => Choice::Auto,
        "ll" => Choice::Forced(AlgorithmId::Ll),
        "direct" => Choice::Forced(AlgorithmId::Direct),
        "read" if all_reduce => Choice::Forced(AlgorithmId::Read),
        "ll128" if all_reduce => Choice::Forced(AlgorithmId::Ll128),
        // Every collective (reduce-scatter and all-reduce with a small reduction kernel).
        "ce" => Choice::Forced(AlgorithmId::Ce),
        _ => {
            return Err(Error::invalid(format!(
                "environment variable {}={v:?} is malformed: expected auto, ll or direct{}",
                algo_var(kind),
                if all_reduce {
                    " (or ll128, read, ce)"
                } else {
                    " (or ce)"
                }
            )));
        }
    })
}

/// The choice among the algorithms that fit a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    pub choices: [Choice; 5],
    /// `MSCCLPP_CE_AUTO_BYTES`: rank-block bytes from which a collective chosen by size takes
    /// the copy-engine path where it serves the call (`None`: never).
    pub ce_from: Option<u64>,
    /// Whose thresholds the choice by size follows (the communicator's backend's).
    pub tuning: Tuning,
}

impl Policy {
    /// Whether `kind`'s algorithm is chosen by size (not forced).
    pub fn is_auto(&self, kind: CollectiveKind) -> bool {
        self.choices[kind as usize] == Choice::Auto
    }

    /// The algorithm for `kind` with rank blocks of `block_bytes`; `fits` says which of them
    /// can serve it here ([`AlgorithmId::Ll`] always can).
    pub fn choose(
        &self,
        kind: CollectiveKind,
        block_bytes: u64,
        fits: impl Fn(AlgorithmId) -> bool,
    ) -> AlgorithmId {
        let family = match self.choices[kind as usize] {
            Choice::Forced(a) if fits(a) => a,
            Choice::Auto
                if self.ce_from.is_some_and(|from| block_bytes >= from)
                    && fits(AlgorithmId::Ce) =>
            {
                AlgorithmId::Ce
            }
            _ if self.tuning == Tuning::Gpu
                && fits(AlgorithmId::Ll128)
                && LL128_RANGE.contains(&block_bytes) =>
            {
                AlgorithmId::Ll128
            }
            _ if fits(AlgorithmId::Direct)
                && block_bytes >= direct_threshold(kind, self.tuning) =>
            {
                AlgorithmId::Direct
            }
            _ => AlgorithmId::Ll,
        };
        // The short kernels run LL's protocol: wherever LL serves, they do if they fit.
        match family {
            AlgorithmId::Ll | AlgorithmId::LlShort if fits(AlgorithmId::LlShort) => {
                AlgorithmId::LlShort
            }
            AlgorithmId::LlShort => AlgorithmId::Ll,
            a => a,
        }
    }
}

/// Everything the environment sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    pub policy: Policy,
    /// `MSCCLPP_LL_THREADS`: LL and LL128 blocks of this many threads.
    pub ll_threads: Option<u32>,
    /// `MSCCLPP_LL_PACKETS_PER_BLOCK`: LL blocks per this many packets of a round.
    pub ll_packets_per_block: u64,
    /// `MSCCLPP_LL_SHORT`: whether one-round calls may take the short kernels.
    pub ll_short: bool,
    /// `MSCCLPP_DIRECT_THREADS`: direct blocks of this many threads at every size.
    pub direct_threads: Option<u32>,
    /// `MSCCLPP_DIRECT_SLOT_BYTES`: the direct algorithm's slot size.
    pub direct_slot_bytes: Option<u64>,
    /// `MSCCLPP_READ_THREADS`: read blocks of this many threads.
    pub read_threads: Option<u32>,
    /// `MSCCLPP_CE_SCRATCH_BYTES`: data bytes of the copy-engine scratch per rank.
    pub ce_scratch_bytes: Option<u64>,
}

impl Settings {
    pub fn from_env() -> Result<Settings> {
        use mscclpp_hal::env;
        let mut choices = [Choice::Auto; 5];
        for kind in CollectiveKind::ALL {
            choices[kind as usize] = parse_choice(kind, env::get(&algo_var(kind)).as_deref())?;
        }
        let direct_slot_bytes = match env::parse::<u64>(
            "MSCCLPP_DIRECT_SLOT_BYTES",
            "a byte count",
        )? {
            Some(b) if b >= 4096 && b % 16 == 0 && b <= 16 << 20 => Some(b),
            Some(b) => {
                return Err(Error::invalid(format!(
                    "MSCCLPP_DIRECT_SLOT_BYTES={b}: expected a multiple of 16 from 4096 to 16 MiB"
                )));
            }
            None => None,
        };
        let ce_scratch_bytes = match env::parse::<u64>("MSCCLPP_CE_SCRATCH_BYTES", "a byte count")?
        {
            Some(b) if b >= 4096 && b % 256 == 0 && b <= 1 << 30 => Some(b),
            Some(b) => {
                return Err(Error::invalid(format!(
                    "MSCCLPP_CE_SCRATCH_BYTES={b}: expected a multiple of 256 from 4096 to 1 GiB"
                )));
            }
            None => None,
        };
        let ce_from = match env::parse::<u64>("MSCCLPP_CE_AUTO_BYTES", "a byte count")? {
            Some(0) => {
                return Err(Error::invalid(
                    "MSCCLPP_CE_AUTO_BYTES=0: expected the rank-block bytes from which the \
                     copy engines serve collectives chosen by size (unset: never)",
                ));
            }
            b => b,
        };
        Ok(Settings {
            // The communicator's backend sets its own (`Collectives::on_backend`).
            policy: Policy {
                choices,
                ce_from,
                tuning: Tuning::Gpu,
            },
            ll_threads: threads_per_block(
                "MSCCLPP_LL_THREADS",
                env::parse("MSCCLPP_LL_THREADS", "threads per block")?,
            )?,
            // 256 packets (4 KiB of data) per block.
            ll_packets_per_block: packets_per_block(env::parse(
                "MSCCLPP_LL_PACKETS_PER_BLOCK",
                "a packet count",
            )?)?
            .unwrap_or(256),
            ll_short: env::flag("MSCCLPP_LL_SHORT")?.unwrap_or(true),
            direct_threads: threads_per_block(
                "MSCCLPP_DIRECT_THREADS",
                env::parse("MSCCLPP_DIRECT_THREADS", "threads per block")?,
            )?,
            direct_slot_bytes,
            read_threads: threads_per_block(
                "MSCCLPP_READ_THREADS",
                env::parse("MSCCLPP_READ_THREADS", "threads per block")?,
            )?,
            ce_scratch_bytes,
        })
    }
}

/// The threads per block a kernel may be given (CUDA's and HIP's limit is 1024; below one warp
/// of 32 a block wastes lanes).
pub(crate) const THREADS_RANGE: std::ops::RangeInclusive<u32> = 32..=1024;

/// The packets per LL block `MSCCLPP_LL_PACKETS_PER_BLOCK` may ask for (2^20 packets are 8 MiB
/// of data, more than a round of the largest slot).
pub(crate) const PACKETS_RANGE: std::ops::RangeInclusive<u64> = 1..=1 << 20;

/// A `MSCCLPP_*_THREADS` value, refused (naming the variable and the range) outside
/// [`THREADS_RANGE`] rather than clamped.
pub(crate) fn threads_per_block(name: &str, v: Option<u32>) -> Result<Option<u32>> {
    match v {
        Some(t) if !THREADS_RANGE.contains(&t) => Err(Error::invalid(format!(
            "{name}={t} is out of range: expected {} to {} threads per block",
            THREADS_RANGE.start(),
            THREADS_RANGE.end()
        ))),
        v => Ok(v),
    }
}

/// A `MSCCLPP_LL_PACKETS_PER_BLOCK` value, refused outside [`PACKETS_RANGE`].
pub(crate) fn packets_per_block(v: Option<u64>) -> Result<Option<u64>> {
    match v {
        Some(p) if !PACKETS_RANGE.contains(&p) => Err(Error::invalid(format!(
            "MSCCLPP_LL_PACKETS_PER_BLOCK={p} is out of range: expected {} to {} packets",
            PACKETS_RANGE.start(),
            PACKETS_RANGE.end()
        ))),
        v => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use AlgorithmId::*;
    use CollectiveKind::*;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;

    fn auto() -> Policy {
        Policy {
            choices: [Choice::Auto; 5],
            ce_from: None,
            tuning: Tuning::Gpu,
        }
    }

    fn forced(kind: CollectiveKind, value: &str) -> Policy {
        let mut p = auto();
        p.choices[kind as usize] = parse_choice(kind, Some(value)).unwrap();
        p
    }

    /// A GPU like 2 x H200: every algorithm set up, LL128 up to one round (1.875 MiB), read up
    /// to its staging area, the short kernels up to one LL round (1 MiB).
    fn h200(kind: CollectiveKind, bytes: u64) -> impl Fn(AlgorithmId) -> bool {
        move |a| match a {
            Ll | Direct => true,
            LlShort => kind != Broadcast && bytes > 0 && bytes <= MIB,
            Ll128 => kind == AllReduce && bytes <= 1920 * KIB,
            Read => kind == AllReduce && bytes <= 4 * MIB,
            Ce | Hier => false,
        }
    }

    /// A backend with LL only.
    fn ll_only(a: AlgorithmId) -> bool {
        a == Ll
    }

    #[test]
    fn all_reduce_by_size() {
        let p = auto();
        let at = |b| p.choose(AllReduce, b, h200(AllReduce, b));
        assert_eq!(at(KIB), LlShort);
        assert_eq!(at(255 * KIB), LlShort);
        assert_eq!(at(256 * KIB), Ll128);
        assert_eq!(at(1920 * KIB), Ll128);
        // Past LL128's round and below direct's threshold: LL in rounds.
        assert_eq!(at(1920 * KIB + 4), Ll);
        assert_eq!(at(2 * MIB), Direct);
        assert_eq!(at(1 << 30), Direct);
    }

    #[test]
    fn the_copy_engines_serve_auto_calls_from_their_threshold_only() {
        let mut p = auto();
        p.ce_from = Some(16 * MIB);
        let with_ce = |k, b| move |a| a == Ce || h200(k, b)(a);
        for kind in CollectiveKind::ALL {
            assert_eq!(
                p.choose(kind, 16 * MIB, with_ce(kind, 16 * MIB)),
                Ce,
                "{kind:?}"
            );
            assert_eq!(
                p.choose(kind, 1 << 30, with_ce(kind, 1 << 30)),
                Ce,
                "{kind:?}"
            );
            assert_eq!(
                p.choose(kind, 8 * MIB, with_ce(kind, 8 * MIB)),
                Direct,
                "{kind:?}"
            );
            // Where the copy-engine path cannot serve the call, the usual choice.
            assert_eq!(
                p.choose(kind, 16 * MIB, h200(kind, 16 * MIB)),
                Direct,
                "{kind:?}"
            );
        }
        // A forced algorithm wins over the threshold.
        let mut f = forced(AllGather, "direct");
        f.ce_from = Some(KIB);
        assert_eq!(f.choose(AllGather, MIB, with_ce(AllGather, MIB)), Direct);
        // Unset: never.
        let q = auto();
        assert_eq!(
            q.choose(AllGather, 1 << 30, with_ce(AllGather, 1 << 30)),
            Direct
        );
    }

    #[test]
    fn thresholds_per_collective() {
        let p = auto();
        let at = |k, b| p.choose(k, b, h200(k, b));
        assert_eq!(at(Broadcast, 256 * KIB), Ll);
        assert_eq!(at(Broadcast, 512 * KIB), Direct);
        assert_eq!(at(AllToAll, 512 * KIB), LlShort);
        assert_eq!(at(AllToAll, MIB), Direct);
        assert_eq!(at(AllGather, MIB), LlShort);
        assert_eq!(at(AllGather, 2 * MIB - 2), Ll);
        assert_eq!(at(ReduceScatter, 2 * MIB), Direct);
        // LL128 serves all-reduce only.
        assert_eq!(at(AllGather, 512 * KIB), LlShort);
    }

    /// The host backend: every algorithm set up; LL128 (all-reduce) and the short kernels
    /// (not broadcast) up to one round of the default 2 MiB slot.
    fn host(kind: CollectiveKind, bytes: u64) -> impl Fn(AlgorithmId) -> bool {
        move |a| match a {
            Ll | Direct => true,
            LlShort => kind != Broadcast && bytes > 0 && bytes <= MIB,
            Ll128 => kind == AllReduce && bytes <= 1920 * KIB,
            Read => kind == AllReduce && bytes <= 4 * MIB,
            Ce | Hier => false,
        }
    }

    fn on_host(mut p: Policy) -> Policy {
        p.tuning = Tuning::Host;
        p
    }

    #[test]
    fn the_backend_picks_its_tuning() {
        assert_eq!(Tuning::of(BackendKind::Host), Tuning::Host);
        assert_eq!(Tuning::of(BackendKind::Cuda), Tuning::Gpu);
        assert_eq!(Tuning::of(BackendKind::Rocm), Tuning::Gpu);
    }

    #[test]
    fn the_host_backend_takes_direct_for_every_non_empty_call() {
        // The host backend's own measurements chose direct at every size (docs/performance.md,
        // "Host backend: the choice by size").
        let p = on_host(auto());
        for kind in CollectiveKind::ALL {
            for b in [1, KIB, 64 * KIB, 512 * KIB, MIB, 2 * MIB, 16 * MIB, 1 << 30] {
                assert_eq!(p.choose(kind, b, host(kind, b)), Direct, "{kind:?} {b}");
            }
            // An empty call runs no data: LL, as on the GPUs.
            assert_eq!(p.choose(kind, 0, host(kind, 0)), Ll, "{kind:?}");
            // Without the direct algorithm: LL (its short kernels where they fit).
            assert_eq!(p.choose(kind, MIB, ll_only), Ll, "{kind:?}");
        }
        // A forced algorithm still wins on the host.
        let ll = on_host(forced(AllGather, "ll"));
        assert_eq!(ll.choose(AllGather, KIB, host(AllGather, KIB)), LlShort);
        assert_eq!(ll.choose(AllGather, 4 * MIB, host(AllGather, 4 * MIB)), Ll);
        let ll128 = on_host(forced(AllReduce, "ll128"));
        assert_eq!(
            ll128.choose(AllReduce, 512 * KIB, host(AllReduce, 512 * KIB)),
            Ll128
        );
        // The copy-engine threshold applies there too.
        let mut ce = on_host(auto());
        ce.ce_from = Some(MIB);
        let with_ce = |k, b| move |a| a == Ce || host(k, b)(a);
        assert_eq!(ce.choose(AllToAll, MIB, with_ce(AllToAll, MIB)), Ce);
        assert_eq!(ce.choose(AllToAll, KIB, with_ce(AllToAll, KIB)), Direct);
    }

    /// The GPUs' choice before the host backend had its own tuning, copied here: the host's
    /// thresholds must not move a GPU's choice.
    fn gpu_choice_before(
        kind: CollectiveKind,
        b: u64,
        fits: impl Fn(AlgorithmId) -> bool,
    ) -> AlgorithmId {
        let family = if fits(Ll128) && ((256 * KIB)..(2 * MIB)).contains(&b) {
            Ll128
        } else if fits(Direct)
            && b >= match kind {
                AllReduce | AllGather | ReduceScatter => 2 * MIB,
                Broadcast => 512 * KIB,
                AllToAll => MIB,
            }
        {
            Direct
        } else {
            Ll
        };
        if family == Ll && fits(LlShort) {
            LlShort
        } else {
            family
        }
    }

    #[test]
    fn the_gpu_choice_is_unchanged_by_the_host_tuning() {
        let p = auto();
        let mut sizes = vec![0, 1, 4, 1000];
        // Every power of two from 1 KiB to 1 GiB, and its neighbours.
        for e in 10..=30 {
            sizes.extend([(1u64 << e) - 4, 1 << e, (1 << e) + 4]);
        }
        sizes.push(1920 * KIB);
        sizes.push(1920 * KIB + 4);
        for kind in CollectiveKind::ALL {
            for &b in &sizes {
                assert_eq!(
                    p.choose(kind, b, h200(kind, b)),
                    gpu_choice_before(kind, b, h200(kind, b)),
                    "{kind:?} {b}"
                );
                assert_eq!(p.choose(kind, b, ll_only), Ll, "{kind:?} {b}");
            }
        }
        // The same sizes on the host differ (LL, LL128, short kernels below the GPUs'
        // thresholds), so the two tunings are really apart.
        let h = on_host(auto());
        assert_ne!(
            h.choose(AllGather, MIB, h200(AllGather, MIB)),
            p.choose(AllGather, MIB, h200(AllGather, MIB))
        );
        assert_ne!(
            h.choose(AllReduce, MIB, h200(AllReduce, MIB)),
            p.choose(AllReduce, MIB, h200(AllReduce, MIB))
        );
    }

    #[test]
    fn without_direct_or_ll128_everything_is_ll() {
        let p = auto();
        for kind in CollectiveKind::ALL {
            for b in [KIB, MIB, 1 << 30] {
                assert_eq!(p.choose(kind, b, ll_only), Ll, "{kind:?} {b}");
            }
        }
    }

    #[test]
    fn the_environment_forces_per_collective() {
        let ll = forced(AllReduce, "LL");
        assert_eq!(
            ll.choose(AllReduce, 64 * MIB, h200(AllReduce, 64 * MIB)),
            Ll
        );
        // Forcing LL still lets one-round calls take the short kernels.
        assert_eq!(
            ll.choose(AllReduce, 512 * KIB, h200(AllReduce, 512 * KIB)),
            LlShort
        );
        // Other collectives keep the default.
        assert_eq!(
            ll.choose(AllGather, 64 * MIB, h200(AllGather, 64 * MIB)),
            Direct
        );
        let direct = forced(Broadcast, "direct");
        assert_eq!(direct.choose(Broadcast, KIB, h200(Broadcast, KIB)), Direct);
        let read = forced(AllReduce, "read");
        assert_eq!(read.choose(AllReduce, KIB, h200(AllReduce, KIB)), Read);
        let ll128 = forced(AllReduce, "ll128");
        assert_eq!(ll128.choose(AllReduce, KIB, h200(AllReduce, KIB)), Ll128);
    }

    #[test]
    fn a_forced_algorithm_that_cannot_serve_leaves_the_default() {
        let read = forced(AllReduce, "read");
        assert_eq!(
            read.choose(AllReduce, 8 * MIB, h200(AllReduce, 8 * MIB)),
            Direct
        );
        let ll128 = forced(AllReduce, "ll128");
        assert_eq!(
            ll128.choose(AllReduce, 4 * MIB, h200(AllReduce, 4 * MIB)),
            Direct
        );
        assert_eq!(ll128.choose(AllReduce, KIB, ll_only), Ll);
        let direct = forced(AllGather, "direct");
        assert_eq!(direct.choose(AllGather, 64 * MIB, ll_only), Ll);
    }

    #[test]
    fn ce_is_forced_for_every_collective_and_never_chosen_by_size() {
        let with_ce = |kind, b| move |a| a == Ce || h200(kind, b)(a);
        for kind in CollectiveKind::ALL {
            let ce = forced(kind, "CE");
            for b in [0, KIB, 64 * MIB, 1 << 30] {
                assert_eq!(ce.choose(kind, b, with_ce(kind, b)), Ce, "{kind:?} {b}");
                assert_ne!(auto().choose(kind, b, with_ce(kind, b)), Ce, "{kind:?} {b}");
            }
        }
        assert_eq!(
            parse_choice(AllReduce, Some("ce")).unwrap(),
            Choice::Forced(Ce)
        );
        let e = parse_choice(AllGather, Some("fast"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("(or ce)"), "{e}");
    }

    #[test]
    fn malformed_choices_name_the_variable_and_the_accepted_values() {
        assert_eq!(parse_choice(AllReduce, None).unwrap(), Choice::Auto);
        assert_eq!(parse_choice(AllGather, Some("Auto")).unwrap(), Choice::Auto);
        let e = parse_choice(AllGather, Some("ll128"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("MSCCLPP_ALGO_ALLGATHER") && e.contains("auto, ll or direct"),
            "{e}"
        );
        let e = parse_choice(AllReduce, Some("fast"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("MSCCLPP_ALGO_ALLREDUCE") && e.contains("ll128, read, ce"),
            "{e}"
        );
    }

    #[test]
    fn thread_and_packet_counts_out_of_range_are_refused_naming_the_variable() {
        for (name, bad) in [
            ("MSCCLPP_LL_THREADS", 0),
            ("MSCCLPP_DIRECT_THREADS", 100_000),
            ("MSCCLPP_READ_THREADS", 31),
        ] {
            let e = threads_per_block(name, Some(bad)).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains("32 to 1024"), "{e}");
        }
        assert_eq!(threads_per_block("X", Some(256)).unwrap(), Some(256));
        assert_eq!(threads_per_block("X", None).unwrap(), None);
        let e = packets_per_block(Some(0)).unwrap_err().to_string();
        assert!(
            e.contains("MSCCLPP_LL_PACKETS_PER_BLOCK") && e.contains("1 to"),
            "{e}"
        );
        assert_eq!(packets_per_block(Some(256)).unwrap(), Some(256));
    }
}
