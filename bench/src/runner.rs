//! The load engine: opens the connections, spreads the requesters over them and
//! drives them closed-loop or at a fixed rate, first through the warm-up phase
//! (not recorded), then through the measured phase.
//!
//! Closed loop (etcd's benchmark tool's model): each requester sends, waits for the
//! response, sends the next; latency runs from send to response.
//!
//! Fixed rate (`--rate R`): request number i is due at `start + i / R`, whichever
//! requester takes it. A requester that is ahead of schedule sleeps until the due
//! time and measures from the moment it actually sends (timer slack is the
//! generator's, not the server's). A requester that is behind schedule, because
//! earlier responses were slow, sends at once and measures from the due time: the
//! wait the server caused is counted, so a stall cannot hide behind the few
//! requests that were in flight when it began (coordinated omission).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::config::{GlobalOpts, Stop};
use crate::grpc;
use crate::security::{self, Conn, Credentials};
use crate::stats::{Recorder, Report};
use crate::workload::{OpClient, Spec, Transport};
use crate::BenchError;

/// How long establishing one connection may take before requests fail.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the progress bar is redrawn.
const PROGRESS_TICK: Duration = Duration::from_millis(100);

/// Turns `host:port` into `http://host:port`, or `https://host:port` with TLS;
/// URLs with a scheme pass unchanged.
pub fn endpoint_url(endpoint: &str, tls: bool) -> String {
    let endpoint = endpoint.trim();
    if endpoint.contains("://") {
        endpoint.to_owned()
    } else if tls {
        format!("https://{endpoint}")
    } else {
        format!("http://{endpoint}")
    }
}

/// The client TLS configuration of `--cacert`, `--cert` and `--key`, if TLS is on.
pub fn tls_config(global: &GlobalOpts) -> Result<Option<ClientTlsConfig>, BenchError> {
    let Some(cacert) = &global.cacert else {
        return Ok(None);
    };
    let identity = global.cert.as_deref().zip(global.key.as_deref());
    security::client_tls_config(cacert, identity).map(Some)
}

/// `global.conns` lazy tonic channels, round-robin over the endpoints, each
/// with the endpoint it goes to.
fn channels(global: &GlobalOpts) -> Result<Vec<(String, Channel)>, BenchError> {
    let tls = tls_config(global)?;
    let endpoints = endpoints(global);
    (0..global.conns)
        .map(|i| {
            let raw = endpoints[i % endpoints.len()];
            let bad = |e: tonic::transport::Error| BenchError::Endpoint {
                endpoint: raw.clone(),
                reason: e.to_string(),
            };
            let mut endpoint =
                Endpoint::from_shared(endpoint_url(raw, tls.is_some())).map_err(bad)?;
            if let Some(tls) = &tls {
                endpoint = endpoint.tls_config(tls.clone()).map_err(bad)?;
            }
            let channel = endpoint
                .timeout(global.timeout)
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                .connect_lazy();
            Ok((raw.clone(), channel))
        })
        .collect()
}

fn endpoints(global: &GlobalOpts) -> Vec<&String> {
    global
        .endpoints
        .iter()
        .filter(|e| !e.trim().is_empty())
        .collect()
}

/// Runs `auth` over every channel concurrently as `user`; the first refusal
/// stops the run.
async fn authenticate_all<T, F, Fut>(
    channels: Vec<(String, Channel)>,
    user: &Credentials,
    auth: F,
) -> Result<Vec<T>, BenchError>
where
    T: Send + 'static,
    F: Fn(Channel, Credentials) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>> + Send + 'static,
{
    let tasks: Vec<_> = channels
        .into_iter()
        .map(|(endpoint, channel)| {
            let name = user.name.clone();
            let call = auth(channel, user.clone());
            tokio::spawn(async move {
                call.await.map_err(|status| BenchError::Auth {
                    user: name,
                    endpoint,
                    status: Box::new(status),
                })
            })
        })
        .collect();
    let mut done = Vec::with_capacity(tasks.len());
    for task in tasks {
        done.push(task.await.map_err(|e| BenchError::Task {
            workload: "authenticate",
            reason: e.to_string(),
        })??);
    }
    Ok(done)
}

/// Opens `global.conns` HTTP/2 connections through tonic, round-robin over
/// the endpoints. Without `--user` they connect lazily: an unreachable
/// endpoint shows up as counted `Unavailable` errors, not as a refusal to
/// start. With `--user` each connection authenticates once, now
/// (concurrently), and a refusal stops the run.
pub async fn connect(global: &GlobalOpts) -> Result<Vec<Conn>, BenchError> {
    let channels = channels(global)?;
    let Some(user) = &global.user else {
        return Ok(channels
            .into_iter()
            .map(|(_, c)| security::anonymous(c))
            .collect());
    };
    authenticate_all(channels, user, |channel, user| async move {
        security::authenticate(channel, &user).await
    })
    .await
}

/// The connections of the load generator's own gRPC client, as [`connect`]
/// opens tonic's: lazily, round-robin, each authenticated once with `--user`.
pub async fn connect_own(global: &GlobalOpts) -> Result<Vec<grpc::Channel>, BenchError> {
    let tokens: Vec<Option<String>> = match &global.user {
        None => vec![None; global.conns],
        Some(user) => {
            authenticate_all(channels(global)?, user, |channel, user| async move {
                security::token(channel, &user).await.map(Some)
            })
            .await?
        }
    };
    let endpoints = endpoints(global);
    Ok(tokens
        .into_iter()
        .enumerate()
        .map(|(i, token)| {
            let host_port = grpc::host_port(endpoints[i % endpoints.len()]);
            grpc::Channel::lazy(host_port, token, global.timeout)
        })
        .collect())
}

/// A progress bar on stderr, shown only on a terminal and never with `--json`.
pub struct Progress {
    bar: Option<ProgressBar>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    /// `done` counts completed requests; the bar tracks them against `stop`.
    pub fn start(enabled: bool, label: &str, stop: Stop, done: Arc<AtomicU64>) -> Progress {
        if !enabled || !std::io::stderr().is_terminal() {
            return Progress {
                bar: None,
                ticker: None,
            };
        }
        let (len, template) = match stop {
            Stop::Total(n) => (
                n,
                "{msg} [{bar:40}] {pos}/{len} requests {per_sec} ({eta} left)",
            ),
            Stop::Duration(d) => (
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
                "{msg} [{bar:40}] {elapsed}/{duration}",
            ),
        };
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(template)
                .expect("static progress template is valid")
                .progress_chars("=> "),
        );
        bar.set_message(label.to_owned());
        let started = Instant::now();
        let ticker = {
            let bar = bar.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(PROGRESS_TICK).await;
                    let pos = match stop {
                        Stop::Total(_) => done.load(Ordering::Relaxed),
                        Stop::Duration(_) => {
                            u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
                        }
                    };
                    bar.set_position(pos.min(len));
                }
            })
        };
        Progress {
            bar: Some(bar),
            ticker: Some(ticker),
        }
    }

    pub fn finish(self) {
        if let Some(t) = self.ticker {
            t.abort();
        }
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// The schedule of one phase.
#[derive(Debug, Clone, Copy)]
pub struct Phase {
    pub stop: Stop,
    pub rate_per_sec: Option<f64>,
}

/// Outcome of one phase: the requesters back, their merged samples, the wall time
/// from the phase start to the last response, and how many requests completed.
pub struct PhaseResult<C> {
    pub clients: Vec<C>,
    pub recorder: Recorder,
    pub elapsed: Duration,
    pub completed: u64,
}

/// Something `drive` can send requests with.
pub trait Requester: Send + 'static {
    fn issue(
        &mut self,
        rec: &mut Recorder,
    ) -> impl std::future::Future<Output = Result<(), tonic::Status>> + Send;
}

impl Requester for OpClient {
    fn issue(
        &mut self,
        rec: &mut Recorder,
    ) -> impl std::future::Future<Output = Result<(), tonic::Status>> + Send {
        OpClient::issue(self, rec)
    }
}

/// Runs one phase with every requester as its own task. `done` counts completed
/// requests for the progress bar.
pub async fn drive<C: Requester>(
    clients: Vec<C>,
    phase: Phase,
    done: Arc<AtomicU64>,
) -> Result<PhaseResult<C>, BenchError> {
    let next_seq = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = match phase.stop {
        Stop::Duration(d) => Some(start + d),
        Stop::Total(_) => None,
    };
    let mut tasks = Vec::with_capacity(clients.len());
    for mut client in clients {
        let next_seq = Arc::clone(&next_seq);
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            let mut rec = Recorder::new();
            let mut last_response = start;
            loop {
                let seq = next_seq.fetch_add(1, Ordering::Relaxed);
                if let Stop::Total(n) = phase.stop {
                    if seq >= n {
                        break;
                    }
                }
                let due = phase
                    .rate_per_sec
                    .map(|r| start + Duration::from_secs_f64(seq as f64 / r));
                let now = Instant::now();
                if let Some(deadline) = deadline {
                    if due.unwrap_or(now) >= deadline {
                        break;
                    }
                }
                let measured_from = match due {
                    Some(due) if due > now => {
                        tokio::time::sleep_until(due.into()).await;
                        Instant::now()
                    }
                    Some(due) => due,
                    None => now,
                };
                let outcome = client.issue(&mut rec).await;
                let finished = Instant::now();
                match outcome {
                    Ok(()) => rec.record_ok(finished - measured_from),
                    Err(status) => rec.record_error(&status),
                }
                last_response = last_response.max(finished);
                done.fetch_add(1, Ordering::Relaxed);
            }
            (client, rec, last_response)
        }));
    }
    let mut clients = Vec::with_capacity(tasks.len());
    let mut recorder = Recorder::new();
    let mut end = start;
    for task in tasks {
        let (client, rec, last) = task.await.map_err(|e| BenchError::Task {
            workload: "drive",
            reason: e.to_string(),
        })?;
        clients.push(client);
        recorder.merge(&rec);
        end = end.max(last);
    }
    let completed = recorder.ok_count() + recorder.error_count();
    Ok(PhaseResult {
        clients,
        recorder,
        elapsed: end - start,
        completed,
    })
}

/// The warm-up (when `--warmup` is set) and the measured phase of `clients`,
/// with a progress bar named `workload`; the measured phase and the requests
/// the warm-up completed.
pub async fn warm_up_and_measure<C: Requester>(
    global: &GlobalOpts,
    workload: &str,
    mut clients: Vec<C>,
    progress: bool,
) -> Result<(PhaseResult<C>, u64), BenchError> {
    let mut warmup_requests = 0;
    if !global.warmup().is_zero() {
        let warm = drive(
            clients,
            Phase {
                stop: Stop::Duration(global.warmup()),
                rate_per_sec: global.rate,
            },
            Arc::new(AtomicU64::new(0)),
        )
        .await?;
        warmup_requests = warm.completed;
        clients = warm.clients;
    }
    let done = Arc::new(AtomicU64::new(0));
    let bar = Progress::start(
        progress && !global.json,
        workload,
        global.stop(),
        Arc::clone(&done),
    );
    let measured = drive(
        clients,
        Phase {
            stop: global.stop(),
            rate_per_sec: global.rate,
        },
        done,
    )
    .await;
    bar.finish();
    Ok((measured?, warmup_requests))
}

/// Runs a request/response workload: setup, warm-up, measured phase, teardown.
pub async fn run(global: &GlobalOpts, spec: Spec, progress: bool) -> Result<Report, BenchError> {
    let transports: Vec<Transport> = if spec.unary_kv() && global.own_grpc_client() {
        connect_own(global)
            .await?
            .into_iter()
            .map(Transport::Cairn)
            .collect()
    } else {
        connect(global)
            .await?
            .into_iter()
            .map(Transport::Tonic)
            .collect()
    };
    let mut clients = Vec::with_capacity(global.clients);
    for i in 0..global.clients {
        let transport = transports[i % transports.len()].clone();
        let client = OpClient::setup(&spec, transport, i, global.clients, global.timeout)
            .await
            .map_err(|status| BenchError::Setup {
                workload: spec.name(),
                endpoint: global.endpoints[i % transports.len() % global.endpoints.len()].clone(),
                status: Box::new(status),
            })?;
        clients.push(client);
    }

    let (measured, warmup_requests) =
        warm_up_and_measure(global, spec.name(), clients, progress).await?;
    for client in measured.clients {
        client.teardown().await;
    }
    Ok(Report {
        workload: spec.name().to_owned(),
        system: None,
        clients: global.clients,
        conns: global.conns,
        target_rate_per_sec: global.rate,
        elapsed: measured.elapsed,
        warmup: global.warmup(),
        warmup_requests,
        recorder: measured.recorder,
        server_cpu_us_per_op: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers instantly except for one 300 ms stall on its 50th request.
    struct Stalling {
        calls: u64,
    }

    impl Requester for Stalling {
        #[allow(clippy::manual_async_fn)]
        fn issue(
            &mut self,
            _rec: &mut Recorder,
        ) -> impl std::future::Future<Output = Result<(), tonic::Status>> + Send {
            self.calls += 1;
            let stall = self.calls == 50;
            async move {
                if stall {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Ok(())
            }
        }
    }

    #[tokio::test]
    async fn fixed_rate_counts_the_stall_for_every_delayed_request() {
        // One requester at 200/s for 1 s: a 300 ms stall delays about 60 requests.
        let r = drive(
            vec![Stalling { calls: 0 }],
            Phase {
                stop: Stop::Duration(Duration::from_secs(1)),
                rate_per_sec: Some(200.0),
            },
            Arc::new(AtomicU64::new(0)),
        )
        .await
        .unwrap();
        let h = &r.recorder.latency_us;
        assert!(h.len() >= 190, "{} requests", h.len());
        let delayed = h.count_between(50_000, u64::MAX);
        assert!(delayed >= 40, "only {delayed} requests saw the stall");
        assert!(
            h.value_at_quantile(0.9) >= 50_000,
            "p90 {} us",
            h.value_at_quantile(0.9)
        );
    }

    #[tokio::test]
    async fn closed_loop_sees_the_stall_once() {
        let r = drive(
            vec![Stalling { calls: 0 }],
            Phase {
                stop: Stop::Total(200),
                rate_per_sec: None,
            },
            Arc::new(AtomicU64::new(0)),
        )
        .await
        .unwrap();
        assert_eq!(r.completed, 200);
        assert_eq!(r.recorder.latency_us.count_between(100_000, u64::MAX), 1);
    }

    #[test]
    fn endpoints_get_a_scheme() {
        assert_eq!(
            endpoint_url("127.0.0.1:2379", false),
            "http://127.0.0.1:2379"
        );
        assert_eq!(
            endpoint_url("127.0.0.1:2379", true),
            "https://127.0.0.1:2379"
        );
        assert_eq!(endpoint_url("https://a:1", false), "https://a:1");
        assert_eq!(endpoint_url("http://a:1", true), "http://a:1");
    }
}
