//! The shared, serialised sending side of one session.
//!
//! Every thread of a session (the frame reader, each exec's supervisor,
//! output readers and stdin writer) sends through one [`Outbox`], so frames
//! never interleave mid-frame. A write failure marks the outbox dead and
//! breaks the transport, which ends the session; later sends are dropped.

use std::io::Write;
use std::sync::{Arc, Mutex};

use hull_protocol::{ConnError, FrameWriter, Message};

type Closer = Arc<dyn Fn() + Send + Sync>;

struct Inner {
    w: FrameWriter<Box<dyn Write + Send>>,
    dead: bool,
}

#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Mutex<Inner>>,
    closer: Closer,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("dead", &self.is_dead())
            .finish()
    }
}

impl Outbox {
    pub fn new(w: Box<dyn Write + Send>, closer: Closer) -> Outbox {
        Outbox {
            inner: Arc::new(Mutex::new(Inner {
                w: FrameWriter::new(w),
                dead: false,
            })),
            closer,
        }
    }

    /// Send one frame; `false` if it was not sent (connection gone).
    pub fn send(&self, msg: &Message, id: u32) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.dead {
            return false;
        }
        match g.w.send(msg, id) {
            Ok(()) => true,
            Err(ConnError::Encode(e)) => {
                // Our own bug (a message out of bounds): say so, keep going.
                tracing::error!(id, "not sending a frame: {e}");
                false
            }
            Err(e) => {
                tracing::debug!(id, "connection lost while sending: {e}");
                g.dead = true;
                drop(g);
                (self.closer)();
                false
            }
        }
    }

    pub fn is_dead(&self) -> bool {
        self.inner.lock().map(|g| g.dead).unwrap_or(true)
    }

    /// Break the transport (ends the session's reader too).
    pub fn close(&self) {
        // Break the transport first: it unblocks a sender stuck in a write
        // (which holds the lock).
        (self.closer)();
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.dead = true;
    }
}
