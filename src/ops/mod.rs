//! Operator tools: send, replay, inspect, rebuild, resync, dead letters — and the
//! dispatcher from a parsed subcommand to the code that runs it.

pub mod send;

use crate::cli::Command;
use crate::config::Config;

/// Runs one subcommand to completion.
pub async fn run_command(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::Serve => crate::ingest::serve(config, crate::shutdown::on_signals()).await,
        Command::Work(args) => crate::worker::work(config, args.consumer).await,
        Command::Run(args) => crate::worker::run_all(config, args.consumer).await,
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
