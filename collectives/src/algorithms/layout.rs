//! The layouts of the collectives' argument structs, checked against
//! `kernels/collectives/args_check.h`: that header, generated from them, `static_assert`s every
//! size and offset in every compile of the collective modules.

use std::path::Path;

use mscclpp_hal::dev::layout::{LayoutEntry, check_header, header};
use mscclpp_hal::layout_entry;

use super::direct::args::DirectCollectiveArgs;
use super::ll::args::LlCollectiveArgs;
use super::p2p::args::{P2pArgs, P2pChannel, P2pOpDesc};
use super::read::args::ReadCollectiveArgs;
use crate::moe::args::{MoeArgs, MoeLayoutArgs};
use crate::scale::ScaleArgs;

fn layout_table() -> Vec<LayoutEntry> {
    vec![
        layout_entry!(LlCollectiveArgs {
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
            abort,
        }),
        layout_entry!(DirectCollectiveArgs {
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
            abort,
        }),
        layout_entry!(P2pChannel {
            peer,
            send,
            first_op,
            nops,
        }),
        layout_entry!(P2pOpDesc { addr, bytes }),
        layout_entry!(P2pArgs {
            scratch,
            slot_bytes,
            lane_min_bytes,
            peer_scratch,
            rank,
            nranks,
            lanes,
            nchannels,
            channels,
            ops,
            abort,
        }),
        layout_entry!(ReadCollectiveArgs {
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
            abort,
        }),
        layout_entry!(ScaleArgs {
            data,
            count,
            scalar,
            imm,
            dtype,
            _pad,
            src,
        }),
        layout_entry!(MoeLayoutArgs {
            topk_idx,
            tokens,
            per_rank,
            per_expert,
            in_rank,
            status,
            topk,
            num_experts,
            nranks,
            _pad,
        }),
        layout_entry!(MoeArgs {
            buffer,
            peer_buffer,
            max_tokens,
            row_bytes,
            scales_at,
            meta_at,
            tokens,
            payload_bytes,
            scale_bytes,
            x,
            topk_idx,
            topk_weights,
            scales,
            out_x,
            out_idx,
            out_weights,
            out_scales,
            out_src,
            out_capacity,
            handle,
            topk,
            num_experts,
            rank,
            nranks,
            dtype,
            phases,
            abort,
            em_x,
            em_scales,
            em_scale_strides,
            em_src,
            em_range,
            em_count,
            em_slots,
            em_stats,
            em_weights,
            em_capacity,
            em_flags,
            _pad,
        }),
    ]
}

#[test]
fn committed_args_check_header_matches_the_rust_layouts() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/collectives/args_check.h");
    let expected = header(
        "collectives/src/algorithms/*/args.rs (collectives/src/algorithms/layout.rs; regenerate \
         with MSCCLPP_BLESS_LAYOUT=1 cargo test -p mscclpp-collectives layout)",
        &layout_table(),
    );
    if let Err(e) = check_header(&path, &expected) {
        panic!("{e}");
    }
}

#[test]
fn argument_structs_have_no_implicit_padding() {
    for e in layout_table() {
        assert_eq!(e.size % e.align, 0, "{}", e.name);
    }
}
