//! How an image build shows its progress on stderr: a bar of the recipe's
//! steps on a terminal, one line per step otherwise (logs, CI). Used by
//! `hull image build` and by the runs that build a policy's userland on
//! first use.
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::build::BuildEvent;

/// Shows [`BuildEvent`]s as they come; the bar is cleared when dropped.
#[derive(Debug)]
pub struct BuildProgress {
    bar: ProgressBar,
    tty: bool,
    step_started: Instant,
    /// Says what is built and why, before the build's own lines.
    prefix: String,
}

impl BuildProgress {
    /// `prefix` starts every line (for example `tier vm: `).
    pub fn new(prefix: &str) -> BuildProgress {
        let bar = ProgressBar::with_draw_target(Some(1), ProgressDrawTarget::stderr());
        let tty = !bar.is_hidden();
        if let Ok(style) =
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:24} {pos}/{len} {msg}")
        {
            bar.set_style(style);
        }
        BuildProgress {
            bar,
            tty,
            step_started: Instant::now(),
            prefix: prefix.to_string(),
        }
    }

    /// Shows one event.
    pub fn on(&mut self, ev: BuildEvent) {
        let p = &self.prefix;
        match ev {
            BuildEvent::Cached { id } => eprintln!("{p}image {id} is cached"),
            BuildEvent::Waiting { id, lock } => eprintln!(
                "{p}image {id}: waiting for another build (or a VM using it) to release {}",
                lock.display()
            ),
            BuildEvent::Started { id, dir, log } => {
                eprintln!(
                    "{p}building image {id} in {}\n  log: {}",
                    dir.display(),
                    log.display()
                );
                self.bar.enable_steady_tick(Duration::from_millis(200));
            }
            BuildEvent::Step { n, of, name } => {
                if !self.tty && n > 1 {
                    eprintln!("  ({:.0} s)", self.step_started.elapsed().as_secs_f64());
                }
                self.step_started = Instant::now();
                self.bar.set_length(u64::from(of));
                self.bar.set_position(u64::from(n - 1));
                self.bar.set_message(name.clone());
                if !self.tty {
                    eprintln!("{p}step {n}/{of}: {name}");
                }
            }
            BuildEvent::Done { id, seconds } => {
                self.bar.finish_and_clear();
                eprintln!("{p}built image {id} in {seconds:.0} s");
            }
            BuildEvent::Evicted { id, bytes } => eprintln!(
                "{p}removed image {id} ({} MiB) to keep the image cache under its cap \
                 (HULL_IMAGE_CACHE_MAX)",
                bytes >> 20
            ),
        }
    }
}

impl Drop for BuildProgress {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
