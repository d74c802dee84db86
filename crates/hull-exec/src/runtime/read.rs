//! `hull read`: UTF-8 text from the project or this instance's spill, by line
//! range or cursor, at most [`READ_MAX_BYTES`] per answer.
//!
//! Which paths: a relative path is taken in the project; an absolute one
//! must lie in the project or in this instance's `spill/`. `..` is refused
//! outright. Anything in the runs root other than this instance's spill is
//! refused, also when the project contains the runs root (then symlinks in
//! the project are refused too, since one could lead into another run dir).
//! The file is opened beneath its root ([`super::beneath`]): a symlink is
//! followed only while it stays inside the project, never in the spill.
//!
//! What an answer holds: lines `start_line..` of the file, up to `max_lines`
//! lines or the byte limit (which includes the truncation notice). When the
//! range does not fit, the answer ends with a notice and carries a cursor;
//! the cursor resumes at the exact byte, also inside a line, never splitting
//! a UTF-8 character. A cursor is refused when the file changed (device,
//! inode, size or modification time differ) or when it came from another
//! instance. Bytes that are not UTF-8 are an error, never lossy text.

use std::fs::File;
use std::io;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use super::beneath::{BeneathError, Root, Symlinks};
use super::cursor::{Cursor, FileIdent, RootKind};
use super::{InstanceId, SPILL_DIR};

/// Most bytes in one answer's `text`, truncation notice included.
pub const READ_MAX_BYTES: usize = 10_000;
/// Longest path (relative to its root) a read accepts.
const MAX_REL_PATH_BYTES: usize = 1024;

/// Errors of `hull read`. Each names the path and what was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path:?}: `..` is not allowed in a read path")]
    ParentDir { path: PathBuf },
    #[error("{path:?} is outside the project {project:?} and this instance's spill")]
    Outside { path: PathBuf, project: PathBuf },
    #[error("{path:?} is in hull's runs root but not in this instance's spill; other instances' run dirs, tmp and lock are not readable")]
    OtherRunDir { path: PathBuf },
    #[error("{path:?} is in a spill dir, but no instance was given (--instance or HULL_INSTANCE)")]
    NoInstance { path: PathBuf },
    #[error("{path:?} leaves its allowed directory (through a symlink or `..`)")]
    Escapes { path: PathBuf },
    #[error("{path:?} goes through a symlink, refused here (spill files, or a project that contains the runs root)")]
    Symlink { path: PathBuf },
    #[error("{path:?}: no such file")]
    NotFound { path: PathBuf },
    #[error("{path:?} is not a regular file")]
    NotRegular { path: PathBuf },
    #[error(
        "{path:?} is not UTF-8 text (invalid byte at offset {offset}); hull read returns text only"
    )]
    NotUtf8 { path: PathBuf, offset: u64 },
    #[error("{path:?}: the path is not valid UTF-8")]
    PathNotUtf8 { path: PathBuf },
    #[error("{path:?}: path longer than {MAX_REL_PATH_BYTES} bytes")]
    PathTooLong { path: PathBuf },
    #[error("--start-line {start_line} is past the end of {path:?} ({lines} lines)")]
    PastEnd {
        path: PathBuf,
        start_line: u64,
        lines: u64,
    },
    #[error("{0}")]
    BadRange(&'static str),
    #[error("the cursor is not valid: {0}")]
    BadCursor(String),
    #[error("the cursor belongs to another hull instance ({cursor}); this read is for {this}")]
    CursorOtherInstance { cursor: String, this: String },
    #[error("{path:?} changed since the cursor was made; read it again by path and line range")]
    FileChanged { path: PathBuf },
    #[error("project {path:?}: {source}")]
    Project {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path:?}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadRequest {
    /// Lines `start_line` (1-based, default 1) onwards, at most `max_lines`
    /// (default: to the end of the file).
    Range {
        path: PathBuf,
        start_line: Option<u64>,
        max_lines: Option<u64>,
    },
    /// Continue where a previous answer's `next_cursor` points.
    Cursor(String),
}

/// One answer. [`ReadAnswer::render`] (the text plus the truncation notice,
/// what `hull read` prints) is at most [`READ_MAX_BYTES`] bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadAnswer {
    /// The file's text, exactly: concatenating `text` over a chain of
    /// cursors gives the selected range byte for byte.
    pub text: String,
    /// When `truncated`: one line telling how to continue (with the cursor).
    pub notice: Option<String>,
    /// Where the next answer resumes, when `truncated`.
    pub next_cursor: Option<String>,
    /// The line the text starts in (it may start inside it, after a cursor).
    pub start_line: u64,
    /// The last line the text reaches into (`start_line - 1` when empty).
    pub end_line: u64,
    /// The selected range did not fit; `next_cursor` continues it.
    pub truncated: bool,
}

/// Where reads may come from: one project, and one instance's spill.
#[derive(Debug, Clone)]
pub struct ReadScope {
    project: PathBuf,
    project_canon: PathBuf,
    runs: PathBuf,
    runs_canon: PathBuf,
    instance: Option<InstanceId>,
}

impl ReadScope {
    /// `project` must exist. `runs_root` is where run dirs live
    /// ([`super::runs_root`]); `instance` is whose spill may be read (None:
    /// the project only).
    pub fn new(
        project: &Path,
        runs_root: &Path,
        instance: Option<InstanceId>,
    ) -> Result<ReadScope, ReadError> {
        let project_canon =
            std::fs::canonicalize(project).map_err(|source| ReadError::Project {
                path: project.to_path_buf(),
                source,
            })?;
        if !project_canon.is_dir() {
            return Err(ReadError::Project {
                path: project.to_path_buf(),
                source: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
            });
        }
        let project = std::path::absolute(project).unwrap_or_else(|_| project_canon.clone());
        let runs = std::path::absolute(runs_root).unwrap_or_else(|_| runs_root.to_path_buf());
        Ok(ReadScope {
            project,
            project_canon,
            runs_canon: canon_or_lexical(&runs),
            runs,
            instance,
        })
    }

    /// Answers one request.
    pub fn read(&self, req: &ReadRequest) -> Result<ReadAnswer, ReadError> {
        match req {
            ReadRequest::Range {
                path,
                start_line,
                max_lines,
            } => {
                let start = start_line.unwrap_or(1);
                if start == 0 {
                    return Err(ReadError::BadRange("--start-line counts from 1"));
                }
                if *max_lines == Some(0) {
                    return Err(ReadError::BadRange("--max-lines must be at least 1"));
                }
                let (kind, rel) = self.locate(path)?;
                let shown = self.shown(kind, &rel);
                let (file, ident) = self.open(kind, &rel, &shown)?;
                let off = seek_line(&file, ident.size, start, &shown)?;
                self.answer(&file, ident, kind, &rel, &shown, off, start, *max_lines)
            }
            ReadRequest::Cursor(s) => {
                let c = Cursor::decode(s).map_err(|e| ReadError::BadCursor(e.to_string()))?;
                let mine = self.instance.map(|i| i.to_string());
                if c.inst != mine {
                    return Err(ReadError::CursorOtherInstance {
                        cursor: c.inst.unwrap_or_else(|| "none".into()),
                        this: mine.unwrap_or_else(|| "no instance".into()),
                    });
                }
                // A cursor grants nothing: its path goes through every check
                // a fresh request does.
                let base = match c.root {
                    RootKind::Project => self.project_canon.clone(),
                    RootKind::Spill => self.spill_dir().ok_or_else(|| {
                        ReadError::BadCursor("spill cursor without an instance".into())
                    })?,
                };
                let mut abs = base;
                for part in c.path.split('/') {
                    abs.push(part);
                }
                let (kind, rel) = self.locate(&abs)?;
                if kind != c.root || rel != c.path {
                    return Err(ReadError::BadCursor(
                        "path does not resolve as recorded".into(),
                    ));
                }
                let shown = self.shown(kind, &rel);
                let (file, ident) = self.open(kind, &rel, &shown)?;
                if ident != c.file {
                    return Err(ReadError::FileChanged { path: shown });
                }
                if c.off > ident.size || c.line == 0 || c.rem == Some(0) {
                    return Err(ReadError::BadCursor("position out of range".into()));
                }
                self.answer(&file, ident, kind, &rel, &shown, c.off, c.line, c.rem)
            }
        }
    }

    fn spill_dir(&self) -> Option<PathBuf> {
        self.instance
            .map(|i| self.runs_canon.join(i.to_string()).join(SPILL_DIR))
    }

    fn shown(&self, kind: RootKind, rel: &str) -> PathBuf {
        let base = match kind {
            RootKind::Project => self.project_canon.clone(),
            RootKind::Spill => self.spill_dir().unwrap_or_default(),
        };
        rel.split('/').fold(base, |p, c| p.join(c))
    }

    /// Which root `path` is in, and its `/`-joined path relative to it.
    fn locate(&self, path: &Path) -> Result<(RootKind, String), ReadError> {
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(ReadError::ParentDir {
                path: path.to_path_buf(),
            });
        }
        let abs: PathBuf = if path.is_absolute() {
            path.components()
                .filter(|c| *c != Component::CurDir)
                .collect()
        } else {
            self.project_canon.join(path)
        };
        for runs in [&self.runs, &self.runs_canon] {
            let Ok(in_runs) = abs.strip_prefix(runs) else {
                continue;
            };
            let Some(id) = self.instance else {
                return Err(
                    if in_runs.components().nth(1) == Some(Component::Normal(SPILL_DIR.as_ref())) {
                        ReadError::NoInstance { path: abs }
                    } else {
                        ReadError::OtherRunDir { path: abs }
                    },
                );
            };
            let mine = Path::new(&id.to_string()).join(SPILL_DIR);
            return match in_runs.strip_prefix(&mine) {
                Ok(rel) if rel.components().next().is_some() => {
                    Ok((RootKind::Spill, rel_string(rel, &abs)?))
                }
                _ => Err(ReadError::OtherRunDir { path: abs }),
            };
        }
        for proj in [&self.project, &self.project_canon] {
            if let Ok(rel) = abs.strip_prefix(proj) {
                if rel.components().next().is_none() {
                    return Err(ReadError::NotRegular { path: abs });
                }
                return Ok((RootKind::Project, rel_string(rel, &abs)?));
            }
        }
        Err(ReadError::Outside {
            path: abs,
            project: self.project_canon.clone(),
        })
    }

    fn open(
        &self,
        kind: RootKind,
        rel: &str,
        shown: &Path,
    ) -> Result<(File, FileIdent), ReadError> {
        let io_err = |source| ReadError::Io {
            path: shown.to_path_buf(),
            source,
        };
        let map = |e: BeneathError| {
            let path = shown.to_path_buf();
            match e {
                BeneathError::Escape => ReadError::Escapes { path },
                BeneathError::Symlink => ReadError::Symlink { path },
                BeneathError::NotFound => ReadError::NotFound { path },
                BeneathError::Io(source) => ReadError::Io { path, source },
            }
        };
        let rel_path: PathBuf = rel.split('/').collect();
        let file = match kind {
            RootKind::Project => {
                let root =
                    Root::open(&self.project_canon).map_err(|source| ReadError::Project {
                        path: self.project_canon.clone(),
                        source,
                    })?;
                // A project containing the runs root: a symlink inside it
                // could lead into another instance's run dir.
                let symlinks = if self.runs_canon.starts_with(&self.project_canon) {
                    Symlinks::Refuse
                } else {
                    Symlinks::Follow
                };
                root.open_beneath(&rel_path, false, symlinks).map_err(map)?
            }
            RootKind::Spill => {
                let id = self.instance.ok_or_else(|| ReadError::NoInstance {
                    path: shown.to_path_buf(),
                })?;
                let runs = Root::open(&self.runs_canon).map_err(|e| match e.kind() {
                    io::ErrorKind::NotFound => ReadError::NotFound {
                        path: shown.to_path_buf(),
                    },
                    _ => io_err(e),
                })?;
                let spill = runs
                    .sub(
                        &Path::new(&id.to_string()).join(SPILL_DIR),
                        Symlinks::Refuse,
                    )
                    .map_err(map)?;
                spill
                    .open_beneath(&rel_path, false, Symlinks::Refuse)
                    .map_err(map)?
            }
        };
        let md = file.metadata().map_err(io_err)?;
        if !md.is_file() {
            return Err(ReadError::NotRegular {
                path: shown.to_path_buf(),
            });
        }
        let ident = ident(&file, &md).map_err(io_err)?;
        Ok((file, ident))
    }

    #[allow(clippy::too_many_arguments)]
    fn answer(
        &self,
        file: &File,
        ident: FileIdent,
        kind: RootKind,
        rel: &str,
        shown: &Path,
        off: u64,
        line: u64,
        rem: Option<u64>,
    ) -> Result<ReadAnswer, ReadError> {
        let make_cursor = |file: FileIdent, off: u64, line: u64, rem: Option<u64>| Cursor {
            v: Cursor::VERSION,
            inst: self.instance.map(|i| i.to_string()),
            root: kind,
            path: rel.to_string(),
            file,
            off,
            line,
            rem,
        };
        // Room for the longest notice this path can need.
        let widest = FileIdent {
            dev: u64::MAX,
            ino: u64::MAX,
            size: u64::MAX,
            mtime_ns: i64::MIN,
        };
        let notice_max = 1 + notice(
            u64::MAX,
            &make_cursor(widest, u64::MAX, u64::MAX, Some(u64::MAX)).encode(),
        )
        .len();
        let budget = READ_MAX_BYTES.saturating_sub(notice_max);

        let mut buf = vec![0u8; budget + 1];
        let got = read_full_at(file, &mut buf, off).map_err(|source| ReadError::Io {
            path: shown.to_path_buf(),
            source,
        })?;
        let more = got > budget;
        buf.truncate(got.min(budget));

        let mut end = buf.len();
        let mut range_done = !more;
        if let Some(r) = rem {
            let mut nl = 0u64;
            for (i, &b) in buf.iter().enumerate() {
                if b == b'\n' {
                    nl += 1;
                    if nl == r {
                        end = i + 1;
                        range_done = true;
                        break;
                    }
                }
            }
        }
        let content = &buf[..end];
        let not_utf8 = |valid: usize| ReadError::NotUtf8 {
            path: shown.to_path_buf(),
            offset: off + valid as u64,
        };
        let text = match std::str::from_utf8(content) {
            Ok(s) => s,
            // Cut inside a character at the byte limit: stop before it.
            Err(e) if e.error_len().is_none() && !range_done => {
                std::str::from_utf8(&content[..e.valid_up_to()]).map_err(|_| not_utf8(0))?
            }
            Err(e) => return Err(not_utf8(e.valid_up_to())),
        };
        let nl = text.bytes().filter(|&b| b == b'\n').count() as u64;
        let end_line = if text.is_empty() {
            line - 1
        } else {
            line + nl - u64::from(text.ends_with('\n'))
        };
        if range_done {
            return Ok(ReadAnswer {
                text: text.to_string(),
                notice: None,
                next_cursor: None,
                start_line: line,
                end_line,
                truncated: false,
            });
        }
        let next_line = line + nl;
        let cursor = make_cursor(
            ident,
            off + text.len() as u64,
            next_line,
            rem.map(|r| r - nl),
        )
        .encode();
        let answer = ReadAnswer {
            text: text.to_string(),
            notice: Some(notice(next_line, &cursor)),
            next_cursor: Some(cursor),
            start_line: line,
            end_line,
            truncated: true,
        };
        debug_assert!(answer.render().len() <= READ_MAX_BYTES);
        Ok(answer)
    }
}

impl ReadAnswer {
    /// The answer as `hull read` prints it: the text, then (when truncated)
    /// the notice on a line of its own. At most [`READ_MAX_BYTES`] bytes.
    pub fn render(&self) -> String {
        let mut out = self.text.clone();
        if let Some(n) = &self.notice {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(n);
        }
        out
    }
}

fn notice(next_line: u64, cursor: &str) -> String {
    format!(
        "[hull: answer truncated at {READ_MAX_BYTES} bytes in line {next_line}; continue with --cursor {cursor}]\n"
    )
}

fn rel_string(rel: &Path, abs: &Path) -> Result<String, ReadError> {
    let mut parts = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => {
                parts.push(n.to_str().ok_or_else(|| ReadError::PathNotUtf8 {
                    path: abs.to_path_buf(),
                })?)
            }
            Component::CurDir => {}
            _ => {
                return Err(ReadError::ParentDir {
                    path: abs.to_path_buf(),
                })
            }
        }
    }
    let s = parts.join("/");
    if s.len() > MAX_REL_PATH_BYTES {
        return Err(ReadError::PathTooLong {
            path: abs.to_path_buf(),
        });
    }
    Ok(s)
}

fn canon_or_lexical(p: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    match (p.parent(), p.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent)
            .map(|c| c.join(name))
            .unwrap_or_else(|_| p.to_path_buf()),
        _ => p.to_path_buf(),
    }
}

/// Byte offset where line `start` (1-based) begins.
fn seek_line(file: &File, size: u64, start: u64, shown: &Path) -> Result<u64, ReadError> {
    if start == 1 {
        return Ok(0);
    }
    let io_err = |source| ReadError::Io {
        path: shown.to_path_buf(),
        source,
    };
    let mut buf = vec![0u8; 64 * 1024];
    let mut off = 0u64;
    let mut line = 1u64;
    let mut last = None;
    loop {
        let n = read_full_at(file, &mut buf, off).map_err(io_err)?;
        if n == 0 {
            break;
        }
        for (i, &b) in buf[..n].iter().enumerate() {
            if b == b'\n' {
                line += 1;
                if line == start {
                    let at = off + i as u64 + 1;
                    if at < size {
                        return Ok(at);
                    }
                    return Err(ReadError::PastEnd {
                        path: shown.to_path_buf(),
                        start_line: start,
                        lines: line - 1,
                    });
                }
            }
        }
        last = buf[..n].last().copied();
        off += n as u64;
    }
    let lines = (line - 1) + u64::from(last.is_some_and(|b| b != b'\n'));
    Err(ReadError::PastEnd {
        path: shown.to_path_buf(),
        start_line: start,
        lines,
    })
}

/// Reads until `buf` is full or the file ends.
fn read_full_at(file: &File, buf: &mut [u8], mut off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match read_at(file, &mut buf[got..], off) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, off)
}

#[cfg(windows)]
fn read_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, off)
}

#[cfg(unix)]
fn ident(_file: &File, md: &std::fs::Metadata) -> io::Result<FileIdent> {
    use std::os::unix::fs::MetadataExt;
    Ok(FileIdent {
        dev: md.dev(),
        ino: md.ino(),
        size: md.size(),
        mtime_ns: md
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(md.mtime_nsec()),
    })
}

#[cfg(windows)]
fn ident(file: &File, md: &std::fs::Metadata) -> io::Result<FileIdent> {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Storage::FileSystem::{
        GetFileInformationByHandle, BY_HANDLE_FILE_INFORMATION,
    };
    // SAFETY: BY_HANDLE_FILE_INFORMATION is plain data; all zeroes is valid.
    let mut info: BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
    // SAFETY: the handle is valid for the call (owned by `file`) and `info`
    // is a writable struct of the type the function fills.
    let ok = unsafe { GetFileInformationByHandle(file.as_raw_handle() as _, &mut info) };
    if ok == 0 {
        return Err(io::Error::last_os_error());
    }
    let ino = (u64::from(info.nFileIndexHigh) << 32) | u64::from(info.nFileIndexLow);
    let t = (u64::from(info.ftLastWriteTime.dwHighDateTime) << 32)
        | u64::from(info.ftLastWriteTime.dwLowDateTime);
    Ok(FileIdent {
        dev: u64::from(info.dwVolumeSerialNumber),
        ino,
        size: md.len(),
        mtime_ns: (t as i64).saturating_mul(100),
    })
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use super::*;
    use crate::runtime::Instance;
    use std::os::unix::fs::symlink;

    struct Fx {
        _d: tempfile::TempDir,
        project: PathBuf,
        runs: PathBuf,
        me: Instance,
        other: Instance,
    }

    fn fx() -> Fx {
        let d = tempfile::tempdir().unwrap();
        let project = d.path().join("project");
        std::fs::create_dir(&project).unwrap();
        let runs = d.path().join("runs");
        let me = Instance::create(&runs).unwrap();
        let other = Instance::create(&runs).unwrap();
        Fx {
            _d: d,
            project,
            runs,
            me,
            other,
        }
    }

    impl Fx {
        fn scope(&self) -> ReadScope {
            ReadScope::new(&self.project, &self.runs, Some(self.me.id())).unwrap()
        }
    }

    fn range(p: impl Into<PathBuf>, s: Option<u64>, m: Option<u64>) -> ReadRequest {
        ReadRequest::Range {
            path: p.into(),
            start_line: s,
            max_lines: m,
        }
    }

    /// Reads a whole range, following cursors; returns the concatenated
    /// text and the answers.
    fn read_all(scope: &ReadScope, first: ReadRequest) -> (String, Vec<ReadAnswer>) {
        let mut out = String::new();
        let mut answers = Vec::new();
        let mut req = first;
        loop {
            let a = scope.read(&req).unwrap();
            let shown = a.render();
            assert!(shown.len() <= READ_MAX_BYTES, "{} bytes", shown.len());
            out.push_str(&a.text);
            match a.next_cursor.clone() {
                Some(c) => {
                    assert!(a.truncated);
                    assert!(shown.ends_with(&format!("--cursor {c}]\n")));
                    // The limit is used, not wasted: at most a notice and a
                    // character short of it.
                    assert!(shown.len() > READ_MAX_BYTES - 1024, "{}", shown.len());
                    req = ReadRequest::Cursor(c);
                    answers.push(a);
                }
                None => {
                    assert!(!a.truncated && a.notice.is_none());
                    answers.push(a);
                    return (out, answers);
                }
            }
        }
    }

    #[test]
    fn line_ranges() {
        let f = fx();
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(f.project.join("a.txt"), &text).unwrap();
        let s = f.scope();
        let a = s.read(&range("a.txt", Some(3), Some(2))).unwrap();
        assert_eq!(a.text, "line 3\nline 4\n");
        assert_eq!((a.start_line, a.end_line, a.truncated), (3, 4, false));
        assert_eq!(a.next_cursor, None);
        let a = s.read(&range("a.txt", None, None)).unwrap();
        assert_eq!(a.text, text);
        assert_eq!((a.start_line, a.end_line), (1, 100));
        let a = s.read(&range("a.txt", Some(100), Some(10))).unwrap();
        assert_eq!((a.text.as_str(), a.end_line), ("line 100\n", 100));
        // Absolute path in the project works too.
        let a = s
            .read(&range(f.project.join("a.txt"), Some(2), Some(1)))
            .unwrap();
        assert_eq!(a.text, "line 2\n");
        assert!(matches!(
            s.read(&range("a.txt", Some(101), None)),
            Err(ReadError::PastEnd { lines: 100, .. })
        ));
        assert!(matches!(
            s.read(&range("a.txt", Some(0), None)),
            Err(ReadError::BadRange(_))
        ));
        assert!(matches!(
            s.read(&range("a.txt", None, Some(0))),
            Err(ReadError::BadRange(_))
        ));
        // No trailing newline: the last line still counts.
        std::fs::write(f.project.join("b.txt"), "x\ny").unwrap();
        let a = s.read(&range("b.txt", Some(2), None)).unwrap();
        assert_eq!((a.text.as_str(), a.start_line, a.end_line), ("y", 2, 2));
        assert!(matches!(
            s.read(&range("b.txt", Some(3), None)),
            Err(ReadError::PastEnd { lines: 2, .. })
        ));
        std::fs::write(f.project.join("empty"), "").unwrap();
        let a = s.read(&range("empty", None, None)).unwrap();
        assert_eq!((a.text.as_str(), a.start_line, a.end_line), ("", 1, 0));
    }

    #[test]
    fn cursor_reassembles_a_long_multibyte_line() {
        let f = fx();
        // One 50 KB line of 1-, 2-, 3- and 4-byte characters, no newline.
        let mut line = String::new();
        let alphabet = ['a', 'é', '✓', '𝄞', 'z', 'ß'];
        let mut i = 0usize;
        while line.len() < 50_000 {
            line.push(alphabet[i % alphabet.len()]);
            i += 1;
        }
        std::fs::write(f.project.join("long.txt"), &line).unwrap();
        let s = f.scope();
        let (got, answers) = read_all(&s, range("long.txt", None, None));
        assert_eq!(got, line);
        assert!(answers.len() >= 6, "{} answers", answers.len());
        assert!(answers.iter().all(|a| a.start_line == 1 && a.end_line == 1));

        // With lines around it and a max_lines range ending inside the file.
        let text = format!("first\n{line}\nthird\nfourth\n");
        std::fs::write(f.project.join("mixed.txt"), &text).unwrap();
        let (got, answers) = read_all(&s, range("mixed.txt", Some(2), Some(2)));
        assert_eq!(got, format!("{line}\nthird\n"));
        let last = answers.last().unwrap();
        assert_eq!(last.end_line, 3);
        assert_eq!(answers[0].start_line, 2);
    }

    #[test]
    fn cursor_refused_after_change_and_in_other_instance() {
        let f = fx();
        let big = "x".repeat(30_000) + "\n";
        std::fs::write(f.project.join("big.txt"), &big).unwrap();
        let s = f.scope();
        let a = s.read(&range("big.txt", None, None)).unwrap();
        let c = a.next_cursor.clone().unwrap();
        // Same cursor, another instance (or none): refused.
        let other = ReadScope::new(&f.project, &f.runs, Some(f.other.id())).unwrap();
        assert!(matches!(
            other.read(&ReadRequest::Cursor(c.clone())),
            Err(ReadError::CursorOtherInstance { .. })
        ));
        let none = ReadScope::new(&f.project, &f.runs, None).unwrap();
        assert!(matches!(
            none.read(&ReadRequest::Cursor(c.clone())),
            Err(ReadError::CursorOtherInstance { .. })
        ));
        // Still good here.
        assert!(s.read(&ReadRequest::Cursor(c.clone())).is_ok());
        // Same size, new content and mtime: refused.
        let t = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::write(f.project.join("big.txt"), "y".repeat(30_000) + "\n").unwrap();
        std::fs::File::options()
            .write(true)
            .open(f.project.join("big.txt"))
            .unwrap()
            .set_modified(t)
            .unwrap();
        assert!(matches!(
            s.read(&ReadRequest::Cursor(c.clone())),
            Err(ReadError::FileChanged { .. })
        ));
        // Appended: refused.
        let a = s.read(&range("big.txt", None, None)).unwrap();
        let c2 = a.next_cursor.unwrap();
        std::fs::write(f.project.join("big.txt"), "y".repeat(30_001) + "\n").unwrap();
        assert!(matches!(
            s.read(&ReadRequest::Cursor(c2)),
            Err(ReadError::FileChanged { .. })
        ));
        assert!(matches!(
            s.read(&ReadRequest::Cursor("garbage!".into())),
            Err(ReadError::BadCursor(_))
        ));
    }

    #[test]
    fn forged_cursor_path_is_checked_again() {
        let f = fx();
        std::fs::write(f.project.join("a"), "a\n").unwrap();
        let c = Cursor {
            v: 1,
            inst: Some(f.me.id().to_string()),
            root: RootKind::Project,
            path: "../secret".into(),
            file: FileIdent {
                dev: 0,
                ino: 0,
                size: 0,
                mtime_ns: 0,
            },
            off: 0,
            line: 1,
            rem: None,
        };
        let e = f
            .scope()
            .read(&ReadRequest::Cursor(c.encode()))
            .unwrap_err();
        assert!(matches!(e, ReadError::ParentDir { .. }), "{e}");
    }

    #[test]
    fn spill_of_this_instance_only() {
        let f = fx();
        std::fs::write(f.me.spill().join("out.txt"), "mine\n").unwrap();
        std::fs::write(f.other.spill().join("out.txt"), "theirs\n").unwrap();
        std::fs::write(f.other.tmp().join("t"), "tmp\n").unwrap();
        let s = f.scope();
        let a = s
            .read(&range(f.me.spill().join("out.txt"), None, None))
            .unwrap();
        assert_eq!(a.text, "mine\n");
        for p in [
            f.other.spill().join("out.txt"),
            f.other.tmp().join("t"),
            f.me.tmp().join("x"),
            f.me.dir().join(".active"),
            f.runs.join(f.other.id().to_string()).join("spill/out.txt"),
        ] {
            let e = s.read(&range(&p, None, None)).unwrap_err();
            assert!(matches!(e, ReadError::OtherRunDir { .. }), "{p:?}: {e}");
        }
        // Without an instance no spill is readable.
        let none = ReadScope::new(&f.project, &f.runs, None).unwrap();
        let e = none
            .read(&range(f.me.spill().join("out.txt"), None, None))
            .unwrap_err();
        assert!(matches!(e, ReadError::NoInstance { .. }), "{e}");
        // A symlink in the spill is never followed.
        symlink(f.other.spill().join("out.txt"), f.me.spill().join("link")).unwrap();
        let e = s
            .read(&range(f.me.spill().join("link"), None, None))
            .unwrap_err();
        assert!(
            matches!(e, ReadError::Symlink { .. } | ReadError::Escapes { .. }),
            "{e}"
        );
    }

    #[test]
    fn project_containing_runs_root() {
        let d = tempfile::tempdir().unwrap();
        let project = d.path().to_path_buf();
        let runs = d.path().join("hull-runs");
        let me = Instance::create(&runs).unwrap();
        let other = Instance::create(&runs).unwrap();
        std::fs::write(other.spill().join("o.txt"), "theirs\n").unwrap();
        std::fs::write(me.spill().join("m.txt"), "mine\n").unwrap();
        std::fs::write(project.join("plain.txt"), "plain\n").unwrap();
        let s = ReadScope::new(&project, &runs, Some(me.id())).unwrap();
        let rel = format!("hull-runs/{}/spill/o.txt", other.id());
        assert!(matches!(
            s.read(&range(&rel, None, None)),
            Err(ReadError::OtherRunDir { .. })
        ));
        // A relative symlink inside the project pointing into the runs root.
        symlink(
            format!("hull-runs/{}/spill", other.id()),
            project.join("peek"),
        )
        .unwrap();
        let e = s.read(&range("peek/o.txt", None, None)).unwrap_err();
        assert!(matches!(e, ReadError::Symlink { .. }), "{e}");
        assert_eq!(
            s.read(&range("plain.txt", None, None)).unwrap().text,
            "plain\n"
        );
        let mine = format!("hull-runs/{}/spill/m.txt", me.id());
        assert_eq!(s.read(&range(&mine, None, None)).unwrap().text, "mine\n");
    }

    #[test]
    fn escapes_refused() {
        let f = fx();
        let outside = f.project.parent().unwrap().join("secret");
        std::fs::write(&outside, "secret\n").unwrap();
        std::fs::create_dir(f.project.join("sub")).unwrap();
        std::fs::write(f.project.join("sub/in.txt"), "in\n").unwrap();
        symlink(&outside, f.project.join("abs_link")).unwrap();
        symlink("../secret", f.project.join("rel_link")).unwrap();
        symlink("sub/in.txt", f.project.join("ok_link")).unwrap();
        let s = f.scope();
        for p in ["abs_link", "rel_link"] {
            let e = s.read(&range(p, None, None)).unwrap_err();
            assert!(matches!(e, ReadError::Escapes { .. }), "{p}: {e}");
        }
        assert_eq!(s.read(&range("ok_link", None, None)).unwrap().text, "in\n");
        for p in ["../secret", "sub/../../secret", "sub/../in.txt"] {
            let e = s.read(&range(p, None, None)).unwrap_err();
            assert!(matches!(e, ReadError::ParentDir { .. }), "{p}: {e}");
        }
        let e = s.read(&range(&outside, None, None)).unwrap_err();
        assert!(matches!(e, ReadError::Outside { .. }), "{e}");
        let e = s.read(&range("sub", None, None)).unwrap_err();
        assert!(matches!(e, ReadError::NotRegular { .. }), "{e}");
        let e = s.read(&range("missing", None, None)).unwrap_err();
        assert!(matches!(e, ReadError::NotFound { .. }), "{e}");
    }

    #[test]
    fn non_utf8_is_an_error() {
        let f = fx();
        std::fs::write(f.project.join("bin"), b"ok\n\xff\xfe\n").unwrap();
        let e = f.scope().read(&range("bin", None, None)).unwrap_err();
        assert!(matches!(e, ReadError::NotUtf8 { offset: 3, .. }), "{e}");
        assert!(e.to_string().contains("not UTF-8"));
        // A truncated character at the very end of the file is not text either.
        std::fs::write(f.project.join("cut"), b"ok\xc3").unwrap();
        assert!(matches!(
            f.scope().read(&range("cut", None, None)),
            Err(ReadError::NotUtf8 { .. })
        ));
    }
}
