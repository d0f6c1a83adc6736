//! Swapping a snapshot's store into the shard's directory, and finishing a
//! swap a crash interrupted, through a seam that tests crash at every step.

use std::io;
use std::path::{Path, PathBuf};

/// The directory operations of a swap. Every store lives in a directory of
/// its own beside the others, so a swap only renames and removes entries of
/// their common parent; what an entry holds was made durable before.
pub(super) trait SwapFs {
    fn exists(&self, path: &Path) -> bool;
    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove_dir_all(&mut self, path: &Path) -> io::Result<()>;
    /// Makes the directory's entries as they are now survive a power loss.
    fn sync_dir(&mut self, dir: &Path) -> io::Result<()>;
}

/// The file system itself.
pub(super) struct RealFs;

impl SwapFs for RealFs {
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove_dir_all(&mut self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(path)
    }

    fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        crate::durable_file::sync_dir(dir)
    }
}

/// `<shard dir>.<suffix>`: where a snapshot's store is built (`new`) and where
/// the replaced one goes (`old`) while the two are swapped.
pub(super) fn swap_dir(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".");
    name.push(suffix);
    dir.with_file_name(name)
}

fn parent_of(dir: &Path) -> &Path {
    match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Puts the complete, synced store at `<dir>.new` in the place of the one at
/// `dir`: two renames (dir -> old, new -> dir), then the parent directory is
/// synced. Once this returns, the new store is the shard's whatever happens
/// to the machine; a crash before that leaves a state
/// [`finish_interrupted_swap`] completes or undoes.
pub(super) fn swap_in(fs: &mut impl SwapFs, dir: &Path) -> io::Result<()> {
    let new_dir = swap_dir(dir, "new");
    let old_dir = swap_dir(dir, "old");
    if fs.exists(&old_dir) {
        fs.remove_dir_all(&old_dir)?;
    }
    fs.rename(dir, &old_dir)?;
    fs.rename(&new_dir, dir)?;
    fs.sync_dir(parent_of(dir))?;
    fs.remove_dir_all(&old_dir)
}

/// Completes or undoes a snapshot install a crash interrupted. With `dir`
/// gone the new store is complete and takes its place; with `dir` present the
/// swap never started and the partial new store is dropped. A leftover old
/// store is removed. The result is made durable (the parent directory synced)
/// before the shard opens. Recovery is also repeatable: a power loss during
/// it, or before its sync, leads the next start to the same store.
pub(super) fn finish_interrupted_swap(fs: &mut impl SwapFs, dir: &Path) -> io::Result<()> {
    let new_dir = swap_dir(dir, "new");
    let old_dir = swap_dir(dir, "old");
    let mut changed = false;
    if !fs.exists(dir) && fs.exists(&new_dir) {
        fs.rename(&new_dir, dir)?;
        changed = true;
    }
    if fs.exists(&new_dir) {
        fs.remove_dir_all(&new_dir)?;
        changed = true;
    }
    if fs.exists(&old_dir) {
        fs.remove_dir_all(&old_dir)?;
        changed = true;
    }
    if changed {
        fs.sync_dir(parent_of(dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! A swap crashed by a power loss after every step: the entries of the
    //! parent directory then are the ones it had at its last sync.

    use super::*;
    use std::collections::BTreeMap;

    /// Which store a directory entry names.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Store {
        Replaced,
        FromSnapshot,
        Leftover,
    }

    /// The parent directory's entries, live and as last synced, with the
    /// power cut before operation number `cut_at`.
    struct PowerLossFs {
        live: BTreeMap<PathBuf, Store>,
        synced: BTreeMap<PathBuf, Store>,
        ops: usize,
        cut_at: usize,
    }

    impl PowerLossFs {
        fn new(entries: &[(&Path, Store)], cut_at: usize) -> Self {
            let live: BTreeMap<_, _> = entries.iter().map(|(p, s)| (p.to_path_buf(), *s)).collect();
            PowerLossFs {
                synced: live.clone(),
                live,
                ops: 0,
                cut_at,
            }
        }

        fn step(&mut self) -> io::Result<()> {
            if self.ops == self.cut_at {
                return Err(io::Error::other("power lost"));
            }
            self.ops += 1;
            Ok(())
        }

        /// The machine comes back: unsynced changes are gone; nothing cuts
        /// the power again.
        fn restart(&mut self) {
            self.live = self.synced.clone();
            self.ops = 0;
            self.cut_at = usize::MAX;
        }
    }

    impl SwapFs for PowerLossFs {
        fn exists(&self, path: &Path) -> bool {
            self.live.contains_key(path)
        }

        fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
            self.step()?;
            if self.live.contains_key(to) {
                return Err(io::Error::from(io::ErrorKind::DirectoryNotEmpty));
            }
            let store = self
                .live
                .remove(from)
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
            self.live.insert(to.to_path_buf(), store);
            Ok(())
        }

        fn remove_dir_all(&mut self, path: &Path) -> io::Result<()> {
            self.step()?;
            self.live
                .remove(path)
                .map(drop)
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }

        fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
            self.step()?;
            assert_eq!(dir, Path::new("data"), "only the stores' parent holds them");
            self.synced = self.live.clone();
            Ok(())
        }
    }

    fn dir() -> PathBuf {
        PathBuf::from("data/shard-0")
    }

    /// The states a swap starts from: the new store built and synced beside
    /// the shard's, with or without an old one a crash left behind.
    fn starts() -> Vec<Vec<(PathBuf, Store)>> {
        let base = vec![
            (dir(), Store::Replaced),
            (swap_dir(&dir(), "new"), Store::FromSnapshot),
        ];
        let mut leftover = base.clone();
        leftover.push((swap_dir(&dir(), "old"), Store::Leftover));
        vec![base, leftover]
    }

    fn fs(start: &[(PathBuf, Store)], cut_at: usize) -> PowerLossFs {
        let entries: Vec<(&Path, Store)> = start.iter().map(|(p, s)| (p.as_path(), *s)).collect();
        PowerLossFs::new(&entries, cut_at)
    }

    /// After recovery the shard's directory holds one store and nothing else.
    fn recovered(fs: &mut PowerLossFs) -> Store {
        finish_interrupted_swap(fs, &dir()).unwrap();
        assert_eq!(fs.live.len(), 1, "leftovers: {:?}", fs.live);
        *fs.live.get(&dir()).expect("the shard has a store")
    }

    #[test]
    fn a_power_loss_at_any_step_leaves_one_store_and_after_the_swap_the_new_one() {
        for start in starts() {
            let mut cut_at = 0;
            loop {
                let mut fs = fs(&start, cut_at);
                let swapped = swap_in(&mut fs, &dir()).is_ok();
                // The power goes right after the swap returned, too: the
                // shard has then acknowledged the snapshot to its leader.
                fs.restart();
                let store = recovered(&mut fs);
                if swapped {
                    assert_eq!(store, Store::FromSnapshot, "lost after the swap returned");
                    break;
                }
                assert_ne!(store, Store::Leftover, "power lost before step {cut_at}");
                cut_at += 1;
            }
            assert!(cut_at >= 3, "every step of the swap was crashed");
        }
    }

    #[test]
    fn recovery_crashed_at_any_step_recovers_to_the_same_store() {
        for start in starts() {
            // Every state a swap can be interrupted in, recovered first
            // without a crash to learn the outcome.
            for swap_cut in 0..5 {
                let mut interrupted = fs(&start, swap_cut);
                let _ = swap_in(&mut interrupted, &dir());
                interrupted.restart();
                let crashed_state: Vec<_> = interrupted.live.clone().into_iter().collect();
                let outcome = recovered(&mut fs(&crashed_state, usize::MAX));
                let mut cut_at = 0;
                loop {
                    let mut fs = fs(&crashed_state, cut_at);
                    let done = finish_interrupted_swap(&mut fs, &dir()).is_ok();
                    fs.restart();
                    assert_eq!(
                        recovered(&mut fs),
                        outcome,
                        "swap cut at {swap_cut}, recovery cut at {cut_at}"
                    );
                    if done {
                        break;
                    }
                    cut_at += 1;
                }
            }
        }
    }

    #[test]
    fn the_real_file_system_swaps_and_recovers() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("shard-0");
        for (d, marker) in [(dir.clone(), "replaced"), (swap_dir(&dir, "new"), "new")] {
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("marker"), marker).unwrap();
        }
        swap_in(&mut RealFs, &dir).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("marker")).unwrap(), "new");
        assert!(!swap_dir(&dir, "new").exists() && !swap_dir(&dir, "old").exists());
        // Interrupted after the first rename: the new store completes it.
        std::fs::create_dir(swap_dir(&dir, "new")).unwrap();
        std::fs::write(swap_dir(&dir, "new").join("marker"), "newer").unwrap();
        std::fs::rename(&dir, swap_dir(&dir, "old")).unwrap();
        finish_interrupted_swap(&mut RealFs, &dir).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("marker")).unwrap(),
            "newer"
        );
        assert!(!swap_dir(&dir, "old").exists());
    }
}
