//! Where this workspace's `cairn` daemon is: the default of `compare` and
//! `tls-cost`, and what the functional tests run against.

use std::path::{Path, PathBuf};

/// The workspace's shared `target` directory (the bench crate sits one level down).
fn workspace_target_dir() -> PathBuf {
    let bench_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    bench_dir.parent().unwrap_or(bench_dir).join("target")
}

/// This workspace's release build of the daemon.
pub fn default_cairn_bin() -> PathBuf {
    workspace_target_dir().join("release").join("cairn")
}

/// The most recently built runnable `cairn` of this workspace, release or debug:
/// what functional tests run against (performance figures want the release build).
pub fn newest_workspace_cairn_bin() -> Option<PathBuf> {
    let target = workspace_target_dir();
    ["release", "debug"]
        .into_iter()
        .map(|profile| target.join(profile).join("cairn"))
        .filter(|bin| {
            std::process::Command::new(bin)
                .arg("--version")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .max_by_key(|bin| std::fs::metadata(bin).and_then(|m| m.modified()).ok())
}

/// [`newest_workspace_cairn_bin`] for tests: when there is none, applies the
/// rule of [`crate::binary_available_or_skip`] to the debug build's path (fail
/// under `CI`, else a skip note) and returns `None`.
pub fn workspace_cairn_or_skip() -> Option<PathBuf> {
    let bin = newest_workspace_cairn_bin();
    if bin.is_none() {
        crate::binary_available_or_skip(&workspace_target_dir().join("debug").join("cairn"));
    }
    bin
}

/// Where a command that starts its own clusters (`compare`, `tls-cost`,
/// `watch-load`, `memory`) finds the daemons and makes their data directories.
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonOpts {
    /// The Cairn daemon (default: this workspace's target/release/cairn).
    #[arg(long)]
    pub cairn_bin: Option<PathBuf>,
    /// The etcd daemon.
    #[arg(long, default_value = "etcd")]
    pub etcd_bin: PathBuf,
    /// Directory in which the temporary data directories are made (default: $TMPDIR).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

impl DaemonOpts {
    /// The daemon a local cluster of `system` runs: `--etcd-bin` for etcd,
    /// and for Cairn `--cairn-bin` or else this workspace's release build.
    pub fn binary(&self, system: crate::cluster::System) -> PathBuf {
        match system {
            crate::cluster::System::Etcd => self.etcd_bin.clone(),
            crate::cluster::System::Cairn => {
                self.cairn_bin.clone().unwrap_or_else(default_cairn_bin)
            }
        }
    }
}
