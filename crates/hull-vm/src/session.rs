//! One tier-3 VM session, with one set of rules for its life and its end:
//! start the VM (restored from the image's snapshot, or booted), wait for
//! the agent's hello, set up the container (`Configure`), run commands in
//! it, and end it. `hull run --tier3` ([`crate::tier`]'s vm adapter),
//! `hull vm up` ([`crate::supervisor`]) and the batch pool
//! ([`crate::pool`]) all go through it.
//!
//! The rules:
//! - a VM that fails to start, to say hello or to set up its container is
//!   gone when the error returns (the [`Machine`] kills QEMU and every
//!   virtiofsd when dropped), and so is one whose session breaks;
//! - a cancellation (Ctrl-C, SIGTERM, a stopping supervisor) is its own
//!   outcome, [`SessionError::Cancelled`], never a failure to report;
//! - a guest that does not answer `Kill` loses its VM: the command ends as
//!   timed out or interrupted, whatever the guest does (an interrupt gives it
//!   1 s, so Ctrl-C ends a run within 2 s);
//! - a command runs watched: a helper (QEMU, a virtiofsd) that dies or stays
//!   stopped ([`crate::machine::STALL_LIMIT`]), or a guest that answers
//!   nothing, not even a ping ([`crate::heartbeat`]), ends it with an
//!   error naming the fault, and the VM is killed;
//! - nothing is retried, and nothing runs anywhere else.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use hull_protocol::NetworkSpec;

use crate::agent::{AgentError, AgentSession, ExecOptions, RawSession};
use crate::assemble::{start_vm, AssembleError, Started};
use crate::exec::{CommandSpec, ExitStatus, OutputSink};
use crate::image::GuestImage;
use crate::machine::{Fault, Machine, MachineError, Tools};
use crate::net::helper::Feed;
use crate::net_channel::NetChannel;
use crate::policy::lower::vm::VmPlan;
use crate::policy::NetPolicy;
use crate::qemu::Accel;
use crate::shape::{configure_spec, now_ns};
use crate::snapshot::SnapshotUse;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Assemble(#[from] AssembleError),
    #[error(transparent)]
    Shape(#[from] crate::shape::ShapeError),
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error("{source}\n  console log: {console}")]
    Agent {
        console: PathBuf,
        #[source]
        source: AgentError,
    },
    /// A helper of the VM died or stalled while a command ran (the VM is
    /// gone).
    #[error("tier vm: {helper} {fault} while the command ran; the VM was killed\n  its log: {log}\n  console log: {console}")]
    HelperFailed {
        helper: String,
        fault: Fault,
        log: PathBuf,
        console: PathBuf,
    },
    /// The run's network proxy ended while a command ran (the VM is gone).
    #[error(
        "{name} ended while the command ran ({how}); the VM was killed\n  console log: {console}"
    )]
    NetProxyEnded {
        name: String,
        how: String,
        console: PathBuf,
    },
    /// The run's proxy did not start (the VM is gone).
    #[error("tier vm: {0}")]
    NetProxy(#[from] crate::net::helper::StartError),
    /// The network channel could not be set up (the VM is gone).
    #[error("tier vm: cannot set up the network channel: {0}")]
    Network(#[source] std::io::Error),
    /// The guest answered nothing, not even a `Ping` (the VM is gone).
    #[error("tier vm: the guest has not answered for {secs} s (its agent wedged, its kernel hung, or its vCPUs stopped); the VM was killed\n  console log: {console}")]
    Silent { secs: u64, console: PathBuf },
    #[error("tier vm: the agent socket: {0}")]
    RawSocket(#[source] std::io::Error),
    /// Given up on request (the VM is gone).
    #[error("tier vm: cancelled")]
    Cancelled,
}

/// How long the run's proxy has to print its refused hosts and end.
const NET_GRACE: Duration = Duration::from_secs(2);

/// What a VM is started for.
#[derive(Debug)]
pub struct StartOptions<'a> {
    pub plan: &'a VmPlan,
    pub tools: &'a Tools,
    pub image: &'a GuestImage,
    pub accel: Accel,
    /// QEMU's `-name`.
    pub vm_name: String,
    /// Sockets and pid files.
    pub dir: &'a Path,
    /// Console, QEMU and virtiofsd logs.
    pub log_dir: &'a Path,
}

/// A running VM whose agent said hello.
#[derive(Debug)]
pub struct VmSession {
    machine: Machine,
    agent: AgentSession,
    plan: VmPlan,
    /// Keeps the snapshot from being replaced while QEMU reads it.
    hold: Option<SnapshotUse>,
    setup_deadline: Duration,
    /// Killed after the guest broke the session or ignored `Kill`.
    dead: bool,
    /// The run's proxy and its bridge to the VM's network port, when the
    /// policy has an allow list.
    net: Option<NetChannel>,
}

impl VmSession {
    /// Starts the VM and waits for the agent's hello, giving up (and
    /// killing the VM) when `cancelled()` says so.
    pub fn start(o: StartOptions<'_>, cancelled: &dyn Fn() -> bool) -> Result<Self, SessionError> {
        let Started {
            mut machine,
            plan,
            hold,
            deadlines: (boot_deadline, setup_deadline),
        } = start_vm(
            o.plan, o.tools, o.image, o.accel, o.vm_name, o.dir, o.log_dir,
        )?;
        let agent = match machine.connect_agent_until(boot_deadline, cancelled) {
            Ok(a) => a,
            Err(_) if cancelled() => {
                machine.kill();
                return Err(SessionError::Cancelled);
            }
            Err(e) => return Err(e.into()),
        };
        Ok(VmSession {
            machine,
            agent,
            plan,
            hold,
            setup_deadline,
            dead: false,
            net: None,
        })
    }

    /// Lets the snapshot go: QEMU only reads it while it starts, and a VM
    /// that stays up (`hull vm up`) must not hold it.
    pub fn release_snapshot(&mut self) {
        self.hold = None;
    }

    fn agent_error(&self, source: AgentError) -> SessionError {
        SessionError::Agent {
            console: self.machine.console_log().to_path_buf(),
            source,
        }
    }

    /// Gives the container the network `net` allows, through a proxy of
    /// this run's own (`label` prefixes its lines; its audit goes to
    /// `spill`): the VM's network port is bridged to it, and the next
    /// [`VmSession::configure`] has the guest listen for it. Call before
    /// `configure`. On an error the VM is killed.
    pub fn start_network(
        &mut self,
        label: &str,
        net: &NetPolicy,
        spill: &Path,
    ) -> Result<(), SessionError> {
        let started = Feed::pair()
            .map_err(SessionError::Network)
            .and_then(|(feed, input)| {
                let proxy = crate::net::helper::start_for_run(label, net, spill, input)?;
                let port = self.machine.connect_net().map_err(SessionError::Network)?;
                NetChannel::start(port, proxy, feed).map_err(SessionError::Network)
            });
        match started {
            Ok(n) => {
                self.net = Some(n);
                Ok(())
            }
            Err(e) => {
                self.machine.kill_now();
                self.dead = true;
                Err(e)
            }
        }
    }

    /// Sets up container `name` with the plan's shares and limits (and
    /// the network, when [`VmSession::attach_network`] gave it one).
    pub fn configure(
        &mut self,
        name: &str,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<(), SessionError> {
        let network = self.net.as_ref().map(|_| NetworkSpec {
            listen_port: crate::net::netns::PORT,
        });
        let cfg = configure_spec(&self.plan, name, now_ns(), network)?;
        let machine = &mut self.machine;
        let r = self.agent.configure(&cfg, self.setup_deadline, &mut || {
            cancelled() || !machine.is_running()
        });
        match r {
            Ok(_) => Ok(()),
            Err(_) if cancelled() => Err(SessionError::Cancelled),
            Err(e) => Err(self.agent_error(e)),
        }
    }

    /// Runs `spec` in the container, as the plan's user. A guest that does
    /// not answer `Kill` (after a timeout or an interrupt) loses its VM and
    /// the command ends as timed out or interrupted.
    pub fn exec(
        &mut self,
        spec: &CommandSpec,
        sink: &mut dyn OutputSink,
        mut opts: ExecOptions,
    ) -> Result<ExitStatus, SessionError> {
        opts.uid_gid = Some((self.plan.uid, self.plan.gid));
        let irq = opts.interrupt.clone();
        let machine = &mut self.machine;
        let net = self.net.as_ref();
        let mut died = None;
        let mut proxy_ended = None;
        // The reason the exec stops with; the error below says it in full.
        let mut watch = || {
            if let Some((name, how)) = net.and_then(NetChannel::ended) {
                proxy_ended = Some((name.clone(), how));
                return Some(name);
            }
            let d = machine.failed_helper()?;
            let name = d.name.clone();
            died = Some(d);
            Some(name)
        };
        let r = self.agent.exec_watched(spec, sink, opts, &mut watch);
        if let Some((name, how)) = proxy_ended {
            self.machine.kill_now();
            self.dead = true;
            return Err(SessionError::NetProxyEnded {
                name,
                how,
                console: self.machine.console_log().to_path_buf(),
            });
        }
        if let Some(d) = died {
            self.machine.kill_now();
            self.dead = true;
            return Err(SessionError::HelperFailed {
                helper: d.name,
                fault: d.fault,
                log: d.log,
                console: self.machine.console_log().to_path_buf(),
            });
        }
        match r {
            Ok(st) => Ok(st),
            Err(AgentError::Unresponsive { why, .. }) => {
                tracing::warn!("tier vm: the guest did not answer Kill after {why}; VM killed");
                self.machine.kill_now();
                self.dead = true;
                let sig = irq.map(|i| i.load(Ordering::SeqCst)).unwrap_or(0);
                Ok(if sig != 0 {
                    ExitStatus::Interrupted(sig)
                } else {
                    ExitStatus::TimedOut
                })
            }
            Err(AgentError::Silent { secs }) => {
                self.machine.kill_now();
                self.dead = true;
                Err(SessionError::Silent {
                    secs,
                    console: self.machine.console_log().to_path_buf(),
                })
            }
            Err(e) => {
                self.machine.kill_now();
                self.dead = true;
                Err(self.agent_error(e))
            }
        }
    }

    /// The container's peak memory during the last exec, as the guest
    /// told it (an untrusted figure, bounded by the protocol).
    pub fn last_peak_memory(&self) -> Option<u64> {
        self.agent.last_peak_memory()
    }

    /// Ends the VM cleanly: the agent's `Shutdown`, up to `grace` for the
    /// guest to power off, then QEMU is stopped and the file servers. A VM
    /// that broke, or a `cancelled()` (before or while it waits), is killed
    /// instead.
    pub fn finish(mut self, grace: Duration, cancelled: &dyn Fn() -> bool) {
        let net = self.net.take();
        if self.dead || cancelled() {
            self.machine.kill();
        } else {
            self.machine
                .shutdown_unless(Some(&mut self.agent), grace, cancelled);
        }
        if let Some(n) = net {
            n.finish(NET_GRACE);
        }
    }

    /// Ends the VM at once.
    pub fn kill(mut self) {
        let net = self.net.take();
        self.machine.kill();
        if let Some(n) = net {
            n.finish(NET_GRACE);
        }
    }

    /// Hands the VM and the raw agent connection over (`hull vm up` relays
    /// its clients' frames itself).
    /// The network channel goes with them: the kept VM's proxy.
    pub fn into_raw(self) -> Result<(Machine, RawSession, Option<NetChannel>), SessionError> {
        let VmSession {
            machine,
            agent,
            net,
            ..
        } = self;
        agent
            .into_raw()
            .map(|raw| (machine, raw, net))
            .map_err(SessionError::RawSocket)
    }
}
