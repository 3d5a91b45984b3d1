//! Reads and validates MSCCL++ execution plans: `check_plan FILE...` prints, for each file, the
//! plan's name, collective, protocol and rank count, or the error naming the offending field.
//! The rank count is taken from the plan itself.

fn main() {
    let mut failed = false;
    for arg in std::env::args().skip(1) {
        let path = std::path::Path::new(&arg);
        // The rank count is the plan's own: read it first, then validate against it.
        let nranks = std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v.get("gpus").and_then(|g| g.as_array()).map(|g| g.len()))
            .unwrap_or(0);
        match mscclpp_executor::Plan::from_file(path, nranks) {
            Ok(p) => {
                let multicast = (0..p.nranks())
                    .find_map(|r| p.first_multicast_op(r))
                    .map_or(String::new(), |op| format!(" (multicast: {op})"));
                println!(
                    "ok   {arg}: {} {} {:?} {} ranks{multicast}",
                    p.name,
                    p.collective,
                    p.protocol,
                    p.nranks()
                );
            }
            Err(e) => {
                failed = true;
                println!("FAIL {arg}: {e}");
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
