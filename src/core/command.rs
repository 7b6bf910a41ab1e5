//! `/shepherd <command>` in PR and issue comments, parsed without IO. A command is a
//! line of its own; lines inside fenced code blocks (```` ``` ```` or `~~~`), indented
//! code blocks and quotes (`>`) are ignored, so quoting someone's command does not
//! repeat it.

use serde::{Deserialize, Serialize};

/// A command a trusted user can give.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "command")]
pub enum Command {
    /// Dispatch the current problem again now (clears `needs-human` and the stuck count).
    Retry,
    /// Go one tier up for the next attempt.
    Escalate,
    /// Stop dispatching and merging until `resume`.
    Pause,
    /// Leave `paused` or `needs-human`.
    Resume,
    /// Refresh the sticky status comment.
    Status,
    /// On an issue: ask for `issue-impl` (like adding the trigger label).
    Implement,
    /// Merge queue: (re-)enter the queue after a `dequeue`, and answer with the PR's
    /// position and why.
    Queue,
    /// Merge queue: the PR's position class (`high` goes before every `normal` entry;
    /// the head under test is never overtaken).
    Priority {
        /// `high` or `normal`.
        level: crate::core::queue::Priority,
    },
    /// Merge queue: take the PR out of its queue until `/shepherd queue`.
    Dequeue,
    /// Merge queue: freeze the queue of `branch` (nothing merges but hotfixes) until
    /// `/shepherd unfreeze <branch>` (`core::queue::freeze`).
    Freeze {
        /// Target branch.
        branch: String,
        /// The rest of the line (may be empty).
        reason: String,
    },
    /// Merge queue: end the freeze of `branch` set by hand.
    Unfreeze {
        /// Target branch.
        branch: String,
    },
    /// `/shepherd agents on`: agent work for a PR whose author is outside the policy's
    /// `agent_authors` (PRs only; recorded with who and when).
    AgentsOn,
    /// `/shepherd budget +<amount>`: this PR (or issue) may spend that much more beyond
    /// the spend caps, and leaves `over-budget` (issue 28). `+5` or `+5usd` is five
    /// dollars, `+20000tokens` twenty thousand input + output tokens.
    Budget {
        /// Micro-dollars granted.
        #[serde(default)]
        usd_micros: u64,
        /// Tokens granted.
        #[serde(default)]
        tokens: u64,
    },
}

/// Most one `/shepherd budget` may grant, in dollars (a typo of a few zeros stays
/// bounded).
pub const MAX_GRANT_USD: f64 = 100_000.0;

/// Most one `/shepherd budget` may grant, in tokens.
pub const MAX_GRANT_TOKENS: u64 = 10_000_000_000;

/// The word that starts a command.
const PREFIX: &str = "/shepherd";

/// Most commands taken from one comment; the rest are ignored. There are thirteen
/// commands, so a human never needs more, and the bound keeps what one comment can
/// queue in a record small (a 1.8 MB comment once queued 100,000 commands).
pub const MAX_COMMANDS_PER_COMMENT: usize = 10;

/// Every command in `body`, in order, up to [`MAX_COMMANDS_PER_COMMENT`]. Unknown
/// words after `/shepherd` are skipped.
pub fn parse(body: &str) -> Vec<Command> {
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    for line in body.lines() {
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        let trimmed = line.trim();
        if let Some(open) = fence {
            if trimmed.starts_with(open) {
                fence = None;
            }
            continue;
        }
        if trimmed.starts_with("```") {
            fence = Some("```");
            continue;
        }
        if trimmed.starts_with("~~~") {
            fence = Some("~~~");
            continue;
        }
        if indent >= 4 || line.starts_with('\t') || trimmed.starts_with('>') {
            continue;
        }
        if let Some(command) = parse_line(trimmed) {
            out.push(command);
            if out.len() >= MAX_COMMANDS_PER_COMMENT {
                break;
            }
        }
    }
    out
}

/// One line: `/shepherd <word>` (case-insensitive, extra words ignored).
fn parse_line(line: &str) -> Option<Command> {
    let mut words = line.split_whitespace();
    if !words.next()?.eq_ignore_ascii_case(PREFIX) {
        return None;
    }
    match words.next()?.to_ascii_lowercase().as_str() {
        "retry" => Some(Command::Retry),
        "escalate" => Some(Command::Escalate),
        "pause" => Some(Command::Pause),
        "resume" => Some(Command::Resume),
        "status" => Some(Command::Status),
        "implement" => Some(Command::Implement),
        "queue" => Some(Command::Queue),
        "dequeue" => Some(Command::Dequeue),
        "freeze" => Some(Command::Freeze {
            branch: branch_word(words.next()?)?,
            reason: words.collect::<Vec<_>>().join(" "),
        }),
        "unfreeze" => Some(Command::Unfreeze {
            branch: branch_word(words.next()?)?,
        }),
        "budget" => parse_grant(words.next()?, words.next()),
        "agents" => match words.next()?.to_ascii_lowercase().as_str() {
            "on" => Some(Command::AgentsOn),
            _ => None,
        },
        "priority" => match words.next()?.to_ascii_lowercase().as_str() {
            "high" => Some(Command::Priority {
                level: crate::core::queue::Priority::High,
            }),
            "normal" => Some(Command::Priority {
                level: crate::core::queue::Priority::Normal,
            }),
            _ => None,
        },
        _ => None,
    }
}

/// A branch name as a command names it: at most 255 bytes (a bound on what one
/// comment can make a key of), no backtick (it is quoted in comments); else the
/// command is ignored.
fn branch_word(word: &str) -> Option<String> {
    (word.len() <= 255 && !word.contains('`')).then(|| word.to_owned())
}

/// The amount of `/shepherd budget +<amount>` (`unit`: an optional next word,
/// `usd` or `tokens`): positive, finite and at most the grant bounds.
fn parse_grant(amount: &str, unit: Option<&str>) -> Option<Command> {
    let amount = amount.strip_prefix('+')?.to_ascii_lowercase();
    let (number, suffix) = match amount.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => amount.split_at(i),
        None => (amount.as_str(), unit.unwrap_or("usd")),
    };
    let number = number.strip_prefix('$').unwrap_or(number);
    match suffix.to_ascii_lowercase().as_str() {
        "usd" | "$" => {
            let usd: f64 = number.parse().ok()?;
            let ok = usd.is_finite() && usd > 0.0 && usd <= MAX_GRANT_USD;
            let usd_micros = super::usage::usd_to_micros(usd);
            (ok && usd_micros > 0).then_some(Command::Budget {
                usd_micros,
                tokens: 0,
            })
        }
        "tokens" | "token" => {
            let tokens: u64 = number.parse().ok()?;
            (tokens > 0 && tokens <= MAX_GRANT_TOKENS).then_some(Command::Budget {
                usd_micros: 0,
                tokens,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_on_their_own_lines() {
        let body = "Thanks!\n/shepherd retry\n  /Shepherd PAUSE please\n/shepherd frobnicate\n";
        assert_eq!(parse(body), vec![Command::Retry, Command::Pause]);
        assert_eq!(parse("/shepherd"), vec![]);
        assert_eq!(parse("please /shepherd retry"), vec![]);
        assert_eq!(parse("/shepherdretry"), vec![]);
    }

    #[test]
    fn parses_the_queue_commands() {
        use crate::core::queue::Priority;
        let body = "/shepherd queue\n/shepherd priority HIGH\n/shepherd priority urgent\n/shepherd priority\n/shepherd priority normal\n/shepherd dequeue";
        assert_eq!(
            parse(body),
            vec![
                Command::Queue,
                Command::Priority {
                    level: Priority::High
                },
                Command::Priority {
                    level: Priority::Normal
                },
                Command::Dequeue,
            ]
        );
    }

    #[test]
    fn parses_freeze_and_unfreeze_with_branch_and_reason() {
        let body = "/shepherd freeze main release 2.0  is   cut\n/shepherd freeze\n/Shepherd UNFREEZE release/2.x\n/shepherd unfreeze\n/shepherd freeze dev\n/shepherd freeze `main`";
        assert_eq!(
            parse(body),
            vec![
                Command::Freeze {
                    branch: "main".into(),
                    reason: "release 2.0 is cut".into()
                },
                Command::Unfreeze {
                    branch: "release/2.x".into()
                },
                Command::Freeze {
                    branch: "dev".into(),
                    reason: String::new()
                },
            ]
        );
    }

    #[test]
    fn parses_agents_on() {
        assert_eq!(parse("/shepherd agents on"), vec![Command::AgentsOn]);
        assert_eq!(parse("/Shepherd AGENTS On please"), vec![Command::AgentsOn]);
        assert_eq!(parse("/shepherd agents\n/shepherd agents off"), vec![]);
    }

    #[test]
    fn parses_budget_grants_and_refuses_odd_amounts() {
        let usd = |u: u64| Command::Budget {
            usd_micros: u,
            tokens: 0,
        };
        let body = "/shepherd budget +5\n/shepherd budget +2.5usd\n/shepherd budget +$3\n\
                    /shepherd budget +20000tokens\n/shepherd budget +7 tokens";
        assert_eq!(
            parse(body),
            vec![
                usd(5_000_000),
                usd(2_500_000),
                usd(3_000_000),
                Command::Budget {
                    usd_micros: 0,
                    tokens: 20_000
                },
                Command::Budget {
                    usd_micros: 0,
                    tokens: 7
                },
            ]
        );
        // No sign, zero, negative, not a number, too much, an unknown unit.
        let bad = "/shepherd budget 5\n/shepherd budget +0\n/shepherd budget +-3\n\
                   /shepherd budget +NaN\n/shepherd budget +inf\n/shepherd budget +1e9\n\
                   /shepherd budget +5eur\n/shepherd budget +1.5tokens\n/shepherd budget";
        assert_eq!(parse(bad), vec![]);
    }

    #[test]
    fn ignores_code_and_quotes() {
        let body = "```\n/shepherd retry\n```\n~~~sh\n/shepherd pause\n~~~\n> /shepherd escalate\n    /shepherd status\n/shepherd resume";
        assert_eq!(parse(body), vec![Command::Resume]);
        // An unclosed fence swallows the rest.
        assert_eq!(parse("```\n/shepherd retry"), vec![]);
    }

    #[test]
    fn a_comment_flooded_with_commands_yields_at_most_the_cap() {
        let body = "/shepherd status\n".repeat(100_000);
        assert_eq!(parse(&body).len(), MAX_COMMANDS_PER_COMMENT);
        let few = "/shepherd pause\n/shepherd resume\n";
        assert_eq!(parse(few), vec![Command::Pause, Command::Resume]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn never_panics(body in ".{0,200}") {
            let _ = parse(&body);
        }
    }
}
