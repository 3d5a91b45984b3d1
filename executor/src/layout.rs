//! The device mirror of the flattened plan (`kernels/executor/args.cuh`) against the Rust
//! records: `kernels/executor/args_check.h`, generated from them, `static_assert`s every size
//! and offset in every compile of the interpreter; the codes the records carry (op codes,
//! reference kinds, channel types, the state layout) are compared with the header's constants.

use std::path::Path;

use mscclpp_hal::dev::layout::{LayoutEntry, check_header, header};
use mscclpp_hal::layout_entry;

use crate::flat::{
    CHANNEL_MEMORY, CHANNEL_NONE, CHANNEL_PORT, CHANNEL_SWITCH, FlatBlock, FlatOp, FlatRef,
    MAX_IDS, MAX_REFS, REF_LOCAL, REF_REMOTE_MEMORY, REF_REMOTE_PORT, REF_SWITCH,
};
use crate::kernel::{DevicePlan, ExecutorArgs, STATE_HEADER_WORDS};
use crate::plan::{BufferType, MAX_BARRIERS, OpKind};

fn layout_table() -> Vec<LayoutEntry> {
    vec![
        layout_entry!(FlatRef {
            offset,
            size,
            kind,
            buffer,
            id,
            packets,
        }),
        layout_entry!(FlatOp {
            code,
            channel_type,
            n_src,
            n_dst,
            n_ids,
            reduce,
            _pad,
            a,
            b,
            c,
            _pad2,
            ids,
            src,
            dst,
        }),
        layout_entry!(FlatBlock { first_op, n_ops }),
        layout_entry!(DevicePlan {
            n_blocks,
            n_ops,
            blocks,
            ops,
            memory_channels,
            port_channels,
            remote_addrs,
            remote_ids,
            local_ids,
            n_memory,
            n_port,
            n_remote,
            _pad,
        }),
        layout_entry!(ExecutorArgs {
            plan,
            state,
            input,
            output,
            scratch,
            scratch_bytes,
            dtype,
            op,
            double_scratch,
            n_semaphores,
            abort,
        }),
    ]
}

fn kernels_file(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../kernels/executor")
        .join(name)
}

#[test]
fn committed_args_check_header_matches_the_rust_layouts() {
    let expected = header(
        "executor/src/{flat,kernel}.rs (executor/src/layout.rs; regenerate with \
         MSCCLPP_BLESS_LAYOUT=1 cargo test -p mscclpp-executor layout)",
        &layout_table(),
    );
    if let Err(e) = check_header(&kernels_file("args_check.h"), &expected) {
        panic!("{e}");
    }
}

#[test]
fn records_have_no_implicit_padding() {
    for e in layout_table() {
        assert_eq!(e.size % e.align, 0, "{}", e.name);
    }
}

/// `constexpr uint32_t NAME = VALUE;` lines of `args.cuh`.
fn constants() -> std::collections::HashMap<String, String> {
    let text = std::fs::read_to_string(kernels_file("args.cuh")).unwrap();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("constexpr uint32_t "))
        .filter_map(|l| l.strip_suffix(';'))
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[test]
fn device_constants_match_the_rust_ones() {
    let c = constants();
    let num = |k: &str| -> u64 {
        c.get(k)
            .unwrap_or_else(|| panic!("args.cuh has no {k}"))
            .parse()
            .unwrap_or_else(|_| panic!("{k} is not a number"))
    };
    // Every op code, by its Rust variant's name.
    for &kind in OpKind::ALL {
        let name = format!("kOp{kind:?}");
        assert_eq!(num(&name), u64::from(kind.code()), "{name}");
    }
    for (k, v) in [
        ("kExecMaxRefs", MAX_REFS as u64),
        ("kExecMaxIds", MAX_IDS as u64),
        ("kExecMaxBarriers", u64::from(MAX_BARRIERS)),
        ("kExecRefLocal", u64::from(REF_LOCAL)),
        ("kExecRefRemoteMemory", u64::from(REF_REMOTE_MEMORY)),
        ("kExecRefRemotePort", u64::from(REF_REMOTE_PORT)),
        ("kExecRefSwitch", u64::from(REF_SWITCH)),
        ("kExecChannelNone", u64::from(CHANNEL_NONE)),
        ("kExecChannelMemory", u64::from(CHANNEL_MEMORY)),
        ("kExecChannelPort", u64::from(CHANNEL_PORT)),
        ("kExecChannelSwitch", u64::from(CHANNEL_SWITCH)),
        ("kExecBufferInput", BufferType::Input as u64),
        ("kExecBufferOutput", BufferType::Output as u64),
        ("kExecBufferScratch", BufferType::Scratch as u64),
    ] {
        assert_eq!(num(k), v, "{k}");
    }
    assert_eq!(
        c.get("kExecStateHeaderWords").map(String::as_str),
        Some("2 + 2 * kExecMaxBarriers")
    );
    assert_eq!(STATE_HEADER_WORDS, 2 + 2 * MAX_BARRIERS as usize);
}

#[test]
fn every_entry_point_is_defined_in_the_source() {
    let m = &crate::kernel::EXECUTOR_MODULE;
    for k in m.kernels {
        for def in [
            format!("extern \"C\" __global__ void {}(", k.id),
            format!(
                "extern \"C\" __global__ void __launch_bounds__(mscclpp::kExecMaxThreads) {}(",
                k.id
            ),
        ] {
            assert!(m.source.contains(&def), "{def}");
        }
    }
    assert!(
        m.source
            .contains("constexpr uint32_t kExecMaxThreads = 1024;")
    );
    assert_eq!(crate::kernel::MAX_THREADS_PER_BLOCK, 1024);
}
