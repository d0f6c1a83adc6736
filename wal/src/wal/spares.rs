//! Spare segments: zero-filled ahead of need, recycled from released
//! segments and zero-filled again before reuse, so the space past the end
//! of the log always reads as zeros (see `wal/FORMAT.md`). The zero-filling
//! writes take turns with the log's flushes as `pacing` decides.

use std::io;
use std::rc::Rc;
use tokio::time::Instant;

use tracing::{debug, warn};

use super::{spare_name, Inner};
use crate::buf::AlignedBuf;
use crate::storage::StorageFile;

impl Inner {
    async fn prepare_spare(&self) -> io::Result<String> {
        let name = {
            let mut st = self.st.borrow_mut();
            st.next_spare_id += 1;
            spare_name(st.next_spare_id)
        };
        let result = async {
            let file = self.storage.open(&name, true)?;
            file.set_len(self.cfg.segment_size_bytes)?;
            self.zero_fill(file.as_ref()).await?;
            self.storage.sync_dir().await?;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => Ok(name),
            Err(e) => {
                let _ = self.storage.remove(&name);
                Err(e)
            }
        }
    }

    /// Zero-fills a spare that may hold old bytes. On failure the file stays
    /// where it is, out of the pool; the next open zero-fills it again.
    async fn clean_spare(&self, name: &str) -> io::Result<()> {
        let file = self.storage.open(name, false)?;
        if file.size_bytes()? != self.cfg.segment_size_bytes {
            file.set_len(self.cfg.segment_size_bytes)?;
        }
        self.zero_fill(file.as_ref()).await
    }

    /// Writes zeros over the whole segment-sized `file` and syncs it, one
    /// chunk at a time when [`Inner::zero_fill_turn`] allows.
    async fn zero_fill(&self, file: &dyn StorageFile) -> io::Result<()> {
        let size = self.cfg.segment_size_bytes;
        self.st.borrow_mut().zero_fill_left_bytes = Some(size);
        let r = async {
            // Writing real zeros (not just fallocate) means a later data sync
            // never converts extents or changes metadata.
            let mut zeros = AlignedBuf::with_capacity(self.cfg.zero_chunk_bytes);
            zeros.extend_zeros(self.cfg.zero_chunk_bytes);
            let mut off = 0u64;
            while off < size {
                let busy = self.zero_fill_turn().await?;
                let n = (size - off).min(self.cfg.zero_chunk_bytes as u64);
                zeros.set_len(n as usize);
                let (b, r) = file.write_at(off, zeros).await;
                zeros = b;
                r?;
                off += n;
                let mut st = self.st.borrow_mut();
                st.zero_fill_left_bytes = Some(size - off);
                st.metrics.zero_fill_bytes += n;
                if busy {
                    st.metrics.zero_fill_busy_bytes += n;
                }
            }
            // The closing sync is never held back: the chunks are written.
            self.st.borrow_mut().zero_fill_left_bytes = None;
            file.sync_data().await
        }
        .await;
        self.st.borrow_mut().zero_fill_left_bytes = None;
        r
    }

    /// Resolves when the next zero chunk may be written: at once when it is
    /// due to keep ahead of the log or the log is idle (or poisoned: nothing
    /// waits on the disk then); otherwise on the flusher's word that it has
    /// fallen due, or once the log has gone idle. Says whether the chunk goes
    /// out beside a busy log.
    async fn zero_fill_turn(&self) -> io::Result<bool> {
        loop {
            let wait = {
                let st = self.st.borrow();
                if st.closed {
                    return Err(io::Error::other("wal closing"));
                }
                if st.poison.is_some() {
                    return Ok(false);
                }
                if st.zero_fill_due(&self.cfg) {
                    return Ok(true);
                }
                let now = Instant::now();
                match st.log_idle_at() {
                    Some(at) if at <= now => return Ok(false),
                    Some(at) => at - now,
                    None => super::pacing::ZERO_FILL_IDLE,
                }
            };
            let _ = tokio::time::timeout(wait, self.zero_wake.notified()).await;
        }
    }
}

pub(super) async fn maintenance(inner: Rc<Inner>) {
    // After a failed preparation, try again only when woken (by the flusher
    // needing a segment, or by a release that may have freed space).
    let mut retry = false;
    loop {
        let (closed, recycle, dirty, want_spare) = {
            let mut st = inner.st.borrow_mut();
            let closed = st.closed || st.poison.is_some();
            let recycle = st.to_recycle.pop_front();
            let may = st.spare_error.is_none() || retry;
            // It stays listed until it is clean, so `settle` sees the work.
            let dirty = if recycle.is_none() && may {
                st.dirty_spares.front().cloned()
            } else {
                None
            };
            let want = st.spares.len() + st.dirty_spares.len() < inner.cfg.spare_segments && may;
            (closed, recycle, dirty, want)
        };
        if closed {
            return;
        }
        if let Some(name) = recycle {
            recycle_segment(&inner, name).await;
            continue;
        }
        let prepared = if let Some(name) = dirty {
            retry = false;
            let r = inner.clean_spare(&name).await;
            inner.st.borrow_mut().dirty_spares.retain(|d| *d != name);
            r.map(|()| name)
        } else if want_spare {
            retry = false;
            inner.prepare_spare().await
        } else {
            inner.maint_wake.notified().await;
            retry = true;
            continue;
        };
        match prepared {
            Ok(name) => {
                debug!(spare = %name, "wal spare segment zero-filled");
                let mut st = inner.st.borrow_mut();
                st.spares.push_back(name);
                st.spare_error = None;
            }
            Err(e) => {
                if !inner.st.borrow().closed {
                    warn!(error = %e, dir = %inner.cfg.dir.display(), "wal could not prepare a spare segment");
                }
                inner.st.borrow_mut().spare_error = Some(e);
            }
        }
        inner.spare_ready.notify_one();
    }
}

async fn recycle_segment(inner: &Inner, name: String) {
    let keep = {
        let st = inner.st.borrow();
        st.spares.len() + st.dirty_spares.len() < inner.cfg.max_spare_segments
    };
    let r = if keep {
        let spare = {
            let mut st = inner.st.borrow_mut();
            st.next_spare_id += 1;
            spare_name(st.next_spare_id)
        };
        match inner.storage.rename(&name, &spare) {
            // One rename per directory sync: a crash never leaves a gap in
            // the sequence of segments.
            Ok(()) => inner.storage.sync_dir().await.map(|()| Some(spare)),
            Err(e) => Err(e),
        }
    } else {
        match inner.storage.remove(&name) {
            Ok(()) => inner.storage.sync_dir().await.map(|()| None),
            Err(e) => Err(e),
        }
    };
    match r {
        Ok(spare) => {
            let mut st = inner.st.borrow_mut();
            st.metrics.segments_recycled += 1;
            if let Some(s) = spare {
                // Its old records stay until it is zero-filled, before reuse.
                debug!(segment = %name, spare = %s, "wal segment recycled");
                st.dirty_spares.push_back(s);
            }
        }
        Err(e) => {
            // Later segments stay in place; recycling resumes at the next open.
            warn!(segment = %name, error = %e, "wal could not recycle segment");
            inner.st.borrow_mut().to_recycle.clear();
        }
    }
}
