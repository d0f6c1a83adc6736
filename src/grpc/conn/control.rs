//! A connection's control frames (RST_STREAM, SETTINGS, WINDOW_UPDATE) and
//! the end of streams and of the connection.

use tokio::io::{AsyncRead, AsyncWrite};

use super::{protocol, Conn, ConnError, Recv};
use super::{MAX_RESETS, MAX_WINDOW_SETTINGS, RESET_PERIOD};
use cairn_proto::h2::frame::{self, ErrorCode, Head};

impl<IO: AsyncRead + AsyncWrite + Unpin> Conn<IO> {
    pub(super) fn on_rst_stream(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream == 0 {
            return Err(protocol(ErrorCode::Protocol, "RST_STREAM on stream 0"));
        }
        if payload.len() != 4 {
            return Err(protocol(ErrorCode::FrameSize, "RST_STREAM is not 4 octets"));
        }
        if head.stream > self.last_stream {
            return Err(protocol(
                ErrorCode::Protocol,
                "RST_STREAM on an idle stream",
            ));
        }
        if self.drop_stream(head.stream) {
            let now = std::time::Instant::now();
            if now.duration_since(self.resets_since) > RESET_PERIOD {
                self.resets_since = now;
                self.resets = 0;
                // Stream ids only grow (at most 2^31 - 1): the calls opened
                // from now on are those of this period.
                self.period_first_stream = self.last_stream + 1;
            }
            if head.stream < self.period_first_stream {
                return Ok(());
            }
            self.resets += 1;
            if self.resets > MAX_RESETS {
                return Err(protocol(
                    ErrorCode::EnhanceYourCalm,
                    format!("more than {MAX_RESETS} calls reset within {RESET_PERIOD:?}"),
                ));
            }
        }
        Ok(())
    }

    /// Ends a stream here: its call is aborted, its held body released, its
    /// queued answer dropped. False when it was not open.
    pub(super) fn drop_stream(&mut self, id: u32) -> bool {
        self.outbox.borrow_mut().close(id);
        let Some(stream) = self.streams.remove(&id) else {
            return false;
        };
        self.held = self.held.saturating_sub(stream.held());
        stream.abort();
        true
    }

    pub(super) fn on_settings(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream != 0 {
            return Err(protocol(ErrorCode::Protocol, "SETTINGS on a stream"));
        }
        if head.has(frame::FLAG_ACK) {
            if !payload.is_empty() {
                return Err(protocol(
                    ErrorCode::FrameSize,
                    "SETTINGS ack with a payload",
                ));
            }
            return Ok(());
        }
        if !payload.len().is_multiple_of(6) {
            return Err(protocol(
                ErrorCode::FrameSize,
                "SETTINGS not a multiple of 6 octets",
            ));
        }
        // Only the frame's last value of a setting counts (RFC 9113 §6.5.3
        // applies them in order), so the window changes once per frame.
        let mut initial_window = None;
        let mut max_frame = None;
        for setting in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([setting[0], setting[1]]);
            let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
            match id {
                frame::SETTINGS_ENABLE_PUSH if value > 1 => {
                    return Err(protocol(ErrorCode::Protocol, "ENABLE_PUSH not 0 or 1"));
                }
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    if i64::from(value) > frame::MAX_WINDOW {
                        return Err(protocol(
                            ErrorCode::FlowControl,
                            "INITIAL_WINDOW_SIZE over 2^31-1",
                        ));
                    }
                    initial_window = Some(value);
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME..=frame::MAX_MAX_FRAME).contains(&value) {
                        return Err(protocol(ErrorCode::Protocol, "MAX_FRAME_SIZE out of range"));
                    }
                    max_frame = Some(value);
                }
                // The table size bounds the peer's decoder; our encoder never
                // uses the dynamic table. Other settings do not bind a server.
                _ => {}
            }
        }
        let mut outbox = self.outbox.borrow_mut();
        if let Some(value) = max_frame {
            outbox.set_max_frame(value);
        }
        if let Some(value) = initial_window {
            match outbox.set_initial_window(value) {
                Err(_) => {
                    return Err(protocol(
                        ErrorCode::FlowControl,
                        "a stream's window over 2^31-1",
                    ))
                }
                Ok(false) => {}
                Ok(true) => {
                    self.window_settings += 1;
                    if self.window_settings > MAX_WINDOW_SETTINGS {
                        return Err(protocol(
                            ErrorCode::EnhanceYourCalm,
                            "the initial window changed too often",
                        ));
                    }
                }
            }
        }
        drop(outbox);
        frame::put_settings_ack(&mut self.out);
        Ok(())
    }

    pub(super) fn on_window_update(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        let Ok(b) = <[u8; 4]>::try_from(payload) else {
            return Err(protocol(
                ErrorCode::FrameSize,
                "WINDOW_UPDATE is not 4 octets",
            ));
        };
        let increment = u32::from_be_bytes(b) & 0x7fff_ffff;
        if head.stream > self.last_stream {
            return Err(protocol(
                ErrorCode::Protocol,
                "WINDOW_UPDATE on an idle stream",
            ));
        }
        if increment == 0 {
            if head.stream == 0 {
                return Err(protocol(ErrorCode::Protocol, "WINDOW_UPDATE of 0"));
            }
            frame::put_rst_stream(&mut self.out, head.stream, ErrorCode::Protocol);
            self.drop_stream(head.stream);
            return Ok(());
        }
        let overflow = self
            .outbox
            .borrow_mut()
            .window_update(head.stream, increment)
            .is_err();
        if overflow {
            if head.stream == 0 {
                return Err(protocol(
                    ErrorCode::FlowControl,
                    "connection window over 2^31-1",
                ));
            }
            frame::put_rst_stream(&mut self.out, head.stream, ErrorCode::FlowControl);
            self.drop_stream(head.stream);
        }
        Ok(())
    }

    /// The last frame of a response went out.
    pub(super) fn response_sent(&mut self, id: u32) {
        if let Some(stream) = self.streams.remove(&id) {
            self.held = self.held.saturating_sub(stream.held());
            if !matches!(stream.recv, Recv::Done) {
                // Answered before the client finished sending: stop it.
                frame::put_rst_stream(&mut self.out, id, ErrorCode::NoError);
            }
        }
    }

    /// The member is stopping: no new streams; the open ones finish.
    pub(super) fn go_away(&mut self) {
        if !self.going_away {
            self.going_away = true;
            frame::put_goaway(&mut self.out, self.last_stream, ErrorCode::NoError, "");
        }
    }
}
