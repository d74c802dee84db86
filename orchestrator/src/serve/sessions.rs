//! The sessions of `hull serve`. A session on landlock or bwrap is one
//! sandbox for its whole life: one `hull run` whose command is hull's
//! agent ([`super::leader`]), every exec a command the agent starts inside
//! it; for a copy-on-write session that run is a `--cow` one, its change
//! set the session's. A session on tier 3 keeps one VM up for it (`hull vm
//! up`, restored once, every exec a run in it), but a copy-on-write one
//! runs each exec as a `hull run --cow` of its own, going on in the
//! session's change set. A `copy` session works on hull's own copy of the
//! project ([`super::workspace`]). Either way an exec has the whole
//! boundary of a run. A session belongs to the uid that made it (the
//! socket peer's credentials); any other caller is told it does not exist.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::Mutex;

use super::api::{self, CreateSession, ExecRequest, ExecResult, SessionInfo, Workspace};
use super::leader::{self, Leader};
use crate::batch::Status;

/// A request the API refuses: its status and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub status: u16,
    pub message: String,
}

impl Refusal {
    pub fn new(status: u16, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
        }
    }
}

/// The caller's template `name`, held, for a session of `req` on `tier`
/// under the policy `pf`: refused unless it was made on that tier, under
/// that policy (its name and its text then) and image, and unless the
/// session names no project of its own and is not a copy session.
fn from_template(
    caller: u32,
    name: &str,
    tier: crate::tier::Tier,
    req: &CreateSession,
    pf: &crate::policy::PolicyFile,
) -> Result<crate::templates::InUse, Refusal> {
    use crate::templates::{Store, TemplateError};
    if tier == crate::tier::Tier::Vm {
        return Err(Refusal::new(
            422,
            "from: tier vm sessions do not start from templates yet; landlock and bwrap \
             sessions do",
        ));
    }
    if req.project.is_some() {
        return Err(Refusal::new(
            400,
            format!("project: a session from template {name} works on the template's workspace"),
        ));
    }
    if req.workspace == Workspace::Copy {
        return Err(Refusal::new(
            400,
            format!(
                "workspace: a session from template {name} is copy-on-write over it, not a copy"
            ),
        ));
    }
    let t = Store::open()
        .and_then(|s| s.take(name, caller))
        .map_err(|e| match e {
            TemplateError::NotFound(_) => Refusal::new(404, e.to_string()),
            TemplateError::Name(_) => Refusal::new(400, e.to_string()),
            e => Refusal::new(500, hull_protocol::error_chain(&e)),
        })?;
    let m = &t.meta;
    let refuse = |what: String| {
        Refusal::new(
            409,
            format!("from: template {name} was made {what}: start it as it was made"),
        )
    };
    if m.tier != tier.name() {
        return Err(refuse(format!("on tier {}, not {}", m.tier, tier.name())));
    }
    if m.policy != req.policy {
        return Err(refuse(format!(
            "under policy {}, not {}",
            m.policy, req.policy
        )));
    }
    if m.policy_sha256 != crate::templates::policy_digest(pf) {
        return Err(refuse(format!(
            "under policy {} as its text was then; it has changed since",
            m.policy
        )));
    }
    if m.image != req.image {
        return Err(refuse(format!(
            "on image {}, not {}",
            m.image.as_deref().unwrap_or("(none)"),
            req.image.as_deref().unwrap_or("(none)")
        )));
    }
    Ok(t)
}

/// One session.
#[derive(Debug)]
pub struct Session {
    pub info: SessionInfo,
    /// The policy its runs get: the one it names, or a copy session's own
    /// (git metadata writable).
    run_policy: String,
    /// Whether its policy keeps `.git` read-only (`fs.git`).
    git_protected: bool,
    owner: u32,
    /// Tier 3 with a shared workspace: the session's kept VM.
    vm: Option<SessionVm>,
    /// Landlock or bwrap with a shared workspace: the session's one
    /// sandbox, which runs every exec.
    leader: Option<Leader>,
    /// A copy session's own workspace, removed when the session ends.
    own: Option<super::workspace::OwnWorkspace>,
    /// A session of a container image: its own policy file, removed when
    /// the session ends.
    own_policy: Option<super::workspace::OwnPolicy>,
    /// A copy-on-write session: its change set, once its first exec made
    /// it. Held for each exec: one run at a time uses the set's overlay.
    changes: Mutex<Option<String>>,
    /// The `hull run` of each exec in progress.
    execs: Execs,
    /// A session from a template: the template, held (no removal takes it
    /// meanwhile).
    _template: Option<crate::templates::InUse>,
}

/// A session's kept VM: its name, and its turn, held for the session's
/// life and handed to each exec: the session's execs run side by side, no
/// other run in its VM.
#[derive(Debug)]
struct SessionVm {
    name: String,
    turn: std::fs::File,
}

/// The `hull run` processes of a session's execs in progress, so a close
/// ends them and waits until they (and their trees) are gone.
#[derive(Debug, Default)]
struct Execs {
    /// Pids of the `hull run`s, and whether the session is closing (no
    /// exec starts then).
    state: std::sync::Mutex<(std::collections::HashSet<u32>, bool)>,
    /// Told whenever an exec ends.
    ended: tokio::sync::Notify,
}

/// How long a closing session gives its execs' `hull run`s to end their
/// trees after SIGTERM before SIGKILL (the tree's cgroup then goes with
/// hull's watchdog).
const EXEC_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

impl Execs {
    fn lock(&self) -> std::sync::MutexGuard<'_, (std::collections::HashSet<u32>, bool)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `pid`'s exec; false when the session is closing.
    fn start(&self, pid: u32) -> bool {
        let mut st = self.lock();
        if st.1 {
            return false;
        }
        st.0.insert(pid);
        true
    }

    fn end(&self, pid: u32) {
        self.lock().0.remove(&pid);
        self.ended.notify_waiters();
    }

    /// Stops new execs, ends every exec in progress (SIGTERM: `hull run`
    /// ends its command's tree and exits; SIGKILL after [`EXEC_GRACE`]),
    /// and returns once each has ended.
    async fn close(&self) {
        let pids: Vec<u32> = {
            let mut st = self.lock();
            st.1 = true;
            st.0.iter().copied().collect()
        };
        signal_all(&pids, libc::SIGTERM);
        let term = tokio::time::Instant::now() + EXEC_GRACE;
        let mut killed = false;
        loop {
            let ended = self.ended.notified();
            let left: Vec<u32> = self.lock().0.iter().copied().collect();
            if left.is_empty() {
                return;
            }
            let deadline = if killed { term + EXEC_GRACE } else { term };
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                if killed {
                    tracing::warn!(?left, "hull serve: execs still running after SIGKILL");
                    return;
                }
                signal_all(&left, libc::SIGKILL);
                killed = true;
            }
        }
    }
}

/// Signals each `hull run` of `pids` (children of this server not yet
/// reaped: an exec removes its pid before its child is waited for).
fn signal_all(pids: &[u32], sig: i32) {
    for pid in pids {
        // SAFETY: kill(2) with integer arguments, on a child of ours that
        // is still registered, so not yet reaped.
        unsafe { libc::kill(*pid as i32, sig) };
    }
}

/// Ends one exec's registration when the exec is over or abandoned (its
/// client went away: the future is dropped): its `hull run` is told to
/// end the command's tree (SIGTERM) first. Dropped before the child.
struct ExecGuard<'a> {
    execs: &'a Execs,
    pid: u32,
    done: bool,
}

impl Drop for ExecGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            signal_all(&[self.pid], libc::SIGTERM);
        }
        self.execs.end(self.pid);
    }
}

/// Every session of the server, and what runs them.
#[derive(Debug)]
pub struct Sessions {
    hull: PathBuf,
    /// Result documents of the runs (0700, the server's).
    work: PathBuf,
    map: Mutex<HashMap<String, Arc<Session>>>,
}

impl Sessions {
    pub fn new(hull: PathBuf, work: PathBuf) -> Sessions {
        Sessions {
            hull,
            work,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// The caller's sessions.
    pub async fn list(&self, caller: u32) -> Vec<SessionInfo> {
        let map = self.map.lock().await;
        let mut v: Vec<SessionInfo> = map
            .values()
            .filter(|s| s.owner == caller)
            .map(|s| s.info.clone())
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// The caller's session `id`; another caller's is not found.
    pub async fn get(&self, caller: u32, id: &str) -> Result<Arc<Session>, Refusal> {
        let map = self.map.lock().await;
        match map.get(id) {
            Some(s) if s.owner == caller => Ok(Arc::clone(s)),
            _ => Err(Refusal::new(404, format!("no session {id}"))),
        }
    }

    /// Makes a session: checks the tier, policy and project; on tier 3
    /// starts its VM.
    pub async fn create(&self, caller: u32, req: CreateSession) -> Result<SessionInfo, Refusal> {
        let tier = crate::tier::Tier::from_arg(&req.tier).ok_or_else(|| {
            Refusal::new(
                400,
                format!(
                    "tier {:?}: no such tier (auto, landlock, bwrap, vm)",
                    req.tier
                ),
            )
        })?;
        if !matches!(
            tier,
            crate::tier::Tier::Landlock | crate::tier::Tier::Bwrap | crate::tier::Tier::Vm
        ) {
            return Err(Refusal::new(
                400,
                format!("tier {tier}: sessions run on landlock, bwrap and vm"),
            ));
        }
        let probe = crate::tier::ready(tier);
        if !probe.available {
            return Err(Refusal::new(
                422,
                format!("tier {tier} is not available here: {}", probe.reason),
            ));
        }
        let mut pf = crate::policy::profiles::load(&req.policy)
            .map_err(|e| Refusal::new(400, format!("policy {}: {e}", req.policy)))?;
        let from = match &req.from {
            None => None,
            Some(name) => Some(from_template(caller, name, tier, &req, &pf)?),
        };
        // A session from a template is copy-on-write over its workspace.
        let workspace = match from {
            Some(_) => Workspace::Cow,
            None => req.workspace,
        };
        // A container image is the session's userland: its policy is the
        // one named with `[vm] image` set (checked as any policy is).
        let image_text = match &req.image {
            None => None,
            Some(_) if tier == crate::tier::Tier::Landlock => {
                return Err(Refusal::new(
                    400,
                    format!(
                        "image: tier {tier} runs the host's programs and cannot change the root; \
                         a container image is the userland of tier vm or the root of a bwrap \
                         sandbox"
                    ),
                ))
            }
            // bwrap: the leader's run takes the image (`--image`); the
            // policy is the one named.
            Some(r) if tier != crate::tier::Tier::Vm => {
                r.parse::<hull_oci::Reference>()
                    .map_err(|e| Refusal::new(400, format!("image: {e}")))?;
                None
            }
            Some(r) => {
                r.parse::<hull_oci::Reference>()
                    .map_err(|e| Refusal::new(400, format!("image: {e}")))?;
                let bad = |e: crate::policy::PolicyError| {
                    Refusal::new(400, format!("policy {} with image {r}: {e}", req.policy))
                };
                let text = pf.with_image_text(r).map_err(bad)?;
                pf = crate::policy::PolicyFile::parse(&pf.source.name, &text).map_err(bad)?;
                Some(text)
            }
        };
        let named = match (&req.project, workspace) {
            _ if from.is_some() => from.as_ref().map(|t| t.workspace.clone()),
            (Some(p), _) => Some(checked_project(p)?),
            (None, Workspace::Copy) => None,
            (None, w) => {
                return Err(Refusal::new(
                    400,
                    format!(
                        "project: a {} session needs one (only a copy session starts empty)",
                        json_of(&w).as_str().unwrap_or("")
                    ),
                ))
            }
        };
        if self.list(caller).await.len() >= api::MAX_SESSIONS {
            return Err(Refusal::new(
                429,
                format!("at most {} sessions at once", api::MAX_SESSIONS),
            ));
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        // A copy session's own workspace and policy; the session is then a
        // shared one on them.
        let own = match workspace {
            Workspace::Copy => Some(
                super::workspace::OwnWorkspace::make(&self.work, &id, named.as_deref(), &pf)
                    .await?,
            ),
            _ => None,
        };
        // Not a copy session's (its own policy is written from `pf`, image
        // and all): an image session's own policy file.
        let own_policy = match (&own, &image_text) {
            (None, Some(text)) => match super::workspace::OwnPolicy::make(&self.work, &id, text) {
                Ok(p) => Some(p),
                Err(e) => return Err(e),
            },
            _ => None,
        };
        let (project, policy, source) = match (&own, &own_policy) {
            (Some(o), _) => (
                o.work.clone(),
                o.policy.to_string_lossy().into_owned(),
                named,
            ),
            (None, Some(p)) => (
                named.unwrap_or_default(),
                p.policy.to_string_lossy().into_owned(),
                None,
            ),
            (None, None) => (named.unwrap_or_default(), req.policy.clone(), None),
        };
        let git = match &own {
            Some(o) => Ok(o.git),
            None => pf.git_metadata(),
        };
        let git_protected = git.map_or(true, |g| g == crate::policy::GitMetadata::ReadOnly);
        let made = self
            .start(
                &id,
                tier,
                workspace,
                &project,
                &policy,
                req.image.as_deref(),
            )
            .await;
        let (vm, leader, changes) = match made {
            Ok(m) => m,
            Err(e) => {
                if let Some(o) = &own {
                    o.remove();
                }
                if let Some(p) = &own_policy {
                    p.remove();
                }
                return Err(e);
            }
        };
        let info = SessionInfo {
            id: id.clone(),
            tier: tier.name().into(),
            policy: req.policy,
            roots: vec![project.clone()],
            project,
            workspace,
            source,
            image: req.image,
        };
        let session = Arc::new(Session {
            info: info.clone(),
            git_protected,
            run_policy: policy,
            owner: caller,
            vm,
            leader,
            own,
            own_policy,
            changes: Mutex::new(changes),
            execs: Execs::default(),
            _template: from,
        });
        self.map.lock().await.insert(id, session);
        Ok(info)
    }

    /// Makes the template `name` of the caller's session `s`: a copy of its
    /// workspace ([`crate::templates`]), made while its commands may run.
    pub async fn template(
        &self,
        caller: u32,
        s: &Session,
        name: &str,
    ) -> Result<crate::templates::Meta, Refusal> {
        use crate::templates::{check_name, Meta, Store, TemplateError};
        check_name(name).map_err(|e| Refusal::new(400, e.to_string()))?;
        if s.info.tier == crate::tier::Tier::Vm.name() {
            return Err(Refusal::new(
                422,
                "tier vm: a template of a tier-3 session (its memory, disk and workspace) is \
                 not made yet; a landlock or bwrap session's workspace is",
            ));
        }
        if s.info.workspace == Workspace::Cow {
            return Err(Refusal::new(
                422,
                "a copy-on-write session's workspace (the project under its changes) is not \
                 made into a template yet; a shared or copy session's is",
            ));
        }
        let pf = crate::policy::profiles::load(&s.info.policy)
            .map_err(|e| Refusal::new(409, format!("policy {}: {e}", s.info.policy)))?;
        let meta = Meta {
            name: name.to_string(),
            owner: caller,
            tier: s.info.tier.clone(),
            policy: s.info.policy.clone(),
            policy_sha256: crate::templates::policy_digest(&pf),
            image: s.info.image.clone(),
            made_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            from_session: s.info.id.clone(),
            entries: 0,
            bytes: 0,
            left_out: 0,
        };
        let src = s.info.project.clone();
        // The caller's project: only what the caller could read there. A
        // copy session's workspace is the server's own copy, all of it
        // the session's.
        let reader = match s.info.workspace {
            Workspace::Copy => None,
            _ => Some(caller),
        };
        let made = tokio::task::spawn_blocking(move || Store::open()?.make(meta, &src, reader))
            .await
            .map_err(|e| Refusal::new(500, format!("template {name}: {e}")))?;
        made.map_err(|e| match e {
            TemplateError::Exists(_) => Refusal::new(409, e.to_string()),
            TemplateError::Name(_) => Refusal::new(400, e.to_string()),
            e => Refusal::new(500, hull_protocol::error_chain(&e)),
        })
    }

    /// What a session with its workspace on `project` keeps for its life:
    /// on tier 3 its VM, on landlock and bwrap its one sandbox, with a
    /// copy-on-write session's change set (on tier 3 a copy-on-write
    /// session has neither: each exec is a run of its own).
    async fn start(
        &self,
        id: &str,
        tier: crate::tier::Tier,
        workspace: Workspace,
        project: &Path,
        policy: &str,
        image: Option<&str>,
    ) -> Result<(Option<SessionVm>, Option<Leader>, Option<String>), Refusal> {
        let cow = workspace == Workspace::Cow;
        if tier == crate::tier::Tier::Vm {
            if cow {
                // A copy-on-write session on tier 3 restores a VM for each
                // exec (a kept VM shares the project itself).
                return Ok((None, None, None));
            }
            let name = format!("session-{}", &id[..12]);
            return Ok((Some(self.vm_up(name, project, policy).await?), None, None));
        }
        let (l, changes) = Leader::start(&self.hull, tier.name(), policy, project, cow, image)
            .await
            .map_err(|e| Refusal::new(500, format!("tier {tier}: {e}")))?;
        Ok((None, Some(l), changes))
    }

    /// Closes the caller's session `id`: its execs in progress end with
    /// their trees, then its VM is stopped; returns once all is gone.
    pub async fn close(&self, caller: u32, id: &str) -> Result<(), Refusal> {
        let s = self.get(caller, id).await?;
        self.map.lock().await.remove(id);
        s.execs.close().await;
        self.stop(&s).await;
        Ok(())
    }

    /// Closes every session (the server is stopping).
    pub async fn close_all(&self) {
        let all: Vec<Arc<Session>> = self.map.lock().await.drain().map(|(_, s)| s).collect();
        for s in all {
            s.execs.close().await;
            self.stop(&s).await;
        }
    }

    async fn stop(&self, s: &Session) {
        if let Some(l) = &s.leader {
            l.close().await;
        }
        if let Some(vm) = &s.vm {
            self.vm_down(&vm.name).await;
        }
        // Nothing of the session runs now.
        if let Some(own) = &s.own {
            own.remove();
        }
        if let Some(p) = &s.own_policy {
            p.remove();
        }
    }

    async fn vm_down(&self, name: &str) {
        let out = tokio::process::Command::new(&self.hull)
            .args(["vm", "down", "--name", name])
            .stdin(Stdio::null())
            .output()
            .await;
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => tracing::warn!(
                "hull serve: stopping the VM {name}: {}",
                String::from_utf8_lossy(&o.stderr).trim_end()
            ),
            Err(e) => tracing::warn!("hull serve: stopping the VM {name}: {e}"),
        }
    }

    /// Brings the session's VM `name` up and takes its turn.
    async fn vm_up(
        &self,
        name: String,
        project: &Path,
        policy: &str,
    ) -> Result<SessionVm, Refusal> {
        let o = tokio::process::Command::new(&self.hull)
            .args([
                "vm", "up", "--name", &name, "--policy", policy, "--idle", "1h",
            ])
            .arg("--project")
            .arg(project)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| Refusal::new(500, format!("cannot start hull vm up: {e}")))?;
        if !o.status.success() {
            return Err(Refusal::new(
                500,
                format!(
                    "tier vm: the session's VM did not come up: {}",
                    String::from_utf8_lossy(&o.stderr).trim_end()
                ),
            ));
        }
        match crate::vm::supervisor::hold_turn(&name) {
            Ok(turn) => Ok(SessionVm { name, turn }),
            Err(e) => {
                self.vm_down(&name).await;
                Err(Refusal::new(500, e.to_string()))
            }
        }
    }

    /// The `hull run` that runs `argv` (in `cwd`, inside the project) for
    /// session `s`, its result document at `result`.
    fn command(
        &self,
        s: &Session,
        req: &ExecRequest,
        result: &Path,
        continued: Option<&str>,
    ) -> Result<(tokio::process::Command, Option<std::os::fd::OwnedFd>), Refusal> {
        let mut c = tokio::process::Command::new(&self.hull);
        let mut env_fd = None;
        c.args(["run", "--tier", &s.info.tier, "--policy", &s.run_policy])
            .arg("--project")
            .arg(&s.info.project)
            .arg("--json-result")
            .arg(result);
        if let Some(vm) = &s.vm {
            let raw = std::os::fd::AsRawFd::as_raw_fd(&vm.turn);
            c.args(["--vm", &vm.name])
                .arg("--vm-turn-fd")
                .arg(raw.to_string());
            // SAFETY: fcntl only, async-signal-safe, on a descriptor number
            // the session holds open while the child starts.
            unsafe {
                c.pre_exec(move || crate::exec::env_fd::keep_in_child(raw));
            }
        }
        if s.info.workspace == Workspace::Cow {
            c.arg("--cow");
            if let Some(id) = continued {
                c.args(["--cow-continue", id]);
            }
        }
        if let Some(t) = &req.timeout {
            crate::policy::resolve::parse_duration(t)
                .map_err(|e| Refusal::new(400, format!("timeout {t:?}: {e}")))?;
            c.args(["--timeout", t]);
        }
        if let Some(user) = &req.user {
            c.args(["--user", user]);
        }
        check_env(req)?;
        if !req.env.is_empty() {
            // Through a descriptor, never on the command line (any local
            // user reads that); closed here once the child has it.
            let env: Vec<(String, String)> = req
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let fd = crate::exec::env_fd::memfd(&env)
                .map_err(|e| Refusal::new(500, format!("cannot pass the environment: {e}")))?;
            let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
            c.arg("--env-fd").arg(raw.to_string());
            // SAFETY: fcntl only, async-signal-safe, on a descriptor number.
            unsafe {
                c.pre_exec(move || crate::exec::env_fd::keep_in_child(raw));
            }
            env_fd = Some(fd);
        }
        c.arg("--");
        if let Some(dir) = &req.cwd {
            if dir.is_empty() || dir.contains('\0') {
                return Err(Refusal::new(400, "cwd: empty or holds a NUL byte"));
            }
            // Where the command starts, inside the sandbox: it decides.
            c.args(["sh", "-c", "cd -- \"$1\" && shift && exec \"$@\"", "sh"])
                .arg(s.info.project.join(dir));
        }
        c.args(&req.argv);
        // Not killed on drop: an abandoned exec's `hull run` gets SIGTERM
        // (`ExecGuard`) and ends the command's tree itself.
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok((c, env_fd))
    }

    /// Runs `req` in session `s`; `on_chunk` gets the output as it comes
    /// (stream 1 or 2), at most `max_output` bytes of each stream, which
    /// the result also holds when `keep`.
    pub async fn exec(
        &self,
        s: &Session,
        req: &ExecRequest,
        stdin: Option<Vec<u8>>,
        keep: bool,
        on_chunk: &(dyn Fn(u8, &[u8]) + Sync),
    ) -> Result<ExecResult, Refusal> {
        if !s.git_protected {
            return self.exec_once(s, req, stdin, keep, on_chunk).await;
        }
        // What the command said on stderr (its start), to tell a refused
        // write to the protected `.git` from any other failure.
        let said = std::sync::Mutex::new(Vec::new());
        let each = |stream: u8, b: &[u8]| {
            if stream == 2 {
                let mut said = said.lock().unwrap_or_else(|e| e.into_inner());
                let room = GIT_SCAN.saturating_sub(said.len()).min(b.len());
                said.extend_from_slice(&b[..room]);
            }
            on_chunk(stream, b)
        };
        let mut r = self.exec_once(s, req, stdin, keep, &each).await?;
        let said = said.into_inner().unwrap_or_else(|e| e.into_inner());
        if r.status == Status::Exit && r.exit_code != Some(0) && git_refused(&said) {
            r.hint = Some(format!(
                "{}/.git is read-only in this session: git metadata is protected (git runs hooks \
                 and config from it when someone uses git there on the host). The policy key \
                 fs.git = \"writable\" makes it writable, for a copy nobody uses git in on the \
                 host; a session with workspace \"copy\" works on such a copy",
                s.info.project.display()
            ));
        }
        Ok(r)
    }

    async fn exec_once(
        &self,
        s: &Session,
        req: &ExecRequest,
        stdin: Option<Vec<u8>>,
        keep: bool,
        on_chunk: &(dyn Fn(u8, &[u8]) + Sync),
    ) -> Result<ExecResult, Refusal> {
        if req.argv.is_empty() || req.argv.len() > api::MAX_ARGS {
            return Err(Refusal::new(
                400,
                format!("argv: give 1 to {} arguments", api::MAX_ARGS),
            ));
        }
        if req.argv.iter().any(|a| a.contains('\0')) {
            return Err(Refusal::new(400, "argv: an argument holds a NUL byte"));
        }
        let max = req.max_output.unwrap_or(api::DEFAULT_OUTPUT);
        if max > api::MAX_OUTPUT {
            return Err(Refusal::new(
                400,
                format!("max_output: at most {} bytes", api::MAX_OUTPUT),
            ));
        }
        if let Some(user) = &req.user {
            if s.vm.is_none() {
                return Err(Refusal::new(
                    400,
                    format!(
                        "user {user:?}: tier {} runs every command as the session's own user; \
                         tier vm runs it as any user of its container",
                        s.info.tier
                    ),
                ));
            }
            hull_protocol::check_user_name(user).map_err(|why| Refusal::new(400, why))?;
        }
        if let Some(l) = &s.leader {
            return exec_in(l, s, req, stdin, max, keep, on_chunk).await;
        }
        let result = self
            .work
            .join(format!("{}.json", uuid::Uuid::new_v4().simple()));
        let mut cow = match s.info.workspace {
            Workspace::Cow => Some(s.changes.lock().await),
            Workspace::Shared | Workspace::Copy => None,
        };
        let continued = cow.as_ref().and_then(|g| (**g).clone());
        let (mut cmd, env_fd) = self.command(s, req, &result, continued.as_deref())?;
        let t0 = std::time::Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| Refusal::new(500, format!("cannot start hull run: {e}")))?;
        drop(env_fd); // the child has its own
        let Some(pid) = child.id() else {
            return Err(Refusal::new(500, "hull run ended at once"));
        };
        let mut guard = ExecGuard {
            execs: &s.execs,
            pid,
            done: false,
        };
        if !s.execs.start(pid) {
            return Err(Refusal::new(
                404,
                "the session is closing: no new exec starts",
            ));
        }
        let mut input = child.stdin.take();
        let writer = async move {
            if let (Some(mut w), Some(bytes)) = (input.take(), stdin) {
                // A command that does not read its stdin closes the pipe.
                let _ = w.write_all(&bytes).await;
            }
        };
        let out = child.stdout.take();
        let err = child.stderr.take();
        let ((), o, e, status) = tokio::join!(
            writer,
            collect(out, max, keep, |b| on_chunk(1, b)),
            collect(err, max, keep, |b| on_chunk(2, b)),
            child.wait()
        );
        guard.done = true;
        drop(guard);
        let wall_s = t0.elapsed().as_secs_f64();
        let ended = crate::result_file::Ended::read(&result);
        let _ = std::fs::remove_file(&result);
        if let (Some(set), Some(id)) =
            (cow.as_mut(), ended.as_ref().and_then(|e| e.changes.clone()))
        {
            **set = Some(id);
        }
        drop(cow);
        let mut r = output_of(o, e, max, keep, wall_s);
        match ended.as_ref().map(crate::batch::results::Ending::from) {
            Some(e) => {
                r.status = e.status;
                r.exit_code = e.exit_code;
                r.signal = e.signal;
                r.error = e.error;
                if let (Status::Interrupted, Some(signal)) = (e.status, e.signal) {
                    // hull run's own interruption: the exec's result is unknown.
                    r.status = Status::HullError;
                    r.signal = None;
                    r.error = Some(format!("hull run was interrupted (signal {signal})"));
                }
            }
            None => {
                r.status = Status::HullError;
                r.error = Some(format!(
                    "hull run left no result ({})",
                    status.map_or_else(|e| e.to_string(), |s| s.to_string())
                ));
            }
        }
        Ok(r)
    }

    /// The file `path` (inside the project) as the session's sandbox reads
    /// it, at most `max` bytes: 404 when it cannot be read there, 413 when
    /// it is larger.
    pub async fn read_file(&self, s: &Session, path: &str, max: u64) -> Result<Vec<u8>, Refusal> {
        let file = in_sandbox(&s.info.project, path)?;
        let req = exec_of(vec!["cat".into(), "--".into(), file.clone()], Some(max));
        let mut data = Vec::new();
        let mut why = Vec::new();
        let r = {
            let data = std::sync::Mutex::new((&mut data, &mut why));
            self.exec(s, &req, None, false, &|stream, b| {
                let mut d = data.lock().unwrap_or_else(|e| e.into_inner());
                if stream == 1 {
                    d.0.extend_from_slice(b);
                } else if d.1.len() < 4096 {
                    d.1.extend_from_slice(&b[..b.len().min(4096)]);
                }
            })
            .await?
        };
        if r.status == Status::HullError {
            return Err(Refusal::new(
                500,
                r.error.unwrap_or_else(|| "the run failed".into()),
            ));
        }
        if r.exit_code != Some(0) {
            let why = String::from_utf8_lossy(&why);
            let status = if why.contains("Permission denied") {
                403
            } else {
                404
            };
            return Err(Refusal::new(
                status,
                format!("{file}: the session cannot read it: {}", why.trim_end()),
            ));
        }
        if r.stdout_bytes > max {
            return Err(Refusal::new(
                413,
                format!("{file}: {} bytes, more than {max}", r.stdout_bytes),
            ));
        }
        Ok(data)
    }

    /// Writes `bytes` to `path` (inside the project; its directories made)
    /// as the session's sandbox would: 403 when the sandbox refuses it.
    pub async fn write_file(&self, s: &Session, path: &str, bytes: Vec<u8>) -> Result<(), Refusal> {
        let file = in_sandbox(&s.info.project, path)?;
        let req = exec_of(
            vec![
                "sh".into(),
                "-c".into(),
                "mkdir -p -- \"$(dirname -- \"$1\")\" && cat > \"$1\"".into(),
                "sh".into(),
                file.clone(),
            ],
            Some(64 << 10),
        );
        let r = self.exec(s, &req, Some(bytes), true, &|_, _| {}).await?;
        match (r.status, r.exit_code) {
            (Status::Exit, Some(0)) => Ok(()),
            (Status::HullError, _) => Err(Refusal::new(
                500,
                r.error.unwrap_or_else(|| "the run failed".into()),
            )),
            _ => Err(Refusal::new(
                403,
                format!(
                    "{file}: the session may not write it: {}",
                    r.stderr.unwrap_or_default().trim_end()
                ),
            )),
        }
    }
}

/// The exec's environment entries are variables, and not too many.
fn check_env(req: &ExecRequest) -> Result<(), Refusal> {
    if req.env.len() > api::MAX_ENV {
        return Err(Refusal::new(
            400,
            format!("at most {} environment entries", api::MAX_ENV),
        ));
    }
    for (k, v) in &req.env {
        if k.is_empty()
            || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            || v.contains('\0')
        {
            return Err(Refusal::new(400, format!("env {k:?}: not a variable")));
        }
    }
    Ok(())
}

/// Runs `req` in the session's one sandbox, `l`: as [`Sessions::exec`].
async fn exec_in(
    l: &Leader,
    s: &Session,
    req: &ExecRequest,
    stdin: Option<Vec<u8>>,
    max: u64,
    keep: bool,
    on_chunk: &(dyn Fn(u8, &[u8]) + Sync),
) -> Result<ExecResult, Refusal> {
    check_env(req)?;
    let timeout_ms = match &req.timeout {
        Some(t) => Some(
            crate::policy::resolve::parse_duration(t)
                .map_err(|e| Refusal::new(400, format!("timeout {t:?}: {e}")))?
                .as_millis()
                .min(u128::from(hull_protocol::limits::MAX_TIMEOUT_MS)) as u64,
        ),
        None => None,
    };
    let cwd = match &req.cwd {
        Some(dir) if dir.is_empty() || dir.contains('\0') => {
            return Err(Refusal::new(400, "cwd: empty or holds a NUL byte"));
        }
        // Where the command starts, inside the sandbox: it decides.
        Some(dir) => s.info.project.join(dir),
        None => s.info.project.clone(),
    };
    let exec = hull_protocol::Exec {
        argv: req.argv.iter().map(|a| a.as_str().into()).collect(),
        env: req
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        cwd: cwd.as_os_str().into(),
        timeout_ms,
        stdin: false,
        uid: None,
        gid: None,
        scrub: Vec::new(),
        // The leader's agent keeps every exec's leftovers already.
        keep_leftovers: false,
        user: None,
    };
    let mut streams = [Stream::default(), Stream::default()];
    let t0 = std::time::Instant::now();
    let ended = {
        let mut each = |stream: u8, b: &[u8]| {
            streams[usize::from(stream == 2)].take(b, max, keep, |part| on_chunk(stream, part));
        };
        l.exec(exec, stdin, &mut each).await
    };
    let [o, e] = streams;
    let mut r = output_of(o, e, max, keep, t0.elapsed().as_secs_f64());
    let tier = &s.info.tier;
    match ended {
        Ok(leader::Ended::Exit(hull_protocol::ExitStatus::Code(c))) => {
            r.status = Status::Exit;
            r.exit_code = Some(c);
        }
        Ok(leader::Ended::Exit(hull_protocol::ExitStatus::Signal(n))) => {
            r.status = Status::Signal;
            r.signal = Some(n);
        }
        Ok(leader::Ended::Exit(hull_protocol::ExitStatus::TimedOut)) => {
            r.status = Status::Timeout;
        }
        Ok(leader::Ended::Refused { code, message }) => {
            let program = crate::text::printable(&req.argv[0]);
            let exit = match code {
                hull_protocol::ErrorCode::CommandNotFound => {
                    Some((127, "command not found in the sandbox"))
                }
                hull_protocol::ErrorCode::CommandNotExecutable => {
                    Some((126, "cannot be executed in the sandbox"))
                }
                _ => None,
            };
            match exit {
                Some((c, what)) => {
                    r.status = Status::Exit;
                    r.exit_code = Some(c);
                    r.error = Some(format!("{program}: {what} (tier {tier}: {message})"));
                }
                None => r.error = Some(format!("tier {tier}: {program} did not start: {message}")),
            }
        }
        Err(leader::LeaderError::TooLarge(e)) => {
            return Err(Refusal::new(400, format!("the exec cannot be sent: {e}")))
        }
        Err(e) => r.error = Some(format!("tier {tier}: {e}")),
    }
    Ok(r)
}

/// An exec of `argv` with no other setting.
fn exec_of(argv: Vec<String>, max_output: Option<u64>) -> ExecRequest {
    ExecRequest {
        argv,
        cwd: None,
        env: Default::default(),
        stdin: None,
        stdin_base64: None,
        timeout: None,
        max_output,
        stream: false,
        user: None,
    }
}

/// What an exec keeps of one output stream: its first `max` bytes, when
/// kept, and the count of all.
#[derive(Debug, Default)]
struct Stream {
    kept: Vec<u8>,
    total: u64,
}

impl Stream {
    /// Takes `b`: what still fits under `max` goes to `each` (and is kept,
    /// when `keep`); all of it is counted.
    fn take(&mut self, b: &[u8], max: u64, keep: bool, each: impl FnOnce(&[u8])) {
        let room = max.saturating_sub(self.total).min(b.len() as u64) as usize;
        if room > 0 {
            each(&b[..room]);
            if keep {
                self.kept.extend_from_slice(&b[..room]);
            }
        }
        self.total += b.len() as u64;
    }
}

/// An exec's result with its output and time, `hull_error` until its
/// ending is filled in.
fn output_of(o: Stream, e: Stream, max: u64, keep: bool, wall_s: f64) -> ExecResult {
    let text = |s: &Stream| keep.then(|| String::from_utf8_lossy(&s.kept).into_owned());
    ExecResult {
        status: Status::HullError,
        exit_code: None,
        signal: None,
        stdout: text(&o),
        stderr: text(&e),
        stdout_bytes: o.total,
        stderr_bytes: e.total,
        truncated: o.total > max || e.total > max,
        wall_s,
        error: None,
        hint: None,
    }
}

/// Reads `r` to its end into a [`Stream`], each piece to `each` as it
/// comes.
async fn collect<R: AsyncRead + Unpin>(
    r: Option<R>,
    max: u64,
    keep: bool,
    each: impl Fn(&[u8]),
) -> Stream {
    let mut out = Stream::default();
    let Some(mut r) = r else {
        return out;
    };
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => out.take(&buf[..n], max, keep, &each),
        }
    }
    out
}

/// How much of an exec's stderr is looked at for a refused write to git
/// metadata.
const GIT_SCAN: usize = 64 << 10;

/// Whether `stderr` tells of a write under a `.git` the kernel refused:
/// a `.git` path component and a refusal's errno text (git's own words:
/// `Unable to create '/p/.git/index.lock': Read-only file system`).
fn git_refused(stderr: &[u8]) -> bool {
    let text = String::from_utf8_lossy(stderr);
    let refused = [
        "Read-only file system",
        "Permission denied",
        "Operation not permitted",
    ]
    .iter()
    .any(|e| text.contains(e));
    let names_git = text.match_indices(".git").any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + 4..].chars().next();
        matches!(before, None | Some('/' | '\'' | '"' | ' ' | '\n'))
            && matches!(after, None | Some('/' | '\'' | '"' | ':' | ' ' | '\n'))
    });
    refused && names_git
}

/// The project a caller names: absolute, there, a directory.
fn checked_project(p: &Path) -> Result<PathBuf, Refusal> {
    if !p.is_absolute() {
        return Err(Refusal::new(
            400,
            format!("project {}: give an absolute path", p.display()),
        ));
    }
    let project = std::fs::canonicalize(p)
        .map_err(|e| Refusal::new(400, format!("project {}: {e}", p.display())))?;
    if !project.is_dir() {
        return Err(Refusal::new(
            400,
            format!("project {}: not a directory", project.display()),
        ));
    }
    Ok(project)
}

/// `path` as the session's command names it: relative to the project, or
/// absolute. Where it may read or write is the sandbox's to decide (the
/// command that reads or writes runs inside it), not a host-side path
/// rule: a link is followed, or refused, there, never by hull on the host.
pub fn in_sandbox(project: &Path, path: &str) -> Result<String, Refusal> {
    if path.is_empty() || path.contains('\0') || path.len() > 4096 {
        return Err(Refusal::new(
            400,
            "path: empty, too long or holds a NUL byte",
        ));
    }
    project
        .join(path)
        .to_str()
        .map(str::to_string)
        .ok_or_else(|| Refusal::new(400, "path: not UTF-8"))
}

impl Session {
    /// A copy-on-write session's change set, as `hull changes show --json`
    /// lists it; 409 for a shared one.
    pub async fn changes(&self) -> Result<api::SessionChanges, Refusal> {
        if self.info.workspace != Workspace::Cow {
            return Err(Refusal::new(
                409,
                "the session's workspace is not copy-on-write: its commands write into it",
            ));
        }
        let Some(id) = self.changes.lock().await.clone() else {
            return Ok(api::SessionChanges {
                id: None,
                counts: None,
                changes: Vec::new(),
            });
        };
        let store = crate::changes::Store::open(crate::changes::Store::default_root());
        let mut set = store
            .get(&id)
            .map_err(|e| Refusal::new(500, format!("change set {id}: {e}")))?;
        if set.meta.finished.is_none() {
            // The session's one run is still going (landlock, bwrap): its
            // upper layer as it is now. An exec in progress may remove an
            // entry under the scan: read again, a few times.
            let mut tries = 0;
            set.changes = loop {
                match set.changes_now() {
                    Ok(c) => break c,
                    Err(_) if tries < 3 => {
                        tries += 1;
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                    Err(e) => return Err(Refusal::new(500, format!("change set {id}: {e}"))),
                }
            };
            set.meta.counts = crate::changes::Counts::of(&set.changes);
        }
        Ok(api::SessionChanges {
            id: Some(id),
            counts: Some(json_of(&set.meta.counts)),
            changes: set.changes.iter().map(json_of).collect(),
        })
    }
}

fn json_of<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// git's own words when `.git` is read-only, on bwrap (a read-only
    /// mount) and on landlock (EACCES); other failures are not it.
    #[test]
    fn a_refused_write_to_git_metadata_is_told_from_other_failures() {
        for said in [
            "fatal: Unable to create '/tmp/p/.git/index.lock': Read-only file system.\n",
            "error: could not lock config file .git/config: Permission denied\n",
            "/tmp/p/.git: Operation not permitted\n",
        ] {
            assert!(git_refused(said.as_bytes()), "{said}");
        }
        for said in [
            "fatal: not a git repository (or any of the parent directories): .git\n",
            "cat: /etc/shadow: Permission denied\n",
            "cp: cannot create regular file 'x.gitignore': Permission denied\n",
            "",
        ] {
            assert!(!git_refused(said.as_bytes()), "{said}");
        }
    }

    #[test]
    fn paths_are_taken_from_the_project_and_left_to_the_sandbox() {
        let p = Path::new("/home/u/p");
        assert_eq!(in_sandbox(p, "a/b.txt").unwrap(), "/home/u/p/a/b.txt");
        assert_eq!(in_sandbox(p, "/tmp/x").unwrap(), "/tmp/x");
        assert_eq!(in_sandbox(p, "../x").unwrap(), "/home/u/p/../x");
        assert_eq!(in_sandbox(p, "").unwrap_err().status, 400);
        assert_eq!(in_sandbox(p, "a\0b").unwrap_err().status, 400);
    }
}
