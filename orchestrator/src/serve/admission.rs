//! How many connections `hull serve` holds at once, per peer uid: a
//! client of one uid (root can reach any user's socket, and a user's own
//! processes theirs) cannot use up the server's descriptors or tasks and
//! starve the others. The server's own uid keeps its share whatever the
//! others hold; a connection over its uid's share is closed unread.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Connections one uid but the owner's holds at once.
pub const MAX_PER_PEER: usize = 64;
/// Connections the server's own uid holds at once (a harness runs many
/// execs at a time, each a connection).
pub const MAX_OWNER: usize = 1024;
/// Connections every uid but the server's own hold at once, together.
pub const MAX_OTHERS: usize = 256;
/// The longest a connection may take to send a request's headers, and the
/// longest a kept-alive connection idles between requests.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The connections held, by uid.
#[derive(Debug)]
pub struct Admitted {
    owner: u32,
    /// Connections held, by uid (a uid with none has no entry).
    held: Mutex<HashMap<u32, usize>>,
}

impl Admitted {
    pub fn new(owner: u32) -> Arc<Admitted> {
        Arc::new(Admitted {
            owner,
            held: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, usize>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connections every uid but the owner's holds, together.
    fn others(&self, held: &HashMap<u32, usize>) -> usize {
        held.iter()
            .filter(|(uid, _)| **uid != self.owner)
            .map(|(_, n)| n)
            .sum()
    }
}

/// One admitted connection: its uid's count goes down when dropped.
#[derive(Debug)]
pub struct Ticket {
    of: Arc<Admitted>,
    uid: u32,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut held = self.of.lock();
        if let Some(n) = held.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.uid);
            }
        }
    }
}

/// A ticket for a connection of `uid`, or None when its uid holds its
/// share ([`MAX_OWNER`] for the server's own uid, [`MAX_PER_PEER`] for
/// another, [`MAX_OTHERS`] for every uid but the owner's together).
pub fn admit(of: &Arc<Admitted>, uid: u32) -> Option<Ticket> {
    let mut held = of.lock();
    let mine = held.get(&uid).copied().unwrap_or(0);
    let other = uid != of.owner;
    let share = if other { MAX_PER_PEER } else { MAX_OWNER };
    if mine >= share || (other && of.others(&held) >= MAX_OTHERS) {
        return None;
    }
    *held.entry(uid).or_insert(0) += 1;
    drop(held);
    Some(Ticket {
        of: Arc::clone(of),
        uid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_uid_has_its_share_and_the_owner_keeps_its_own() {
        let a = Admitted::new(1000);
        let flood: Vec<Ticket> = (0..MAX_PER_PEER).map(|_| admit(&a, 0).unwrap()).collect();
        assert!(admit(&a, 0).is_none(), "over one uid's share");
        let mut others = Vec::new();
        for uid in 1..=u32::try_from(MAX_OTHERS / MAX_PER_PEER).unwrap() {
            for _ in 0..MAX_PER_PEER {
                if let Some(t) = admit(&a, uid) {
                    others.push(t);
                }
            }
        }
        assert!(admit(&a, 9999).is_none(), "over the others' share");
        let own: Vec<Ticket> = (0..MAX_OWNER).map(|_| admit(&a, 1000).unwrap()).collect();
        assert!(admit(&a, 1000).is_none());
        drop(flood);
        assert!(
            admit(&a, 0).is_some(),
            "a closed connection frees its place"
        );
        drop((own, others));
        assert!(a.lock().is_empty());
    }
}
