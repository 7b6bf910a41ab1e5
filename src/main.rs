//! The `shepherd` binary: parse the command line, set up logging, run the subcommand,
//! and exit with status 1 (after printing the error chain) when it fails.
#![forbid(unsafe_code)]

use clap::Parser;
use shepherd::cli::Cli;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // `doctor` reports an invalid configuration as one of its checks.
    if let shepherd::cli::Command::Doctor(args) = &cli.command {
        return shepherd::app::doctor::main(&cli.settings, args);
    }
    let config = match cli.settings.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("shepherd: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    shepherd::telemetry::init_logging(config.log_format, &config.log);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shepherd: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(shepherd::app::run(cli.command, config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shepherd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
