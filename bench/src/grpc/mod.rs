//! The load generator's own gRPC client for the unary KV calls (Range, Put,
//! Txn) over plaintext HTTP/2: what a request costs the machine should be
//! the server's, not the client's, when both share a small host.
//!
//! tonic's client spends about 33-41 µs of CPU per call on this 2-core VM
//! (a buffer task, hyper's dispatch, h2's stream locks, a wake-up per hop):
//! more than a Cairn member spends serving it. Here one task per connection
//! ([`serve`]) owns the socket and a [`conn::Connection`]; a requester hands
//! it the encoded request and waits for the answer, and the task writes every
//! request that is ready with one write and reads every answer that has
//! arrived with one read.
//!
//! Calls fail with the server's status, or Unavailable when the connection
//! cannot be opened or breaks (the next call opens a new one), or
//! DeadlineExceeded past `--timeout` (tonic's client reports that one as
//! Cancelled, "Timeout expired"). A connection that drains (GOAWAY, or its
//! stream ids spent) takes no new calls; they wait for its last answers and
//! then go over a new connection. `watch-load`'s reading watchers stream
//! their answers here too ([`Channel::open_stream`]); TLS and the other
//! streaming calls stay with tonic (`--grpc-client`).

pub mod conn;

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use conn::{Broken, Call, Connection, Reply, MESSAGE_PREFIX};

/// How long opening a connection may take before its calls fail.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often calls given up (timed out) are looked for and reset.
const SWEEP_INTERVAL: Duration = Duration::from_millis(100);
/// Octets read from the socket at most per read.
const READ_CHUNK: usize = 64 * 1024;

/// The calls this client makes: unary KV calls, and Watch's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Range,
    Put,
    Txn,
    Watch,
}

impl Method {
    pub const ALL: [Method; 4] = [Method::Range, Method::Put, Method::Txn, Method::Watch];

    pub fn path(self) -> &'static str {
        match self {
            Method::Range => "/etcdserverpb.KV/Range",
            Method::Put => "/etcdserverpb.KV/Put",
            Method::Txn => "/etcdserverpb.KV/Txn",
            Method::Watch => "/etcdserverpb.Watch/Watch",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A handle on one connection's task; clones share the connection.
#[derive(Debug, Clone)]
pub struct Channel {
    calls: mpsc::UnboundedSender<Call>,
    timeout: Duration,
}

impl Channel {
    /// A connection to `endpoint` (`host:port`), opened by the first call
    /// and again by the first call after it breaks. Each call may take
    /// `timeout`; `token` goes with every call.
    pub fn lazy(endpoint: &str, token: Option<String>, timeout: Duration) -> Channel {
        let (calls, rx) = mpsc::unbounded_channel();
        tokio::spawn(serve(endpoint.to_owned(), token, rx));
        Channel { calls, timeout }
    }

    /// Calls `method` with `request` and decodes the answer.
    pub async fn call<Req, Resp>(&self, method: Method, request: &Req) -> Result<Resp, Status>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let mut body = BytesMut::new();
        put_message(&mut body, request)?;
        let (reply, answer) = oneshot::channel();
        self.start(method, body, Reply::Unary(reply))?;
        let message: Bytes = match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(result)) => result?,
            Ok(Err(_)) => return Err(task_stopped()),
            Err(_) => {
                return Err(Status::deadline_exceeded(format!(
                    "no answer within {:?}",
                    self.timeout
                )))
            }
        };
        Resp::decode(message)
            .map_err(|e| Status::internal(format!("the answer does not decode: {e}")))
    }

    /// Opens a call of `method` whose answers stream, sending `requests` as
    /// its body and leaving its side open. Its messages arrive, undecoded,
    /// on the channel returned, then a status if the call fails; dropping
    /// the receiver resets the stream (within [`SWEEP_INTERVAL`]).
    pub fn open_stream<Req: prost::Message>(
        &self,
        method: Method,
        requests: &[Req],
    ) -> Result<mpsc::UnboundedReceiver<Result<Bytes, Status>>, Status> {
        let mut body = BytesMut::new();
        for request in requests {
            put_message(&mut body, request)?;
        }
        let (reply, messages) = mpsc::unbounded_channel();
        self.start(method, body, Reply::Messages(reply))?;
        Ok(messages)
    }

    /// Hands a call to the connection's task.
    fn start(&self, method: Method, body: BytesMut, reply: Reply) -> Result<(), Status> {
        let call = Call {
            method,
            body: body.freeze(),
            reply,
        };
        self.calls.send(call).map_err(|_| task_stopped())
    }
}

/// A call's failure when the connection's task is gone.
fn task_stopped() -> Status {
    Status::unavailable("the connection's task has stopped")
}

/// The `host:port` of a client URL (`http://host:port`, or `host:port`
/// already), as [`Channel::lazy`] takes it.
pub fn host_port(url: &str) -> &str {
    let url = url.trim();
    url.strip_prefix("http://").unwrap_or(url)
}

/// Appends `request` to `body` as a gRPC message: the 5-octet prefix, then
/// the encoding.
fn put_message(body: &mut BytesMut, request: &impl prost::Message) -> Result<(), Status> {
    let len = request.encoded_len();
    let prefix = u32::try_from(len)
        .map_err(|_| Status::resource_exhausted(format!("a request of {len} bytes")))?;
    body.reserve(MESSAGE_PREFIX + len);
    body.put_u8(0);
    body.put_u32(prefix);
    request
        .encode(body)
        .expect("the buffer holds the encoded length");
    Ok(())
}

/// How a connection's service ended.
enum End {
    /// Every handle is gone.
    Handles,
    /// GOAWAY or stream ids ran out, and every call on it is answered.
    Drained,
    Broken(Broken),
}

/// The connection task: opens a connection when a call comes, serves it
/// until it drains or breaks, and opens the next one for the next call.
async fn serve(endpoint: String, token: Option<String>, mut calls: mpsc::UnboundedReceiver<Call>) {
    // Calls a drained connection never opened: they go first on the next.
    let mut carried: Vec<Call> = Vec::new();
    loop {
        let first = match carried.pop() {
            Some(call) => call,
            None => match calls.recv().await {
                Some(call) => call,
                None => return,
            },
        };
        let stream = match connect(&endpoint).await {
            Ok(s) => s,
            Err(reason) => {
                // Every call already waiting fails with this attempt.
                let status = Status::unavailable(reason);
                first.reply.finish(Err(status.clone()));
                for call in carried.drain(..) {
                    call.reply.finish(Err(status.clone()));
                }
                while let Ok(call) = calls.try_recv() {
                    call.reply.finish(Err(status.clone()));
                }
                continue;
            }
        };
        let mut conn = Connection::new(&endpoint, token.as_deref());
        conn.start(first);
        for call in carried.drain(..).rev() {
            conn.start(call);
        }
        match drive(&stream, &mut conn, &mut calls).await {
            End::Handles => return,
            End::Drained => {
                carried = conn.take_waiting();
                carried.reverse();
            }
            End::Broken(Broken(reason)) => {
                conn.fail_all(&Status::unavailable(format!(
                    "connection to {endpoint} broken: {reason}"
                )));
            }
        }
    }
}

async fn connect(endpoint: &str) -> Result<TcpStream, String> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(endpoint))
        .await
        .map_err(|_| format!("connecting to {endpoint} took over {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| format!("connecting to {endpoint}: {e}"))?;
    stream
        .set_nodelay(true)
        .map_err(|e| format!("TCP_NODELAY on {endpoint}: {e}"))?;
    Ok(stream)
}

/// Serves one connection: writes what the state machine has to send as soon
/// as the socket takes it, reads what the server sends, takes new calls.
async fn drive(
    stream: &TcpStream,
    conn: &mut Connection,
    calls: &mut mpsc::UnboundedReceiver<Call>,
) -> End {
    let mut input = BytesMut::with_capacity(READ_CHUNK);
    let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let io = |e: std::io::Error| End::Broken(Broken(e.to_string()));
    loop {
        while !conn.out.is_empty() {
            match stream.try_write(&conn.out) {
                Ok(0) => return End::Broken(Broken("the socket took no octets".into())),
                // What is written leaves the buffer, whose space is reused.
                Ok(n) => conn.out.advance(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return io(e),
            }
        }
        if conn.drained() && conn.out.is_empty() {
            return End::Drained;
        }
        let unwritten = !conn.out.is_empty();
        tokio::select! {
            ready = stream.readable() => {
                if let Err(e) = ready {
                    return io(e);
                }
                input.reserve(READ_CHUNK);
                match stream.try_read_buf(&mut input) {
                    Ok(0) => return End::Broken(Broken("closed by the server".into())),
                    Ok(_) => {
                        if let Err(b) = conn.receive(&mut input) {
                            return End::Broken(b);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return io(e),
                }
            }
            call = calls.recv(), if conn.accepting() => match call {
                Some(call) => {
                    conn.start(call);
                    while conn.accepting() {
                        let Ok(call) = calls.try_recv() else { break };
                        conn.start(call);
                    }
                }
                // Calls still open have nobody waiting for them.
                None => return End::Handles,
            },
            ready = stream.writable(), if unwritten => {
                if let Err(e) = ready {
                    return io(e);
                }
            }
            _ = sweep.tick() => conn.cancel_abandoned(),
        }
    }
}

#[cfg(test)]
mod tests;
