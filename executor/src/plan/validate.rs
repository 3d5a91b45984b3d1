//! Checks of decoded values: the plan-wide settings, a rank's channel counts, a buffer
//! reference's chunk range, and the shape each operation's sources and destinations must have
//! for the interpreter kernel to run it. The decoder calls them once the value is read; they
//! read no JSON, so they state the rules apart from how a plan spells them.

use mscclpp_hal::Result;

use super::json::{Path, bad};
use super::limits::MAX_PER_RANK;
use super::types::{BufRef, ChannelType, Gpu, Op, OpKind, Target};

/// `buffer_alignment`: chunk boundaries are multiples of it.
pub(super) fn check_alignment(alignment: u64, path: &Path) -> Result<()> {
    if alignment == 0 || alignment > 1 << 20 || alignment % 4 != 0 {
        return Err(bad(
            path,
            format!("{alignment}: a multiple of 4 from 4 to 1 MiB is needed"),
        ));
    }
    Ok(())
}

/// `num_threads_per_block`: at most the 1024 threads a block can have.
pub(super) fn check_threads(threads: u64, path: &Path) -> Result<()> {
    if !(1..=1024).contains(&threads) {
        return Err(bad(path, format!("{threads}: 1 to 1024 expected")));
    }
    Ok(())
}

/// A rank's channels of each type, flattened, fit the device's byte-sized indexes.
pub(super) fn check_channel_counts(gpu: &Gpu, ch_path: &Path) -> Result<()> {
    for ty in [ChannelType::Memory, ChannelType::Port] {
        let n = gpu.peers(ty).len();
        if n > MAX_PER_RANK {
            return Err(bad(
                ch_path,
                format!("{n} {} channels, at most {MAX_PER_RANK}", ty.name()),
            ));
        }
    }
    if gpu.switch_channels().len() > MAX_PER_RANK {
        return Err(bad(
            ch_path,
            format!("more than {MAX_PER_RANK} switch channels"),
        ));
    }
    Ok(())
}

/// Chunks `index..index + size` lie inside `what`, which has `chunks`.
pub(super) fn check_chunk_range(
    index: u64,
    size: u64,
    chunks: u64,
    what: &str,
    path: &Path,
) -> Result<()> {
    if index.checked_add(size).is_none_or(|end| end > chunks) {
        return Err(bad(
            path,
            format!(
                "chunks {index}..{} lie past the end of {what}, which has {chunks}",
                index.saturating_add(size)
            ),
        ));
    }
    Ok(())
}

/// Checks that the sources and destinations of `op` have the shape its semantics need.
pub(super) fn check_shape(op: &Op, path: &Path) -> Result<()> {
    use OpKind as K;
    let local = |b: &BufRef| matches!(b.target, Target::Local(_));
    let remote = |b: &BufRef| matches!(b.target, Target::Remote { .. });
    let switch = |b: &BufRef| matches!(b.target, Target::Switch { .. });
    let need = |ok: bool, why: &str| -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(bad(path, format!("{}: {why}", op.kind)))
        }
    };
    let (s, d) = (&op.src, &op.dst);
    let first_local = |v: &Vec<BufRef>| v.first().is_some_and(local);
    let ch = op.channel_type;
    match op.kind {
        K::Nop
        | K::Barrier
        | K::Signal
        | K::Wait
        | K::RelaxedSignal
        | K::RelaxedWait
        | K::Flush
        | K::SemAcquire
        | K::SemRelease
        | K::Pipeline => Ok(()),
        K::Copy | K::CopyPackets | K::UnpackPackets => need(
            s.len() == 1 && d.len() == 1 && local(&s[0]) && local(&d[0]),
            "one local source and one local destination expected",
        ),
        K::Put | K::PutWithSignal | K::PutWithSignalAndFlush | K::PutPackets => {
            need(
                !d.is_empty() && d.iter().all(remote) && s.iter().all(local) && !s.is_empty(),
                "local sources and remote destinations expected",
            )?;
            need(
                ch != Some(ChannelType::Switch) && ch.is_some(),
                "a memory or port channel_type expected",
            )?;
            if ch == Some(ChannelType::Port) {
                need(
                    op.channels.len() == d.len() && s.len() == d.len(),
                    "one channel and one source per destination expected through port channels",
                )?;
            }
            need(
                s.len() == d.len() || s.len() == 1,
                "one source per destination (or one source) expected",
            )
        }
        K::ReadPutPackets => need(
            s.len() == 1 && local(&s[0]) && !d.is_empty() && d.iter().all(remote),
            "one local source and remote destinations expected",
        ),
        K::Get => need(
            !s.is_empty() && s.len() == d.len() && s.iter().all(remote) && d.iter().all(local),
            "remote sources and as many local destinations expected",
        ),
        K::Reduce | K::ReducePackets => need(
            s.len() >= 2 && s.iter().all(local) && d.len() == 1 && local(&d[0]),
            "local sources (at least 2) and one local destination expected",
        ),
        K::ReduceSend | K::ReduceSendPackets => need(
            s.len() >= 2 && s.iter().all(local) && first_local(d) && d[1..].iter().all(remote),
            "local sources, a local destination and remote destinations expected",
        ),
        K::ReduceCopyPackets => need(
            s.len() >= 2 && s.iter().all(local) && d.len() == 2 && d.iter().all(local),
            "local sources, a local destination and a local packet copy expected",
        ),
        K::ReduceCopySendPackets => need(
            s.len() >= 2
                && s.iter().all(local)
                && d.len() >= 2
                && local(&d[0])
                && local(&d[1])
                && d[2..].iter().all(remote),
            "local sources, a local destination, a local packet copy and remote destinations expected",
        ),
        K::ReadReduce | K::ReadReduceSend => need(
            first_local(s)
                && s.len() >= 2
                && s[1..].iter().all(remote)
                && first_local(d)
                && (op.kind == K::ReadReduceSend || d.len() == 1)
                && d[1..].iter().all(remote),
            "a local source, remote sources, a local destination (and remote destinations) expected",
        ),
        K::MultiLoadReduceStore => need(
            s.len() == 1 && d.len() == 1 && switch(&s[0]) && switch(&d[0]),
            "a switch source and a switch destination expected",
        ),
        K::MultiStore | K::MultiStorePackets => need(
            s.len() == 1 && d.len() == 1 && local(&s[0]) && switch(&d[0]),
            "a local source and a switch destination expected",
        ),
    }
}
