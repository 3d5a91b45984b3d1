//! Passing file descriptors between the ranks of one host ([`Bootstrap::exchange_fds`]): what
//! symmetric memory needs, since a GPU runtime's shareable handle is a descriptor, which no
//! byte stream can carry. Each rank listens on a Unix socket of the abstract namespace under a
//! random name, the ranks learn each other's names (and a random token each) over the
//! bootstrap, and every rank connects to every other member of the group and sends its
//! descriptor (`SCM_RIGHTS`) with the receiver's token, which only the authenticated bootstrap
//! told it: a process that finds the socket's name cannot pass a descriptor off as a rank's.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use mscclpp_base::{Error, Result};
use rustix::event::{PollFd, PollFlags, poll};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::Bootstrap;

const MAGIC: [u8; 4] = *b"MFD1";
/// Bytes of a socket name's random part and of a token.
const RANDOM: usize = 16;
/// What a sender writes beside the descriptor: magic, its rank, the receiver's token.
const MESSAGE: usize = 4 + 4 + RANDOM;

fn io(what: &str, e: rustix::io::Errno) -> Error {
    Error::io(format!("passing descriptors: {what}"), e.into())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Bootstrap {
    /// Gives `fd` to every other rank of `group` (ranks of this host, this rank among them) and
    /// returns the descriptor each member gave, in `group`'s order (this rank's own: a
    /// duplicate of `fd`). Collective over every rank of the bootstrap (those outside `group`
    /// take part in the exchange of names only); fails naming the rank and the step where a
    /// member does not answer within the bootstrap's timeout.
    pub fn exchange_fds(&self, group: &[usize], fd: BorrowedFd<'_>) -> Result<Vec<OwnedFd>> {
        let me = self.rank();
        let mine = group.iter().position(|&r| r == me);
        let mut seed = [0u8; 2 * RANDOM];
        getrandom::fill(&mut seed)
            .map_err(|e| Error::Internal(format!("passing descriptors: no randomness: {e}")))?;
        let (name, token) = seed.split_at(RANDOM);
        let listener = match mine {
            Some(_) => Some(listen(&format!("mscclpp-fd-{}", hex(name)), group.len())?),
            None => None,
        };
        let mut card = Vec::with_capacity(2 * RANDOM);
        if mine.is_some() {
            card.extend_from_slice(name);
            card.extend_from_slice(token);
        }
        let cards = self.all_gather(&card)?;
        let Some(mine) = mine else {
            return Ok(Vec::new());
        };
        for &p in group {
            let c = cards.get(p).filter(|c| c.len() == 2 * RANDOM).ok_or_else(|| {
                Error::invalid(format!(
                    "passing descriptors: rank {p} is in the group of rank {me} but did not join it"
                ))
            })?;
            if p == me {
                continue;
            }
            send(
                &format!("mscclpp-fd-{}", hex(&c[..RANDOM])),
                me,
                &c[RANDOM..],
                fd,
            )
            .map_err(|e| {
                e.with_context(|| format!("rank {me} giving its descriptor to rank {p}"))
            })?;
        }
        let mut got: Vec<Option<OwnedFd>> = (0..group.len()).map(|_| None).collect();
        got[mine] = Some(
            fd.try_clone_to_owned()
                .map_err(|e| Error::io("passing descriptors: duplicating this rank's", e))?,
        );
        let deadline = Instant::now() + self.timeout();
        let listener = listener.ok_or_else(|| Error::Internal("no listener".into()))?;
        while got.iter().any(Option::is_none) {
            let (from, received) =
                receive(&listener, token, deadline, self.timeout()).map_err(|e| {
                    let missing: Vec<usize> = group
                        .iter()
                        .zip(&got)
                        .filter(|(_, g)| g.is_none())
                        .map(|(&r, _)| r)
                        .collect();
                    e.with_context(|| {
                        format!("rank {me} waiting for the descriptors of ranks {missing:?}")
                    })
                })?;
            let i = group.iter().position(|&r| r == from).ok_or_else(|| {
                Error::malformed(
                    "descriptor message",
                    format!("from rank {from}, outside the group"),
                )
            })?;
            if got[i].is_some() {
                return Err(Error::malformed(
                    "descriptor message",
                    format!("a second descriptor from rank {from}"),
                ));
            }
            got[i] = Some(received);
        }
        Ok(got.into_iter().flatten().collect())
    }
}

fn listen(name: &str, backlog: usize) -> Result<OwnedFd> {
    let s = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(|e| io("a local socket", e))?;
    let addr =
        SocketAddrUnix::new_abstract_name(name.as_bytes()).map_err(|e| io("a socket name", e))?;
    rustix::net::bind(&s, &addr).map_err(|e| io("binding a local socket", e))?;
    rustix::net::listen(&s, backlog.min(i32::MAX as usize) as i32)
        .map_err(|e| io("listening on a local socket", e))?;
    Ok(s)
}

fn send(name: &str, me: usize, token: &[u8], fd: BorrowedFd<'_>) -> Result<()> {
    let s = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| io("a local socket", e))?;
    let addr =
        SocketAddrUnix::new_abstract_name(name.as_bytes()).map_err(|e| io("a socket name", e))?;
    rustix::net::connect(&s, &addr).map_err(|e| io("connecting to the member's socket", e))?;
    let mut msg = Vec::with_capacity(MESSAGE);
    msg.extend_from_slice(&MAGIC);
    msg.extend_from_slice(&(me as u32).to_le_bytes());
    msg.extend_from_slice(token);
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(Error::Internal(
            "passing descriptors: no room for one".into(),
        ));
    }
    let sent = rustix::net::sendmsg(&s, &[IoSlice::new(&msg)], &mut control, SendFlags::NOSIGNAL)
        .map_err(|e| io("sending a descriptor", e))?;
    if sent != msg.len() {
        return Err(Error::Internal(format!(
            "passing descriptors: {sent} of {} bytes sent",
            msg.len()
        )));
    }
    Ok(())
}

/// One member's descriptor: (its rank, the descriptor).
fn receive(
    listener: &OwnedFd,
    token: &[u8],
    deadline: Instant,
    limit: Duration,
) -> Result<(usize, OwnedFd)> {
    let conn = loop {
        match rustix::net::accept_with(listener, SocketFlags::CLOEXEC) {
            Ok(c) => break c,
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(io("accepting", e)),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                waiting_for: "a descriptor from a member of the group".into(),
                after: limit,
            });
        }
        let mut fds = [PollFd::new(listener, PollFlags::IN)];
        let ts = rustix::event::Timespec::try_from(left.min(Duration::from_millis(100)))
            .map_err(|_| Error::Internal("a deadline out of range".into()))?;
        match poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(io("waiting for a member", e)),
        }
    };
    // The member wrote its message before we accepted (connect succeeds on the backlog); read
    // it with a deadline in case it stalls half-way.
    rustix::net::sockopt::set_socket_timeout(
        &conn,
        rustix::net::sockopt::Timeout::Recv,
        Some(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10)),
        ),
    )
    .map_err(|e| io("a receive timeout", e))?;
    let mut msg = [0u8; MESSAGE];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        conn.as_fd(),
        &mut [IoSliceMut::new(&mut msg)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| io("receiving a descriptor", e))?;
    let mut received = None;
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            for f in fds {
                received.get_or_insert(f);
            }
        }
    }
    if got.bytes != MESSAGE || msg[..4] != MAGIC || msg[8..] != *token {
        return Err(Error::malformed(
            "descriptor message",
            format!("{} bytes without this rank's magic and token", got.bytes),
        ));
    }
    let from = u32::from_le_bytes([msg[4], msg[5], msg[6], msg[7]]) as usize;
    let fd = received.ok_or_else(|| {
        Error::malformed(
            "descriptor message",
            format!("rank {from} sent no descriptor"),
        )
    })?;
    Ok((from, fd))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::sync::Arc;

    use crate::{Bootstrap, BootstrapConfig, BootstrapRoot};

    fn memfd_holding(v: u8) -> std::os::fd::OwnedFd {
        let fd = rustix::fs::memfd_create("fds-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::io::write(&fd, &[v; 8]).unwrap();
        fd
    }

    fn first_byte(fd: &std::os::fd::OwnedFd) -> u8 {
        let mut b = [0u8; 1];
        rustix::io::pread(fd, &mut b, 0).unwrap();
        b[0]
    }

    /// Four ranks, a group of three (rank 1 only takes part in the exchange of names): each
    /// member gets every member's file in the group's order, its own duplicated.
    #[test]
    fn members_receive_each_others_descriptors() {
        let n = 4;
        let cfg = BootstrapConfig::default();
        let (_root, uid) = BootstrapRoot::start("127.0.0.1:0".parse().unwrap(), n, &cfg).unwrap();
        let group = [3usize, 0, 2];
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let cfg = cfg.clone();
                    s.spawn(move || {
                        let b = Arc::new(Bootstrap::new(&uid, r, n, cfg).unwrap());
                        let mine = memfd_holding(10 + r as u8);
                        let got = b.exchange_fds(&group, mine.as_fd()).unwrap();
                        if r == 1 {
                            assert!(got.is_empty());
                        } else {
                            let bytes: Vec<u8> = got.iter().map(first_byte).collect();
                            assert_eq!(bytes, vec![13, 10, 12], "rank {r}");
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        });
    }
}
