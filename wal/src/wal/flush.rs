//! The flush path: one batch at a time written and made durable, a spare
//! turned into the segment on its first batch, and the poisoning of the log
//! when a write or sync fails.

use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use tokio::time::Instant;

use tracing::{debug, error, info};

use super::{Batch, FlushEvent, Inner, BUF_POOL_MAX};
use crate::buf::{AlignedBuf, BLOCK_BYTES};
use crate::error::Poison;
use crate::record::SEGMENT_DATA_OFFSET;
use crate::storage::StorageFile;

impl Inner {
    fn poison(&self, file: PathBuf, offset: u64, e: &io::Error) {
        let p = Rc::new(Poison {
            file: file.clone(),
            offset,
            errno: e.raw_os_error(),
            message: e.to_string(),
        });
        error!(file = %file.display(), offset, error = %e, "wal write failed; refusing appends until reopened");
        {
            let mut st = self.st.borrow_mut();
            if st.poison.is_none() {
                st.poison = Some(p.clone());
            }
            st.batches.clear();
        }
        self.durable_tx.send_modify(|d| {
            if d.poison.is_none() {
                d.poison = Some(p);
            }
        });
        self.space_wake.notify_waiters();
    }

    /// The file a batch goes to, turning a spare into the segment on its first batch.
    async fn batch_file(&self, batch: &Batch) -> Result<Rc<dyn StorageFile>, (PathBuf, io::Error)> {
        let Some(name) = &batch.new_segment else {
            let st = self.st.borrow();
            let seg = st
                .segments
                .get(&batch.seq)
                .expect("segment of a queued batch");
            return Ok(seg.file.clone().expect("segment opened by its first batch"));
        };
        let path = self.storage.path_of(name);
        let mut waited = false;
        let spare = loop {
            {
                let mut st = self.st.borrow_mut();
                if let Some(s) = st.spares.pop_front() {
                    st.segments_awaiting_spare -= 1;
                    break s;
                }
                if let Some(e) = st.spare_error.take() {
                    return Err((path, e));
                }
                if st.poison.is_some() {
                    return Err((path, io::Error::other("wal poisoned")));
                }
                if !waited {
                    waited = true;
                    st.metrics.spare_waits += 1;
                }
            }
            self.maint_wake.notify_one();
            // A paced zero-fill is now due at full speed.
            self.zero_wake.notify_one();
            debug!(segment = %name, "wal flush waits for a spare segment");
            self.spare_ready.notified().await;
        };
        self.maint_wake.notify_one();
        self.storage
            .rename(&spare, name)
            .map_err(|e| (path.clone(), e))?;
        // The name must be durable before acknowledged records depend on it.
        self.storage
            .sync_dir()
            .await
            .map_err(|e| (path.clone(), e))?;
        let file = self
            .storage
            .open(name, false)
            .map_err(|e| (path.clone(), e))?;
        // The header is made durable on its own before any record: a tail
        // segment with valid records behind a bad header is then damage, never
        // a torn first write.
        let mut header = AlignedBuf::with_capacity(SEGMENT_DATA_OFFSET);
        header.extend_from_slice(&batch.buf[..SEGMENT_DATA_OFFSET]);
        let (_, r) = file.write_durable(0, header).await;
        r.map_err(|e| (path.clone(), e))?;
        self.st
            .borrow_mut()
            .segments
            .get_mut(&batch.seq)
            .expect("segment of a queued batch")
            .file = Some(file.clone());
        info!(segment = %name, "wal segment started");
        Ok(file)
    }
}

pub(super) async fn flusher(inner: Rc<Inner>) {
    loop {
        let batch = {
            let mut st = inner.st.borrow_mut();
            if st.poison.is_some() {
                return;
            }
            if st.batches.is_empty() {
                if st.closed {
                    return;
                }
                None
            } else {
                if st.batches.len() == 1 {
                    st.close_open_batch();
                }
                st.batches.pop_front()
            }
        };
        let Some(batch) = batch else {
            inner.flush_wake.notified().await;
            continue;
        };
        debug_assert!(batch.closed && batch.buf.len() % BLOCK_BYTES == 0);
        inner.st.borrow_mut().flush_in_flight = true;
        let file = match inner.batch_file(&batch).await {
            Ok(f) => f,
            Err((path, e)) => {
                inner.poison(path, 0, &e);
                return;
            }
        };
        let bytes = batch.buf.len();
        let t0 = Instant::now();
        let (buf, res) = file.write_durable(batch.start, batch.buf).await;
        let end = Instant::now();
        let latency = end - t0;
        if let Err(e) = res {
            let name = inner
                .st
                .borrow()
                .segments
                .get(&batch.seq)
                .map(|s| s.name.clone());
            let path = inner.storage.path_of(&name.unwrap_or_default());
            inner.poison(path, batch.start, &e);
            return;
        }
        let (event, zero_fill_due) = {
            let mut st = inner.st.borrow_mut();
            st.flush_in_flight = false;
            st.last_flush_end = end;
            if st.buf_pool.len() < BUF_POOL_MAX && buf.capacity() <= inner.cfg.max_batch_bytes * 2 {
                let mut buf = buf;
                buf.clear();
                st.buf_pool.push(buf);
            }
            st.durable_lsn = st.durable_lsn.max(batch.last_lsn);
            let m = &mut st.metrics;
            m.flushes += 1;
            m.bytes_written += bytes as u64;
            m.flush_latency_us
                .saturating_record(latency.as_micros() as u64);
            m.batch_appends.saturating_record(batch.appends as u64);
            m.batch_bytes.saturating_record(bytes as u64);
            if batch.seal {
                if let Some(seg) = st.segments.get_mut(&batch.seq) {
                    seg.sealed = true;
                }
                if st.collect_releasable() > 0 {
                    inner.maint_wake.notify_one();
                }
            }
            st.evict_cache(inner.cfg.tail_cache_bytes);
            let event = FlushEvent {
                appends: batch.appends,
                records: batch.records,
                bytes,
                latency,
                durable_lsn: st.durable_lsn,
            };
            (event, st.zero_fill_due(&inner.cfg))
        };
        if zero_fill_due {
            inner.zero_wake.notify_one();
        }
        let lsn = event.durable_lsn;
        inner.durable_tx.send_modify(|d| d.lsn = lsn);
        inner.space_wake.notify_waiters();
        if let Some(obs) = inner.observer.borrow_mut().as_mut() {
            obs(&event);
        }
    }
}
