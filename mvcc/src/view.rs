//! Reads over one consistent state: a committed revision tree, the records
//! applied after it, and the key index. Shared by the store and its snapshots.

use std::rc::Rc;

use crate::btree::{self, Cursor};
use crate::error::ReadError;
use crate::index::{End, Found, Index};
use crate::pager::PageSource;
use crate::record::{Record, RecordView};
use crate::types::*;

pub(crate) struct View<'a> {
    pub src: &'a Rc<PageSource>,
    pub rev_root: u64,
    /// Records up to this revision are in the tree; later ones in `pending`.
    /// The revision the last commit reached; the tree may hold no record at it.
    pub committed_rev: i64,
    pub pending: &'a [Rc<Record>],
    pub index: &'a Index,
    /// What revision 0 means, and the newest readable revision: the revision
    /// the store has reached, which need not be the revision of a write.
    /// Reads at a revision no write has see the last write before it.
    pub current_rev: i64,
    pub compact_rev: i64,
}

impl View<'_> {
    /// Resolves a requested revision (0: current) and checks it is readable.
    pub(crate) fn check_rev(&self, rev: i64) -> Result<i64, ReadError> {
        if rev > self.current_rev {
            return Err(ReadError::FutureRevision {
                revision: rev,
                current_revision: self.current_rev,
            });
        }
        let at = if rev <= 0 { self.current_rev } else { rev };
        if at < self.compact_rev {
            return Err(ReadError::Compacted {
                revision: at,
                compact_revision: self.compact_rev,
            });
        }
        Ok(at)
    }

    fn missing(&self, rev: Revision) -> ReadError {
        ReadError::MissingRevision {
            file: self.src.file().to_string(),
            main: rev.main,
            sub: rev.sub,
        }
    }

    /// The record stored at `rev`.
    pub(crate) fn kv(&self, rev: Revision, keys_only: bool) -> Result<KeyValue, ReadError> {
        if rev.main > self.committed_rev {
            let i = self
                .pending
                .binary_search_by(|r| r.rev.cmp(&rev))
                .map_err(|_| self.missing(rev))?;
            let mut kv = self.pending[i].kv.clone();
            if keys_only {
                kv.value = Vec::new();
            }
            return Ok(kv);
        }
        let key = (rev.main as u64, rev.sub as u64);
        let Some((page, start, end)) = btree::get(self.src, self.rev_root, key)? else {
            return Err(self.missing(rev));
        };
        let v = btree::resolve(self.src, &page[start..end])?;
        let rec = RecordView::parse(&v).map_err(|_| self.missing(rev))?;
        Ok(rec.to_kv(keys_only))
    }

    /// Visits stored records from `from` in revision order, skipping those
    /// `skip` names, until `f` returns false.
    pub(crate) fn for_each_record(
        &self,
        from: Revision,
        skip: impl Fn(&Revision) -> bool,
        mut f: impl FnMut(Revision, &[u8]) -> bool,
    ) -> Result<(), ReadError> {
        let mut c = Cursor::seek(self.src, self.rev_root, (from.main as u64, from.sub as u64))?;
        while let Some((k, lv)) = c.next(self.src)? {
            let rev = Revision {
                main: k.0 as i64,
                sub: k.1 as i64,
            };
            if rev.main > self.committed_rev {
                break;
            }
            if skip(&rev) {
                continue;
            }
            let v = btree::resolve(self.src, lv)?;
            if !f(rev, &v) {
                return Ok(());
            }
        }
        let start = self.pending.partition_point(|r| r.rev < from);
        for r in &self.pending[start..] {
            if skip(&r.rev) {
                continue;
            }
            if !f(r.rev, &r.encode()) {
                break;
            }
        }
        Ok(())
    }

    /// etcd's Range, materialised (bounded by the caller's limit when unsorted).
    pub(crate) fn range(&self, req: &RangeRequest) -> Result<RangeResponse, ReadError> {
        if req.key.is_empty() {
            return Err(ReadError::EmptyKey);
        }
        let at = self.check_rev(req.revision)?;
        let end = End::from_range_end(&req.range_end);
        let mut resp = RangeResponse {
            revision: self.current_rev,
            ..RangeResponse::default()
        };
        if req.count_only {
            let mut n = 0;
            self.index.visit(&req.key, &end, at, None, false, |_, _| {
                n += 1;
                true
            });
            resp.count = n;
            return Ok(resp);
        }
        let filtered = req.min_mod_revision != 0
            || req.max_mod_revision != 0
            || req.min_create_revision != 0
            || req.max_create_revision != 0;
        let sort = effective_sort(req);
        // As etcd: fetch one extra to learn `more`, or everything when sorting
        // or filtering happens after the fetch.
        let fetch = if sort.is_some() || filtered || req.limit <= 0 {
            usize::MAX
        } else {
            req.limit as usize + 1
        };
        let mut founds: Vec<Found> = Vec::new();
        let mut total = 0i64;
        self.index.visit(&req.key, &end, at, None, false, |_, f| {
            total += 1;
            if founds.len() < fetch && passes_filters(req, &f) {
                founds.push(f);
            }
            true
        });
        resp.count = total;
        let need_values = !req.keys_only || req.sort_target == SortTarget::Value;
        let mut kvs = Vec::with_capacity(founds.len());
        for f in &founds {
            kvs.push(self.kv(f.modified, !need_values)?);
        }
        if let Some((target, descend)) = sort {
            sort_kvs(&mut kvs, target, descend);
        }
        if req.limit > 0 && kvs.len() > req.limit as usize {
            kvs.truncate(req.limit as usize);
            resp.more = true;
        }
        if req.keys_only {
            for kv in &mut kvs {
                kv.value = Vec::new();
            }
        }
        resp.kvs = kvs;
        Ok(resp)
    }

    /// Whether every compare of a txn holds (etcd stops at the first that
    /// does not).
    pub(crate) fn compares_hold(&self, compares: &[Compare]) -> Result<bool, ReadError> {
        for c in compares {
            if !self.compare(c)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// etcd's compare: every key in the range must satisfy it; a missing key
    /// compares as zero, except that a value compare on no key fails.
    pub(crate) fn compare(&self, c: &Compare) -> Result<bool, ReadError> {
        Ok(self
            .compare_present(c)?
            .unwrap_or_else(|| compare_absent(c)))
    }

    /// The compare over the keys of its range present here: None when there
    /// are none, else whether every one satisfies it. Stops at the first key
    /// that does not.
    pub(crate) fn compare_present(&self, c: &Compare) -> Result<Option<bool>, ReadError> {
        let end = End::from_range_end(&c.range_end);
        let reads_record = matches!(c.target, CompareTarget::Value(_) | CompareTarget::Lease(_));
        let mut any = false;
        let mut answer = Ok(true);
        self.index
            .visit(&c.key, &end, self.current_rev, None, false, |_, f| {
                any = true;
                let kv = if reads_record {
                    match self.kv(f.modified, false) {
                        Ok(kv) => kv,
                        Err(e) => {
                            answer = Err(e);
                            return false;
                        }
                    }
                } else {
                    KeyValue {
                        create_revision: f.created.main,
                        mod_revision: f.modified.main,
                        version: f.version,
                        ..KeyValue::default()
                    }
                };
                let holds = compare_kv(c, &kv);
                if !holds {
                    answer = Ok(false);
                }
                holds
            });
        if !any {
            return Ok(None);
        }
        answer.map(Some)
    }
}

/// etcd's compare on a range holding no key: a missing key compares as
/// zero, and a value compare fails.
pub fn compare_absent(c: &Compare) -> bool {
    match c.target {
        CompareTarget::Value(_) => false,
        _ => compare_kv(c, &KeyValue::default()),
    }
}

pub(crate) fn passes_filters(req: &RangeRequest, f: &Found) -> bool {
    let m = f.modified.main;
    let c = f.created.main;
    !(req.max_mod_revision != 0 && m > req.max_mod_revision
        || req.min_mod_revision != 0 && m < req.min_mod_revision
        || req.max_create_revision != 0 && c > req.max_create_revision
        || req.min_create_revision != 0 && c < req.min_create_revision)
}

/// etcd's normalisation: results come in key order, so ascending by key needs
/// no sort, and any other target without an order sorts ascending.
pub(crate) fn effective_sort(req: &RangeRequest) -> Option<(SortTarget, bool)> {
    match (req.sort_target, req.sort_order) {
        (SortTarget::Key, SortOrder::None | SortOrder::Ascend) => None,
        (t, SortOrder::Descend) => Some((t, true)),
        (t, _) => Some((t, false)),
    }
}

fn sort_kvs(kvs: &mut [KeyValue], target: SortTarget, descend: bool) {
    let key = |a: &KeyValue, b: &KeyValue| match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.version.cmp(&b.version),
        SortTarget::Create => a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => a.value.cmp(&b.value),
    };
    if descend {
        kvs.sort_by(|a, b| key(b, a));
    } else {
        kvs.sort_by(key);
    }
}

pub(crate) fn compare_kv(c: &Compare, kv: &KeyValue) -> bool {
    let ord = match &c.target {
        CompareTarget::Value(v) => kv.value.as_slice().cmp(v.as_slice()),
        CompareTarget::Version(v) => kv.version.cmp(v),
        CompareTarget::CreateRevision(v) => kv.create_revision.cmp(v),
        CompareTarget::ModRevision(v) => kv.mod_revision.cmp(v),
        CompareTarget::Lease(v) => kv.lease.cmp(v),
    };
    match c.result {
        CompareResult::Equal => ord.is_eq(),
        CompareResult::NotEqual => ord.is_ne(),
        CompareResult::Greater => ord.is_gt(),
        CompareResult::Less => ord.is_lt(),
    }
}
