//! What the Redis server says about itself, for `shepherd doctor`: its version
//! (`INFO server`) and the persistence settings that decide whether an acknowledged
//! delivery survives a crash (`CONFIG GET appendonly`, `appendfsync`, `save`). Read
//! only; nothing is written.

use redis::Value;

use crate::store::{Conn, StoreError};

/// The persistence settings of a Redis server, as `CONFIG GET` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistence {
    /// `appendonly`: `yes` or `no`.
    pub appendonly: String,
    /// `appendfsync`: `always`, `everysec` or `no`.
    pub appendfsync: String,
    /// `save`: the RDB snapshot rules (`""` when off).
    pub save: String,
}

/// The server's version (`redis_version` of `INFO server`). On a cluster, one node's.
pub async fn version(conn: &mut Conn) -> Result<String, StoreError> {
    let info: Value = redis::cmd("INFO").arg("server").query_async(conn).await?;
    let mut texts = Vec::new();
    strings(&info, &mut texts);
    texts
        .iter()
        .flat_map(|t| t.lines())
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(|v| v.trim().to_owned())
        .ok_or_else(|| StoreError::Protocol {
            script: "INFO server",
            reply: "no redis_version".into(),
        })
}

/// The persistence settings (one `CONFIG GET` each, as servers before 7.0 take one
/// parameter a call). Fails when the server refuses `CONFIG` (a managed Redis may).
pub async fn persistence(conn: &mut Conn) -> Result<Persistence, StoreError> {
    Ok(Persistence {
        appendonly: config_get(conn, "appendonly").await?,
        appendfsync: config_get(conn, "appendfsync").await?,
        save: config_get(conn, "save").await?,
    })
}

/// One `CONFIG GET` parameter's value.
async fn config_get(conn: &mut Conn, name: &str) -> Result<String, StoreError> {
    let reply: Value = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(conn)
        .await?;
    let mut texts = Vec::new();
    strings(&reply, &mut texts);
    // `[name, value]` (or a map `{name: value}`, or one such per cluster node).
    texts
        .iter()
        .position(|t| t == name)
        .and_then(|i| texts.get(i + 1))
        .cloned()
        .ok_or_else(|| StoreError::Protocol {
            script: "CONFIG GET",
            reply: format!("no value for {name}"),
        })
}

/// Every string in a reply, depth first (arrays, maps, bulk and simple strings).
fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => out.push(s.clone()),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            strings(k, out);
            strings(v, out);
        }),
        Value::Attribute { data, .. } => strings(data, out),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_found_in_every_reply_shape() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let mut out = Vec::new();
        strings(
            &Value::Array(vec![
                bulk("save"),
                bulk("3600 1"),
                Value::Map(vec![(bulk("appendonly"), bulk("yes"))]),
                Value::Int(3),
            ]),
            &mut out,
        );
        assert_eq!(out, ["save", "3600 1", "appendonly", "yes"]);
    }
}
