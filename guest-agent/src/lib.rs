//! `hull-agent`: hull's guest agent. It runs in the outer VM (`outer`) and
//! inside the container (`inner`), speaks `hull-protocol`, and runs commands
//! for the host with streamed output and whole-tree kill.
//!
//! Linux only: it relies on `/proc`, `PR_SET_CHILD_SUBREAPER`, pidfds and
//! virtio-serial.

#[cfg(target_os = "linux")]
pub mod cgroup;
#[cfg(target_os = "linux")]
pub mod exec;
#[cfg(target_os = "linux")]
pub mod incus;
#[cfg(target_os = "linux")]
pub mod mounts;
#[cfg(target_os = "linux")]
pub mod netrelay;
#[cfg(target_os = "linux")]
pub mod outbox;
#[cfg(target_os = "linux")]
pub mod outer;
#[cfg(target_os = "linux")]
pub mod scrub;
#[cfg(target_os = "linux")]
pub mod serve;
#[cfg(target_os = "linux")]
pub mod spawn;
#[cfg(target_os = "linux")]
pub mod transport;
#[cfg(target_os = "linux")]
pub mod tree;
#[cfg(target_os = "linux")]
pub mod users;
