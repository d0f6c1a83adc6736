//! watch-latency: the time from sending a put to each watcher receiving its event.
//!
//! Watchers sit on one key (or, with `--whole-keyspace`, on every key), spread
//! over `--streams` bidirectional Watch streams.
//! Putters send puts on a fixed schedule (`--rate`, else `--put-rate`); each put's
//! value carries the moment it was sent, so a watcher computes the latency of
//! every event it receives without shared state. The clock starts when the put is
//! sent, not when its response arrives: the event may well arrive first.
//!
//! Value layout (little-endian): byte 0 is the phase (0 warm-up, 1 measured),
//! bytes 1..9 the send time in nanoseconds since the run's base instant, then
//! padding up to `--val-size`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::security::Conn;
use bytes::Bytes;
use cairn_proto::etcdserverpb::kv_client::KvClient;
use cairn_proto::etcdserverpb::watch_client::WatchClient;
use cairn_proto::etcdserverpb::watch_request::RequestUnion;
use cairn_proto::etcdserverpb::{PutRequest, WatchCreateRequest, WatchRequest};
use tokio::sync::{mpsc, watch as signal};

use crate::config::{GlobalOpts, Stop, WatchOpts};
use crate::runner::{connect, drive, Phase, Progress, Requester};
use crate::stats::{Recorder, Report};
use crate::BenchError;

const PHASE_OFFSET: usize = 0;
const SENT_NANOS_OFFSET: usize = PHASE_OFFSET + 1;
pub const VALUE_HEADER_BYTES: usize = SENT_NANOS_OFFSET + size_of::<u64>();
const PHASE_WARMUP: u8 = 0;
const PHASE_MEASURED: u8 = 1;

/// The key every watcher watches and every put writes.
pub const WATCH_KEY: &str = "cairn-bench/watch-latency";
/// How long a stream may take to confirm its watchers.
const WATCH_CREATE_TIMEOUT: Duration = Duration::from_secs(10);

struct StampedPut {
    kv: KvClient<Conn>,
    base: Instant,
    phase: u8,
    val_size_bytes: usize,
}

impl Requester for StampedPut {
    fn issue(
        &mut self,
        _rec: &mut Recorder,
    ) -> impl std::future::Future<Output = Result<(), tonic::Status>> + Send {
        let mut value = vec![0u8; self.val_size_bytes];
        value[PHASE_OFFSET] = self.phase;
        let sent_nanos = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        value[SENT_NANOS_OFFSET..VALUE_HEADER_BYTES].copy_from_slice(&sent_nanos.to_le_bytes());
        let request = PutRequest {
            key: Bytes::from_static(WATCH_KEY.as_bytes()),
            value: value.into(),
            ..Default::default()
        };
        let mut kv = self.kv.clone();
        async move {
            kv.put(request).await?;
            Ok(())
        }
    }
}

/// Latency of one received event, if it belongs to the measured phase.
fn event_latency(value: &[u8], base: Instant, received: Instant) -> Option<Duration> {
    if value.len() < VALUE_HEADER_BYTES || value[PHASE_OFFSET] != PHASE_MEASURED {
        return None;
    }
    let mut nanos = [0u8; 8];
    nanos.copy_from_slice(&value[SENT_NANOS_OFFSET..VALUE_HEADER_BYTES]);
    let sent = Duration::from_nanos(u64::from_le_bytes(nanos));
    Some(received.duration_since(base).saturating_sub(sent))
}

/// Opens one stream with `watchers` watchers on [`WATCH_KEY`] (on every key
/// with `whole_keyspace`) and waits until all are confirmed; then spawns its
/// reader, which records until `shutdown` flips.
async fn open_stream(
    channel: Conn,
    watchers: usize,
    whole_keyspace: bool,
    base: Instant,
    events: Arc<AtomicU64>,
    mut shutdown: signal::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<Recorder>, tonic::Status> {
    // The server answers the call only once it has a message to send (the first
    // `created`), so the create requests go in before the call.
    let (tx, rx) = mpsc::channel(watchers.max(1));
    for _ in 0..watchers {
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(if whole_keyspace {
                WatchCreateRequest {
                    key: Bytes::from_static(b"\0"),
                    range_end: Bytes::from_static(b"\0"),
                    ..Default::default()
                }
            } else {
                WatchCreateRequest {
                    key: Bytes::from_static(WATCH_KEY.as_bytes()),
                    ..Default::default()
                }
            })),
        };
        tx.send(create)
            .await
            .map_err(|_| tonic::Status::unavailable("watch stream closed during setup"))?;
    }
    let mut responses = tokio::time::timeout(
        WATCH_CREATE_TIMEOUT,
        WatchClient::new(channel).watch(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
    .await
    .map_err(|_| tonic::Status::deadline_exceeded("watch stream not opened in time"))??
    .into_inner();
    let mut created = 0;
    while created < watchers {
        let resp = tokio::time::timeout(WATCH_CREATE_TIMEOUT, responses.message())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("watchers not confirmed in time"))??
            .ok_or_else(|| tonic::Status::unavailable("watch stream ended during setup"))?;
        if resp.canceled {
            return Err(tonic::Status::failed_precondition(format!(
                "watch refused: {}",
                resp.cancel_reason
            )));
        }
        if resp.created {
            created += 1;
        }
    }
    Ok(tokio::spawn(async move {
        // Keeps the request side open: dropping it would end the stream.
        let _requests = tx;
        let mut rec = Recorder::new();
        loop {
            tokio::select! {
                biased;
                message = responses.message() => match message {
                    Ok(Some(resp)) => {
                        let received = Instant::now();
                        for event in resp.events {
                            let Some(kv) = event.kv else { continue };
                            if let Some(latency) = event_latency(&kv.value, base, received) {
                                rec.record_ok(latency);
                                events.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Ok(None) => {
                        rec.record_error_code("WatchStreamEnded");
                        break;
                    }
                    Err(status) => {
                        rec.record_error(&status);
                        break;
                    }
                },
                _ = shutdown.changed() => break,
            }
        }
        rec
    }))
}

pub async fn run(
    global: &GlobalOpts,
    opts: &WatchOpts,
    progress: bool,
) -> Result<Report, BenchError> {
    let channels = connect(global).await?;
    let base = Instant::now();
    let events = Arc::new(AtomicU64::new(0));
    let (shutdown_tx, shutdown_rx) = signal::channel(false);
    let mut readers = Vec::with_capacity(opts.streams);
    for s in 0..opts.streams {
        let reader = open_stream(
            channels[s % channels.len()].clone(),
            opts.watchers_per_stream,
            opts.whole_keyspace,
            base,
            Arc::clone(&events),
            shutdown_rx.clone(),
        )
        .await
        .map_err(|status| BenchError::Setup {
            workload: "watch-latency",
            endpoint: global.endpoints[s % channels.len() % global.endpoints.len()].clone(),
            status: Box::new(status),
        })?;
        readers.push(reader);
    }
    let watchers = (opts.streams * opts.watchers_per_stream) as u64;
    let rate = global.rate.unwrap_or(opts.put_rate);
    let putters = |phase: u8| -> Vec<StampedPut> {
        (0..global.clients)
            .map(|i| StampedPut {
                kv: KvClient::new(channels[i % channels.len()].clone()),
                base,
                phase,
                val_size_bytes: opts.val_size,
            })
            .collect()
    };

    let mut warmup_requests = 0;
    if !global.warmup().is_zero() {
        let warm = drive(
            putters(PHASE_WARMUP),
            Phase {
                stop: Stop::Duration(global.warmup()),
                rate_per_sec: Some(rate),
            },
            Arc::new(AtomicU64::new(0)),
        )
        .await?;
        warmup_requests = warm.completed;
    }

    let done = Arc::new(AtomicU64::new(0));
    let bar = Progress::start(
        progress && !global.json,
        "watch-latency",
        global.stop(),
        Arc::clone(&done),
    );
    let puts = drive(
        putters(PHASE_MEASURED),
        Phase {
            stop: global.stop(),
            rate_per_sec: Some(rate),
        },
        done,
    )
    .await;
    bar.finish();
    let puts = puts?;

    // Every measured put that succeeded owes one event to every watcher.
    let expected = puts.recorder.ok_count() * watchers;
    let drain_deadline = Instant::now() + opts.drain_timeout;
    while events.load(Ordering::Relaxed) < expected && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = shutdown_tx.send(true);

    let mut recorder = Recorder::new();
    for reader in readers {
        let rec = reader.await.map_err(|e| BenchError::Task {
            workload: "watch-latency",
            reason: e.to_string(),
        })?;
        recorder.merge(&rec);
    }
    let received = recorder.ok_count();
    recorder.record_errors("MissingEvent", expected.saturating_sub(received));
    for (code, n) in &puts.recorder.errors {
        recorder.record_errors(&format!("Put{code}"), *n);
    }
    recorder.counters.insert("puts", puts.recorder.ok_count());
    recorder.counters.insert("watchers", watchers);
    Ok(Report {
        workload: "watch-latency".to_owned(),
        system: None,
        clients: global.clients,
        conns: global.conns,
        target_rate_per_sec: Some(rate),
        elapsed: puts.elapsed,
        warmup: global.warmup(),
        warmup_requests,
        recorder,
        server_cpu_us_per_op: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_measured_values_yield_a_latency() {
        let base = Instant::now();
        let mut value = vec![0u8; 16];
        value[SENT_NANOS_OFFSET..VALUE_HEADER_BYTES].copy_from_slice(&1_000_000u64.to_le_bytes());
        let received = base + Duration::from_millis(3);
        assert_eq!(event_latency(&value, base, received), None, "warm-up phase");
        value[PHASE_OFFSET] = PHASE_MEASURED;
        assert_eq!(
            event_latency(&value, base, received),
            Some(Duration::from_millis(2))
        );
        assert_eq!(
            event_latency(&value[..4], base, received),
            None,
            "foreign value"
        );
    }
}
