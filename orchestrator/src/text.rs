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

    #[test]
    fn escapes_controls_and_invisible_formatting() {
        assert_eq!(
            printable("a\x1b[2Jb\u{202e}c\r\n\td\u{9b}"),
            "a\\x1b[2Jb\\u{202e}c\n\td\\x9b"
        );
    }
}
