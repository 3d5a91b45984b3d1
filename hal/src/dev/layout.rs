//! Device-visible layouts — sizes, alignments and field offsets — and the `static_assert`
//! headers generated from them, which the device sources include so that every compile (CUDA
//! and HIP alike) checks its mirror of the Rust structs.
//!
//! The HAL's own table ([`layout_table`]: handles, packets, triggers) becomes
//! `kernels/include/mscclpp/layout_check.h`; the owner of a kernel module builds the table of
//! its argument structs with [`layout_entry!`](crate::layout_entry) and checks its own header
//! with [`check_header`].

use std::path::Path;

use super::*;

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

/// The [`LayoutEntry`] of a `#[repr(C)]` type in scope, listing the fields to check:
/// `layout_entry!(MyArgs { dst, count })`. The device-side type has the same name, in namespace
/// `mscclpp`.
#[macro_export]
macro_rules! layout_entry {
    ($t:ident { $($f:ident),* $(,)? }) => {
        $crate::dev::layout::LayoutEntry {
            name: stringify!($t),
            size: ::std::mem::size_of::<$t>(),
            align: ::std::mem::align_of::<$t>(),
            fields: vec![$((stringify!($f), ::std::mem::offset_of!($t, $f))),*],
        }
    };
}
use crate::layout_entry as entry;

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
    ]
}

/// The C++ header (for CUDA and HIP alike) that `static_assert`s every entry of
/// [`layout_table`] against the device-side definitions, which must be in scope (namespace
/// `mscclpp`) where it is included.
pub fn generate_header() -> String {
    header(
        "hal/src/dev by `cargo run -p mscclpp-hal --example gen_layout`",
        &layout_table(),
    )
}

/// The C++ header that `static_assert`s every entry of `entries` against the device-side
/// definitions (namespace `mscclpp`, in scope where it is included); `origin` says where the
/// Rust definitions are and how the header is regenerated.
pub fn header(origin: &str, entries: &[LayoutEntry]) -> String {
    let mut s = format!(
        "// Generated from the Rust definitions in {origin}.\n\
         // Do not edit: a test fails when this file and the Rust layouts disagree.\n\
         #pragma once\n\n\
         // NVRTC's front end has no __builtin_offsetof (nor <cstddef>); it has __INTADDR__.\n\
         #if defined(__CUDACC_RTC__)\n\
         #define MSCCLPP_LAYOUT_OFFSETOF(type, field) __INTADDR__(&((type*)0)->field)\n\
         #else\n\
         #define MSCCLPP_LAYOUT_OFFSETOF(type, field) __builtin_offsetof(type, field)\n\
         #endif\n\n",
    );
    for e in entries {
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

/// Compares the committed header at `path` with `expected` (a [`header`]): `Err` says what
/// differs and how to regenerate. With `MSCCLPP_BLESS_LAYOUT=1` it writes `expected` there
/// instead — how an owner's test regenerates its header after a change to its structs.
pub fn check_header(path: &Path, expected: &str) -> std::result::Result<(), String> {
    if std::env::var("MSCCLPP_BLESS_LAYOUT").is_ok_and(|v| v == "1") {
        return std::fs::write(path, expected)
            .map_err(|e| format!("cannot write {}: {e}", path.display()));
    }
    let found = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if found != expected {
        return Err(format!(
            "{} differs from the Rust layouts; regenerate it by running the test that checks it \
             with MSCCLPP_BLESS_LAYOUT=1",
            path.display()
        ));
    }
    Ok(())
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
