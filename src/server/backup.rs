//! Backups: the file `etcdctl snapshot save` writes from a Cairn member
//! (Maintenance.Snapshot), written and read here; building a new cluster's
//! members from it (`--restore-snapshot`) is `member/restore.rs`.
//!
//! # File format (version 3)
//! All integers little-endian.
//! ```text
//! "CAIRNSNP"                  8 bytes of magic
//! version u32 = 3
//! shards u32                  the shard count of the cluster it came from
//! cluster_id u64, member_id u64   where it was taken (informational)
//! per shard, in shard order:
//!   shard u32, applied_index u64
//!   (len u32, store snapshot chunk of len bytes)*   the store's snapshot stream
//!   0xFFFF_FFFF               end of the shard
//! auth_len u32, auth_len bytes   the auth state (`cairnpb.AuthState`; version 2)
//! zero bytes                  padding to a multiple of 512 bytes
//! trailer, 32 bytes:          "CAIRNEND", body_len u64 (the bytes before the
//!                             padding), crc32 u32 (CRC-32 IEEE of those), 12 zero bytes
//! ```
//! The padding and the 32-byte trailer give the file the shape `etcdctl
//! snapshot save` checks for (etcd's files end in a 32-byte SHA-256 after
//! 512-byte pages); the trailer here is Cairn's own.
//! Each shard's part is its store's snapshot stream (`mvcc/FORMAT.md`), taken
//! at one point: a consistent image of that shard at `applied_index`. Shards are
//! taken one after another, so (like any multi-shard read) the file is not one
//! point in time across shards.
//!
//! # Restoring
//! Every member of the new cluster is started once with the same file and an
//! empty data directory: each shard's store is rebuilt from its part, and its
//! Raft log starts after the store's applied index (term 1) with the new
//! cluster's members, so all members start from the same log position. The
//! users, roles and permissions are restored with them (`auth.state`), as
//! etcd's snapshots carry its auth buckets. Version 1 files (no auth state)
//! are still read.
//!
//! Version 3 is version 2 with its keys placed by routing rule 2
//! ([`crate::routing::ROUTING_VERSION`]): each shard's part holds the keys that
//! rule gives the shard. A version 1 or 2 file of one shard restores as ever
//! (one shard holds every key whatever the rule); one of several shards was
//! placed by rule 1 and is refused, since its keys would sit on shards this
//! build never looks them up on.

use std::path::Path;

use bytes::Bytes;

pub const MAGIC: &[u8; 8] = b"CAIRNSNP";
pub const VERSION: u32 = 3;
/// The first file version whose keys are placed by routing rule 2.
const FIRST_VERSION_OF_ROUTING_2: u32 = 3;
const END_OF_SHARD: u32 = u32::MAX;

/// Builds the file's bytes piece by piece, keeping the running checksum.
#[derive(Default)]
pub struct BackupEncoder {
    crc: crc32fast::Hasher,
    len: u64,
}

const TRAILER_MAGIC: &[u8; 8] = b"CAIRNEND";
const TRAILER_BYTES: usize = 32;
const PAGE_BYTES: u64 = 512;

impl BackupEncoder {
    fn out(&mut self, bytes: Vec<u8>) -> Bytes {
        self.crc.update(&bytes);
        self.len += bytes.len() as u64;
        Bytes::from(bytes)
    }

    pub fn header(&mut self, shards: u32, cluster_id: u64, member_id: u64) -> Bytes {
        self.header_of_version(VERSION, shards, cluster_id, member_id)
    }

    fn header_of_version(
        &mut self,
        version: u32,
        shards: u32,
        cluster_id: u64,
        member_id: u64,
    ) -> Bytes {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&shards.to_le_bytes());
        b.extend_from_slice(&cluster_id.to_le_bytes());
        b.extend_from_slice(&member_id.to_le_bytes());
        self.out(b)
    }

    pub fn shard_start(&mut self, shard: u32, applied_index: u64) -> Bytes {
        let mut b = shard.to_le_bytes().to_vec();
        b.extend_from_slice(&applied_index.to_le_bytes());
        self.out(b)
    }

    pub fn chunk(&mut self, chunk: &[u8]) -> Bytes {
        let mut b = Vec::with_capacity(4 + chunk.len());
        b.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
        b.extend_from_slice(chunk);
        self.out(b)
    }

    pub fn shard_end(&mut self) -> Bytes {
        self.out(END_OF_SHARD.to_le_bytes().to_vec())
    }

    /// The auth state, after the last shard.
    pub fn auth(&mut self, state: &[u8]) -> Bytes {
        let mut b = (state.len() as u32).to_le_bytes().to_vec();
        b.extend_from_slice(state);
        self.out(b)
    }

    /// The padding and the trailer: the file's last bytes.
    pub fn finish(self) -> Bytes {
        let padding = (PAGE_BYTES - self.len % PAGE_BYTES) % PAGE_BYTES;
        let mut b = vec![0u8; padding as usize];
        b.extend_from_slice(TRAILER_MAGIC);
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.crc.finalize().to_le_bytes());
        b.extend_from_slice(&[0u8; 12]);
        Bytes::from(b)
    }
}

/// One shard's part of a backup.
pub struct ShardBackup {
    pub shard: u32,
    pub applied_index: u64,
    pub chunks: Vec<Vec<u8>>,
}

pub struct Backup {
    pub shards: u32,
    pub cluster_id: u64,
    pub parts: Vec<ShardBackup>,
    /// The encoded `cairnpb.AuthState` (empty in version 1 files).
    pub auth: Vec<u8>,
}

/// Reads and checks a backup file.
pub fn read_backup(path: &Path) -> Result<Backup, String> {
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_backup(&data).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse_backup(data: &[u8]) -> Result<Backup, String> {
    if data.len() < MAGIC.len() + 4 || &data[..MAGIC.len()] != MAGIC {
        return Err(
            "not a Cairn snapshot (it must come from `etcdctl snapshot save` \
                    against a Cairn member)"
                .to_string(),
        );
    }
    if data.len() < 8 + 4 + 4 + 8 + 8 + TRAILER_BYTES {
        return Err("shorter than its header and trailer".to_string());
    }
    let (rest, trailer) = data.split_at(data.len() - TRAILER_BYTES);
    if &trailer[..8] != TRAILER_MAGIC || trailer[20..].iter().any(|&b| b != 0) {
        return Err("no trailer: the file is incomplete".to_string());
    }
    let body_len = u64::from_le_bytes(trailer[8..16].try_into().expect("8 bytes"));
    let expected = u32::from_le_bytes(trailer[16..20].try_into().expect("4 bytes"));
    if body_len > rest.len() as u64 || rest[body_len as usize..].iter().any(|&b| b != 0) {
        return Err("checksum mismatch: the trailer does not fit the file".to_string());
    }
    let body = &rest[..body_len as usize];
    if crc32fast::hash(body) != expected {
        return Err("checksum mismatch: the file is damaged or incomplete".to_string());
    }
    let mut r = Reader { data: body, pos: 8 };
    let version = r.u32()?;
    if !(1..=VERSION).contains(&version) {
        return Err(format!(
            "snapshot version {version}; this build reads 1 to {VERSION}"
        ));
    }
    let shards = r.u32()?;
    if shards > 1 && version < FIRST_VERSION_OF_ROUTING_2 {
        return Err(format!(
            "snapshot version {version} of {shards} shards placed its keys by routing rule 1; \
             this build routes by rule {}: restore it with the build that took it and copy \
             its keys into a new cluster (`etcdctl make-mirror`)",
            crate::routing::ROUTING_VERSION
        ));
    }
    let cluster_id = r.u64()?;
    let _member_id = r.u64()?;
    let mut parts = Vec::with_capacity(shards as usize);
    for expected_shard in 0..shards {
        let shard = r.u32()?;
        if shard != expected_shard {
            return Err(format!(
                "shard {shard} where shard {expected_shard} was due"
            ));
        }
        let applied_index = r.u64()?;
        let mut chunks = Vec::new();
        loop {
            let len = r.u32()?;
            if len == END_OF_SHARD {
                break;
            }
            chunks.push(r.take(len as usize)?.to_vec());
        }
        parts.push(ShardBackup {
            shard,
            applied_index,
            chunks,
        });
    }
    let auth = if version >= 2 {
        let len = r.u32()?;
        r.take(len as usize)?.to_vec()
    } else {
        Vec::new()
    };
    if r.pos != body.len() {
        return Err(format!("{} bytes after the last shard", body.len() - r.pos));
    }
    Ok(Backup {
        shards,
        cluster_id,
        parts,
        auth,
    })
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        if self.data.len() - self.pos < n {
            return Err(format!("ends inside a field at byte {}", self.pos));
        }
        let b = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        sample_of(VERSION, 2)
    }

    fn sample_of(version: u32, shards: u32) -> Vec<u8> {
        let mut e = BackupEncoder::default();
        let mut out = Vec::new();
        out.extend_from_slice(&e.header_of_version(version, shards, 7, 9));
        for s in 0..shards {
            out.extend_from_slice(&e.shard_start(s, 100 + u64::from(s)));
            out.extend_from_slice(&e.chunk(b"first chunk"));
            out.extend_from_slice(&e.chunk(b""));
            out.extend_from_slice(&e.shard_end());
        }
        out.extend_from_slice(&e.auth(b"auth state"));
        out.extend_from_slice(&e.finish());
        out
    }

    #[test]
    fn a_backup_round_trips() {
        let b = parse_backup(&sample()).unwrap();
        assert_eq!((b.shards, b.cluster_id), (2, 7));
        assert_eq!(b.parts.len(), 2);
        assert_eq!(b.parts[1].applied_index, 101);
        assert_eq!(b.parts[0].chunks, vec![b"first chunk".to_vec(), Vec::new()]);
        assert_eq!(b.auth, b"auth state");
    }

    #[test]
    fn shards_placed_by_routing_rule_1_are_refused_and_one_shard_is_not() {
        let err = parse_backup(&sample_of(2, 2)).err().unwrap();
        assert!(err.contains("routing rule 1"), "{err}");
        assert_eq!(parse_backup(&sample_of(2, 1)).unwrap().parts.len(), 1);
        assert!(parse_backup(&sample_of(VERSION + 1, 1)).is_err());
    }

    #[test]
    fn damage_anywhere_is_refused() {
        let good = sample();
        for i in [0, 9, 20, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            assert!(parse_backup(&bad).is_err(), "flip at {i} accepted");
        }
        assert!(parse_backup(&good[..good.len() - 5]).is_err());
        // The shape etcdctl checks: 512-byte pages, then 32 bytes.
        assert_eq!(good.len() % 512, 32);
        assert!(parse_backup(b"SQLite format 3\0").is_err());
    }
}
