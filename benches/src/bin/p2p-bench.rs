//! `p2p-bench`: the p2p command-line tool.
//!
//! Today it has one subcommand, `list`, which shows the GPUs and CUDA libraries it finds and
//! says so plainly where there are none. The transport and collective benchmarks come with
//! their crates.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use p2p_benches::{gpu_table, libraries, GpuInfo};
use p2p_mem::Device;

#[derive(Parser)]
#[command(
    name = "p2p-bench",
    version,
    about = "GPU peer-to-peer benchmarks and diagnostics"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the GPUs and CUDA libraries found on this machine.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("P2P_LOG"))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::List { json } => list(json),
    }
}

fn list(json: bool) -> ExitCode {
    let libs = libraries();
    let gpus = Device::all().map(|ds| ds.iter().map(GpuInfo::of).collect::<Vec<_>>());
    if json {
        let doc = serde_json::json!({
            "libraries": libs.iter().map(|(l, r)| (l.name().to_string(), match r {
                Ok(f) => serde_json::json!({"found": f}),
                Err(e) => serde_json::json!({"error": e}),
            })).collect::<serde_json::Map<_, _>>(),
            "gpus": match &gpus { Ok(g) => g.iter().map(GpuInfo::to_json).collect(), Err(_) => vec![] },
            "error": gpus.as_ref().err().map(|e| e.to_string()),
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    println!("libraries:");
    for (lib, r) in &libs {
        match r {
            Ok(file) => println!("  {:<13} {file}", lib.name()),
            Err(_) => println!("  {:<13} not found", lib.name()),
        }
    }
    match gpus {
        Ok(g) if g.is_empty() => {
            println!("\nno GPU found: the CUDA driver loaded but reports no device")
        }
        Ok(g) => {
            println!("\n{} GPU(s):", g.len());
            print!("{}", gpu_table(&g));
            print_peer_matrix();
        }
        Err(e) => println!("\nno GPU found: {e}"),
    }
    println!("\nThe transport and collective benchmarks are not built yet; `list` is all this version does.");
    ExitCode::SUCCESS
}

/// Which pairs can access each other (`cuDeviceCanAccessPeer`) and their P2P performance rank.
fn print_peer_matrix() {
    let Ok(devs) = Device::all() else { return };
    if devs.len() < 2 {
        return;
    }
    println!("\npeer access (rank; '-' = none):");
    print!("     ");
    for d in &devs {
        print!("GPU{:<3}", d.ordinal());
    }
    println!();
    for a in &devs {
        print!("GPU{:<2}", a.ordinal());
        for b in &devs {
            let cell = if a == b {
                "X".to_string()
            } else {
                match (a.can_access_peer(b), a.p2p_attributes(b)) {
                    (Ok(true), Ok(attr)) => format!("r{}", attr.performance_rank),
                    (Ok(false), _) => "-".into(),
                    (Err(e), _) | (_, Err(e)) => format!("err: {e}"),
                }
            };
            print!("{cell:<6}");
        }
        println!();
    }
}
