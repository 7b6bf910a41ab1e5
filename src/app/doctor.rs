//! `shepherd doctor`: runs the checks of [`crate::ops::doctor`] and prints them as a
//! checklist on stdout, one line per check (`✓`/`✗`, its name, what was found) and,
//! under a failed one, the fix. Exit status 0 only when every check passes.

use std::process::ExitCode;

use crate::cli::DoctorArgs;
use crate::config::Settings;
use crate::ops::doctor::{Check, DoctorReport, DoctorRequest, doctor};

/// The whole command: its own runtime (the configuration may not validate, so
/// `main.rs` calls this before anything else is set up), the checks, the checklist.
pub fn main(settings: &Settings, args: &DoctorArgs) -> ExitCode {
    let request = DoctorRequest {
        settings: settings.clone(),
        agents: args.agents.clone(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shepherd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = runtime.block_on(doctor(&request));
    print!("{}", render(&report));
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The checklist as printed.
pub fn render(report: &DoctorReport) -> String {
    let width = report
        .checks
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for Check {
        name,
        ok,
        detail,
        fix,
    } in &report.checks
    {
        let mark = if *ok { '✓' } else { '✗' };
        out.push_str(&format!("{mark} {name:<width$}  {detail}\n"));
        if let Some(fix) = fix {
            out.push_str(&format!("  {:<width$}  fix: {fix}\n", ""));
        }
    }
    let passed = report.checks.iter().filter(|c| c.ok).count();
    let total = report.checks.len();
    out.push_str(&match report.passed() {
        true => format!("all {total} checks passed\n"),
        false => format!("{passed} of {total} checks passed\n"),
    });
    out
}
