//! `SHEPHERD_REDIS_URL` and the TLS files, read once at start into a [`RedisTarget`]:
//! which topology (one server, a Sentinel-managed primary, a Cluster), over TLS or not,
//! with which credentials and certificates. The store turns it into connections
//! (`store::client`); nothing here opens a socket.
//!
//! Accepted forms (contract, docs/operations.md "Redis"):
//!
//! - `redis://[user:password@]host[:port][/db]`, `rediss://…` (TLS), `redis+unix://…`,
//!   `unix://…` — one server, read by the redis crate itself;
//! - `redis+sentinel://[user:password@]host1[:port],host2[:port],…/service[/db]` and
//!   `rediss+sentinel://…` — the primary the sentinels name for `service` (default
//!   sentinel port 26379); the credentials are the primary's;
//! - `redis+cluster://[user:password@]host1[:port],host2[:port],…` and
//!   `rediss+cluster://…` — a Redis Cluster reached through any of the seed nodes
//!   (default port 6379).

use std::path::Path;

use percent_encoding::percent_decode_str;
use secrecy::{ExposeSecret, SecretString};

/// How Shepherd reaches Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server at the URL (the redis crate parses it).
    Single,
    /// The primary that the sentinels name for `service`.
    Sentinel {
        /// Sentinel addresses (host, port).
        sentinels: Vec<(String, u16)>,
        /// The monitored master's name (`sentinel monitor <service> …`).
        service: String,
    },
    /// A Redis Cluster reached through these seed nodes (host, port).
    Cluster {
        /// Seed nodes; any reachable one suffices.
        nodes: Vec<(String, u16)>,
    },
}

/// PEM material for TLS, read from the files named by `SHEPHERD_REDIS_CA_FILE`,
/// `SHEPHERD_REDIS_CLIENT_CERT_FILE` and `SHEPHERD_REDIS_CLIENT_KEY_FILE`.
#[derive(Clone, Default)]
pub struct TlsFiles {
    /// CA certificates the server's certificate must chain to (`None`: the system roots).
    pub ca: Option<Vec<u8>>,
    /// Client certificate and key (PEM) for servers that require one.
    pub client: Option<(Vec<u8>, SecretString)>,
}

/// The parsed `SHEPHERD_REDIS_URL` plus its TLS material. `Debug` never shows the
/// password or the key.
#[derive(Clone)]
pub struct RedisTarget {
    /// The URL as given (it may carry a password: never logged).
    url: SecretString,
    /// Which topology.
    pub topology: Topology,
    /// Whether the connections use TLS (`rediss…`).
    pub tls: bool,
    /// ACL user, if any.
    pub username: Option<String>,
    /// Password, if any.
    pub password: Option<SecretString>,
    /// Database number (single server and Sentinel; a cluster has only 0).
    pub db: i64,
    /// TLS material (meaningful only with `tls`).
    pub tls_files: TlsFiles,
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget")
            .field("topology", &self.topology)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .field("ca_file", &self.tls_files.ca.is_some())
            .field("client_cert", &self.tls_files.client.is_some())
            .finish()
    }
}

impl RedisTarget {
    /// Parses a URL of one of the accepted forms (module docs). The error says what is
    /// wrong without repeating the URL (it may hold a password).
    pub fn parse(url: &str) -> Result<Self, String> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err("is not a URL (no scheme://)".into());
        };
        let (topology_kind, tls) = match scheme {
            "redis" | "redis+unix" | "unix" => ("single", false),
            "rediss" => ("single", true),
            "redis+sentinel" => ("sentinel", false),
            "rediss+sentinel" => ("sentinel", true),
            "redis+cluster" => ("cluster", false),
            "rediss+cluster" => ("cluster", true),
            other => {
                return Err(format!(
                    "scheme {other}:// is not one of redis://, rediss://, redis+unix://, \
                     unix://, redis+sentinel://, rediss+sentinel://, redis+cluster://, \
                     rediss+cluster://"
                ));
            }
        };
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, p.split_once('?').map_or(p, |(p, _)| p)),
            None => (rest.split_once('?').map_or(rest, |(a, _)| a), ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => {
                let (user, pass) = u.split_once(':').unwrap_or((u, ""));
                let user = decode(user)?;
                let pass = decode(pass)?;
                (
                    (!user.is_empty()).then_some(user),
                    (!pass.is_empty()).then(|| SecretString::from(pass)),
                )
            }
        };
        let mut target = RedisTarget {
            url: SecretString::from(url.to_owned()),
            topology: Topology::Single,
            tls,
            username,
            password,
            db: 0,
            tls_files: TlsFiles::default(),
        };
        match topology_kind {
            "single" => {
                // The redis crate reads the URL itself; here only the db for get_db.
                if scheme.starts_with("redis") && !scheme.contains("unix") {
                    target.db = parse_db(path)?;
                }
            }
            "sentinel" => {
                let sentinels = parse_hosts(hosts, 26379)?;
                let mut parts = path.splitn(2, '/');
                let service = parts.next().unwrap_or("").to_owned();
                if service.is_empty() {
                    return Err("a redis+sentinel:// URL names the service after the hosts \
                                (…/mymaster)"
                        .into());
                }
                target.db = parse_db(parts.next().unwrap_or(""))?;
                target.topology = Topology::Sentinel { sentinels, service };
            }
            _ => {
                let nodes = parse_hosts(hosts, 6379)?;
                if !path.is_empty() && path != "0" {
                    return Err("a Redis Cluster has only database 0".into());
                }
                target.topology = Topology::Cluster { nodes };
            }
        }
        Ok(target)
    }

    /// Reads the TLS files (PEM). Any of them without a `rediss…` URL, or a certificate
    /// without its key, is refused: it would silently do nothing.
    pub fn with_tls_files(
        mut self,
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Self, (&'static str, String)> {
        if !self.tls {
            for (setting, file) in [
                ("SHEPHERD_REDIS_CA_FILE", ca),
                ("SHEPHERD_REDIS_CLIENT_CERT_FILE", cert),
                ("SHEPHERD_REDIS_CLIENT_KEY_FILE", key),
            ] {
                if file.is_some() {
                    return Err((
                        setting,
                        "is set but SHEPHERD_REDIS_URL does not use TLS (rediss://, \
                         rediss+sentinel://, rediss+cluster://)"
                            .into(),
                    ));
                }
            }
            return Ok(self);
        }
        if let Some(ca) = ca {
            self.tls_files.ca = Some(read_pem("SHEPHERD_REDIS_CA_FILE", ca, "CERTIFICATE")?);
        }
        match (cert, key) {
            (None, None) => {}
            (Some(cert), Some(key)) => {
                let cert = read_pem("SHEPHERD_REDIS_CLIENT_CERT_FILE", cert, "CERTIFICATE")?;
                let key = read_pem("SHEPHERD_REDIS_CLIENT_KEY_FILE", key, "PRIVATE KEY")?;
                let key = String::from_utf8(key).map_err(|_| {
                    (
                        "SHEPHERD_REDIS_CLIENT_KEY_FILE",
                        "is not a PEM text file".to_owned(),
                    )
                })?;
                self.tls_files.client = Some((cert, SecretString::from(key)));
            }
            (Some(_), None) => {
                return Err((
                    "SHEPHERD_REDIS_CLIENT_KEY_FILE",
                    "must be set with SHEPHERD_REDIS_CLIENT_CERT_FILE".into(),
                ));
            }
            (None, Some(_)) => {
                return Err((
                    "SHEPHERD_REDIS_CLIENT_CERT_FILE",
                    "must be set with SHEPHERD_REDIS_CLIENT_KEY_FILE".into(),
                ));
            }
        }
        Ok(self)
    }

    /// The URL as given (for the redis crate; never log it).
    pub fn url(&self) -> &str {
        self.url.expose_secret()
    }

    /// The password, if any (for the agents' secret scrubbing).
    pub fn password(&self) -> Option<&str> {
        self.password.as_ref().map(|p| p.expose_secret())
    }

    /// True for the one form `shepherd run` may start a local redis-server for
    /// (`redis://` to this machine): TLS, Sentinel and Cluster deployments are the
    /// operator's.
    pub fn is_plain_single(&self) -> bool {
        self.topology == Topology::Single && !self.tls
    }
}

fn decode(s: &str) -> Result<String, String> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| "the credentials are not valid percent-encoded UTF-8".into())
}

fn parse_db(path: &str) -> Result<i64, String> {
    if path.is_empty() {
        return Ok(0);
    }
    path.parse::<i64>()
        .map_err(|_| format!("database {path:?} is not a number"))
}

/// `host[:port],host[:port],…` (IPv6 in brackets).
fn parse_hosts(hosts: &str, default_port: u16) -> Result<Vec<(String, u16)>, String> {
    let mut out = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Err("lists an empty host (host1:port,host2:port,…)".into());
        }
        let (name, port) = if let Some(v6) = host.strip_prefix('[') {
            let (name, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("host {host:?} lacks its closing ]"))?;
            match after.strip_prefix(':') {
                Some(port) => (name, Some(port)),
                None if after.is_empty() => (name, None),
                None => return Err(format!("host {host:?} is not [address]:port")),
            }
        } else {
            match host.rsplit_once(':') {
                Some((name, port)) => (name, Some(port)),
                None => (host, None),
            }
        };
        let port = match port {
            None => default_port,
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| format!("port {p:?} of host {name:?} is not a port number"))?,
        };
        if name.is_empty() {
            return Err(format!("host {host:?} has no name"));
        }
        out.push((name.to_owned(), port));
    }
    Ok(out)
}

fn read_pem(
    setting: &'static str,
    path: &Path,
    label: &str,
) -> Result<Vec<u8>, (&'static str, String)> {
    let bytes = std::fs::read(path)
        .map_err(|e| (setting, format!("cannot read {}: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&bytes);
    if !text.contains("-----BEGIN ") || !text.contains(label) {
        return Err((setting, format!("{} holds no PEM {label}", path.display())));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        let t = RedisTarget::parse("redis://:pw@127.0.0.1:6379/2").unwrap();
        assert_eq!(t.topology, Topology::Single);
        assert!(!t.tls && t.is_plain_single());
        assert_eq!((t.db, t.password()), (2, Some("pw")));

        let t = RedisTarget::parse("rediss://r.example:6380").unwrap();
        assert!(t.tls && !t.is_plain_single());

        let t = RedisTarget::parse("redis+sentinel://u:p%40ss@s1:26379,s2,[::1]:26380/mymaster/3")
            .unwrap();
        assert_eq!(
            t.topology,
            Topology::Sentinel {
                sentinels: vec![
                    ("s1".into(), 26379),
                    ("s2".into(), 26379),
                    ("::1".into(), 26380)
                ],
                service: "mymaster".into()
            }
        );
        assert_eq!(t.username.as_deref(), Some("u"));
        assert_eq!((t.password(), t.db), (Some("p@ss"), 3));
        assert!(!t.tls);

        let t = RedisTarget::parse("rediss+cluster://n1:7000,n2:7001").unwrap();
        assert_eq!(
            t.topology,
            Topology::Cluster {
                nodes: vec![("n1".into(), 7000), ("n2".into(), 7001)]
            }
        );
        assert!(t.tls);
    }

    #[test]
    fn refuses_bad_urls_without_echoing_them() {
        for (url, needle) in [
            ("redis+sentinel://:secretpw@s1:26379", "service"),
            ("redis+cluster://:secretpw@n1:70000", "port"),
            ("redis+cluster://:secretpw@n1:7000,,n2", "empty host"),
            ("redis+cluster://:secretpw@n1:7000/1", "database 0"),
            ("http://:secretpw@x", "scheme"),
        ] {
            let e = RedisTarget::parse(url).unwrap_err();
            assert!(e.contains(needle), "{url}: {e}");
            assert!(!e.contains("secretpw"), "{e}");
        }
        let t = RedisTarget::parse("redis://:secretpw@h").unwrap();
        assert!(!format!("{t:?}").contains("secretpw"));
    }

    #[test]
    fn tls_files_need_a_tls_url_and_pairs() {
        let dir = std::env::temp_dir().join(format!("shepherd-tls-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let plain = RedisTarget::parse("redis://h").unwrap();
        let e = plain.with_tls_files(Some(&ca), None, None).unwrap_err();
        assert_eq!(e.0, "SHEPHERD_REDIS_CA_FILE");
        let tls = RedisTarget::parse("rediss://h").unwrap();
        let e = tls
            .clone()
            .with_tls_files(None, Some(&ca), None)
            .unwrap_err();
        assert_eq!(e.0, "SHEPHERD_REDIS_CLIENT_KEY_FILE");
        let e = tls
            .clone()
            .with_tls_files(Some(&dir.join("missing.pem")), None, None)
            .unwrap_err();
        assert!(e.1.contains("cannot read"), "{}", e.1);
        let ok = tls.with_tls_files(Some(&ca), None, None).unwrap();
        assert!(ok.tls_files.ca.is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
