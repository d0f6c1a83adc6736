//! The connection task over real sockets, against servers that misbehave:
//! one that never answers, one that goes away, one that is not there.

use super::*;
use bytes::Buf;
use cairn_proto::etcdserverpb::{PutRequest, PutResponse};
use cairn_proto::h2::frame::{self, Head};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tonic::Code;

/// The server's side of one accepted connection: reads the client's frames.
struct Peer {
    socket: TcpStream,
    input: BytesMut,
    preface: bool,
}

impl Peer {
    async fn accept(listener: &TcpListener) -> Peer {
        let (socket, _) = listener.accept().await.unwrap();
        Peer {
            socket,
            input: BytesMut::new(),
            preface: true,
        }
    }

    /// Reads frames until one of `kind` on `stream` arrives; its payload.
    async fn frame_of(&mut self, kind: u8, stream: u32) -> Bytes {
        loop {
            if self.preface && self.input.len() >= 24 {
                self.input.advance(24);
                self.preface = false;
            }
            if !self.preface {
                if let Some(head) = Head::parse(&self.input) {
                    let len = frame::HEADER_LEN + head.len as usize;
                    if self.input.len() >= len {
                        let frame = self.input.split_to(len);
                        if head.kind == kind && head.stream == stream {
                            return frame.freeze().slice(frame::HEADER_LEN..);
                        }
                        continue;
                    }
                }
            }
            let n = self.socket.read_buf(&mut self.input).await.unwrap();
            assert!(n > 0, "the client closed before sending the frame");
        }
    }
}

fn put() -> PutRequest {
    PutRequest {
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(b"v"),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_call_past_its_deadline_fails_and_is_reset() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let channel = Channel::lazy(&addr, None, Duration::from_millis(200));
    // A handle stays: the connection lives on after the call.
    let _kept = channel.clone();
    let call = tokio::spawn(async move {
        let r: Result<PutResponse, Status> = channel.call(Method::Put, &put()).await;
        r
    });
    let mut peer = Peer::accept(&listener).await;
    peer.frame_of(frame::HEADERS, 1).await;
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    // The connection task finds the call given up and resets its stream.
    let code = peer.frame_of(frame::RST_STREAM, 1).await;
    assert_eq!(&code[..], &(frame::ErrorCode::Cancel as u32).to_be_bytes());
}

#[tokio::test]
async fn a_server_going_away_fails_the_call_and_the_next_call_reconnects() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let channel = Channel::lazy(&addr, None, Duration::from_secs(60));
    let first = {
        let channel = channel.clone();
        tokio::spawn(async move {
            let r: Result<PutResponse, Status> = channel.call(Method::Put, &put()).await;
            r
        })
    };
    let mut peer = Peer::accept(&listener).await;
    peer.frame_of(frame::HEADERS, 1).await;
    let mut goaway = BytesMut::new();
    frame::put_head(&mut goaway, 8, frame::GOAWAY, 0, 0);
    goaway.put_u32(0);
    goaway.put_u32(0);
    peer.socket.write_all(&goaway).await.unwrap();
    let err = first.await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    drop(peer);

    let second = tokio::spawn(async move {
        let r: Result<PutResponse, Status> = channel.call(Method::Put, &put()).await;
        r
    });
    let mut peer = Peer::accept(&listener).await;
    let body = peer.frame_of(frame::DATA, 1).await;
    assert_eq!(body[0], 0, "an uncompressed message");
    // The server closes without answering: the call fails, as tonic's would.
    drop(peer);
    let err = second.await.unwrap().unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("broken"), "{err:?}");
}

#[tokio::test]
async fn a_server_not_there_is_unavailable() {
    // Bound and closed: nothing listens on the port.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let channel = Channel::lazy(&format!("127.0.0.1:{port}"), None, Duration::from_secs(60));
    for _ in 0..3 {
        let err = channel
            .call::<_, PutResponse>(Method::Put, &put())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert!(err.message().contains("connecting to"), "{err:?}");
    }
}
