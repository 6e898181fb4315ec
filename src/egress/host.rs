//! The host's own addresses, as the egress proxy must know them (`docs/reliability.md`,
//! "Network egress", "Special and host addresses"): every address of the host's interfaces
//! (refused whatever the policy, loopback excepted), the networks those interfaces are on
//! (Docker's bridges among them: special ranges that need their own allowance), and
//! kernelbox's own listening addresses (refused whatever the policy, loopback included).
//! Enumerated with `getifaddrs` at start and again when a snapshot is older than
//! [`HOST_ADDRS_REFRESH`], when a destination is judged.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How old a snapshot of the host's interface addresses may be when a destination is judged
/// against it (an interface or Docker network added since is known within this).
pub const HOST_ADDRS_REFRESH: Duration = Duration::from_secs(1);

/// Shortest prefix of an interface's network taken as a special range (a wider one, a
/// misconfiguration or a tunnel's catch-all, would make most of the internet special).
const MIN_PREFIX_V4: u8 = 8;
const MIN_PREFIX_V6: u8 = 32;

/// One snapshot of the host's interfaces: each address with its network's prefix length.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interfaces {
    /// Every interface address and its prefix length (IPv4-mapped addresses as IPv4).
    pub addrs: Vec<(IpAddr, u8)>,
}

impl Interfaces {
    /// The host's interfaces now (an empty snapshot when `getifaddrs` fails: the static
    /// special ranges still apply).
    pub fn now() -> Interfaces {
        match enumerate() {
            Ok(addrs) => Interfaces { addrs },
            Err(e) => {
                tracing::warn!(error = %e, "listing the host's interface addresses failed");
                Interfaces::default()
            }
        }
    }

    /// True when `ip` is an address of one of the host's interfaces.
    pub fn is_host(&self, ip: IpAddr) -> bool {
        self.addrs.iter().any(|(a, _)| *a == ip)
    }

    /// The networks the host's interfaces are on, as ranges (base, prefix length).
    pub fn networks(&self) -> impl Iterator<Item = (IpAddr, u8)> + '_ {
        self.addrs.iter().filter_map(|(a, len)| {
            let min = if a.is_ipv4() {
                MIN_PREFIX_V4
            } else {
                MIN_PREFIX_V6
            };
            (*len >= min).then_some((*a, *len))
        })
    }
}

/// The host's addresses as the proxy judges them: a refreshed snapshot of its interfaces and
/// kernelbox's own listening addresses.
#[derive(Debug)]
pub struct HostAddrs {
    snapshot: Mutex<(Instant, std::sync::Arc<Interfaces>)>,
    listeners: Mutex<Vec<SocketAddr>>,
}

impl Default for HostAddrs {
    fn default() -> Self {
        HostAddrs::new()
    }
}

impl HostAddrs {
    /// Enumerates the host's interfaces now.
    pub fn new() -> HostAddrs {
        HostAddrs {
            snapshot: Mutex::new((Instant::now(), std::sync::Arc::new(Interfaces::now()))),
            listeners: Mutex::new(Vec::new()),
        }
    }

    /// The host's interfaces, enumerated again when the snapshot is older than
    /// [`HOST_ADDRS_REFRESH`].
    pub fn interfaces(&self) -> std::sync::Arc<Interfaces> {
        let mut snapshot = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        if snapshot.0.elapsed() >= HOST_ADDRS_REFRESH {
            *snapshot = (Instant::now(), std::sync::Arc::new(Interfaces::now()));
        }
        snapshot.1.clone()
    }

    /// Adds kernelbox's own listening addresses (the API's, the metrics', the proxy's): never
    /// a destination.
    pub fn add_listeners(&self, addrs: &[SocketAddr]) {
        let mut listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        for addr in addrs {
            let addr = SocketAddr::new(canonical(addr.ip()), addr.port());
            if !listeners.contains(&addr) {
                listeners.push(addr);
            }
        }
    }

    /// True when `dest` is one of kernelbox's own listening addresses: the same port on the
    /// listener's address, or on any host address (loopback included) for a listener bound
    /// to the unspecified address.
    pub fn is_listener(&self, dest: SocketAddr, interfaces: &Interfaces) -> bool {
        let ip = canonical(dest.ip());
        let on_host = ip.is_loopback() || interfaces.is_host(ip);
        self.listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|l| {
                l.port() == dest.port()
                    && (l.ip() == ip
                        || (l.ip().is_unspecified() && (on_host || ip.is_unspecified())))
            })
    }
}

/// `ip` with an IPv4-mapped IPv6 address as its IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Every interface address with its prefix length, from `getifaddrs` (the library's one
/// use of the C interface list: no safe wrapper is among its dependencies).
#[allow(unsafe_code)]
fn enumerate() -> std::io::Result<Vec<(IpAddr, u8)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `getifaddrs` fills `head` with a list it allocated, freed below with
    // `freeifaddrs`; nothing of it is kept past that.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut at = head;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list `getifaddrs` returned, not yet freed.
        let node = unsafe { &*at };
        // SAFETY: each address pointer is null or points to a sockaddr of its family.
        if let (Some(addr), mask) = unsafe { (sockaddr(node.ifa_addr), sockaddr(node.ifa_netmask)) }
        {
            let len = match mask {
                Some(IpAddr::V4(m)) => u32::from(m).count_ones() as u8,
                Some(IpAddr::V6(m)) => u128::from(m).count_ones() as u8,
                None => {
                    if addr.is_ipv4() {
                        32
                    } else {
                        128
                    }
                }
            };
            out.push((canonical(addr), len));
        }
        at = node.ifa_next;
    }
    // SAFETY: `head` came from `getifaddrs` and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The address in `sa`, when it is an IPv4 or IPv6 one.
///
/// # Safety
/// `sa` is null or points to a valid sockaddr of the size its family implies.
#[allow(unsafe_code)]
unsafe fn sockaddr(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    match i32::from((*sa).sa_family) {
        libc::AF_INET => {
            let sin = &*(sa as *const libc::sockaddr_in);
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                sin.sin_addr.s_addr,
            ))))
        }
        libc::AF_INET6 => {
            let sin6 = &*(sa as *const libc::sockaddr_in6);
            Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_loopback_is_among_its_interfaces_and_listeners_are_matched_by_port() {
        let interfaces = Interfaces::now();
        assert!(
            interfaces.is_host("127.0.0.1".parse().expect("ip")),
            "{interfaces:?}"
        );
        assert!(interfaces
            .networks()
            .any(|(a, len)| a == "127.0.0.1".parse::<IpAddr>().expect("ip") && len == 8));
        let host = HostAddrs::new();
        host.add_listeners(&["0.0.0.0:8080".parse().expect("addr")]);
        host.add_listeners(&["127.0.0.1:9090".parse().expect("addr")]);
        let at = |s: &str| host.is_listener(s.parse().expect("addr"), &interfaces);
        assert!(at("127.0.0.1:8080"));
        assert!(at("127.0.0.2:8080"));
        assert!(at("[::ffff:127.0.0.1]:9090"));
        assert!(!at("127.0.0.2:9090"));
        assert!(!at("127.0.0.1:8081"));
        assert!(!at("203.0.113.9:8080"));
    }
}
