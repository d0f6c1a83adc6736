//! Log output: `tracing` events to stderr (journald captures it under systemd), in
//! a human format by default or one JSON object per line with `--log-format json`,
//! filtered by `--log-level`.
//!
//! `--log-level` takes etcd's level names (`debug`, `info`, `warn`, `error`, and
//! `panic`/`fatal`, which Cairn treats as `error`) plus `trace`, or a full filter
//! directive such as `info,cairn::raft=debug` for finer control. `RUST_LOG`, when
//! set, is ignored: the flag (or the config file) is the one place to say it.

use std::str::FromStr;

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// Default `--log-level`, as etcd's.
pub const DEFAULT_LOG_LEVEL: &str = "info";
/// Longest `--log-level` directive accepted.
pub const MAX_LOG_LEVEL_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    #[error("--log-format {value:?}: expected \"human\" or \"json\"")]
    BadFormat { value: String },
    #[error("--log-level {value:?}: {why}")]
    BadLevel { value: String, why: String },
    #[error("a global log subscriber is already installed")]
    AlreadyInstalled,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Human,
    Json,
}

impl FromStr for LogFormat {
    type Err = LogError;

    fn from_str(s: &str) -> Result<Self, LogError> {
        match s {
            "human" | "text" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            _ => Err(LogError::BadFormat {
                value: s.to_string(),
            }),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogFormat::Human => "human",
            LogFormat::Json => "json",
        })
    }
}

/// Turns a `--log-level` value into a filter; call it from `Config::validate()`
/// so that a bad value is refused at start with a message naming it.
pub fn parse_log_level(value: &str) -> Result<EnvFilter, LogError> {
    let bad = |why: String| LogError::BadLevel {
        value: value.to_string(),
        why,
    };
    if value.is_empty() || value.len() > MAX_LOG_LEVEL_BYTES {
        return Err(bad(format!("must be 1 to {MAX_LOG_LEVEL_BYTES} bytes")));
    }
    let directive = match value.to_ascii_lowercase().as_str() {
        "panic" | "fatal" | "dpanic" => "error".to_string(),
        "warning" => "warn".to_string(),
        "trace" | "debug" | "info" | "warn" | "error" | "off" => value.to_ascii_lowercase(),
        _ => value.to_string(),
    };
    // A plain word that is no level would be read as a target name and silently
    // log nothing; refuse it instead.
    if !directive.contains(['=', ',', ':'])
        && directive.parse::<tracing::Level>().is_err()
        && directive != "off"
    {
        return Err(bad(
            "expected trace, debug, info, warn, error, or a filter like info,cairn::raft=debug"
                .to_string(),
        ));
    }
    EnvFilter::builder()
        .parse(&directive)
        .map_err(|e| bad(e.to_string()))
}

/// Installs the global subscriber writing to stderr. Call once, first thing in
/// `main`, after the flags are parsed. Colours only when stderr is a terminal
/// (never into journald) and `NO_COLOR` is unset.
pub fn init_logging(format: LogFormat, level: &str) -> Result<(), LogError> {
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    install(format, level, std::io::stderr, ansi)
}

/// As [`init_logging`], writing to `writer` without colours (tests capture
/// output this way).
pub fn init_logging_to<W>(format: LogFormat, level: &str, writer: W) -> Result<(), LogError>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    install(format, level, writer, false)
}

fn install<W>(format: LogFormat, level: &str, writer: W, ansi: bool) -> Result<(), LogError>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = parse_log_level(level)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi);
    let installed = match format {
        LogFormat::Human => builder.with_target(true).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
    };
    installed.map_err(|_| LogError::AlreadyInstalled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse() {
        assert_eq!("json".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert_eq!("human".parse::<LogFormat>().unwrap(), LogFormat::Human);
        let err = "xml".parse::<LogFormat>().unwrap_err();
        assert!(err.to_string().contains("xml"));
    }

    #[test]
    fn etcd_levels_and_directives_parse() {
        for ok in [
            "debug",
            "info",
            "warn",
            "error",
            "panic",
            "fatal",
            "INFO",
            "info,cairn::raft=debug",
        ] {
            parse_log_level(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in ["", "loud", "info,=x=y"] {
            let err = parse_log_level(bad).unwrap_err();
            assert!(err.to_string().contains("--log-level"), "{err}");
        }
    }
}
