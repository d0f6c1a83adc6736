//! Loopback throughput of the peer transport.
//!
//! `cargo run --release -p cairn-net --example netbench -- --frame-bytes B --seconds S [--raw]`
//!
//! Two threads, each a current-thread runtime with a `LocalSet` like a core:
//! one dials and sends `B`-byte message frames as fast as its queue takes them,
//! the other accepts and counts what arrives. With `--raw` the same payload
//! bytes go over a plain TCP socket with no framing, handshake or queue: the
//! ceiling. Prints a table, then one JSON line (last) with `frame_bytes`,
//! `frames_per_sec` and `payload_mb_per_sec` (MB = 10^6 bytes), measured at the
//! receiver from its first to its last byte. `--compare [--rounds N]` runs raw
//! and framed alternately and ends with the medians and their ratio.
//! `--tls` runs the framed links inside TLS (rustls, ring, TLS 1.3 with the
//! default suites, a certificate of a throwaway CA); with `--compare` it
//! alternates framed in clear and framed over TLS instead, so the ratio is
//! what TLS costs the transport.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_net::{
    dial, serve_accepted, AcceptPolicy, Config, MemberSet, PeerListener, PeerTls, SendError,
    TlsSource,
};
use clap::Parser;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Frames sent between two looks at the clock.
const CLOCK_CHECK_FRAMES: u64 = 1024;
/// Bytes per write and per read in raw mode.
const RAW_IO_BYTES: usize = 1 << 20;

#[derive(Parser, Debug)]
#[command(about = "Loopback throughput of Cairn's peer transport")]
struct Args {
    /// Payload bytes per frame.
    #[arg(long, default_value_t = 65536)]
    frame_bytes: usize,
    /// How long the sender sends.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Plain TCP with no framing: the ceiling.
    #[arg(long)]
    raw: bool,
    /// Run raw and framed alternately `--rounds` times and report medians and
    /// their ratio (for noisy shared machines).
    #[arg(long, conflicts_with = "raw")]
    compare: bool,
    /// Rounds for `--compare`.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Receive buffer size of the framed receiver (`read_buffer_bytes`).
    #[arg(long, default_value_t = Config::default().read_buffer_bytes)]
    read_buffer_bytes: usize,
    /// Most bytes per read call of the framed receiver (`read_chunk_bytes`).
    #[arg(long, default_value_t = Config::default().read_chunk_bytes)]
    read_chunk_bytes: usize,
    /// Framed links over TLS; with `--compare`, framed in clear against
    /// framed over TLS.
    #[arg(long)]
    tls: bool,
}

/// The TLS both ends use when a run asks for it.
static TLS: OnceLock<PeerTls> = OnceLock::new();

/// Fixed configs from a throwaway CA and one certificate for 127.0.0.1,
/// presented and checked both ways as between members.
struct BenchTls {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

impl TlsSource for BenchTls {
    fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, String> {
        Ok(self.server.clone())
    }

    fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        Ok(self.client.clone())
    }
}

fn bench_tls() -> PeerTls {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("ca");
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("params")
        .signed_by(&key, &ca)
        .expect("cert");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key_der = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let chain = vec![cert.der().clone()];
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).expect("root");
    let roots = Arc::new(roots);
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()
    .expect("verifier");
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key_der.clone_key())
        .expect("server config");
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key_der)
        .expect("client config");
    PeerTls::from(Arc::new(BenchTls {
        server: Arc::new(server),
        client: Arc::new(client),
    }))
}

/// What one run moves the payload with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Raw,
    Framed,
    FramedTls,
}

struct Received {
    payload_bytes: u64,
    frames: u64,
    elapsed: Duration,
}

struct Sent {
    frames: u64,
    writes: u64,
    queue_full: u64,
}

fn on_core<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .expect("spawn")
}

fn block_on_local<F: std::future::Future>(f: F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tokio::task::LocalSet::new().block_on(&runtime, f)
}

fn config(
    member_id: u64,
    (read_buffer_bytes, read_chunk_bytes): (usize, usize),
    tls: bool,
) -> Config {
    let config = Config {
        cluster_id: 0xBE4C,
        member_id,
        read_buffer_bytes,
        read_chunk_bytes,
        tls: tls.then(|| TLS.get_or_init(bench_tls).clone()),
        ..Config::default()
    };
    config.validate().expect("valid settings");
    config
}

fn run_framed(args: &Args, tls: bool) -> (Sent, Received) {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = std_listener.local_addr().expect("addr");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let read_buffer_bytes = (args.read_buffer_bytes, args.read_chunk_bytes);
    let receiver = on_core("netbench-recv", move || {
        block_on_local(async move {
            let policy = AcceptPolicy {
                config: config(1, read_buffer_bytes, tls),
                members: MemberSet::new([2]),
                lane_count: 1,
            };
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            let mut listener = PeerListener::from_listener(listener, policy);
            let accepted = listener.accept().await;
            let (_link, mut rx) =
                serve_accepted(accepted, &config(1, read_buffer_bytes, tls)).expect("serve");
            let mut received = Received {
                payload_bytes: 0,
                frames: 0,
                elapsed: Duration::ZERO,
            };
            let mut started = None;
            while let Some(batch) = rx.recv_batch().await {
                let now = Instant::now();
                let first = *started.get_or_insert(now);
                received.frames += batch.len() as u64;
                for item in &batch {
                    if let cairn_net::Inbound::Message { payload, .. } = item {
                        received.payload_bytes += payload.len() as u64;
                    }
                }
                received.elapsed = now - first;
            }
            received
        })
    });
    let frame_bytes = args.frame_bytes;
    let seconds = args.seconds;
    let read_buffer_bytes = (args.read_buffer_bytes, args.read_chunk_bytes);
    let sender = on_core("netbench-send", move || {
        block_on_local(async move {
            let (link, _rx) = dial(&config(2, read_buffer_bytes, tls), 1, addr, 0).expect("dial");
            link.wait_connected().await.expect("connect");
            let payload = Bytes::from(vec![0x5Au8; frame_bytes]);
            let deadline = Instant::now() + Duration::from_secs_f64(seconds);
            let mut frames = 0u64;
            let mut queue_full = 0u64;
            loop {
                match link.send(0, 0, payload.clone()) {
                    Ok(()) => frames += 1,
                    Err(SendError::QueueFull { .. }) => {
                        queue_full += 1;
                        link.send_wait(0, 0, payload.clone()).await.expect("send");
                        frames += 1;
                    }
                    Err(err) => panic!("send failed: {err}"),
                }
                if frames.is_multiple_of(CLOCK_CHECK_FRAMES) && Instant::now() >= deadline {
                    break;
                }
            }
            while link.queued_frames() > 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let counters = link.counters().snapshot();
            link.close();
            tokio::time::sleep(Duration::from_millis(20)).await;
            Sent {
                frames,
                writes: counters.writes,
                queue_full,
            }
        })
    });
    let sent = sender.join().expect("sender");
    (sent, receiver.join().expect("receiver"))
}

fn run_raw(args: &Args) -> (Sent, Received) {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr: SocketAddr = std_listener.local_addr().expect("addr");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let frame_bytes = args.frame_bytes as u64;
    let receiver = on_core("netbench-recv", move || {
        block_on_local(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
            let (mut stream, _) = listener.accept().await.expect("accept");
            stream.set_nodelay(true).expect("nodelay");
            let mut buf = vec![0u8; RAW_IO_BYTES];
            let mut payload_bytes = 0u64;
            let mut started = None;
            let mut elapsed = Duration::ZERO;
            loop {
                let n = stream.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                let now = Instant::now();
                let first = *started.get_or_insert(now);
                payload_bytes += n as u64;
                elapsed = now - first;
            }
            Received {
                payload_bytes,
                frames: payload_bytes / frame_bytes,
                elapsed,
            }
        })
    });
    let seconds = args.seconds;
    let sender = on_core("netbench-send", move || {
        block_on_local(async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
            stream.set_nodelay(true).expect("nodelay");
            let buf = vec![0x5Au8; RAW_IO_BYTES];
            let deadline = Instant::now() + Duration::from_secs_f64(seconds);
            let mut writes = 0u64;
            while Instant::now() < deadline {
                stream.write_all(&buf).await.expect("write");
                writes += 1;
            }
            stream.shutdown().await.expect("shutdown");
            Sent {
                frames: writes * RAW_IO_BYTES as u64 / frame_bytes,
                writes,
                queue_full: 0,
            }
        })
    });
    let sent = sender.join().expect("sender");
    (sent, receiver.join().expect("receiver"))
}

/// One run's figures.
struct Measurement {
    mode: &'static str,
    secs: f64,
    frames: u64,
    frames_per_sec: f64,
    payload_mb_per_sec: f64,
    frames_per_write: f64,
    queue_full: u64,
}

fn measure(args: &Args, mode: Mode) -> Measurement {
    let (sent, received) = match mode {
        Mode::Raw => run_raw(args),
        Mode::Framed => run_framed(args, false),
        Mode::FramedTls => run_framed(args, true),
    };
    let secs = received.elapsed.as_secs_f64().max(1e-9);
    Measurement {
        mode: match mode {
            Mode::Raw => "raw",
            Mode::Framed => "framed",
            Mode::FramedTls => "framed+tls",
        },
        secs,
        frames: received.frames,
        frames_per_sec: received.frames as f64 / secs,
        payload_mb_per_sec: received.payload_bytes as f64 / secs / 1e6,
        frames_per_write: sent.frames as f64 / sent.writes.max(1) as f64,
        queue_full: sent.queue_full,
    }
}

fn print_row(frame_bytes: usize, m: &Measurement) {
    println!(
        "| {} | {frame_bytes} | {:.2} | {} | {:.0} | {:.1} | {:.1} | {} |",
        m.mode,
        m.secs,
        m.frames,
        m.frames_per_sec,
        m.payload_mb_per_sec,
        m.frames_per_write,
        m.queue_full
    );
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args = Args::parse();
    assert!(args.frame_bytes > 0, "--frame-bytes must be positive");
    assert!(
        args.frame_bytes <= cairn_net::frame::DEFAULT_MAX_PAYLOAD_BYTES as usize,
        "--frame-bytes over 16 MiB"
    );
    println!("| mode | frame bytes | seconds | frames received | frames/s | payload MB/s | frames/write | queue-full waits |");
    println!("|---|---|---|---|---|---|---|---|");
    if args.compare {
        // Alternating runs, so load from elsewhere on a shared machine hits
        // both modes alike; medians reported.
        // With --tls: framed in clear is the baseline, framed over TLS the
        // one measured against it.
        let (base, tested) = if args.tls {
            (Mode::Framed, Mode::FramedTls)
        } else {
            (Mode::Raw, Mode::Framed)
        };
        let mut raw = Vec::new();
        let mut framed = Vec::new();
        for _ in 0..args.rounds.max(1) {
            let m = measure(&args, base);
            print_row(args.frame_bytes, &m);
            raw.push(m);
            let m = measure(&args, tested);
            print_row(args.frame_bytes, &m);
            framed.push(m);
        }
        let raw_mb = median(raw.iter().map(|m| m.payload_mb_per_sec).collect());
        let framed_mb = median(framed.iter().map(|m| m.payload_mb_per_sec).collect());
        let framed_fps = median(framed.iter().map(|m| m.frames_per_sec).collect());
        let ratios: Vec<f64> = raw
            .iter()
            .zip(&framed)
            .map(|(r, f)| f.payload_mb_per_sec / r.payload_mb_per_sec)
            .collect();
        let (base_name, tested_name) = (raw[0].mode, framed[0].mode);
        println!(
            "median of {} rounds: {base_name} {raw_mb:.1} MB/s, {tested_name} {framed_mb:.1} MB/s, {tested_name}/{base_name} {:.2}",
            raw.len(),
            median(ratios.clone())
        );
        let ratio = (median(ratios) * 1000.0).round() / 1000.0;
        let base_mb = (raw_mb * 10.0).round() / 10.0;
        let line = if args.tls {
            serde_json::json!({
                "mode": "compare-tls",
                "frame_bytes": args.frame_bytes,
                "rounds": raw.len(),
                "frames_per_sec": framed_fps.round(),
                "payload_mb_per_sec": (framed_mb * 10.0).round() / 10.0,
                "clear_payload_mb_per_sec": base_mb,
                "tls_over_clear": ratio,
            })
        } else {
            serde_json::json!({
                "mode": "compare",
                "frame_bytes": args.frame_bytes,
                "rounds": raw.len(),
                "frames_per_sec": framed_fps.round(),
                "payload_mb_per_sec": (framed_mb * 10.0).round() / 10.0,
                "raw_payload_mb_per_sec": base_mb,
                "framed_over_raw": ratio,
            })
        };
        println!("{line}");
        return;
    }
    let mode = match (args.raw, args.tls) {
        (true, _) => Mode::Raw,
        (false, false) => Mode::Framed,
        (false, true) => Mode::FramedTls,
    };
    let m = measure(&args, mode);
    print_row(args.frame_bytes, &m);
    println!(
        "{}",
        serde_json::json!({
            "mode": m.mode,
            "frame_bytes": args.frame_bytes,
            "seconds": m.secs,
            "frames": m.frames,
            "frames_per_sec": m.frames_per_sec.round(),
            "payload_mb_per_sec": (m.payload_mb_per_sec * 10.0).round() / 10.0,
            "frames_per_write": m.frames_per_write,
        })
    );
}
