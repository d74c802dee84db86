//! `hull read`: bounded, symlink-safe reads of UTF-8 text from the project or
//! this instance's spill (see [`crate::runtime::read`]).
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::runtime::{self, InstanceId, ReadRequest, ReadScope};

#[derive(Debug, Args)]
pub struct ReadArgs {
    /// A path in the project (relative to it, or absolute) or in this
    /// instance's spill (absolute, as printed by `--spill`).
    #[arg(required_unless_present = "cursor")]
    pub path: Option<PathBuf>,
    /// First line to read, counting from 1.
    #[arg(long)]
    pub start_line: Option<u64>,
    /// Most lines to read (default: to the end of the file).
    #[arg(long)]
    pub max_lines: Option<u64>,
    /// Resume from the cursor a previous answer gave.
    #[arg(long, conflicts_with_all = ["path", "start_line", "max_lines"])]
    pub cursor: Option<String>,
    /// The instance whose spill may be read, and that cursors belong to.
    #[arg(long, env = runtime::INSTANCE_ENV)]
    pub instance: Option<String>,
    /// The project directory (default: the current directory).
    #[arg(long)]
    pub project: Option<PathBuf>,
    /// Print {text, notice, next_cursor, start_line, end_line, truncated} as JSON.
    /// `text` is the file's text only; the plain output adds the notice.
    #[arg(long)]
    pub json: bool,
}

pub fn read(a: ReadArgs) -> anyhow::Result<i32> {
    let instance = match a.instance.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(s) => Some(s.parse::<InstanceId>()?),
    };
    let project = match a.project {
        Some(p) => p,
        None => super::default_project().context("finding the current directory")?,
    };
    let runs = runtime::runs_root();
    let scope = ReadScope::new(&project, &runs, instance)?;
    let req = match a.cursor {
        Some(c) => ReadRequest::Cursor(c),
        None => ReadRequest::Range {
            path: a.path.context("a PATH or --cursor is required")?,
            start_line: a.start_line,
            max_lines: a.max_lines,
        },
    };
    let answer = scope.read(&req).context("hull read")?;
    let mut out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer(&mut out, &answer)?;
        out.write_all(b"\n")?;
    } else if std::io::IsTerminal::is_terminal(&out) {
        // What the command wrote, on the user's terminal: no escape
        // sequence of its reaches the terminal (piped, the text is exact).
        out.write_all(crate::text::printable(&answer.render()).as_bytes())?;
    } else {
        out.write_all(answer.render().as_bytes())?;
    }
    out.flush()?;
    Ok(0)
}
