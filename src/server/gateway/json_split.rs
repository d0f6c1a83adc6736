//! The JSON values of a streamed request body, found as its bytes arrive.
//!
//! A body may come in frames of any size, down to one byte. Each byte is
//! scanned once, whatever the framing: the scanner keeps its place (depth,
//! inside a string, after a backslash) between frames, and a value is handed
//! to serde only once its last byte is in. The bytes of values already taken
//! are dropped in bulk, once they are half of the buffer. Parsing the whole
//! unparsed text again at every frame, and moving the rest of the buffer
//! after every value, made a 2 MiB body sent a byte at a time (or holding
//! a million `{}`) cost the connection's core time quadratic in its length.

use serde_json::Value;

/// Values split off a stream of bytes.
#[derive(Debug, Default)]
pub struct JsonSplitter {
    buf: Vec<u8>,
    /// Bytes of `buf` already taken (values and the whitespace between them).
    taken: usize,
    scan: Scan,
}

/// Where the scan of the value starting at `taken` stands.
#[derive(Debug, Default, Clone, Copy)]
struct Scan {
    /// The next byte to look at, an index into the buffer.
    at: usize,
    /// Whether the value's first byte was seen.
    started: bool,
    /// Objects and arrays open.
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// A number or literal at the top level.
    scalar: bool,
}

impl JsonSplitter {
    /// Bytes received and not yet taken as part of a value.
    pub fn unparsed_len(&self) -> usize {
        self.buf.len() - self.taken
    }

    pub fn push(&mut self, data: &[u8]) {
        if self.taken > 0 && self.taken >= self.buf.len() / 2 {
            self.buf.drain(..self.taken);
            self.scan.at -= self.taken;
            self.taken = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next whole value; `None` when the bytes so far hold none (and,
    /// once `ended`, none is left). A value that does not parse, or text
    /// left unfinished at the end, is serde's error.
    pub fn next_value(&mut self, ended: bool) -> Option<Result<Value, serde_json::Error>> {
        let end = match self.scan.advance(&self.buf) {
            Some(end) => end,
            None if ended && self.scan.started => self.buf.len(),
            None => {
                if !self.scan.started {
                    // Only whitespace so far: nothing of it is needed.
                    self.taken = self.buf.len();
                    self.scan.at = self.buf.len();
                }
                return None;
            }
        };
        let value = serde_json::from_slice(&self.buf[self.taken..end]);
        self.taken = end;
        self.scan = Scan {
            at: end,
            ..Scan::default()
        };
        Some(value)
    }
}

impl Scan {
    /// Scans on from `at`; the end of the value once its last byte is seen.
    fn advance(&mut self, buf: &[u8]) -> Option<usize> {
        while let Some(&b) = buf.get(self.at) {
            self.at += 1;
            if !self.started {
                if b.is_ascii_whitespace() {
                    continue;
                }
                self.started = true;
                match b {
                    b'{' | b'[' => self.depth = 1,
                    b'"' => self.in_string = true,
                    // Not the start of any value: serde says what is wrong.
                    b'}' | b']' | b',' | b':' => return Some(self.at),
                    _ => self.scalar = true,
                }
                continue;
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if self.depth == 0 {
                        return Some(self.at);
                    }
                }
                continue;
            }
            if self.scalar {
                if b.is_ascii_whitespace() || b"{}[]\",:".contains(&b) {
                    // The scalar ended before this byte.
                    self.at -= 1;
                    return Some(self.at);
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Some(self.at);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value `text` splits into, fed in frames of the given sizes
    /// (cycled), as results: `Err` for a value serde refused.
    fn split(text: &[u8], frames: &[usize]) -> Vec<Result<Value, ()>> {
        let mut s = JsonSplitter::default();
        let mut out = Vec::new();
        let mut at = 0;
        for &n in frames.iter().cycle() {
            if at >= text.len() {
                break;
            }
            let end = (at + n.max(1)).min(text.len());
            s.push(&text[at..end]);
            at = end;
            while let Some(v) = s.next_value(false) {
                let failed = v.is_err();
                out.push(v.map_err(|_| ()));
                if failed {
                    return out;
                }
            }
        }
        while let Some(v) = s.next_value(true) {
            let failed = v.is_err();
            out.push(v.map_err(|_| ()));
            if failed {
                break;
            }
        }
        out
    }

    /// What serde's own stream reader makes of the whole text at once.
    fn serde_values(text: &[u8]) -> Vec<Result<Value, ()>> {
        let mut out = Vec::new();
        for v in serde_json::Deserializer::from_slice(text).into_iter::<Value>() {
            let failed = v.is_err();
            out.push(v.map_err(|_| ()));
            if failed {
                break;
            }
        }
        out
    }

    #[test]
    fn values_split_across_any_frames_come_out_as_serde_reads_them() {
        let texts: &[&[u8]] = &[
            br#"{"create_request":{"key":"YQ==","range_end":"Yg=="}}"#,
            b" {}{}\n{} [1,2,{\"a\":[]}]  ",
            br#"{"a":"}{\"]["} {"b":"\\"} {"c":"\\\\"}"#,
            br#""top" 12 -3.5e2 true null false {"x":1}"#,
            br#"{"a":1}{"b":"#,
            br#"{"a":1} {"b" 2}"#,
            br#"{"a":1} }"#,
            br#"{"a":1} 12x {"b":2}"#,
            br#"{"a":[1,2}"#,
            b"   \n\t ",
            b"",
            "{\"k\":\"\u{e9}\u{1F600}\"}".as_bytes(),
        ];
        for text in texts {
            let want = serde_values(text);
            for frames in [&[1][..], &[2], &[3, 1, 7], &[64], &[1000]] {
                assert_eq!(
                    split(text, frames),
                    want,
                    "{:?} in frames {frames:?}",
                    String::from_utf8_lossy(text)
                );
            }
        }
    }

    #[test]
    fn generated_streams_agree_with_serde() {
        let mut seed = 5u64;
        let mut below = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        const PIECES: &[&str] = &[
            "{", "}", "[", "]", "\"", "\\", ",", ":", " ", "\n", "a", "1", "-", "true", "\"s\"",
            "\"\\\"\"", "{\"k\":", "[1,", "{}", "null",
        ];
        let (mut whole, mut broken) = (0, 0);
        for _ in 0..20_000 {
            let text: String = (0..below(12))
                .map(|_| PIECES[below(PIECES.len() as u64) as usize])
                .collect();
            let want = serde_values(text.as_bytes());
            let frames = [1 + below(4) as usize, 1 + below(9) as usize];
            assert_eq!(split(text.as_bytes(), &frames), want, "{text:?} {frames:?}");
            if want.iter().all(Result::is_ok) && !want.is_empty() {
                whole += 1;
            } else if want.iter().any(Result::is_err) {
                broken += 1;
            }
        }
        assert!(
            whole > 500 && broken > 1_000,
            "{whole} whole, {broken} broken"
        );
    }

    #[test]
    fn taken_bytes_are_dropped_and_whitespace_is_not_kept() {
        let mut s = JsonSplitter::default();
        for _ in 0..10_000 {
            s.push(b"{}");
        }
        let mut n = 0;
        while let Some(v) = s.next_value(false) {
            assert!(v.is_ok());
            n += 1;
        }
        assert_eq!((n, s.unparsed_len()), (10_000, 0));
        s.push(b"   ");
        assert!(s.next_value(false).is_none());
        assert_eq!(s.unparsed_len(), 0);
        s.push(b"{\"a\":");
        assert!(s.next_value(false).is_none());
        assert_eq!(s.unparsed_len(), 5);
        s.push(b"1}");
        assert_eq!(s.next_value(false).map(|v| v.is_ok()), Some(true));
        assert!(s.buf.len() <= 16, "{} bytes kept", s.buf.len());
    }
}
