//! Failed logins slowed, per peer address: after a wrong token, password or session token, the
//! address waits before its next credential is looked at (0.1 s, doubling with each failure up
//! to 5 s), so that guessing runs at a few attempts a second, not thousands. A call with a
//! session token the server gave goes on meanwhile: a client already in is never held up by
//! someone guessing from the same address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tonic::Status;

/// The wait after the first failure; each further failure doubles it, up to [`LONGEST`].
const FIRST: Duration = Duration::from_millis(100);
const LONGEST: Duration = Duration::from_secs(5);
/// An address with no failure for this long starts afresh.
const FORGOTTEN_AFTER: Duration = Duration::from_secs(600);
/// Addresses remembered at most; past it, those done waiting are forgotten first.
const MOST_PEERS: usize = 65_536;

#[derive(Debug, Default)]
pub struct Throttle {
    peers: Mutex<HashMap<IpAddr, Failures>>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    /// When the address's next credential is looked at.
    until: Instant,
}

impl Throttle {
    /// Refuses a credential from `peer` while it waits after its failures.
    #[allow(clippy::result_large_err)]
    pub fn wait(&self, peer: Option<IpAddr>) -> Result<(), Status> {
        let Some(peer) = peer else { return Ok(()) };
        let now = Instant::now();
        match self.peers.lock().get(&peer) {
            Some(f) if f.until > now => Err(Status::unauthenticated(format!(
                "too many failed attempts from this address: the next credential is looked at \
                 in {} ms",
                (f.until - now).as_millis().max(1)
            ))),
            _ => Ok(()),
        }
    }

    /// A wrong credential from `peer`: its wait grows.
    pub fn failed(&self, peer: Option<IpAddr>) {
        let Some(peer) = peer else { return };
        let now = Instant::now();
        let mut peers = self.peers.lock();
        if peers.len() >= MOST_PEERS && !peers.contains_key(&peer) {
            peers.retain(|_, f| f.until + FORGOTTEN_AFTER > now);
            if peers.len() >= MOST_PEERS {
                // Still full: the oldest to wait out its failures make room.
                let mut waits: Vec<Instant> = peers.values().map(|f| f.until).collect();
                waits.sort();
                let cut = waits[waits.len() / 2];
                peers.retain(|_, f| f.until > cut);
            }
        }
        let failures = peers.entry(peer).or_insert(Failures {
            count: 0,
            until: now,
        });
        if failures.until + FORGOTTEN_AFTER < now {
            failures.count = 0;
        }
        failures.count = failures.count.saturating_add(1);
        let wait = FIRST
            .saturating_mul(1 << (failures.count - 1).min(10))
            .min(LONGEST);
        failures.until = now + wait;
    }

    /// A right credential from `peer`: its failures forgotten.
    pub fn succeeded(&self, peer: Option<IpAddr>) {
        if let Some(peer) = peer {
            self.peers.lock().remove(&peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_doubles_the_wait_of_its_address_only() {
        let throttle = Throttle::default();
        let a: Option<IpAddr> = Some("10.0.0.1".parse().unwrap());
        let b: Option<IpAddr> = Some("10.0.0.2".parse().unwrap());
        assert!(throttle.wait(a).is_ok());
        throttle.failed(a);
        assert!(throttle.wait(a).is_err());
        assert!(throttle.wait(b).is_ok());
        std::thread::sleep(FIRST + Duration::from_millis(20));
        assert!(throttle.wait(a).is_ok());
        throttle.failed(a);
        std::thread::sleep(FIRST + Duration::from_millis(20));
        assert!(
            throttle.wait(a).is_err(),
            "the second failure waits twice as long"
        );
        throttle.succeeded(a);
        assert!(throttle.wait(a).is_ok());
        assert!(throttle.wait(None).is_ok());
    }
}
