//! NCCL's RAS client service, served by this library: tools that read NCCL's RAS (its `ncclras`
//! client, Ray Train's hang detection, SGLang's crash detection) read ours.
//!
//! As NCCL 2.28+: on by default (`NCCL_RAS_ENABLE` other than `1` turns it off), listening on
//! `NCCL_RAS_ADDR` (default `localhost:28028`) from the first communicator of the process on;
//! every process of a node binds the same port (`SO_REUSEPORT`) and any of them answers for the
//! job; a port that cannot be bound is logged and the job goes on. The client protocol
//! (version 2) is plain text, one command a line: `CLIENT PROTOCOL <n>` (answered
//! `SERVER PROTOCOL 2`), `TIMEOUT <s>`, `SET FORMAT text|json`, `STATUS`, `VERBOSE STATUS` (the
//! report, then the connection closes) and `MONITOR [groups]` (`OK`, then peer events:
//! [`monitor`]). The report has NCCL's layout: a job summary, the communicators grouped by size,
//! nodes, status and errors, then the errors (missing ranks) and warnings (ranks whose status or
//! per-collective counts differ); as JSON, NCCL's document.
//!
//! Where the data comes from: each communicator of the process that answers is surveyed over
//! its bootstrap (every rank's event loop answers with its calls per operation and the card
//! [`publish`] set: process, host, device, state), so one process reports every rank of its
//! communicators. A communicator none of whose ranks lives in the answering process is not
//! reported (NCCL's RAS network reaches every process of the job).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::comm::Comm;

mod monitor;

/// The protocol version NCCL's clients speak (every release since 2.24).
const PROTOCOL: u32 = 2;
/// How long a survey waits for the ranks by default (NCCL: 5 s, times its timeout factor).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The collectives NCCL counts, in its order, with the names our calls are noted under.
const FUNCS: [(&str, &str); 5] = [
    ("Broadcast", "broadcast"),
    ("Reduce", "reduce"),
    ("AllGather", "allgather"),
    ("ReduceScatter", "reducescatter"),
    ("AllReduce", "allreduce"),
];

/// Starts the service once per process (at the first communicator), unless turned off.
pub fn start() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        if std::env::var("NCCL_RAS_ENABLE").is_ok_and(|v| v.trim() != "1") {
            return;
        }
        let addr = std::env::var("NCCL_RAS_ADDR").unwrap_or_else(|_| "localhost:28028".into());
        match listen(&addr) {
            Ok(l) => {
                let spawned = std::thread::Builder::new()
                    .name("nccl-ras".into())
                    .spawn(move || serve(l));
                if let Err(e) = spawned {
                    tracing::info!(target: crate::debug::INIT, "RAS: no service thread: {e}");
                }
            }
            Err(e) => tracing::info!(
                target: crate::debug::INIT,
                "RAS failed to establish a client listening socket at {addr}: {e}"
            ),
        }
    });
}

/// Binds `addr` (`host:port`, `[v6]:port`) with `SO_REUSEADDR` and `SO_REUSEPORT`, so that every
/// process of the node can listen on it.
fn listen(addr: &str) -> std::io::Result<TcpListener> {
    let sa: SocketAddr = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{addr} resolves to no address")))?;
    use std::os::fd::FromRawFd;
    let family = if sa.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket calls on a descriptor this function owns until it is handed to the
    // listener (closed on every error path); the address structures are built and sized here.
    unsafe {
        let fd = libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fail = |fd| {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            Err(e)
        };
        let one: libc::c_int = 1;
        for opt in [libc::SO_REUSEADDR, libc::SO_REUSEPORT] {
            let p = (&one as *const libc::c_int).cast();
            let len = size_of::<libc::c_int>() as libc::socklen_t;
            if libc::setsockopt(fd, libc::SOL_SOCKET, opt, p, len) != 0 {
                return fail(fd);
            }
        }
        let rc = match sa {
            SocketAddr::V4(a) => {
                let mut s: libc::sockaddr_in = std::mem::zeroed();
                s.sin_family = libc::AF_INET as libc::sa_family_t;
                s.sin_port = a.port().to_be();
                s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
                let len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
                libc::bind(fd, (&s as *const libc::sockaddr_in).cast(), len)
            }
            SocketAddr::V6(a) => {
                let mut s: libc::sockaddr_in6 = std::mem::zeroed();
                s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                s.sin6_port = a.port().to_be();
                s.sin6_addr.s6_addr = a.ip().octets();
                s.sin6_scope_id = a.scope_id();
                let len = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
                libc::bind(fd, (&s as *const libc::sockaddr_in6).cast(), len)
            }
        };
        if rc != 0 || libc::listen(fd, 128) != 0 {
            return fail(fd);
        }
        Ok(TcpListener::from_raw_fd(fd))
    }
}

fn serve(l: TcpListener) {
    for c in l.incoming() {
        let c = match c {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin.
                tracing::debug!(target: crate::debug::INIT, "RAS accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        // A client of its own thread: a survey takes seconds, the handshake must not wait.
        let _ = std::thread::Builder::new()
            .name("nccl-ras-client".into())
            .spawn(move || {
                if let Err(e) = client(c) {
                    tracing::debug!(target: crate::debug::INIT, "RAS client: {e}");
                }
            });
    }
}

/// One client's commands, until it closes, asks for the report, or sends a line too long.
fn client(stream: TcpStream) -> std::io::Result<()> {
    // An idle client does not keep its thread for ever.
    stream.set_read_timeout(Some(Duration::from_secs(3600)))?;
    let mut out = stream.try_clone()?;
    let mut input = BufReader::new(stream);
    let (mut json, mut timeout) = (false, DEFAULT_TIMEOUT);
    // The client's monitor subscription, dropped however the loop ends.
    struct Sub(Option<u64>);
    impl Drop for Sub {
        fn drop(&mut self) {
            if let Some(id) = self.0 {
                monitor::unsubscribe(id);
            }
        }
    }
    let mut sub = Sub(None);
    let mut line = String::new();
    loop {
        line.clear();
        let n = (&mut input).take(1024).read_line(&mut line)?;
        if n == 0 {
            return Ok(());
        }
        if !line.ends_with('\n') && n == 1024 {
            return Ok(()); // NCCL closes on a line that fills its buffer
        }
        let cmd = line.trim_end_matches(['\n', '\r']);
        let upper = cmd.to_ascii_uppercase();
        let words: Vec<&str> = cmd.split_whitespace().collect();
        if upper.starts_with("CLIENT PROTOCOL") {
            out.write_all(format!("SERVER PROTOCOL {PROTOCOL}\n").as_bytes())?;
        } else if upper.starts_with("TIMEOUT") {
            match words
                .get(1)
                .filter(|_| words.len() == 2)
                .and_then(|v| v.parse::<u64>().ok())
            {
                Some(0) => {
                    // No timeout: wait for the ranks as long as they take (a day at most).
                    timeout = Duration::from_secs(86_400);
                    out.write_all(b"OK\n")?;
                }
                Some(s) => {
                    timeout = Duration::from_secs(s);
                    out.write_all(b"OK\n")?;
                }
                None => out.write_all(
                    format!("ERROR: Invalid timeout value {}\n", words[1..].join(" ")).as_bytes(),
                )?,
            }
        } else if upper.starts_with("SET FORMAT") {
            match words.get(2).map(|f| f.to_ascii_lowercase()).as_deref() {
                Some(f @ ("text" | "json")) => {
                    json = f == "json";
                    if let Some(id) = sub.0 {
                        monitor::update(id, None, Some(json));
                    }
                    out.write_all(b"OK\n")?;
                }
                _ => out.write_all(
                    format!("ERROR: Invalid format {}\n", words[2..].join(" ")).as_bytes(),
                )?,
            }
        } else if upper == "STATUS" || upper == "VERBOSE STATUS" {
            let verbose = upper.starts_with("VERBOSE");
            let started = Instant::now();
            let comms = gather(timeout);
            let text = if json {
                render_json(&comms, started.elapsed())
            } else {
                render_text(&comms, started.elapsed(), verbose)
            };
            out.write_all(text.as_bytes())?;
            return Ok(());
        } else if upper == "MONITOR" || upper.starts_with("MONITOR ") {
            match monitor::parse_groups(words.get(1).copied()) {
                Err(bad) => {
                    out.write_all(format!("ERROR: Invalid event group '{bad}'\n").as_bytes())?
                }
                Ok(mask) => {
                    // `OK` before any event can be written.
                    out.write_all(b"OK\n")?;
                    match sub.0 {
                        Some(id) => monitor::update(id, Some(mask), Some(json)),
                        None => {
                            sub.0 = Some(monitor::subscribe(out.try_clone()?, mask, json));
                            // A monitoring client sends nothing more, for as long as it
                            // watches: no idle timeout from now on.
                            input.get_ref().set_read_timeout(None)?;
                        }
                    }
                }
            }
        } else {
            out.write_all(format!("ERROR: Unknown command {cmd}\n").as_bytes())?;
        }
    }
}

/// What a rank tells about itself (its card, set by [`publish`]).
#[derive(Debug, Clone, Default)]
struct Card {
    pid: i64,
    host: String,
    /// Its bootstrap's listen port (with `host`, how a peer's death names it).
    port: u16,
    cuda_dev: i64,
    init_state: i64,
    async_error: i64,
    finalize: bool,
    destroy: bool,
    abort: bool,
}

/// Publishes this rank's card for `c` (at creation and at each change of state): what every
/// rank's survey of the communicator reports for this rank.
pub fn publish(c: &Comm, destroying: bool, aborting: bool) {
    let Some(n) = &c.native else { return };
    let boot = n.communicator().bootstrap();
    let async_error = match c.native_failure() {
        Some(_) => crate::abi::NCCL_REMOTE_ERROR,
        None => c.async_error.load(std::sync::atomic::Ordering::Relaxed),
    };
    let card = json!({
        "pid": std::process::id(),
        "host": boot.listen_addr().ip().to_string(),
        "port": boot.listen_addr().port(),
        "cuda": c.device,
        "init": 0,
        "async": async_error,
        "fin": c.finalized.load(std::sync::atomic::Ordering::Relaxed),
        "destroy": destroying,
        "abort": aborting,
    });
    boot.set_card(card.to_string().as_bytes());
    watch(c, boot, destroying || aborting);
}

/// The failure handlers [`watch`] registered, by communicator (id, rank): (bootstrap, handler
/// id). Weak: a communicator released by a path that never says it ended (a failed creation)
/// is not kept alive here; its entry goes at the next [`watch`].
type Watches = BTreeMap<(u64, usize), (std::sync::Weak<mscclpp::comm::Bootstrap>, u64)>;

fn watches() -> std::sync::MutexGuard<'static, Watches> {
    static W: OnceLock<std::sync::Mutex<Watches>> = OnceLock::new();
    W.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The monitor's view of `c`: at its first card, a failure handler (each dead rank a
/// `PEER_DEAD`) and, while a client monitors, a survey of its cards (`PEER_NEW`); at its end
/// (`ending`), the handler removed.
fn watch(c: &Comm, boot: &Arc<mscclpp::comm::Bootstrap>, ending: bool) {
    let key = (c.id, c.rank);
    if ending {
        if let Some((b, id)) = watches().remove(&key)
            && let Some(b) = b.upgrade()
        {
            b.remove_failure_handler(id);
        }
        return;
    }
    // A finalize's card (possibly after the destroy that ended the watch) starts nothing.
    if c.finalized.load(std::sync::atomic::Ordering::Acquire) {
        return;
    }
    let mut w = watches();
    w.retain(|_, (b, _)| b.strong_count() > 0);
    if w.contains_key(&key) {
        return;
    }
    let id = boot.on_failure(Box::new(|f| monitor::dead(f.addr)));
    w.insert(key, (Arc::downgrade(boot), id));
    drop(w);
    if monitor::watched() {
        let b = Arc::clone(boot);
        // Off the creating thread: the peers publish their cards as they finish creating.
        let _ = std::thread::Builder::new()
            .name("nccl-ras-peers".into())
            .spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                let cards: Vec<(SocketAddr, Card)> = b
                    .survey(DEFAULT_TIMEOUT)
                    .into_iter()
                    .filter_map(|a| decode_card(&a.ok()?.card))
                    .filter_map(|card| {
                        let ip = card.host.parse().ok()?;
                        Some((SocketAddr::new(ip, card.port), card))
                    })
                    .collect();
                monitor::saw(&cards);
            });
    }
}

fn decode_card(b: &[u8]) -> Option<Card> {
    let v: Value = serde_json::from_slice(b).ok()?;
    Some(Card {
        pid: v["pid"].as_i64()?,
        host: v["host"].as_str()?.to_owned(),
        port: v["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(0),
        cuda_dev: v["cuda"].as_i64().unwrap_or(-1),
        init_state: v["init"].as_i64().unwrap_or(0),
        async_error: v["async"].as_i64().unwrap_or(0),
        finalize: v["fin"].as_bool().unwrap_or(false),
        destroy: v["destroy"].as_bool().unwrap_or(false),
        abort: v["abort"].as_bool().unwrap_or(false),
    })
}

/// One rank of a communicator, as its survey answered (or why not).
#[derive(Debug, Clone)]
enum Rank {
    Answered { card: Card, counts: [u64; 5] },
    Missing,
}

/// One communicator of this process: its id and every rank's answer.
#[derive(Debug, Clone)]
struct CommData {
    id: u64,
    ranks: Vec<Rank>,
}

fn gather(timeout: Duration) -> Vec<CommData> {
    // The bootstraps only: a communicator destroyed meanwhile is freed at once, not when the
    // survey ends. One report per communicator, however many of its ranks live here.
    let mut seen = BTreeSet::new();
    let boots: Vec<(u64, Arc<mscclpp::comm::Bootstrap>)> = crate::registry::ready()
        .into_iter()
        .filter_map(|c| {
            let n = c.native.as_ref()?;
            seen.insert(c.id)
                .then(|| (c.id, Arc::clone(n.communicator().bootstrap())))
        })
        .collect();
    // Every communicator at once, under one deadline (ncclras waits about 11 s).
    let surveyed: Vec<(
        u64,
        Vec<std::result::Result<mscclpp::comm::bootstrap::Progress, String>>,
    )> = std::thread::scope(|s| {
        let hs: Vec<_> = boots
            .iter()
            .map(|(id, b)| (*id, s.spawn(move || b.survey(timeout))))
            .collect();
        hs.into_iter()
            .map(|(id, h)| (id, h.join().unwrap_or_default()))
            .collect()
    });
    let mut out = Vec::new();
    for (id, answers) in surveyed {
        let ranks = answers
            .into_iter()
            .map(|a| match a {
                Ok(p) => {
                    let mut counts = [0u64; 5];
                    for (i, (_, ours)) in FUNCS.iter().enumerate() {
                        counts[i] = p
                            .counts
                            .iter()
                            .find(|(name, _)| name == ours)
                            .map_or(0, |(_, n)| *n);
                    }
                    Rank::Answered {
                        card: decode_card(&p.card).unwrap_or_default(),
                        counts,
                    }
                }
                Err(_) => Rank::Missing,
            })
            .collect();
        out.push(CommData { id, ranks });
    }
    out.sort_by_key(|c| c.id);
    out
}

/// NCCL's statuses, lowest first.
const STATUSES: [&str; 5] = ["NOCOMM", "INIT", "RUNNING", "FINALIZE", "ABORT"];

fn status_of(card: &Card) -> usize {
    if card.abort {
        4
    } else if card.finalize || card.destroy {
        3
    } else if card.init_state == 0 {
        2
    } else {
        1
    }
}

/// A communicator's summary: status, the error flags (INCOMPLETE, ERROR, MISMATCH), nodes and
/// ranks per node of the answering ranks.
struct Summary {
    status: usize,
    incomplete: bool,
    error: bool,
    mismatch: bool,
    nodes: usize,
    per_node: (usize, usize),
}

fn summarize(c: &CommData) -> Summary {
    let answered: Vec<(&Card, &[u64; 5])> = c
        .ranks
        .iter()
        .filter_map(|r| match r {
            Rank::Answered { card, counts } => Some((card, counts)),
            Rank::Missing => None,
        })
        .collect();
    let statuses: BTreeSet<usize> = answered.iter().map(|(c, _)| status_of(c)).collect();
    let mut by_node: BTreeMap<&str, usize> = BTreeMap::new();
    for (card, _) in &answered {
        *by_node.entry(card.host.as_str()).or_default() += 1;
    }
    let first = answered.first().map(|(_, k)| **k);
    Summary {
        status: statuses.iter().copied().max().unwrap_or(0),
        incomplete: answered.len() < c.ranks.len(),
        error: answered
            .iter()
            .any(|(c, _)| ![0, 7].contains(&c.init_state) || ![0, 7].contains(&c.async_error)),
        mismatch: statuses.len() > 1 || answered.iter().any(|(_, k)| Some(**k) != first),
        nodes: by_node.len(),
        per_node: (
            by_node.values().copied().min().unwrap_or(0),
            by_node.values().copied().max().unwrap_or(0),
        ),
    }
}

fn errors_label(s: &Summary) -> String {
    let flags: Vec<&str> = [
        (s.incomplete, "INCOMPLETE"),
        (s.error, "ERROR"),
        (s.mismatch, "MISMATCH"),
    ]
    .into_iter()
    .filter_map(|(on, l)| on.then_some(l))
    .collect();
    if flags.is_empty() {
        "OK".into()
    } else {
        flags.join(",")
    }
}

fn version_line() -> String {
    let v = crate::abi::NCCL_VERSION_CODE;
    format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
}

fn render_json(comms: &[CommData], took: Duration) -> String {
    let list: Vec<Value> = comms
        .iter()
        .map(|c| {
            let mut ranks = Vec::new();
            let mut missing = Vec::new();
            for (r, rank) in c.ranks.iter().enumerate() {
                match rank {
                    Rank::Answered { card, counts } => ranks.push(json!({
                        "rank": r,
                        "host": card.host,
                        "pid": card.pid,
                        "cuda_dev": card.cuda_dev,
                        "nvml_dev": card.cuda_dev,
                        "status": {
                            "init_state": card.init_state,
                            "async_error": card.async_error,
                            "finalize_called": card.finalize,
                            "destroy_flag": card.destroy,
                            "abort_flag": card.abort,
                        },
                        "collective_counts": FUNCS.iter().zip(counts)
                            .map(|((name, _), n)| ((*name).to_owned(), json!(n)))
                            .collect::<serde_json::Map<_, _>>(),
                    })),
                    Rank::Missing => missing.push(json!({
                        "rank": r,
                        "host": "unknown",
                        "pid": -1,
                        "cuda_dev": -1,
                        "nvml_dev": -1,
                        "status": { "unresponsive": true, "considered_dead": false },
                    })),
                }
            }
            json!({
                "hash": format!("0x{:x}", c.id),
                "secondary_hash": "0x0:0x0",
                "size": c.ranks.len(),
                "ranks_count": ranks.len(),
                "missing_ranks_count": missing.len(),
                "ranks": ranks,
                "missing_ranks": missing,
            })
        })
        .collect();
    let doc = json!({
        "nccl_version": version_line(),
        "cuda_runtime_version": 0,
        "cuda_driver_version": 0,
        "timestamp": timestamp(),
        "communicators_count": comms.len(),
        "communicators": list,
        "ras": {
            "collection_time_sec": (took.as_secs_f64() * 1000.0).round() / 1000.0,
            "timeouts_count": comms.iter().map(|c| c.ranks.iter().filter(|r| matches!(r, Rank::Missing)).count()).sum::<usize>(),
        },
    });
    let mut s = serde_json::to_string_pretty(&doc).unwrap_or_else(|_| "{}".into());
    s.push('\n');
    s
}

/// Local time as `%F %T` (UTC: this library does not read the time zone database).
fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

fn render_text(comms: &[CommData], took: Duration, verbose: bool) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "NCCL version {} compiled with CUDA 0.0 (mscclpp-rs)",
        version_line()
    );
    let _ = writeln!(o, "CUDA runtime version 0, driver version 0");
    let _ = writeln!(o);
    // The job: every process and device any communicator's answers name.
    let mut procs: BTreeMap<(String, i64), BTreeSet<i64>> = BTreeMap::new();
    for c in comms {
        for r in &c.ranks {
            if let Rank::Answered { card, .. } = r {
                procs
                    .entry((card.host.clone(), card.pid))
                    .or_default()
                    .insert(card.cuda_dev);
            }
        }
    }
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for (host, _) in procs.keys() {
        *per_node.entry(host.as_str()).or_default() += 1;
    }
    let gpus: BTreeSet<usize> = procs.values().map(BTreeSet::len).collect();
    let ppn: BTreeSet<usize> = per_node.values().copied().collect();
    let total_gpus: usize = procs.values().map(BTreeSet::len).sum();
    let _ = writeln!(o, "Job summary\n===========\n");
    if ppn.len() <= 1 && gpus.len() <= 1 {
        let _ = writeln!(o, "  Nodes  Processes         GPUs  Processes     GPUs");
        let _ = writeln!(o, "(total)   per node  per process    (total)  (total)");
        let _ = writeln!(
            o,
            "{:7}  {:9}  {:11}  {:9}  {:7}",
            per_node.len(),
            ppn.iter().next().copied().unwrap_or(0),
            gpus.iter().next().copied().unwrap_or(0),
            procs.len(),
            total_gpus
        );
    } else {
        let _ = writeln!(o, "  Nodes  Processes         GPUs");
        let _ = writeln!(o, "(total)    (total)      (total)");
        let _ = writeln!(
            o,
            "{:7}  {:9}  {:11}",
            per_node.len(),
            procs.len(),
            total_gpus
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "Communicators... ({:.3}s)", took.as_secs_f64());
    let _ = writeln!(o, "=============\n");
    // Groups: same size, nodes, status and errors; largest first.
    let summaries: Vec<(usize, Summary)> = comms.iter().map(summarize).enumerate().collect();
    let mut groups: BTreeMap<GroupKey, Vec<usize>> = BTreeMap::new();
    for (i, s) in &summaries {
        groups
            .entry((
                std::cmp::Reverse(comms[*i].ranks.len()),
                std::cmp::Reverse(s.nodes),
                std::cmp::Reverse(s.status),
                errors_label(s),
            ))
            .or_default()
            .push(*i);
    }
    if comms.is_empty() {
        let _ = writeln!(o, "No communicator data collected!");
    } else {
        let _ = writeln!(
            o,
            "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors"
        );
        let _ = writeln!(o, "    #  in group  per comm  per node  per comm  in group");
    }
    let mut named: Vec<(String, usize)> = Vec::new();
    for (g, ((size, nodes, status, errors), members)) in groups.iter().enumerate() {
        let (lo, hi) = members.iter().fold((usize::MAX, 0), |(lo, hi), &i| {
            let s = &summaries[i].1;
            (lo.min(s.per_node.0), hi.max(s.per_node.1))
        });
        let per_node = if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}-{hi}")
        };
        let in_group: BTreeSet<(String, i64, i64)> = members
            .iter()
            .flat_map(|&i| comms[i].ranks.iter())
            .filter_map(|r| match r {
                Rank::Answered { card, .. } => Some((card.host.clone(), card.pid, card.cuda_dev)),
                Rank::Missing => None,
            })
            .collect();
        let _ = writeln!(
            o,
            "{:5}  {:8}  {:8}  {:>8}  {:8}  {:8}  {:>8}  {:>6}",
            g,
            members.len(),
            nodes.0,
            per_node,
            size.0,
            in_group.len(),
            STATUSES[status.0],
            errors
        );
        for (k, &i) in members.iter().enumerate() {
            named.push((format!("#{g}-{k} ({:016x})", comms[i].id), i));
        }
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "Errors\n======\n");
    for (name, i) in &named {
        let c = &comms[*i];
        let missing: Vec<usize> = c
            .ranks
            .iter()
            .enumerate()
            .filter_map(|(r, x)| matches!(x, Rank::Missing).then_some(r))
            .collect();
        if !missing.is_empty() {
            let _ = writeln!(o, "{name} INCOMPLETE");
            let _ = writeln!(
                o,
                "  Missing communicator data from {} rank{}",
                missing.len(),
                if missing.len() == 1 { "" } else { "s" }
            );
            if outlier(missing.len(), Some(c.ranks.len()), verbose) {
                for r in &missing {
                    let _ = writeln!(o, "  Rank {r} -- [process information not found]");
                }
            }
            let _ = writeln!(o);
        }
    }
    for (name, i) in &named {
        let c = &comms[*i];
        if !summaries[*i].1.error {
            continue;
        }
        let _ = writeln!(o, "{name} ERROR");
        let failed: Vec<(usize, &Card)> = c
            .ranks
            .iter()
            .enumerate()
            .filter_map(|(r, x)| match x {
                Rank::Answered { card, .. } if ![0, 7].contains(&card.async_error) => {
                    Some((r, card))
                }
                _ => None,
            })
            .collect();
        let _ = writeln!(
            o,
            "  Asynchronous error{} on {} rank{}",
            if failed.len() == 1 { "" } else { "s" },
            failed.len(),
            if failed.len() == 1 { "" } else { "s" }
        );
        for (r, card) in &failed {
            let _ = writeln!(
                o,
                "  Rank {r} reported {} -- GPU {} managed by process {} on node {}",
                error_string(card.async_error),
                card.cuda_dev,
                card.pid,
                card.host
            );
        }
        let _ = writeln!(o);
    }
    let _ = writeln!(o, "Warnings\n========\n");
    for (name, i) in &named {
        let c = &comms[*i];
        if !summaries[*i].1.mismatch {
            continue;
        }
        let _ = writeln!(o, "{name} MISMATCH");
        let answered: Vec<(usize, &Card, &[u64; 5])> = c
            .ranks
            .iter()
            .enumerate()
            .filter_map(|(r, x)| match x {
                Rank::Answered { card, counts } => Some((r, card, counts)),
                Rank::Missing => None,
            })
            .collect();
        let statuses: BTreeSet<usize> = answered.iter().map(|(_, c, _)| status_of(c)).collect();
        if statuses.len() > 1 {
            let _ = writeln!(o, "  Communicator ranks have different status");
            for st in statuses.iter().rev() {
                let ranks: Vec<&(usize, &Card, &[u64; 5])> = answered
                    .iter()
                    .filter(|(_, c, _)| status_of(c) == *st)
                    .collect();
                write_ranks(&mut o, &ranks, c.ranks.len(), verbose, |n| {
                    format!("have status {}", STATUSES[*st])
                        .replace("have", if n == 1 { "has" } else { "have" })
                });
            }
        }
        for (f, (func, _)) in FUNCS.iter().enumerate() {
            let values: BTreeMap<u64, usize> =
                answered.iter().fold(BTreeMap::new(), |mut m, (_, _, k)| {
                    *m.entry(k[f]).or_default() += 1;
                    m
                });
            if values.len() <= 1 {
                continue;
            }
            let _ = writeln!(
                o,
                "  Communicator ranks have different {func} operation counts"
            );
            let mut order: Vec<(u64, usize)> = values.into_iter().collect();
            order.sort_by_key(|&(v, n)| (std::cmp::Reverse(n), v));
            for (v, _) in order {
                let ranks: Vec<&(usize, &Card, &[u64; 5])> =
                    answered.iter().filter(|(_, _, k)| k[f] == v).collect();
                write_ranks(&mut o, &ranks, c.ranks.len(), verbose, |n| {
                    let verb = if n == 1 { "has" } else { "have" };
                    if v == 0 {
                        format!("{verb} not launched any operations")
                    } else {
                        format!("{verb} launched up to operation {v}")
                    }
                });
            }
            let _ = writeln!(o);
        }
    }
    o
}

/// What puts communicators in one group of the table (size, nodes, status: largest first;
/// then the errors).
type GroupKey = (
    std::cmp::Reverse<usize>,
    std::cmp::Reverse<usize>,
    std::cmp::Reverse<usize>,
    String,
);

/// NCCL's words for an `ncclResult_t` in the report.
fn error_string(code: i64) -> &'static str {
    match code {
        1 => "Unhandled CUDA error",
        2 => "System error",
        3 => "Internal error",
        4 => "Invalid argument",
        5 => "Invalid usage",
        6 => "Remote process error",
        7 => "NCCL operation in progress",
        _ => "Unexpected error",
    }
}

/// NCCL's rule for printing each rank of a set of `count` (of `total`).
fn outlier(count: usize, total: Option<usize>, verbose: bool) -> bool {
    if count == 1 {
        return true;
    }
    match (verbose, total) {
        (false, None) => count <= 10,
        (false, Some(t)) => count <= 10 && count * 4 <= t,
        (true, None) => true,
        (true, Some(t)) => count * 2 < t,
    }
}

/// `  <N> ranks <what>` (or `  Rank <r> <what> -- GPU …` for one), with one line per rank when
/// they are few.
fn write_ranks(
    o: &mut String,
    ranks: &[&(usize, &Card, &[u64; 5])],
    total: usize,
    verbose: bool,
    what: impl Fn(usize) -> String,
) {
    let line = |r: usize, c: &Card| {
        format!(
            "  Rank {r} {} -- GPU {} managed by process {} on node {}",
            what(1),
            c.cuda_dev,
            c.pid,
            c.host
        )
    };
    if ranks.len() == 1 {
        let _ = writeln!(o, "{}", line(ranks[0].0, ranks[0].1));
        return;
    }
    let _ = writeln!(o, "  {} ranks {}", ranks.len(), what(ranks.len()));
    if outlier(ranks.len(), Some(total), verbose) {
        for (r, c, _) in ranks {
            let _ = writeln!(
                o,
                "  Rank {r} -- GPU {} managed by process {} on node {}",
                c.cuda_dev, c.pid, c.host
            );
        }
    }
}
