//! `--auto-compaction-mode` and `--auto-compaction-retention`, read as etcd
//! 3.4 reads them but for two refusals: a duration in revision mode (etcd
//! takes `1h` there as 3.6e12 revisions), and durations other than whole
//! ms, s, m and h.

use std::time::Duration;

use super::auth::parse_go_duration;

/// How the member compacts its history on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoCompaction {
    /// No automatic compaction (retention 0, etcd's default).
    #[default]
    Off,
    /// Keep about this much time of history (`periodic`).
    Periodic(Duration),
    /// Keep this many revisions of history (`revision`).
    Revisions(i64),
}

/// etcd's rule: the mode is `periodic` (default) or `revision`; a retention
/// that is a whole number is hours (`periodic`) or revisions (`revision`),
/// else a `periodic` duration such as `30m` or `1h30m`; 0 is off.
pub fn from_flags(
    mode: Option<&str>,
    retention: Option<&str>,
) -> Result<AutoCompaction, (&'static str, String)> {
    let retention = retention.unwrap_or("0");
    let periodic = match mode.unwrap_or("periodic") {
        "periodic" => true,
        "revision" => false,
        other => {
            return Err((
                "auto-compaction-mode",
                format!("unknown mode {other:?} (expected \"periodic\" or \"revision\")"),
            ))
        }
    };
    let whole: Option<u64> = retention.parse().ok();
    let policy = match (periodic, whole) {
        (_, Some(0)) => AutoCompaction::Off,
        (true, Some(hours)) => {
            AutoCompaction::Periodic(Duration::from_secs(hours.checked_mul(3600).ok_or((
                "auto-compaction-retention",
                format!("{retention:?} is too large"),
            ))?))
        }
        (false, Some(revisions)) => {
            AutoCompaction::Revisions(i64::try_from(revisions).map_err(|_| {
                (
                    "auto-compaction-retention",
                    format!("{retention:?} is too large"),
                )
            })?)
        }
        (true, None) => {
            let period =
                parse_go_duration(retention).map_err(|e| ("auto-compaction-retention", e))?;
            if period.is_zero() {
                AutoCompaction::Off
            } else {
                AutoCompaction::Periodic(period)
            }
        }
        (false, None) => {
            return Err((
                "auto-compaction-retention",
                format!(
                    "{retention:?}: with --auto-compaction-mode revision the retention is a \
                     number of revisions"
                ),
            ))
        }
    };
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_reads_as_etcds() {
        let hour = Duration::from_secs(3600);
        assert_eq!(from_flags(None, None), Ok(AutoCompaction::Off));
        assert_eq!(from_flags(None, Some("0")), Ok(AutoCompaction::Off));
        assert_eq!(
            from_flags(None, Some("1")),
            Ok(AutoCompaction::Periodic(hour))
        );
        assert_eq!(
            from_flags(Some("periodic"), Some("30m")),
            Ok(AutoCompaction::Periodic(hour / 2))
        );
        assert_eq!(
            from_flags(Some("revision"), Some("1000")),
            Ok(AutoCompaction::Revisions(1000))
        );
        assert_eq!(
            from_flags(Some("revision"), Some("0")),
            Ok(AutoCompaction::Off)
        );
        for (mode, retention, flag) in [
            (Some("hourly"), "1", "auto-compaction-mode"),
            (None, "soon", "auto-compaction-retention"),
            (Some("revision"), "1h", "auto-compaction-retention"),
            (None, "-1", "auto-compaction-retention"),
        ] {
            let err = from_flags(mode, Some(retention)).unwrap_err();
            assert_eq!(err.0, flag, "{mode:?} {retention}: {}", err.1);
        }
    }
}
