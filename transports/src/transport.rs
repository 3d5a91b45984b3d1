//! Transport names (MSCCL++'s), their wire codes and what this build supports.

use std::fmt;
use std::str::FromStr;

use mscclpp_hal::{Error, Result};

/// A transport between two ranks, with MSCCL++'s names. `CudaIpc` means "device IPC over the
/// vendor's peer link" on every vendor (and shared memory on the host backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Peer-mapped device memory on one host.
    CudaIpc,
    /// InfiniBand/RoCE through HCA number 0..=7.
    Ib(u8),
    /// TCP between hosts.
    Ethernet,
    /// Device `n` (0..=5) of an NCCL net plugin (`NCCL_NET_PLUGIN`): EFA through aws-ofi-nccl,
    /// vendors' NICs; see `crate::net`.
    Net(u8),
}

/// Net devices a transport name can address (Net0..Net5): what fits the 16 bits of
/// [`crate::TransportFlags`] beside MSCCL++'s ten.
pub const MAX_NET_DEVICES: u8 = 6;

impl Transport {
    /// What carries the bytes over this transport for ranks of `backend`, in words for a
    /// table's heading: "TCP sockets (Ethernet transport)".
    pub fn carrier(self, backend: mscclpp_hal::BackendKind) -> String {
        use mscclpp_hal::BackendKind;
        match (self, backend) {
            (Transport::CudaIpc, BackendKind::Host) => {
                "host shared memory (CudaIpc transport)".to_string()
            }
            (Transport::CudaIpc, BackendKind::Cuda) => {
                "peer-mapped GPU memory, CUDA IPC (CudaIpc transport)".to_string()
            }
            (Transport::CudaIpc, BackendKind::Rocm) => {
                "peer-mapped GPU memory, HIP IPC (CudaIpc transport)".to_string()
            }
            (Transport::Ethernet, _) => "TCP sockets (Ethernet transport)".to_string(),
            (t @ Transport::Ib(_), _) => format!("RDMA writes ({t} transport)"),
            (t @ Transport::Net(_), _) => format!("an NCCL net plugin ({t} transport)"),
        }
    }

    /// Every transport, in MSCCL++'s order.
    pub const ALL: [Transport; 16] = [
        Transport::CudaIpc,
        Transport::Ib(0),
        Transport::Ib(1),
        Transport::Ib(2),
        Transport::Ib(3),
        Transport::Ib(4),
        Transport::Ib(5),
        Transport::Ib(6),
        Transport::Ib(7),
        Transport::Ethernet,
        Transport::Net(0),
        Transport::Net(1),
        Transport::Net(2),
        Transport::Net(3),
        Transport::Net(4),
        Transport::Net(5),
    ];

    /// Whether this build can use the transport at all; the reason when it cannot. IB is always
    /// built (libibverbs is opened at run time): whether an HCA exists is found when an endpoint
    /// or a registration asks for one.
    pub fn built(self) -> Result<()> {
        match self {
            Transport::CudaIpc | Transport::Ethernet => Ok(()),
            Transport::Ib(n) if n <= 7 => Ok(()),
            Transport::Ib(n) => Err(Error::invalid(format!(
                "IB{n} does not exist: MSCCL++ names IB0 to IB7"
            ))),
            Transport::Net(n) if n < MAX_NET_DEVICES => Ok(()),
            Transport::Net(n) => Err(Error::invalid(format!(
                "Net{n} does not exist: Net0 to Net{} name net plugin devices",
                MAX_NET_DEVICES - 1
            ))),
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::CudaIpc => f.write_str("CudaIpc"),
            Transport::Ib(n) => write!(f, "IB{n}"),
            Transport::Ethernet => f.write_str("Ethernet"),
            Transport::Net(n) => write!(f, "Net{n}"),
        }
    }
}

impl FromStr for Transport {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("cudaipc") {
            return Ok(Transport::CudaIpc);
        }
        if t.eq_ignore_ascii_case("ethernet") {
            return Ok(Transport::Ethernet);
        }
        if t.eq_ignore_ascii_case("net") {
            return Ok(Transport::Net(0));
        }
        if let Some(n) = t.strip_prefix("Net").or_else(|| t.strip_prefix("net")) {
            if let Ok(n) = n.parse::<u8>() {
                if n < MAX_NET_DEVICES {
                    return Ok(Transport::Net(n));
                }
            }
        }
        if let Some(n) = t.strip_prefix("IB").or_else(|| t.strip_prefix("ib")) {
            if let Ok(n) = n.parse::<u8>() {
                if n <= 7 {
                    return Ok(Transport::Ib(n));
                }
            }
        }
        Err(Error::invalid(format!(
            "unknown transport {s:?}: expected CudaIpc, IB0..IB7, Ethernet or Net (Net0..Net5)"
        )))
    }
}

impl Transport {
    /// The transport's bit in a [`crate::TransportFlags`] and its code on the wire; `None` for
    /// an IB number MSCCL++ does not have (above 7).
    pub(crate) fn code(self) -> Option<u8> {
        match self {
            Transport::CudaIpc => Some(0),
            Transport::Ib(n) if n <= 7 => Some(1 + n),
            Transport::Ib(_) => None,
            Transport::Ethernet => Some(9),
            Transport::Net(n) if n < MAX_NET_DEVICES => Some(10 + n),
            Transport::Net(_) => None,
        }
    }

    /// Inverse of [`Transport::code`].
    pub(crate) fn from_code(code: u8) -> Option<Transport> {
        match code {
            0 => Some(Transport::CudaIpc),
            1..=8 => Some(Transport::Ib(code - 1)),
            9 => Some(Transport::Ethernet),
            10..=15 => Some(Transport::Net(code - 10)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_ib_is_built() {
        for t in Transport::ALL {
            assert_eq!(t.to_string().parse::<Transport>().unwrap(), t);
            assert!(t.built().is_ok(), "{t}");
        }
        assert!("IB8".parse::<Transport>().is_err());
        let e = Transport::Ib(8).built().unwrap_err().to_string();
        assert!(e.contains("IB8") && e.contains("IB0 to IB7"), "{e}");
    }

    #[test]
    fn codes_round_trip() {
        for t in Transport::ALL {
            assert_eq!(t.code().and_then(Transport::from_code), Some(t));
        }
        assert_eq!(Transport::from_code(16), None);
        assert_eq!(Transport::Net(6).code(), None);
        assert_eq!("net".parse::<Transport>().unwrap(), Transport::Net(0));
        assert!("Net6".parse::<Transport>().is_err());
        assert_eq!(Transport::Ib(8).code(), None);
    }
}
