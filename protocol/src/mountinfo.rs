//! `/proc/self/mountinfo` fields, as both sides read them (hull on the
//! host, the agent in the guest): one decoder for both.

/// A field of `/proc/self/mountinfo` with its `\ooo` escapes (space, tab,
/// newline, backslash) decoded.
pub fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = u32::from(b[i + 1] - b'0') * 64
                + u32::from(b[i + 2] - b'0') * 8
                + u32::from(b[i + 3] - b'0');
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_decoded_and_the_rest_kept() {
        assert_eq!(unescape("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape("/a\\011\\012\\134"), "/a\t\n\\");
        assert_eq!(unescape("/a\\04"), "/a\\04");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
