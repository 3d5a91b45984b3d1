//! The status service (issue 46): off by default; a rank that starts it (the front ends start
//! it on rank 0 when `MSCCLPP_STATUS` is set) listens on a TCP port and, to a client that
//! presents its token, answers with a survey of every rank (see `progress`): each rank's last
//! call, the ranks behind, or why a rank did not answer. One command on any host that can reach
//! the port (`mscclpp-perf status ADDR TOKEN`) then says who is behind and where.
//!
//! The token is 16 random bytes made when the service starts (hex on the wire), compared in
//! constant time, as the bootstrap's secret is; whoever starts the service tells its operator
//! the address and the token (the log, `MSCCLPP_STATUS_FILE`).

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_base::{Error, Result};

use super::Bootstrap;
use super::protocol::secrets_equal;

/// What a client sends before its token.
const GREETING: &str = "MSCCLPP-STATUS";
/// How long the survey behind one answer waits for the ranks.
const SURVEY: Duration = Duration::from_secs(2);
/// How long one client may take to send its line, and each write to it may block.
const CLIENT_DEADLINE: Duration = Duration::from_secs(5);
/// Longest line a client may send.
const MAX_LINE: usize = 256;
/// How often the accept loop looks for clients and for the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// A running status service; stopped when dropped.
#[derive(Debug)]
pub struct StatusServer {
    addr: SocketAddr,
    token: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StatusServer {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The token a client presents (hex).
    pub fn token(&self) -> &str {
        &self.token
    }
}

impl Drop for StatusServer {
    fn drop(&mut self) {
        // The accept loop polls the flag (its listener does not block), and each client has a
        // deadline of its own: the join is bounded.
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The report a client gets: one line per rank, then who is behind.
pub fn report(boot: &Bootstrap, timeout: Duration) -> String {
    let answers = boot.survey(timeout);
    let most = answers
        .iter()
        .filter_map(|a| a.as_ref().ok().map(|p| p.calls))
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (r, a) in answers.iter().enumerate() {
        match a {
            Ok(p) => out += &format!("rank {r}: {p}\n"),
            Err(why) => out += &format!("rank {r}: no answer: {why}\n"),
        }
    }
    let behind: Vec<String> = super::progress::behind(&answers, most)
        .into_iter()
        .map(|(r, what)| format!("rank {r} ({what})"))
        .collect();
    if behind.is_empty() {
        out += &format!("every rank has issued {most} calls\n");
    } else {
        out += &format!("behind (the most calls is {most}): {}\n", behind.join("; "));
    }
    out
}

impl Bootstrap {
    /// Starts the status service of this bootstrap on `bind` (port 0 picks one).
    pub fn serve_status(self: &Arc<Self>, bind: SocketAddr) -> Result<StatusServer> {
        let listener = TcpListener::bind(bind)
            .map_err(|e| Error::io(format!("binding the status service on {bind}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("the status service's listener", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("the status service's address", e))?;
        let secret = super::unique_id::random_secret()?;
        let token = hex(&secret);
        let stop = Arc::new(AtomicBool::new(false));
        let (boot, flag) = (Arc::clone(self), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("mscclpp-status".into())
            .spawn(move || {
                // Connections to every rank now, while the job is healthy, so that a survey
                // during a hang has nothing to dial.
                boot.link_all();
                while !flag.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            if let Err(e) = answer(&boot, stream, &secret) {
                                tracing::debug!("status service: {e}");
                            }
                        }
                        Err(_) => std::thread::sleep(ACCEPT_POLL),
                    }
                }
            })
            .map_err(|e| Error::io("starting the status service", e))?;
        Ok(StatusServer {
            addr,
            token,
            stop,
            thread: Some(thread),
        })
    }

    /// Opens the connection to every rank of this view that has none (within the bootstrap's
    /// deadline each; a failure is left for the survey to report).
    fn link_all(&self) {
        let me = self.shared().rank;
        for &target in self.members.iter().filter(|&&t| t != me) {
            if let Err(e) = self.link(target, Instant::now() + self.cfg.timeout) {
                tracing::debug!("status service: no connection to rank {target} yet: {e}");
            }
        }
    }
}

/// Reads the client's line (within [`CLIENT_DEADLINE`] in all); answers with the report, or
/// refuses a wrong token; every write has a deadline too.
fn answer(
    boot: &Bootstrap,
    mut stream: TcpStream,
    secret: &[u8; super::protocol::SECRET_BYTES],
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(CLIENT_DEADLINE))?;
    let deadline = Instant::now() + CLIENT_DEADLINE;
    let mut line = Vec::new();
    let mut buf = [0u8; 128];
    while !line.contains(&b'\n') && line.len() < MAX_LINE {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        stream.set_read_timeout(Some(left))?;
        let got = std::io::Read::read(&mut stream, &mut buf)?;
        if got == 0 {
            return Ok(());
        }
        line.extend_from_slice(&buf[..got]);
    }
    let line = String::from_utf8_lossy(&line);
    let token = line
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .strip_prefix(GREETING)
        .map(str::trim)
        .unwrap_or("");
    let mut given = [0u8; super::protocol::SECRET_BYTES];
    let parsed = token.len() == 2 * given.len()
        && given.iter_mut().enumerate().all(|(i, b)| {
            u8::from_str_radix(&token[2 * i..2 * i + 2], 16)
                .map(|v| *b = v)
                .is_ok()
        });
    if !parsed || !secrets_equal(&given, secret) {
        stream.write_all(b"refused: wrong token\n")?;
        return Ok(());
    }
    stream.write_all(report(boot, SURVEY).as_bytes())
}

/// The client side: asks the service at `addr` with `token`; its answer.
pub fn ask_status(addr: SocketAddr, token: &str, timeout: Duration) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| Error::io(format!("connecting to the status service at {addr}"), e))?;
    s.set_read_timeout(Some(timeout + SURVEY))
        .map_err(|e| Error::io("setting a read timeout", e))?;
    s.write_all(format!("{GREETING} {token}\n").as_bytes())
        .map_err(|e| Error::io(format!("asking the status service at {addr}"), e))?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out)
        .map_err(|e| Error::io(format!("reading the status service at {addr}"), e))?;
    if out.starts_with("refused") {
        return Err(Error::invalid(format!(
            "the status service at {addr} {}",
            out.trim()
        )));
    }
    Ok(out)
}
