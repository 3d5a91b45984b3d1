use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use mscclpp_hal::dev::{FifoDeviceHandle, ProxyTrigger, TriggerType};
use mscclpp_hal::{Backend, Device, ErrorClass, IpcHandle};

use super::*;

const WAIT: Duration = Duration::from_secs(20);
const ROLE_VAR: &str = "MSCCLPP_PROXY_TEST_ROLE";

fn device() -> Arc<dyn Device> {
    mscclpp_host::HostBackend::new().open_device(0).unwrap()
}

fn fifo(size: usize) -> Arc<Fifo> {
    Arc::new(Fifo::new(&device(), size).unwrap())
}

/// A trigger that encodes `i` in every field, so that any corruption or reordering shows.
fn numbered(i: u64) -> ProxyTrigger {
    ProxyTrigger::new(
        1 + i % 7,
        ((i / 512) % 512) as u32,
        i.wrapping_mul(2_654_435_761) & 0xffff_ffff,
        (i % 512) as u32,
        !i & 0xffff_ffff,
        i & 0xffff_ffff,
        ((i * 7) % 1024) as u32,
    )
    .unwrap()
}

/// A trigger from producer `p` with sequence number `seq`.
fn tagged(p: u32, seq: u64) -> ProxyTrigger {
    ProxyTrigger::new(TriggerType::DATA, 0, 0, 0, seq >> 32, seq & 0xffff_ffff, p).unwrap()
}

fn push(h: &FifoDeviceHandle, t: ProxyTrigger, timeout: Duration) -> mscclpp_hal::Result<u64> {
    // SAFETY: `h` comes from a `Fifo` the caller keeps alive for the whole test.
    unsafe { h.push(t, timeout) }
}

fn sync(h: &FifoDeviceHandle, pos: u64, timeout: Duration) -> mscclpp_hal::Result<()> {
    // SAFETY: as in `push`.
    unsafe { h.sync(pos, timeout) }
}

fn mismatch(pos: u64, got: ProxyTrigger, want: ProxyTrigger) -> Error {
    Error::Internal(format!("position {pos}: got {got:?}, expected {want:?}"))
}

#[test]
fn sizes_are_checked() {
    let dev = device();
    for bad in [0usize, 3, 12, MAX_FIFO_SIZE * 2] {
        let e = Fifo::new(&dev, bad).unwrap_err();
        assert_eq!(e.class(), ErrorClass::InvalidUsage);
        assert!(e.to_string().contains(&format!("{bad} slots")), "{e}");
    }
    let f = Fifo::new(&dev, 1).unwrap();
    assert_eq!((f.size(), f.tail(), f.poll()), (1, 0, None));
    let h = f.device_handle();
    assert_eq!(h.size, 1);
    assert_eq!(h.triggers, f.triggers_buffer().ptr().0);
    assert_eq!(f.triggers_buffer().len(), 16);
    assert_eq!((f.head_buffer().len(), f.tail_buffer().len()), (8, 8));
}

#[test]
fn poll_and_pop_by_hand_across_laps() {
    let f = fifo(2);
    let h = f.device_handle();
    for i in 0..7 {
        assert_eq!(f.poll(), None);
        assert_eq!(push(&h, numbered(i), WAIT).unwrap(), i);
        assert_eq!(f.poll(), Some(numbered(i)), "position {i}");
        assert_eq!(f.tail(), i);
        f.pop();
    }
    assert_eq!((f.tail(), f.poll()), (7, None));
}

#[test]
fn one_producer_a_million_triggers_in_order() {
    const N: u64 = 1_000_000;
    let f = fifo(8);
    let h = f.device_handle();
    let proxy = Proxy::start(Arc::clone(&f), move |t, pos| {
        let want = numbered(pos);
        if t != want {
            return Err(mismatch(pos, t, want));
        }
        Ok(ProxyHandlerResult::Continue)
    })
    .unwrap();
    let start = Instant::now();
    let producer = thread::spawn(move || -> mscclpp_hal::Result<()> {
        let mut last = 0;
        for i in 0..N {
            last = push(&h, numbered(i), WAIT)?;
            assert_eq!(last, i);
        }
        sync(&h, last, WAIT)
    });
    producer.join().unwrap().unwrap();
    let elapsed = start.elapsed();
    assert_eq!(f.tail(), N);
    proxy.stop().unwrap();
    eprintln!(
        "1 producer, ring of 8: {N} triggers in {elapsed:?} = {:.2} M triggers/s",
        N as f64 / elapsed.as_secs_f64() / 1e6
    );
}

#[test]
fn four_producers_each_in_order_none_lost() {
    const P: u32 = 4;
    const N: u64 = 250_000;
    let f = fifo(8);
    let h = f.device_handle();
    let mut next = vec![0u64; P as usize];
    let proxy = Proxy::start(Arc::clone(&f), move |t, pos| {
        let p = t.semaphore_id() as usize;
        let seq = t.size() | (t.src_offset() << 32);
        let Some(expected) = next.get_mut(p) else {
            return Err(Error::Internal(format!("position {pos}: producer {p}?")));
        };
        if seq != *expected || t != tagged(p as u32, seq) {
            return Err(Error::Internal(format!(
                "position {pos}: producer {p} sent {seq} (fields {t:?}), expected {expected}"
            )));
        }
        *expected += 1;
        Ok(ProxyHandlerResult::Continue)
    })
    .unwrap();
    let start = Instant::now();
    let producers: Vec<_> = (0..P)
        .map(|p| {
            thread::spawn(move || -> mscclpp_hal::Result<u64> {
                let mut last = 0;
                for seq in 0..N {
                    last = push(&h, tagged(p, seq), WAIT)?;
                }
                Ok(last)
            })
        })
        .collect();
    let last = producers
        .into_iter()
        .map(|t| t.join().unwrap().unwrap())
        .max()
        .unwrap();
    sync(&h, last, WAIT).unwrap();
    let elapsed = start.elapsed();
    assert_eq!(f.tail(), u64::from(P) * N);
    // Every per-producer sequence was checked in order; the count shows none was duplicated.
    proxy.stop().unwrap();
    eprintln!(
        "{P} producers, ring of 8: {} triggers in {elapsed:?} = {:.2} M triggers/s",
        u64::from(P) * N,
        (u64::from(P) * N) as f64 / elapsed.as_secs_f64() / 1e6
    );
}

#[test]
fn sync_returns_only_after_the_handler_finished() {
    let f = fifo(4);
    let h = f.device_handle();
    let done = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&done);
    let proxy = Proxy::start(Arc::clone(&f), move |t, _| {
        if t.kind() & TriggerType::SYNC != 0 {
            thread::sleep(Duration::from_millis(30));
            flag.store(true, Ordering::Relaxed);
        }
        Ok(ProxyHandlerResult::Continue)
    })
    .unwrap();
    push(&h, numbered(1), WAIT).unwrap();
    let sync_trigger = ProxyTrigger::new(TriggerType::SYNC, 0, 0, 0, 0, 0, 0).unwrap();
    let start = Instant::now();
    let pos = push(&h, sync_trigger, WAIT).unwrap();
    sync(&h, pos, WAIT).unwrap();
    // Relaxed is enough: the tail's release/acquire orders the handler's store before this.
    assert!(
        done.load(Ordering::Relaxed),
        "sync returned before the handler finished"
    );
    assert!(start.elapsed() >= Duration::from_millis(30));
    proxy.stop().unwrap();
}

#[test]
fn full_ring_blocks_push_until_the_proxy_moves_on() {
    let f = fifo(4);
    let h = f.device_handle();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let entered = Arc::new(Barrier::new(2));
    let in_handler = Arc::clone(&entered);
    let proxy = Proxy::start(Arc::clone(&f), move |_, pos| {
        if pos == 0 {
            in_handler.wait();
            release_rx
                .recv_timeout(WAIT)
                .map_err(|e| Error::Internal(format!("release: {e}")))?;
        }
        Ok(ProxyHandlerResult::Continue)
    })
    .unwrap();
    for i in 0..4 {
        push(&h, numbered(i), WAIT).unwrap();
    }
    entered.wait();
    // Positions 0..4 fill the ring and the handler holds 0: position 4 has no slot.
    let e = push(&h, numbered(4), Duration::from_millis(50)).unwrap_err();
    assert_eq!(e.class(), ErrorClass::Timeout);
    assert!(e.to_string().contains("position 4"), "{e}");
    // A blocked push goes through once the proxy moves on.
    let blocked = thread::spawn(move || push(&h, numbered(5), WAIT));
    thread::sleep(Duration::from_millis(20));
    assert!(!blocked.is_finished());
    release_tx.send(()).unwrap();
    // Position 5 was claimed after the abandoned 4, so it lands in the ring.
    assert_eq!(blocked.join().unwrap().unwrap(), 5);
    let deadline = Instant::now() + WAIT;
    while f.tail() < 4 {
        assert!(Instant::now() < deadline, "the proxy did not drain");
        thread::sleep(Duration::from_millis(1));
    }
    // The timed-out push claimed position 4 and never published it: the proxy waits there.
    thread::sleep(Duration::from_millis(20));
    assert_eq!(f.tail(), 4);
    proxy.stop().unwrap();
}

#[test]
fn handler_error_stops_the_proxy_and_sync_times_out() {
    let f = fifo(8);
    let h = f.device_handle();
    let proxy = Proxy::start(Arc::clone(&f), move |_, pos| {
        if pos == 2 {
            Err(Error::invalid("trigger 2 is refused"))
        } else {
            Ok(ProxyHandlerResult::Continue)
        }
    })
    .unwrap();
    let mut last = 0;
    for i in 0..3 {
        last = push(&h, numbered(i), WAIT).unwrap();
    }
    sync(&h, 1, WAIT).unwrap();
    let e = sync(&h, last, Duration::from_millis(100)).unwrap_err();
    assert_eq!(e.class(), ErrorClass::Timeout, "{e}");
    assert!(!proxy.is_running());
    assert!(proxy.error().unwrap().contains("trigger 2 is refused"));
    assert_eq!(f.tail(), 2, "the failed trigger is not acknowledged");
    let e = proxy.stop().unwrap_err();
    assert_eq!(e.class(), ErrorClass::InvalidUsage);
    assert!(e.to_string().contains("trigger 2 is refused"), "{e}");
}

#[test]
fn handler_panic_becomes_an_internal_error() {
    let f = fifo(8);
    let h = f.device_handle();
    let proxy = Proxy::start(Arc::clone(&f), |_, pos| {
        if pos == 1 {
            panic!("handler gave up at {pos}");
        }
        Ok(ProxyHandlerResult::Continue)
    })
    .unwrap();
    push(&h, numbered(0), WAIT).unwrap();
    let pos = push(&h, numbered(1), WAIT).unwrap();
    let e = sync(&h, pos, Duration::from_millis(100)).unwrap_err();
    assert_eq!(e.class(), ErrorClass::Timeout);
    let e = proxy.join().unwrap_err();
    assert_eq!(e.class(), ErrorClass::Internal);
    let msg = e.to_string();
    assert!(
        msg.contains("handler gave up at 1") && msg.contains("position 1"),
        "{msg}"
    );
}

#[test]
fn stop_result_ends_the_proxy_after_acknowledging() {
    let f = fifo(8);
    let h = f.device_handle();
    let proxy = Proxy::start(Arc::clone(&f), |t, _| {
        Ok(if t.kind() & TriggerType::FLAG != 0 {
            ProxyHandlerResult::Stop
        } else {
            ProxyHandlerResult::Continue
        })
    })
    .unwrap();
    push(
        &h,
        ProxyTrigger::new(TriggerType::DATA, 0, 0, 0, 0, 1, 0).unwrap(),
        WAIT,
    )
    .unwrap();
    let pos = push(
        &h,
        ProxyTrigger::new(TriggerType::FLAG, 0, 0, 0, 0, 0, 0).unwrap(),
        WAIT,
    )
    .unwrap();
    sync(&h, pos, WAIT).unwrap();
    proxy.join().unwrap();
    assert_eq!(f.tail(), 2);
}

#[test]
fn one_proxy_per_fifo_and_a_restart_carries_on() {
    let f = fifo(8);
    let h = f.device_handle();
    let seen = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&seen);
    let first = Proxy::start(Arc::clone(&f), move |_, _| {
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(ProxyHandlerResult::Continue)
    })
    .unwrap();
    let e = Proxy::start(Arc::clone(&f), |_, _| Ok(ProxyHandlerResult::Continue)).unwrap_err();
    assert_eq!(e.class(), ErrorClass::InvalidUsage);
    let pos = push(&h, numbered(0), WAIT).unwrap();
    sync(&h, pos, WAIT).unwrap();
    first.stop().unwrap();
    // Pushed while no proxy runs: stays in the FIFO for the next one.
    push(&h, numbered(1), WAIT).unwrap();
    thread::sleep(Duration::from_millis(5));
    assert_eq!(f.tail(), 1);
    let second = Proxy::start(Arc::clone(&f), |t, pos| {
        if t == numbered(pos) {
            Ok(ProxyHandlerResult::Continue)
        } else {
            Err(mismatch(pos, t, numbered(pos)))
        }
    })
    .unwrap();
    let pos = push(&h, numbered(2), WAIT).unwrap();
    sync(&h, pos, WAIT).unwrap();
    second.stop().unwrap();
    assert_eq!(seen.load(Ordering::Relaxed), 1);
}

#[test]
fn idle_proxy_stops_at_once_and_a_stuck_one_times_out() {
    let f = fifo(8);
    let proxy = Proxy::start(Arc::clone(&f), |_, _| Ok(ProxyHandlerResult::Continue)).unwrap();
    // Long enough to be in the sleeping phase.
    thread::sleep(Duration::from_millis(30));
    let start = Instant::now();
    proxy.stop().unwrap();
    let took = start.elapsed();
    eprintln!("idle proxy stopped in {took:?}");
    assert!(took < Duration::from_millis(100), "{took:?}");

    let h = f.device_handle();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let proxy = Proxy::start(Arc::clone(&f), move |_, _| {
        let _ = release_rx.recv_timeout(WAIT);
        Ok(ProxyHandlerResult::Continue)
    })
    .unwrap();
    let pos = push(&h, numbered(0), WAIT).unwrap();
    // Wait until the handler holds the trigger.
    thread::sleep(Duration::from_millis(20));
    let e = proxy.stop_timeout(Duration::from_millis(50)).unwrap_err();
    assert_eq!(e.class(), ErrorClass::Timeout);
    assert!(e.to_string().contains(&format!("position {pos}")), "{e}");
    // The detached thread finishes the trigger and ends, giving the FIFO back.
    release_tx.send(()).unwrap();
    sync(&h, pos, WAIT).unwrap();
    let deadline = Instant::now() + WAIT;
    let third = loop {
        match Proxy::start(Arc::clone(&f), |_, _| Ok(ProxyHandlerResult::Continue)) {
            Ok(p) => break p,
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("the detached proxy never ended: {e}"),
        }
    };
    drop(third);
}

/// Nanoseconds the calling thread has run (Linux schedstat), if the kernel reports them.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

#[test]
fn idle_cost_and_wake_up_latency() {
    let f = fifo(8);
    let h = f.device_handle();
    let (tx, rx) = mpsc::channel::<Option<u64>>();
    let proxy = Proxy::start(Arc::clone(&f), move |_, _| {
        let _ = tx.send(thread_cpu_ns());
        Ok(ProxyHandlerResult::Continue)
    })
    .unwrap();
    let pos = push(&h, numbered(0), WAIT).unwrap();
    sync(&h, pos, WAIT).unwrap();
    let idle = Duration::from_millis(500);
    thread::sleep(idle);
    // The first trigger after a long idle waits out (part of) a maximal sleep.
    let start = Instant::now();
    let pos = push(&h, numbered(1), WAIT).unwrap();
    sync(&h, pos, WAIT).unwrap();
    let wake = start.elapsed();
    // Back to back, while the proxy polls flat out.
    let start = Instant::now();
    for i in 2..1002 {
        let pos = push(&h, numbered(i), WAIT).unwrap();
        sync(&h, pos, WAIT).unwrap();
    }
    let round_trip = start.elapsed() / 1000;
    proxy.stop().unwrap();
    let cpu: Vec<Option<u64>> = rx.try_iter().take(2).collect();
    let cost = match cpu[..] {
        [Some(a), Some(b)] => format!(
            "{:.2}% of a core",
            (b - a) as f64 / idle.as_nanos() as f64 * 100.0
        ),
        _ => "unknown (no /proc/thread-self/schedstat)".into(),
    };
    eprintln!(
        "idle proxy ({:?}): CPU while idle {cost}; first trigger after idle {wake:?}; \
         push+sync round trip when hot {round_trip:?}",
        ProxyConfig::default()
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

const CROSS_N: u64 = 100_000;

/// The child's side of [`producer_in_another_process`]: imports the FIFO and pushes.
fn cross_process_child() {
    let dev = device();
    let env = |k: &str| std::env::var(k).unwrap();
    let import = |k: &str| {
        let handle = IpcHandle::from_bytes(&unhex(&env(k))).unwrap();
        dev.ipc_import(&handle).unwrap()
    };
    let (triggers, head, tail) = (
        import("FIFO_TRIGGERS"),
        import("FIFO_HEAD"),
        import("FIFO_TAIL"),
    );
    let h = FifoDeviceHandle {
        triggers: triggers.ptr().0,
        head: head.ptr().0,
        tail: tail.ptr().0,
        size: env("FIFO_SIZE").parse().unwrap(),
        _pad: 0,
    };
    let start = Instant::now();
    let mut last = 0;
    for i in 0..CROSS_N {
        last = push(&h, numbered(i), WAIT).unwrap();
    }
    sync(&h, last, WAIT).unwrap();
    eprintln!(
        "child: {CROSS_N} triggers in {:?} = {:.2} M triggers/s",
        start.elapsed(),
        CROSS_N as f64 / start.elapsed().as_secs_f64() / 1e6
    );
    // The mappings (`triggers`, `head`, `tail`) stay alive until here.
}

#[test]
fn producer_in_another_process() {
    if std::env::var(ROLE_VAR).as_deref() == Ok("fifo-producer") {
        return cross_process_child();
    }
    let dev = device();
    let f = Arc::new(Fifo::new(&dev, 8).unwrap());
    let proxy = Proxy::start(Arc::clone(&f), |t, pos| {
        if t == numbered(pos) {
            Ok(ProxyHandlerResult::Continue)
        } else {
            Err(mismatch(pos, t, numbered(pos)))
        }
    })
    .unwrap();
    let export = |b: &mscclpp_hal::DeviceBuffer| hex(&dev.ipc_export(b).unwrap().to_bytes());
    let vars: HashMap<&str, String> = HashMap::from([
        ("FIFO_TRIGGERS", export(f.triggers_buffer())),
        ("FIFO_HEAD", export(f.head_buffer())),
        ("FIFO_TAIL", export(f.tail_buffer())),
        ("FIFO_SIZE", f.size().to_string()),
    ]);
    let name = concat!(module_path!(), "::producer_in_another_process");
    let name = name.split_once("::").map_or(name, |(_, rest)| rest);
    let start = Instant::now();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(ROLE_VAR, "fifo-producer")
        .envs(vars)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = start + WAIT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        thread::sleep(Duration::from_millis(5));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.success() && stdout.contains("1 passed"),
        "child {status}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    eprintln!(
        "{} (whole child process, start-up included: {:?})",
        stderr
            .lines()
            .find(|l| l.starts_with("child:"))
            .unwrap_or("?"),
        start.elapsed()
    );
    assert_eq!(f.tail(), CROSS_N);
    proxy.stop().unwrap();
}

/// `drain` returns once every trigger pushed before it is handled (a stop right after it then
/// loses none), and says so.
#[test]
fn drain_waits_for_the_triggers_already_pushed() {
    const N: u64 = 40;
    let f = fifo(64);
    let h = f.device_handle();
    let handled = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&handled);
    let proxy = Proxy::start(Arc::clone(&f), move |_, _| {
        thread::sleep(Duration::from_millis(2));
        count.fetch_add(1, Ordering::SeqCst);
        Ok(ProxyHandlerResult::Continue)
    })
    .unwrap();
    for i in 0..N {
        push(&h, numbered(i), WAIT).unwrap();
    }
    assert!(proxy.drain(Duration::from_secs(10)), "the FIFO drained");
    assert_eq!(
        handled.load(Ordering::SeqCst),
        N,
        "every trigger pushed before the drain"
    );
    proxy.stop().unwrap();
}
