//! Failed logins, counted per peer so that password guessing is throttled (see
//! [`Failures`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

/// Peers whose failures are remembered at most; past it, the failures of every peer not
/// remembered are counted together (see [`Failures`]).
pub(super) const MAX_PEERS: usize = 4096;

/// Failed logins: per peer (an IPv6 peer by its /64, the block one host is given), and,
/// once [`MAX_PEERS`] peers are remembered, for all other peers together, so that failures
/// spread over more addresses than that are still counted (those peers are then refused
/// together, rather than not at all).
pub(super) struct Failures {
    pub(super) by_peer: HashMap<IpAddr, (u32, Instant)>,
    others: (u32, Instant),
}

impl Default for Failures {
    fn default() -> Self {
        Failures {
            by_peer: HashMap::new(),
            others: (0, Instant::now()),
        }
    }
}

impl Failures {
    /// `peer`'s count, if it has one: its own (`true`), or the others' when it has none
    /// and the table is full (`false`).
    pub(super) fn get(&self, peer: IpAddr) -> Option<((u32, Instant), bool)> {
        match self.by_peer.get(&peer) {
            Some(&count) => Some((count, true)),
            None => (self.by_peer.len() >= MAX_PEERS).then_some((self.others, false)),
        }
    }

    /// Where a failure of `peer` is counted: its own count (made if new), or the others'
    /// when it has none and the table is full. Only failures take a place in the table.
    pub(super) fn place(&self, peer: IpAddr) -> Counted {
        match self.by_peer.len() >= MAX_PEERS && !self.by_peer.contains_key(&peer) {
            true => Counted::Others,
            false => Counted::Own(peer),
        }
    }

    /// The count `counted` names (a peer's own is made at `now` if new).
    pub(super) fn of(&mut self, counted: Counted, now: Instant) -> &mut (u32, Instant) {
        match counted {
            Counted::Others => &mut self.others,
            Counted::Own(peer) => self.by_peer.entry(peer).or_insert((0, now)),
        }
    }

    /// Takes back a login counted as failed that succeeded: a peer whose count falls to
    /// zero gives up its place, so only failures keep one.
    pub(super) fn take_back(&mut self, counted: Counted) {
        match counted {
            Counted::Others => self.others.0 = self.others.0.saturating_sub(1),
            Counted::Own(peer) => {
                if let Some((n, _)) = self.by_peer.get_mut(&peer) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.by_peer.remove(&peer);
                    }
                }
            }
        }
    }
}

/// Where a login was counted: a peer's own count, or the others' (see [`Failures`]).
#[derive(Clone, Copy)]
pub(super) enum Counted {
    Own(IpAddr),
    Others,
}

/// The address failures are counted by: an IPv4 address (one mapped into IPv6 too), or
/// an IPv6 address's /64.
pub(super) fn counted_as(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V4(_) => peer,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from_bits(
                v6.to_bits() & !u128::from(u64::MAX),
            )),
        },
    }
}
