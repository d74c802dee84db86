//! A script's `#!` line, as the kernel reads it: the interpreter both sides
//! name when a script cannot start because its interpreter is missing or
//! cannot run (`execve` says only "No such file" or "Permission denied",
//! about the script).

/// How much of a file the kernel reads for its `#!` line
/// (`BINPRM_BUF_SIZE`).
pub const HEAD_BYTES: usize = 256;

/// The interpreter `head` (a file's first bytes) names on its `#!` line:
/// `#!/usr/bin/env python3` is `/usr/bin/env`. `None` when `head` is not a
/// script or names nothing.
pub fn interpreter(head: &[u8]) -> Option<&[u8]> {
    let line = head.strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next().unwrap_or(line);
    let start = line.iter().position(|&b| b != b' ' && b != b'\t')?;
    let line = &line[start..];
    let end = line
        .iter()
        .position(|&b| b == b' ' || b == b'\t' || b == b'\r' || b == 0)
        .unwrap_or(line.len());
    Some(&line[..end]).filter(|i| !i.is_empty())
}

/// The interpreter named by the `#!` line of `file`, an opened regular
/// file (anything else names none): its first [`HEAD_BYTES`] read, as the
/// kernel reads them. The caller opens it (how, without following a link
/// or blocking on a FIFO, is the caller's concern: both sides do it their
/// own way).
pub fn interpreter_of(file: &std::fs::File) -> Option<Vec<u8>> {
    use std::io::Read;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut head = Vec::with_capacity(HEAD_BYTES);
    file.take(HEAD_BYTES as u64).read_to_end(&mut head).ok()?;
    interpreter(&head).map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interpreter_is_the_first_word_of_the_first_line() {
        for (head, want) in [
            (&b"#!/bin/sh\necho\n"[..], Some(&b"/bin/sh"[..])),
            (b"#! /usr/bin/env python3 -u\n", Some(b"/usr/bin/env")),
            (b"#!\t/no/such\r\n", Some(b"/no/such")),
            (b"#!relative", Some(b"relative")),
            (b"#!\n/bin/sh", None),
            (b"#!   ", None),
            (b"\x7fELF", None),
            (b"", None),
            (b" #!/bin/sh", None),
        ] {
            assert_eq!(interpreter(head), want, "{head:?}");
        }
    }

    #[test]
    fn a_file_s_interpreter_is_read_from_its_head_and_a_directory_has_none() {
        let d = std::env::temp_dir().join(format!("hull-shebang-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let script = d.join("s");
        let mut text = b"#!/opt/py -u\n".to_vec();
        text.resize(HEAD_BYTES * 4, b'x');
        std::fs::write(&script, &text).unwrap();
        let f = std::fs::File::open(&script).unwrap();
        assert_eq!(interpreter_of(&f).as_deref(), Some(&b"/opt/py"[..]));
        assert_eq!(interpreter_of(&std::fs::File::open(&d).unwrap()), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
