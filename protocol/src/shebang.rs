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
}
