//! Identity newtypes, normalized at construction so that two spellings of the same
//! thing compare equal (`Org/Repo` and `org/repo` are one repository).
//!
//! Issue and PR numbers share one index space in Forgejo and stay plain `u64`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a string is not a valid identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// A repository name must be `owner/name` with two non-empty parts.
    #[error("repository name {0:?} is not owner/name")]
    Repo(String),
    /// A commit id must be 4–64 hexadecimal digits.
    #[error("commit id {0:?} is not hexadecimal")]
    Sha(String),
    /// The identity is empty or contains whitespace.
    #[error("{kind} {value:?} is empty or contains whitespace")]
    Blank {
        /// Which identity.
        kind: &'static str,
        /// The rejected text.
        value: String,
    },
}

/// Implements `Display`, `FromStr`, `Serialize` and `Deserialize` through the
/// normalizing constructor, so deserialized values are normalized too.
macro_rules! text_id {
    ($name:ident, $normalize:expr) => {
        impl $name {
            /// The normalized text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                let normalize: fn(&str) -> Result<String, IdError> = $normalize;
                normalize(s).map(Self)
            }
        }
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// Rejects empty text and text with whitespace.
fn non_blank(kind: &'static str, s: &str) -> Result<String, IdError> {
    let t = s.trim();
    if t.is_empty() || t.chars().any(char::is_whitespace) {
        return Err(IdError::Blank {
            kind,
            value: s.to_owned(),
        });
    }
    Ok(t.to_owned())
}

/// A repository, `owner/name`, lower-cased (Forgejo names are case-insensitive).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RepoName(String);

text_id!(RepoName, |s| {
    let t = s.trim().to_lowercase();
    match t.split_once('/') {
        Some((o, n))
            if !o.is_empty()
                && !n.is_empty()
                && !n.contains('/')
                && !t.chars().any(char::is_whitespace) =>
        {
            Ok(t)
        }
        _ => Err(IdError::Repo(s.to_owned())),
    }
});

impl RepoName {
    /// The owner (user or organisation) part.
    pub fn owner(&self) -> &str {
        self.0.split_once('/').map_or("", |(o, _)| o)
    }

    /// The repository name part.
    pub fn name(&self) -> &str {
        self.0.split_once('/').map_or("", |(_, n)| n)
    }
}

/// A commit id, lower-case hex.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sha(String);

text_id!(Sha, |s| {
    let t = s.trim().to_lowercase();
    if (4..=64).contains(&t.len()) && t.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(t)
    } else {
        Err(IdError::Sha(s.to_owned()))
    }
});

/// A user login, lower-cased (Forgejo logins are case-insensitive).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Login(String);

text_id!(Login, |s| non_blank("login", s).map(|t| t.to_lowercase()));

/// A webhook delivery id (`X-Forgejo-Delivery`), kept as sent.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeliveryId(String);

text_id!(DeliveryId, |s| non_blank("delivery id", s));

/// Identity of one dispatched work item. Its text is
/// `<owner>:<name>:<pr|issue>:<number>:<sequence>`: URL-path safe (it appears in
/// `/api/v1/work/{id}/result`) and enough to find the record it belongs to
/// ([`WorkId::subject`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkId(String);

text_id!(WorkId, |s| non_blank("work id", s));

/// Whether a record is a pull request's or an issue's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// A pull request record.
    Pr,
    /// An issue record (`issue-impl`).
    Issue,
}

impl WorkId {
    /// The id of the `seq`-th work item of a record.
    pub fn new(repo: &RepoName, scope: Scope, number: u64, seq: u64) -> Self {
        let scope = match scope {
            Scope::Pr => "pr",
            Scope::Issue => "issue",
        };
        Self(format!(
            "{}:{}:{scope}:{number}:{seq}",
            repo.owner(),
            repo.name()
        ))
    }

    /// The record this work item belongs to, when the id has the shape [`WorkId::new`]
    /// makes.
    pub fn subject(&self) -> Option<(RepoName, Scope, u64)> {
        let mut parts = self.0.rsplitn(4, ':');
        let _seq: u64 = parts.next()?.parse().ok()?;
        let number: u64 = parts.next()?.parse().ok()?;
        let scope = match parts.next()? {
            "pr" => Scope::Pr,
            "issue" => Scope::Issue,
            _ => return None,
        };
        let (owner, name) = parts.next()?.split_once(':')?;
        let repo = format!("{owner}/{name}").parse().ok()?;
        Some((repo, scope, number))
    }
}

/// Deterministic identity of one effect: record key + record version + index, so a
/// retried commit produces the same ids and executors can deduplicate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EffectId(String);

text_id!(EffectId, |s| non_blank("effect id", s));

impl EffectId {
    /// The id of effect `index` of the transition that produced record `version`.
    pub fn new(repo: &RepoName, scope: Scope, number: u64, version: u64, index: usize) -> Self {
        let scope = match scope {
            Scope::Pr => "pr",
            Scope::Issue => "issue",
        };
        Self(format!("{repo}/{scope}/{number}@{version}.{index}"))
    }
}

/// Why git would refuse `name` as a branch name (`git check-ref-format --branch`'s
/// rules: no control characters, space, `~ ^ : ? * [ \`, no `..` or `@{`, no empty,
/// leading-dot or `.lock` component, no leading `-`, no trailing `/` or `.`, not `@`),
/// or `None` when it is a valid name. Policy `issue_branch` and the head branch of a
/// dependency's PR (read from Forgejo) are checked with it before they reach a prompt.
pub fn branch_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || name == "@" {
        return Some("is empty or `@`");
    }
    if name.len() > 255 {
        return Some("is longer than 255 bytes");
    }
    if name.starts_with('-') {
        return Some("starts with `-`");
    }
    if name
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c))
    {
        return Some("holds a space, a control character or one of ~ ^ : ? * [ \\");
    }
    if name.contains("..") || name.contains("@{") {
        return Some("holds `..` or `@{`");
    }
    if name.ends_with('.') || name.ends_with('/') {
        return Some("ends with `.` or `/`");
    }
    if name
        .split('/')
        .any(|part| part.is_empty() || part.starts_with('.') || part.ends_with(".lock"))
    {
        return Some("has an empty component, one starting with `.` or ending with `.lock`");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_names_normalize_and_reject_garbage() {
        let r: RepoName = " Org/Repo ".parse().unwrap();
        assert_eq!(r.to_string(), "org/repo");
        assert_eq!((r.owner(), r.name()), ("org", "repo"));
        for bad in ["", "org", "/repo", "org/", "a/b/c", "a b/c"] {
            assert!(bad.parse::<RepoName>().is_err(), "{bad}");
        }
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json, "\"org/repo\"");
        let back: RepoName = serde_json::from_str("\"ORG/Repo\"").unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn shas_and_logins_normalize() {
        assert_eq!("ABCdef12".parse::<Sha>().unwrap().as_str(), "abcdef12");
        assert!("xyz".parse::<Sha>().is_err());
        assert_eq!("Alice".parse::<Login>().unwrap().as_str(), "alice");
        assert!(" ".parse::<Login>().is_err());
    }

    #[test]
    fn work_ids_name_their_record() {
        let repo: RepoName = "my-org/my.repo".parse().unwrap();
        let id = WorkId::new(&repo, Scope::Issue, 12, 3);
        assert_eq!(id.as_str(), "my-org:my.repo:issue:12:3");
        assert_eq!(id.subject(), Some((repo, Scope::Issue, 12)));
        assert_eq!("nonsense".parse::<WorkId>().unwrap().subject(), None);
    }
}
