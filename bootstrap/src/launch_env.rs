//! What the launcher told this process: rank, world size, local rank, root address.
//!
//! A pure function over a variable lookup, so that it is tested without touching the process
//! environment. Launchers, in the order they are tried:
//!
//! | source     | rank                    | world size              | local rank                    |
//! |------------|-------------------------|-------------------------|-------------------------------|
//! | `torchrun` | `RANK`                  | `WORLD_SIZE`            | `LOCAL_RANK`                  |
//! | `openmpi`  | `OMPI_COMM_WORLD_RANK`  | `OMPI_COMM_WORLD_SIZE`  | `OMPI_COMM_WORLD_LOCAL_RANK`  |
//! | `pmi`      | `PMI_RANK`              | `PMI_SIZE`              | `MPI_LOCALRANKID`, `PMI_LOCAL_RANK` |
//! | `slurm`    | `SLURM_PROCID`          | `SLURM_NTASKS`          | `SLURM_LOCALID`               |
//!
//! The root address is `MSCCLPP_MASTER_ADDR`/`MSCCLPP_MASTER_PORT` when set, else torchrun's
//! `MASTER_ADDR` and `MASTER_PORT + 1`: torchrun's own TCPStore already listens on
//! `MASTER_PORT` on the master node, so the bootstrap root takes the next port. Set
//! `MSCCLPP_MASTER_PORT` to choose the port explicitly.

use mscclpp_base::{Error, Result};

/// The launch as described by the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    /// This process's rank.
    pub rank: usize,
    /// The number of ranks.
    pub world_size: usize,
    /// The rank within this node, if the launcher says.
    pub local_rank: Option<usize>,
    /// The bootstrap root as `"host:port"` (`"[v6]:port"`), if an address is configured.
    pub root: Option<String>,
    /// Which launcher the rank came from: `"torchrun"`, `"openmpi"`, `"pmi"` or `"slurm"`.
    pub source: &'static str,
}

struct Launcher {
    source: &'static str,
    rank: &'static str,
    size: &'static str,
    local: &'static [&'static str],
}

const LAUNCHERS: &[Launcher] = &[
    Launcher {
        source: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        local: &["LOCAL_RANK"],
    },
    Launcher {
        source: "openmpi",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local: &["OMPI_COMM_WORLD_LOCAL_RANK"],
    },
    Launcher {
        source: "pmi",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local: &["MPI_LOCALRANKID", "PMI_LOCAL_RANK"],
    },
    Launcher {
        source: "slurm",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local: &["SLURM_LOCALID"],
    },
];

/// Reads the launch description through `lookup` (which returns a variable's value, `None`
/// when unset). Empty values count as unset. No launcher variable at all is an error; see
/// [`detect_optional`] for programs that also run standalone.
pub fn detect(lookup: &dyn Fn(&str) -> Option<String>) -> Result<LaunchInfo> {
    detect_optional(lookup)?.ok_or_else(|| {
        let names: Vec<String> = LAUNCHERS
            .iter()
            .map(|l| format!("{}/{}", l.rank, l.size))
            .collect();
        Error::invalid(format!(
            "no launcher rank found in the environment: set one of {}",
            names.join(", ")
        ))
    })
}

/// Like [`detect`], but `Ok(None)` when no launcher set a rank or a world size (a standalone
/// run). Every launcher variable that is present must be well-formed, whichever launcher it
/// belongs to: a malformed one is an error naming it and its value, never a reason to run
/// standalone (under a launcher, every process would then run a job of its own).
pub fn detect_optional(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>> {
    let get = |name: &str| {
        lookup(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    check_present(&get)?;
    let Some(launcher) = LAUNCHERS
        .iter()
        .find(|l| get(l.rank).is_some() || get(l.size).is_some())
    else {
        return Ok(None);
    };
    let need = |name: &str| -> Result<usize> {
        let v = get(name).ok_or_else(|| {
            Error::invalid(format!(
                "{} launch detected but environment variable {name} is not set",
                launcher.source
            ))
        })?;
        num(name, &v)
    };
    if get(launcher.size).as_deref() == Some("0") {
        return Err(Error::invalid(format!(
            "environment variable {}=0: the world size must be at least 1",
            launcher.size
        )));
    }
    let world_size = need(launcher.size)?;
    let rank = need(launcher.rank)?;
    if world_size == 0 {
        return Err(Error::invalid(format!(
            "environment variable {}={world_size}: the world size must be at least 1",
            launcher.size
        )));
    }
    if rank >= world_size {
        return Err(Error::invalid(format!(
            "environment variables {}={rank} and {}={world_size}: the rank must be below the world size",
            launcher.rank, launcher.size
        )));
    }
    let mut local_rank = None;
    for name in launcher.local {
        if let Some(v) = get(name) {
            local_rank = Some(num(name, &v)?);
            break;
        }
    }
    Ok(Some(LaunchInfo {
        rank,
        world_size,
        local_rank,
        root: root_address(&get)?,
        source: launcher.source,
    }))
}

fn num(name: &str, v: &str) -> Result<usize> {
    v.parse::<usize>().map_err(|_| {
        Error::invalid(format!(
            "environment variable {name}={v:?} is malformed: expected a non-negative integer"
        ))
    })
}

fn port_of(name: &str, v: &str) -> Result<u16> {
    v.parse::<u16>().map_err(|_| {
        Error::invalid(format!(
            "environment variable {name}={v:?} is malformed: expected a port in 0..=65535"
        ))
    })
}

/// Checks the form of every launcher variable that is set.
fn check_present(get: &dyn Fn(&str) -> Option<String>) -> Result<()> {
    for l in LAUNCHERS {
        for name in [l.rank, l.size].iter().chain(l.local) {
            if let Some(v) = get(name) {
                num(name, &v)?;
            }
        }
    }
    for name in ["MSCCLPP_MASTER_ADDR", "MASTER_ADDR"] {
        if let Some(v) = get(name) {
            check_host(name, &v)?;
        }
    }
    let own_port = match get("MSCCLPP_MASTER_PORT") {
        Some(v) => Some(port_of("MSCCLPP_MASTER_PORT", &v)?),
        None => None,
    };
    if let Some(v) = get("MASTER_PORT") {
        let port = port_of("MASTER_PORT", &v)?;
        if own_port.is_none() && port == u16::MAX {
            return Err(Error::invalid(
                "environment variable MASTER_PORT=\"65535\" leaves no port for the bootstrap root \
                 (it uses MASTER_PORT+1); set MSCCLPP_MASTER_PORT",
            ));
        }
    }
    Ok(())
}

/// A host name, an IPv4 address or an IPv6 address (bracketed or not, with a zone).
fn check_host(name: &str, v: &str) -> Result<()> {
    let ok = v.len() <= 255
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-_:[]%".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "environment variable {name}={v:?} is malformed: expected a host name or an IP address"
        )))
    }
}

fn root_address(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>> {
    let (addr_var, addr) = match (get("MSCCLPP_MASTER_ADDR"), get("MASTER_ADDR")) {
        (Some(a), _) => ("MSCCLPP_MASTER_ADDR", a),
        (None, Some(a)) => ("MASTER_ADDR", a),
        (None, None) => return Ok(None),
    };
    let port = if let Some(p) = get("MSCCLPP_MASTER_PORT") {
        port_of("MSCCLPP_MASTER_PORT", &p)?
    } else if let Some(p) = get("MASTER_PORT") {
        // torchrun's TCPStore owns MASTER_PORT on the master node.
        let base = port_of("MASTER_PORT", &p)?;
        base.checked_add(1).ok_or_else(|| {
            Error::invalid(
                "environment variable MASTER_PORT=\"65535\" leaves no port for the bootstrap root \
                 (it uses MASTER_PORT+1); set MSCCLPP_MASTER_PORT",
            )
        })?
    } else {
        return Err(Error::invalid(format!(
            "{addr_var} is set but neither MSCCLPP_MASTER_PORT nor MASTER_PORT is"
        )));
    };
    let host = if addr.contains(':') && !addr.starts_with('[') {
        format!("[{addr}]")
    } else {
        addr
    };
    Ok(Some(format!("{host}:{port}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn run(vars: &[(&str, &str)]) -> Result<LaunchInfo> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        detect(&move |k| map.get(k).cloned())
    }

    #[test]
    fn torchrun_uses_master_port_plus_one() {
        let i = run(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!(
            i,
            LaunchInfo {
                rank: 3,
                world_size: 8,
                local_rank: Some(1),
                root: Some("10.0.0.1:29501".into()),
                source: "torchrun"
            }
        );
    }

    #[test]
    fn mscclpp_overrides_win() {
        let i = run(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("MSCCLPP_MASTER_ADDR", "fe80::1"),
            ("MSCCLPP_MASTER_PORT", "7000"),
        ])
        .unwrap();
        assert_eq!(i.root.as_deref(), Some("[fe80::1]:7000"));
        // MSCCLPP port alone overrides torchrun's port without the +1.
        let i = run(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "host1"),
            ("MASTER_PORT", "29500"),
            ("MSCCLPP_MASTER_PORT", "7000"),
        ])
        .unwrap();
        assert_eq!(i.root.as_deref(), Some("host1:7000"));
    }

    #[test]
    fn openmpi_and_slurm_and_pmi() {
        let i = run(&[
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "16"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "5"),
            ("MSCCLPP_MASTER_ADDR", "node0"),
            ("MSCCLPP_MASTER_PORT", "5000"),
        ])
        .unwrap();
        assert_eq!(
            (i.rank, i.world_size, i.local_rank, i.source),
            (5, 16, Some(5), "openmpi")
        );
        let i = run(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "0"),
        ])
        .unwrap();
        assert_eq!(
            (i.rank, i.world_size, i.local_rank, i.source),
            (2, 4, Some(0), "slurm")
        );
        assert_eq!(i.root, None);
        let i = run(&[("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("SLURM_PROCID", "7")]).unwrap();
        assert_eq!(
            (i.rank, i.world_size, i.local_rank, i.source),
            (1, 2, None, "pmi")
        );
    }

    #[test]
    fn missing_and_malformed_values_name_the_variable() {
        let e = run(&[]).unwrap_err().to_string();
        assert!(
            e.contains("RANK/WORLD_SIZE") && e.contains("SLURM_PROCID"),
            "{e}"
        );
        let e = run(&[("RANK", "1")]).unwrap_err().to_string();
        assert!(e.contains("WORLD_SIZE"), "{e}");
        let e = run(&[("RANK", "one"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("RANK=\"one\""), "{e}");
        let e = run(&[("RANK", "2"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("below the world size"), "{e}");
        let e = run(&[("RANK", "0"), ("WORLD_SIZE", "0")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("WORLD_SIZE=0"), "{e}");
        let e = run(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "h")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("MASTER_PORT"), "{e}");
        let e = run(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "x"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("MASTER_PORT=\"x\""), "{e}");
        let e = run(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "65535"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("MSCCLPP_MASTER_PORT"), "{e}");
        let e = run(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "-1"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("SLURM_LOCALID"), "{e}");
    }

    fn optional(vars: &[(&str, &str)]) -> Result<Option<LaunchInfo>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        detect_optional(&move |k| map.get(k).cloned())
    }

    /// The cases: each used to fall back to a standalone run.
    #[test]
    fn a_malformed_launcher_variable_is_never_a_standalone_run() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("RANK", "5"), ("WORLD_SIZE", "2")],
                "RANK=5 and WORLD_SIZE=2",
            ),
            (&[("WORLD_SIZE", "0")], "WORLD_SIZE=0"),
            (&[("RANK", "abc")], "RANK=\"abc\""),
            (&[("RANK", "-1")], "RANK=\"-1\""),
            (&[("LOCAL_RANK", "abc")], "LOCAL_RANK=\"abc\""),
            (&[("MASTER_PORT", "abc")], "MASTER_PORT=\"abc\""),
            (&[("MASTER_PORT", "65535")], "MASTER_PORT=\"65535\""),
            (&[("MASTER_PORT", "70000")], "MASTER_PORT=\"70000\""),
            (&[("MSCCLPP_MASTER_PORT", "x")], "MSCCLPP_MASTER_PORT=\"x\""),
            (&[("MASTER_ADDR", "a b")], "MASTER_ADDR=\"a b\""),
            (
                &[("OMPI_COMM_WORLD_SIZE", "two")],
                "OMPI_COMM_WORLD_SIZE=\"two\"",
            ),
            (&[("PMI_RANK", "1.5")], "PMI_RANK=\"1.5\""),
            (&[("MPI_LOCALRANKID", "x")], "MPI_LOCALRANKID=\"x\""),
            (&[("SLURM_NTASKS", "")], ""),
            // A malformed variable of another launcher counts too.
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("SLURM_PROCID", "n")],
                "SLURM_PROCID=\"n\"",
            ),
        ];
        for (vars, want) in cases {
            match optional(vars) {
                Err(e) if !want.is_empty() => {
                    let m = e.to_string();
                    assert!(m.contains(want), "{vars:?}: {m}");
                    assert_eq!(e.class(), mscclpp_base::ErrorClass::InvalidUsage);
                }
                Ok(None) if want.is_empty() => {}
                other => panic!("{vars:?}: {other:?}"),
            }
        }
        // Well-formed values without a launcher rank: a standalone run.
        assert_eq!(
            optional(&[
                ("LOCAL_RANK", "0"),
                ("MASTER_ADDR", "node-1.example"),
                ("MASTER_PORT", "29500")
            ])
            .unwrap(),
            None
        );
        // MSCCLPP_MASTER_PORT frees MASTER_PORT=65535 from the +1.
        let i = optional(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "65535"),
            ("MSCCLPP_MASTER_PORT", "7000"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(i.root.as_deref(), Some("h:7000"));
    }
}
