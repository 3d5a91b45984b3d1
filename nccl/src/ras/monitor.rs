//! NCCL's RAS monitor mode (NCCL 2.29+): a client that sends `MONITOR [groups]` (`lifecycle`,
//! `trace`, `all`; default `lifecycle`) gets `OK`, then one event per line as peers come and go,
//! in the format it set (`SET FORMAT`), until it closes. NCCL's peers are processes; ours are
//! the processes of this process's communicators:
//! - `PEER_NEW` (lifecycle): a process first seen in a communicator created here, named by its
//!   card (`Process <pid> on node <ip> managing GPU <dev>`), learned by a survey of the new
//!   communicator, made only while a monitor is connected;
//! - `PEER_DEAD` (lifecycle): a rank of a communicator here found dead (its bootstrap connection
//!   ended without a goodbye, or a peer reported it lost), named by its card where a survey saw
//!   it, else by its bootstrap address (`ip<port>`, as NCCL names a peer it cannot look up);
//!   once per process.
//!
//! NCCL's trace group (`PEER_CONNECTING`) is accepted and has no events here: our bootstrap's
//! connections are not RAS's. Events are written by one thread of their own, so the bootstrap's
//! event loop, which learns of deaths, never waits on a client's socket.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use super::{Card, timestamp};

/// The lifecycle group (`PEER_NEW`, `PEER_DEAD`).
pub const LIFECYCLE: u8 = 0x01;
/// The trace group.
pub const TRACE: u8 = 0x02;

/// The groups a `MONITOR` line asks for (`Err(token)`: one NCCL does not know).
pub fn parse_groups(arg: Option<&str>) -> Result<u8, String> {
    let Some(arg) = arg else {
        return Ok(LIFECYCLE);
    };
    let mut mask = 0;
    for g in arg.split(',').filter(|g| !g.is_empty()) {
        mask |= match g.to_ascii_lowercase().as_str() {
            "lifecycle" => LIFECYCLE,
            "trace" => TRACE,
            "all" => 0xff,
            _ => return Err(g.to_owned()),
        };
    }
    Ok(mask)
}

/// Who an event is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A process known by its card.
    Known { host: String, pid: i64, cuda: i64 },
    /// Known only by its bootstrap address.
    Addr(SocketAddr),
}

/// One event.
#[derive(Debug, Clone)]
pub struct Event {
    /// `PEER_NEW`, `PEER_DEAD`.
    pub kind: &'static str,
    /// Its group ([`LIFECYCLE`] or [`TRACE`]).
    pub group: u8,
    pub peer: Peer,
    pub details: String,
}

impl Peer {
    /// The process it is (a process with several ranks has one card per rank, one device
    /// each): its host and pid, or its address where no card names it.
    fn process(&self) -> String {
        match self {
            Peer::Known { host, pid, .. } => format!("{host}/{pid}"),
            Peer::Addr(a) => a.to_string(),
        }
    }
}

impl Event {
    /// As NCCL writes it for a client in text (`json` false) or JSON.
    pub fn render(&self, json: bool, time: &str) -> String {
        if !json {
            let peer = match &self.peer {
                Peer::Known { host, pid, cuda } => {
                    format!("Process {pid} on node {host} managing GPU {cuda}")
                }
                Peer::Addr(a) => format!("{}<{}>", a.ip(), a.port()),
            };
            return format!("[{time}] {}: {peer} {}\n", self.kind, self.details);
        }
        let group = if self.group == LIFECYCLE {
            "LIFECYCLE"
        } else {
            "TRACE"
        };
        let peer = match &self.peer {
            Peer::Known { host, pid, cuda } => format!(
                "  \"peer\": {{\n    \"host\": \"{host}\",\n    \"pid\": {pid},\n    \"cuda_devs\": [{cuda}],\n    \"nvml_devs\": [{cuda}]\n  }},\n"
            ),
            Peer::Addr(a) => format!(
                "  \"peer\": {{\n    \"addr\": \"{}<{}>\"\n  }},\n",
                a.ip(),
                a.port()
            ),
        };
        format!(
            "{{\n  \"timestamp\": \"{time}\",\n  \"group\": \"{group}\",\n  \"event\": \"{}\",\n{peer}  \"details\": \"{}\"\n}}\n",
            self.kind, self.details
        )
    }
}

struct Client {
    out: TcpStream,
    mask: u8,
    json: bool,
}

#[derive(Default)]
struct State {
    next: u64,
    clients: HashMap<u64, Client>,
    /// Processes named so far (`PEER_NEW` once each), by [`Peer::process`].
    known: BTreeSet<String>,
    /// Ranks by bootstrap address, as surveys named them (to name a dead peer).
    cards: HashMap<SocketAddr, Peer>,
    /// Processes reported dead, by [`Peer::process`].
    dead: BTreeSet<String>,
    /// The writer's queue.
    tx: Option<Sender<Event>>,
}

fn state() -> std::sync::MutexGuard<'static, State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    // Plain tables: a panic elsewhere leaves them usable.
    S.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Whether any client monitors (events are made only then).
pub fn watched() -> bool {
    !state().clients.is_empty()
}

/// Adds a monitoring client (its socket for events; `mask` its groups): its id.
pub fn subscribe(out: TcpStream, mask: u8, json: bool) -> u64 {
    // A client that stops reading loses its events rather than stall the writer.
    let _ = out.set_write_timeout(Some(Duration::from_secs(2)));
    let mut st = state();
    let id = st.next;
    st.next += 1;
    st.clients.insert(id, Client { out, mask, json });
    id
}

/// Changes a client's groups or format (a second `MONITOR`, a `SET FORMAT`).
pub fn update(id: u64, mask: Option<u8>, json: Option<bool>) {
    if let Some(c) = state().clients.get_mut(&id) {
        if let Some(m) = mask {
            c.mask = m;
        }
        if let Some(j) = json {
            c.json = j;
        }
    }
}

/// Drops a client (it closed).
pub fn unsubscribe(id: u64) {
    state().clients.remove(&id);
}

/// Queues `ev` for the clients (never blocks: the bootstrap's event loop calls it).
pub fn notify(ev: Event) {
    let mut st = state();
    if st.clients.is_empty() {
        return;
    }
    if st.tx.is_none() {
        let (tx, rx) = channel();
        let spawned = std::thread::Builder::new()
            .name("nccl-ras-monitor".into())
            .spawn(move || write_events(rx));
        if spawned.is_err() {
            return;
        }
        st.tx = Some(tx);
    }
    if let Some(tx) = &st.tx {
        let _ = tx.send(ev);
    }
}

fn write_events(rx: Receiver<Event>) {
    for ev in rx {
        let time = timestamp();
        // The sockets are written without the lock: a client slow to read must not hold up
        // the bootstrap's event loop, which takes the lock to report a death.
        let targets: Vec<(u64, TcpStream, bool)> = state()
            .clients
            .iter()
            .filter(|(_, c)| c.mask & ev.group != 0)
            .filter_map(|(id, c)| Some((*id, c.out.try_clone().ok()?, c.json)))
            .collect();
        for (id, mut out, json) in targets {
            if out.write_all(ev.render(json, &time).as_bytes()).is_err() {
                // A client whose socket fails is gone (as NCCL drops it); it is told so.
                let _ = out.shutdown(std::net::Shutdown::Both);
                unsubscribe(id);
            }
        }
    }
}

/// A survey's cards of a communicator made here: `PEER_NEW` for each process first seen (not
/// this one), and the cards kept to name a later death.
pub fn saw(cards: &[(SocketAddr, Card)]) {
    let me = i64::from(std::process::id());
    let mut news = Vec::new();
    {
        let mut st = state();
        for (addr, card) in cards {
            let peer = Peer::Known {
                host: card.host.clone(),
                pid: card.pid,
                cuda: card.cuda_dev,
            };
            st.cards.insert(*addr, peer.clone());
            if card.pid != me && st.known.insert(peer.process()) {
                news.push(peer);
            }
        }
    }
    for peer in news {
        notify(Event {
            kind: "PEER_NEW",
            group: LIFECYCLE,
            peer,
            details: String::new(),
        });
    }
}

/// A rank listening at `addr` was found dead: `PEER_DEAD` once per process.
pub fn dead(addr: SocketAddr) {
    let peer = {
        let mut st = state();
        if st.clients.is_empty() {
            return;
        }
        let peer = st.cards.get(&addr).cloned().unwrap_or(Peer::Addr(addr));
        // Once per process: a process in several communicators dies in each.
        if !st.dead.insert(peer.process()) {
            return;
        }
        peer
    };
    notify(Event {
        kind: "PEER_DEAD",
        group: LIFECYCLE,
        peer,
        details: String::new(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_as_nccl_parses_them() {
        assert_eq!(parse_groups(None), Ok(LIFECYCLE));
        assert_eq!(parse_groups(Some("trace")), Ok(TRACE));
        assert_eq!(parse_groups(Some("LIFECYCLE,trace")), Ok(LIFECYCLE | TRACE));
        assert_eq!(parse_groups(Some("all")), Ok(0xff));
        assert_eq!(parse_groups(Some("lifecycle,bogus")), Err("bogus".into()));
    }

    #[test]
    fn events_in_nccl_s_text_and_json() {
        let ev = Event {
            kind: "PEER_DEAD",
            group: LIFECYCLE,
            peer: Peer::Known {
                host: "192.0.2.7".into(),
                pid: 4242,
                cuda: 1,
            },
            details: String::new(),
        };
        assert_eq!(
            ev.render(false, "2026-12-06 10:00:00"),
            "[2026-12-06 10:00:00] PEER_DEAD: Process 4242 on node 192.0.2.7 managing GPU 1 \n"
        );
        let j: serde_json::Value =
            serde_json::from_str(&ev.render(true, "2026-12-06 10:00:00")).unwrap();
        assert_eq!(j["group"], "LIFECYCLE");
        assert_eq!(j["event"], "PEER_DEAD");
        assert_eq!(j["peer"]["pid"], 4242);
        assert_eq!(j["peer"]["cuda_devs"][0], 1);
        let by_addr = Event {
            peer: Peer::Addr("192.0.2.7:5000".parse().unwrap()),
            ..ev
        };
        assert_eq!(
            by_addr.render(false, "t"),
            "[t] PEER_DEAD: 192.0.2.7<5000> \n"
        );
        let j: serde_json::Value = serde_json::from_str(&by_addr.render(true, "t")).unwrap();
        assert_eq!(j["peer"]["addr"], "192.0.2.7<5000>");
    }
}
