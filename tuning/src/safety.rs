//! The lab's footprint in DIR: it checks DIR before anything runs, names every file
//! it creates, removes exactly those, and stops cleanly on Ctrl-C.

use crate::error::LabError;
use serde::Serialize;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Prefix of every file and directory the lab creates, so an operator can see
/// (and, after a `kill -9`, remove) what is ours.
pub const FILE_PREFIX: &str = "cairn-tune-";

static STOP: AtomicBool = AtomicBool::new(false);

/// Whether Ctrl-C (SIGINT) or SIGTERM arrived: experiments stop at their next append.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

extern "C" fn on_signal(_signal: libc::c_int) {
    if STOP.swap(true, Ordering::Relaxed) {
        // A second Ctrl-C means "now": leave without cleaning up.
        // SAFETY: _exit is async-signal-safe and touches no Rust state.
        unsafe { libc::_exit(130) };
    }
}

/// Installs SIGINT and SIGTERM handlers that only set the stop flag, so every
/// experiment finishes its current append, the run removes its files and exits.
pub fn install_signal_handlers() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the
        // handler only performs an atomic swap and _exit, both async-signal-safe;
        // sigaction is given valid pointers to a local struct.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// What the lab knows about the filesystem and device under DIR.
#[derive(Debug, Clone, Serialize, Default)]
pub struct DiskFacts {
    pub dir: String,
    pub filesystem: String,
    pub free_bytes: u64,
    /// "write back" or "write through" from sysfs, when the device is found.
    pub write_cache: Option<String>,
    /// Whether nothing written here survives a power loss (tmpfs, ramfs).
    pub volatile: bool,
}

fn filesystem_name(magic: i64) -> String {
    match magic {
        0xEF53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x0102_1994 => "tmpfs".into(),
        0x8584_58F6 => "ramfs".into(),
        0x794C_7630 => "overlayfs".into(),
        0x6969 => "nfs".into(),
        0x2FC1_2FC1 => "zfs".into(),
        0xF2F5_2010 => "f2fs".into(),
        other => format!("unknown (0x{other:x})"),
    }
}

fn disk_facts(dir: &Path) -> Result<DiskFacts, LabError> {
    let c_dir = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| {
        LabError::Inspect {
            path: dir.to_path_buf(),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        }
    })?;
    // SAFETY: statfs writes into a zeroed, properly sized struct we own and reads a
    // NUL-terminated path that outlives the call.
    let (rc, st) = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        let rc = libc::statfs(c_dir.as_ptr(), &mut st);
        (rc, st)
    };
    if rc != 0 {
        return Err(LabError::Inspect {
            path: dir.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    let filesystem = filesystem_name(st.f_type as i64);
    let volatile = filesystem == "tmpfs" || filesystem == "ramfs";
    let dev = fs::metadata(dir)
        .map_err(|source| LabError::Inspect {
            path: dir.to_path_buf(),
            source,
        })?
        .dev();
    Ok(DiskFacts {
        dir: dir.display().to_string(),
        filesystem,
        #[allow(clippy::unnecessary_cast)]
        free_bytes: st.f_bavail as u64 * st.f_bsize as u64,
        write_cache: write_cache(dev),
        volatile,
    })
}

/// Reads the device's cache mode from sysfs (a partition's is on its parent disk).
fn write_cache(dev: u64) -> Option<String> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let base = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    for candidate in [
        base.join("queue/write_cache"),
        base.join("../queue/write_cache"),
    ] {
        if let Ok(text) = fs::read_to_string(&candidate) {
            return Some(text.trim().to_string());
        }
    }
    None
}

/// DIR, checked, with the list of what the lab created in it.
#[derive(Debug)]
pub struct LabDir {
    dir: PathBuf,
    facts: DiskFacts,
    created: Mutex<Vec<PathBuf>>,
    next_id: AtomicU64,
}

impl LabDir {
    /// Checks that DIR exists, is a directory and that a file can be created in it.
    pub fn open(dir: &Path) -> Result<LabDir, LabError> {
        let meta = match fs::metadata(dir) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(LabError::DirMissing {
                    path: dir.to_path_buf(),
                })
            }
            Err(source) => {
                return Err(LabError::Inspect {
                    path: dir.to_path_buf(),
                    source,
                })
            }
        };
        if !meta.is_dir() {
            return Err(LabError::NotADirectory {
                path: dir.to_path_buf(),
            });
        }
        let lab = LabDir {
            dir: dir.to_path_buf(),
            facts: disk_facts(dir)?,
            created: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
        };
        // Root passes access(W_OK) even on a read-only mount, so try for real.
        let probe = lab.file_path("probe");
        let written = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .and_then(|mut f| f.write_all(b"cairn-tune probe\n"));
        let result = match written {
            Ok(()) => Ok(()),
            Err(source) => Err(LabError::DirNotWritable {
                path: dir.to_path_buf(),
                source,
            }),
        };
        lab.remove(&probe);
        result.map(|()| lab)
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn facts(&self) -> &DiskFacts {
        &self.facts
    }

    /// A fresh path in DIR for a file or directory the lab will create; it is
    /// remembered so that [`LabDir::cleanup`] removes it.
    pub fn file_path(&self, tag: &str) -> PathBuf {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let path = self
            .dir
            .join(format!("{FILE_PREFIX}{}-{id}.{tag}", std::process::id()));
        self.register(path.clone());
        path
    }

    /// Remembers a path that something else (fio) creates on the lab's behalf.
    pub fn register(&self, path: PathBuf) {
        self.created
            .lock()
            .expect("lab file list poisoned")
            .push(path);
    }

    /// Removes one of the lab's paths (file or directory tree) now.
    pub fn remove(&self, path: &Path) {
        let mut created = self.created.lock().expect("lab file list poisoned");
        assert!(
            created.iter().any(|p| p == path),
            "refusing to remove {} which the lab did not create",
            path.display()
        );
        remove_path(path);
        created.retain(|p| p != path);
    }

    /// Removes everything the lab created in DIR and nothing else.
    pub fn cleanup(&self) {
        let mut created = self.created.lock().expect("lab file list poisoned");
        for path in created.drain(..) {
            remove_path(&path);
        }
    }
}

impl Drop for LabDir {
    fn drop(&mut self) {
        self.cleanup();
    }
}

fn remove_path(path: &Path) {
    let result = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(_) => return,
    };
    if let Err(e) = result {
        tracing::warn!(path = %path.display(), error = %e, "could not remove a lab file");
    }
}
