//! etcd key ranges: `(key, range_end)`, `range_end` empty for the one key
//! and `"\0"` for every key from `key` on.

use bytes::Bytes;

/// Whether two etcd key ranges share a key.
pub(crate) fn ranges_overlap(a: &(Bytes, Bytes), b: &(Bytes, Bytes)) -> bool {
    starts_before_end(&a.0, b) && starts_before_end(&b.0, a)
}

/// Whether `start` is below the end of etcd key range `range`: `range_end`
/// empty for the one key (its end is the key followed by a zero byte) and
/// `"\0"` for every key from the key on.
fn starts_before_end(start: &[u8], (key, end): &(Bytes, Bytes)) -> bool {
    if end.is_empty() {
        start <= key.as_ref()
    } else if end.as_ref() == b"\0" {
        true
    } else {
        start < end.as_ref()
    }
}
