//! Small files made durable atomically: written beside their place, synced,
//! renamed over the old one, and the directory synced, so a crash leaves
//! either the old file or the new one, whole. `member.toml`, a shard's
//! snapshot metadata, the auth state and auto-TLS certificates are written this way;
//! the small binary ones behind a CRC32 ([`write_checked`]).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Replaces `dir/name` with `bytes` atomically and durably; a new file gets
/// permission bits `mode` (less the umask).
pub fn write(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Makes the directory's entries (creates, renames, removes) durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Writes `body` behind its CRC32 (4 bytes, little-endian) to `dir/name`,
/// atomically and durably.
pub fn write_checked(dir: &Path, name: &str, body: &[u8]) -> std::io::Result<()> {
    let mut bytes = crc32fast::hash(body).to_le_bytes().to_vec();
    bytes.extend_from_slice(body);
    write(dir, name, &bytes, 0o644)
}

/// Reads a file written by [`write_checked`]: None when it does not exist, an
/// error when it is damaged.
pub fn read_checked(path: &Path) -> Result<Option<Vec<u8>>, String> {
    match std::fs::read(path) {
        Ok(bytes) => {
            if bytes.len() < 4 {
                return Err("shorter than its checksum".to_string());
            }
            let (crc, body) = bytes.split_at(4);
            if u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) != crc32fast::hash(body) {
                return Err("checksum mismatch".to_string());
            }
            Ok(Some(body.to_vec()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}
