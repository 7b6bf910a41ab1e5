//! Operator tools: send, replay, inspect, rebuild, resync, dead letters — and the
//! dispatcher from a parsed subcommand to the code that runs it.

pub mod send;

use crate::cli::Command;
use crate::config::Config;

/// Runs one subcommand to completion.
pub async fn run_command(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::Serve => crate::ingest::serve(config, crate::shutdown::on_signals()).await,
        Command::Work(_) => anyhow::bail!("work: not built yet"),
        Command::Run(_) => anyhow::bail!("run: not built yet"),
        Command::Send(args) => send::run(&args).await,
        Command::Replay(_) => anyhow::bail!("replay: not built yet"),
        Command::Inspect(_) => anyhow::bail!("inspect: not built yet"),
        Command::Rebuild(_) => anyhow::bail!("rebuild: not built yet"),
        Command::Resync(_) => anyhow::bail!("resync: not built yet"),
        Command::Dlq(_) => {
            let _ = config;
            anyhow::bail!("dlq: not built yet")
        }
    }
}
