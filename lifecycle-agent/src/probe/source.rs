//! Who may connect to a pod's probe listener (`--probe-allow-from`, issue 10).
//!
//! The kubelet probes a pod IP from the node's network namespace, so its source address is one
//! of the node's own addresses (the bridge or veth gateway, or the node IP, depending on the
//! CNI). The agent runs with hostNetwork, so its own addresses are the node's: by default
//! ([`AllowFrom::Node`]) a listener accepts connections only from those, loopback excepted (inside
//! a pod's namespace 127.0.0.1 is the pod itself). Other pods, and the pod itself, are refused
//! before a byte is read.
//!
//! This is a filter on addresses, not authentication: whatever shares the node's network
//! namespace (hostNetwork pods) passes it too. Only declared checks answer either way.

use std::{fmt, net::IpAddr, str::FromStr, sync::Arc};

use parking_lot::RwLock;

/// One `--probe-allow-from` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AllowFrom {
    /// The node's own addresses (host network namespace), loopback excepted.
    Node,
    /// Every source.
    Any,
    /// Sources inside a CIDR block, e.g. `10.0.0.0/8` or `fd00::/8`.
    Cidr(Cidr),
}

/// An address block: `addr/prefix`; a bare address is a /32 or /128.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// Why a `--probe-allow-from` value was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllowFromError {
    /// Neither `node`, `any` nor `addr[/prefix]`.
    #[error("{0:?} is not `node`, `any` or a CIDR block such as 10.0.0.0/8")]
    Unknown(String),
    /// The prefix length is longer than the address.
    #[error("prefix /{prefix} is too long for {addr}")]
    Prefix { addr: IpAddr, prefix: u8 },
}

impl FromStr for AllowFrom {
    type Err = AllowFromError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "node" => return Ok(Self::Node),
            "any" => return Ok(Self::Any),
            _ => {}
        }
        let unknown = || AllowFromError::Unknown(text.to_owned());
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix.parse::<u8>().map_err(|_| unknown())?)),
            None => (text, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| unknown())?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(bits);
        if prefix > bits {
            return Err(AllowFromError::Prefix { addr, prefix });
        }
        Ok(Self::Cidr(Cidr { addr, prefix }))
    }
}

impl fmt::Display for AllowFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Node => write!(f, "node"),
            Self::Any => write!(f, "any"),
            Self::Cidr(Cidr { addr, prefix }) => write!(f, "{addr}/{prefix}"),
        }
    }
}

impl Cidr {
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => same_prefix(&net.octets(), &ip.octets(), self.prefix),
            (IpAddr::V6(net), IpAddr::V6(ip)) => same_prefix(&net.octets(), &ip.octets(), self.prefix),
            _ => false,
        }
    }
}

fn same_prefix(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let (whole, rest) = (usize::from(prefix / 8), prefix % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        a[whole] & mask == b[whole] & mask
    }
}

/// The rules of every pod listener, and the node addresses `node` stands for (shared: the
/// supervisor refreshes them, the listeners read them on each accept).
#[derive(Clone)]
pub struct SourceFilter {
    rules: Arc<[AllowFrom]>,
    node: Arc<RwLock<Vec<IpAddr>>>,
}

impl SourceFilter {
    /// A filter with `rules` (none: nobody) and no node addresses known yet.
    pub fn new(rules: &[AllowFrom]) -> Self {
        Self { rules: rules.into(), node: Arc::new(RwLock::new(Vec::new())) }
    }

    /// Whether a connection from `ip` is let in.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.rules.iter().any(|rule| match rule {
            AllowFrom::Any => true,
            AllowFrom::Cidr(cidr) => cidr.contains(ip),
            AllowFrom::Node => !ip.is_loopback() && self.node.read().contains(&ip),
        })
    }

    /// Whether the rules use the node's addresses (so they need refreshing).
    pub(crate) fn needs_node_addresses(&self) -> bool {
        self.rules.contains(&AllowFrom::Node)
    }

    /// Replaces the node's addresses.
    pub(crate) fn set_node_addresses(&self, mut addresses: Vec<IpAddr>) {
        addresses.retain(|ip| !ip.is_loopback());
        addresses.sort_unstable();
        addresses.dedup();
        *self.node.write() = addresses;
    }

    /// Reads this network namespace's addresses (the node's: the agent runs with hostNetwork)
    /// and makes them the node's; returns how many there are. Does nothing without a `node` rule.
    pub fn refresh_node_addresses(&self) -> std::io::Result<usize> {
        if !self.needs_node_addresses() {
            return Ok(0);
        }
        let addresses: Vec<IpAddr> = if_addrs::get_if_addrs()?.into_iter().map(|i| i.ip()).collect();
        self.set_node_addresses(addresses);
        Ok(self.node.read().len())
    }
}

impl fmt::Debug for SourceFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules: Vec<String> = self.rules.iter().map(ToString::to_string).collect();
        write!(f, "SourceFilter({})", rules.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("address")
    }

    #[test]
    fn flag_values_parse() {
        assert_eq!("node".parse(), Ok(AllowFrom::Node));
        assert_eq!("any".parse(), Ok(AllowFrom::Any));
        let cidr: AllowFrom = "10.1.0.0/16".parse().expect("cidr");
        assert_eq!(cidr.to_string(), "10.1.0.0/16");
        assert_eq!("192.0.2.7".parse::<AllowFrom>().expect("bare").to_string(), "192.0.2.7/32");
        assert_eq!("fd00::/8".parse::<AllowFrom>().expect("v6").to_string(), "fd00::/8");
        assert!(matches!("10.0.0.0/33".parse::<AllowFrom>(), Err(AllowFromError::Prefix { prefix: 33, .. })));
        for bad in ["nodes", "", "10.0.0/8", "10.0.0.0/x", "::1/129"] {
            assert!(bad.parse::<AllowFrom>().is_err(), "{bad}");
        }
    }

    #[test]
    fn cidr_blocks_match_by_prefix() {
        let AllowFrom::Cidr(block) = "10.1.128.0/17".parse().expect("cidr") else { panic!("not a block") };
        assert!(block.contains(ip("10.1.200.3")));
        assert!(!block.contains(ip("10.1.127.255")));
        assert!(!block.contains(ip("::ffff:10.1.200.3")), "mapped addresses are made canonical by the filter");
        let AllowFrom::Cidr(all) = "0.0.0.0/0".parse().expect("cidr") else { panic!("not a block") };
        assert!(all.contains(ip("203.0.113.9")));
        assert!(!all.contains(ip("2001:db8::1")));
    }

    #[test]
    fn node_means_the_node_addresses_but_never_loopback() {
        let filter = SourceFilter::new(&[AllowFrom::Node]);
        assert!(!filter.allows(ip("10.244.0.1")), "nothing known yet");
        filter.set_node_addresses(vec![ip("10.244.0.1"), ip("127.0.0.1"), ip("::1"), ip("2001:db8::5")]);
        assert!(filter.allows(ip("10.244.0.1")));
        assert!(filter.allows(ip("::ffff:10.244.0.1")), "IPv4-mapped");
        assert!(filter.allows(ip("2001:db8::5")));
        assert!(!filter.allows(ip("127.0.0.1")), "inside a pod, loopback is the pod itself");
        assert!(!filter.allows(ip("::1")));
        assert!(!filter.allows(ip("10.244.0.7")), "another pod");
        let both = SourceFilter::new(&[AllowFrom::Node, "127.0.0.0/8".parse().expect("cidr")]);
        assert!(both.allows(ip("127.0.0.1")), "loopback when asked for explicitly");
        assert!(SourceFilter::new(&[AllowFrom::Any]).allows(ip("10.244.0.7")));
        assert!(!SourceFilter::new(&[]).allows(ip("10.244.0.1")));
    }

    #[test]
    fn this_namespace_has_addresses_to_read() {
        let filter = SourceFilter::new(&[AllowFrom::Node]);
        // Loopback is never a node address; whatever else this machine has is.
        filter.refresh_node_addresses().expect("getifaddrs");
        assert!(!filter.allows(ip("127.0.0.1")));
        assert_eq!(SourceFilter::new(&[AllowFrom::Any]).refresh_node_addresses().expect("no-op"), 0);
    }
}
