//! The copy-on-write B+tree on pages, keyed by `(u64, u64)`.
//!
//! Writes are applied as one sorted batch per commit: the batch is routed down
//! the tree, every touched node is rewritten into fresh pages, and siblings are
//! repacked on the way up so that nodes emptied by deletions (compaction) merge
//! with their neighbours instead of lingering half empty. Old pages are handed to
//! the pager, which reuses them once no reader can see them.
//!
//! Back of the envelope: a 4 KiB leaf holds 12 records of 256-byte values and a
//! branch 169 children, so 1,000,000 records need 3 levels; a commit of 1000
//! appended records writes about 84 leaves and 2 branches (344 KiB).

use std::borrow::Cow;

use crate::page::{
    self, get_u16, get_u32, get_u64, put_u16, put_u32, put_u64, CorruptPage, PageFault, BODY_BYTES,
    BRANCH_ENTRY_BYTES, HEADER_BYTES, INLINE_VALUE_MAX_BYTES, KIND_BRANCH, KIND_LEAF,
    KIND_OVERFLOW, LEAF_ENTRY_FIXED_BYTES, LEAF_SLOT_BYTES, OVERFLOW_DATA_BYTES,
    OVERFLOW_DATA_OFFSET, OVERFLOW_LEN_OFFSET, OVERFLOW_NEXT_OFFSET, PAGE_SIZE_BYTES,
};
use crate::pager::{PageRead, PageRef, Pager};

pub(crate) type TreeKey = (u64, u64);

/// Leaf value kinds (first byte of a stored leaf value).
const VAL_INLINE: u8 = 0;
const VAL_OVERFLOW: u8 = 1;
const OVERFLOW_REF_BYTES: usize = 1 + size_of::<u32>() + size_of::<u64>();

/// A node is repacked with its neighbour when it holds less than this.
const MIN_FILL_BYTES: usize = BODY_BYTES / 4;

fn bad(r: &impl PageRead, id: u64, what: &'static str) -> CorruptPage {
    CorruptPage {
        file: r.file_name().to_string(),
        page: id,
        fault: PageFault::Malformed(what),
    }
}

fn wrong_kind(r: &impl PageRead, id: u64, expected: &'static str, found: u8) -> CorruptPage {
    CorruptPage {
        file: r.file_name().to_string(),
        page: id,
        fault: PageFault::WrongKind { expected, found },
    }
}

/// Checks the structure of a tree page beyond its CRC, so entry accessors can
/// slice without further checks. Runs with the CRC check, once per page write.
pub(crate) fn check_node(p: &[u8]) -> Result<(), PageFault> {
    let kind = p[page::KIND_OFFSET];
    let n = page::count(p);
    match kind {
        KIND_BRANCH if n == 0 || HEADER_BYTES + n * BRANCH_ENTRY_BYTES > PAGE_SIZE_BYTES => {
            return Err(PageFault::Malformed("branch entry count"));
        }
        KIND_LEAF => {
            let slots_end = HEADER_BYTES + n * LEAF_SLOT_BYTES;
            if slots_end > PAGE_SIZE_BYTES {
                return Err(PageFault::Malformed("leaf entry count"));
            }
            for i in 0..n {
                let off = get_u16(p, HEADER_BYTES + i * LEAF_SLOT_BYTES) as usize;
                if off < slots_end || off + LEAF_ENTRY_FIXED_BYTES > PAGE_SIZE_BYTES {
                    return Err(PageFault::Malformed("leaf slot offset"));
                }
                let vlen = get_u16(p, off + 16) as usize;
                if vlen == 0 || off + LEAF_ENTRY_FIXED_BYTES + vlen > PAGE_SIZE_BYTES {
                    return Err(PageFault::Malformed("leaf value length"));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn read_node(r: &impl PageRead, id: u64) -> Result<(PageRef, u8), CorruptPage> {
    let p = r.read_page(id)?;
    let kind = p[page::KIND_OFFSET];
    if kind != KIND_BRANCH && kind != KIND_LEAF {
        return Err(wrong_kind(r, id, "tree node", kind));
    }
    Ok((p, kind))
}

pub(crate) fn branch_entry(p: &[u8], i: usize) -> (TreeKey, u64) {
    let off = HEADER_BYTES + i * BRANCH_ENTRY_BYTES;
    ((get_u64(p, off), get_u64(p, off + 8)), get_u64(p, off + 16))
}

pub(crate) fn leaf_entry(p: &[u8], i: usize) -> (TreeKey, &[u8]) {
    let off = get_u16(p, HEADER_BYTES + i * LEAF_SLOT_BYTES) as usize;
    let vlen = get_u16(p, off + 16) as usize;
    let v = off + LEAF_ENTRY_FIXED_BYTES;
    ((get_u64(p, off), get_u64(p, off + 8)), &p[v..v + vlen])
}

/// Index of the child of branch `p` whose subtree may hold `key`.
fn route(p: &[u8], key: TreeKey) -> usize {
    let n = page::count(p);
    let (mut lo, mut hi) = (0usize, n);
    // First child whose key is greater than `key`; the one before it routes.
    while lo < hi {
        let mid = (lo + hi) / 2;
        if branch_entry(p, mid).0 <= key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo.saturating_sub(1)
}

/// Index of the first leaf entry at or after `key`.
fn leaf_seek(p: &[u8], key: TreeKey) -> usize {
    let n = page::count(p);
    let (mut lo, mut hi) = (0usize, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if leaf_entry(p, mid).0 < key {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Resolves a stored leaf value to the logical value, following overflow pages.
pub(crate) fn resolve<'v>(r: &impl PageRead, lv: &'v [u8]) -> Result<Cow<'v, [u8]>, CorruptPage> {
    match lv[0] {
        VAL_INLINE => Ok(Cow::Borrowed(&lv[1..])),
        VAL_OVERFLOW if lv.len() == OVERFLOW_REF_BYTES => {
            let total = get_u32(lv, 1) as usize;
            let first = get_u64(lv, 5);
            let mut out = Vec::with_capacity(total);
            walk_overflow(r, first, total, |_, data| out.extend_from_slice(data))?;
            Ok(Cow::Owned(out))
        }
        _ => Err(CorruptPage {
            file: r.file_name().to_string(),
            page: 0,
            fault: PageFault::Malformed("leaf value kind"),
        }),
    }
}

fn walk_overflow(
    r: &impl PageRead,
    first: u64,
    total: usize,
    mut f: impl FnMut(u64, &[u8]),
) -> Result<(), CorruptPage> {
    let mut next = first;
    let mut seen = 0usize;
    while seen < total {
        if next == 0 {
            return Err(bad(r, first, "overflow chain ends early"));
        }
        let p = r.read_page(next)?;
        if p[page::KIND_OFFSET] != KIND_OVERFLOW {
            return Err(wrong_kind(r, next, "overflow", p[page::KIND_OFFSET]));
        }
        let len = get_u32(&p, OVERFLOW_LEN_OFFSET) as usize;
        if len == 0 || len > OVERFLOW_DATA_BYTES || seen + len > total {
            return Err(bad(r, next, "overflow data length"));
        }
        f(next, &p[OVERFLOW_DATA_OFFSET..OVERFLOW_DATA_OFFSET + len]);
        seen += len;
        next = get_u64(&p, OVERFLOW_NEXT_OFFSET);
    }
    Ok(())
}

fn overflow_pages(r: &impl PageRead, lv: &[u8]) -> Result<Vec<u64>, CorruptPage> {
    let mut pages = Vec::new();
    if lv[0] == VAL_OVERFLOW {
        walk_overflow(r, get_u64(lv, 5), get_u32(lv, 1) as usize, |id, _| {
            pages.push(id)
        })?;
    }
    Ok(pages)
}

/// Finds `key`; returns the page holding it and the stored value's byte range.
pub(crate) fn get(
    r: &impl PageRead,
    root: u64,
    key: TreeKey,
) -> Result<Option<(PageRef, usize, usize)>, CorruptPage> {
    if root == 0 {
        return Ok(None);
    }
    let mut id = root;
    loop {
        let (p, kind) = read_node(r, id)?;
        if kind == KIND_BRANCH {
            id = branch_entry(&p, route(&p, key)).1;
            continue;
        }
        let i = leaf_seek(&p, key);
        if i < page::count(&p) {
            let (k, v) = leaf_entry(&p, i);
            if k == key {
                let start = v.as_ptr() as usize - p.as_ptr() as usize;
                let end = start + v.len();
                return Ok(Some((p, start, end)));
            }
        }
        return Ok(None);
    }
}

/// An in-order cursor over the entries of one tree version.
pub(crate) struct Cursor {
    stack: Vec<(PageRef, usize)>,
    leaf: Option<(PageRef, usize)>,
}

impl Cursor {
    /// Positions before the first entry at or after `key`.
    pub(crate) fn seek(r: &impl PageRead, root: u64, key: TreeKey) -> Result<Cursor, CorruptPage> {
        let mut c = Cursor {
            stack: Vec::new(),
            leaf: None,
        };
        if root == 0 {
            return Ok(c);
        }
        let mut id = root;
        loop {
            let (p, kind) = read_node(r, id)?;
            if kind == KIND_BRANCH {
                let i = route(&p, key);
                id = branch_entry(&p, i).1;
                c.stack.push((p, i));
            } else {
                let i = leaf_seek(&p, key);
                c.leaf = Some((p, i));
                return Ok(c);
            }
        }
    }

    /// The next entry: its key and stored value (resolve it with [`resolve`]).
    pub(crate) fn next(
        &mut self,
        r: &impl PageRead,
    ) -> Result<Option<(TreeKey, &[u8])>, CorruptPage> {
        loop {
            match &self.leaf {
                Some((p, i)) if *i < page::count(p) => break,
                _ => {}
            }
            self.leaf = None;
            // Climb to the first ancestor with a further child, then go leftmost.
            let mut child = None;
            while let Some((p, i)) = self.stack.last_mut() {
                *i += 1;
                if *i < page::count(p) {
                    child = Some(branch_entry(p, *i).1);
                    break;
                }
                self.stack.pop();
            }
            let Some(mut id) = child else {
                return Ok(None);
            };
            loop {
                let (p, kind) = read_node(r, id)?;
                if kind == KIND_BRANCH {
                    id = branch_entry(&p, 0).1;
                    self.stack.push((p, 0));
                } else {
                    self.leaf = Some((p, 0));
                    break;
                }
            }
        }
        let (p, i) = self.leaf.as_mut().expect("positioned on a leaf");
        let at = *i;
        *i += 1;
        Ok(Some(leaf_entry(p, at)))
    }
}

pub(crate) type EntryVisitor<'a> = dyn FnMut(TreeKey, &[u8]) -> Result<(), CorruptPage> + 'a;

/// Visits every page (branches, leaves, overflow) and every entry in key order.
pub(crate) fn walk(
    r: &impl PageRead,
    root: u64,
    on_page: &mut dyn FnMut(u64),
    on_entry: &mut EntryVisitor<'_>,
) -> Result<(), CorruptPage> {
    if root == 0 {
        return Ok(());
    }
    let (p, kind) = read_node(r, root)?;
    on_page(root);
    if kind == KIND_BRANCH {
        for i in 0..page::count(&p) {
            walk(r, branch_entry(&p, i).1, on_page, on_entry)?;
        }
        return Ok(());
    }
    for i in 0..page::count(&p) {
        let (k, lv) = leaf_entry(&p, i);
        if lv[0] == VAL_OVERFLOW {
            for id in overflow_pages(r, lv)? {
                on_page(id);
            }
        }
        let v = resolve(r, lv)?;
        on_entry(k, &v)?;
    }
    Ok(())
}

trait Entry: Sized {
    const KIND: u8;
    fn size(&self) -> usize;
    fn key(&self) -> TreeKey;
    fn decode(p: &[u8]) -> Vec<Self>;
    fn encode(es: &[Self]) -> Vec<u8>;
}

type LeafE = (TreeKey, Vec<u8>);
type BranchE = (TreeKey, u64);

impl Entry for LeafE {
    const KIND: u8 = KIND_LEAF;
    fn size(&self) -> usize {
        LEAF_SLOT_BYTES + LEAF_ENTRY_FIXED_BYTES + self.1.len()
    }
    fn key(&self) -> TreeKey {
        self.0
    }
    fn decode(p: &[u8]) -> Vec<Self> {
        (0..page::count(p))
            .map(|i| {
                let (k, v) = leaf_entry(p, i);
                (k, v.to_vec())
            })
            .collect()
    }
    fn encode(es: &[Self]) -> Vec<u8> {
        let mut b = vec![0u8; PAGE_SIZE_BYTES];
        let mut off = HEADER_BYTES + es.len() * LEAF_SLOT_BYTES;
        for (i, (k, v)) in es.iter().enumerate() {
            put_u16(&mut b, HEADER_BYTES + i * LEAF_SLOT_BYTES, off as u16);
            put_u64(&mut b, off, k.0);
            put_u64(&mut b, off + 8, k.1);
            put_u16(&mut b, off + 16, v.len() as u16);
            let v_off = off + LEAF_ENTRY_FIXED_BYTES;
            b[v_off..v_off + v.len()].copy_from_slice(v);
            off = v_off + v.len();
        }
        assert!(off <= PAGE_SIZE_BYTES, "leaf overfilled: {off} bytes");
        b
    }
}

impl Entry for BranchE {
    const KIND: u8 = KIND_BRANCH;
    fn size(&self) -> usize {
        BRANCH_ENTRY_BYTES
    }
    fn key(&self) -> TreeKey {
        self.0
    }
    fn decode(p: &[u8]) -> Vec<Self> {
        (0..page::count(p)).map(|i| branch_entry(p, i)).collect()
    }
    fn encode(es: &[Self]) -> Vec<u8> {
        let mut b = vec![0u8; PAGE_SIZE_BYTES];
        for (i, (k, c)) in es.iter().enumerate() {
            let off = HEADER_BYTES + i * BRANCH_ENTRY_BYTES;
            put_u64(&mut b, off, k.0);
            put_u64(&mut b, off + 8, k.1);
            put_u64(&mut b, off + 16, *c);
        }
        assert!(HEADER_BYTES + es.len() * BRANCH_ENTRY_BYTES <= PAGE_SIZE_BYTES);
        b
    }
}

enum Item<E> {
    Kept(BranchE),
    Fresh(Vec<E>),
}

enum NodeOut {
    Leaf(Vec<LeafE>),
    Branch(Vec<BranchE>),
}

/// A batch mutation: `Some` inserts or replaces, `None` deletes.
pub(crate) type Mutation = (TreeKey, Option<Vec<u8>>);

/// Applies mutations (sorted by key, unique) to the tree at `root` inside the
/// commit the pager is building; returns the new root (0 for an empty tree).
pub(crate) fn apply(pg: &mut Pager, root: u64, muts: Vec<Mutation>) -> Result<u64, CorruptPage> {
    if muts.is_empty() {
        return Ok(root);
    }
    debug_assert!(
        muts.windows(2).all(|w| w[0].0 < w[1].0),
        "mutations unsorted"
    );
    let mut prepared = Vec::with_capacity(muts.len());
    for (k, v) in muts {
        let lv = v.map(|v| store_value(pg, v));
        prepared.push((k, lv));
    }
    let mut refs = if root == 0 {
        let fresh: Vec<LeafE> = prepared
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        pack::<LeafE>(pg, vec![Item::Fresh(fresh)])?
    } else {
        let (p, kind) = read_node(&*pg, root)?;
        match apply_node(pg, root, p, kind, &mut prepared)? {
            NodeOut::Leaf(es) => pack::<LeafE>(pg, vec![Item::Fresh(es)])?,
            NodeOut::Branch(es) => pack::<BranchE>(pg, vec![Item::Fresh(es)])?,
        }
    };
    while refs.len() > 1 {
        refs = pack::<BranchE>(pg, vec![Item::Fresh(refs)])?;
    }
    let Some(&(_, mut new_root)) = refs.first() else {
        return Ok(0);
    };
    loop {
        let (p, kind) = read_node(&*pg, new_root)?;
        if kind != KIND_BRANCH || page::count(&p) != 1 {
            return Ok(new_root);
        }
        let child = branch_entry(&p, 0).1;
        pg.release(new_root);
        new_root = child;
    }
}

/// Turns a logical value into its stored form, spilling long ones to overflow
/// pages. A short value keeps its buffer: the tag goes in front of it (a move
/// within the buffer, no new allocation when it has a spare octet).
fn store_value(pg: &mut Pager, v: Vec<u8>) -> Vec<u8> {
    if v.len() <= INLINE_VALUE_MAX_BYTES {
        let mut lv = v;
        lv.insert(0, VAL_INLINE);
        return lv;
    }
    let chunks: Vec<&[u8]> = v.chunks(OVERFLOW_DATA_BYTES).collect();
    let ids: Vec<u64> = chunks.iter().map(|_| pg.alloc()).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let mut b = vec![0u8; PAGE_SIZE_BYTES];
        put_u64(
            &mut b,
            OVERFLOW_NEXT_OFFSET,
            ids.get(i + 1).copied().unwrap_or(0),
        );
        put_u32(&mut b, OVERFLOW_LEN_OFFSET, chunk.len() as u32);
        b[OVERFLOW_DATA_OFFSET..OVERFLOW_DATA_OFFSET + chunk.len()].copy_from_slice(chunk);
        pg.write(ids[i], b, KIND_OVERFLOW, 0);
    }
    let mut lv = vec![VAL_OVERFLOW];
    lv.extend_from_slice(&(v.len() as u32).to_le_bytes());
    lv.extend_from_slice(&ids[0].to_le_bytes());
    lv
}

fn drop_value(pg: &mut Pager, lv: &[u8]) -> Result<(), CorruptPage> {
    for id in overflow_pages(&*pg, lv)? {
        pg.release(id);
    }
    Ok(())
}

type Prepared = (TreeKey, Option<Vec<u8>>);

fn apply_node(
    pg: &mut Pager,
    id: u64,
    p: PageRef,
    kind: u8,
    muts: &mut [Prepared],
) -> Result<NodeOut, CorruptPage> {
    if kind == KIND_LEAF {
        let old = LeafE::decode(&p);
        drop(p);
        let mut out = Vec::with_capacity(old.len() + muts.len());
        // Each mutation reaches one leaf: its value moves there.
        let mut mi = muts.iter_mut().peekable();
        for (k, v) in old {
            while let Some((mk, mv)) = mi.next_if(|m| m.0 < k) {
                if let Some(mv) = mv.take() {
                    out.push((*mk, mv));
                }
            }
            match mi.next_if(|m| m.0 == k) {
                Some((_, Some(nv))) => {
                    drop_value(pg, &v)?;
                    out.push((k, std::mem::take(nv)));
                }
                Some((_, None)) => drop_value(pg, &v)?,
                None => out.push((k, v)),
            }
        }
        for (mk, mv) in mi {
            if let Some(mv) = mv.take() {
                out.push((*mk, mv));
            }
        }
        pg.release(id);
        return Ok(NodeOut::Leaf(out));
    }
    let children = BranchE::decode(&p);
    drop(p);
    // Split the batch by child: child i takes keys below child i+1's first key.
    let mut parts = Vec::with_capacity(children.len());
    let mut start = 0usize;
    for i in 0..children.len() {
        let end = match children.get(i + 1) {
            Some((next_key, _)) => start + muts[start..].partition_point(|m| m.0 < *next_key),
            None => muts.len(),
        };
        parts.push(start..end);
        start = end;
    }
    let mut leaf_items: Vec<Item<LeafE>> = Vec::new();
    let mut branch_items: Vec<Item<BranchE>> = Vec::new();
    let mut child_kind = None;
    for (i, &(ck, cid)) in children.iter().enumerate() {
        let part = &mut muts[parts[i].clone()];
        if part.is_empty() {
            leaf_items.push(Item::Kept((ck, cid)));
            branch_items.push(Item::Kept((ck, cid)));
            continue;
        }
        let (cp, ckind) = read_node(&*pg, cid)?;
        if *child_kind.get_or_insert(ckind) != ckind {
            return Err(bad(&*pg, id, "children of mixed levels"));
        }
        match apply_node(pg, cid, cp, ckind, part)? {
            NodeOut::Leaf(es) => leaf_items.push(Item::Fresh(es)),
            NodeOut::Branch(es) => branch_items.push(Item::Fresh(es)),
        }
    }
    let refs = match child_kind {
        Some(KIND_LEAF) => pack::<LeafE>(pg, leaf_items)?,
        Some(_) => pack::<BranchE>(pg, branch_items)?,
        None => unreachable!("apply_node called on {id} without mutations"),
    };
    pg.release(id);
    Ok(NodeOut::Branch(refs))
}

fn load<E: Entry>(pg: &mut Pager, id: u64) -> Result<Vec<E>, CorruptPage> {
    let (p, kind) = read_node(&*pg, id)?;
    if kind != E::KIND {
        return Err(wrong_kind(&*pg, id, "sibling of the same level", kind));
    }
    let es = E::decode(&p);
    drop(p);
    pg.release(id);
    Ok(es)
}

fn emit<E: Entry>(pg: &mut Pager, es: &[E], out: &mut Vec<BranchE>) {
    let id = pg.alloc();
    pg.write(id, E::encode(es), E::KIND, es.len() as u16);
    out.push((es[0].key(), id));
}

/// Writes `acc` as full pages, keeping back a tail that is less than a page.
fn emit_full<E: Entry>(
    pg: &mut Pager,
    acc: &mut Vec<E>,
    bytes: &mut usize,
    out: &mut Vec<BranchE>,
) {
    let mut start = 0usize;
    while *bytes > BODY_BYTES {
        let mut end = start;
        let mut used = 0usize;
        while used + acc[end].size() <= BODY_BYTES {
            used += acc[end].size();
            end += 1;
        }
        emit(pg, &acc[start..end], out);
        start = end;
        *bytes -= used;
    }
    // One shift of the tail instead of one per emitted page.
    acc.drain(..start);
}

/// Lays out one level: kept children stay where they are unless a fresh,
/// underfull neighbour needs them to merge with; fresh entries fill pages.
fn pack<E: Entry>(pg: &mut Pager, items: Vec<Item<E>>) -> Result<Vec<BranchE>, CorruptPage> {
    let mut out: Vec<BranchE> = Vec::new();
    let mut acc: Vec<E> = Vec::new();
    let mut bytes = 0usize;
    for item in items {
        match item {
            Item::Kept(r) => {
                if acc.is_empty() {
                    out.push(r);
                } else if bytes >= MIN_FILL_BYTES {
                    emit_full(pg, &mut acc, &mut bytes, &mut out);
                    emit(pg, &acc, &mut out);
                    acc.clear();
                    bytes = 0;
                    out.push(r);
                } else {
                    let es = load::<E>(pg, r.1)?;
                    bytes += es.iter().map(Entry::size).sum::<usize>();
                    acc.extend(es);
                    emit_full(pg, &mut acc, &mut bytes, &mut out);
                }
            }
            Item::Fresh(es) => {
                bytes += es.iter().map(Entry::size).sum::<usize>();
                acc.extend(es);
                emit_full(pg, &mut acc, &mut bytes, &mut out);
            }
        }
    }
    if !acc.is_empty() {
        if bytes < MIN_FILL_BYTES {
            if let Some(&(_, last)) = out.last() {
                // Merge an underfull tail into the node before it.
                out.pop();
                let mut es = load::<E>(pg, last)?;
                bytes += es.iter().map(Entry::size).sum::<usize>();
                es.append(&mut acc);
                acc = es;
            }
        }
        emit_full(pg, &mut acc, &mut bytes, &mut out);
        if !acc.is_empty() {
            emit(pg, &acc, &mut out);
        }
    }
    Ok(out)
}

/// Copies every page at or past `limit` (and its ancestors) to a lower free
/// page, writing at most `budget` pages; returns the new root.
pub(crate) fn relocate(
    pg: &mut Pager,
    root: u64,
    limit: u64,
    budget: &mut usize,
) -> Result<u64, CorruptPage> {
    if root == 0 {
        return Ok(0);
    }
    Ok(relocate_node(pg, root, limit, budget)?.unwrap_or(root))
}

fn relocate_node(
    pg: &mut Pager,
    id: u64,
    limit: u64,
    budget: &mut usize,
) -> Result<Option<u64>, CorruptPage> {
    if *budget == 0 {
        return Ok(None);
    }
    let (p, kind) = read_node(&*pg, id)?;
    let mut changed = false;
    if kind == KIND_BRANCH {
        let mut es = BranchE::decode(&p);
        drop(p);
        for e in es.iter_mut() {
            if let Some(n) = relocate_node(pg, e.1, limit, budget)? {
                e.1 = n;
                changed = true;
            }
        }
        // A node whose children moved must be rewritten even past the budget.
        if changed || (id >= limit && *budget > 0) {
            *budget = budget.saturating_sub(1);
            pg.release(id);
            let nid = pg.alloc();
            pg.write(nid, BranchE::encode(&es), KIND_BRANCH, es.len() as u16);
            return Ok(Some(nid));
        }
        return Ok(None);
    }
    let mut es = LeafE::decode(&p);
    drop(p);
    for e in es.iter_mut() {
        if e.1[0] == VAL_OVERFLOW && *budget > 0 {
            let pages = overflow_pages(&*pg, &e.1)?;
            if pages.iter().any(|&x| x >= limit) {
                let v = resolve(&*pg, &e.1)?.into_owned();
                for x in pages {
                    pg.release(x);
                }
                *budget = budget.saturating_sub(v.len().div_ceil(OVERFLOW_DATA_BYTES));
                e.1 = store_value(pg, v);
                changed = true;
            }
        }
    }
    if changed || id >= limit {
        *budget = budget.saturating_sub(1);
        pg.release(id);
        let nid = pg.alloc();
        pg.write(nid, LeafE::encode(&es), KIND_LEAF, es.len() as u16);
        return Ok(Some(nid));
    }
    Ok(None)
}
