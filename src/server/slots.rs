//! Connection slots: who may hold one of the server's `max_connections` connections
//! (docs/http-api.md, "Slow and idle clients cannot hold the server").
//!
//! A connection is accepted *unauthenticated*. Unauthenticated connections share a smaller
//! pool (`max_unauthenticated`, a quarter of `max_connections` by default), and one address
//! (an IPv4 address, or an IPv6 /64) may hold at most `max_unauthenticated_per_address` of
//! them; a connection from an address already holding its share takes the slot of one of that
//! address's unauthenticated connections doing nothing useful — one withholding the rest of a
//! head before one idle (between requests, or not reading its response) before one that has
//! sent nothing yet, the oldest of them ([`Doing`]) — and is refused only when all of them are
//! busy. So a tenant behind the same address as a flood (a NAT) gets in: its new connection is
//! the newest, and sends its head at once. The first request on a connection that carries a valid tenant token promotes it
//! (the API's authentication calls [`Promote::authenticated`], found in the request's
//! extensions): it leaves the unauthenticated pool and counts only against
//! `max_connections`.
//!
//! When a new connection finds the unauthenticated pool (or every slot) full, it takes the
//! slot of an unauthenticated connection that is doing nothing useful — still waiting for
//! its first request head, idle between requests, or not reading its response — chosen from
//! the address holding the most unauthenticated connections, its oldest first; that
//! connection is closed without a response. Only when no such connection exists is the new
//! one refused (503 `too_many_connections`). So a client without a token, from however many
//! addresses, can neither hold the slots of authenticated connections nor keep a new
//! connection from being admitted long enough to authenticate: to push out a tenant's
//! connection before its head arrives, the tenant's address would have to be the one holding
//! the most unauthenticated connections.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// Where a connection stands in the slot books.
const UNAUTHENTICATED: u8 = 0;
const AUTHENTICATED: u8 = 1;
/// Its slot was given to a newer connection (or released): nothing left to release.
const GONE: u8 = 2;

/// What an unauthenticated connection is doing, for who gives way first: a higher one before a
/// lower one of the same address; [`Doing::Busy`] never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(super) enum Doing {
    /// A request in flight, its response read.
    Busy = 0,
    /// Nothing received yet: a client whose head is on its way (a tenant's new connection
    /// behind the same address as a flood is here until its head arrives).
    Silent = 1,
    /// Idle between requests, or not reading its response.
    Idle = 2,
    /// Part of a request head received, the rest withheld (a slow or half-sent head).
    Stalled = 3,
}

impl Doing {
    fn from_u8(n: u8) -> Doing {
        match n {
            1 => Doing::Silent,
            2 => Doing::Idle,
            3 => Doing::Stalled,
            _ => Doing::Busy,
        }
    }
}

/// The address a per-address share is counted under: an IPv4 address, or the /64 of an IPv6
/// one (a single host commonly holds a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Peer {
    V4(u32),
    V6(u64),
}

impl Peer {
    fn of(ip: IpAddr) -> Peer {
        match ip {
            IpAddr::V4(v4) => Peer::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Peer::V4(u32::from(v4)),
                None => Peer::V6((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

/// The caps slots are handed out under.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caps {
    /// Connections open at once, at least 1.
    pub total: usize,
    /// Unauthenticated connections open at once, in 1..=total.
    pub unauthenticated: usize,
    /// Unauthenticated connections of one address; 0 for no cap.
    pub per_address: usize,
}

/// Why a connection was refused a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Every slot it could take is held by a connection that is busy (or authenticated).
    Full,
    /// Its address holds its share of unauthenticated connections already.
    PerAddress,
}

impl Shared {
    fn doing(&self) -> Doing {
        Doing::from_u8(self.doing.load(Ordering::Acquire))
    }
}

/// One connection's part of the books, shared by its [`Slot`] and its [`Promote`] handles.
#[derive(Debug)]
struct Shared {
    id: u64,
    peer: Peer,
    stage: AtomicU8,
    /// What the connection is doing ([`Doing`]): whether, and how readily, it gives up its
    /// slot to a newer one while unauthenticated.
    doing: AtomicU8,
    /// Cancelled when the slot is given to a newer connection: the connection closes.
    evicted: CancellationToken,
}

#[derive(Debug, Default)]
struct Books {
    open: usize,
    /// Unauthenticated connections, oldest first.
    unauthenticated: BTreeMap<u64, Arc<Shared>>,
    per_address: HashMap<Peer, usize>,
    next_id: u64,
}

impl Books {
    fn forget_unauthenticated(&mut self, shared: &Shared) {
        self.unauthenticated.remove(&shared.id);
        if let Some(n) = self.per_address.get_mut(&shared.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_address.remove(&shared.peer);
            }
        }
    }

    /// Takes `victim`'s slot away: it leaves the books and its connection is closed.
    fn evict(&mut self, victim: &Shared) {
        self.forget_unauthenticated(victim);
        self.open = self.open.saturating_sub(1);
        victim.stage.store(GONE, Ordering::Release);
        victim.evicted.cancel();
    }

    /// The unauthenticated connection of `peer` to give up its slot: one withholding the rest
    /// of a head before one idle before one that has sent nothing yet, the oldest of them;
    /// none while all are busy.
    fn oldest_idle_of(&self, peer: Peer) -> Option<Arc<Shared>> {
        let mut best: Option<(Doing, &Arc<Shared>)> = None;
        for shared in self.unauthenticated.values() {
            if shared.peer != peer {
                continue;
            }
            let doing = shared.doing();
            // Oldest first: a later one doing the same does not replace it.
            if doing != Doing::Busy && best.is_none_or(|(most, _)| doing > most) {
                best = Some((doing, shared));
            }
        }
        best.map(|(_, shared)| shared.clone())
    }

    /// The unauthenticated connection to give up its slot: an evictable one of the address
    /// holding the most unauthenticated connections, the oldest of them.
    fn victim(&self) -> Option<Arc<Shared>> {
        let mut best: Option<(usize, &Arc<Shared>)> = None;
        for shared in self.unauthenticated.values() {
            if shared.doing() == Doing::Busy {
                continue;
            }
            let held = self.per_address.get(&shared.peer).copied().unwrap_or(0);
            // Oldest first: a later one of the same count does not replace it.
            if best.is_none_or(|(most, _)| held > most) {
                best = Some((held, shared));
            }
        }
        best.map(|(_, shared)| shared.clone())
    }
}

/// The slot books of one server, across all of its listeners.
#[derive(Debug)]
pub(super) struct Slots {
    caps: Caps,
    books: Mutex<Books>,
}

impl Slots {
    pub(super) fn new(caps: Caps) -> Arc<Slots> {
        Arc::new(Slots {
            caps,
            books: Mutex::new(Books::default()),
        })
    }

    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a new connection from `ip`, taken from an idle unauthenticated connection
    /// if need be (which is then closed); `Err` when none can be had. The second value says
    /// whether a connection was pushed out for it.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<(Slot, bool), Refusal> {
        let peer = Peer::of(ip);
        let mut books = self.books();
        let held = books.per_address.get(&peer).copied().unwrap_or(0);
        let mut evicted = false;
        if self.caps.per_address > 0 && held >= self.caps.per_address {
            // The address is at its share: the newcomer takes the slot of the address's own
            // oldest idle unauthenticated connection (a tenant behind the same NAT as a flood
            // still gets in), and is refused only when every one of them is busy.
            let victim = books.oldest_idle_of(peer).ok_or(Refusal::PerAddress)?;
            books.evict(&victim);
            evicted = true;
        } else if books.open >= self.caps.total
            || books.unauthenticated.len() >= self.caps.unauthenticated
        {
            let victim = books.victim().ok_or(Refusal::Full)?;
            books.evict(&victim);
            evicted = true;
        }
        let shared = Arc::new(Shared {
            id: books.next_id,
            peer,
            stage: AtomicU8::new(UNAUTHENTICATED),
            doing: AtomicU8::new(Doing::Silent as u8),
            evicted: CancellationToken::new(),
        });
        books.next_id += 1;
        books.open += 1;
        *books.per_address.entry(peer).or_insert(0) += 1;
        books.unauthenticated.insert(shared.id, shared.clone());
        let slot = Slot(Promote {
            slots: self.clone(),
            shared,
        });
        Ok((slot, evicted))
    }

    /// Connections open, and of them unauthenticated (for tests).
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let books = self.books();
        (books.open, books.unauthenticated.len())
    }
}

/// A connection's handle on its slot, put in each of its requests' extensions: the API's
/// authentication promotes the connection with it. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Promote {
    slots: Arc<Slots>,
    shared: Arc<Shared>,
}

impl Promote {
    /// The connection carried a valid tenant token: it leaves the unauthenticated pool (and
    /// its address's share of it) and can no longer be pushed out. Idempotent.
    pub(crate) fn authenticated(&self) {
        if self.shared.stage.load(Ordering::Acquire) != UNAUTHENTICATED {
            return;
        }
        let mut books = self.slots.books();
        if self.shared.stage.load(Ordering::Acquire) == UNAUTHENTICATED {
            books.forget_unauthenticated(&self.shared);
            self.shared.stage.store(AUTHENTICATED, Ordering::Release);
        }
    }

    /// A request is about to run on the connection: marks it [`Doing::Busy`] under the books'
    /// lock, so it is never given away while the request runs, unless its slot was already
    /// given to a newer connection: false then, and the request must not run (its connection
    /// is being closed, so its answer would never reach the client).
    pub(super) fn begin_request(&self) -> bool {
        if self.shared.stage.load(Ordering::Acquire) == AUTHENTICATED {
            return true;
        }
        let _books = self.slots.books();
        if self.shared.stage.load(Ordering::Acquire) == GONE {
            return false;
        }
        self.set_doing(Doing::Busy);
        true
    }

    /// Notes what the connection is doing (see [`Doing`]).
    pub(super) fn set_doing(&self, doing: Doing) {
        self.shared.doing.store(doing as u8, Ordering::Release);
    }
}

/// One connection's slot, released when dropped.
#[derive(Debug)]
pub(super) struct Slot(Promote);

impl Slot {
    /// The handle the API promotes the connection with.
    pub(super) fn promote(&self) -> Promote {
        self.0.clone()
    }

    /// Cancelled when the slot was given to a newer connection.
    pub(super) fn evicted(&self) -> &CancellationToken {
        &self.0.shared.evicted
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let shared = &self.0.shared;
        let mut books = self.0.slots.books();
        match shared.stage.swap(GONE, Ordering::AcqRel) {
            UNAUTHENTICATED => {
                books.forget_unauthenticated(shared);
                books.open = books.open.saturating_sub(1);
            }
            AUTHENTICATED => books.open = books.open.saturating_sub(1),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an address")
    }

    fn slots(total: usize, unauthenticated: usize, per_address: usize) -> Arc<Slots> {
        Slots::new(Caps {
            total,
            unauthenticated,
            per_address,
        })
    }

    #[test]
    fn an_address_at_its_share_gives_up_its_own_oldest_idle_slot_and_is_refused_when_all_are_busy()
    {
        let slots = slots(16, 8, 2);
        let (other, _) = slots.admit(ip("10.0.0.2")).expect("another address");
        let a = [
            slots.admit(ip("10.0.0.1")).expect("first"),
            slots.admit(ip("10.0.0.1")).expect("second"),
        ];
        // At its share: the newcomer takes the address's oldest idle slot, never another
        // address's (even an older one).
        let (b, evicted) = slots.admit(ip("10.0.0.1")).expect("the third");
        assert!(evicted);
        assert!(a[0].0.evicted().is_cancelled());
        assert!(!a[1].0.evicted().is_cancelled() && !other.evicted().is_cancelled());
        assert_eq!(slots.counts(), (3, 3));
        // When every connection of the address is busy, the newcomer is refused.
        a[1].0.promote().set_doing(Doing::Busy);
        b.promote().set_doing(Doing::Busy);
        assert_eq!(slots.admit(ip("10.0.0.1")).err(), Some(Refusal::PerAddress));
        let (c, evicted) = slots.admit(ip("10.0.0.3")).expect("another address still");
        assert!(!evicted);
        // A promoted connection no longer counts against its address's share.
        b.promote().authenticated();
        let (_d, evicted) = slots.admit(ip("10.0.0.1")).expect("room again");
        assert!(!evicted);
        assert_eq!(slots.counts(), (5, 4));
        drop(c);
        assert_eq!(slots.counts(), (4, 3));
    }

    #[test]
    fn at_an_addresss_share_a_withheld_head_gives_way_before_an_idle_one_before_a_silent_one() {
        let slots = slots(16, 8, 3);
        let (silent, _) = slots.admit(ip("10.0.0.1")).expect("silent");
        let (idle, _) = slots.admit(ip("10.0.0.1")).expect("idle");
        idle.promote().set_doing(Doing::Idle);
        let (stalled, _) = slots.admit(ip("10.0.0.1")).expect("stalled");
        stalled.promote().set_doing(Doing::Stalled);
        let (_d, evicted) = slots.admit(ip("10.0.0.1")).expect("d");
        assert!(evicted && stalled.evicted().is_cancelled());
        let (_e, _) = slots.admit(ip("10.0.0.1")).expect("e");
        assert!(idle.evicted().is_cancelled());
        assert!(!silent.evicted().is_cancelled());
        // Only silent ones left: the oldest of them.
        let (_f, _) = slots.admit(ip("10.0.0.1")).expect("f");
        assert!(silent.evicted().is_cancelled());
        assert_eq!(slots.counts(), (3, 3));
    }

    #[test]
    fn a_request_never_starts_on_a_connection_whose_slot_was_given_away() {
        let slots = slots(16, 8, 1);
        let (first, _) = slots.admit(ip("10.0.0.1")).expect("first");
        // Its head is being read when a newer connection of the address takes its slot: the
        // request does not run.
        let (second, evicted) = slots.admit(ip("10.0.0.1")).expect("second");
        assert!(evicted && first.evicted().is_cancelled());
        assert!(!first.promote().begin_request());
        // One whose request began is busy: a newcomer is refused rather than cut it off.
        assert!(second.promote().begin_request());
        assert_eq!(slots.admit(ip("10.0.0.1")).err(), Some(Refusal::PerAddress));
        assert!(!second.evicted().is_cancelled());
    }

    #[test]
    fn ipv6_addresses_are_counted_by_their_64_and_mapped_ipv4_as_ipv4() {
        let slots = slots(16, 8, 1);
        let (a, _) = slots.admit(ip("2001:db8:1:2::1")).expect("first");
        // Busy, so the address's share cannot be taken from it.
        a.promote().set_doing(Doing::Busy);
        assert_eq!(
            slots.admit(ip("2001:db8:1:2:ffff::9")).err(),
            Some(Refusal::PerAddress),
            "same /64"
        );
        let _b = slots.admit(ip("2001:db8:1:3::1")).expect("another /64");
        let (c, _) = slots.admit(ip("10.1.1.1")).expect("v4");
        c.promote().set_doing(Doing::Busy);
        assert_eq!(
            slots.admit(ip("::ffff:10.1.1.1")).err(),
            Some(Refusal::PerAddress)
        );
    }

    #[test]
    fn a_full_unauthenticated_pool_gives_up_the_oldest_idle_slot_of_the_busiest_address() {
        let slots = slots(64, 4, 0);
        let flood: Vec<(Slot, bool)> = (0..3)
            .map(|_| slots.admit(ip("10.0.0.9")).expect("flood"))
            .collect();
        let (tenant, _) = slots.admit(ip("10.0.0.1")).expect("tenant");
        // The pool is full: a newcomer from anywhere pushes out the flood's oldest.
        let (newcomer, evicted) = slots.admit(ip("10.0.0.1")).expect("admitted");
        assert!(evicted);
        assert!(flood[0].0.evicted().is_cancelled());
        assert!(!flood[1].0.evicted().is_cancelled());
        assert!(!tenant.evicted().is_cancelled());
        assert_eq!(slots.counts(), (4, 4));
        // A connection with a request in flight is not pushed out.
        flood[1].0.promote().set_doing(Doing::Busy);
        let (_late, _) = slots.admit(ip("10.0.0.3")).expect("admitted");
        assert!(!flood[1].0.evicted().is_cancelled());
        assert!(flood[2].0.evicted().is_cancelled());
        // Dropping an evicted slot releases nothing twice.
        drop(flood);
        assert_eq!(slots.counts(), (3, 3));
        drop((tenant, newcomer));
        assert_eq!(slots.counts(), (1, 1));
    }

    #[test]
    fn authenticated_connections_are_never_pushed_out_and_a_full_house_refuses() {
        let slots = slots(3, 2, 0);
        let (a, _) = slots.admit(ip("10.0.0.1")).expect("a");
        let (b, _) = slots.admit(ip("10.0.0.1")).expect("b");
        a.promote().authenticated();
        b.promote().authenticated();
        b.promote().authenticated();
        let (c, _) = slots.admit(ip("10.0.0.2")).expect("c");
        c.promote().set_doing(Doing::Busy);
        assert_eq!(slots.counts(), (3, 1));
        // Every slot is held: two authenticated, one busy.
        assert_eq!(slots.admit(ip("10.0.0.3")).err(), Some(Refusal::Full));
        // Once c is idle, a newcomer takes its slot; never a's or b's.
        c.promote().set_doing(Doing::Idle);
        let (_d, evicted) = slots.admit(ip("10.0.0.3")).expect("d");
        assert!(evicted && c.evicted().is_cancelled());
        assert!(!a.evicted().is_cancelled() && !b.evicted().is_cancelled());
        drop(a);
        assert_eq!(slots.counts(), (2, 1));
    }
}
