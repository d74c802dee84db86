//! Whether a busy guest is still there.
//!
//! A command may print nothing for an hour, so silence alone proves
//! nothing; a guest that answers nothing does. After [`PING_AFTER`] without
//! a frame hull sends a `Ping` (once per [`PING_AFTER`]), which the agent
//! answers from its session thread whatever the command does; when nothing
//! at all has come back for the limit, the guest is declared silent (its
//! agent wedged, its kernel hung, its vCPUs stopped) and the caller kills
//! the VM. Any frame counts as a sign of life, so a chatty command costs no
//! pings.
//!
//! The limit ([`SILENCE_LIMIT`]) is generous because guests run under TCG
//! here, two vCPUs emulated on a loaded host: a busy emulated guest has
//! answered within a second in every measured run (docs/testing.md), a
//! stopped one never does.

use std::time::{Duration, Instant};

/// Silence after which a `Ping` goes out (and the interval between pings).
pub const PING_AFTER: Duration = Duration::from_secs(1);
/// Silence after which the guest counts as gone.
pub const SILENCE_LIMIT: Duration = Duration::from_secs(8);

/// What the caller does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// Nothing to do.
    Quiet,
    /// Send `Ping` with this nonce on the control id (0).
    Ping(u64),
    /// Nothing has come back for this long: the guest is gone.
    Silent(Duration),
}

/// One peer's liveness.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    last_heard: Instant,
    last_ping: Option<Instant>,
    limit: Duration,
    nonce: u64,
    /// The longest silence seen that a frame then ended (for the logs).
    longest: Duration,
}

impl Heartbeat {
    pub fn new(limit: Duration, now: Instant) -> Heartbeat {
        Heartbeat {
            last_heard: now,
            last_ping: None,
            limit,
            nonce: 0,
            longest: Duration::ZERO,
        }
    }

    /// A frame came from the peer.
    pub fn heard(&mut self, now: Instant) {
        self.longest = self
            .longest
            .max(now.saturating_duration_since(self.last_heard));
        self.last_heard = now;
        self.last_ping = None;
    }

    /// The longest silence the peer ended itself.
    pub fn longest_silence(&self) -> Duration {
        self.longest
    }

    pub fn poll(&mut self, now: Instant) -> Beat {
        let quiet = now.saturating_duration_since(self.last_heard);
        if quiet >= self.limit {
            return Beat::Silent(quiet);
        }
        let due = match self.last_ping {
            None => quiet >= PING_AFTER,
            Some(at) => now.saturating_duration_since(at) >= PING_AFTER,
        };
        if !due {
            return Beat::Quiet;
        }
        self.last_ping = Some(now);
        self.nonce = self.nonce.wrapping_add(1);
        Beat::Ping(self.nonce)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn pings_after_a_quiet_second_and_gives_up_at_the_limit() {
        let t0 = Instant::now();
        let mut h = Heartbeat::new(4 * S, t0);
        assert_eq!(h.poll(t0), Beat::Quiet);
        assert_eq!(h.poll(t0 + S / 2), Beat::Quiet);
        assert_eq!(h.poll(t0 + S), Beat::Ping(1));
        // Once per interval, not per poll.
        assert_eq!(h.poll(t0 + S + S / 2), Beat::Quiet);
        assert_eq!(h.poll(t0 + 2 * S), Beat::Ping(2));
        assert_eq!(h.poll(t0 + 3 * S), Beat::Ping(3));
        assert_eq!(h.poll(t0 + 4 * S), Beat::Silent(4 * S));
    }

    #[test]
    fn any_frame_is_a_sign_of_life() {
        let t0 = Instant::now();
        let mut h = Heartbeat::new(4 * S, t0);
        assert_eq!(h.poll(t0 + 3 * S), Beat::Ping(1));
        h.heard(t0 + 3 * S + S / 2);
        assert_eq!(h.longest_silence(), 3 * S + S / 2);
        // The clock starts again from the frame.
        assert_eq!(h.poll(t0 + 4 * S), Beat::Quiet);
        assert_eq!(h.poll(t0 + 7 * S), Beat::Ping(2));
        assert_eq!(h.poll(t0 + 7 * S + S / 2), Beat::Silent(4 * S));
    }
}
