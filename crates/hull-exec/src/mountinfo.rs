//! Reading `/proc/self/mountinfo`.

pub use hull_protocol::mountinfo::unescape;

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

/// Whether a mountinfo table lists mount `id`.
pub fn has_mount(mountinfo: &str, id: u64) -> bool {
    mountinfo
        .lines()
        .any(|line| line.split(' ').next().and_then(|v| v.parse::<u64>().ok()) == Some(id))
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
        assert!(has_mount(table, 24) && !has_mount(table, 2) && !has_mount(table, 99));
    }
}
