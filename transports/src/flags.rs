//! [`TransportFlags`]: a set of transports, as MSCCL++'s `TransportFlags`.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

use mscclpp_hal::Result;

use crate::transport::Transport;

/// A set of [`Transport`]s (a registered memory's reachability, say).
///
/// One bit per transport, in MSCCL++'s order: CudaIpc, IB0..IB7, Ethernet. On the wire it is
/// a `u16`; unknown bits are refused when decoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TransportFlags(u16);

// Every bit names a transport since Net0..Net5 (codes 10..15) took the last six.
impl TransportFlags {
    /// The empty set.
    pub const NONE: TransportFlags = TransportFlags(0);

    /// The set holding only `t` (empty for an IB number above 7, which does not exist).
    pub fn single(t: Transport) -> Self {
        TransportFlags(t.code().map_or(0, |c| 1 << c))
    }

    /// Whether `t` is in the set.
    pub fn contains(self, t: Transport) -> bool {
        t.code().is_some_and(|c| self.0 & (1 << c) != 0)
    }

    /// Whether memory in the set lands through its owner's receiver, by id: Ethernet and every
    /// Net device do (both carry frames that the peer's receiver thread lands).
    pub fn lands_by_id(self) -> bool {
        self.iter()
            .any(|t| matches!(t, Transport::Ethernet | Transport::Net(_)))
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The transports in the set, in MSCCL++'s order.
    pub fn iter(self) -> impl Iterator<Item = Transport> {
        Transport::ALL
            .into_iter()
            .filter(move |t| self.contains(*t))
    }

    /// The wire form.
    pub fn bits(self) -> u16 {
        self.0
    }

    /// Decodes the wire form (every bit names a transport: it cannot fail today; it stays a
    /// `Result` for the transports a later version adds).
    pub fn from_bits(bits: u16) -> Result<Self> {
        Ok(TransportFlags(bits))
    }
}

impl From<Transport> for TransportFlags {
    fn from(t: Transport) -> Self {
        TransportFlags::single(t)
    }
}

impl BitOr for TransportFlags {
    type Output = TransportFlags;
    fn bitor(self, rhs: TransportFlags) -> TransportFlags {
        TransportFlags(self.0 | rhs.0)
    }
}

impl BitOr<Transport> for TransportFlags {
    type Output = TransportFlags;
    fn bitor(self, rhs: Transport) -> TransportFlags {
        self | TransportFlags::single(rhs)
    }
}

impl BitOr for Transport {
    type Output = TransportFlags;
    fn bitor(self, rhs: Transport) -> TransportFlags {
        TransportFlags::single(self) | rhs
    }
}

impl BitOrAssign for TransportFlags {
    fn bitor_assign(&mut self, rhs: TransportFlags) {
        self.0 |= rhs.0;
    }
}

impl fmt::Display for TransportFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        for (i, t) in self.iter().enumerate() {
            if i > 0 {
                f.write_str("|")?;
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for TransportFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TransportFlags({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations_and_display() {
        let f = Transport::CudaIpc | Transport::Ethernet;
        assert!(f.contains(Transport::CudaIpc) && f.contains(Transport::Ethernet));
        assert!(!f.contains(Transport::Ib(0)));
        assert_eq!(f.to_string(), "CudaIpc|Ethernet");
        assert_eq!(TransportFlags::NONE.to_string(), "none");
        let g = f | Transport::Ib(7);
        assert_eq!(
            g.iter().collect::<Vec<_>>(),
            vec![Transport::CudaIpc, Transport::Ib(7), Transport::Ethernet]
        );
        assert_eq!(TransportFlags::from_bits(g.bits()).unwrap(), g);
        assert!(TransportFlags::from_bits(1 << 10).is_ok(), "Net0's bit");
        assert!(TransportFlags::single(Transport::Ib(8)).is_empty());
        assert!(TransportFlags::single(Transport::Net(6)).is_empty());
        let all = Transport::ALL
            .into_iter()
            .fold(TransportFlags::NONE, |a, t| a | t);
        assert_eq!(all.iter().count(), 16);
    }
}
