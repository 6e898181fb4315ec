//! The egress network and its firewall (`docs/reliability.md`, "Network egress"): one
//! internal bridge network per instance (no route out, no traffic between kernels), and host
//! firewall rules that admit, from that network's bridge, only the proxy's address and port. Everything
//! here is named after the network, so the rules go with it: at shutdown, and in the sweep
//! after a crash. Rules of others are never touched: only a chain of our own and the one
//! INPUT rule that jumps to it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::Command;

use crate::docker::{Engine, EngineError, NetworkSpec};

/// The label on every network kernelbox creates for egress.
pub const NETWORK_LABEL: &str = "io.kernelbox.egress";

/// A step of setting up or removing the egress network failed.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// Creating the network failed.
    #[error("creating the egress network {name}: {source}")]
    Create {
        /// The network's name.
        name: String,
        /// The engine's error.
        source: EngineError,
    },
    /// A firewall command failed.
    #[error("firewall rule for the egress network ({args}): {message}")]
    Firewall {
        /// The iptables arguments.
        args: String,
        /// What it said.
        message: String,
    },
}

/// The names derived from one instance id: the network, its bridge interface and its chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The Docker network.
    pub network: String,
    /// Its bridge interface (at most 15 bytes).
    pub bridge: String,
    /// The iptables chain that judges what enters the host from the bridge.
    pub chain: String,
}

impl Names {
    /// The names for `instance` (its id; 8 hex digits of it are used).
    pub fn of(instance: &str) -> Names {
        let tag: String = instance
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(8)
            .collect::<String>()
            .to_ascii_lowercase();
        Names {
            network: format!("kernelbox-egress-{tag}"),
            bridge: format!("kbe-{tag}"),
            chain: format!("KBE-{tag}"),
        }
    }

    /// The names of a network called `network` (the sweep's way back).
    pub fn of_network(network: &str) -> Option<Names> {
        network
            .strip_prefix("kernelbox-egress-")
            .map(Names::of)
            .filter(|n| n.network == network)
    }
}

/// Creates the network (labelled `labels` and [`NETWORK_LABEL`]); returns its gateway and
/// subnet.
pub async fn create(
    engine: &dyn Engine,
    names: &Names,
    labels: &BTreeMap<String, String>,
) -> Result<crate::docker::NetworkAddrs, NetworkError> {
    let mut labels = labels.clone();
    labels.insert(NETWORK_LABEL.into(), "true".into());
    engine
        .create_network(&NetworkSpec {
            name: names.network.clone(),
            bridge: names.bridge.clone(),
            labels,
        })
        .await
        .map_err(|source| NetworkError::Create {
            name: names.network.clone(),
            source,
        })
}

fn iptables(args: &[&str]) -> Result<(), NetworkError> {
    let out = Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .map_err(|e| NetworkError::Firewall {
            args: args.join(" "),
            message: e.to_string(),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetworkError::Firewall {
            args: args.join(" "),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

fn jump<'a>(names: &'a Names, comment: &'a str) -> [&'a str; 8] {
    [
        "-i",
        &names.bridge,
        "-m",
        "comment",
        "--comment",
        comment,
        "-j",
        &names.chain,
    ]
}

/// Admits from the bridge only TCP to `gateway:port` (the proxy's address: no other address of
/// the host, whatever listens there) and drops the rest: a chain of its own, jumped to from the
/// top of INPUT. Any rules left from an earlier run of the same names are removed first.
pub fn firewall(names: &Names, gateway: IpAddr, port: u16) -> Result<(), NetworkError> {
    remove_firewall(names);
    let port = port.to_string();
    let gateway = gateway.to_string();
    let comment = format!("kernelbox egress {}", names.network);
    iptables(&["-N", &names.chain])?;
    iptables(&[
        "-A",
        &names.chain,
        "-p",
        "tcp",
        "-d",
        &gateway,
        "--dport",
        &port,
        "-j",
        "ACCEPT",
    ])?;
    iptables(&["-A", &names.chain, "-j", "DROP"])?;
    let mut args = vec!["-I", "INPUT", "1"];
    args.extend(jump(names, &comment));
    iptables(&args)
}

/// Removes the chain and its jump (what is already gone is no error).
pub fn remove_firewall(names: &Names) {
    let comment = format!("kernelbox egress {}", names.network);
    let mut args = vec!["-D", "INPUT"];
    args.extend(jump(names, &comment));
    while iptables(&args).is_ok() {}
    let _ = iptables(&["-F", &names.chain]);
    let _ = iptables(&["-X", &names.chain]);
}

/// Removes the network and its firewall rules.
pub async fn remove(engine: &dyn Engine, names: &Names) -> Result<(), EngineError> {
    remove_firewall(names);
    engine.remove_network(&names.network).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_the_kernels_limits_and_lead_back() {
        let n = Names::of("3F9a-77bc11d2e");
        assert_eq!(n.network, "kernelbox-egress-3f9a77bc");
        assert!(n.bridge.len() <= 15, "{}", n.bridge);
        assert!(n.chain.len() <= 28, "{}", n.chain);
        assert_eq!(Names::of_network(&n.network), Some(n));
        assert_eq!(Names::of_network("bridge"), None);
    }
}
