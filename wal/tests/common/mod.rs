//! Shared test scaffolding: one environment per backend so every behaviour is
//! checked on io_uring, pwrite + fdatasync and the crash-simulating storage.

#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::rc::Rc;

use bytes::Bytes;
use cairn_wal::crash::CrashStorage;
use cairn_wal::{
    BackendChoice, Config, Record, Storage, SyncOptions, SyncStorage, Uring, UringOptions,
    UringStorage,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Uring,
    Sync,
    Crash,
}

pub const ALL: [Kind; 3] = [Kind::Uring, Kind::Sync, Kind::Crash];

/// A WAL directory on one backend that can be reopened and tampered with.
pub struct Env {
    pub kind: Kind,
    pub tmp: Option<tempfile::TempDir>,
    pub crash: CrashStorage,
}

/// Tests live on the real disk, not tmpfs: O_DIRECT and fdatasync must be real.
fn test_root() -> PathBuf {
    let root = std::env::var_os("CAIRN_WAL_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&root).expect("test dir");
    root
}

impl Env {
    pub fn new(kind: Kind) -> Env {
        let tmp =
            (kind != Kind::Crash).then(|| tempfile::tempdir_in(test_root()).expect("tempdir"));
        Env {
            kind,
            tmp,
            crash: CrashStorage::new(),
        }
    }

    pub fn dir(&self) -> PathBuf {
        self.tmp
            .as_ref()
            .map(|t| t.path().to_path_buf())
            .unwrap_or_else(|| PathBuf::from("crash"))
    }

    /// A small-segment config so tests roll and recycle often.
    pub fn config(&self) -> Config {
        let mut c = Config::new(self.dir());
        c.segment_size_bytes = 64 << 10;
        c.max_record_payload_bytes = 4 << 10;
        c.max_batch_bytes = 16 << 10;
        c.max_queued_bytes = 1 << 20;
        c.max_shards = 32;
        c.zero_chunk_bytes = 16 << 10;
        c.spare_segments = 1;
        c.max_spare_segments = 2;
        c.backend = match self.kind {
            Kind::Uring => BackendChoice::Uring(UringOptions::default()),
            Kind::Sync | Kind::Crash => BackendChoice::Sync(SyncOptions::default()),
        };
        c
    }

    pub fn storage(&self) -> Rc<dyn Storage> {
        match self.kind {
            Kind::Uring => Rc::new(
                UringStorage::new(
                    &self.dir(),
                    Uring::for_this_core().expect("io_uring available in tests"),
                    UringOptions::default(),
                )
                .expect("uring storage"),
            ),
            Kind::Sync => Rc::new(
                SyncStorage::new(&self.dir(), SyncOptions::default()).expect("sync storage"),
            ),
            Kind::Crash => Rc::new(self.crash.clone()),
        }
    }

    pub fn names(&self) -> Vec<String> {
        match self.kind {
            Kind::Crash => self.crash.file_names(),
            _ => {
                let mut v: Vec<String> = std::fs::read_dir(self.dir())
                    .expect("read dir")
                    .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
                    .collect();
                v.sort();
                v
            }
        }
    }

    pub fn segments(&self) -> Vec<String> {
        self.names()
            .into_iter()
            .filter(|n| n.ends_with(".wal"))
            .collect()
    }

    pub fn read(&self, name: &str) -> Vec<u8> {
        match self.kind {
            Kind::Crash => self.crash.read_file(name).expect("file exists"),
            _ => std::fs::read(self.dir().join(name)).expect("read file"),
        }
    }

    pub fn write(&self, name: &str, bytes: &[u8]) {
        match self.kind {
            Kind::Crash => self.crash.write_file(name, bytes),
            _ => std::fs::write(self.dir().join(name), bytes).expect("write file"),
        }
    }

    pub fn delete(&self, name: &str) {
        match self.kind {
            Kind::Crash => self.crash.delete_file(name),
            _ => std::fs::remove_file(self.dir().join(name)).expect("remove file"),
        }
    }

    /// Snapshot of every file, to restore between tampering experiments.
    pub fn snapshot(&self) -> Snapshot {
        match self.kind {
            Kind::Crash => Snapshot::Crash(self.crash.after_crash(None)),
            _ => Snapshot::Files(
                self.names()
                    .into_iter()
                    .map(|n| {
                        let b = self.read(&n);
                        (n, b)
                    })
                    .collect(),
            ),
        }
    }

    pub fn restore(&mut self, snap: &Snapshot) {
        match snap {
            Snapshot::Crash(c) => self.crash = c.after_crash(None),
            Snapshot::Files(files) => {
                for n in self.names() {
                    self.delete(&n);
                }
                for (n, b) in files {
                    std::fs::write(self.dir().join(n), b).expect("restore file");
                }
            }
        }
    }
}

pub enum Snapshot {
    Crash(CrashStorage),
    Files(Vec<(String, Vec<u8>)>),
}

/// Runs `f` on a current-thread runtime inside a `LocalSet`, as a core does.
pub fn run<F: Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tokio::task::LocalSet::new().block_on(&rt, f)
}

pub fn entry(shard: u64, index: u64, term: u64, len: usize) -> Record {
    let data: Vec<u8> = (0..len)
        .map(|i| (shard as usize * 131 + index as usize * 7 + i) as u8)
        .collect();
    Record::Entry {
        shard,
        index,
        term,
        data: Bytes::from(data),
    }
}
