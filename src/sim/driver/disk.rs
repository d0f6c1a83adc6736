//! A member's WAL disk in the driver simulation: the WAL's in-memory
//! power-cut model ([`CrashStorage`]) whose data syncs take a seeded
//! stretch of simulated time, so that a crash can fall between a write and
//! its sync, as it can on a real disk.

use std::io;
use std::path::PathBuf;
use std::rc::{Rc, Weak};
use std::time::Duration;

use cairn_wal::crash::CrashStorage;
use cairn_wal::{AlignedBuf, IoFuture, Storage, StorageFile};

use super::world::World;

/// Shortest and longest simulated data sync.
pub const SYNC_MICROS: std::ops::RangeInclusive<u64> = 50..=2_000;

/// [`CrashStorage`] whose syncs sleep first.
pub struct SlowDisk {
    inner: CrashStorage,
    world: Weak<World>,
    /// Whose disk it is, for a traced seed's trace.
    member: u64,
}

impl SlowDisk {
    pub fn new(inner: CrashStorage, world: Weak<World>, member: u64) -> SlowDisk {
        SlowDisk {
            inner,
            world,
            member,
        }
    }
}

/// How long one simulated sync of `what` takes, drawn from the seed (none
/// once the world is gone).
fn sync_delay(world: &Weak<World>, member: u64, what: &str) -> Duration {
    world.upgrade().map_or(Duration::ZERO, |w| {
        w.note(|| format!("member {member} syncs {what}"));
        Duration::from_micros(w.gen_range(SYNC_MICROS))
    })
}

impl Storage for SlowDisk {
    fn describe(&self) -> String {
        format!("{} with slow syncs", self.inner.describe())
    }
    fn path_of(&self, name: &str) -> PathBuf {
        self.inner.path_of(name)
    }
    fn list(&self) -> io::Result<Vec<String>> {
        self.inner.list()
    }
    fn open(&self, name: &str, create: bool) -> io::Result<Rc<dyn StorageFile>> {
        Ok(Rc::new(SlowFile {
            inner: self.inner.open(name, create)?,
            world: self.world.clone(),
            member: self.member,
            name: name.to_string(),
        }))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        self.inner.remove(name)
    }
    fn sync_dir(&self) -> IoFuture<'_, io::Result<()>> {
        let delay = sync_delay(&self.world, self.member, "the directory");
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            self.inner.sync_dir().await
        })
    }
}

struct SlowFile {
    inner: Rc<dyn StorageFile>,
    world: Weak<World>,
    member: u64,
    name: String,
}

impl StorageFile for SlowFile {
    fn size_bytes(&self) -> io::Result<u64> {
        self.inner.size_bytes()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn read_at(&self, offset: u64, len: usize) -> IoFuture<'_, io::Result<Vec<u8>>> {
        self.inner.read_at(offset, len)
    }
    fn write_at(&self, offset: u64, buf: AlignedBuf) -> IoFuture<'_, (AlignedBuf, io::Result<()>)> {
        self.inner.write_at(offset, buf)
    }
    fn sync_data(&self) -> IoFuture<'_, io::Result<()>> {
        let delay = sync_delay(&self.world, self.member, &self.name);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            self.inner.sync_data().await
        })
    }
}
