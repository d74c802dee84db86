//! Evaluation batches (`hull batch`): the jobs file (JSON lines, or one
//! shell line per job), the results log each job's line is appended and
//! synced to when it ends (what `--resume` reads back), shards and their
//! merge. Running them is Linux only for now, as change sets are.

pub mod jobs;
#[cfg(target_os = "linux")]
pub mod results;
#[cfg(target_os = "linux")]
pub mod runner;

pub use jobs::{Job, OnBadLine, Shard, Workspace};
#[cfg(target_os = "linux")]
pub use results::{Receipt, ResultLine, ResultsLog, Status};
