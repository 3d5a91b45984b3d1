//! Prints one of the plans written in code (`mscclpp_executor::testgen`) as MSCCL++'s JSON, for
//! `mscclpp-perf plan` and `run_plan`: `emit_plan NAME N [ip]` (allreduce_simple, allreduce_ll,
//! allgather_simple, allreduce_nvls, allgather_nvls, allgather_nvls_ll over N ranks) or
//! `emit_plan allgather_hosts HOSTS PER_HOST [ip]` (memory channels within a host, port channels
//! between hosts).

use mscclpp_executor::testgen;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> usize {
        args.get(i).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            eprintln!("emit_plan: argument {} must be a count", i + 1);
            std::process::exit(2)
        })
    };
    let name = args.first().map(String::as_str).unwrap_or("");
    let ip = |i: usize| args.get(i).is_some_and(|s| s == "ip");
    let plan = match name {
        "allreduce_simple" => testgen::allreduce_simple(num(1), ip(2)),
        "allreduce_ll" => testgen::allreduce_ll(num(1), ip(2)),
        "allgather_simple" => testgen::allgather_simple(num(1), ip(2)),
        "allreduce_nvls" => testgen::allreduce_nvls(num(1), ip(2)),
        "allgather_nvls" => testgen::allgather_nvls(num(1), ip(2)),
        "allgather_nvls_ll" => testgen::allgather_nvls_ll(num(1), ip(2)),
        "allgather_hosts" => testgen::allgather_hosts(num(1), num(2), ip(3)),
        other => {
            eprintln!("emit_plan: unknown plan {other:?} (see the source's list)");
            std::process::exit(2)
        }
    };
    println!("{plan:#}");
}
