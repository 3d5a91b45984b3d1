//! The host interpreter: the executor kernel's host function, which runs each block of a
//! rank's [`DevicePlan`] on a thread of its own. Blocks of one rank wait for each other (barriers,
//! semaphores) and for the peers' blocks, so all must run at once.

use std::sync::atomic::Ordering;
use std::time::Duration;

use mscclpp_hal::dev::{
    BaseMemoryChannelDeviceHandle, DEFAULT_WAIT, LL16Packet, PortChannelDeviceHandle, abort_scope,
    atomic_u64_at, current_abort, spin_until,
};
use mscclpp_hal::{DataType, Error, KernelArgs, LaunchConfig, ReduceOp, Result};

use crate::flat::{
    CHANNEL_MEMORY, CHANNEL_PORT, FlatBlock, FlatOp, FlatRef, MAX_IDS, MAX_REFS, REF_LOCAL,
    REF_REMOTE_MEMORY, REF_SWITCH,
};
use crate::plan::OpKind;

use super::{DevicePlan, ExecutorArgs, MAX_SWITCH_MEMBERS, STATE_HEADER_WORDS};

/// The host interpreter (see the module doc).
pub(super) fn host_executor(_cfg: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let args = ExecutorArgs::from_bytes(bytes)?;
    if args.plan == 0 || args.state == 0 {
        return Err(Error::invalid(
            "executor kernel launched without a plan or state",
        ));
    }
    // SAFETY: the executor's launch points `plan` at a live DevicePlan in device memory of this
    // process that nothing writes while kernels run.
    let plan: DevicePlan = unsafe { std::ptr::read(args.plan as *const DevicePlan) };
    let dtype = DataType::from_code(args.dtype)?;
    let op = match args.op {
        u32::MAX => None,
        c => Some(ReduceOp::from_code(c)?),
    };
    // SAFETY: the state block is live, 8-byte aligned device memory of this context, accessed
    // only atomically.
    let last = unsafe { atomic_u64_at(args.state) }.load(Ordering::Acquire);
    // One flag per launch, never reset: packets of earlier launches never match a later one.
    let flag = (last + 1) as u32;
    let half = if args.double_scratch != 0 && flag % 2 == 0 {
        args.scratch_bytes / 2
    } else {
        0
    };
    let switch = read_switch_table(&args)?;
    let cx = Exec {
        plan,
        args,
        dtype,
        op,
        flag,
        half,
        timeout: DEFAULT_WAIT,
        switch,
    };
    let n = plan.n_blocks as usize;
    // The launch's abort word (installed by the stream around this kernel): every block thread
    // polls it too, so a dead peer ends every block's wait, as for_each_block does.
    let abort = current_abort();
    let result = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|b| {
                let cx = &cx;
                std::thread::Builder::new()
                    .name(format!("executor-block-{b}"))
                    .spawn_scoped(s, move || {
                        let _abort = abort_scope(abort);
                        cx.run_block(b)
                    })
            })
            .collect();
        let mut first = Ok(());
        for h in handles {
            let r = match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(Error::Internal("an executor block panicked".into()))),
                Err(e) => Err(Error::io("spawning an executor block thread", e)),
            };
            if first.is_ok() {
                first = r;
            }
        }
        first
    });
    // Every block has read the flag: the next launch (after this one, on the same stream) uses
    // the next one.
    // SAFETY: as above.
    unsafe { atomic_u64_at(args.state) }.store(last + 1, Ordering::Release);
    result
}

/// Reads the emulated switch channels after the semaphores of the state block
/// ([`switch_table_words`]).
fn read_switch_table(args: &ExecutorArgs) -> Result<Vec<Vec<u64>>> {
    let base = args.state + 8 * (STATE_HEADER_WORDS as u64 + u64::from(args.n_semaphores));
    // SAFETY: the executor writes the table (at least its count word) after the semaphores of
    // every context's state block, which lives as long as the context; words are read only.
    let word = |i: u64| unsafe { atomic_u64_at(base + 8 * i) }.load(Ordering::Acquire);
    let n = word(0);
    if n > crate::plan::MAX_PER_RANK as u64 {
        return Err(Error::Internal(format!(
            "{n} switch channels in the state block"
        )));
    }
    let mut at = 1;
    let mut out = Vec::with_capacity(n as usize);
    for c in 0..n {
        let m = word(at);
        if m > MAX_SWITCH_MEMBERS as u64 {
            return Err(Error::Internal(format!(
                "switch channel {c} with {m} members in the state block"
            )));
        }
        out.push((0..m).map(|k| word(at + 1 + k)).collect());
        at += 1 + m;
    }
    Ok(out)
}

struct Exec {
    plan: DevicePlan,
    args: ExecutorArgs,
    dtype: DataType,
    op: Option<ReduceOp>,
    flag: u32,
    /// Offset of the scratch half this launch uses.
    half: u64,
    timeout: Duration,
    /// Emulated switch channels: every member's address of the channel's buffer.
    switch: Vec<Vec<u64>>,
}

/// A data offset into each op's ranges (pipelines) and the most bytes it may take.
#[derive(Clone, Copy)]
struct Slice {
    offset: u64,
    unit: u64,
}

const WHOLE: Slice = Slice {
    offset: 0,
    unit: u64::MAX,
};

impl Exec {
    fn run_block(&self, b: usize) -> Result<()> {
        // SAFETY: `blocks` holds `n_blocks` records (built by the executor) and b < n_blocks.
        let block: FlatBlock =
            unsafe { std::ptr::read((self.plan.blocks as *const FlatBlock).add(b)) };
        let end = block
            .first_op
            .checked_add(block.n_ops)
            .filter(|&e| e <= self.plan.n_ops);
        let end = end.ok_or_else(|| Error::Internal(format!("block {b} runs past the ops")))?;
        let mut i = block.first_op;
        while i < end {
            let op = self.op_at(i);
            if op.code == OpKind::Pipeline.code() {
                let body = op.c;
                if i + 1 + body > end {
                    return Err(Error::Internal(format!(
                        "pipeline of block {b} runs past its ops"
                    )));
                }
                for it in 0..op.b {
                    let s = Slice {
                        offset: u64::from(it) * u64::from(op.a),
                        unit: u64::from(op.a),
                    };
                    for k in 0..body {
                        self.run_op(&self.op_at(i + 1 + k), s).map_err(|e| {
                            e.with_context(|| format!("block {b} op {}", i + 1 + k))
                        })?;
                    }
                }
                i += 1 + body;
            } else {
                self.run_op(&op, WHOLE)
                    .map_err(|e| e.with_context(|| format!("block {b} op {i}")))?;
                i += 1;
            }
        }
        Ok(())
    }

    fn op_at(&self, i: u32) -> FlatOp {
        // SAFETY: `ops` holds `n_ops` records and callers keep i < n_ops.
        unsafe { std::ptr::read((self.plan.ops as *const FlatOp).add(i as usize)) }
    }

    fn reduce_op(&self, op: &FlatOp) -> Result<ReduceOp> {
        match self.op {
            Some(o) => Ok(o),
            None => ReduceOp::from_code(u32::from(op.reduce)),
        }
    }

    /// The base address of a local buffer (`buffer` of a [`FlatRef`]).
    fn local_base(&self, buffer: u8) -> Result<u64> {
        match buffer {
            0 => Ok(self.args.input),
            1 => Ok(self.args.output),
            2 => Ok(self.args.scratch + self.half),
            b => Err(Error::Internal(format!("buffer type {b}"))),
        }
    }

    /// The scratch half offset when `r` points into a scratch buffer (ours or a peer's: every
    /// rank's launch uses the same flag, hence the same half).
    fn half_of(&self, r: &FlatRef) -> u64 {
        if r.buffer == 2 { self.half } else { 0 }
    }

    /// The address of `r` plus `extra` bytes, for local and memory-channel references.
    fn addr(&self, r: &FlatRef, extra: u64) -> Result<u64> {
        match r.kind {
            REF_LOCAL => Ok(self.local_base(r.buffer)? + r.offset + extra),
            REF_REMOTE_MEMORY => {
                let base = self.remote_addr(r.id)?;
                Ok(base + self.half_of(r) + r.offset + extra)
            }
            k => Err(Error::unavailable(
                format!("buffer reference kind {k} where an address is needed"),
                "a switch (multicast) buffer has no one address: only NVLS operations take it",
            )),
        }
    }

    fn remote_addr(&self, id: u8) -> Result<u64> {
        if u32::from(id) >= self.plan.n_remote {
            return Err(Error::Internal(format!("remote buffer {id} out of range")));
        }
        // SAFETY: `remote_addrs` holds n_remote entries.
        let a = unsafe { std::ptr::read((self.plan.remote_addrs as *const u64).add(id as usize)) };
        if a == 0 {
            return Err(Error::Internal(format!(
                "remote buffer {id} is not mapped here (declared for port access only)"
            )));
        }
        Ok(a)
    }

    fn remote_id(&self, id: u8) -> Result<u32> {
        if u32::from(id) >= self.plan.n_remote {
            return Err(Error::Internal(format!("remote buffer {id} out of range")));
        }
        // SAFETY: `remote_ids` holds n_remote entries.
        let m = unsafe { std::ptr::read((self.plan.remote_ids as *const u32).add(id as usize)) };
        if m == u32::MAX {
            return Err(Error::Internal(format!(
                "remote buffer {id} has no proxy memory id (declared for memory access only)"
            )));
        }
        Ok(m)
    }

    fn memory_channel(&self, idx: u8) -> Result<BaseMemoryChannelDeviceHandle> {
        if u32::from(idx) >= self.plan.n_memory {
            return Err(Error::Internal(format!(
                "memory channel {idx} out of range"
            )));
        }
        // SAFETY: the table holds n_memory handles.
        Ok(unsafe {
            std::ptr::read(
                (self.plan.memory_channels as *const BaseMemoryChannelDeviceHandle)
                    .add(idx as usize),
            )
        })
    }

    fn port_channel(&self, idx: u8) -> Result<PortChannelDeviceHandle> {
        if u32::from(idx) >= self.plan.n_port {
            return Err(Error::Internal(format!("port channel {idx} out of range")));
        }
        // SAFETY: the table holds n_port handles.
        Ok(unsafe {
            std::ptr::read(
                (self.plan.port_channels as *const PortChannelDeviceHandle).add(idx as usize),
            )
        })
    }

    fn state_word(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: the state block has STATE_HEADER_WORDS + n_semaphores live, aligned words;
        // callers stay below that.
        unsafe { atomic_u64_at(self.args.state + 8 * i as u64) }
    }

    fn run_op(&self, op: &FlatOp, s: Slice) -> Result<()> {
        let kind = OpKind::from_code(op.code)
            .ok_or_else(|| Error::Internal(format!("op code {}", op.code)))?;
        let (n_src, n_dst, n_ids) = (op.n_src as usize, op.n_dst as usize, op.n_ids as usize);
        if n_src > MAX_REFS || n_dst > MAX_REFS || n_ids > MAX_IDS {
            return Err(Error::Internal("op counts out of range".into()));
        }
        let src = &op.src[..n_src];
        let dst = &op.dst[..n_dst];
        let ids = &op.ids[..n_ids];
        use OpKind as K;
        match kind {
            K::Nop => Ok(()),
            K::Barrier => self.barrier(op.a as usize, u64::from(op.b)),
            K::Signal | K::RelaxedSignal => self.signal(op, ids),
            K::Wait | K::RelaxedWait => self.wait(op, ids),
            K::Flush => ids.iter().try_for_each(|&c| {
                let h = self.port_channel(c)?;
                // SAFETY: port handles made by the executor's proxy service, alive with it.
                unsafe { h.flush(self.timeout) }
            }),
            K::Put | K::PutWithSignal | K::PutWithSignalAndFlush => {
                if op.channel_type == CHANNEL_PORT {
                    self.port_put(kind, ids, src, dst, s, false)
                } else {
                    for (k, d) in dst.iter().enumerate() {
                        let sr = src.get(k).unwrap_or(&src[0]);
                        let n = sliced(d.size, s);
                        copy(self.addr(d, s.offset)?, self.addr(sr, s.offset)?, n);
                    }
                    Ok(())
                }
            }
            K::Get => {
                for (sr, d) in src.iter().zip(dst) {
                    let n = sliced(sr.size, s);
                    copy(self.addr(d, s.offset)?, self.addr(sr, s.offset)?, n);
                }
                Ok(())
            }
            K::Copy => {
                let n = sliced(src[0].size, s);
                copy(
                    self.addr(&dst[0], s.offset)?,
                    self.addr(&src[0], s.offset)?,
                    n,
                );
                Ok(())
            }
            K::Reduce | K::ReduceSend | K::ReadReduce | K::ReadReduceSend => {
                let n = sliced(src[0].size, s);
                let mut acc = load(self.addr(&src[0], s.offset)?, n);
                let rop = self.reduce_op(op)?;
                for r in &src[1..] {
                    let other = load(self.addr(r, s.offset)?, n);
                    combine(&mut acc, &other, self.dtype, rop);
                }
                for d in dst {
                    store(self.addr(d, s.offset)?, &acc);
                }
                Ok(())
            }
            K::PutPackets => {
                if op.channel_type == CHANNEL_PORT {
                    return self.port_put(kind, ids, src, dst, WHOLE, true);
                }
                for (k, d) in dst.iter().enumerate() {
                    let sr = src.get(k).unwrap_or(&src[0]);
                    let data = load(self.addr(sr, 0)?, d.size as usize);
                    self.write_packets(self.addr(d, 0)?, &data)?;
                }
                Ok(())
            }
            K::ReadPutPackets => {
                let data = self.read_packets(self.addr(&src[0], 0)?, src[0].size)?;
                if op.channel_type == CHANNEL_PORT {
                    return self.port_put(kind, ids, &[src[0]], dst, WHOLE, true);
                }
                for d in dst {
                    self.write_packets(self.addr(d, 0)?, &data)?;
                }
                Ok(())
            }
            K::CopyPackets => {
                let data = load(self.addr(&src[0], 0)?, src[0].size as usize);
                self.write_packets(self.addr(&dst[0], 0)?, &data)
            }
            K::UnpackPackets => {
                let data = self.read_packets(self.addr(&src[0], 0)?, src[0].size)?;
                store(self.addr(&dst[0], 0)?, &data);
                Ok(())
            }
            K::ReducePackets
            | K::ReduceSendPackets
            | K::ReduceCopyPackets
            | K::ReduceCopySendPackets => {
                let rop = self.reduce_op(op)?;
                let n = src[0].size;
                let mut acc = load(self.addr(&src[0], 0)?, n as usize);
                for r in &src[1..] {
                    let other = self.read_packets(self.addr(r, 0)?, n)?;
                    combine(&mut acc, &other, self.dtype, rop);
                }
                store(self.addr(&dst[0], 0)?, &acc);
                // The rest of the destinations take packets (a local copy, then the peers').
                for d in &dst[1..] {
                    self.write_packets(self.addr(d, 0)?, &acc)?;
                }
                Ok(())
            }
            K::SemRelease => ids.iter().try_for_each(|&id| {
                self.semaphore(id)?.fetch_add(1, Ordering::Release);
                Ok(())
            }),
            K::SemAcquire => ids.iter().try_for_each(|&id| {
                let sem = self.semaphore(id)?;
                spin_until(
                    self.timeout,
                    || format!("device semaphore {id} to be released"),
                    || {
                        let v = sem.load(Ordering::Acquire);
                        v > 0
                            && sem
                                .compare_exchange(v, v - 1, Ordering::AcqRel, Ordering::Relaxed)
                                .is_ok()
                    },
                )
            }),
            K::Pipeline => Err(Error::Internal("a pipeline inside a pipeline".into())),
            // Emulated multicast: a reducing load visits every member, a store writes to every
            // member (the semantics of multimem.ld_reduce / multimem.st on one address).
            K::MultiLoadReduceStore => {
                let n = sliced(src[0].size, s);
                let rop = self.reduce_op(op)?;
                let from = self.members(&src[0], s.offset)?;
                let mut acc = load(from[0], n);
                for &m in &from[1..] {
                    combine(&mut acc, &load(m, n), self.dtype, rop);
                }
                for m in self.members(&dst[0], s.offset)? {
                    store(m, &acc);
                }
                Ok(())
            }
            K::MultiStore => {
                let n = sliced(src[0].size, s);
                let data = load(self.addr(&src[0], s.offset)?, n);
                for m in self.members(&dst[0], s.offset)? {
                    store(m, &data);
                }
                Ok(())
            }
            K::MultiStorePackets => {
                let data = self.read_packets(self.addr(&src[0], 0)?, src[0].size)?;
                for m in self.members(&dst[0], 0)? {
                    self.write_packets(m, &data)?;
                }
                Ok(())
            }
        }
    }

    /// Every member's address of switch reference `r`, plus `extra` bytes.
    fn members(&self, r: &FlatRef, extra: u64) -> Result<Vec<u64>> {
        if r.kind != REF_SWITCH {
            return Err(Error::Internal(format!(
                "buffer reference kind {} where a switch channel is needed",
                r.kind
            )));
        }
        let m = self.switch.get(r.id as usize).ok_or_else(|| {
            Error::unavailable(
                format!("switch channel {}", r.id),
                "it was not set up: NVLS plans run on the host backend only",
            )
        })?;
        if m.is_empty() {
            return Err(Error::Internal(format!(
                "switch channel {} has no members",
                r.id
            )));
        }
        let off = self.half_of(r) + r.offset + extra;
        Ok(m.iter().map(|a| a + off).collect())
    }

    fn semaphore(&self, id: u8) -> Result<&std::sync::atomic::AtomicU64> {
        if u32::from(id) >= self.args.n_semaphores {
            return Err(Error::Internal(format!("semaphore {id} out of range")));
        }
        Ok(self.state_word(STATE_HEADER_WORDS + id as usize))
    }

    fn barrier(&self, id: usize, n: u64) -> Result<()> {
        if id >= crate::plan::MAX_BARRIERS as usize {
            return Err(Error::Internal(format!("barrier {id} out of range")));
        }
        let count = self.state_word(2 + 2 * id);
        let generation = self.state_word(3 + 2 * id);
        let g = generation.load(Ordering::Acquire);
        if count.fetch_add(1, Ordering::AcqRel) + 1 == n {
            count.store(0, Ordering::Relaxed);
            generation.fetch_add(1, Ordering::Release);
            return Ok(());
        }
        spin_until(
            self.timeout,
            || format!("{n} threadblocks to reach barrier {id}"),
            || generation.load(Ordering::Acquire) != g,
        )
    }

    fn signal(&self, op: &FlatOp, ids: &[u8]) -> Result<()> {
        for &c in ids {
            if op.channel_type == CHANNEL_MEMORY {
                let h = self.memory_channel(c)?;
                // SAFETY: handles of the executor's semaphores, alive with its context. Relaxed
                // signals are carried out as ordered ones: stronger, and as cheap on a CPU.
                unsafe { h.signal() };
            } else {
                let h = self.port_channel(c)?;
                // SAFETY: as above, for the proxy service's channels.
                unsafe { h.signal(self.timeout)? };
            }
        }
        Ok(())
    }

    fn wait(&self, op: &FlatOp, ids: &[u8]) -> Result<()> {
        for &c in ids {
            if op.channel_type == CHANNEL_MEMORY {
                let h = self.memory_channel(c)?;
                // SAFETY: as in `signal`.
                unsafe { h.wait(self.timeout)? };
            } else {
                let h = self.port_channel(c)?;
                // SAFETY: as in `signal`.
                unsafe { h.wait(self.timeout)? };
            }
        }
        Ok(())
    }

    /// Puts through port channels: destination `k` over channel `ids[k]`, from source `k`
    /// (or the only one); packet references move twice their data bytes.
    fn port_put(
        &self,
        kind: OpKind,
        ids: &[u8],
        src: &[FlatRef],
        dst: &[FlatRef],
        s: Slice,
        packets: bool,
    ) -> Result<()> {
        for (k, d) in dst.iter().enumerate() {
            let sr = src.get(k).unwrap_or(&src[0]);
            let c = *ids.get(k).ok_or_else(|| {
                Error::invalid(format!("{kind}: no port channel for destination {k}"))
            })?;
            let mut h = self.port_channel(c)?;
            h.dst = self.remote_id(d.id)?;
            h.src = self.plan.local_ids[sr.buffer as usize % 4];
            let (bytes, off) = if packets {
                (u64::from(d.size) * 2, 0)
            } else {
                (sliced(d.size, s) as u64, s.offset)
            };
            let dst_off = d.offset + self.half_of(d) + off;
            let src_off = sr.offset + self.half_of(sr) + off;
            // SAFETY: port handles made by the executor's proxy service, alive with it.
            unsafe {
                match kind {
                    OpKind::PutWithSignal => {
                        h.put_with_signal(dst_off, src_off, bytes, self.timeout)?
                    }
                    OpKind::PutWithSignalAndFlush => {
                        h.put_with_signal_and_flush(dst_off, src_off, bytes, self.timeout)?
                    }
                    _ => h.put(dst_off, src_off, bytes, self.timeout)?,
                }
            }
        }
        Ok(())
    }

    /// Writes `data` as LL16 packets carrying this launch's flag at `addr`.
    fn write_packets(&self, addr: u64, data: &[u8]) -> Result<()> {
        check_packets(addr, data.len())?;
        for (k, w) in data.chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            // SAFETY: `addr` is a 16-byte aligned packet range of the plan's scratch (bounds
            // checked when the plan was flattened) whose packets are only accessed atomically.
            unsafe { LL16Packet::write(addr + 16 * k as u64, u64::from_le_bytes(b), self.flag) };
        }
        Ok(())
    }

    /// Reads `bytes` of data from LL16 packets at `addr`, waiting for this launch's flag.
    fn read_packets(&self, addr: u64, bytes: u32) -> Result<Vec<u8>> {
        check_packets(addr, bytes as usize)?;
        let mut out = Vec::with_capacity(bytes as usize);
        for k in 0..(bytes as u64 / 8) {
            // SAFETY: as in `write_packets`.
            let v = unsafe { LL16Packet::read(addr + 16 * k, self.flag, self.timeout)? };
            out.extend_from_slice(&v.to_le_bytes());
        }
        Ok(out)
    }
}

fn check_packets(addr: u64, bytes: usize) -> Result<()> {
    if addr % 16 != 0 || bytes % 8 != 0 {
        return Err(Error::invalid(format!(
            "LL16 packets at {addr:#x} for {bytes} data bytes: a 16-byte aligned address and a multiple of 8 bytes are needed (check the plan's buffer_alignment and the message size)"
        )));
    }
    Ok(())
}

/// Bytes of a `size`-byte range that slice `s` covers.
fn sliced(size: u32, s: Slice) -> usize {
    u64::from(size).saturating_sub(s.offset).min(s.unit) as usize
}

/// Copies `n` bytes (ranges may overlap: in-place plans copy a buffer onto itself).
fn copy(dst: u64, src: u64, n: usize) {
    if n == 0 || dst == src {
        return;
    }
    // SAFETY: both ranges are inside buffers of this execution (bounds checked when the plan
    // was flattened against the sizes it runs with), live while the kernel runs.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) }
}

/// Loads `n` bytes into host memory (as a device load would into registers).
fn load(src: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    // SAFETY: as in `copy`.
    unsafe { std::ptr::copy(src as *const u8, v.as_mut_ptr(), n) };
    v
}

fn store(dst: u64, data: &[u8]) {
    // SAFETY: as in `copy`.
    unsafe { std::ptr::copy(data.as_ptr(), dst as *mut u8, data.len()) };
}

/// `acc = acc op other`, element-wise (a trailing partial element is left alone).
pub fn combine(acc: &mut [u8], other: &[u8], dtype: DataType, op: ReduceOp) {
    use half::{bf16, f16};
    fn f(x: f32, y: f32, op: ReduceOp) -> f32 {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => x + y,
            ReduceOp::Prod => x * y,
            ReduceOp::Min => x.min(y),
            ReduceOp::Max => x.max(y),
        }
    }
    macro_rules! int {
        ($t:ty) => {
            for (a, b) in acc.chunks_exact_mut(4).zip(other.chunks_exact(4)) {
                let x = <$t>::from_le_bytes([a[0], a[1], a[2], a[3]]);
                let y = <$t>::from_le_bytes([b[0], b[1], b[2], b[3]]);
                let r = match op {
                    ReduceOp::Sum | ReduceOp::Avg => x.wrapping_add(y),
                    ReduceOp::Prod => x.wrapping_mul(y),
                    ReduceOp::Min => x.min(y),
                    ReduceOp::Max => x.max(y),
                };
                a.copy_from_slice(&r.to_le_bytes());
            }
        };
    }
    match dtype {
        DataType::F32 => {
            for (a, b) in acc.chunks_exact_mut(4).zip(other.chunks_exact(4)) {
                let x = f32::from_le_bytes([a[0], a[1], a[2], a[3]]);
                let y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                a.copy_from_slice(&f(x, y, op).to_le_bytes());
            }
        }
        DataType::F16 => {
            for (a, b) in acc.chunks_exact_mut(2).zip(other.chunks_exact(2)) {
                let x = f16::from_le_bytes([a[0], a[1]]).to_f32();
                let y = f16::from_le_bytes([b[0], b[1]]).to_f32();
                a.copy_from_slice(&f16::from_f32(f(x, y, op)).to_le_bytes());
            }
        }
        DataType::BF16 => {
            for (a, b) in acc.chunks_exact_mut(2).zip(other.chunks_exact(2)) {
                let x = bf16::from_le_bytes([a[0], a[1]]).to_f32();
                let y = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                a.copy_from_slice(&bf16::from_f32(f(x, y, op)).to_le_bytes());
            }
        }
        DataType::I32 => int!(i32),
        DataType::U32 => int!(u32),
        _ => {
            let s = dtype.size();
            for (a, b) in acc.chunks_exact_mut(s).zip(other.chunks_exact(s)) {
                let x = a.to_vec();
                dtype.combine_elem(&x, b, op, a);
            }
        }
    }
}
