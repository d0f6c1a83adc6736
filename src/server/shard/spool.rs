//! A snapshot stream received from a leader, spooled to a file in the
//! receiving shard's directory as it arrives, and read back one store chunk
//! at a time when Raft asks to install it: a snapshot never sits whole in
//! memory on the member that receives it.
//!
//! # The spool file
//! `<shard dir>/snapshot-incoming-<peer>-<stream id>-<attempt>-<nonce>` holds
//! the stream's bytes exactly as they came, in the layout
//! [`super::snapshots::StoreSnapshotSource`] sends (every length a
//! little-endian u32):
//!
//! ```text
//! +-----------+----------------------+-----------+-------------+-----------+----
//! | len: u32  | MsgSnap (protobuf,   | len: u32  | store chunk | len: u32  | ...
//! |           | context: members)    |           | (mvcc)      |           |
//! +-----------+----------------------+-----------+-------------+-----------+----
//! ```
//!
//! The file only has to last until the install that reads it, in the process
//! that wrote it. Crash cases: a file left by a crash, complete or not, is
//! deleted when the shard next opens ([`remove_leftovers`]), and Raft sends a
//! fresh snapshot. A file whose stream is aborted, goes over its limit or
//! cannot be written is deleted at once; one handed to the shard is deleted
//! when the shard drops it (replaced, refused, or installed).
//!
//! # Syncs
//! The writer syncs the file's data every [`SPOOL_SYNC_INTERVAL_BYTES`] and at
//! the end of the stream. Not for crash safety (see above) but because a
//! write-back error (ENOSPC on a file system with delayed allocation, EIO) is
//! reported only by a sync, and after one Linux may drop the dirty pages: the
//! install would then read what the disk has, not what was received. The
//! periodic sync also bounds the dirty page cache a stream builds up, so the
//! last sync, which the peer link waits for, is short.
//!
//! # Back of the envelope
//! The transport hands chunks of at most its `stream_chunk_bytes` (1 MiB by
//! default). At most [`SPOOL_QUEUE_CHUNKS`] wait for the writer; beyond that
//! the peer link waits, its inbound queue (`inbound_queue_batches`, 64 socket
//! reads of at most `read_buffer_bytes`, 1 MiB) fills, and the transport stops
//! acknowledging the stream, whose sender keeps at most `stream_window_chunks`
//! (8) unacknowledged. So a stream of any size holds at most ~80 MiB of
//! memory, and in practice far less (measured below).
//! The writer syncs every 64 MiB, so it goes at the disk's pace, not the page
//! cache's: at 500 MB/s of sequential writes a 4 GiB snapshot spools in ~9 s.
//! Reading it back
//! holds one store chunk (`mvcc::Config::snapshot_chunk_bytes`, 1 MiB by
//! default) at a time.
//!
//! Measured (2-core VM shared with other builds, loopback, 3 members): a
//! member catching up by a 300 MB, 600 MB or 1.2 GB snapshot peaked at
//! 130-190 MB of anonymous memory until the snapshot was received; with
//! jemalloc returning freed pages at once (`dirty_decay_ms:0`), its anonymous
//! memory stayed flat at 89-97 MB while 600 MB arrived in ~5 s. The 1.2 GB
//! one arrived in ~4.3 s.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use cairn_mvcc as mvcc;
use prost::Message as _;
use tokio::sync::{mpsc, oneshot};

use crate::raft;
use crate::routing::ShardId;

/// Names of spool files start with this, in the shard's directory.
pub const SPOOL_FILE_PREFIX: &str = "snapshot-incoming-";

/// Chunks that may wait for a stream's writer; the peer link waits beyond.
pub const SPOOL_QUEUE_CHUNKS: usize = 8;

/// Bytes written between two syncs of a spool file.
pub const SPOOL_SYNC_INTERVAL_BYTES: u64 = 64 << 20;

/// Largest `MsgSnap` at the head of a stream: its context carries the member
/// table and, for shard 0, the auth state.
pub const MAX_SNAPSHOT_MESSAGE_BYTES: u32 = 64 << 20;

/// Largest store chunk read back: a chunk holds at most
/// `snapshot_chunk_bytes` (itself at most a request) of records plus the one
/// record that crosses that size, which is at most a request.
pub const MAX_STORE_CHUNK_BYTES: u32 = 2 * mvcc::MAX_REQUEST_BYTES_LIMIT as u32;

const _: () = assert!(mvcc::MAX_REQUEST_BYTES_LIMIT <= (u32::MAX / 4) as usize);
const _: () = assert!(SPOOL_QUEUE_CHUNKS >= 1 && SPOOL_SYNC_INTERVAL_BYTES > 0);

/// Bytes of the length before each part of the stream.
const LEN_BYTES: u64 = size_of::<u32>() as u64;

/// Why a received snapshot stream was dropped, or its store could not be
/// read back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpoolError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} at offset {offset_bytes}: {what}")]
    Malformed {
        path: PathBuf,
        offset_bytes: u64,
        what: String,
    },
    #[error("the snapshot stream is over the limit of {limit_bytes} bytes")]
    OverLimit { limit_bytes: u64 },
    /// The writer stopped on an error it logged itself, naming the file.
    #[error("the writer of {path} stopped")]
    WriterGone { path: PathBuf },
}

/// A spool file's path; dropping it deletes the file.
#[derive(Debug)]
struct SpoolPath {
    path: PathBuf,
    /// Cleared once the file is deleted.
    armed: bool,
    /// Which thread deletes the file when it goes: the blocking pool's
    /// (`Own`), or the dropping thread (`Caller`: the simulation's, where a
    /// thread of the pool would race the next install or restart).
    deleter: SpoolWriterThread,
}

impl SpoolPath {
    fn remove_now(&mut self) {
        if std::mem::take(&mut self.armed) {
            remove_spool_file(&self.path);
        }
    }
}

impl Drop for SpoolPath {
    fn drop(&mut self) {
        if !std::mem::take(&mut self.armed) {
            return;
        }
        if self.deleter == SpoolWriterThread::Caller {
            remove_spool_file(&self.path);
            return;
        }
        // Unlinking a file of gigabytes takes a while: a core thread hands it
        // to the blocking pool.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let path = std::mem::take(&mut self.path);
                drop(rt.spawn_blocking(move || remove_spool_file(&path)));
            }
            Err(_) => remove_spool_file(&self.path),
        }
    }
}

fn remove_spool_file(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        // A snapshot install swapped the shard's directory away with it.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(
            file = %path.display(),
            error = %e,
            "cannot delete a snapshot spool file"
        ),
    }
}

/// A complete snapshot stream on disk, as the peer link hands it to the
/// shard: its `MsgSnap`, read from the head of the file, and its store chunks.
#[derive(Debug)]
pub struct SpooledSnapshot {
    message: raft::Message,
    chunks: SpooledChunks,
}

impl SpooledSnapshot {
    pub fn into_parts(self) -> (raft::Message, SpooledChunks) {
        (self.message, self.chunks)
    }
}

/// The store chunks of a spool file, read through the file handle it was
/// written with (so a snapshot install that swaps the shard's directory away
/// does not take them). Dropping it deletes the file.
#[derive(Debug)]
pub struct SpooledChunks {
    file: File,
    /// Where the first store chunk's length starts.
    start_offset_bytes: u64,
    /// The whole file's length, as written.
    len_bytes: u64,
    path: SpoolPath,
}

impl SpooledChunks {
    pub fn path(&self) -> &Path {
        &self.path.path
    }

    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// The store chunks in order, read one at a time.
    pub fn reader(&self) -> ChunkReader<'_> {
        ChunkReader {
            chunks: self,
            offset_bytes: self.start_offset_bytes,
            error: None,
        }
    }

    /// Deletes the file now, on this thread.
    pub fn remove(mut self) {
        self.path.remove_now();
    }
}

/// Reads a spool file's store chunks one at a time, for `mvcc::Store::restore`.
/// A chunk that cannot be read ends the iteration and is kept as the error
/// ([`ChunkReader::into_error`]); the restore then fails as incomplete.
pub struct ChunkReader<'a> {
    chunks: &'a SpooledChunks,
    offset_bytes: u64,
    error: Option<SpoolError>,
}

impl ChunkReader<'_> {
    /// Why the chunks ended before the end of the file, if they did.
    pub fn into_error(self) -> Option<SpoolError> {
        self.error
    }
}

impl Iterator for ChunkReader<'_> {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if self.error.is_some() || self.offset_bytes == self.chunks.len_bytes {
            return None;
        }
        let c = self.chunks;
        match read_part(
            &c.file,
            c.path(),
            self.offset_bytes,
            c.len_bytes,
            MAX_STORE_CHUNK_BYTES,
            "store chunk",
        ) {
            Ok(chunk) => {
                self.offset_bytes += LEN_BYTES + chunk.len() as u64;
                debug_assert!(self.offset_bytes <= c.len_bytes);
                Some(chunk)
            }
            Err(e) => {
                self.error = Some(e);
                None
            }
        }
    }
}

/// Reads the length-prefixed part at `offset_bytes` of a file of `len_bytes`;
/// the length is checked against `max_bytes` and the file before anything is
/// allocated for it.
fn read_part(
    file: &File,
    path: &Path,
    offset_bytes: u64,
    len_bytes: u64,
    max_bytes: u32,
    what: &str,
) -> Result<Vec<u8>, SpoolError> {
    let malformed = |what: String| SpoolError::Malformed {
        path: path.to_path_buf(),
        offset_bytes,
        what,
    };
    let io = |source| SpoolError::Io {
        op: "reading",
        path: path.to_path_buf(),
        source,
    };
    if len_bytes.saturating_sub(offset_bytes) < LEN_BYTES {
        return Err(malformed(format!(
            "the snapshot stream ends inside the length of the {what}"
        )));
    }
    let mut len = [0u8; LEN_BYTES as usize];
    file.read_exact_at(&mut len, offset_bytes).map_err(io)?;
    let len = u32::from_le_bytes(len);
    if len > max_bytes {
        return Err(malformed(format!(
            "a {what} of {len} bytes is over the limit of {max_bytes}"
        )));
    }
    if len_bytes - offset_bytes - LEN_BYTES < u64::from(len) {
        return Err(malformed(format!(
            "the snapshot stream ends inside the {what} ({len} bytes announced)"
        )));
    }
    let mut part = vec![0u8; len as usize];
    file.read_exact_at(&mut part, offset_bytes + LEN_BYTES)
        .map_err(io)?;
    Ok(part)
}

/// What the peer link asks of a stream's writer.
enum SpoolOp {
    Chunk(Bytes),
    Finish(oneshot::Sender<Result<SpooledSnapshot, SpoolError>>),
}

/// The receiving end of one snapshot stream attempt, on the peer link: the
/// bytes go to a writer thread that appends them to the spool file. Dropping
/// it aborts the stream, and the writer deletes the file.
pub struct StreamSpool {
    shard: ShardId,
    path: PathBuf,
    sink: Sink,
    received_bytes: u64,
    limit_bytes: u64,
}

/// Which thread writes a stream's spool file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpoolWriterThread {
    /// A thread of the stream's own, so that the peer link never waits for
    /// the disk: the daemon's.
    Own,
    /// The thread that appends, before each append returns: the
    /// simulation's, whose clock cannot see another thread.
    Caller,
}

/// Where a stream's bytes go.
enum Sink {
    /// To the stream's writer thread.
    Thread(mpsc::Sender<SpoolOp>),
    /// To the file, on the caller's thread: the simulation's streams, which
    /// a thread the simulated clock cannot see would make replay unevenly.
    Inline(SpoolWriter),
}

impl StreamSpool {
    /// Starts spooling attempt `attempt` of stream `stream_id` from member
    /// `peer` into `shard_dir`; the stream may carry at most `limit_bytes`.
    /// `writer` says which thread writes the file.
    pub fn start(
        shard_dir: &Path,
        shard: ShardId,
        peer: u64,
        stream_id: u64,
        attempt: u32,
        limit_bytes: u64,
        writer: SpoolWriterThread,
    ) -> Result<StreamSpool, SpoolError> {
        let path = spool_path(shard_dir, peer, stream_id, attempt);
        let sink = match writer {
            SpoolWriterThread::Own => {
                let (tx, rx) = mpsc::channel(SPOOL_QUEUE_CHUNKS);
                let writer_path = path.clone();
                std::thread::Builder::new()
                    .name(format!("snapshot-spool-{shard}"))
                    .spawn(move || write_spool(shard, peer, writer_path, rx))
                    .map_err(|source| SpoolError::Io {
                        op: "starting the writer thread of",
                        path: path.clone(),
                        source,
                    })?;
                Sink::Thread(tx)
            }
            SpoolWriterThread::Caller => Sink::Inline(SpoolWriter::create(path.clone(), writer)?),
        };
        Ok(StreamSpool {
            shard,
            path,
            sink,
            received_bytes: 0,
            limit_bytes,
        })
    }

    pub fn shard(&self) -> ShardId {
        self.shard
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Hands the next bytes of the stream to the writer, waiting while
    /// [`SPOOL_QUEUE_CHUNKS`] are queued. Fails (and the caller drops the
    /// stream) once the stream is over its limit or the writer has stopped.
    pub async fn append(&mut self, data: Bytes) -> Result<(), SpoolError> {
        self.received_bytes += data.len() as u64;
        if self.received_bytes > self.limit_bytes {
            return Err(SpoolError::OverLimit {
                limit_bytes: self.limit_bytes,
            });
        }
        match &mut self.sink {
            Sink::Thread(tx) => {
                tx.send(SpoolOp::Chunk(data))
                    .await
                    .map_err(|_| SpoolError::WriterGone {
                        path: self.path.clone(),
                    })
            }
            Sink::Inline(writer) => writer.write(&data),
        }
    }

    /// Ends the stream: once the writer has synced the file, its `MsgSnap`
    /// is read from its head.
    pub async fn finish(self) -> Result<SpooledSnapshot, SpoolError> {
        let gone = || SpoolError::WriterGone {
            path: self.path.clone(),
        };
        match self.sink {
            Sink::Thread(tx) => {
                let (reply, answer) = oneshot::channel();
                tx.send(SpoolOp::Finish(reply)).await.map_err(|_| gone())?;
                answer.await.map_err(|_| gone())?
            }
            Sink::Inline(writer) => writer.finish(),
        }
    }
}

/// A fresh spool file's path for one stream attempt; the nonce keeps an
/// attempt's file apart from a leftover of an earlier process.
fn spool_path(shard_dir: &Path, peer: u64, stream_id: u64, attempt: u32) -> PathBuf {
    let nonce: u32 = rand::random();
    shard_dir.join(format!(
        "{SPOOL_FILE_PREFIX}{peer:x}-{stream_id}-{attempt}-{nonce:08x}"
    ))
}

/// The writer thread of one stream: appends what the link sends until it
/// finishes the stream or drops it.
fn write_spool(shard: ShardId, peer: u64, path: PathBuf, mut rx: mpsc::Receiver<SpoolOp>) {
    let mut writer = match SpoolWriter::create(path, SpoolWriterThread::Own) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(shard, peer, error = %e, "snapshot stream dropped: cannot create its spool file");
            return;
        }
    };
    while let Some(op) = rx.blocking_recv() {
        match op {
            SpoolOp::Chunk(data) => {
                if let Err(e) = writer.write(&data) {
                    tracing::warn!(shard, peer, error = %e, "snapshot stream dropped: cannot write its spool file");
                    return;
                }
            }
            SpoolOp::Finish(reply) => {
                // A link gone by now drops the snapshot, and so the file.
                let _ = reply.send(writer.finish());
                return;
            }
        }
    }
    // The link dropped the stream: `writer` deletes the file.
}

/// A spool file being written.
struct SpoolWriter {
    file: File,
    written_bytes: u64,
    unsynced_bytes: u64,
    path: SpoolPath,
}

impl SpoolWriter {
    /// Creates the file at `path`; `deleter` deletes it when it goes.
    fn create(path: PathBuf, deleter: SpoolWriterThread) -> Result<SpoolWriter, SpoolError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|source| SpoolError::Io {
                op: "creating",
                path: path.clone(),
                source,
            })?;
        Ok(SpoolWriter {
            file,
            written_bytes: 0,
            unsynced_bytes: 0,
            path: SpoolPath {
                path,
                armed: true,
                deleter,
            },
        })
    }

    fn io(&self, op: &'static str) -> impl FnOnce(io::Error) -> SpoolError + '_ {
        move |source| SpoolError::Io {
            op,
            path: self.path.path.clone(),
            source,
        }
    }

    fn write(&mut self, data: &[u8]) -> Result<(), SpoolError> {
        self.file.write_all(data).map_err(self.io("writing"))?;
        self.written_bytes += data.len() as u64;
        self.unsynced_bytes += data.len() as u64;
        if self.unsynced_bytes >= SPOOL_SYNC_INTERVAL_BYTES {
            self.file.sync_data().map_err(self.io("syncing"))?;
            self.unsynced_bytes = 0;
        }
        Ok(())
    }

    fn finish(self) -> Result<SpooledSnapshot, SpoolError> {
        self.file.sync_data().map_err(self.io("syncing"))?;
        let path = &self.path.path;
        let head = read_part(
            &self.file,
            path,
            0,
            self.written_bytes,
            MAX_SNAPSHOT_MESSAGE_BYTES,
            "message",
        )?;
        let message =
            raft::Message::decode(head.as_slice()).map_err(|e| SpoolError::Malformed {
                path: path.clone(),
                offset_bytes: 0,
                what: format!("the snapshot message does not decode: {e}"),
            })?;
        Ok(SpooledSnapshot {
            message,
            chunks: SpooledChunks {
                file: self.file,
                start_offset_bytes: LEN_BYTES + head.len() as u64,
                len_bytes: self.written_bytes,
                path: self.path,
            },
        })
    }
}

/// Deletes the spool files in `shard_dir` that a crash, or a stream cut short
/// by one, left behind; returns how many.
pub fn remove_leftovers(shard_dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(shard_dir)? {
        let entry = entry?;
        let is_spool = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(SPOOL_FILE_PREFIX));
        if is_spool {
            // The writer of an abandoned stream may delete it meanwhile.
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}

/// Spools `parts` as a stream from a leader would be, on this thread.
#[cfg(test)]
pub(super) fn spool_for_test(
    dir: &Path,
    name: &str,
    parts: &[&[u8]],
) -> Result<SpooledSnapshot, SpoolError> {
    let mut writer = SpoolWriter::create(
        dir.join(format!("{SPOOL_FILE_PREFIX}{name}")),
        SpoolWriterThread::Own,
    )?;
    for p in parts {
        writer.write(p)?;
    }
    writer.finish()
}

#[cfg(test)]
#[path = "spool_tests.rs"]
mod tests;
