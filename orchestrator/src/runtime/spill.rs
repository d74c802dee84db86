//! TEMPORARY shim until the runtime module lands.
use std::io::Write;
use std::path::Path;

#[derive(Debug)]
pub struct SpillSink;

impl SpillSink {
    pub fn new(_dir: &Path, _threshold: u64) -> SpillSink {
        SpillSink
    }
}

impl crate::exec::OutputSink for SpillSink {
    fn stdout(&mut self, d: &[u8]) -> std::io::Result<()> {
        std::io::stdout().write_all(d)
    }
    fn stderr(&mut self, d: &[u8]) -> std::io::Result<()> {
        std::io::stderr().write_all(d)
    }
}
