//! Page access: the read side ([`PageSource`], shared by snapshots) and the
//! writer's allocator with its dirty pages and free lists ([`Pager`]).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Deref;
use std::rc::Rc;

use crate::page::{self, CorruptPage, PageFault, PAGE_SIZE_BYTES};
use crate::storage::Storage;

pub(crate) type SharedStorage = Rc<RefCell<Box<dyn Storage>>>;

/// Where committed pages are read from. A snapshot keeps the source it was
/// taken with, so a remap after the file grew never invalidates its pages.
pub(crate) enum PageSource {
    /// A read-only shared mapping of the real file. `checked` has a bit per
    /// page whose CRC was verified since it was last written: mapped pages do
    /// not change while reachable, so each is checked once, not on every read.
    Map {
        map: memmap2::Mmap,
        file: Rc<str>,
        checked: RefCell<Vec<u64>>,
    },
    /// Positioned reads through the storage seam (in-memory test backends).
    Io {
        storage: SharedStorage,
        file: Rc<str>,
    },
}

impl PageSource {
    /// Maps the file; `prev` passes on which pages were already checked.
    pub(crate) fn new(
        storage: &SharedStorage,
        file: &Rc<str>,
        prev: Option<&PageSource>,
    ) -> std::io::Result<PageSource> {
        let st = storage.borrow();
        if let Some(f) = st.file() {
            // SAFETY: the file is locked against other processes (flock at open),
            // and this process never writes a page that a live reader can reach:
            // pages are copy-on-write and reused only once no snapshot or meta that
            // refers to them is live. The file is shrunk only past pages that are
            // free for every reader. So the bytes behind any slice handed out from
            // this mapping do not change while the slice is alive.
            // Not populated: pages become resident as they are read, so the
            // mapping costs memory for the pages in use, not the whole file,
            // and a remap after the file grew does not fault in every page.
            let map = unsafe { memmap2::MmapOptions::new().map(f)? };
            let words = (map.len() / PAGE_SIZE_BYTES).div_ceil(64);
            let mut checked = match prev {
                Some(PageSource::Map { checked, .. }) => checked.borrow().clone(),
                _ => Vec::new(),
            };
            checked.resize(words, 0);
            return Ok(PageSource::Map {
                map,
                file: file.clone(),
                checked: RefCell::new(checked),
            });
        }
        Ok(PageSource::Io {
            storage: storage.clone(),
            file: file.clone(),
        })
    }

    pub(crate) fn file(&self) -> &str {
        match self {
            PageSource::Map { file, .. } | PageSource::Io { file, .. } => file,
        }
    }

    fn fault(&self, page: u64, fault: PageFault) -> CorruptPage {
        CorruptPage {
            file: self.file().to_string(),
            page,
            fault,
        }
    }

    /// Marks pages as rewritten: their next read checks them again.
    pub(crate) fn forget(&self, ids: impl Iterator<Item = u64>) {
        if let PageSource::Map { checked, .. } = self {
            let mut c = checked.borrow_mut();
            for id in ids {
                if let Some(w) = c.get_mut(id as usize / 64) {
                    *w &= !(1u64 << (id % 64));
                }
            }
        }
    }

    /// Reads page `id` and checks its CRC and id.
    pub(crate) fn page(self: &Rc<Self>, id: u64) -> Result<PageRef, CorruptPage> {
        let off = id as usize * PAGE_SIZE_BYTES;
        let r = match &**self {
            PageSource::Map { map, checked, .. } => {
                if off + PAGE_SIZE_BYTES > map.len() {
                    return Err(self.fault(id, PageFault::BeyondEnd));
                }
                let r = PageRef(Repr::Map(self.clone(), off));
                let (w, bit) = (id as usize / 64, 1u64 << (id % 64));
                if checked.borrow()[w] & bit != 0 {
                    return Ok(r);
                }
                page::verify(&r, id).map_err(|f| self.fault(id, f))?;
                checked.borrow_mut()[w] |= bit;
                return Ok(r);
            }
            PageSource::Io { storage, .. } => {
                let mut buf = vec![0u8; PAGE_SIZE_BYTES].into_boxed_slice();
                storage
                    .borrow()
                    .read_at(&mut buf, off as u64)
                    .map_err(|e| self.fault(id, PageFault::Io(e.to_string())))?;
                PageRef(Repr::Owned(buf))
            }
        };
        page::verify(&r, id).map_err(|f| self.fault(id, f))?;
        Ok(r)
    }
}

enum Repr {
    Map(Rc<PageSource>, usize),
    Owned(Box<[u8]>),
}

/// One page's bytes, kept alive by a reference to its source.
pub(crate) struct PageRef(Repr);

impl PageRef {
    pub(crate) fn owned(b: Vec<u8>) -> PageRef {
        PageRef(Repr::Owned(b.into_boxed_slice()))
    }
}

impl Deref for PageRef {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Map(src, off) => match &**src {
                PageSource::Map { map, .. } => &map[*off..*off + PAGE_SIZE_BYTES],
                PageSource::Io { .. } => unreachable!("mapped page ref over an io source"),
            },
            Repr::Owned(b) => b,
        }
    }
}

/// Anything pages can be read from: a snapshot's source or the writer's pager.
pub(crate) trait PageRead {
    fn read_page(&self, id: u64) -> Result<PageRef, CorruptPage>;
    fn file_name(&self) -> &str;
}

impl PageRead for Rc<PageSource> {
    fn read_page(&self, id: u64) -> Result<PageRef, CorruptPage> {
        self.page(id)
    }
    fn file_name(&self) -> &str {
        self.file()
    }
}

/// The writer's view of the file: allocation, pages written by the commit being
/// built, and pages waiting until no reader can see them.
pub(crate) struct Pager {
    pub storage: SharedStorage,
    pub file: Rc<str>,
    pub source: Rc<PageSource>,
    /// File length in pages.
    pub file_pages: u64,
    /// Pages at or past this id have never been handed out since open.
    pub high_water: u64,
    /// Pages no meta and no live snapshot can reach; lowest first.
    pub free: BTreeSet<u64>,
    /// Pages freed by commit `txn`, visible to snapshots older than `txn`.
    pub pending_free: VecDeque<(u64, Vec<u64>)>,
    /// Pages written by the commit being built.
    pub dirty: BTreeMap<u64, Vec<u8>>,
    /// Pages of the committed trees that the commit being built replaces.
    pub freed_now: Vec<u64>,
    /// Id of the commit being built.
    pub txn: u64,
}

impl Pager {
    pub(crate) fn alloc(&mut self) -> u64 {
        if let Some(p) = self.free.pop_first() {
            return p;
        }
        let p = self.high_water;
        self.high_water += 1;
        p
    }

    /// Releases a page the tree no longer uses.
    pub(crate) fn release(&mut self, id: u64) {
        assert!(
            id >= page::META_PAGES,
            "{}: released meta page {id}",
            self.file
        );
        if self.dirty.remove(&id).is_some() {
            // Written by this very commit: nothing durable or live refers to it.
            self.free.insert(id);
        } else {
            self.freed_now.push(id);
        }
    }

    /// Seals `page` under `id` and queues it for the commit.
    pub(crate) fn write(&mut self, id: u64, mut page: Vec<u8>, kind: u8, count: u16) {
        page::seal(&mut page, kind, count, id, self.txn);
        self.dirty.insert(id, page);
    }

    /// Hands back to the allocator the pages freed by durable commits that no
    /// live snapshot can see.
    pub(crate) fn release_pending(&mut self, oldest_live_txn: Option<u64>, durable_txn: u64) {
        while let Some((txn, _)) = self.pending_free.front() {
            // A page freed by commit `txn` is reachable from metas older than
            // `txn`: from snapshots taken before it, and from the durable meta
            // until `txn` itself is durable.
            if oldest_live_txn.is_some_and(|o| o < *txn) || *txn > durable_txn {
                break;
            }
            let (_, pages) = self.pending_free.pop_front().expect("front exists");
            self.free.extend(pages);
        }
    }

    pub(crate) fn pending_free_pages(&self) -> usize {
        self.pending_free.iter().map(|(_, p)| p.len()).sum()
    }

    /// Pages in use by the committed trees (and by readers, until released).
    pub(crate) fn used_pages(&self) -> u64 {
        self.high_water - self.free.len() as u64
    }
}

impl PageRead for Pager {
    fn read_page(&self, id: u64) -> Result<PageRef, CorruptPage> {
        if let Some(p) = self.dirty.get(&id) {
            return Ok(PageRef::owned(p.clone()));
        }
        self.source.page(id)
    }
    fn file_name(&self) -> &str {
        &self.file
    }
}
