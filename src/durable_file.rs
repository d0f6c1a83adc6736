//! Small files made durable atomically: written beside their place, synced,
//! renamed over the old one, and the directory synced, so a crash leaves
//! either the old file or the new one, whole. `member.toml`, a shard's
//! snapshot metadata and auto-TLS certificates are written this way.

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
