//! Simulated hosts as network namespaces: one namespace per host, each joined by a veth pair to
//! a bridge that holds the root's address (`NET.254`; host `h` is `NET.{h+1}`). Needs root and
//! `ip`; a suite that cannot make them reports its trial ignored with the reason.

use std::process::{Command, Stdio};

/// The namespaces' /24.
pub const NET: &str = "10.79.0";

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// One network namespace per host, each joined by a veth pair to a bridge that holds the
/// root's address; removed on drop.
#[derive(Debug)]
pub struct Namespaces {
    /// The namespaces' names, by host.
    pub names: Vec<String>,
    veths: Vec<String>,
    bridge: String,
}

impl Namespaces {
    /// Makes `hosts` namespaces (their names and devices carry this process's id).
    pub fn create(hosts: usize) -> Result<Namespaces, String> {
        let id = std::process::id() % 10_000;
        let mut ns = Namespaces {
            names: Vec::new(),
            veths: Vec::new(),
            bridge: format!("mhbr{id}"),
        };
        let br = ns.bridge.clone();
        sh(&["ip", "link", "add", &br, "type", "bridge"])?;
        sh(&["ip", "addr", "add", &format!("{NET}.254/24"), "dev", &br])?;
        sh(&["ip", "link", "set", &br, "up"])?;
        for h in 0..hosts {
            let name = format!("mscclpp-hier-{id}-{h}");
            let veth = format!("mh{id}v{h}");
            let peer = format!("mh{id}p{h}");
            sh(&["ip", "netns", "add", &name])?;
            ns.names.push(name.clone());
            sh(&[
                "ip", "link", "add", &veth, "type", "veth", "peer", "name", &peer,
            ])?;
            ns.veths.push(veth.clone());
            sh(&["ip", "link", "set", &peer, "netns", &name])?;
            sh(&["ip", "link", "set", &veth, "master", &br])?;
            sh(&["ip", "link", "set", &veth, "up"])?;
            let inside = ["ip", "netns", "exec", name.as_str()];
            let addr = format!("{NET}.{}/24", h + 1);
            for cmd in [
                &["ip", "addr", "add", addr.as_str(), "dev", &peer][..],
                &["ip", "link", "set", &peer, "up"],
                &["ip", "link", "set", "lo", "up"],
            ] {
                sh(&[&inside[..], cmd].concat())?;
            }
        }
        Ok(ns)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for v in &self.veths {
            let _ = sh(&["ip", "link", "del", v]);
        }
        for n in &self.names {
            let _ = sh(&["ip", "netns", "del", n]);
        }
        let _ = sh(&["ip", "link", "del", &self.bridge]);
    }
}
