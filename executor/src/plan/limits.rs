//! The limits a plan is checked against. A plan is untrusted input, and every count it gives
//! becomes device records or loop bounds in the interpreter kernel, so each is capped here; the
//! kernel and the flattened layout size their tables from the same constants.

/// Largest plan accepted, in bytes (the DSL's largest single-node plans are a few hundred KiB).
pub const MAX_PLAN_BYTES: usize = 64 << 20;
/// Most ranks a plan may describe.
pub const MAX_GPUS: usize = 256;
/// Most threadblocks per rank.
pub const MAX_THREADBLOCKS: usize = 1024;
/// Most operations per threadblock (pipeline bodies included).
pub const MAX_OPS: usize = 1 << 16;
/// Most buffer references on either side of one operation (MSCCL++: 2 local + 8 through channels).
pub const MAX_BUFFERS_PER_OP: usize = 10;
/// Most channels (or semaphores) one operation names.
pub const MAX_IDS_PER_OP: usize = 16;
/// Most channels of one type, remote buffers, or semaphores per rank (device indexes are bytes).
pub const MAX_PER_RANK: usize = 255;
/// Most device barriers (`barrier_id` below this).
pub const MAX_BARRIERS: u32 = 16;
/// Most chunks a buffer may be cut into.
pub const MAX_CHUNKS: u64 = 1 << 24;
