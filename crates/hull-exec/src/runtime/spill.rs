//! Output sinks: [`PassThrough`] (byte for byte) and [`SpillSink`] (large
//! outputs go to the instance's spill, the caller gets head, tail and path).
//!
//! A spill sink treats stdout and stderr separately. Each stream is written
//! in full to `spill/<stamp>-<stream>.txt` as it arrives. The first half of
//! the threshold passes through live; the rest is withheld in a bounded
//! buffer. At the end, a stream that stayed within the threshold is released
//! as it was (the caller got every byte, in order) and its spill file is
//! deleted; a longer one ends with a marker line
//! `[hull: N bytes omitted; full output: PATH]` and the last half-threshold
//! bytes, and its spill file is kept.
//!
//! Memory is bounded by the threshold per stream, whatever the command
//! prints. A full disk ends the run with an error naming the spill file and
//! how many bytes it kept. Not protected against: a caller who never calls
//! `finish` (withheld bytes are then not delivered).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::exec::OutputSink;

/// Threshold when `--spill` is given without a value.
pub const DEFAULT_SPILL_BYTES: u64 = 50_000;
/// The smallest threshold accepted.
pub const MIN_SPILL_BYTES: u64 = 64;

/// Bad spill settings.
#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    #[error("--spill threshold {0} bytes is below the minimum of {MIN_SPILL_BYTES}")]
    ThresholdTooSmall(u64),
    #[error("spill directory {0:?} does not exist or is not a directory")]
    NoSpillDir(PathBuf),
}

type Writer = Box<dyn Write + Send>;

/// Writes stdout and stderr through unchanged, flushing after every write.
pub struct PassThrough {
    out: Writer,
    err: Writer,
}

impl std::fmt::Debug for PassThrough {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PassThrough").finish_non_exhaustive()
    }
}

impl PassThrough {
    /// To this process's stdout and stderr.
    pub fn stdio() -> Self {
        Self::new(Box::new(io::stdout()), Box::new(io::stderr()))
    }
    /// To the given writers (tests capture output this way).
    pub fn new(out: Writer, err: Writer) -> Self {
        PassThrough { out, err }
    }
}

impl OutputSink for PassThrough {
    fn stdout(&mut self, data: &[u8]) -> io::Result<()> {
        self.out.write_all(data)?;
        self.out.flush()
    }
    fn stderr(&mut self, data: &[u8]) -> io::Result<()> {
        self.err.write_all(data)?;
        self.err.flush()
    }
    fn finish(&mut self) -> io::Result<()> {
        self.out.flush()?;
        self.err.flush()
    }
}

/// Spills large outputs into the instance's spill dir (see the module docs).
#[derive(Debug)]
pub struct SpillSink {
    out: Stream,
    err: Stream,
}

impl SpillSink {
    /// To this process's stdout and stderr.
    pub fn stdio(spill_dir: &Path, threshold: u64) -> Result<Self, SpillError> {
        Self::new(
            spill_dir,
            threshold,
            Box::new(io::stdout()),
            Box::new(io::stderr()),
        )
    }

    /// To the given writers. `threshold` is per stream, in bytes.
    pub fn new(
        spill_dir: &Path,
        threshold: u64,
        out: Writer,
        err: Writer,
    ) -> Result<Self, SpillError> {
        if threshold < MIN_SPILL_BYTES {
            return Err(SpillError::ThresholdTooSmall(threshold));
        }
        if !spill_dir.is_dir() {
            return Err(SpillError::NoSpillDir(spill_dir.to_path_buf()));
        }
        let stamp = stamp();
        let path = |s: &str| spill_dir.join(format!("{stamp}-{s}.txt"));
        Ok(SpillSink {
            out: Stream::new(path("stdout"), threshold, out),
            err: Stream::new(path("stderr"), threshold, err),
        })
    }

    /// The spill files kept by [`OutputSink::finish`] (streams that passed
    /// the threshold), stdout first.
    pub fn kept_files(&self) -> Vec<PathBuf> {
        [&self.out, &self.err]
            .into_iter()
            .filter(|s| s.kept)
            .map(|s| s.path.clone())
            .collect()
    }
}

impl OutputSink for SpillSink {
    fn stdout(&mut self, data: &[u8]) -> io::Result<()> {
        self.out.write(data)
    }
    fn stderr(&mut self, data: &[u8]) -> io::Result<()> {
        self.err.write(data)
    }
    fn finish(&mut self) -> io::Result<()> {
        let a = self.out.finish();
        let b = self.err.finish();
        a.and(b)
    }
}

/// `20261201T120000.123Z-1a2b3c4d`: sortable by time, unique across the
/// processes of one instance.
fn stamp() -> String {
    let t = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let t: String = t.chars().filter(|c| *c != '-' && *c != ':').collect();
    let r = uuid::Uuid::new_v4().simple().to_string();
    format!("{t}-{}", &r[..8])
}

struct Stream {
    path: PathBuf,
    file: Option<File>,
    live: Writer,
    threshold: u64,
    total: u64,
    /// Bytes passed through live so far.
    passed: u64,
    /// Whether bytes still pass through live.
    head_open: bool,
    last_live: Option<u8>,
    /// What was withheld, bounded by `cap` (the newest bytes).
    withheld: VecDeque<u8>,
    cap: usize,
    kept: bool,
    finished: bool,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("path", &self.path)
            .field("total", &self.total)
            .field("passed", &self.passed)
            .finish_non_exhaustive()
    }
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

impl Stream {
    fn new(path: PathBuf, threshold: u64, live: Writer) -> Self {
        Stream {
            path,
            file: None,
            live,
            threshold,
            total: 0,
            passed: 0,
            head_open: true,
            last_live: None,
            withheld: VecDeque::new(),
            cap: 0,
            kept: false,
            finished: false,
        }
    }

    fn spill_err(&self, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), format!("spill file {}: {e}", self.path.display()))
    }

    fn write(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        if self.file.is_none() {
            let mut o = File::options();
            o.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                o.mode(0o600);
            }
            self.file = Some(o.open(&self.path).map_err(|e| self.spill_err(e))?);
        }
        if let Some(f) = self.file.as_mut() {
            if let Err(e) = f.write_all(data) {
                // What the file holds is what the caller can still read.
                let kept = f.metadata().map(|m| m.len()).unwrap_or(self.total);
                let sent = self.total + data.len() as u64;
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "spill file {}: {e}; it keeps the first {kept} of the {sent} bytes the stream has sent",
                        self.path.display()
                    ),
                ));
            }
        }
        self.total += data.len() as u64;

        let mut rest = data;
        if self.head_open {
            let room = self.threshold / 2 - self.passed;
            if (rest.len() as u64) <= room {
                self.live(rest)?;
                return Ok(());
            }
            // Close the head here, backing off so a UTF-8 character that
            // straddles the cut is withheld whole.
            let mut cut = room as usize;
            let mut back = 0;
            while cut > 0 && back < 3 && is_continuation(rest[cut]) {
                cut -= 1;
                back += 1;
            }
            if back == 3 && is_continuation(rest[cut]) {
                cut = room as usize; // not UTF-8 there: cut at the limit
            }
            self.live(&rest[..cut])?;
            rest = &rest[cut..];
            self.head_open = false;
            // Enough to release everything withheld when the stream ends
            // within the threshold.
            self.cap = (self.threshold - self.passed) as usize;
        }
        if rest.len() >= self.cap {
            self.withheld.clear();
            self.withheld.extend(&rest[rest.len() - self.cap..]);
        } else {
            let over = (self.withheld.len() + rest.len()).saturating_sub(self.cap);
            self.withheld.drain(..over);
            self.withheld.extend(rest);
        }
        Ok(())
    }

    fn live(&mut self, b: &[u8]) -> io::Result<()> {
        if b.is_empty() {
            return Ok(());
        }
        self.live.write_all(b)?;
        self.live.flush()?;
        self.passed += b.len() as u64;
        self.last_live = b.last().copied();
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        if let Some(f) = self.file.take() {
            f.sync_data().map_err(|e| self.spill_err(e))?;
        }
        if self.total <= self.threshold {
            let (a, b) = self.withheld.as_slices();
            self.live.write_all(a)?;
            self.live.write_all(b)?;
            self.withheld.clear();
            self.live.flush()?;
            if self.total > 0 {
                std::fs::remove_file(&self.path).map_err(|e| self.spill_err(e))?;
            }
            return Ok(());
        }
        self.kept = true;
        let withheld: Vec<u8> = self.withheld.drain(..).collect();
        let tail_max = (self.threshold - self.threshold / 2) as usize;
        let mut tail = &withheld[withheld.len().saturating_sub(tail_max)..];
        tail = trim_start(tail);
        let omitted = self.total - self.passed - tail.len() as u64;
        let mut marker = Vec::new();
        if self.last_live.is_some_and(|b| b != b'\n') {
            marker.push(b'\n');
        }
        marker.extend(
            format!(
                "[hull: {omitted} bytes omitted; full output: {}]\n",
                self.path.display()
            )
            .as_bytes(),
        );
        self.live.write_all(&marker)?;
        self.live.write_all(tail)?;
        self.live.flush()
    }
}

/// Starts the tail at a line start when one is near, else at a UTF-8
/// character start.
fn trim_start(tail: &[u8]) -> &[u8] {
    let window = &tail[..tail.len().min(tail.len() / 4).min(4096)];
    if let Some(i) = window.iter().position(|&b| b == b'\n') {
        return &tail[i + 1..];
    }
    let skip = tail
        .iter()
        .take(3)
        .take_while(|&&b| is_continuation(b))
        .count();
    &tail[skip..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Cap(Arc<Mutex<Vec<u8>>>);
    impl Write for Cap {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    impl Cap {
        fn get(&self) -> Vec<u8> {
            self.0.lock().unwrap().clone()
        }
    }

    fn sink(dir: &Path, threshold: u64) -> (SpillSink, Cap, Cap) {
        let (o, e) = (Cap::default(), Cap::default());
        let s = SpillSink::new(dir, threshold, Box::new(o.clone()), Box::new(e.clone())).unwrap();
        (s, o, e)
    }

    fn feed(s: &mut SpillSink, data: &[u8], chunk: usize, stderr: bool) {
        for c in data.chunks(chunk) {
            if stderr {
                s.stderr(c).unwrap();
            } else {
                s.stdout(c).unwrap();
            }
        }
    }

    fn pseudo(n: usize) -> Vec<u8> {
        // Lines of mixed ASCII and multibyte text, deterministic.
        let mut v = Vec::new();
        let mut i = 0u64;
        while v.len() < n {
            v.extend(format!("line {i} héllo wörld ✓ {}\n", i * 7919 % 1000).as_bytes());
            i += 1;
        }
        // Cut at a character boundary (at most 3 bytes short of n).
        let mut cut = n;
        while std::str::from_utf8(&v[..cut]).is_err() {
            cut -= 1;
        }
        v.truncate(cut);
        v
    }

    #[test]
    fn below_threshold_is_exact_and_file_removed() {
        let d = tempfile::tempdir().unwrap();
        for n in [0usize, 1, 499, 500, 501, 999, 1000] {
            let (mut s, o, e) = sink(d.path(), 1000);
            let data = pseudo(n);
            feed(&mut s, &data, 7, false);
            feed(&mut s, b"err\n", 2, true);
            // Live part: at most the head.
            assert!(o.get().len() <= 500, "n={n}: {} live", o.get().len());
            assert_eq!(o.get(), data[..o.get().len()]);
            s.finish().unwrap();
            assert_eq!(o.get(), data, "n={n}");
            assert_eq!(e.get(), b"err\n");
            assert!(s.kept_files().is_empty());
            assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "n={n}");
        }
    }

    #[test]
    fn above_threshold_head_marker_tail_and_full_file() {
        let d = tempfile::tempdir().unwrap();
        for chunk in [1usize, 13, 4096, 1 << 20] {
            let (mut s, o, e) = sink(d.path(), 1000);
            let data = pseudo(200_000);
            feed(&mut s, &data, chunk, false);
            let live = o.get();
            assert!(
                live.len() <= 500 && live.len() >= 497,
                "chunk {chunk}: {}",
                live.len()
            );
            assert_eq!(live, data[..live.len()]);
            s.finish().unwrap();
            let kept = s.kept_files();
            assert_eq!(kept.len(), 1);
            assert!(kept[0].to_str().unwrap().ends_with("-stdout.txt"));
            assert_eq!(
                std::fs::read(&kept[0]).unwrap(),
                data,
                "spill holds everything"
            );
            let all = o.get();
            let text = String::from_utf8(all.clone()).unwrap();
            let head = &all[..live.len()];
            let rest = &text[live.len()..];
            let rest = rest.strip_prefix('\n').unwrap_or(rest);
            let (marker, tail) = rest.split_once('\n').unwrap();
            let want = format!("full output: {}]", kept[0].display());
            assert!(
                marker.starts_with("[hull: ") && marker.ends_with(&want),
                "{marker}"
            );
            let n: u64 = marker["[hull: ".len()..]
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(data.ends_with(tail.as_bytes()));
            assert!(tail.len() <= 500 && tail.len() > 350, "{}", tail.len());
            assert_eq!(n as usize + head.len() + tail.len(), data.len());
            assert!(e.get().is_empty());
            std::fs::remove_file(&kept[0]).unwrap();
        }
    }

    #[test]
    fn head_cut_never_splits_a_character() {
        let d = tempfile::tempdir().unwrap();
        // 'é' is two bytes; put one across the head boundary (500).
        let mut data = vec![b'a'; 499];
        data.extend("é".repeat(1000).as_bytes());
        let (mut s, o, _) = sink(d.path(), 1000);
        feed(&mut s, &data, 4096, false);
        assert_eq!(o.get(), vec![b'a'; 499]);
        s.finish().unwrap();
        assert!(std::str::from_utf8(&o.get()).is_ok());
    }

    #[test]
    fn streams_are_separate() {
        let d = tempfile::tempdir().unwrap();
        let (mut s, o, e) = sink(d.path(), 100);
        let big = pseudo(1000);
        feed(&mut s, b"small\n", 3, false);
        feed(&mut s, &big, 64, true);
        s.finish().unwrap();
        assert_eq!(o.get(), b"small\n");
        let kept = s.kept_files();
        assert_eq!(kept.len(), 1);
        assert!(kept[0].to_str().unwrap().ends_with("-stderr.txt"));
        assert_eq!(std::fs::read(&kept[0]).unwrap(), big);
        assert!(String::from_utf8(e.get())
            .unwrap()
            .contains("bytes omitted"));
    }

    #[test]
    fn bad_settings() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(
            SpillSink::stdio(d.path(), 10),
            Err(SpillError::ThresholdTooSmall(10))
        ));
        assert!(matches!(
            SpillSink::stdio(&d.path().join("x"), 1000),
            Err(SpillError::NoSpillDir(_))
        ));
    }

    #[test]
    fn passthrough_is_exact() {
        let (o, e) = (Cap::default(), Cap::default());
        let mut p = PassThrough::new(Box::new(o.clone()), Box::new(e.clone()));
        let data = pseudo(300_000);
        for c in data.chunks(977) {
            p.stdout(c).unwrap();
        }
        p.stderr(b"\xff\x00binary").unwrap();
        p.finish().unwrap();
        assert_eq!(o.get(), data);
        assert_eq!(e.get(), b"\xff\x00binary");
    }
}
