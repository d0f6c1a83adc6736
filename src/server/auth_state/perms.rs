//! A user's permissions merged from all its roles: the key intervals it may
//! read and write, each list sorted and with overlapping or touching
//! intervals joined, so a check is one binary search.

use cairn_proto::authpb::{permission::Type as PermType, Permission};

/// `[start, end)`; `end` None reaches past every key.
type Interval = (Vec<u8>, Option<Vec<u8>>);

#[derive(Debug, Default, Clone)]
pub struct UserPerms {
    /// Holds the root role: may do everything.
    pub root: bool,
    read: Vec<Interval>,
    write: Vec<Interval>,
}

impl UserPerms {
    pub fn merge<'a>(root: bool, perms: impl Iterator<Item = &'a Permission>) -> UserPerms {
        let mut read = Vec::new();
        let mut write = Vec::new();
        for p in perms {
            let ivl = interval(&p.key, &p.range_end);
            match PermType::try_from(p.perm_type) {
                Ok(PermType::Read) => read.push(ivl),
                Ok(PermType::Write) => write.push(ivl),
                Ok(PermType::Readwrite) => {
                    read.push(ivl.clone());
                    write.push(ivl);
                }
                Err(_) => {}
            }
        }
        UserPerms {
            root,
            read: join(read),
            write: join(write),
        }
    }

    /// Whether the user may do `kind` on the key `key` (`range_end` empty) or
    /// on every key of `[key, range_end)` (`\0`: every key from `key` on).
    /// As etcd: the union of the user's intervals must cover the whole range.
    pub fn permits(&self, key: &[u8], range_end: &[u8], kind: PermType) -> bool {
        if self.root {
            return true;
        }
        let list = match kind {
            PermType::Read => &self.read,
            PermType::Write => &self.write,
            PermType::Readwrite => {
                return self.permits(key, range_end, PermType::Read)
                    && self.permits(key, range_end, PermType::Write)
            }
        };
        let (start, end) = interval(key, range_end);
        // The last joined interval starting at or before `start` is the only
        // one that can cover it.
        let i = list.partition_point(|(s, _)| s.as_slice() <= start.as_slice());
        if i == 0 {
            return false;
        }
        let (_, covered_to) = &list[i - 1];
        match (covered_to, end) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(c), Some(e)) => c.as_slice() >= e.as_slice(),
        }
    }
}

/// The interval a key and range end name.
fn interval(key: &[u8], range_end: &[u8]) -> Interval {
    if range_end.is_empty() {
        // One key: up to its immediate successor.
        let mut next = key.to_vec();
        next.push(0);
        (key.to_vec(), Some(next))
    } else if range_end == [0] {
        (key.to_vec(), None)
    } else {
        (key.to_vec(), Some(range_end.to_vec()))
    }
}

/// Sorts and joins overlapping or touching intervals.
fn join(mut list: Vec<Interval>) -> Vec<Interval> {
    list.sort();
    let mut out: Vec<Interval> = Vec::with_capacity(list.len());
    for (start, end) in list {
        if let Some((_, last_end)) = out.last_mut() {
            let touches = match last_end {
                None => true,
                Some(e) => start.as_slice() <= e.as_slice(),
            };
            if touches {
                *last_end = match (last_end.take(), end) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
                continue;
            }
        }
        out.push((start, end));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(t: PermType, key: &[u8], end: &[u8]) -> Permission {
        Permission {
            perm_type: t as i32,
            key: key.to_vec().into(),
            range_end: end.to_vec().into(),
        }
    }

    #[test]
    fn keys_prefixes_and_open_ranges() {
        let perms = [
            perm(PermType::Read, b"a", b""),
            perm(PermType::Readwrite, b"foo/", b"foo0"),
            perm(PermType::Write, b"z", &[0]),
        ];
        let p = UserPerms::merge(false, perms.iter());
        assert!(p.permits(b"a", b"", PermType::Read));
        assert!(!p.permits(b"a", b"", PermType::Write));
        assert!(!p.permits(b"a0", b"", PermType::Read));
        assert!(
            !p.permits(b"a", b"b", PermType::Read),
            "range wider than the key"
        );
        assert!(p.permits(b"foo/x", b"", PermType::Write));
        assert!(p.permits(b"foo/", b"foo0", PermType::Read));
        assert!(p.permits(b"foo/a", b"foo/b", PermType::Read));
        assert!(!p.permits(b"foo/", b"foo1", PermType::Read));
        assert!(!p.permits(b"foo", b"", PermType::Read));
        assert!(p.permits(b"zzz", &[0], PermType::Write));
        assert!(!p.permits(b"y", &[0], PermType::Write));
        assert!(!p.permits(b"zzz", b"", PermType::Read));
        assert!(UserPerms::merge(true, [].iter()).permits(b"", &[0], PermType::Readwrite));
    }

    #[test]
    fn a_range_covered_only_by_several_grants_together_is_permitted() {
        let perms = [
            perm(PermType::Read, b"a", b"c"),
            perm(PermType::Read, b"c", b"e"),
            perm(PermType::Read, b"b", b"d"),
        ];
        let p = UserPerms::merge(false, perms.iter());
        assert!(p.permits(b"a", b"e", PermType::Read));
        assert!(!p.permits(b"a", b"f", PermType::Read));
        let gap = [
            perm(PermType::Read, b"a", b"c"),
            perm(PermType::Read, b"d", b"e"),
        ];
        let p = UserPerms::merge(false, gap.iter());
        assert!(!p.permits(b"a", b"e", PermType::Read));
        assert!(p.permits(b"d", b"", PermType::Read));
    }
}
