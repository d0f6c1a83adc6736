//! Checks of the host that cost latency and that only an operator can change.
//!
//! On a KVM guest whose idle driver is `haltpoll` with
//! `guest_halt_poll_ns = 0`, an idle vCPU halts at once: the next wake-up (a
//! packet, a completed write, another thread's message) exits to the hypervisor
//! and waits for the host to run the vCPU again. A replicated write wakes
//! several threads in turn, so each pays that exit. Measured on the 2-core VM
//! of BENCHMARKS.md: 1-client put p50 0.55 ms with polling off, 0.41 ms with
//! `guest_halt_poll_ns = 200000` (`--cores 1`, 3 members). Cairn's own idle
//! polling (`crate::idle_poll`, on by default) keeps a core's vCPU busy through
//! waits shorter than its window, so the daemon gives this advice only when a
//! core runs without it.

use std::path::Path;

/// Advice for the operator when guest halt polling is available but off;
/// `None` when it is on, or the host has no such driver. `sysfs` is the sysfs
/// mount (`/sys`), a parameter so tests can give a made-up one.
pub fn halt_polling_advice(sysfs: &Path) -> Option<String> {
    let read = |rel: &str| std::fs::read_to_string(sysfs.join(rel)).ok();
    let driver = read("devices/system/cpu/cpuidle/current_driver")?;
    // The parameter is the haltpoll governor's: with another governor
    // (cpuidle.governor=menu) it has no effect.
    let governor = read("devices/system/cpu/cpuidle/current_governor")
        .or_else(|| read("devices/system/cpu/cpuidle/current_governor_ro"))?;
    if driver.trim() != "haltpoll" || governor.trim() != "haltpoll" {
        return None;
    }
    let param = "module/haltpoll/parameters/guest_halt_poll_ns";
    let poll_ns: u64 = read(param)?.trim().parse().ok()?;
    (poll_ns == 0).then(|| {
        format!(
            "guest halt polling is off ({}/{param} is 0): every wake-up of an idle \
             vCPU exits to the hypervisor, which adds about 0.1 ms to a replicated \
             write; `echo 200000 > {}/{param}` turns it on (README, \"Latency on \
             virtual machines\")",
            sysfs.display(),
            sysfs.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_sysfs(driver: Option<&str>, poll_ns: Option<&str>) -> tempfile::TempDir {
        fake_sysfs_governed(driver, "haltpoll", poll_ns)
    }

    fn fake_sysfs_governed(
        driver: Option<&str>,
        governor: &str,
        poll_ns: Option<&str>,
    ) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        if let Some(d) = driver {
            let p = dir.path().join("devices/system/cpu/cpuidle");
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("current_driver"), format!("{d}\n")).unwrap();
            std::fs::write(p.join("current_governor_ro"), format!("{governor}\n")).unwrap();
        }
        if let Some(n) = poll_ns {
            let p = dir.path().join("module/haltpoll/parameters");
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("guest_halt_poll_ns"), format!("{n}\n")).unwrap();
        }
        dir
    }

    #[test]
    fn advises_only_when_halt_polling_is_available_and_off() {
        let off = fake_sysfs(Some("haltpoll"), Some("0"));
        let advice = halt_polling_advice(off.path()).expect("advice when off");
        assert!(advice.contains("guest_halt_poll_ns is 0"), "{advice}");
        assert!(advice.contains("echo 200000 >"), "{advice}");

        let on = fake_sysfs(Some("haltpoll"), Some("200000"));
        assert_eq!(halt_polling_advice(on.path()), None);
        let bare_metal = fake_sysfs(Some("intel_idle"), None);
        assert_eq!(halt_polling_advice(bare_metal.path()), None);
        let no_cpuidle = fake_sysfs(None, None);
        assert_eq!(halt_polling_advice(no_cpuidle.path()), None);
        let other_governor = fake_sysfs_governed(Some("haltpoll"), "menu", Some("0"));
        assert_eq!(halt_polling_advice(other_governor.path()), None);
        let unreadable = fake_sysfs(Some("haltpoll"), Some("lots"));
        assert_eq!(halt_polling_advice(unreadable.path()), None);
    }
}
