//! What the event loop needs of a rank it serves: its listener and identity (to accept and
//! check a peer's Hello), and three events it hands up: a checked Hello, a message frame, the
//! end of a connection.
//!
//! The loop is the lower layer: `state` holds the loop and its connections, and `inbound`
//! implements this trait for the state, filing what arrives into it. The loop names only this
//! trait, so it can be read (and changed) without the state it feeds, and the state's closing
//! can use the loop without the loop knowing the state.
//!
//! The loop keeps `Weak<dyn Endpoint>`s (a closing bootstrap is not kept alive by its
//! descriptors) and calls through the vtable: one indirect call per frame, no allocation and
//! no lock of its own (a bootstrap's types are the only implementation, so the loop's
//! entries stay one type for every bootstrap of the process).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use super::super::failure::Deferred;
use super::super::protocol::{FrameKind, SECRET_BYTES};
use super::Reactor;
use super::conn::Conn;

/// One rank's side of the loop (one bootstrap; the loop serves every bootstrap of the
/// process). Called on whichever thread reads a connection: the loop, or an operation's
/// [`Waiter`](super::waiter::Waiter).
///
/// Lock order (the loop's, see `reactor`): [`Endpoint::frame`] and [`Endpoint::ended`] run
/// under the connection's `rx` and may take the endpoint's own locks, then a connection's
/// `tx` (to send on it); [`Endpoint::admit`] runs with no lock of the loop held. Failure
/// handlers go to `deferred` and run once no lock is held.
pub(crate) trait Endpoint: Send + Sync {
    /// This rank's listener (non-blocking, in the loop's set).
    fn listener(&self) -> &TcpListener;
    /// The listener's token in the loop.
    fn listen_token(&self) -> u64;
    /// This rank, in the numbering of the bootstrap's connections.
    fn rank(&self) -> usize;
    /// The bootstrap's size.
    fn nranks(&self) -> usize;
    /// The secret a peer's Hello must carry.
    fn secret(&self) -> &[u8; SECRET_BYTES];
    /// The bootstrap is closing: nothing new is accepted.
    fn closing(&self) -> bool;
    /// Inbound handshakes in progress (bounded by `hello::MAX_PENDING_HELLOS`).
    fn handshakes(&self) -> &AtomicUsize;
    /// The bootstrap's deadline (a Hello's is the shorter of it and `hello::HELLO_LIMIT`).
    fn timeout(&self) -> Duration;

    /// A peer's Hello, checked against [`Endpoint::secret`], [`Endpoint::nranks`] and
    /// [`Endpoint::rank`]: the rank decides whether to keep the connection (and, if so,
    /// acknowledges it and adds it to the loop under `token`, `in_set` as for
    /// [`Reactor::add_conn`]) or refuses it (taking it out of the set first when `in_set`,
    /// [`Reactor::unset`]).
    fn admit(
        self: Arc<Self>,
        r: &Reactor,
        peer: usize,
        from: SocketAddr,
        token: u64,
        stream: TcpStream,
        in_set: bool,
    );

    /// A whole message frame from `c` (any kind but the connection's own Error and Bye, which
    /// the loop handles); `Err(why)` ends the connection as broken, with `why` as the reason.
    fn frame(
        &self,
        c: &Conn,
        r: &Reactor,
        kind: FrameKind,
        tag: u64,
        payload: Vec<u8>,
        deferred: &mut Vec<Deferred>,
    ) -> Result<(), String>;

    /// `c` ended (out of the loop and shut down already): its peer is dead, a failure unless
    /// `graceful` (it said goodbye).
    fn ended(&self, c: &Conn, reason: String, graceful: bool, deferred: &mut Vec<Deferred>);
}
