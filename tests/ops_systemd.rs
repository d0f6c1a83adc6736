//! The systemd files in `systemd/`, checked with systemd's own tools. Guards
//! against unit files that systemd would reject or half-ignore (unknown keys,
//! bad values and unknown system-call groups are only warnings at load time, so
//! any complaint fails here), a template that does not expand, a sysusers or
//! tmpfiles snippet that does not create the `cairn` user and its private data
//! directory, and the hardening promises (notify, watchdog, io_uring allowed,
//! read-only system) quietly dropped from the units.
//!
//! `systemd-analyze verify` insists that `ExecStart=` points at an executable,
//! and `/usr/bin/cairn` is not installed on a build machine. So the test copies
//! the units into a temporary directory with `/usr/bin/cairn` replaced by the
//! `cairn` binary cargo built for this test run (`CARGO_BIN_EXE_cairn`), adds
//! `cairn@node1.service` as a link to the template, and verifies the copies.
//! Nothing else in the units is changed. Without `systemd-analyze` the test fails
//! when `CI` is set and is skipped with a note otherwise.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const UNITS: [&str; 2] = ["cairn.service", "cairn@.service"];
const INSTALLED_BINARY: &str = "/usr/bin/cairn";

fn systemd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd")
}

/// Finds a systemd tool, or says why the test cannot run.
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        if std::env::var_os("CI").is_some() {
            panic!("{name} not found, and CI is set: install Debian's `systemd` package");
        }
        eprintln!(
            "note: {name} not found; skipping (install Debian's `systemd` package to run this)"
        );
    }
    found
}

fn read(name: &str) -> String {
    let path = systemd_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn systemd_analyze_verify_accepts_every_unit() {
    let Some(analyze) = tool("systemd-analyze") else {
        return;
    };
    let binary = env!("CARGO_BIN_EXE_cairn");
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for unit in UNITS {
        let text = read(unit);
        assert!(
            text.contains(&format!("ExecStart={INSTALLED_BINARY} ")),
            "{unit}: ExecStart does not start {INSTALLED_BINARY}"
        );
        let copy = dir.path().join(unit);
        std::fs::write(&copy, text.replace(INSTALLED_BINARY, binary)).unwrap();
        if !unit.contains('@') {
            paths.push(copy);
        }
    }
    let instance = dir.path().join("cairn@node1.service");
    std::os::unix::fs::symlink("cairn@.service", &instance).unwrap();
    paths.push(instance);

    let output = Command::new(&analyze)
        .arg("verify")
        .args(&paths)
        .output()
        .expect("running systemd-analyze");
    let complaints: String = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    // Lines about our units: systemd-analyze may also mention units of the host.
    let ours: Vec<&str> = complaints
        .lines()
        .filter(|l| l.contains("cairn") || l.contains(&dir.path().display().to_string()))
        .collect();
    assert!(
        output.status.success() && ours.is_empty(),
        "systemd-analyze verify {paths:?} ({}):\n{complaints}",
        output.status
    );
}

#[test]
fn units_keep_their_operating_promises() {
    for unit in UNITS {
        let text = read(unit);
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for required in [
            "Type=notify",
            "Restart=on-failure",
            "NoNewPrivileges=true",
            "PrivateTmp=true",
            "ProtectSystem=strict",
            "User=cairn",
            "LimitMEMLOCK=infinity",
        ] {
            assert!(lines.contains(&required), "{unit}: missing {required}");
        }
        for prefix in ["WatchdogSec=", "LimitNOFILE=", "StateDirectory=cairn"] {
            assert!(
                lines.iter().any(|l| l.starts_with(prefix)),
                "{unit}: missing {prefix}"
            );
        }
        // The system-call allow list must name io_uring explicitly.
        let filter = lines
            .iter()
            .find(|l| l.starts_with("SystemCallFilter=@system-service"))
            .unwrap_or_else(|| panic!("{unit}: no SystemCallFilter allow list"));
        for call in ["io_uring_setup", "io_uring_enter", "io_uring_register"] {
            assert!(
                filter.split(' ').any(|w| w == call),
                "{unit}: {call} not allowed"
            );
        }
        // The only writable paths are the state directory (and PrivateTmp).
        assert!(
            !lines.iter().any(|l| l.starts_with("ReadWritePaths=")),
            "{unit}: extra writable paths"
        );
    }
    assert!(read("cairn@.service").contains("--config-file /etc/cairn/%i.toml"));
}

#[test]
fn sysusers_and_tmpfiles_create_the_user_and_a_private_data_dir() {
    let (Some(sysusers), Some(tmpfiles)) = (tool("systemd-sysusers"), tool("systemd-tmpfiles"))
    else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("etc")).unwrap();
    let status = Command::new(&sysusers)
        .arg(format!("--root={}", root.path().display()))
        .arg(systemd_dir().join("cairn.sysusers.conf"))
        .status()
        .unwrap();
    assert!(status.success(), "systemd-sysusers: {status}");
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd")).unwrap();
    let entry = passwd
        .lines()
        .find(|l| l.starts_with("cairn:"))
        .unwrap_or_else(|| panic!("no cairn user in {passwd}"));
    let fields: Vec<&str> = entry.split(':').collect();
    assert_eq!(fields[5], "/var/lib/cairn", "{entry}");
    let uid: u32 = fields[2].parse().unwrap();

    // Creating directories owned by another user needs root.
    let is_root = std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false);
    if !is_root {
        eprintln!("note: not root; skipping systemd-tmpfiles --create");
        return;
    }
    let output = Command::new(&tmpfiles)
        .arg(format!("--root={}", root.path().display()))
        .arg("--create")
        .arg(systemd_dir().join("cairn.tmpfiles.conf"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "systemd-tmpfiles: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let data = std::fs::metadata(root.path().join("var/lib/cairn")).unwrap();
    assert_eq!(data.uid(), uid);
    assert_eq!(data.mode() & 0o777, 0o700);
}

#[test]
fn example_config_is_accepted_by_the_daemon() {
    use cairn::config::{Config, Flags};
    let path = systemd_dir().join("cairn.toml");
    let flags = Flags::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config = Config::from_flags(flags).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(config.name, "node1");
    assert_eq!(config.initial_cluster.len(), 3);
    assert_eq!(
        config.listen_metrics_addrs,
        vec!["10.0.0.1:2381".parse().unwrap()]
    );
    assert!(matches!(config.log_format, cairn::config::LogFormat::Json));
    cairn::ops::logging::parse_log_level(&config.log_level).unwrap();
    // The units make /var/lib/cairn the only writable path.
    assert!(
        config.data_dir.starts_with("/var/lib/cairn"),
        "{}",
        config.data_dir.display()
    );
}
