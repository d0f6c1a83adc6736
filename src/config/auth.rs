//! The auth flags: `--auth-token`, `--auth-token-ttl`, `--bcrypt-cost`.

use std::path::PathBuf;
use std::time::Duration;

/// How the member authenticates, from its flags.
#[derive(Debug, Clone)]
pub struct AuthOptions {
    pub token: TokenKind,
    /// Simple tokens are forgotten after this long unused (`--auth-token-ttl`).
    pub simple_token_ttl: Duration,
    /// bcrypt's cost for new passwords (`--bcrypt-cost`).
    pub bcrypt_cost: u32,
    /// With `--client-cert-auth`, a client certificate's common name is the
    /// user of requests that carry no token.
    pub client_cert_auth: bool,
}

impl AuthOptions {
    /// The options the auth flags give (defaults: simple tokens, 300 s,
    /// bcrypt cost 10, etcd's); a refusal names its flag.
    pub fn from_flags(
        auth_token: Option<&str>,
        auth_token_ttl_secs: Option<u64>,
        bcrypt_cost: Option<u32>,
        client_cert_auth: bool,
    ) -> Result<AuthOptions, (&'static str, String)> {
        let bcrypt_cost = bcrypt_cost.unwrap_or(10);
        if !(4..=31).contains(&bcrypt_cost) {
            return Err((
                "bcrypt-cost",
                format!("{bcrypt_cost}: must be between 4 and 31"),
            ));
        }
        let simple_token_ttl = match auth_token_ttl_secs.unwrap_or(300) {
            0 => return Err(("auth-token-ttl", "must be at least 1 second".into())),
            secs => Duration::from_secs(secs),
        };
        Ok(AuthOptions {
            token: parse_auth_token(auth_token.unwrap_or("simple"))
                .map_err(|reason| ("auth-token", reason))?,
            simple_token_ttl,
            bcrypt_cost,
            client_cert_auth,
        })
    }
}

/// The JWT signing methods Cairn supports (etcd's names).
pub const JWT_SIGN_METHODS: [&str; 8] = [
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
];

/// What `--auth-token` selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenKind {
    Simple,
    Jwt(JwtOptions),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtOptions {
    pub pub_key: PathBuf,
    pub priv_key: Option<PathBuf>,
    pub sign_method: String,
    pub ttl: Duration,
}

/// Parses etcd's `--auth-token` value: `simple`, or `jwt` followed by
/// comma-separated `pub-key=`, `priv-key=`, `sign-method=` and `ttl=`.
pub fn parse_auth_token(value: &str) -> Result<TokenKind, String> {
    let mut parts = value.split(',');
    match parts.next().unwrap_or_default() {
        "simple" => {
            if parts.next().is_some() {
                return Err("simple tokens take no options".into());
            }
            Ok(TokenKind::Simple)
        }
        "jwt" => {
            let mut pub_key = None;
            let mut priv_key = None;
            let mut sign_method = None;
            let mut ttl = Duration::from_secs(300);
            for part in parts {
                let (k, v) = part
                    .split_once('=')
                    .ok_or_else(|| format!("jwt option {part:?} is not key=value"))?;
                match k {
                    "pub-key" => pub_key = Some(PathBuf::from(v)),
                    "priv-key" => priv_key = Some(PathBuf::from(v)),
                    "sign-method" => sign_method = Some(v.to_string()),
                    "ttl" => ttl = parse_go_duration(v)?,
                    other => return Err(format!("unknown jwt option {other:?}")),
                }
            }
            let sign_method = sign_method.ok_or("jwt needs sign-method=")?;
            if !JWT_SIGN_METHODS.contains(&sign_method.as_str()) {
                return Err(format!(
                    "unsupported jwt sign-method {sign_method:?} (expected one of {})",
                    JWT_SIGN_METHODS.join(", ")
                ));
            }
            Ok(TokenKind::Jwt(JwtOptions {
                pub_key: pub_key.ok_or("jwt needs pub-key=")?,
                priv_key,
                sign_method,
                ttl,
            }))
        }
        other => Err(format!(
            "unknown token type {other:?} (expected simple or jwt,...)"
        )),
    }
}

/// A Go duration as etcd's flags write them: `300s`, `5m`, `1h30m`, `500ms`.
pub(super) fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration like 300s or 5m");
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let too_large = || format!("{s:?} is too long a duration");
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(too_large)?),
            "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(too_large)?),
            _ => return Err(bad()),
        };
        total = total.checked_add(unit).ok_or_else(too_large)?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_token_values_parse_as_etcds() {
        assert_eq!(parse_auth_token("simple"), Ok(TokenKind::Simple));
        let jwt =
            parse_auth_token("jwt,pub-key=/k.pub,priv-key=/k,sign-method=RS256,ttl=10m").unwrap();
        assert_eq!(
            jwt,
            TokenKind::Jwt(JwtOptions {
                pub_key: "/k.pub".into(),
                priv_key: Some("/k".into()),
                sign_method: "RS256".into(),
                ttl: Duration::from_secs(600),
            })
        );
        for bad in [
            "",
            "opaque",
            "jwt,pub-key=/k",
            "jwt,pub-key=/k,sign-method=HS999",
            "jwt,pub-key=/k,sign-method=RS256,ttl=ten",
            "jwt,pub-key=/k,sign-method=RS256,color=red",
        ] {
            assert!(parse_auth_token(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_go_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("500ms"), Ok(Duration::from_millis(500)));
    }
}
