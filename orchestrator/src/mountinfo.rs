//! Reading `/proc/self/mountinfo`.

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
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether mount `id` of a mountinfo table is mounted read-write (its
/// per-mount options, the sixth field).
pub fn mount_is_writable(mountinfo: &str, id: u64) -> bool {
    mountinfo.lines().any(|line| {
        let mut f = line.split(' ');
        f.next().and_then(|v| v.parse::<u64>().ok()) == Some(id)
            && f.nth(4)
                .is_some_and(|opts| opts.split(',').any(|o| o == "rw"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_options_decide() {
        let table = "22 1 0:21 / / rw,nosuid shared:1 - tmpfs tmpfs rw\n\
                     23 22 8:1 /home/u/p /home/u/p rw,relatime - ext4 /dev/sda1 rw\n\
                     24 22 8:1 /run /run ro,nosuid,relatime - ext4 /dev/sda1 rw\n";
        assert!(mount_is_writable(table, 23));
        assert!(!mount_is_writable(table, 24));
        assert!(!mount_is_writable(table, 99));
    }
}
