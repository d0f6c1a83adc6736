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

/// A listener on a free port, and a channel to it with call `timeout`.
async fn listening(timeout: Duration) -> (TcpListener, Channel) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let channel = Channel::lazy(&addr, None, timeout);
    (listener, channel)
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
        self.head_and_frame_of(kind, stream).await.1
    }

    /// Reads frames until one of `kind` on `stream` arrives; its head and
    /// payload.
    async fn head_and_frame_of(&mut self, kind: u8, stream: u32) -> (Head, Bytes) {
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
                            return (head, frame.freeze().slice(frame::HEADER_LEN..));
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
    let (listener, channel) = listening(Duration::from_millis(200)).await;
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
    let (listener, channel) = listening(Duration::from_secs(60)).await;
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

/// A header block of literal `fields`, as a server sends it.
fn block_of(fields: &[(&str, &str)]) -> BytesMut {
    let mut out = BytesMut::new();
    let block = cairn_proto::h2::hpack::Block::literals(fields.iter().copied());
    cairn_proto::h2::hpack::encode_literals(&block, &mut out);
    out
}

/// `block` as one HEADERS frame on stream 1, with `flags` besides
/// END_HEADERS.
fn put_block(out: &mut BytesMut, block: &[u8], flags: u8) {
    frame::put_head(
        out,
        block.len(),
        frame::HEADERS,
        frame::FLAG_END_HEADERS | flags,
        1,
    );
    out.extend_from_slice(block);
}

/// `payload` as one gRPC message: the 5-octet prefix, then the octets.
fn message(payload: &[u8]) -> Vec<u8> {
    let mut m = vec![0];
    m.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    m.extend_from_slice(payload);
    m
}

#[tokio::test]
async fn a_streaming_call_keeps_its_side_open_and_gets_each_message_as_it_is_whole() {
    let (listener, channel) = listening(Duration::from_secs(60)).await;
    let mut answers = channel.open_stream(Method::Watch, &[put(), put()]).unwrap();
    let mut peer = Peer::accept(&listener).await;
    let headers = peer.frame_of(frame::HEADERS, 1).await;
    assert!(
        headers
            .windows(b"/etcdserverpb.Watch/Watch".len())
            .any(|w| w == b"/etcdserverpb.Watch/Watch"),
        "the call goes to Watch"
    );
    let (head, body) = peer.head_and_frame_of(frame::DATA, 1).await;
    assert!(
        !head.has(frame::FLAG_END_STREAM),
        "a watch's side stays open"
    );
    let one = prost::Message::encode_to_vec(&put());
    assert_eq!(
        &body[..],
        [message(&one), message(&one)].concat(),
        "both requests in the body"
    );

    let mut out = BytesMut::new();
    let block = block_of(&[(":status", "200"), ("content-type", "application/grpc")]);
    put_block(&mut out, &block, 0);
    // Two messages in one frame, a third cut over two frames.
    let data = [message(b"first"), message(b"second"), message(b"third")].concat();
    let cut = data.len() - 3;
    frame::put_head(&mut out, cut, frame::DATA, 0, 1);
    out.extend_from_slice(&data[..cut]);
    peer.socket.write_all(&out).await.unwrap();
    for expected in [&b"first"[..], b"second"] {
        let got = answers
            .recv()
            .await
            .expect("a message")
            .expect("not a failure");
        assert_eq!(&got[..], expected);
    }
    let pending = tokio::time::timeout(Duration::from_millis(50), answers.recv()).await;
    assert!(pending.is_err(), "half a message is not delivered");
    let mut out = BytesMut::new();
    frame::put_head(&mut out, 3, frame::DATA, 0, 1);
    out.extend_from_slice(&data[cut..]);
    let trailers = block_of(&[("grpc-status", "0")]);
    put_block(&mut out, &trailers, frame::FLAG_END_STREAM);
    peer.socket.write_all(&out).await.unwrap();
    let got = answers
        .recv()
        .await
        .expect("a message")
        .expect("not a failure");
    assert_eq!(&got[..], b"third");
    assert!(
        answers.recv().await.is_none(),
        "the call ended well: the channel closes"
    );
    // The client closes its side, which it had left open.
    let code = peer.frame_of(frame::RST_STREAM, 1).await;
    assert_eq!(&code[..], &(frame::ErrorCode::Cancel as u32).to_be_bytes());
}

#[tokio::test]
async fn a_streaming_call_the_server_fails_ends_with_its_status() {
    let (listener, channel) = listening(Duration::from_secs(60)).await;
    let mut answers = channel.open_stream(Method::Watch, &[put()]).unwrap();
    let mut peer = Peer::accept(&listener).await;
    peer.frame_of(frame::DATA, 1).await;
    let mut out = BytesMut::new();
    let block = block_of(&[
        (":status", "200"),
        ("grpc-status", "9"),
        ("grpc-message", "not%20now"),
    ]);
    put_block(&mut out, &block, frame::FLAG_END_STREAM);
    peer.socket.write_all(&out).await.unwrap();
    let status = answers.recv().await.expect("the status").unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(status.message(), "not now");
    assert!(answers.recv().await.is_none());
}
