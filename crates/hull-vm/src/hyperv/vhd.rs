//! Fixed VHD footers: the guest image recipe makes raw ext4 disk images;
//! Hyper-V attaches VHD or VHDX files only. A fixed VHD is the raw image
//! followed by one 512-byte footer, so hull converts an image by appending
//! [`footer`] (no tool, no copy) and checks an existing one with [`parse`].

/// Size of the footer.
pub const FOOTER_LEN: usize = 512;
/// Seconds from the Unix epoch to the VHD epoch (2000-01-01 00:00:00 UTC).
const VHD_EPOCH: u64 = 946_684_800;

/// Errors reading a footer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VhdError {
    #[error("disk size {0} is not a positive multiple of 512 bytes")]
    BadSize(u64),
    #[error("not a VHD footer (cookie)")]
    Cookie,
    #[error("VHD footer checksum mismatch")]
    Checksum,
    #[error("not a fixed VHD (disk type {0})")]
    NotFixed(u32),
}

/// Cylinders, heads, sectors per track, by the algorithm of the VHD
/// specification (appendix "CHS calculation").
pub fn geometry(size: u64) -> (u16, u8, u8) {
    let mut total = size / 512;
    if total > 65535 * 16 * 255 {
        total = 65535 * 16 * 255;
    }
    let (spt, heads, cth);
    if total >= 65535 * 16 * 63 {
        spt = 255u64;
        heads = 16u64;
        cth = total / spt;
    } else {
        let mut s = 17u64;
        let mut c = total / s;
        let mut h = c.div_ceil(1024).max(4);
        if c >= h * 1024 || h > 16 {
            s = 31;
            h = 16;
            c = total / s;
        }
        if c >= h * 1024 {
            s = 63;
            h = 16;
            c = total / s;
        }
        spt = s;
        heads = h;
        cth = c;
    }
    ((cth / heads) as u16, heads as u8, spt as u8)
}

fn checksum(f: &[u8; FOOTER_LEN]) -> u32 {
    let sum: u32 = f
        .iter()
        .enumerate()
        .filter(|(i, _)| !(64..68).contains(i))
        .fold(0u32, |a, (_, b)| a.wrapping_add(u32::from(*b)));
    !sum
}

/// The footer of a fixed VHD for a raw image of `size` bytes, created at
/// `unix_time`, with the 16-byte `unique_id`.
pub fn footer(
    size: u64,
    unix_time: u64,
    unique_id: [u8; 16],
) -> Result<[u8; FOOTER_LEN], VhdError> {
    if size == 0 || !size.is_multiple_of(512) {
        return Err(VhdError::BadSize(size));
    }
    let mut f = [0u8; FOOTER_LEN];
    f[0..8].copy_from_slice(b"conectix");
    f[8..12].copy_from_slice(&2u32.to_be_bytes()); // features: reserved bit set
    f[12..16].copy_from_slice(&0x0001_0000u32.to_be_bytes()); // format version 1.0
    f[16..24].copy_from_slice(&u64::MAX.to_be_bytes()); // data offset: none (fixed)
    let ts = unix_time.saturating_sub(VHD_EPOCH) as u32;
    f[24..28].copy_from_slice(&ts.to_be_bytes());
    f[28..32].copy_from_slice(b"hull");
    f[32..36].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    f[36..40].copy_from_slice(b"Wi2k");
    f[40..48].copy_from_slice(&size.to_be_bytes()); // original size
    f[48..56].copy_from_slice(&size.to_be_bytes()); // current size
    let (c, h, s) = geometry(size);
    f[56..58].copy_from_slice(&c.to_be_bytes());
    f[58] = h;
    f[59] = s;
    f[60..64].copy_from_slice(&2u32.to_be_bytes()); // disk type: fixed
    f[68..84].copy_from_slice(&unique_id);
    let sum = checksum(&f);
    f[64..68].copy_from_slice(&sum.to_be_bytes());
    Ok(f)
}

/// Checks a footer and returns the disk size it describes.
pub fn parse(f: &[u8; FOOTER_LEN]) -> Result<u64, VhdError> {
    if &f[0..8] != b"conectix" {
        return Err(VhdError::Cookie);
    }
    let want = u32::from_be_bytes([f[64], f[65], f[66], f[67]]);
    if checksum(f) != want {
        return Err(VhdError::Checksum);
    }
    let kind = u32::from_be_bytes([f[60], f[61], f[62], f[63]]);
    if kind != 2 {
        return Err(VhdError::NotFixed(kind));
    }
    let mut sz = [0u8; 8];
    sz.copy_from_slice(&f[48..56]);
    Ok(u64::from_be_bytes(sz))
}

/// Appends a footer to a raw image file unless it already ends with a valid
/// one for its size. Returns true when it appended.
pub fn ensure_fixed_vhd(path: &std::path::Path, unique_id: [u8; 16]) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let len = f.metadata()?.len();
    if len >= FOOTER_LEN as u64 {
        let mut tail = [0u8; FOOTER_LEN];
        f.seek(SeekFrom::Start(len - FOOTER_LEN as u64))?;
        f.read_exact(&mut tail)?;
        if parse(&tail) == Ok(len - FOOTER_LEN as u64) {
            return Ok(false);
        }
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(VHD_EPOCH);
    let footer = footer(len, now, unique_id)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    f.seek(SeekFrom::End(0))?;
    f.write_all(&footer)?;
    f.sync_all()?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_follows_the_specification() {
        // 1 GiB: 2097152 sectors -> 63 sectors, 16 heads, 2080 cylinders
        assert_eq!(geometry(1 << 30), (2080, 16, 63));
        // small disks use 17 sectors per track and at least 4 heads
        assert_eq!(geometry(10 << 20), (301, 4, 17));
        // the largest geometry is capped
        assert_eq!(geometry(4 << 40), (65535, 16, 255));
    }

    #[test]
    fn footer_round_trips_and_detects_damage() {
        let f = footer(8 << 20, VHD_EPOCH + 100, [7; 16]).unwrap();
        assert_eq!(&f[0..8], b"conectix");
        assert_eq!(u32::from_be_bytes([f[24], f[25], f[26], f[27]]), 100);
        assert_eq!(parse(&f), Ok(8 << 20));
        let mut bad = f;
        bad[100] ^= 1;
        assert_eq!(parse(&bad), Err(VhdError::Checksum));
        assert_eq!(footer(1000, 0, [0; 16]), Err(VhdError::BadSize(1000)));
    }

    #[test]
    fn ensure_appends_once_to_a_real_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("root.img");
        std::fs::write(&p, vec![0xABu8; 4096]).unwrap();
        assert!(ensure_fixed_vhd(&p, [1; 16]).unwrap());
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 4096 + 512);
        assert!(
            !ensure_fixed_vhd(&p, [1; 16]).unwrap(),
            "second call appends nothing"
        );
        let data = std::fs::read(&p).unwrap();
        assert!(
            data[..4096].iter().all(|b| *b == 0xAB),
            "the image is unchanged"
        );
        let tail: [u8; 512] = data[4096..].try_into().unwrap();
        assert_eq!(parse(&tail), Ok(4096));
    }
}
