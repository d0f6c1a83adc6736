//! The peer transport inside TLS. Guards against a TLS session that breaks
//! when an accepted connection moves from the listener's runtime to the core
//! owning its lane, against a TLS port that lets in plaintext or a peer whose
//! certificate another CA signed, and against the port's other protocol
//! (the peer HTTP side) not getting its bytes through TLS.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_net::{
    dial, serve_accepted, AcceptedStream, Config, Inbound, Incoming, OtherStream, PeerTls,
    TlsSource,
};
use common::{config, listener_with, run_local};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct FixedTls {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
}

impl TlsSource for FixedTls {
    fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, String> {
        Ok(self.server.clone())
    }

    fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        Ok(self.client.clone())
    }
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A member's TLS: a certificate for 127.0.0.1 signed by `signer`, trusting
/// `trusted` both ways, client certificates required.
fn member_tls(
    signer: &CertifiedIssuer<'static, KeyPair>,
    trusted: &CertifiedIssuer<'static, KeyPair>,
) -> PeerTls {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, signer)
        .unwrap();
    let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone()];
    let key = PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted.der().clone()).unwrap();
    let roots = Arc::new(roots);
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        roots.clone(),
        provider.clone(),
    )
    .build()
    .unwrap();
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    PeerTls::from(Arc::new(FixedTls {
        server: Arc::new(server),
        client: Arc::new(client),
    }))
}

fn with_tls(member_id: u64, tls: &PeerTls) -> Config {
    Config {
        tls: Some(tls.clone()),
        ..config(member_id)
    }
}

#[test]
fn frames_cross_a_tls_link_accepted_on_one_runtime_and_served_on_another() {
    let ca = ca("cluster CA");
    let tls1 = member_tls(&ca, &ca);
    let tls2 = member_tls(&ca, &ca);
    let (accepted_tx, accepted_rx) = std::sync::mpsc::channel();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let server_config = with_tls(1, &tls1);
    // The listener's thread: handshakes, then hands the connection over.
    let listener_config = server_config.clone();
    let listener_thread = std::thread::spawn(move || {
        run_local(async move {
            let mut listener = listener_with(listener_config, &[2], 1).await;
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            let accepted = listener.accept().await;
            assert!(matches!(accepted.stream, AcceptedStream::Tls(_)));
            accepted_tx.send(accepted).unwrap();
        })
    });
    // The owning core's thread: serves the connection and echoes.
    let core_thread = std::thread::spawn(move || {
        run_local(async move {
            let accepted = accepted_rx.recv().unwrap();
            let (link, mut rx) = serve_accepted(accepted, &server_config).unwrap();
            let mut got = Vec::new();
            while got.len() < 100 {
                if let Some(Inbound::Message { payload, .. }) = rx.recv().await {
                    link.send(0, 0, payload.clone()).unwrap();
                    got.push(payload);
                }
            }
            // Let the echoes leave before the link is dropped.
            while link.queued_frames() > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            got
        })
    });
    let addr = addr_rx.recv().unwrap();
    let echoed = run_local(async move {
        let (link, mut rx) = dial(&with_tls(2, &tls2), 1, addr, 0).unwrap();
        link.wait_connected().await.unwrap();
        for i in 0..100u32 {
            let payload = Bytes::from(vec![i as u8; 1 + (i as usize * 997) % 70_000]);
            link.send_wait(0, 0, payload).await.unwrap();
        }
        let mut echoed = Vec::new();
        while echoed.len() < 100 {
            match rx.recv().await {
                Some(Inbound::Message { payload, .. }) => echoed.push(payload),
                Some(_) => {}
                None => panic!("link closed after {} echoes", echoed.len()),
            }
        }
        echoed
    });
    listener_thread.join().unwrap();
    let received = core_thread.join().unwrap();
    for (i, (sent_back, got)) in echoed.iter().zip(&received).enumerate() {
        assert_eq!(got.len(), 1 + (i * 997) % 70_000);
        assert!(got.iter().all(|&b| b == i as u8));
        assert_eq!(sent_back, got);
    }
}

#[test]
fn plaintext_and_certificates_of_another_ca_are_refused() {
    let other = ca("another CA");
    let ca = ca("cluster CA");
    let member = member_tls(&ca, &ca);
    let intruder = member_tls(&other, &ca);
    let capture = common::LogCapture::start();
    run_local(async move {
        let mut listener = listener_with(with_tls(1, &member), &[2, 3, 4], 1).await;
        let addr = listener.local_addr().unwrap();
        // Plaintext, and a certificate the listener's CA did not sign.
        let (plain, _) = dial(&config(2), 1, addr, 0).unwrap();
        let (foreign, _) = dial(&with_tls(3, &intruder), 1, addr, 0).unwrap();
        // A member with the right certificate still gets in meanwhile.
        let (good, _good_rx) = dial(&with_tls(4, &member_tls(&ca, &ca)), 1, addr, 0).unwrap();
        let accepted = tokio::time::timeout(Duration::from_secs(10), listener.accept())
            .await
            .expect("the good member is accepted");
        assert_eq!(accepted.hello.member_id, 4);
        let (_served, _served_rx) = serve_accepted(accepted, &with_tls(1, &member)).unwrap();
        good.wait_connected().await.unwrap();
        // Keep accepting (and refusing) until both have failed twice.
        let refusals = async {
            let a = listener.accept().await;
            panic!("member {} was let in", a.hello.member_id);
        };
        let failed_twice = async {
            let failures = |l: &cairn_net::Link| l.counters().snapshot().connect_failures;
            while failures(&plain) < 2 || failures(&foreign) < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::select! {
            () = refusals => {}
            () = failed_twice => {}
        }
        assert!(!plain.is_connected() && !foreign.is_connected());
    });
    let refused = capture.lines_with("peer TLS handshake failed");
    assert!(
        refused.iter().any(|l| l.contains("UnknownIssuer")),
        "{refused:#?}"
    );
    assert!(refused.len() >= 2, "{refused:#?}");
}

#[test]
fn the_other_protocol_of_a_tls_port_gets_its_bytes_through_tls() {
    let ca = ca("cluster CA");
    let member = member_tls(&ca, &ca);
    let client = member_tls(&ca, &ca);
    run_local(async move {
        let mut listener = listener_with(with_tls(1, &member), &[2], 1)
            .await
            .with_other_protocol(|prefix| prefix == b"GET ");
        let addr = listener.local_addr().unwrap();
        let client_config = client.0.client_config().unwrap();
        let talk = tokio::task::spawn_local(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(client_config)
                .connect(name, tcp)
                .await
                .unwrap();
            tls.write_all(b"GET /x HTTP/1.1\r\n\r\n").await.unwrap();
            tls.flush().await.unwrap();
            let mut answer = [0u8; 2];
            tls.read_exact(&mut answer).await.unwrap();
            answer
        });
        match listener.accept_any().await {
            Incoming::Other {
                stream: mut other @ OtherStream::Tls(_),
                ..
            } => {
                let mut buf = [0u8; 6];
                other.read_exact(&mut buf).await.unwrap();
                assert_eq!(&buf, b"GET /x");
                other.write_all(b"ok").await.unwrap();
                other.flush().await.unwrap();
                assert_eq!(&talk.await.unwrap(), b"ok");
            }
            other => panic!("not the other protocol over TLS: {other:?}"),
        }
    });
}
