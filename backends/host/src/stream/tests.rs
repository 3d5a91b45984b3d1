//! The host stream's tests: the bounded queue (a full one blocks its producer, memory stays flat
//! over many operations), flag waits between streams and their abort, and an event recorded
//! behind an error. A file of its own because they exercise the stream, its events and its
//! worker together; the module path (`stream::tests`) is what the RSS probe runs itself by.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use mscclpp_hal::{Backend, ErrorClass, MemoryKind, Stream};

use super::HostStream;
use crate::HostBackend;

#[test]
fn a_full_queue_blocks_the_producer_until_its_deadline() {
    let s = HostStream::with_queue(4, Duration::from_millis(200)).unwrap();
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = std::sync::Mutex::new(release_rx);
    s.submit(std::sync::Arc::new(move || {
        let _ = started_tx.send(());
        let _ = release_rx
            .lock()
            .map(|r| r.recv_timeout(Duration::from_secs(30)));
        Ok(())
    }))
    .unwrap();
    started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    for _ in 0..4 {
        s.submit(std::sync::Arc::new(|| Ok(()))).unwrap();
    }
    let t = Instant::now();
    let e = s.submit(std::sync::Arc::new(|| Ok(()))).unwrap_err();
    assert_eq!(e.class(), ErrorClass::Timeout, "{e}");
    assert!(e.to_string().contains("full host stream queue"), "{e}");
    assert!(t.elapsed() >= Duration::from_millis(200));
    release_tx.send(()).unwrap();
    s.synchronize_timeout(Duration::from_secs(10)).unwrap();
    // Room again: the producer goes on.
    s.submit(std::sync::Arc::new(|| Ok(()))).unwrap();
    s.synchronize_timeout(Duration::from_secs(10)).unwrap();
}

#[test]
fn wait_value64_holds_later_work_until_another_stream_writes_the_flag() {
    use mscclpp_hal::WaitCmp;
    let dev = HostBackend::new().open_device(0).unwrap();
    let flag = dev.alloc(16, MemoryKind::Device).unwrap();
    let data = dev.alloc(8, MemoryKind::Device).unwrap();
    let (waiter, writer) = (HostStream::new().unwrap(), HostStream::new().unwrap());
    waiter.fill(&flag.full(), 0).unwrap();
    waiter.fill(&data.full(), 0).unwrap();
    waiter.synchronize().unwrap();
    let word = flag.slice(0..8).unwrap();
    waiter.wait_value64(&word, 2, WaitCmp::Geq).unwrap();
    waiter.fill(&data.full(), 7).unwrap();
    writer.write_value64(&word, 1).unwrap();
    writer.synchronize().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let mut seen = [0u8; 8];
    writer.read_to_host(&mut seen, &data.full()).unwrap();
    assert_eq!(seen, [0; 8], "the fill ran before the flag reached 2");
    writer.write_value64(&word, 2).unwrap();
    waiter.synchronize_timeout(Duration::from_secs(10)).unwrap();
    waiter.read_to_host(&mut seen, &data.full()).unwrap();
    assert_eq!(seen, [7; 8]);
    // Eq waits for the exact value; a misaligned or short flag is refused.
    waiter.wait_value64(&word, 2, WaitCmp::Eq).unwrap();
    waiter.synchronize_timeout(Duration::from_secs(10)).unwrap();
    let e = waiter
        .wait_value64(&flag.slice(4..12).unwrap(), 1, WaitCmp::Eq)
        .unwrap_err();
    assert!(e.to_string().contains("8-byte aligned"), "{e}");
    assert!(
        WaitCmp::Geq.holds(0, u64::MAX),
        "cyclic comparison, as the GPUs do"
    );
    assert!(!WaitCmp::Geq.holds(1, 2));
}

#[test]
fn wait_value64_ends_with_the_abort_error() {
    use mscclpp_hal::WaitCmp;
    let dev = HostBackend::new().open_device(0).unwrap();
    let flag = dev.alloc(16, MemoryKind::Device).unwrap();
    let s = HostStream::new().unwrap();
    s.fill(&flag.full(), 0).unwrap();
    // The abort word: rank 1 died (value rank + 1).
    let abort = flag.slice(8..16).unwrap();
    s.write_value64(&abort, 2).unwrap();
    s.synchronize().unwrap();
    {
        let _scope = mscclpp_hal::dev::abort_scope(abort.ptr().0);
        s.wait_value64(&flag.slice(0..8).unwrap(), 1, WaitCmp::Eq)
            .unwrap();
    }
    let t = Instant::now();
    let e = s.synchronize_timeout(Duration::from_secs(30)).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(10), "{e}");
    assert!(e.to_string().contains("rank 1"), "{e}");
}

/// A stream that failed still reaches the events it records after the failure, carrying the
/// error: a stream waiting for one fails with it (naming the dead rank) at once instead of
/// waiting for its deadline; a later record on a healthy stream clears it.
#[test]
fn an_event_recorded_behind_an_error_fails_its_waiters() {
    use mscclpp_hal::WaitCmp;
    let dev = HostBackend::new().open_device(0).unwrap();
    let flag = dev.alloc(16, MemoryKind::Device).unwrap();
    let (a, b) = (HostStream::new().unwrap(), HostStream::new().unwrap());
    a.fill(&flag.full(), 0).unwrap();
    let abort = flag.slice(8..16).unwrap();
    a.write_value64(&abort, 3).unwrap();
    a.synchronize().unwrap();
    let ev = super::HostEvent::default();
    {
        let _scope = mscclpp_hal::dev::abort_scope(abort.ptr().0);
        a.wait_value64(&flag.slice(0..8).unwrap(), 1, WaitCmp::Eq)
            .unwrap();
    }
    a.record(&ev).unwrap();
    b.wait_event(&ev).unwrap();
    let t = Instant::now();
    let e = b.synchronize_timeout(Duration::from_secs(30)).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(10), "{e}");
    assert!(e.to_string().contains("rank 2"), "{e}");
    assert!(a.synchronize().is_err());
    // Healthy again (the errors were taken by the synchronisations): records clear it.
    a.record(&ev).unwrap();
    b.wait_event(&ev).unwrap();
    b.synchronize_timeout(Duration::from_secs(10)).unwrap();
}

const RSS_OPS_VAR: &str = "MSCCLPP_HOST_STREAM_RSS_OPS";

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Runs `rss_probe` in a process of its own (the other tests of this binary allocate in
/// parallel and would move the figure), with `ops` operations.
fn probe_in_child(ops: u64) {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "stream::tests::rss_probe",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(RSS_OPS_VAR, ops.to_string())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("rss_probe: done"),
        "the probe did not run:\n{text}"
    );
    eprintln!("{text}");
}

#[test]
fn a_million_operations_keep_rss_flat() {
    probe_in_child(1_000_000);
}

#[test]
#[ignore = "10^8 operations take minutes; run with --ignored (docs/faults.md)"]
fn a_hundred_million_operations_keep_rss_flat() {
    probe_in_child(100_000_000);
}

/// Enqueues `MSCCLPP_HOST_STREAM_RSS_OPS` one-word fills without waiting and checks that
/// the resident set stays within a bound independent of the count.
#[test]
#[ignore = "run in a process of its own by a_million_operations_keep_rss_flat"]
fn rss_probe() {
    let Some(ops) = std::env::var(RSS_OPS_VAR)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return;
    };
    let dev = HostBackend::new().open_device(0).unwrap();
    let buf = dev.alloc(8, MemoryKind::Device).unwrap();
    let s = HostStream::new().unwrap();
    for i in 0..4 * super::QUEUE_DEPTH {
        s.fill(&buf.full(), i as u8).unwrap();
    }
    s.synchronize().unwrap();
    let base = rss_bytes();
    // A worker that falls behind (a kernel waiting for a slow peer): without a bound the
    // producer queues everything it can in the meantime.
    s.submit(std::sync::Arc::new(|| {
        std::thread::sleep(Duration::from_millis(300));
        Ok(())
    }))
    .unwrap();
    let mut peak = base;
    let t = Instant::now();
    let step = (ops / 10).max(1);
    for i in 0..ops {
        s.fill(&buf.full(), i as u8).unwrap();
        if i % step == step - 1 {
            let r = rss_bytes();
            peak = peak.max(r);
            println!(
                "rss_probe: {:>11} ops  {:>7.1} s  rss {:>7} KiB (+{} KiB)",
                i + 1,
                t.elapsed().as_secs_f64(),
                r / 1024,
                r.saturating_sub(base) / 1024
            );
        }
    }
    s.synchronize().unwrap();
    // The queue holds at most QUEUE_DEPTH small jobs; allocator slack on top of that.
    const BOUND: u64 = 16 << 20;
    let growth = peak.saturating_sub(base);
    assert!(
        growth < BOUND,
        "rss grew by {growth} bytes over {ops} operations (bound {BOUND})"
    );
    println!("rss_probe: done, {ops} ops, growth {} KiB", growth / 1024);
}
