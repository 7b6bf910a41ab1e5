//! The operator commands on the command line: each turns its clap arguments into the
//! plain request of an `ops` function, runs it on a fresh [`Ops`], and prints the
//! report (progress and summaries on stderr, `--json` or data on stdout). The admin API
//! (`crate::ingest::admin`) runs the same `ops` functions and answers JSON.

use crate::cli::{CostsArgs, DlqAction, DlqArgs, InspectArgs, RebuildArgs, ReplayArgs, ResyncArgs};
use crate::ops::costs::{self, CostsRequest};
use crate::ops::dlq::{drop_entries, list, replay_dead_letters, show};
use crate::ops::inspect::{InspectReport, inspect, render_line, render_pr};
use crate::ops::rebuild::{RebuildRequest, rebuild};
use crate::ops::replay::{ReplayRequest, replay};
use crate::ops::resync::{ResyncRequest, resync};
use crate::ops::timefmt::now_ms;
use crate::ops::{Ops, diff};

/// Prints `value` as pretty JSON on stdout.
fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// The request of `shepherd replay …`.
pub fn replay_request(a: &ReplayArgs) -> ReplayRequest {
    ReplayRequest {
        delivery: a.delivery.clone(),
        pr: a.pr.clone(),
        repo: a.repo.clone(),
        since: a.since.clone(),
        until: a.until.clone(),
        dead_letter: a.dead_letter.clone(),
        dry_run: a.dry_run,
    }
}

/// `shepherd replay`: progress and summary on stderr, `--json` report on stdout.
pub async fn replay_cmd(ops: &Ops, args: &ReplayArgs) -> anyhow::Result<()> {
    let req = replay_request(args);
    let report = replay(ops, &req, &|line| eprintln!("{line}")).await?;
    if args.dry_run && !args.json {
        for item in &report.replayed {
            for t in &item.transitions {
                for fx in &t.effects {
                    eprintln!("    effect {} {}", fx.id, serde_json::to_string(&fx.kind)?);
                }
            }
        }
    }
    let verb = if report.dry_run {
        "would replay"
    } else {
        "replayed"
    };
    eprintln!("{verb} {} entries", report.replayed.len());
    if args.json {
        print_json(&report)?;
    }
    Ok(())
}

/// `shepherd inspect`.
pub async fn inspect_cmd(ops: &Ops, args: &InspectArgs) -> anyhow::Result<()> {
    let report = inspect(ops, &args.target).await?;
    if args.json {
        return print_json(&report);
    }
    let now = now_ms();
    match &report {
        InspectReport::Pr(i) => print!("{}", render_pr(i, now)),
        InspectReport::Issue(i) => print!("{}", crate::ops::inspect_issue::render_issue(i, now)),
        InspectReport::Repo(prs) => {
            for s in prs {
                println!("{}", render_line(s, now));
            }
            eprintln!("{} open PRs", prs.len());
        }
    }
    Ok(())
}

/// `shepherd rebuild`.
pub async fn rebuild_cmd(ops: &Ops, args: &RebuildArgs) -> anyhow::Result<()> {
    let req = RebuildRequest {
        target: args.target.clone(),
        apply: args.apply,
    };
    let report = rebuild(ops, &req).await?;
    if args.json {
        return print_json(&report);
    }
    eprintln!(
        "{}: folded {} archived events; stored record at version {}",
        report.target, report.events_folded, report.stored_version
    );
    if let Some(l) = &report.legacy {
        eprintln!("previous dispatcher's state: {l}");
    }
    if report.changes.is_empty() {
        println!("no differences");
    } else {
        println!("{} differences (stored → folded):", report.changes.len());
        print!("{}", diff::render(&report.changes));
    }
    if let Some(v) = report.new_version {
        eprintln!("applied: the stored record is now the folded one (version {v})");
    } else if !report.changes.is_empty() {
        eprintln!("run with --apply to replace the stored record");
    }
    Ok(())
}

/// `shepherd resync`.
pub async fn resync_cmd(ops: &Ops, args: &ResyncArgs) -> anyhow::Result<()> {
    let req = ResyncRequest {
        repo: args.repo.clone(),
        all: args.all,
    };
    let report = resync(ops, &req).await?;
    for r in &report.repos {
        eprintln!(
            "{}: {} open PRs, {} no longer open, {} observations queued",
            r.repo,
            r.open_prs.len(),
            r.no_longer_open.len(),
            r.queued
        );
        for e in &r.errors {
            eprintln!("  error: {e}");
        }
    }
    print_json(&report)?;
    if report.repos.iter().any(|r| !r.errors.is_empty()) {
        anyhow::bail!("resync finished with errors");
    }
    Ok(())
}

/// `shepherd dlq …`.
pub async fn dlq_cmd(ops: &Ops, args: &DlqArgs) -> anyhow::Result<()> {
    match &args.action {
        DlqAction::List => {
            let items = list(ops).await?;
            if args.json {
                return print_json(&items);
            }
            for d in &items {
                println!(
                    "{}  {}  {}  {}  {}  [{}]",
                    d.id, d.at, d.repo, d.event, d.delivery, d.reason
                );
            }
            eprintln!("{} dead letters", items.len());
        }
        DlqAction::Show { id } => {
            let d = show(ops, id).await?;
            print_json(&d)?;
        }
        DlqAction::Retry { id, all } => {
            let req = ReplayRequest {
                dead_letter: Some(if *all {
                    String::new()
                } else {
                    id.clone().unwrap_or_default()
                }),
                ..ReplayRequest::default()
            };
            let report = replay_dead_letters(ops, &req, &|l| eprintln!("{l}")).await?;
            eprintln!("re-queued {} dead letters", report.replayed.len());
            if args.json {
                print_json(&report)?;
            }
        }
        DlqAction::Drop { id, all } => {
            let id = if *all { None } else { id.as_deref() };
            let n = drop_entries(ops, id).await?;
            eprintln!("dropped {n} dead letters");
            if args.json {
                print_json(&serde_json::json!({ "dropped": n }))?;
            }
        }
    }
    Ok(())
}

/// `shepherd costs`: text tables, `--csv` or `--json` on stdout.
pub async fn costs_cmd(ops: &Ops, args: &CostsArgs) -> anyhow::Result<()> {
    let req = CostsRequest {
        from: args.from.clone(),
        to: args.to.clone(),
        days: args.days,
        repo: args.repo.clone(),
        top: args.top,
    };
    let report = costs::costs(ops, &req, now_ms()).await?;
    if args.json {
        return print_json(&report);
    }
    if args.csv {
        print!("{}", costs::render_csv(&report));
    } else {
        print!("{}", costs::render_text(&report));
    }
    Ok(())
}
