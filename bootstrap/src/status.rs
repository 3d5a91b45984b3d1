//! The status service (issue 46): off by default; a rank that starts it (the front ends start
//! it on rank 0 when `MSCCLPP_STATUS` is set) listens on a TCP port and, to a client that
//! presents its token, answers with a survey of every rank (see `progress`): each rank's last
//! call, the ranks behind, or why a rank did not answer. One command on any host that can reach
//! the port (`mscclpp-perf status ADDR TOKEN`) then says who is behind and where.
//!
//! The token is 16 random bytes made when the service starts (hex on the wire), compared in
//! constant time, as the bootstrap's secret is; whoever starts the service tells its operator
//! the address and the token (the log, `MSCCLPP_STATUS_FILE`).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use mscclpp_base::{Error, Result};

use super::Bootstrap;
use super::protocol::secrets_equal;

/// What a client sends before its token.
const GREETING: &str = "MSCCLPP-STATUS";
/// How long the survey behind one answer waits for the ranks.
const SURVEY: Duration = Duration::from_secs(2);
/// How long a client may take to send its line.
const CLIENT_READ: Duration = Duration::from_secs(5);

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
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
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
    let mut behind = Vec::new();
    for (r, a) in answers.iter().enumerate() {
        match a {
            Ok(p) => {
                out += &format!("rank {r}: {p}\n");
                if p.calls < most {
                    behind.push(format!("rank {r} ({p})"));
                }
            }
            Err(why) => {
                out += &format!("rank {r}: no answer: {why}\n");
                behind.push(format!("rank {r} (no answer: {why})"));
            }
        }
    }
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
                for conn in listener.incoming() {
                    if flag.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(stream) = conn else { continue };
                    if let Err(e) = answer(&boot, stream, &secret) {
                        tracing::debug!("status service: {e}");
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
}

/// Reads the client's line; answers with the report, or refuses a wrong token.
fn answer(
    boot: &Bootstrap,
    stream: TcpStream,
    secret: &[u8; super::protocol::SECRET_BYTES],
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_READ))?;
    let mut line = String::new();
    BufReader::new(std::io::Read::take(stream.try_clone()?, 256)).read_line(&mut line)?;
    let mut w = stream;
    let token = line
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
        w.write_all(b"refused: wrong token\n")?;
        return Ok(());
    }
    w.write_all(report(boot, SURVEY).as_bytes())
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
