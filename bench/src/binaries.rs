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

/// The daemon a local cluster of `system` runs: `etcd_bin` for etcd, and for
/// Cairn `cairn_bin` or else this workspace's release build.
pub fn system_binary(
    system: crate::cluster::System,
    cairn_bin: Option<&Path>,
    etcd_bin: &Path,
) -> PathBuf {
    match system {
        crate::cluster::System::Etcd => etcd_bin.to_path_buf(),
        crate::cluster::System::Cairn => {
            cairn_bin.map_or_else(default_cairn_bin, Path::to_path_buf)
        }
    }
}
