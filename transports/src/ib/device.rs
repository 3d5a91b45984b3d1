//! Which HCA an IBn transport means, opened: its context, protection domain, port and address.
//!
//! IBn is the n-th entry of `MSCCLPP_HCA_DEVICES` (a comma list of device names, each optionally
//! `name:port`), as MSCCL++'s `getIBDeviceName` reads it; unset, it is the n-th device
//! `ibv_get_device_list` returns. The port is the one named, else the first ACTIVE one.

use std::fmt;
use std::sync::Arc;

use mscclpp_hal::{Error, Result};

use super::ffi::{IBV_LINK_LAYER_ETHERNET, IBV_PORT_ACTIVE};
use super::verbs::{Handle, Verbs};

/// The environment variable mapping IBn to a device.
pub(crate) const HCA_DEVICES: &str = "MSCCLPP_HCA_DEVICES";

/// Highest port number probed when looking for an active one.
const MAX_PORT: u8 = 8;

/// One opened HCA port, shared by the connections and registrations of a rank that use IBn.
pub(crate) struct IbDevice {
    pub(crate) verbs: Arc<dyn Verbs>,
    pub(crate) index: u8,
    pub(crate) name: String,
    pub(crate) ctx: Handle,
    pub(crate) pd: Handle,
    pub(crate) port: u8,
    pub(crate) lid: u16,
    pub(crate) gid_tbl_len: i32,
    pub(crate) mtu: u32,
    pub(crate) roce: bool,
}

impl fmt::Debug for IbDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IbDevice")
            .field("transport", &format_args!("IB{}", self.index))
            .field("name", &self.name)
            .field("port", &self.port)
            .field("lid", &self.lid)
            .field("roce", &self.roce)
            .finish()
    }
}

impl Drop for IbDevice {
    fn drop(&mut self) {
        self.verbs.dealloc_pd(self.pd);
        self.verbs.close(self.ctx);
    }
}

/// One entry of `MSCCLPP_HCA_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HcaEntry {
    pub name: String,
    pub port: Option<u8>,
}

/// Parses `MSCCLPP_HCA_DEVICES`'s value; the error names the variable and the bad entry.
pub(crate) fn parse_hca_list(v: &str) -> Result<Vec<HcaEntry>> {
    v.split(',')
        .map(|e| {
            let e = e.trim();
            let (name, port) = match e.split_once(':') {
                Some((n, p)) => {
                    let port = p.trim().parse::<u8>().ok().filter(|&p| p >= 1);
                    if port.is_none() {
                        return Err(Error::invalid(format!(
                            "environment variable {HCA_DEVICES}={v:?} is malformed: entry {e:?} has port {p:?}, expected a number from 1"
                        )));
                    }
                    (n.trim(), port)
                }
                None => (e, None),
            };
            if name.is_empty() {
                return Err(Error::invalid(format!(
                    "environment variable {HCA_DEVICES}={v:?} is malformed: an empty entry; expected device names such as mlx5_0,mlx5_1"
                )));
            }
            Ok(HcaEntry {
                name: name.to_owned(),
                port,
            })
        })
        .collect()
}

/// The "not available" error for IBn, with the reason in MSCCL++'s words.
pub(crate) fn no_device(n: u8, why: impl fmt::Display) -> Error {
    Error::unavailable(format!("IB{n}"), format!("no RDMA device found ({why})"))
}

impl IbDevice {
    /// Opens the device IBn means, with `hca_list` the value of `MSCCLPP_HCA_DEVICES` (if set).
    pub(crate) fn open(
        verbs: Arc<dyn Verbs>,
        n: u8,
        hca_list: Option<&str>,
    ) -> Result<Arc<IbDevice>> {
        let names = verbs
            .device_names()
            .map_err(|e| {
                no_device(
                    n,
                    format_args!(
                        "libibverbs ({}) was loaded but listing devices failed: {e}; is the ib_uverbs kernel module loaded? see `ibv_devinfo`",
                        verbs.origin()
                    ),
                )
            })?;
        if names.is_empty() {
            return Err(no_device(
                n,
                format_args!(
                    "libibverbs ({}) was found but lists no device: is an RDMA driver loaded? see `ibv_devinfo`",
                    verbs.origin()
                ),
            ));
        }
        let entry = match hca_list {
            Some(v) => {
                let list = parse_hca_list(v)?;
                let Some(e) = list.get(usize::from(n)).cloned() else {
                    return Err(Error::invalid(format!(
                        "IB{n} needs entry {n} of {HCA_DEVICES}={v:?}, which has {} entries",
                        list.len()
                    )));
                };
                if !names.contains(&e.name) {
                    return Err(no_device(
                        n,
                        format_args!(
                            "{HCA_DEVICES} names {:?} for IB{n}; this host has {}",
                            e.name,
                            names.join(", ")
                        ),
                    ));
                }
                e
            }
            None => match names.get(usize::from(n)) {
                Some(name) => HcaEntry {
                    name: name.clone(),
                    port: None,
                },
                None => {
                    return Err(no_device(
                        n,
                        format_args!(
                            "IB{n} is device {n} in libibverbs' list, and this host has {} device(s): {}; set {HCA_DEVICES} to choose",
                            names.len(),
                            names.join(", ")
                        ),
                    ));
                }
            },
        };
        let ctx = verbs.open(&entry.name)?;
        // From here the context (and then the PD) must be released on every error path.
        let (port, info) = match Self::probe(&*verbs, ctx, &entry) {
            Ok(p) => p,
            Err(e) => {
                verbs.close(ctx);
                return Err(super::error::within(e, || {
                    format!("opening IB{n} ({})", entry.name)
                }));
            }
        };
        let pd = match verbs.alloc_pd(ctx) {
            Ok(pd) => pd,
            Err(e) => {
                verbs.close(ctx);
                return Err(e);
            }
        };
        tracing::debug!(
            transport = %format_args!("IB{n}"),
            device = %entry.name,
            port,
            lid = info.lid,
            roce = info.link_layer == IBV_LINK_LAYER_ETHERNET,
            "opened an RDMA device"
        );
        Ok(Arc::new(IbDevice {
            verbs,
            index: n,
            name: entry.name,
            ctx,
            pd,
            port,
            lid: info.lid,
            gid_tbl_len: info.gid_tbl_len,
            mtu: info.active_mtu,
            roce: info.link_layer == IBV_LINK_LAYER_ETHERNET,
        }))
    }

    /// The port to use and its attributes.
    fn probe(
        verbs: &dyn Verbs,
        ctx: Handle,
        entry: &HcaEntry,
    ) -> Result<(u8, super::verbs::PortInfo)> {
        let mut seen = Vec::new();
        let ports: Vec<u8> = match entry.port {
            Some(p) => vec![p],
            None => (1..=MAX_PORT).collect(),
        };
        for p in ports {
            let info = match verbs.query_port(ctx, p) {
                Ok(i) => i,
                // Ports are numbered from 1 without gaps: the first that fails is past the last.
                Err(e) if entry.port.is_none() && !seen.is_empty() => {
                    tracing::trace!("port {p}: {e}");
                    break;
                }
                Err(e) => return Err(e),
            };
            if info.state != IBV_PORT_ACTIVE {
                seen.push(format!("port {p} is {}", port_state(info.state)));
                continue;
            }
            return Ok((p, info));
        }
        Err(Error::unavailable(
            format!("an ACTIVE port on {}", entry.name),
            if seen.is_empty() {
                "no port answered".to_owned()
            } else {
                seen.join(", ")
            },
        ))
    }
}

fn port_state(s: u32) -> &'static str {
    match s {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "in an unknown state",
    }
}

impl IbDevice {
    /// The GID at `index` of the port, checked against the table and, on RoCE, for emptiness.
    pub(crate) fn gid(&self, index: u8) -> Result<[u8; 16]> {
        if self.gid_tbl_len > 0 && i32::from(index) >= self.gid_tbl_len {
            return Err(Error::invalid(format!(
                "GID index {index} is outside the table of {} entries of {} port {}",
                self.gid_tbl_len, self.name, self.port
            )));
        }
        let gid = self.verbs.query_gid(self.ctx, self.port, index)?;
        if self.roce && gid == [0; 16] {
            return Err(Error::unavailable(
                format!("RoCE on {} port {}", self.name, self.port),
                format!(
                    "GID index {index} is empty (no IP address on the interface?); see `show_gids`"
                ),
            ));
        }
        Ok(gid)
    }
}
