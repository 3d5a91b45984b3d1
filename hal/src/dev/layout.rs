//! The table of device-visible layouts — sizes, alignments and field offsets — from which the
//! `static_assert` header mirrored in `kernels/cuda` and `kernels/hip` is generated.

use std::mem::{align_of, offset_of, size_of};

use super::*;
use crate::collective::{DirectCollectiveArgs, LlCollectiveArgs, ReadCollectiveArgs};
use crate::kernel::{
    AtomicAddU64Args, FillU32Args, MemoryChannelPutArgs, PingPongArgs, PortChannelPutArgs,
};

/// Size, alignment and field offsets of one `#[repr(C)]` type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutEntry {
    /// The type's name, the same in Rust and in the device headers (namespace `mscclpp`).
    pub name: &'static str,
    /// `size_of`.
    pub size: usize,
    /// `align_of`.
    pub align: usize,
    /// `(field, offset)` for every field.
    pub fields: Vec<(&'static str, usize)>,
}

macro_rules! entry {
    ($t:ident { $($f:ident),* $(,)? }) => {
        LayoutEntry {
            name: stringify!($t),
            size: size_of::<$t>(),
            align: align_of::<$t>(),
            fields: vec![$((stringify!($f), offset_of!($t, $f))),*],
        }
    };
}

/// Every device-visible type.
pub fn layout_table() -> Vec<LayoutEntry> {
    vec![
        entry!(ProxyTrigger { fst, snd }),
        entry!(FifoDeviceHandle {
            triggers,
            head,
            tail,
            size,
            _pad
        }),
        entry!(LL16Packet {
            data1,
            flag1,
            data2,
            flag2
        }),
        entry!(LL8Packet { data, flag }),
        entry!(Host2DeviceSemaphoreDeviceHandle {
            inbound_token,
            expected_inbound_token
        }),
        entry!(MemoryDevice2DeviceSemaphoreDeviceHandle {
            inbound_token,
            outbound_token,
            remote_inbound_token,
            expected_inbound_token,
        }),
        entry!(BaseMemoryChannelDeviceHandle { semaphore }),
        entry!(MemoryChannelDeviceHandle {
            semaphore,
            dst,
            src,
            packet_buffer
        }),
        entry!(PortChannelDeviceHandle {
            semaphore_id,
            dst,
            src,
            _pad,
            semaphore,
            fifo
        }),
        entry!(SwitchChannelDeviceHandle {
            device_ptr,
            mc_ptr,
            member_ptrs,
            buffer_size,
            num_members,
            _pad,
        }),
        entry!(FillU32Args {
            dst,
            count,
            value,
            _pad
        }),
        entry!(AtomicAddU64Args { counter, value }),
        entry!(MemoryChannelPutArgs { chan, bytes, iters }),
        entry!(PortChannelPutArgs { chan, bytes, iters }),
        entry!(PingPongArgs {
            chan,
            rounds,
            initiator,
            relaxed
        }),
        entry!(LlCollectiveArgs {
            input,
            output,
            count,
            flag,
            scratch,
            slot_bytes,
            peer_scratch,
            kind,
            dtype,
            op,
            rank,
            nranks,
            root,
        }),
        entry!(DirectCollectiveArgs {
            input,
            output,
            count,
            scratch,
            slot_bytes,
            chunk_bytes,
            peer_scratch,
            kind,
            dtype,
            op,
            rank,
            nranks,
            root,
            max_blocks,
            _pad,
        }),
        entry!(ReadCollectiveArgs {
            input,
            output,
            count,
            scratch,
            table,
            in_key,
            staging_bytes,
            peer_scratch,
            dtype,
            op,
            rank,
            nranks,
            max_blocks,
            _pad,
        }),
    ]
}

/// The C++ header (for CUDA and HIP alike) that `static_assert`s every entry of
/// [`layout_table`] against the device-side definitions, which must be in scope (namespace
/// `mscclpp`) where it is included.
pub fn generate_header() -> String {
    let mut s = String::from(
        "// Generated from the Rust definitions in hal/src/dev by `cargo run -p mscclpp-hal --example gen_layout`.\n\
         // Do not edit: a test fails when this file and the Rust layouts disagree.\n\
         #pragma once\n\n\
         // NVRTC's front end has no __builtin_offsetof (nor <cstddef>); it has __INTADDR__.\n\
         #if defined(__CUDACC_RTC__)\n\
         #define MSCCLPP_LAYOUT_OFFSETOF(type, field) __INTADDR__(&((type*)0)->field)\n\
         #else\n\
         #define MSCCLPP_LAYOUT_OFFSETOF(type, field) __builtin_offsetof(type, field)\n\
         #endif\n\n",
    );
    for e in layout_table() {
        s.push_str(&format!(
            "static_assert(sizeof(mscclpp::{n}) == {sz}, \"size of {n}\");\n\
             static_assert(alignof(mscclpp::{n}) == {al}, \"alignment of {n}\");\n",
            n = e.name,
            sz = e.size,
            al = e.align
        ));
        for (f, off) in &e.fields {
            s.push_str(&format!(
                "static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::{n}, {f}) == {off}, \"offset of {n}::{f}\");\n",
                n = e.name
            ));
        }
        s.push('\n');
    }
    s.push_str("#undef MSCCLPP_LAYOUT_OFFSETOF\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_have_no_implicit_padding() {
        for e in layout_table() {
            assert_eq!(e.size % e.align, 0, "{}", e.name);
            assert!(
                e.fields.windows(2).all(|w| w[0].1 < w[1].1),
                "{} fields out of order",
                e.name
            );
        }
        assert_eq!(size_of::<ProxyTrigger>(), 16);
        assert_eq!(size_of::<LL16Packet>(), 16);
        assert_eq!(size_of::<LL8Packet>(), 8);
    }
}
