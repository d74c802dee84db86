//! Text from outside hull (the guest, the command) made safe to show on
//! the user's terminal, and hex.

/// Lowercase hex of `b` (digests, ids, disk names).
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `text` with every control character but newline and tab escaped
/// (carriage returns dropped), and the invisible formatting characters that
/// reorder or hide text (bidirectional overrides, zero-width ones).
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\r' {
            continue; // serial consoles end lines with CR LF
        }
        let invisible = matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}');
        if invisible {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// `text` on one line: [`printable`], and a newline or tab escaped too
/// (a reason or message that may carry a name the command chose).
pub fn one_line(text: &str) -> String {
    printable(text).replace('\n', "\\n").replace('\t', "\\t")
}

/// A path (or link target) from a tree the command wrote, quoted as git
/// quotes paths (`core.quotePath`, its default): as it is when every byte
/// is printable ASCII other than `"` and `\`, else in double quotes with
/// C escapes (`\n`, `\t`, `\"`, `\\` ...) and every other control or
/// non-ASCII byte in octal (`\303\251`). A name cannot forge a line, hide
/// behind invisible characters, or pass for another.
pub fn quote_path(path: &str) -> String {
    let plain = |b: u8| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
    if path.bytes().all(plain) {
        return path.to_string();
    }
    let mut out = String::with_capacity(path.len() + 8);
    out.push('"');
    for b in path.bytes() {
        match b {
            0x07 => out.push_str("\\a"),
            0x08 => out.push_str("\\b"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            0x0b => out.push_str("\\v"),
            0x0c => out.push_str("\\f"),
            b'\r' => out.push_str("\\r"),
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b if plain(b) => out.push(b as char),
            b => out.push_str(&format!("\\{b:03o}")),
        }
    }
    out.push('"');
    out
}

/// `s` for HTML text and attribute values: `& < > " '` escaped, control
/// characters but newline replaced (U+FFFD).
pub fn html_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c if c.is_control() && c != '\n' => o.push('\u{fffd}'),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names quoted as git itself quotes them (`git ls-files --others`,
    /// core.quotePath at its default), the real git on real files.
    #[test]
    // A tree built by path for git to list.
    #[allow(clippy::disallowed_methods)]
    fn paths_are_quoted_as_git_quotes_them() {
        let t = tempfile::tempdir().unwrap();
        let names = [
            "plain name.txt",
            "a\n+ M etc-passwd",
            "tab\there",
            "quote\"d",
            "back\\slash",
            "caf\u{e9}",
            "\u{202e}txt.exe",
            "bell\u{7}del\u{7f}",
        ];
        for n in names {
            std::fs::write(t.path().join(n), "x").unwrap();
        }
        let o = std::process::Command::new("git")
            .arg("-C")
            .arg(t.path())
            .args(["-c", "core.quotePath=true", "init", "-q"])
            .status()
            .unwrap();
        assert!(o.success());
        let o = std::process::Command::new("git")
            .arg("-C")
            .arg(t.path())
            .args(["ls-files", "--others"])
            .output()
            .unwrap();
        let mut git: Vec<String> = String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        let mut ours: Vec<String> = names.iter().map(|n| quote_path(n)).collect();
        git.sort();
        ours.sort();
        assert_eq!(ours, git);
        assert!(ours.iter().all(|q| !q.contains('\n')));
        assert_eq!(quote_path("plain name.txt"), "plain name.txt");
    }

    #[test]
    fn escapes_controls_and_invisible_formatting() {
        assert_eq!(
            printable("a\x1b[2Jb\u{202e}c\r\n\td\u{9b}"),
            "a\\x1b[2Jb\\u{202e}c\n\td\\x9b"
        );
    }
}
