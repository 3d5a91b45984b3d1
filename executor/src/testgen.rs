//! Small plans written here (not by MSCCL++'s DSL), in its JSON format, for any rank count: what
//! the tests run against a CPU reference, and examples of the format.
//!
//! - [`allreduce_simple`]: every rank signals and waits for its peers, reduces its own chunk
//!   by reading the peers' inputs (`rres`), which also writes the result into the peers'
//!   outputs, then signals and waits again (the peers' results have landed).
//! - [`allreduce_ll`]: all-pairs over LL packets: `ppkt` of chunk p to peer p's scratch,
//!   `respkt` (reduce the received packets with the own chunk, send the result as packets),
//!   `upkt` of the peers' results. No semaphores: packets carry the flag.
//! - [`allgather_simple`]: `copy` of the input into the own output chunk (out of place), then
//!   `put` of it into every peer's output, between signal/wait rounds.
//! - [`allreduce_nvls`]: NVLS (switch channels over every rank's input and output): each rank
//!   `glres`es its own chunk — a reducing load from every member, a store to every member —
//!   between signal/wait rounds, as the DSL's `allreduce_nvls_zero_copy` does.
//! - [`allgather_nvls`]: `gstore` of the own chunk to every member's output (switch channel over
//!   the output) between signal/wait rounds.
//! - [`allgather_nvls_ll`]: LL: `cpkt` of the input into the own scratch slot, `gstorepkt` of it
//!   into every member's scratch, `upkt` of every slot into the output (the DSL's
//!   `allgather_nvls_zero_copy_pkt`).
//!
//! - [`allgather_hosts`]: ranks on several hosts (`per_host` consecutive ranks each): the own
//!   chunk `put` through memory channels into the outputs of the host's ranks, and through
//!   port channels into the outputs of every other host's ranks, between signal/wait rounds on
//!   both, then a flush of the port channels (the shape of the DSL's multi-node plans: memory
//!   channels within a node, port channels between nodes).
//!
//! The NVLS plans run on the host backend, which emulates multicast; GPUs refuse them.
//!
//! Built only with the crate's `testgen` feature (off by default): the tests that use these
//! plans enable it in their crate's dev-dependencies.

use serde_json::{Value, json};

fn peers(r: usize, n: usize) -> Vec<usize> {
    (0..n).filter(|&p| p != r).collect()
}

fn header(name: &str, collective: &str, protocol: &str, inplace: bool, gpus: Vec<Value>) -> Value {
    json!({
        "name": name,
        "collective": collective,
        "protocol": protocol,
        "inplace": inplace,
        "reuse_resources": false,
        "num_threads_per_block": 1024,
        "use_double_scratch_buffer": protocol == "LL",
        "buffer_alignment": 16,
        "min_message_size": 0,
        "max_message_size": u64::MAX,
        "gpus": gpus,
    })
}

fn sync_ops(n_peers: usize) -> [Value; 2] {
    let ids: Vec<usize> = (0..n_peers).collect();
    [
        json!({"name": "signal", "channel_type": "memory", "channel_ids": ids}),
        json!({"name": "wait", "channel_type": "memory", "channel_ids": ids}),
    ]
}

/// An all-reduce of `n` ranks in the Simple protocol (in place: the input is the output).
pub fn allreduce_simple(n: usize, inplace: bool) -> Value {
    let out = if inplace { "i" } else { "o" };
    let gpus = (0..n)
        .map(|r| {
            let ps = peers(r, n);
            // Remote buffers: every peer's input (read), then every peer's output (written).
            let mut remote = Vec::new();
            for &p in &ps {
                remote.push(json!({"rank": p, "type": "i", "access_channel_types": ["memory"]}));
            }
            if !inplace {
                for &p in &ps {
                    remote.push(json!({"rank": p, "type": "o", "access_channel_types": ["memory"]}));
                }
            }
            let k = ps.len();
            let mut src = vec![json!({"type": "i", "index": r, "size": 1})];
            let mut dst = vec![json!({"type": out, "index": r, "size": 1})];
            for j in 0..k {
                src.push(json!({"buffer_id": j, "index": r, "size": 1}));
                let id = if inplace { j } else { k + j };
                dst.push(json!({"buffer_id": id, "index": r, "size": 1}));
            }
            let [signal, wait] = sync_ops(k);
            let ops = vec![
                signal.clone(),
                wait.clone(),
                json!({"name": "rres", "channel_type": "memory", "reduce_op": "sum",
                       "src_buff": src, "dst_buff": dst}),
                json!({"name": "nop"}),
                signal,
                wait,
            ];
            json!({
                "id": r, "input_chunks": n, "output_chunks": if inplace { 0 } else { n },
                "scratch_chunks": 0,
                "channels": [{"channel_type": "memory", "connected_to": ps}],
                "remote_buffers": remote,
                "semaphores": [],
                "threadblocks": [{
                    "id": 0, "ops": ops,
                    "channels": [{"channel_type": "memory", "channel_ids": (0..k).collect::<Vec<_>>()}],
                    "remote_buffer_refs": [{"access_channel_type": "memory",
                        "remote_buffer_ids": (0..remote.len()).collect::<Vec<_>>()}],
                }],
            })
        })
        .collect();
    let name = format!("allreduce_simple_{n}{}", if inplace { "_ip" } else { "" });
    header(&name, "allreduce", "Simple", inplace, gpus)
}

/// An all-reduce of `n` ranks over LL packets, with two threadblocks per rank (sending and
/// reducing in one, unpacking in the other).
pub fn allreduce_ll(n: usize, inplace: bool) -> Value {
    let out = if inplace { "i" } else { "o" };
    let gpus = (0..n)
        .map(|r| {
            let ps = peers(r, n);
            let k = ps.len();
            // Scratch: slots 0..k take the peers' inputs of my chunk, slots k..2k their results.
            let slot = |of: usize, at: usize| if of < at { of } else { of - 1 };
            let remote: Vec<Value> = ps
                .iter()
                .map(|&p| json!({"rank": p, "type": "s", "access_channel_types": ["memory"]}))
                .collect();
            let mut tb0 = Vec::new();
            for (j, &p) in ps.iter().enumerate() {
                tb0.push(json!({"name": "ppkt", "channel_type": "memory",
                    "src_buff": [{"type": "i", "index": p, "size": 1}],
                    "dst_buff": [{"buffer_id": j, "index": slot(r, p), "size": 1}]}));
            }
            let mut src = vec![json!({"type": "i", "index": r, "size": 1})];
            let mut dst = vec![json!({"type": out, "index": r, "size": 1})];
            for (j, &p) in ps.iter().enumerate() {
                src.push(json!({"type": "s", "index": slot(p, r), "size": 1}));
                dst.push(json!({"buffer_id": j, "index": k + slot(r, p), "size": 1}));
            }
            tb0.push(
                json!({"name": "respkt", "channel_type": "memory", "reduce_op": "sum",
                "src_buff": src, "dst_buff": dst}),
            );
            let tb1: Vec<Value> = ps
                .iter()
                .map(|&p| {
                    json!({"name": "upkt",
                        "src_buff": [{"type": "s", "index": k + slot(p, r), "size": 1}],
                        "dst_buff": [{"type": out, "index": p, "size": 1}]})
                })
                .collect();
            json!({
                "id": r, "input_chunks": n, "output_chunks": if inplace { 0 } else { n },
                "scratch_chunks": 2 * k,
                "channels": [{"channel_type": "memory", "connected_to": ps}],
                "remote_buffers": remote,
                "semaphores": [],
                "threadblocks": [
                    {"id": 0, "ops": tb0, "channels": [],
                     "remote_buffer_refs": [{"access_channel_type": "memory",
                        "remote_buffer_ids": (0..k).collect::<Vec<_>>()}]},
                    {"id": 1, "ops": tb1, "channels": [], "remote_buffer_refs": []},
                ],
            })
        })
        .collect();
    let name = format!("allreduce_ll_{n}{}", if inplace { "_ip" } else { "" });
    header(&name, "allreduce", "LL", inplace, gpus)
}

/// An all-gather of `n` ranks in the Simple protocol (in place: the input is chunk `rank` of
/// the output, and the plan reads it there).
pub fn allgather_simple(n: usize, inplace: bool) -> Value {
    let gpus = (0..n)
        .map(|r| {
            let ps = peers(r, n);
            let k = ps.len();
            let remote: Vec<Value> = ps
                .iter()
                .map(|&p| json!({"rank": p, "type": "o", "access_channel_types": ["memory"]}))
                .collect();
            let [signal, wait] = sync_ops(k);
            let mut ops = Vec::new();
            if !inplace {
                ops.push(json!({"name": "copy",
                    "src_buff": [{"type": "i", "index": 0, "size": 1}],
                    "dst_buff": [{"type": "o", "index": r, "size": 1}]}));
            }
            ops.push(signal.clone());
            ops.push(wait.clone());
            ops.push(json!({"name": "put", "channel_type": "memory",
                "src_buff": (0..k).map(|_| json!({"type": "o", "index": r, "size": 1})).collect::<Vec<_>>(),
                "dst_buff": (0..k).map(|j| json!({"buffer_id": j, "index": r, "size": 1})).collect::<Vec<_>>()}));
            ops.push(signal);
            ops.push(wait);
            json!({
                "id": r, "input_chunks": 1, "output_chunks": n, "scratch_chunks": 0,
                "channels": [{"channel_type": "memory", "connected_to": ps}],
                "remote_buffers": remote,
                "semaphores": [],
                "threadblocks": [{
                    "id": 0, "ops": ops,
                    "channels": [{"channel_type": "memory", "channel_ids": (0..k).collect::<Vec<_>>()}],
                    "remote_buffer_refs": [{"access_channel_type": "memory",
                        "remote_buffer_ids": (0..k).collect::<Vec<_>>()}],
                }],
            })
        })
        .collect();
    let name = format!("allgather_simple_{n}{}", if inplace { "_ip" } else { "" });
    header(&name, "allgather", "Simple", inplace, gpus)
}

/// An all-gather of `hosts * per_host` ranks across hosts: memory channels to the ranks of the
/// own host, port channels to the others (see the module).
pub fn allgather_hosts(hosts: usize, per_host: usize, inplace: bool) -> Value {
    let n = hosts * per_host;
    let gpus = (0..n)
        .map(|r| {
            let (near, far): (Vec<usize>, Vec<usize>) =
                peers(r, n).into_iter().partition(|p| p / per_host == r / per_host);
            let (kn, kf) = (near.len(), far.len());
            let remote: Vec<Value> = near
                .iter()
                .map(|&p| json!({"rank": p, "type": "o", "access_channel_types": ["memory"]}))
                .chain(far.iter().map(
                    |&p| json!({"rank": p, "type": "o", "access_channel_types": ["port"]}),
                ))
                .collect();
            let mut ops = Vec::new();
            if !inplace {
                ops.push(json!({"name": "copy",
                    "src_buff": [{"type": "i", "index": 0, "size": 1}],
                    "dst_buff": [{"type": "o", "index": r, "size": 1}]}));
            }
            let sync = |name: &str, ops: &mut Vec<Value>| {
                if kn > 0 {
                    ops.push(json!({"name": name, "channel_type": "memory",
                        "channel_ids": (0..kn).collect::<Vec<_>>()}));
                }
                ops.push(json!({"name": name, "channel_type": "port",
                    "channel_ids": (0..kf).collect::<Vec<_>>()}));
            };
            sync("signal", &mut ops);
            sync("wait", &mut ops);
            if kn > 0 {
                ops.push(json!({"name": "put", "channel_type": "memory",
                    "src_buff": (0..kn).map(|_| json!({"type": "o", "index": r, "size": 1})).collect::<Vec<_>>(),
                    "dst_buff": (0..kn).map(|j| json!({"buffer_id": j, "index": r, "size": 1})).collect::<Vec<_>>()}));
            }
            ops.push(json!({"name": "put", "channel_type": "port",
                "channel_ids": (0..kf).collect::<Vec<_>>(),
                "src_buff": (0..kf).map(|_| json!({"type": "o", "index": r, "size": 1})).collect::<Vec<_>>(),
                "dst_buff": (0..kf).map(|j| json!({"buffer_id": j, "index": r, "size": 1})).collect::<Vec<_>>()}));
            sync("signal", &mut ops);
            sync("wait", &mut ops);
            ops.push(json!({"name": "flush", "channel_type": "port",
                "channel_ids": (0..kf).collect::<Vec<_>>()}));
            let mut channels = Vec::new();
            let mut tb_channels = Vec::new();
            let mut refs = Vec::new();
            if kn > 0 {
                channels.push(json!({"channel_type": "memory", "connected_to": near}));
                tb_channels.push(json!({"channel_type": "memory", "channel_ids": (0..kn).collect::<Vec<_>>()}));
                refs.push(json!({"access_channel_type": "memory",
                    "remote_buffer_ids": (0..kn).collect::<Vec<_>>()}));
            }
            channels.push(json!({"channel_type": "port", "connected_to": far}));
            tb_channels.push(json!({"channel_type": "port", "channel_ids": (0..kf).collect::<Vec<_>>()}));
            refs.push(json!({"access_channel_type": "port",
                "remote_buffer_ids": (kn..kn + kf).collect::<Vec<_>>()}));
            json!({
                "id": r, "input_chunks": 1, "output_chunks": n, "scratch_chunks": 0,
                "channels": channels,
                "remote_buffers": remote,
                "semaphores": [],
                "threadblocks": [{
                    "id": 0, "ops": ops,
                    "channels": tb_channels,
                    "remote_buffer_refs": refs,
                }],
            })
        })
        .collect();
    let name = format!(
        "allgather_hosts_{hosts}x{per_host}{}",
        if inplace { "_ip" } else { "" }
    );
    header(&name, "allgather", "Simple", inplace, gpus)
}

fn switch_channel(buffer: &str, n: usize) -> Value {
    json!({"channel_type": "switch", "buffer_type": buffer,
           "rank_groups": [{"size": n, "ranks": (0..n).collect::<Vec<_>>()}]})
}

/// An all-reduce of `n` ranks over switch channels (Simple protocol; in place: one channel over
/// the input, else one over the input and one over the output).
pub fn allreduce_nvls(n: usize, inplace: bool) -> Value {
    let gpus = (0..n)
        .map(|r| {
            let ps = peers(r, n);
            let k = ps.len();
            let mut channels = vec![
                json!({"channel_type": "memory", "connected_to": ps}),
                switch_channel("i", n),
            ];
            if !inplace {
                channels.push(switch_channel("o", n));
            }
            let out_channel = if inplace { 0 } else { 1 };
            let [signal, wait] = sync_ops(k);
            let ops = vec![
                signal.clone(),
                wait.clone(),
                json!({"name": "glres", "channel_type": "switch", "reduce_op": "sum",
                       "src_buff": [{"switch_channel_id": 0, "index": r, "size": 1}],
                       "dst_buff": [{"switch_channel_id": out_channel, "index": r, "size": 1}]}),
                signal,
                wait,
            ];
            let switch_ids: Vec<usize> = if inplace { vec![0] } else { vec![0, 1] };
            json!({
                "id": r, "input_chunks": n, "output_chunks": if inplace { 0 } else { n },
                "scratch_chunks": 0,
                "channels": channels,
                "remote_buffers": [],
                "semaphores": [],
                "threadblocks": [{
                    "id": 0, "ops": ops,
                    "channels": [
                        {"channel_type": "memory", "channel_ids": (0..k).collect::<Vec<_>>()},
                        {"channel_type": "switch", "channel_ids": switch_ids},
                    ],
                    "remote_buffer_refs": [],
                }],
            })
        })
        .collect();
    let name = format!("allreduce_nvls_{n}{}", if inplace { "_ip" } else { "" });
    header(&name, "allreduce", "Simple", inplace, gpus)
}

/// An all-gather of `n` ranks over a switch channel on the output (Simple protocol; in place:
/// the input is chunk `rank` of the output).
pub fn allgather_nvls(n: usize, inplace: bool) -> Value {
    let gpus = (0..n)
        .map(|r| {
            let ps = peers(r, n);
            let k = ps.len();
            let [signal, wait] = sync_ops(k);
            let src = if inplace {
                json!({"type": "o", "index": r, "size": 1})
            } else {
                json!({"type": "i", "index": 0, "size": 1})
            };
            let ops = vec![
                signal.clone(),
                wait.clone(),
                json!({"name": "gstore", "channel_type": "switch", "src_buff": [src],
                       "dst_buff": [{"switch_channel_id": 0, "index": r, "size": 1}]}),
                signal,
                wait,
            ];
            json!({
                "id": r, "input_chunks": 1, "output_chunks": n, "scratch_chunks": 0,
                "channels": [
                    {"channel_type": "memory", "connected_to": ps},
                    switch_channel("o", n),
                ],
                "remote_buffers": [],
                "semaphores": [],
                "threadblocks": [{
                    "id": 0, "ops": ops,
                    "channels": [
                        {"channel_type": "memory", "channel_ids": (0..k).collect::<Vec<_>>()},
                        {"channel_type": "switch", "channel_ids": [0]},
                    ],
                    "remote_buffer_refs": [],
                }],
            })
        })
        .collect();
    let name = format!("allgather_nvls_{n}{}", if inplace { "_ip" } else { "" });
    header(&name, "allgather", "Simple", inplace, gpus)
}

/// An all-gather of `n` ranks over LL packets and a switch channel on the scratch: block 0
/// packs the input into scratch slot `rank` and stores those packets into every member's slot;
/// block 1 unpacks every slot into the output.
pub fn allgather_nvls_ll(n: usize, inplace: bool) -> Value {
    let gpus = (0..n)
        .map(|r| {
            let src = if inplace {
                json!({"type": "o", "index": r, "size": 1})
            } else {
                json!({"type": "i", "index": 0, "size": 1})
            };
            let tb0 = vec![
                json!({"name": "cpkt", "src_buff": [src],
                       "dst_buff": [{"type": "s", "index": r, "size": 1}]}),
                json!({"name": "gstorepkt", "channel_type": "switch",
                       "src_buff": [{"type": "s", "index": r, "size": 1}],
                       "dst_buff": [{"switch_channel_id": 0, "index": r, "size": 1}]}),
            ];
            // In place, the own chunk is already in the output.
            let tb1: Vec<Value> = (0..n)
                .filter(|&p| !(inplace && p == r))
                .map(|p| {
                    json!({"name": "upkt",
                        "src_buff": [{"type": "s", "index": p, "size": 1}],
                        "dst_buff": [{"type": "o", "index": p, "size": 1}]})
                })
                .collect();
            json!({
                "id": r, "input_chunks": 1, "output_chunks": n, "scratch_chunks": n,
                "channels": [switch_channel("s", n)],
                "remote_buffers": [],
                "semaphores": [],
                "threadblocks": [
                    {"id": 0, "ops": tb0,
                     "channels": [{"channel_type": "switch", "channel_ids": [0]}],
                     "remote_buffer_refs": []},
                    {"id": 1, "ops": tb1, "channels": [], "remote_buffer_refs": []},
                ],
            })
        })
        .collect();
    let name = format!("allgather_nvls_ll_{n}{}", if inplace { "_ip" } else { "" });
    header(&name, "allgather", "LL", inplace, gpus)
}
