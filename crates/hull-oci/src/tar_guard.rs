//! A reader under a tar parser that follows the tar block layout as the
//! bytes pass, and hashes them: a metadata entry (a GNU long name or link,
//! a PAX header) the tar crate would read whole into memory is refused by
//! its header's size before it is read, and a PAX record that sets an
//! entry's size (which would move the headers where this reader does not
//! look) is refused once read.

use std::io::{self, Read};

use sha2::{Digest, Sha256};

/// The largest metadata entry (a GNU long name or link, a PAX header).
pub const MAX_METADATA_ENTRY: u64 = 64 << 10;

/// See the module.
#[derive(Debug)]
pub struct TarGuard<R> {
    inner: R,
    hash: Sha256,
    /// Bytes passed so far.
    read: u64,
    /// Where the next header starts.
    next_header: u64,
    /// The header being collected.
    header: Vec<u8>,
    /// PAX records being collected, and how many bytes of them are left.
    pax: Vec<u8>,
    pax_left: u64,
}

impl<R: Read> TarGuard<R> {
    pub fn new(inner: R) -> TarGuard<R> {
        TarGuard {
            inner,
            hash: Sha256::new(),
            read: 0,
            next_header: 0,
            header: Vec::with_capacity(512),
            pax: Vec::new(),
            pax_left: 0,
        }
    }

    /// The SHA-256 of every byte read so far, lowercase hex.
    pub fn sha256(self) -> String {
        self.hash
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl<R: Read> Read for TarGuard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        let mut at = 0;
        while at < n {
            let pos = self.read + at as u64;
            if pos < self.next_header {
                let skip = (self.next_header - pos).min((n - at) as u64) as usize;
                if self.pax_left > 0 {
                    let take = skip.min(self.pax_left as usize);
                    self.pax.extend_from_slice(&buf[at..at + take]);
                    self.pax_left -= take as u64;
                    if self.pax_left == 0 {
                        let records = String::from_utf8_lossy(&self.pax);
                        if records.lines().any(|r| {
                            r.split_once(' ')
                                .is_some_and(|(_, kv)| kv.starts_with("size="))
                        }) {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                "a PAX header that sets an entry's size",
                            ));
                        }
                        self.pax.clear();
                    }
                }
                at += skip;
                continue;
            }
            let take = (512 - self.header.len()).min(n - at);
            self.header.extend_from_slice(&buf[at..at + take]);
            at += take;
            if self.header.len() == 512 {
                let (kind, size) = (self.header[156], header_size(&self.header));
                let metadata = matches!(kind, b'L' | b'K' | b'x' | b'g');
                if metadata && size > MAX_METADATA_ENTRY {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "a metadata entry (type {:?}) of {size} bytes, more than {MAX_METADATA_ENTRY}",
                            kind as char
                        ),
                    ));
                }
                self.next_header = self.read + at as u64 + size.div_ceil(512) * 512;
                if kind == b'x' || kind == b'g' {
                    self.pax_left = size;
                }
                self.header.clear();
            }
        }
        self.read += n as u64;
        Ok(n)
    }
}

/// The size field of a tar header: octal, or base-256 when its top bit is
/// set; an unreadable one counts as 0 (the tar crate then refuses it).
fn header_size(h: &[u8]) -> u64 {
    let f = &h[124..136];
    if f[0] & 0x80 != 0 {
        return f[1..].iter().fold(0u64, |v, b| {
            v.saturating_mul(256).saturating_add(u64::from(*b))
        });
    }
    let digits: String = f
        .iter()
        .take_while(|b| **b != 0)
        .map(|b| *b as char)
        .collect();
    u64::from_str_radix(digits.trim(), 8).unwrap_or(0)
}
