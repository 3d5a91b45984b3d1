//! Which local address a rank's sockets listen on (bootstrap root and mesh, Ethernet endpoints).
//!
//! `MSCCLPP_SOCKET_IFNAME` may be an interface name, `ifname:ip`, or an IP. For a bare interface
//! name the IPv4 address is found without `getifaddrs`: the interface's routes in
//! `/proc/net/route` give a destination on its subnet, and a UDP socket "connected" there (which
//! sends nothing) reports the source address the kernel picks — the interface's own. Without the
//! variable, the same trick towards a public address finds the address of the default route;
//! with no route at all, 127.0.0.1 (single-host runs).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};

use crate::error::{Error, Result};

/// The address to listen on, per `MSCCLPP_SOCKET_IFNAME` (see the module doc).
pub fn local_ip() -> Result<IpAddr> {
    match crate::env::get("MSCCLPP_SOCKET_IFNAME") {
        Some(v) => ip_for_ifname(&v).map_err(|e| {
            // The inner error's own class prefix would repeat "invalid usage".
            let why = match e {
                Error::InvalidUsage(m) => m,
                other => other.to_string(),
            };
            Error::invalid(format!(
                "environment variable MSCCLPP_SOCKET_IFNAME={v:?} is malformed: {why}"
            ))
        }),
        None => Ok(source_ip_towards(SocketAddr::from(([8, 8, 8, 8], 53)))
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))),
    }
}

/// Checks that network interface `name` exists (`/sys/class/net/<name>`).
pub fn check_interface(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() < 16
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b));
    if valid && std::path::Path::new("/sys/class/net").join(name).exists() {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "network interface {name:?} does not exist (not in /sys/class/net)"
        )))
    }
}

fn ip_for_ifname(v: &str) -> Result<IpAddr> {
    if let Ok(ip) = v.parse::<IpAddr>() {
        return Ok(ip);
    }
    if let Some((name, ip)) = v.split_once(':') {
        check_interface(name)?;
        return ip
            .parse::<IpAddr>()
            .map_err(|_| Error::invalid(format!("{ip:?} is not an IP address")));
    }
    check_interface(v)?;
    if v == "lo" {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let routes = std::fs::read_to_string("/proc/net/route")
        .map_err(|e| Error::io("reading /proc/net/route", e))?;
    for line in routes.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || f[0] != v {
            continue;
        }
        let hex = |s: &str| {
            u32::from_str_radix(s, 16)
                .ok()
                .map(|x| Ipv4Addr::from(x.swap_bytes()))
        };
        let (Some(dest), Some(gw), Some(mask)) = (hex(f[1]), hex(f[2]), hex(f[7])) else {
            continue;
        };
        let target = if !mask.is_unspecified() {
            // Any address on the interface's subnet routes out of it.
            Ipv4Addr::from(u32::from(dest) | 1)
        } else if !gw.is_unspecified() {
            gw
        } else {
            continue;
        };
        if let Some(ip) = source_ip_towards(SocketAddr::new(IpAddr::V4(target), 9)) {
            return Ok(ip);
        }
    }
    Err(Error::unavailable(
        format!("an IPv4 address on interface {v}"),
        "no usable route in /proc/net/route; set MSCCLPP_SOCKET_IFNAME=ifname:ip",
    ))
}

fn source_ip_towards(target: SocketAddr) -> Option<IpAddr> {
    let bind: SocketAddr = if target.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let s = UdpSocket::bind(bind).ok()?;
    s.connect(target).ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_bad_names() {
        assert!(check_interface("lo").is_ok());
        assert!(check_interface("no-such-if0").is_err());
        assert!(check_interface("../etc").is_err());
        assert_eq!(
            ip_for_ifname("lo").unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(
            ip_for_ifname("lo:127.0.0.2").unwrap(),
            "127.0.0.2".parse::<IpAddr>().unwrap()
        );
        assert!(ip_for_ifname("lo:notanip").is_err());
    }
}
