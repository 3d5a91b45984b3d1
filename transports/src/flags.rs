//! [`TransportFlags`]: a set of transports, as MSCCL++'s `TransportFlags`.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

use mscclpp_hal::{Error, Result};

use crate::transport::Transport;

/// A set of [`Transport`]s (a registered memory's reachability, say).
///
/// One bit per transport, in MSCCL++'s order: CudaIpc, IB0..IB7, Ethernet. On the wire it is
/// a `u16`; unknown bits are refused when decoding.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TransportFlags(u16);

/// Every bit that names a transport.
const VALID: u16 = (1 << 10) - 1;

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

    /// Decodes the wire form, refusing bits that name no transport.
    pub fn from_bits(bits: u16) -> Result<Self> {
        if bits & !VALID != 0 {
            return Err(Error::malformed(
                "transport flags",
                format!("bits {:#06x} name no transport", bits & !VALID),
            ));
        }
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
        assert!(TransportFlags::from_bits(1 << 10).is_err());
        assert!(TransportFlags::single(Transport::Ib(8)).is_empty());
        let all = Transport::ALL
            .into_iter()
            .fold(TransportFlags::NONE, |a, t| a | t);
        assert_eq!(all.iter().count(), 10);
    }
}
