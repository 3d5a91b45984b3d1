//! The host kernel of `mscclpp_p2p`: every channel-lane of the launch as a state machine, all
//! advanced by one worker in turn (a GPU runs them as concurrent blocks), so that a rank's sends
//! to and receives from a peer never wait on each other — exactly the protocol of `spec.md` and
//! `kernels/collectives/p2p.cu`.

use std::sync::atomic::Ordering;
use std::time::Instant;

use mscclpp_hal::dev::{DEFAULT_WAIT, LL16Packet};
use mscclpp_hal::{Error, KernelArgs, LaunchConfig, Result};

use super::args::{P2P_MAX_CHANNELS, P2P_MAX_LANES, P2P_MAX_OPS, P2pArgs};
use crate::algorithms::host_common::{check_ranks, load, store, word};

/// One look at the packet at `addr`: its data when both halves carry `flag`.
///
/// # Safety
/// `addr` must be a 16-byte aligned packet slot of live device memory.
unsafe fn try_packet(addr: u64, flag: u32) -> Option<u64> {
    let (lo, hi) = (word(addr, 0), word(addr, 8));
    let a = lo.load(Ordering::Relaxed);
    let b = hi.load(Ordering::Relaxed);
    ((a >> 32) as u32 == flag && (b >> 32) as u32 == flag).then_some((a & 0xffff_ffff) | (b << 32))
}

fn check(a: &P2pArgs, blocks: u64) -> Result<()> {
    check_ranks("point-to-point", a.rank, a.nranks)?;
    let n = a.nranks as usize;
    if a.lanes == 0 || a.lanes > P2P_MAX_LANES || a.nchannels as usize > P2P_MAX_CHANNELS {
        return Err(Error::invalid(format!(
            "point-to-point launch of {} channels of {} lanes",
            a.nchannels, a.lanes
        )));
    }
    if a.slot_bytes < 32 || a.slot_bytes % 16 != 0 {
        return Err(Error::invalid(format!(
            "point-to-point slot of {} bytes: a multiple of 16 from 32 is needed",
            a.slot_bytes
        )));
    }
    if a.peer_scratch[..n].contains(&0)
        || a.scratch != a.peer_scratch[a.rank as usize]
        || a.scratch % 128 != 0
    {
        return Err(Error::invalid(
            "point-to-point without (128-aligned) scratch memory",
        ));
    }
    if blocks == 0 {
        return Err(Error::invalid("point-to-point launch of no blocks"));
    }
    for c in &a.channels[..a.nchannels as usize] {
        let end = c.first_op as usize + c.nops as usize;
        if c.peer >= a.nranks || c.peer == a.rank || end > P2P_MAX_OPS || c.send > 1 {
            return Err(Error::invalid(format!(
                "point-to-point channel {c:?} of rank {} of {}",
                a.rank, a.nranks
            )));
        }
    }
    Ok(())
}

/// Where a channel-lane is in its current operation.
#[derive(Debug, Clone, Copy)]
struct Cur {
    /// The operation's buffer and bytes (the receiver's own expectation).
    addr: u64,
    bytes: u64,
    /// The part this lane carries (sends: known at once; receives: from the header).
    part_off: u64,
    part_bytes: u64,
    /// Packets of the lane's stream and rounds; `None` on a receive until its header arrived.
    packets: Option<u64>,
    /// The current round and the next packet of it to read (receives).
    round: u64,
    next: u64,
}

struct Lane {
    peer: u32,
    send: bool,
    lane: u32,
    ops: std::ops::Range<usize>,
    op: usize,
    seq: u64,
    cur: Option<Cur>,
    done: bool,
}

/// The host kernel.
pub fn p2p(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = P2pArgs::from_bytes(args)?;
    check(&a, cfg.num_blocks())?;
    let (rank, lanes) = (a.rank, a.lanes);
    let packets_per_round = a.slot_bytes / 16;
    let mut all: Vec<Lane> = Vec::new();
    for c in &a.channels[..a.nchannels as usize] {
        for lane in 0..lanes {
            let seq_off = if c.send == 1 {
                P2pArgs::send_seq_offset(lanes, c.peer, lane)
            } else {
                P2pArgs::recv_seq_offset(lanes, c.peer, lane)
            };
            all.push(Lane {
                peer: c.peer,
                send: c.send == 1,
                lane,
                ops: c.first_op as usize..(c.first_op + c.nops) as usize,
                op: c.first_op as usize,
                seq: word(a.scratch, seq_off).load(Ordering::Acquire),
                cur: None,
                done: false,
            });
        }
    }
    let mut errors: Vec<String> = Vec::new();
    let mut last_progress = Instant::now();
    let mut spins = 0u32;
    while all.iter().any(|l| !l.done) {
        let mut progress = false;
        for l in all.iter_mut().filter(|l| !l.done) {
            // SAFETY: the launcher vouched for the buffers of the operations and the scratch
            // mappings; offsets stay inside the layout of `lanes` and `slot_bytes`.
            progress |= unsafe { step(&a, l, packets_per_round, &mut errors) };
        }
        if progress {
            last_progress = Instant::now();
            spins = 0;
        } else {
            spins += 1;
            if spins > 64 {
                // A dead peer (or an abort) ends the group at once, naming the rank.
                mscclpp_hal::dev::check_abort(|| {
                    format!("point-to-point operations on rank {rank}")
                })?;
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            if last_progress.elapsed() > DEFAULT_WAIT {
                let waiting: Vec<String> = all
                    .iter()
                    .filter(|l| !l.done)
                    .map(|l| {
                        format!(
                            "{} rank {} (operation {} of the group, lane {})",
                            if l.send { "send to" } else { "receive from" },
                            l.peer,
                            l.op,
                            l.lane
                        )
                    })
                    .collect();
                return Err(Error::Timeout {
                    waiting_for: format!(
                        "point-to-point on rank {rank}: progress on {} (does every send have a matching receive on its peer, in the same order?)",
                        waiting.join(", ")
                    ),
                    after: DEFAULT_WAIT,
                });
            }
        }
    }
    for l in &all {
        let off = if l.send {
            P2pArgs::send_seq_offset(lanes, l.peer, l.lane)
        } else {
            P2pArgs::recv_seq_offset(lanes, l.peer, l.lane)
        };
        word(a.scratch, off).store(l.seq, Ordering::Release);
    }
    if !errors.is_empty() {
        return Err(Error::invalid(errors.join("; ")));
    }
    Ok(())
}

/// Advances one channel-lane as far as it can without waiting; whether it moved.
///
/// # Safety
/// As for [`p2p`]'s body.
unsafe fn step(a: &P2pArgs, l: &mut Lane, per_round: u64, errors: &mut Vec<String>) -> bool {
    let lanes = a.lanes;
    let mut progress = false;
    loop {
        if l.cur.is_none() {
            // The next operation this lane takes part in.
            loop {
                if l.op >= l.ops.end {
                    l.done = true;
                    return true;
                }
                let d = a.ops[l.op];
                let used = P2pArgs::lanes_used(d.bytes, a.lane_min_bytes, lanes);
                if d.bytes == 0 || l.lane >= used {
                    l.op += 1;
                    continue;
                }
                let (part_off, part_bytes) = P2pArgs::lane_part(d.bytes, used, l.lane);
                l.cur = Some(Cur {
                    addr: d.addr,
                    bytes: d.bytes,
                    part_off,
                    part_bytes,
                    packets: l.send.then(|| P2pArgs::stream_packets(part_bytes)),
                    round: 0,
                    next: 0,
                });
                break;
            }
        }
        let Some(mut c) = l.cur else { return progress };
        let f = l.seq + 1 + c.round;
        let half = f % 2;
        let moved = if l.send {
            let packets = c.packets.unwrap_or(1);
            let ack = word(a.scratch, P2pArgs::ack_offset(lanes, l.peer, l.lane));
            if f > 2 && ack.load(Ordering::Acquire) < f - 2 {
                false
            } else {
                let slot = a.peer_scratch[l.peer as usize]
                    + P2pArgs::slot_offset(lanes, a.slot_bytes, a.rank, l.lane, half);
                let first = c.round * per_round;
                let last = (first + per_round).min(packets);
                for j in first..last {
                    let v = if j == 0 {
                        c.bytes
                    } else {
                        let at = 8 * (j - 1);
                        let n = (c.part_bytes - at).min(8);
                        // SAFETY: within the part of the send buffer (launcher's contract).
                        unsafe { load(c.addr + c.part_off + at, n) }
                    };
                    // SAFETY: a packet of the peer's slot for this rank and lane.
                    unsafe { LL16Packet::write(slot + 16 * (j - first), v, f as u32) };
                }
                c.round += 1;
                true
            }
        } else {
            let slot = a.scratch + P2pArgs::slot_offset(lanes, a.slot_bytes, l.peer, l.lane, half);
            let first = c.round * per_round;
            let mut moved = false;
            loop {
                let last = match c.packets {
                    Some(p) => (first + per_round).min(p),
                    None => first + 1,
                };
                if c.next >= last {
                    break;
                }
                let j = c.next;
                // SAFETY: a packet of this rank's slot for the peer and lane.
                let Some(v) = (unsafe { try_packet(slot + 16 * (j - first), f as u32) }) else {
                    break;
                };
                moved = true;
                if j == 0 {
                    // The header: the sender's bytes decide the stream.
                    let sent = v;
                    let used = P2pArgs::lanes_used(sent, a.lane_min_bytes, lanes);
                    let (off, part) = P2pArgs::lane_part(sent, used, l.lane);
                    if sent != c.bytes {
                        errors.push(format!(
                            "rank {} sent {sent} bytes to rank {}, which receives {} bytes: a send and its receive must have the same size",
                            l.peer, a.rank, c.bytes
                        ));
                    }
                    c.part_off = off;
                    c.part_bytes = part;
                    c.packets = Some(P2pArgs::stream_packets(part));
                } else {
                    let at = c.part_off + 8 * (j - 1);
                    // Only what fits the receive buffer is stored.
                    if at < c.bytes {
                        let n = (c.part_off + c.part_bytes - at).min(8).min(c.bytes - at);
                        // SAFETY: within the receive buffer (checked just above).
                        unsafe { store(c.addr + at, v, n) };
                    }
                }
                c.next += 1;
            }
            let packets = c.packets.unwrap_or(u64::MAX);
            let round_end = (first + per_round).min(packets);
            if c.packets.is_some() && c.next >= round_end {
                // The round is read: acknowledge it to the sender.
                std::sync::atomic::fence(Ordering::SeqCst);
                word(
                    a.peer_scratch[l.peer as usize],
                    P2pArgs::ack_offset(lanes, a.rank, l.lane),
                )
                .store(f, Ordering::Release);
                c.round += 1;
                moved = true;
            }
            moved
        };
        if !moved {
            l.cur = Some(c);
            return progress;
        }
        progress = true;
        let packets = c.packets.unwrap_or(u64::MAX);
        if c.packets.is_some() && c.round * per_round >= packets {
            l.seq += c.round;
            l.op += 1;
            l.cur = None;
        } else {
            l.cur = Some(c);
        }
    }
}
