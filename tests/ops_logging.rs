//! Log output with `--log-format json`. Guards against log lines that a log
//! shipper cannot parse (one JSON object per line), fields such as shard and
//! term lost or folded into the message text, and `--log-level` not filtering.
//! This file holds a single test because it installs the global subscriber.

use std::io::Write;
use std::sync::{Arc, Mutex};

use cairn::ops::logging::{init_logging_to, LogFormat};

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn json_format_writes_one_object_per_event_with_fields() {
    let capture = Capture::default();
    let writer = capture.clone();
    init_logging_to(LogFormat::Json, "warn", move || writer.clone()).unwrap();
    assert!(
        init_logging_to(LogFormat::Human, "info", std::io::sink).is_err(),
        "a second subscriber must be refused"
    );

    tracing::info!(shard = 3u32, "filtered out below warn");
    tracing::warn!(shard = 3u32, term = 7u64, index = 42u64, "leader lost");

    let text = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    let event: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(event["level"], "WARN");
    assert_eq!(event["message"], "leader lost");
    assert_eq!(event["shard"], 3);
    assert_eq!(event["term"], 7);
    assert_eq!(event["index"], 42);
    assert!(event["timestamp"].is_string(), "{event}");
    assert!(
        !text.contains('\x1b'),
        "escape codes in captured logs: {text:?}"
    );
}
