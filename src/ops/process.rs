//! The standard `process_*` families every Prometheus client exports (etcd's
//! dashboards plot `process_resident_memory_bytes`; file-descriptor alerts divide
//! `process_open_fds` by `process_max_fds`), read from `/proc/self` at scrape
//! time, plus `cairn_build_info`. A figure that cannot be read is left out rather
//! than rendered as a made-up zero.

use std::fmt::Write as _;

/// Appends the process families to a Prometheus text exposition.
pub fn render_into(out: &mut String) {
    let _ = writeln!(
        out,
        "# HELP cairn_build_info Cairn build running: 1 for the version label.\n\
         # TYPE cairn_build_info gauge\n\
         cairn_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    let stat = read_stat();
    let ticks_per_second = clock_ticks_per_second();
    if let (Some(stat), Some(hz)) = (&stat, ticks_per_second) {
        let cpu_seconds = (stat.utime_ticks + stat.stime_ticks) as f64 / hz as f64;
        family(
            out,
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            "counter",
            cpu_seconds,
        );
        if let Some(boot_seconds) = boot_time_seconds() {
            let start = boot_seconds as f64 + stat.start_ticks as f64 / hz as f64;
            family(
                out,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                "gauge",
                start,
            );
        }
    }
    if let Some(stat) = &stat {
        family(
            out,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            "gauge",
            stat.vsize_bytes as f64,
        );
        if let Some(page) = page_size_bytes() {
            family(
                out,
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                "gauge",
                (stat.rss_pages * page) as f64,
            );
        }
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        // The directory handle itself is one of the entries.
        let open = dir.count().saturating_sub(1);
        family(
            out,
            "process_open_fds",
            "Number of open file descriptors.",
            "gauge",
            open as f64,
        );
    }
    if let Some(max) = max_open_files() {
        family(
            out,
            "process_max_fds",
            "Maximum number of open file descriptors.",
            "gauge",
            max as f64,
        );
    }
}

fn family(out: &mut String, name: &str, help: &str, kind: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

struct Stat {
    utime_ticks: u64,
    stime_ticks: u64,
    start_ticks: u64,
    vsize_bytes: u64,
    rss_pages: u64,
}

/// `/proc/self/stat`: fields after the parenthesised command name, which may
/// itself contain spaces and parentheses, hence the split at the last ')'.
fn read_stat() -> Option<Stat> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat(&text)
}

fn parse_stat(text: &str) -> Option<Stat> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state); proc(5) numbers fields from 1.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime_ticks: field(14)?,
        stime_ticks: field(15)?,
        start_ticks: field(22)?,
        vsize_bytes: field(23)?,
        rss_pages: field(24)?,
    })
}

fn boot_time_seconds() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

fn max_open_files() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn clock_ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf only reads a system constant; it takes no pointers and has
    // no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0)
}

fn page_size_bytes() -> Option<u64> {
    // SAFETY: as above, a read of a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().filter(|&p| p > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_survives_odd_command_names() {
        let line = "42 (a) b (c)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22";
        let stat = parse_stat(line).unwrap();
        assert_eq!((stat.utime_ticks, stat.stime_ticks), (11, 12));
        assert_eq!(
            (stat.start_ticks, stat.vsize_bytes, stat.rss_pages),
            (19, 20, 21)
        );
    }

    #[test]
    fn this_process_reports_memory_and_descriptors() {
        let mut out = String::new();
        render_into(&mut out);
        for name in [
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_cpu_seconds_total",
            "process_start_time_seconds",
        ] {
            assert!(
                out.contains(&format!("\n{name} ")),
                "{name} missing:\n{out}"
            );
        }
    }
}
