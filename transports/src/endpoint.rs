//! Making an endpoint ([`Endpoint::new`]): binding its listener, drawing its nonce and running
//! what its transport prepares before any peer sees it (IB's QP, the net plugin's load), picked
//! from the table of transports (`connection.rs`'s `TransportOps`). What an endpoint is, and
//! what the transports read of it, is in `offer.rs`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use mscclpp_hal::{Error, Result};

use crate::connection::TransportOps;
use crate::context::TransportContext;
use crate::offer::{Endpoint, EndpointConfig, LocalEndpoint};

impl Endpoint {
    /// Creates this rank's endpoint for one connection, binding its listener on the address
    /// `MSCCLPP_SOCKET_IFNAME` names (`ip`, `ifname:ip`, `lo`), else the address of the default
    /// route, else 127.0.0.1.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(ctx: &Arc<TransportContext>, cfg: EndpointConfig) -> Result<LocalEndpoint> {
        cfg.transport.built()?;
        let ip = mscclpp_hal::net::local_ip()?;
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| Error::io(format!("binding a {} listener on {ip}", cfg.transport), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("reading the listener's address", e))?;
        let (ops, n) = TransportOps::of(cfg.transport);
        let ib = (ops.prepare)(ctx, &cfg, n)?;
        let endpoint = Endpoint {
            transport: cfg.transport,
            rank: ctx.rank(),
            host_id: ctx.host_id().to_owned(),
            device: ctx.device().info().ordinal,
            addr,
            nonce: nonce(),
            ib: ib.as_ref().map(|q| q.info),
        };
        Ok(LocalEndpoint {
            ctx: ctx.clone(),
            cfg,
            endpoint,
            listener,
            ib,
        })
    }
}

/// 128 bits from the OS's random source, through the standard library's randomly keyed hasher
/// (the only OS randomness std exposes).
fn nonce() -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, half) in out.chunks_mut(8).enumerate() {
        let mut h = RandomState::new().build_hasher();
        h.write_usize(i);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ib::QpInfo;
    use crate::test_util::host_ctx;
    use crate::transport::Transport;
    use proptest::prelude::*;

    #[test]
    fn round_trip_v4_and_v6() {
        let ctx = host_ctx(3);
        let local = Endpoint::new(&ctx, EndpointConfig::new(Transport::Ethernet)).unwrap();
        let ep = local.endpoint().clone();
        assert_eq!(ep.rank, 3);
        assert_eq!(Endpoint::from_bytes(&local.to_bytes()).unwrap(), ep);
        let v6 = Endpoint {
            addr: "[::1]:4242".parse().unwrap(),
            transport: Transport::Ib(5),
            ib: Some(QpInfo {
                qpn: 0x1234,
                psn: 77,
                lid: 9,
                gid: [7; 16],
                mtu: 5,
                roce: true,
                atomics: false,
            }),
            ..ep
        };
        assert_eq!(Endpoint::from_bytes(&v6.to_bytes()).unwrap(), v6);
        assert_ne!(nonce(), nonce());
    }

    #[test]
    fn ib_endpoint_without_an_hca_says_so() {
        let ctx = host_ctx(0);
        ctx.use_verbs(crate::ib::fake::FakeVerbs::with_devices(&[]));
        let e = Endpoint::new(&ctx, EndpointConfig::new(Transport::Ib(0)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("IB0") && e.contains("no RDMA device found ("),
            "{e}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = Endpoint::from_bytes(&buf);
        }

        #[test]
        fn mutated_endpoints_never_panic(at in 0usize..80, x in 1u8..=255) {
            let ep = Endpoint {
                transport: Transport::Ethernet,
                rank: 1,
                host_id: "h".into(),
                device: 0,
                addr: "127.0.0.1:9".parse().unwrap(),
                nonce: [3; 16],
                ib: None,
            };
            let mut b = ep.to_bytes();
            let at = at % b.len();
            b[at] ^= x;
            let _ = Endpoint::from_bytes(&b);
        }
    }
}
