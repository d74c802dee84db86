//! The server name a TLS ClientHello asks for (RFC 8446 4.1.2, RFC 6066 3),
//! read by the proxy before it connects anywhere: a `CONNECT` to an allowed
//! host whose ClientHello names another host is refused.
//!
//! Only what is needed is parsed, with every length checked against what
//! is there; the hello may span several TLS records (at most
//! [`MAX_HELLO`] bytes in all).

/// The most bytes of records the proxy reads for one ClientHello.
pub const MAX_HELLO: usize = 64 * 1024;

/// The content type of a TLS handshake record, the first byte of a
/// ClientHello.
pub const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST: u8 = 0;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SniError {
    #[error("not a TLS handshake (first byte {0:#04x})")]
    NotTls(u8),
    #[error("not a ClientHello")]
    NotClientHello,
    #[error("the ClientHello is malformed ({0})")]
    Malformed(&'static str),
    #[error("the ClientHello is longer than {MAX_HELLO} bytes")]
    TooLong,
    #[error("the ClientHello names no server (no SNI)")]
    NoName,
    #[error("the server name is not UTF-8 text")]
    NotText,
}

/// What the bytes read so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// More bytes are needed (at least this many more).
    Incomplete(usize),
    /// The server name.
    Name(String),
}

/// Parses the start of a TLS stream: the records carrying the ClientHello.
pub fn server_name(buf: &[u8]) -> Result<Hello, SniError> {
    if buf.len() > MAX_HELLO {
        return Err(SniError::TooLong);
    }
    // Join the handshake bytes of the records read so far.
    let mut handshake = Vec::new();
    let mut at = 0;
    loop {
        let Some(header) = buf.get(at..at + 5) else {
            return Ok(Hello::Incomplete(at + 5 - buf.len()));
        };
        if header[0] != RECORD_HANDSHAKE {
            return Err(SniError::NotTls(header[0]));
        }
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if len == 0 {
            return Err(SniError::Malformed("empty record"));
        }
        let Some(body) = buf.get(at + 5..at + 5 + len) else {
            return Ok(Hello::Incomplete(at + 5 + len - buf.len()));
        };
        handshake.extend_from_slice(body);
        at += 5 + len;
        if handshake.len() >= 4 {
            if handshake[0] != HANDSHAKE_CLIENT_HELLO {
                return Err(SniError::NotClientHello);
            }
            let want =
                u32::from_be_bytes([0, handshake[1], handshake[2], handshake[3]]) as usize + 4;
            if want > MAX_HELLO {
                return Err(SniError::TooLong);
            }
            if handshake.len() >= want {
                return hello_name(&handshake[4..want]).map(Hello::Name);
            }
        }
    }
}

/// A cursor that refuses to read past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], SniError> {
        if self.0.len() < n {
            return Err(SniError::Malformed(what));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, SniError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, SniError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one- or two-byte length prefix.
    fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], SniError> {
        let n = self.u8(what)? as usize;
        self.take(n, what)
    }

    fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], SniError> {
        let n = self.u16(what)? as usize;
        self.take(n, what)
    }
}

fn hello_name(body: &[u8]) -> Result<String, SniError> {
    let mut r = Reader(body);
    r.take(2, "version")?;
    r.take(32, "random")?;
    r.vec8("session id")?;
    r.vec16("cipher suites")?;
    r.vec8("compression methods")?;
    if r.0.is_empty() {
        return Err(SniError::NoName);
    }
    let mut exts = Reader(r.vec16("extensions")?);
    let mut found: Option<String> = None;
    while !exts.0.is_empty() {
        let kind = exts.u16("extension type")?;
        let data = exts.vec16("extension")?;
        if kind != EXT_SERVER_NAME {
            continue;
        }
        if found.is_some() {
            return Err(SniError::Malformed("two server_name extensions"));
        }
        let mut list = Reader(data);
        let mut names = Reader(list.vec16("server name list")?);
        while !names.0.is_empty() {
            let t = names.u8("name type")?;
            let name = names.vec16("host name")?;
            if t != NAME_TYPE_HOST {
                continue;
            }
            if found.is_some() {
                return Err(SniError::Malformed("two host names"));
            }
            let text = std::str::from_utf8(name).map_err(|_| SniError::NotText)?;
            found = Some(text.to_string());
        }
    }
    found.ok_or(SniError::NoName)
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A minimal ClientHello record naming `name` (none when `None`), with
    /// `pad` bytes of another extension before it.
    pub fn client_hello(name: Option<&str>, pad: usize) -> Vec<u8> {
        let mut ext = Vec::new();
        // A padding extension (21) first.
        ext.extend_from_slice(&21u16.to_be_bytes());
        ext.extend_from_slice(&(pad as u16).to_be_bytes());
        ext.extend(std::iter::repeat_n(0u8, pad));
        if let Some(n) = name {
            let mut entry = vec![0u8];
            entry.extend_from_slice(&(n.len() as u16).to_be_bytes());
            entry.extend_from_slice(n.as_bytes());
            let mut list = (entry.len() as u16).to_be_bytes().to_vec();
            list.extend(entry);
            ext.extend_from_slice(&0u16.to_be_bytes());
            ext.extend_from_slice(&(list.len() as u16).to_be_bytes());
            ext.extend(list);
        }
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        body.extend_from_slice(&[1, 0]); // null compression
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend(ext);
        let mut hs = vec![HANDSHAKE_CLIENT_HELLO];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend(body);
        records(&hs, 16 * 1024)
    }

    /// `hs` cut into handshake records of at most `max` bytes.
    pub fn records(hs: &[u8], max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in hs.chunks(max) {
            out.extend_from_slice(&[RECORD_HANDSHAKE, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    #[test]
    fn reads_the_name_and_waits_for_more_bytes() {
        let hello = client_hello(Some("pkgs.example"), 10);
        assert_eq!(server_name(&hello), Ok(Hello::Name("pkgs.example".into())));
        for cut in [0, 3, 5, 20, hello.len() - 1] {
            assert!(
                matches!(server_name(&hello[..cut]), Ok(Hello::Incomplete(n)) if n > 0),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_hello_over_several_records() {
        let one = client_hello(Some("a.example"), 3000);
        // Take the handshake back out and cut it into 1000-byte records.
        let hs = one[5..].to_vec();
        let many = records(&hs, 1000);
        assert!(many.len() > one.len());
        assert_eq!(server_name(&many), Ok(Hello::Name("a.example".into())));
    }

    #[test]
    fn what_is_refused() {
        assert_eq!(server_name(&client_hello(None, 4)), Err(SniError::NoName));
        assert_eq!(
            server_name(b"GET / HTTP/1.1\r\n"),
            Err(SniError::NotTls(b'G'))
        );
        let mut not_hello = client_hello(Some("a.example"), 0);
        not_hello[5] = 2; // ServerHello
        assert_eq!(server_name(&not_hello), Err(SniError::NotClientHello));
        // A length that points past the extension block.
        let mut bad = client_hello(Some("a.example"), 0);
        let n = bad.len();
        bad[n - 14] = 0xff;
        assert!(matches!(server_name(&bad), Err(SniError::Malformed(_))));
        // A handshake claiming more than the limit.
        let huge = records(&[1, 0x10, 0, 0], 16);
        assert_eq!(server_name(&huge), Err(SniError::TooLong));
    }
}
