//! `/shepherd` commands with trust: users in the policy's `trusted_users` act at once;
//! anyone else's commands wait for an `Observe(Permission)` and run when it says write
//! or admin (a read-only commenter gets one refusal comment). The bot's own comments
//! never carry commands. Each comment's commands run once for the life of the record,
//! however often and however late the comment is delivered or replayed: the record
//! keeps the highest handled comment ids and a floor below which nothing runs (an
//! edit of a comment already handled runs nothing either; post a new comment).

use super::super::command::Command;
use super::super::effect::{EffectKind, ObserveWhat};
use super::super::event::Permission;
use super::super::ids::Login;
use super::super::policy::Policy;
use super::super::queue::freeze::{FreezeAction, FreezeOp};
use super::super::record::{
    HANDLED_COMMENTS_KEPT, Hold, MAX_PENDING_COMMANDS, MAX_PENDING_PER_LOGIN, PendingCommand,
    PermissionFact, WorkState,
};
use super::super::texts;
use super::{Fx, work};

/// How long an observed permission is trusted (ms).
const PERMISSION_TTL_MS: i64 = 3_600_000;

/// Where commands are given.
pub(crate) struct CommandCtx {
    /// The record's number (for refusal comments).
    pub number: u64,
}

/// What executed commands ask of the record beyond its work state.
#[derive(Debug, Default, Clone)]
pub(crate) struct CommandEffects {
    /// Refresh the status comment (`/shepherd status`).
    pub refresh_status: bool,
    /// A retry was requested (clear a merge back-off too).
    pub retry: bool,
    /// `issue-impl` was requested (issues only; ignored on PRs).
    pub implement: bool,
    /// A merge-queue command (PRs only; the last one of a comment wins).
    pub queue: Option<QueueCommand>,
    /// `/shepherd freeze|unfreeze` by a user with write access (PRs only; the last one
    /// of a comment wins).
    pub freeze: Option<crate::core::queue::freeze::FreezeOp>,
    /// `/shepherd agents on` by a user with write access: who (PRs only).
    pub agents_on: Option<Login>,
    /// `/shepherd agents on` by a user without write access, refused: who.
    pub agents_on_refused: Option<Login>,
}

/// A merge-queue command for the PR record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueCommand {
    /// `/shepherd queue`.
    Enter,
    /// `/shepherd priority …`.
    Priority(crate::core::queue::Priority),
    /// `/shepherd dequeue`.
    Dequeue,
}

/// Whether a user may give commands.
enum Trust {
    /// Trusted or has write access.
    Yes,
    /// Read-only.
    No,
    /// Not known: look it up.
    Unknown,
}

/// What the record knows about `login`'s trust.
fn trust(ws: &WorkState, login: &Login, policy: &Policy, now: i64) -> Trust {
    if policy.is_trusted(login) {
        return Trust::Yes;
    }
    match ws.permissions.get(login) {
        Some(f) if now - f.at_ms < PERMISSION_TTL_MS => match f.permission {
            Permission::Write | Permission::Admin => Trust::Yes,
            Permission::Read => Trust::No,
        },
        Some(_) | None => Trust::Unknown,
    }
}

/// Whether `login` has write access as far as the record knows (trusted users do):
/// `None` when a permission read is needed.
pub(crate) fn writer(ws: &WorkState, login: &Login, policy: &Policy, now: i64) -> Option<bool> {
    match trust(ws, login, policy, now) {
        Trust::Yes => Some(true),
        Trust::No => Some(false),
        Trust::Unknown => None,
    }
}

/// A human comment with commands.
#[expect(
    clippy::too_many_arguments,
    reason = "one call site per record kind; a struct would only rename the parameters"
)]
pub(crate) fn on_comment(
    ws: &mut WorkState,
    ctx: &CommandCtx,
    comment_id: i64,
    commands: &[Command],
    sender: Option<&Login>,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) -> CommandEffects {
    let mut out = CommandEffects::default();
    let Some(login) = sender else {
        return out;
    };
    if commands.is_empty() || !mark_handled(ws, comment_id) {
        return out;
    }
    match trust(ws, login, policy, now) {
        Trust::Yes => {
            for c in commands {
                execute(ws, c, login, now, policy, &mut out);
            }
        }
        Trust::No => {
            refused(commands.iter(), login, &mut out);
            fx.comment(ctx.number, texts::command_refused(login.as_str()));
        }
        Trust::Unknown => {
            let mine = ws
                .pending_commands
                .iter()
                .filter(|p| &p.login == login)
                .count();
            let asked = mine > 0;
            let take = MAX_PENDING_PER_LOGIN
                .saturating_sub(mine)
                .min(commands.len());
            if take == 0 {
                // This login's flood: its lookup is already asked; the rest is dropped.
                return out;
            }
            // The record-wide bound evicts the oldest commands of other logins, so a
            // flood from many accounts cannot keep a newcomer's commands out (their
            // lookups are already asked and answer in seconds).
            while ws.pending_commands.len() + take > MAX_PENDING_COMMANDS {
                let Some(i) = ws.pending_commands.iter().position(|p| &p.login != login) else {
                    break;
                };
                ws.pending_commands.remove(i);
            }
            ws.pending_commands
                .extend(commands.iter().take(take).map(|c| PendingCommand {
                    login: login.clone(),
                    command: c.clone(),
                    comment_id,
                }));
            if !asked {
                fx.push(EffectKind::Observe(ObserveWhat::Permission {
                    login: login.clone(),
                }));
            }
        }
    }
    out
}

/// Notes that `comment_id`'s commands are being handled; false when they already were
/// (in the window, or at or below the floor). The window keeps the highest ids: the
/// lowest is dropped into the floor, so the two together cover every id handled.
fn mark_handled(ws: &mut WorkState, comment_id: i64) -> bool {
    if comment_id <= ws.handled_floor || ws.handled_comments.contains(&comment_id) {
        return false;
    }
    ws.handled_comments.push(comment_id);
    if ws.handled_comments.len() > HANDLED_COMMENTS_KEPT
        && let Some((i, &lowest)) = ws
            .handled_comments
            .iter()
            .enumerate()
            .min_by_key(|(_, id)| **id)
    {
        ws.handled_comments.remove(i);
        ws.handled_floor = ws.handled_floor.max(lowest);
    }
    true
}

/// A permission read: run or refuse the commands waiting for it.
#[expect(clippy::too_many_arguments, reason = "mirrors on_comment")]
pub(crate) fn on_permission(
    ws: &mut WorkState,
    ctx: &CommandCtx,
    login: &Login,
    permission: Permission,
    at_ms: i64,
    now: i64,
    policy: &Policy,
    fx: &mut Fx,
) -> CommandEffects {
    let mut out = CommandEffects::default();
    let newer = ws.permissions.get(login).is_none_or(|f| at_ms >= f.at_ms);
    if newer {
        ws.permissions
            .insert(login.clone(), PermissionFact { permission, at_ms });
    }
    let (mine, rest): (Vec<PendingCommand>, Vec<PendingCommand>) = ws
        .pending_commands
        .drain(..)
        .partition(|p| &p.login == login);
    ws.pending_commands = rest;
    // A push by this user waits for the read to end a needs-human hold.
    if ws.resume_by_push.as_ref() == Some(login) {
        let needs_human = matches!(ws.hold, Some(Hold::NeedsHuman { .. }));
        match permission {
            Permission::Write | Permission::Admin if needs_human => {
                work::resume(ws);
            }
            Permission::Write | Permission::Admin | Permission::Read => ws.resume_by_push = None,
        }
    }
    if mine.is_empty() {
        return out;
    }
    match permission {
        Permission::Write | Permission::Admin => {
            for p in &mine {
                execute(ws, &p.command, login, now, policy, &mut out);
            }
        }
        Permission::Read => {
            refused(mine.iter().map(|p| &p.command), login, &mut out);
            fx.comment(ctx.number, texts::command_refused(login.as_str()));
        }
    }
    out
}

/// Runs one command.
fn execute(
    ws: &mut WorkState,
    command: &Command,
    by: &Login,
    now: i64,
    policy: &Policy,
    out: &mut CommandEffects,
) {
    match command {
        Command::Retry => {
            work::resume(ws);
            out.retry = true;
        }
        Command::Escalate => {
            work::escalate(ws, policy);
        }
        Command::Pause => {
            work::pause(ws, Some(by), now);
        }
        Command::Resume => {
            work::resume(ws);
        }
        Command::Status => out.refresh_status = true,
        Command::Implement => out.implement = true,
        Command::Queue => out.queue = Some(QueueCommand::Enter),
        Command::Priority { level } => out.queue = Some(QueueCommand::Priority(*level)),
        Command::Dequeue => out.queue = Some(QueueCommand::Dequeue),
        Command::AgentsOn => out.agents_on = Some(by.clone()),
        Command::Freeze { branch, reason } => {
            out.freeze = Some(FreezeOp {
                branch: branch.clone(),
                by: by.to_string(),
                action: FreezeAction::Freeze {
                    reason: reason.clone(),
                },
            });
        }
        Command::Unfreeze { branch } => {
            out.freeze = Some(FreezeOp {
                branch: branch.clone(),
                by: by.to_string(),
                action: FreezeAction::Unfreeze,
            });
        }
        Command::Budget { usd_micros, tokens } => {
            let more = crate::core::budget::Grant {
                usd_micros: *usd_micros,
                tokens: *tokens,
            };
            super::budget::grant(ws, more);
        }
    }
}

/// Notes a refused `/shepherd agents on` among `commands` (the record keeps who).
fn refused<'a>(
    mut commands: impl Iterator<Item = &'a Command>,
    login: &Login,
    out: &mut CommandEffects,
) {
    if commands.any(|c| *c == Command::AgentsOn) {
        out.agents_on_refused = Some(login.clone());
    }
}
