//! A request's header fields as the server uses them (RFC 9113 §8.3, the gRPC
//! HTTP/2 protocol): the pseudo-headers checked, `grpc-timeout` parsed, every
//! other field kept as metadata for the services (the auth token among them).

use std::time::Duration;

use cairn_proto::h2::hpack::Block;
use http::header::{HeaderMap, HeaderName, HeaderValue};

/// The head of one request.
#[derive(Debug, Default)]
pub struct RequestHead {
    pub method: Option<Vec<u8>>,
    pub path: Option<Vec<u8>>,
    /// Pseudo-headers taken (one bit each: method, path, authority,
    /// scheme), to refuse repeats. The authority and scheme are not kept:
    /// no service reads them.
    pseudo_seen: u8,
    /// `grpc-timeout`, when given and well formed.
    pub timeout: Option<Duration>,
    /// A `grpc-encoding` other than `identity` was named.
    pub compressed: bool,
    /// Regular fields, in order.
    pub headers: HeaderMap,
    /// Why the head is malformed (RFC 9113 §8.1.1): the stream is reset.
    pub malformed: Option<&'static str>,
    regular_seen: bool,
}

/// What a held [`RequestHead`] takes besides its map's tables and fields:
/// the boxed head, and the map's first allocation.
const HELD_HEAD_BYTES: usize = 1024;

/// What each slot of a held head's header map takes, used or not: an entry
/// (about 104 bytes) and its share of the index, with the allocator's
/// rounding. The map's capacity is read, not assumed: names chosen to collide
/// in its hash make it grow far ahead of its fields.
const HELD_SLOT_BYTES: usize = 144;

/// What each value of a held head takes besides its slot, name and value
/// octets: the allocations of its name and value (rounded up to a size
/// class), and for a repeated name the extra-value entry.
const HELD_VALUE_BYTES: usize = 224;

impl RequestHead {
    /// The head of a decoded header block, field by field.
    pub fn of(block: &Block) -> RequestHead {
        let mut head = RequestHead::default();
        for field in &block.fields {
            head.field(&field.name, &field.value);
        }
        head
    }

    /// Takes one decoded field.
    pub fn field(&mut self, name: &[u8], value: &[u8]) {
        if let Some(pseudo) = name.strip_prefix(b":") {
            if self.regular_seen {
                self.malformed = Some("pseudo-header after a regular field");
                return;
            }
            let bit = match pseudo {
                b"method" => 1,
                b"path" => 2,
                b"authority" => 4,
                b"scheme" => 8,
                _ => {
                    self.malformed = Some("unknown pseudo-header");
                    return;
                }
            };
            if self.pseudo_seen & bit != 0 {
                self.malformed = Some("repeated pseudo-header");
            }
            self.pseudo_seen |= bit;
            match bit {
                1 => self.method = Some(value.to_vec()),
                2 => self.path = Some(value.to_vec()),
                _ => {}
            }
            return;
        }
        self.regular_seen = true;
        match name {
            b"grpc-timeout" => self.timeout = parse_timeout(value),
            b"grpc-encoding" if value != b"identity" => self.compressed = true,
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
            | b"upgrade" => {
                self.malformed = Some("connection-specific header field");
                return;
            }
            b"te" if value != b"trailers" => {
                self.malformed = Some("te other than trailers");
                return;
            }
            _ => {}
        }
        if name.iter().any(u8::is_ascii_uppercase) {
            self.malformed = Some("uppercase header field name");
            return;
        }
        let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        else {
            self.malformed = Some("invalid header field");
            return;
        };
        self.headers.append(name, value);
    }

    /// The most memory this head holds, as a connection counts an open
    /// stream's header list against its budget of held bytes: the octets of
    /// its names, values, method and path with a quarter more for the
    /// allocator's rounding, [`HELD_SLOT_BYTES`] for each slot of its header
    /// map, [`HELD_VALUE_BYTES`] a value and [`HELD_HEAD_BYTES`]
    /// (`tests/request_head_memory.rs` measures it). HTTP/2's size of a list
    /// (names, values and 32 bytes a field) is several times too small for a
    /// list of many tiny fields.
    pub fn held_bytes(&self) -> usize {
        let octets: usize = self
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum::<usize>()
            + self.method.as_ref().map_or(0, Vec::len)
            + self.path.as_ref().map_or(0, Vec::len);
        HELD_HEAD_BYTES
            + octets
            + octets / 4
            + self.headers.capacity() * HELD_SLOT_BYTES
            + self.headers.len() * HELD_VALUE_BYTES
    }

    /// The path when the head is a well-formed gRPC request: POST with a
    /// path. Otherwise the reason.
    pub fn validate(&self) -> Result<&[u8], &'static str> {
        if let Some(why) = self.malformed {
            return Err(why);
        }
        match (&self.method, &self.path) {
            (Some(m), Some(p)) if m == b"POST" && p.starts_with(b"/") => Ok(p),
            (Some(m), Some(_)) if m != b"POST" => Err("method is not POST"),
            _ => Err("missing :method or :path"),
        }
    }
}

/// `grpc-timeout`: at most 8 digits and a unit (H, M, S, m, u, n).
pub fn parse_timeout(value: &[u8]) -> Option<Duration> {
    let (unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(fields: &[(&str, &str)]) -> RequestHead {
        let mut h = RequestHead::default();
        for (n, v) in fields {
            h.field(n.as_bytes(), v.as_bytes());
        }
        h
    }

    #[test]
    fn a_grpc_request_head_keeps_its_path_and_metadata() {
        let h = head(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/etcdserverpb.KV/Put"),
            (":authority", "http://127.0.0.1:2379"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("token", "abc.1"),
            ("grpc-timeout", "250m"),
        ]);
        assert_eq!(h.validate().unwrap(), b"/etcdserverpb.KV/Put");
        assert_eq!(h.timeout, Some(Duration::from_millis(250)));
        assert_eq!(h.headers.get("token").unwrap(), "abc.1");
        assert!(!h.compressed);
    }

    #[test]
    fn malformed_heads_are_named() {
        for (fields, why) in [
            (
                vec![(":method", "GET"), (":path", "/x")],
                "method is not POST",
            ),
            (vec![(":method", "POST")], "missing :method or :path"),
            (
                vec![(":method", "POST"), ("a", "b"), (":path", "/x")],
                "pseudo-header after a regular field",
            ),
            (
                vec![(":method", "POST"), (":path", "/x"), (":path", "/y")],
                "repeated pseudo-header",
            ),
            (
                vec![(":method", "POST"), (":path", "/x"), (":status", "200")],
                "unknown pseudo-header",
            ),
            (
                vec![
                    (":method", "POST"),
                    (":path", "/x"),
                    ("connection", "close"),
                ],
                "connection-specific header field",
            ),
            (
                vec![(":method", "POST"), (":path", "/x"), ("Token", "a")],
                "uppercase header field name",
            ),
            (
                vec![(":method", "POST"), (":path", "/x"), ("bad name", "a")],
                "invalid header field",
            ),
        ] {
            assert_eq!(head(&fields).validate().unwrap_err(), why);
        }
    }

    #[test]
    fn timeouts_follow_the_grpc_units() {
        assert_eq!(parse_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout(b"3S"), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_timeout(b"99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(parse_timeout(b"5n"), Some(Duration::from_nanos(5)));
        for bad in [&b""[..], b"S", b"123456789S", b"1x", b"-1S", b"1.5S"] {
            assert_eq!(parse_timeout(bad), None, "{bad:?}");
        }
    }
}
