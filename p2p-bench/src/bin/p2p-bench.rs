//! `p2p-bench`: the p2p command-line tool.
//!
//! - `list`: the GPUs and CUDA libraries found, and which pairs have peer access.
//! - `topo`: the `nvidia-smi topo -m` style matrix, P2P matrices, links and the path model.
//! - `doctor`: whether P2P works between each pair, why not, and what to do.
//! - `p2p`: bandwidth and latency between every pair.
//! - `coll`: every collective from 8 B to 1 GiB beside NCCL in each of its modes (nccl-tests
//!   columns, the fastest NCCL mode per size), with a plot.
//! - `launch -n N [--hosts H] -- CMD`: runs CMD as N ranks with the torchrun environment.
//! - `hosts`: (as the ranks of a job over hosts) MultiHostCommunicator beside NCCL.
//! - `faults -n N`: the fault-injection suite (ranks killed, stalled, aborted; strangers).
//!
//! Every crate's `P2P_*` settings are validated first: a bad value exits with status 2 and a
//! message naming the variable. `P2P_DEBUG` and `P2P_DEBUG_SUBSYS` set the log output (stderr,
//! coloured only on a terminal without `NO_COLOR`). The exit statuses, the same in every
//! command, are [`p2p_bench::exit::HELP`]; standard output goes through
//! [`p2p_bench::out`](mod@p2p_bench::out), so a reader that closes the pipe ends no
//! command with a panic.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use p2p_bench::doctor::{self, Status};
use p2p_bench::exit::{self, no_gpu, require_gpus};
use p2p_bench::{gpu_table, libraries, out, outln, GpuInfo};
use p2p_collective::plan::Tuning;
use p2p_collective::Op;
use p2p_mem::Device;
use p2p_transport::topo::{self, P2pMatrix, Topology};

#[derive(Parser)]
#[command(
    name = "p2p-bench",
    version,
    about = "GPU peer-to-peer benchmarks and diagnostics",
    after_help = exit::HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// What p2p does for each collective and size on this machine, and why: the algorithm,
    /// protocol, what moves the bytes (SMs or copy engines), blocks, chunks and barrier steps,
    /// as the planner chooses them with this environment's P2P_* settings. With no GPU (or
    /// --machine), a reference machine built in: 4 x H200 behind an NVSwitch by default,
    /// where the figures p2p and NCCL measured stand beside each plan.
    Plan {
        /// A reference machine instead of this one: h200x4-nvswitch, h200x2-nv18,
        /// dgx-h100-8gpu-nvswitch, ring-4gpu-nvlink, a100-pcie-4gpu-2socket,
        /// consumer-2gpu-no-p2p, single-h100.
        #[arg(long, conflicts_with = "load")]
        machine: Option<String>,
        /// A topology saved with `p2p-bench topo --json` instead of this machine's.
        #[arg(long, value_name = "FILE")]
        load: Option<PathBuf>,
        /// Ranks, one per GPU from the first (default: every GPU).
        #[arg(long)]
        gpus: Option<usize>,
        #[command(flatten)]
        calls: Calls,
        /// Each size is this many times the one before.
        #[arg(long, default_value_t = 8)]
        factor: usize,
        /// Every rank's buffers registered (Communicator::register).
        #[arg(long)]
        registered: bool,
        /// In place.
        #[arg(long)]
        in_place: bool,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        tuning: Box<TuningArgs>,
    },
    /// List the GPUs and CUDA libraries found on this machine.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show how the GPUs are joined: connection matrix, P2P matrices, links, path model.
    Topo {
        /// Print the topology as JSON (loadable with --load).
        #[arg(long)]
        json: bool,
        /// Show a topology saved with --json instead of this machine's.
        #[arg(long, value_name = "FILE")]
        load: Option<PathBuf>,
    },
    /// Bandwidth and latency between every GPU pair (like p2pBandwidthLatencyTest), with plain
    /// cudaMemcpyPeerAsync in the same run; writes JSON and Markdown.
    P2p {
        /// Directory for the results (created if missing). Default: p2p/results in the user's
        /// data folder, outside any source tree.
        #[arg(long, default_value_os_t = default_results())]
        out: PathBuf,
        /// Size of the matrix measurements, MiB.
        #[arg(long, default_value_t = 256)]
        matrix_mib: usize,
        /// Largest size of the 4 B.. sweep, MiB.
        #[arg(long, default_value_t = 1024)]
        max_mib: usize,
        /// Timed samples per figure (the median is reported).
        #[arg(long, default_value_t = 20)]
        samples: usize,
    },
    /// Every collective from 8 B to 1 GiB, ours beside NCCL's in the same run (nccl-tests
    /// columns, eager and CUDA graph); writes JSON, Markdown and an SVG plot.
    Coll {
        /// Directory for the results (created if missing). Default: p2p/results in the user's
        /// data folder, outside any source tree.
        #[arg(long, default_value_os_t = default_results())]
        out: PathBuf,
        #[command(flatten)]
        calls: Calls,
        /// Timed samples per figure (the median is reported).
        #[arg(long, default_value_t = 20)]
        samples: usize,
        /// Largest size also timed under CUDA graph, MiB.
        #[arg(long, default_value_t = 64)]
        graph_max_mib: usize,
        /// How many GPUs (default: all).
        #[arg(long, default_value_t = 0)]
        gpus: usize,
        /// Instead put this many ranks on GPU 0 (a machine with one GPU: the kernels' own costs,
        /// not the links'; NCCL cannot run there and is skipped).
        #[arg(long, default_value_t = 0)]
        share_gpu: usize,
        /// Skip NCCL.
        #[arg(long)]
        no_nccl: bool,
        /// Skip ours on registered buffers (the direct kernels).
        #[arg(long)]
        no_registered: bool,
        /// NCCL's modes to run beside ours (comma list of plain, symmetric, copy_engine;
        /// default all): the tables compare against the fastest at each size.
        #[arg(long, value_delimiter = ',')]
        nccl_modes: Vec<String>,
        /// Each size is this many times the one before (as nccl-tests' -f).
        #[arg(long, default_value_t = 2)]
        factor: usize,
        /// Element types for all-reduce (comma list: float, bfloat16, half, double, int32,
        /// int64, uint8; default float and bfloat16); the other collectives run float.
        #[arg(long, value_delimiter = ',')]
        types: Vec<String>,
        /// Skip the correctness check before each figure (tuning sweeps only).
        #[arg(long)]
        no_check: bool,
        /// The longest one step may take, seconds (one implementation at one size and
        /// placement: its check, eager and graph timing). A step past it, or one NCCL reports
        /// an error for, is aborted and reported at once; that implementation is skipped from
        /// there on.
        #[arg(long, default_value_t = 60)]
        deadline_s: u64,
        /// Also time every graph without the timing gate (the host's cost of launching the
        /// graphs then counts: `graph_ungated` in the JSON), to show what the gate takes out.
        #[arg(long)]
        graph_ungated: bool,
        /// Run NCCL's all-to-all on the same buffers as its other collectives: reproduces
        /// NVIDIA/nccl issue 1859 (NCCL before 2.29.2: a ring collective after sends and
        /// receives on one registered buffer waits forever). By default they are kept apart.
        #[arg(long)]
        nccl_shared_p2p_buffers: bool,
        #[command(flatten)]
        tuning: Box<TuningArgs>,
    },
    /// Render a `coll` results file again (the Markdown table and the SVG plot beside it), for
    /// results assembled from several runs.
    Render {
        /// The results JSON written by `p2p-bench coll`.
        json: PathBuf,
        /// Print p2p's figures on stdout in nccl-tests' text columns instead (for scripts that
        /// parse nccl-tests' output); nothing is written.
        #[arg(long)]
        nccl_tests: bool,
        /// With --nccl-tests: the graph replay's figures (nccl-tests' -G) instead of eager.
        #[arg(long, requires = "nccl_tests")]
        graph: bool,
    },
    /// The fault-injection suite: jobs of N ranks in which one rank is killed, crashes, exits,
    /// stalls or aborts at a random point, or strangers try to join, until --faults of each
    /// were injected; writes faults-DATE-NxGPU.{json,md} with detection times, hangs, wrong
    /// results, foreign joins, and the GPU memory and fds measured before and after the jobs.
    /// Needs N GPUs (ranks share GPUs round robin when there are fewer).
    Faults {
        /// Ranks per job.
        #[arg(short = 'n', long, default_value_t = 2)]
        ranks: usize,
        /// Stop once this many process faults (ranks killed, crashing, exiting, stalled or
        /// aborted) and this many stranger attempts were injected.
        #[arg(long, default_value_t = 200)]
        faults: u64,
        /// ... and at least this many trials with a stranger at the job's door.
        #[arg(long, default_value_t = 50)]
        stranger_trials: usize,
        /// At most this many trials (every fault kind in turn).
        #[arg(long, default_value_t = 2000)]
        trials: usize,
        /// Stop starting trials after this many seconds.
        #[arg(long, default_value_t = 480)]
        seconds: u64,
        /// The collectives' time limit in the jobs (P2P_TIMEOUT_MS): what finds a stalled rank.
        #[arg(long, default_value_t = 2000)]
        timeout_ms: u64,
        /// Every trial makes the same call, a 4 MiB f32 sum all-reduce, instead of one drawn by
        /// the fault matrix (operation, type, size, forced algorithm, in place or not, graph
        /// replay, registered buffers, a split communicator).
        #[arg(long)]
        classic: bool,
        /// The largest size the matrix draws, MiB (log-uniform from 8 B; a rank's part for
        /// all-gather, reduce-scatter and all-to-all).
        #[arg(long, default_value_t = 256)]
        max_mib: u64,
        /// Directory for the results (created if missing). Default: p2p/results in the user's
        /// data folder, outside any source tree.
        #[arg(long, default_value_os_t = default_results())]
        out: PathBuf,
    },
    /// Host time to issue one call, split: binding the context, an empty kernel launched as
    /// ours, the same with our argument block, our all-reduce (8 B, 8 KiB, in place); prints a
    /// Markdown table.
    Host {
        /// How many GPUs, one rank each (0: all).
        #[arg(long, default_value_t = 0)]
        gpus: usize,
        /// Instead put this many ranks on GPU 0 (for a machine with one GPU).
        #[arg(long, default_value_t = 0)]
        share_gpu: usize,
        /// Timed batches per variant (median, min and max reported).
        #[arg(long, default_value_t = 30)]
        samples: usize,
        /// Calls per rank in one batch.
        #[arg(long, default_value_t = 200)]
        calls: usize,
        /// Also write the JSON here.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
    /// Send/recv between the GPUs of this process: ours (a group of sends and receives per
    /// rank) beside NCCL's grouped ncclSend/ncclRecv, eager and under CUDA graph, each size
    /// checked first; writes JSON and Markdown.
    Sendrecv {
        /// Who exchanges with whom: `ring` (rank r sends to r + 1, receives from r - 1) or
        /// `all-to-all` (every rank sends a message to every rank, itself included).
        #[arg(long, default_value = "ring")]
        pattern: String,
        /// Directory for the results (created if missing). Default: p2p/results in the user's
        /// data folder, outside any source tree.
        #[arg(long, default_value_os_t = default_results())]
        out: PathBuf,
        /// Smallest message, bytes.
        #[arg(long, default_value_t = 8)]
        min_bytes: usize,
        /// Largest message, MiB.
        #[arg(long, default_value_t = 256)]
        max_mib: usize,
        /// Each size is this many times the one before.
        #[arg(long, default_value_t = 4)]
        factor: usize,
        /// Timed samples per figure (the median is reported).
        #[arg(long, default_value_t = 10)]
        samples: usize,
        /// How many GPUs (default: all).
        #[arg(long, default_value_t = 0)]
        gpus: usize,
        /// Skip NCCL.
        #[arg(long)]
        no_nccl: bool,
    },
    /// A job over several hosts (MultiHostCommunicator) beside NCCL's own communicator over the
    /// same ranks and host ids, every collective, f32 sum, each call checked once. Run it as the
    /// ranks of a job: `p2p-bench launch -n 4 --hosts 2 -- p2p-bench hosts` (one machine posing
    /// as two hosts), or under torchrun --nnodes H; rank 0 prints and writes the table.
    Hosts {
        /// Directory for the results (created if missing). Default: p2p/results in the user's
        /// data folder, outside any source tree.
        #[arg(long, default_value_os_t = default_results())]
        out: PathBuf,
        /// The collectives (comma-separated).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "all_reduce,all_gather,reduce_scatter,broadcast,reduce,all_to_all"
        )]
        ops: Vec<String>,
        /// Smallest size, bytes.
        #[arg(long, default_value_t = 8192)]
        min_bytes: usize,
        /// Largest size, MiB.
        #[arg(long, default_value_t = 256)]
        max_mib: usize,
        /// Each size is this many times the one before.
        #[arg(long, default_value_t = 4)]
        factor: usize,
        /// Timed runs per figure (the median is reported).
        #[arg(long, default_value_t = 5)]
        samples: usize,
    },
    /// One rank of a fault-injection job (started by `faults`, configured by FAULT_* variables).
    #[command(hide = true)]
    FaultWorker,
    /// What GPU memory a process still holds after dropping its communicators: makes and drops
    /// one CYCLES times and prints the memory held after each (`HELD` lines). Process per GPU
    /// under `p2p-bench launch -n N --`, or one process for every GPU with --local.
    HeldMemory {
        /// Communicators made and dropped.
        #[arg(long, default_value_t = 20)]
        cycles: usize,
        /// One process drives every GPU (no launcher).
        #[arg(long)]
        local: bool,
        /// Each part of a communicator alone (modules, abort flag, streams and events, local
        /// communicators without a call), in one process.
        #[arg(long)]
        parts: bool,
    },
    /// Run a command as N local ranks with RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE set
    /// (as torchrun does) and a fresh job id and secret (P2P_JOB_ID, P2P_JOB_SECRET); a rank
    /// whose process ends is reported to the others at once, and if one fails the others have
    /// 3 s to end before they are stopped.
    Launch {
        /// Number of ranks.
        #[arg(short = 'n', long)]
        nprocs: usize,
        /// Pose as this many hosts of N / HOSTS ranks each (GROUP_RANK, its own GPUs through
        /// CUDA_VISIBLE_DEVICES, P2P_HOST_ID and NCCL_HOSTID per host): to test jobs over hosts
        /// (MultiHostCommunicator) on one machine.
        #[arg(long, default_value_t = 1)]
        hosts: usize,
        /// Stop the job (every rank's process group: SIGTERM, SIGKILL 3 s later) once it has
        /// run this long, e.g. `90s`, `20m`, `2h`; exit status 124.
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        time_limit: Option<std::time::Duration>,
        /// The command and its arguments (after `--`).
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
    /// Compile the collective kernels into the on-disk cache, with no GPU needed (libnvrtc
    /// only): the first communicator then starts without compiling. For a GPU whose kernels
    /// p2p does not ship compiled (sm_80 and sm_90 are), in a container's build step or on a
    /// machine's first run.
    Kernels {
        /// Targets, e.g. `sm_90` (H100, H200) or `sm_80` (A100); repeat for several. Default:
        /// those of this machine's GPUs (with --ship: sm_80 and sm_90).
        #[arg(long, value_name = "ARCH")]
        arch: Vec<String>,
        /// Instead: compile every crate's kernels, uncached, and write the archives that the
        /// crates ship into DIR (what `cargo xtask kernels` runs, with NVRTC 12.4).
        #[arg(long, value_name = "DIR")]
        ship: Option<std::path::PathBuf>,
    },
    /// Check every GPU pair: does P2P work, why not, what to do. Exits 1 if any check fails.
    Doctor {
        /// Print the findings as JSON.
        #[arg(long)]
        json: bool,
        /// Skip the functional test (writing through the peer mapping with a kernel).
        #[arg(long)]
        no_functional: bool,
    },
}

/// What the benchmarks answer where there is no GPU.
const MEASURES: &str = "it measures GPUs; `p2p-bench render FILE` draws a saved `coll` run again";

/// `$XDG_DATA_HOME/p2p/results`, else `$HOME/.local/share/p2p/results`, else
/// `./p2p-results`: where results go unless `--out` names a folder.
fn default_results() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local/share"))
        })
        .map(|d| d.join("p2p").join("results"))
        .unwrap_or_else(|| PathBuf::from("p2p-results"))
}

fn main() -> ExitCode {
    // As the libraries read them: an unknown `P2P_*` variable is a warning, a bad value an error.
    let config = match p2p_bench::settings::check() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("p2p-bench: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(config.tracing_filter()))
        .with_writer(std::io::stderr)
        .with_ansi(p2p_bench::out::colour_stderr())
        .init();
    match Cli::parse().command {
        Command::Plan {
            machine,
            load,
            gpus,
            calls:
                Calls {
                    ops,
                    min_bytes,
                    max_mib,
                },
            factor,
            registered,
            in_place,
            json,
            tuning,
        } => {
            let ops = match parse_ops("plan", &ops) {
                Ok(ops) => ops,
                Err(code) => return code,
            };
            let machine = match plan_machine(machine.as_deref(), load) {
                Ok(m) => m,
                Err(code) => return code,
            };
            let sms = machine.sm_count(gpus.unwrap_or(usize::MAX));
            let settings = match p2p_collective::Settings::from_env() {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("p2p-bench plan: {e}");
                    return ExitCode::from(exit::USAGE);
                }
            };
            let defaults = p2p_bench::plan::Options::new(machine);
            let opts = p2p_bench::plan::Options {
                gpus,
                ops: if ops.is_empty() {
                    defaults.ops.clone()
                } else {
                    ops
                },
                min_bytes,
                max_bytes: max_mib.saturating_mul(1 << 20),
                factor,
                registered,
                in_place,
                tuning: tuning_from(&tuning, || sms),
                forced: settings.forced,
                check: settings.check,
                transport: config.clone(),
                ..defaults
            };
            plan_cmd(&opts, json)
        }
        Command::List { json } => list(json),
        Command::Topo { json, load } => topo_cmd(json, load),
        Command::Doctor {
            json,
            no_functional,
        } => doctor_cmd(json, !no_functional),
        Command::P2p {
            out,
            matrix_mib,
            max_mib,
            samples,
        } => match require_gpus("p2p", MEASURES) {
            Ok(_) => p2p_cmd(out, matrix_mib, max_mib, samples),
            Err(code) => code,
        },
        Command::Kernels {
            arch,
            ship: Some(dir),
        } => {
            let archs = if arch.is_empty() {
                p2p_mem::kernel::shipped::ARCHS.map(String::from).to_vec()
            } else {
                arch
            };
            finished(
                "p2p-bench kernels --ship",
                p2p_bench::ship::ship(&dir, &archs),
            )
        }
        Command::Kernels { arch, ship: None } => kernels_cmd(arch),
        Command::Host {
            gpus,
            share_gpu,
            samples,
            calls,
            json,
        } => {
            if let Err(code) = require_gpus("host", MEASURES) {
                return code;
            }
            let opts = p2p_bench::host::Options {
                gpus,
                share_gpu,
                samples,
                calls,
            };
            let v = match p2p_bench::host::run(&opts) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("p2p-bench host: {e}");
                    return ExitCode::from(exit::FAILED);
                }
            };
            out!("{}", p2p_bench::host::markdown(&v));
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&v).unwrap_or_default();
                if let Err(e) = std::fs::write(&path, text) {
                    eprintln!("p2p-bench host: writing {}: {e}", path.display());
                    return ExitCode::from(exit::FAILED);
                }
            }
            ExitCode::SUCCESS
        }
        Command::Sendrecv {
            pattern,
            out,
            min_bytes,
            max_mib,
            factor,
            samples,
            gpus,
            no_nccl,
        } => {
            let pattern = match p2p_bench::sendrecv::Pattern::parse(&pattern) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("p2p-bench sendrecv: {e}");
                    return ExitCode::from(exit::USAGE);
                }
            };
            if let Err(code) = require_gpus("sendrecv", MEASURES) {
                return code;
            }
            let opts = p2p_bench::sendrecv::Options {
                pattern,
                min_bytes,
                max_bytes: max_mib << 20,
                factor,
                samples: samples.max(1),
                gpus,
                nccl: !no_nccl,
                out,
            };
            finished("p2p-bench sendrecv", p2p_bench::sendrecv::run(&opts))
        }
        Command::Coll {
            out,
            calls:
                Calls {
                    ops,
                    min_bytes,
                    max_mib,
                },
            samples,
            graph_max_mib,
            gpus,
            share_gpu,
            no_nccl,
            no_registered,
            nccl_modes,
            factor,
            types,
            no_check,
            deadline_s,
            graph_ungated,
            nccl_shared_p2p_buffers,
            tuning,
        } => {
            let chosen = match parse_ops("coll", &ops) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let mut modes = Vec::new();
            for name in &nccl_modes {
                match p2p_bench::nccl::NcclMode::ALL
                    .into_iter()
                    .find(|m| m.name() == name.trim())
                {
                    Some(m) => modes.push(m),
                    None => {
                        eprintln!(
                            "p2p-bench coll: unknown NCCL mode {name:?}; choose from plain, symmetric, copy_engine"
                        );
                        return ExitCode::from(exit::USAGE);
                    }
                }
            }
            let mut all_reduce_types = Vec::new();
            for name in &types {
                match p2p_collective::DataType::ALL
                    .into_iter()
                    .find(|d| d.name() == name.trim())
                {
                    Some(d) => all_reduce_types.push(d),
                    None => {
                        eprintln!(
                            "p2p-bench coll: unknown type {name:?}; choose from {}",
                            p2p_collective::DataType::ALL.map(|d| d.name()).join(", ")
                        );
                        return ExitCode::from(exit::USAGE);
                    }
                }
            }
            if let Err(code) = require_gpus("coll", MEASURES) {
                return code;
            }
            let defaults = p2p_bench::coll::Options::default();
            let opts = p2p_bench::coll::Options {
                ops: if chosen.is_empty() {
                    defaults.ops.clone()
                } else {
                    chosen
                },
                min_bytes,
                max_bytes: max_mib << 20,
                samples: samples.max(1),
                graph_max_bytes: graph_max_mib << 20,
                gpus,
                share_gpu,
                nccl: !no_nccl && share_gpu == 0,
                registered: !no_registered,
                nccl_modes: if modes.is_empty() {
                    defaults.nccl_modes.clone()
                } else {
                    modes
                },
                check: !no_check,
                factor,
                all_reduce_types: if all_reduce_types.is_empty() {
                    defaults.all_reduce_types.clone()
                } else {
                    all_reduce_types
                },
                tuning: tuning_from(&tuning, || {
                    Device::new(0).map(|d| d.sm_count()).unwrap_or(132)
                }),
                deadline: std::time::Duration::from_secs(deadline_s.max(1)),
                partial: Some(out.join("coll-partial.json")),
                graph_ungated,
                nccl_shared_p2p_buffers,
                ..defaults
            };
            if let Err(e) = std::fs::create_dir_all(&out) {
                eprintln!("p2p-bench coll: creating {}: {e}", out.display());
                return ExitCode::from(exit::FAILED);
            }
            coll_cmd(out, &opts)
        }
        Command::Launch {
            nprocs,
            hosts,
            time_limit,
            command,
        } => launch_cmd(nprocs, hosts, time_limit, &command),
        Command::Render {
            json,
            nccl_tests,
            graph,
        } => {
            use p2p_bench::render::{nccl_tests::Timing, nccl_tests_file};
            if !nccl_tests {
                return render_cmd(&json);
            }
            let timing = if graph { Timing::Graph } else { Timing::Eager };
            finished(
                "p2p-bench render",
                nccl_tests_file(&json, timing).map(|text| outln!("{text}")),
            )
        }
        Command::Hosts {
            out,
            ops,
            min_bytes,
            max_mib,
            factor,
            samples,
        } => {
            let chosen = match parse_ops("hosts", &ops) {
                Ok(c) => c,
                Err(code) => return code,
            };
            let opts = p2p_bench::hosts::Options {
                ops: chosen,
                min_bytes,
                max_bytes: max_mib << 20,
                factor,
                samples,
                out,
            };
            finished("p2p-bench hosts", p2p_bench::hosts::run(&opts))
        }
        Command::FaultWorker => ExitCode::from(p2p_bench::faults::worker() as u8),
        Command::HeldMemory {
            cycles,
            local,
            parts,
        } => finished(
            "p2p-bench held-memory",
            p2p_bench::held::run(cycles, local, parts),
        ),
        Command::Faults {
            ranks,
            faults,
            stranger_trials,
            trials,
            seconds,
            timeout_ms,
            classic,
            max_mib,
            out,
        } => faults_cmd(
            &p2p_bench::faults::SuiteOptions {
                world: ranks,
                faults,
                stranger_trials,
                trials,
                budget: std::time::Duration::from_secs(seconds),
                timeout_ms,
                matrix: (!classic).then_some(max_mib.clamp(1, 256) << 20),
            },
            &out,
        ),
    }
}

/// The calls `plan` and `coll` cover: which collectives, and their sizes.
#[derive(clap::Args, Debug)]
struct Calls {
    /// Collectives (comma list of all_reduce, broadcast, reduce, all_gather, reduce_scatter,
    /// all_to_all; default all).
    #[arg(long, value_delimiter = ',')]
    ops: Vec<String>,
    /// Smallest size, bytes (a rank's part for all-gather, reduce-scatter and all-to-all).
    #[arg(long, default_value_t = 8)]
    min_bytes: usize,
    /// Largest size, MiB.
    #[arg(long, default_value_t = 1024)]
    max_mib: usize,
}

/// `p2p-bench coll`'s planner knobs (tuning sweeps); none given: the device's defaults.
#[derive(clap::Args, Debug, Default)]
struct TuningArgs {
    /// Planner: most bytes a block moves per chunk, KiB (default 64).
    #[arg(long)]
    piece_kib: Option<usize>,
    /// Planner: most blocks per call (default: two per SM, at most 256).
    #[arg(long)]
    blocks: Option<u32>,
    /// Planner: bytes per block that small calls aim for, KiB (default 16); smaller spreads a
    /// mid-sized call over more blocks.
    #[arg(long)]
    block_kib: Option<usize>,
    /// Planner: calls up to this size per source run LL, KiB (default 512, over n / 2 on
    /// more than 3 ranks; 0 turns LL off; at most 512).
    #[arg(long)]
    ll_kib: Option<usize>,
    /// Planner: broadcasts and reduces from this size split among the non-roots on more
    /// than two ranks, KiB (default 1024).
    #[arg(long)]
    split_kib: Option<usize>,
    /// Planner: on two ranks, all-gathers and all-to-alls on registered buffers of at
    /// least this many MiB (all parts) move the data with the copy engines (default 256;
    /// 0: at every size LL does not take; a large number: never).
    #[arg(long)]
    ce_mib: Option<usize>,
    /// Planner: on more than two ranks, what --ce-mib is on two: all-gathers and all-to-alls
    /// on registered buffers of at least this many MiB (all parts) by the copy engines
    /// (default: never; 0: at every size LL does not take).
    #[arg(long)]
    ce_more_ranks_mib: Option<usize>,
    /// Planner: on two ranks, out-of-place all-reduces into a registered output of at
    /// least this many MiB run by the copy engines (default 256; a large number: never).
    #[arg(long)]
    ce_all_reduce_mib: Option<usize>,
    /// Planner: on two ranks, all-reduces above LL's sizes and up to this many KiB run the
    /// pipelined one-shot (default 0: never; docs/performance.md, "The pipelined one-shot
    /// all-reduce").
    #[arg(long)]
    pipe_max_kib: Option<usize>,
    /// Planner: bytes per sub-piece of the pipelined one-shot, KiB (default 4).
    #[arg(long)]
    pipe_sub_kib: Option<usize>,
    /// Planner: out-of-place all-gathers and all-to-alls through the scratch of at least this
    /// many MiB (all parts) copy the own part with the copy engine beside the kernel (default:
    /// never; 0: at every size LL does not take).
    #[arg(long)]
    ce_own_mib: Option<usize>,
    /// Planner: streams that share each copy of an all-gather or all-to-all by the copy
    /// engines, 1 or 2 (default 1).
    #[arg(long)]
    ce_streams: Option<usize>,
    /// Planner: two-shot all-reduces, split broadcasts and reduces, and one-shot all-gathers,
    /// reduce-scatters and all-to-alls of at least this many KiB per source overlap their
    /// chunks' steps (default: never; 0: at every size).
    #[arg(long)]
    overlap_min_kib: Option<usize>,
    /// Planner: the fewest chunks an overlapped call, and every relayed broadcast
    /// (`P2P_ALGO=relay`), is cut into, 1 to 64 (default 4).
    #[arg(long)]
    overlap_chunks: Option<usize>,
}

/// The knobs `args` gives over the defaults of a GPU with `sms()` SMs; `None` where it gives
/// none (the communicator's own defaults).
fn tuning_from(args: &TuningArgs, sms: impl FnOnce() -> i32) -> Option<Tuning> {
    let TuningArgs {
        piece_kib,
        blocks,
        block_kib,
        ll_kib,
        split_kib,
        ce_mib,
        ce_more_ranks_mib,
        ce_all_reduce_mib,
        pipe_max_kib,
        pipe_sub_kib,
        ce_own_mib,
        ce_streams,
        overlap_min_kib,
        overlap_chunks,
    } = *args;
    if piece_kib.is_none()
        && blocks.is_none()
        && block_kib.is_none()
        && ll_kib.is_none()
        && split_kib.is_none()
        && ce_mib.is_none()
        && ce_more_ranks_mib.is_none()
        && ce_all_reduce_mib.is_none()
        && pipe_max_kib.is_none()
        && pipe_sub_kib.is_none()
        && ce_own_mib.is_none()
        && ce_streams.is_none()
        && overlap_min_kib.is_none()
        && overlap_chunks.is_none()
    {
        return None;
    }
    let mut t = Tuning::for_device(sms(), 2);
    if let Some(p) = piece_kib {
        t.piece_bytes = p.max(1) << 10;
    }
    if let Some(l) = ll_kib {
        t.ll_max_bytes = (l << 10).min(p2p_collective::plan::LL_MAX_BYTES);
    }
    if let Some(b) = block_kib {
        t.block_bytes = b.max(1) << 10;
    }
    if let Some(s) = split_kib {
        t.split_min_bytes = s << 10;
    }
    if let Some(b) = blocks {
        t.max_blocks = b.clamp(1, p2p_collective::plan::MAX_BLOCKS);
    }
    if let Some(c) = ce_mib {
        t.ce_min_bytes = c.saturating_mul(1 << 20);
    }
    if let Some(c) = ce_more_ranks_mib {
        t.ce_min_bytes_more_ranks = c.saturating_mul(1 << 20);
    }
    if let Some(c) = ce_all_reduce_mib {
        t.ce_all_reduce_min_bytes = c.saturating_mul(1 << 20);
    }
    if let Some(m) = pipe_max_kib {
        t.pipe_max_bytes = m.saturating_mul(1 << 10);
    }
    if let Some(k) = pipe_sub_kib {
        t.pipe_sub_bytes = k.max(1) << 10;
    }
    if let Some(m) = ce_own_mib {
        t.ce_own_min_bytes = m.saturating_mul(1 << 20);
    }
    if let Some(c) = ce_streams {
        t.ce_streams = c; // init refuses anything but 1 or 2, saying so
    }
    if let Some(k) = overlap_min_kib {
        t.overlap_min_bytes = k.saturating_mul(1 << 10);
    }
    if let Some(c) = overlap_chunks {
        t.overlap_chunks = c; // init refuses anything but 1 to 64, saying so
    }
    Some(t)
}

/// Writes `results` as `OUT/NAME-DATE-NxGPU.json`, the report as `.md` (and the plot as
/// `.svg`); returns the path without extension.
fn write_results(
    out: &std::path::Path,
    name: &str,
    results: &serde_json::Value,
    report: &str,
    svg: Option<&str>,
) -> Result<PathBuf, String> {
    let n = results["gpus"].as_array().map_or(0, Vec::len);
    let gpu = p2p_bench::gpu_slug(results["gpus"][0]["name"].as_str().unwrap_or("gpu"));
    let date: String = results["date"]
        .as_str()
        .unwrap_or("date")
        .chars()
        .take(10)
        .collect();
    let stem = out.join(format!("{name}-{date}-{n}x{gpu}"));
    std::fs::create_dir_all(out)
        .and_then(|_| {
            std::fs::write(
                stem.with_extension("json"),
                serde_json::to_string_pretty(results).unwrap_or_default(),
            )
        })
        .and_then(|_| std::fs::write(stem.with_extension("md"), report))
        .and_then(|_| match svg {
            Some(svg) => std::fs::write(stem.with_extension("svg"), svg),
            None => Ok(()),
        })
        .map_err(|e| format!("writing {}: {e}", stem.display()))?;
    Ok(stem)
}

/// Takes the results of benchmark `name` (`p2p-bench NAME`), prints its report (`render`) and
/// writes them with it (and the plot `svg` draws, if any) into `out` ([`write_results`]), saying
/// where; `None` once an error, of the run or the writing, is printed.
fn report_and_write<E: std::fmt::Display>(
    out: &std::path::Path,
    name: &str,
    results: Result<serde_json::Value, E>,
    render: fn(&serde_json::Value) -> String,
    svg: Option<fn(&serde_json::Value) -> String>,
) -> Option<serde_json::Value> {
    let results = match results {
        Ok(r) => r,
        Err(e) => {
            eprintln!("p2p-bench {name}: {e}");
            return None;
        }
    };
    let report = render(&results);
    outln!("{report}");
    let svg = svg.map(|svg| svg(&results));
    match write_results(out, name, &results, &report, svg.as_deref()) {
        Ok(stem) if svg.is_some() => eprintln!("wrote {}.json, .md and .svg", stem.display()),
        Ok(stem) => eprintln!("wrote {}.json and .md", stem.display()),
        Err(e) => {
            eprintln!("p2p-bench {name}: {e}");
            return None;
        }
    }
    Some(results)
}

/// A subcommand's exit code from its run: success, or the error printed after the command's name
/// and [`exit::FAILED`].
fn finished<T>(command: &str, run: Result<T, impl std::fmt::Display>) -> ExitCode {
    match run {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{command}: {e}");
            ExitCode::from(exit::FAILED)
        }
    }
}

fn coll_cmd(out: PathBuf, opts: &p2p_bench::coll::Options) -> ExitCode {
    use p2p_bench::coll;
    let results = coll::run(opts);
    let Some(results) = report_and_write(&out, "coll", results, coll::render, Some(coll::svg))
    else {
        return ExitCode::from(exit::FAILED);
    };
    let wrong: u64 = results["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| {
            ["out_of_place", "in_place"].map(|p| r["ours"][p]["wrong"].as_u64().unwrap_or(0))
        })
        .sum();
    if wrong > 0 {
        eprintln!("p2p-bench coll: {wrong} wrong elements in our results: see the #wrong columns");
        return ExitCode::from(exit::FAILED);
    }
    if let Some(why) = results["incomplete"].as_str() {
        eprintln!("p2p-bench coll: the run ended early: {why}");
        return ExitCode::from(exit::INCOMPLETE);
    }
    ExitCode::SUCCESS
}

fn render_cmd(json: &std::path::Path) -> ExitCode {
    match p2p_bench::render::render_file(json) {
        Ok(md) => {
            eprintln!("wrote {} and .svg", md.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("p2p-bench render: {e}");
            ExitCode::from(exit::FAILED)
        }
    }
}

fn faults_cmd(options: &p2p_bench::faults::SuiteOptions, out: &std::path::Path) -> ExitCode {
    let ranks = options.world;
    if ranks < 2 {
        eprintln!("p2p-bench faults: a fault needs at least 2 ranks (-n 2)");
        return ExitCode::from(exit::USAGE);
    }
    // Its trials run ranks on GPUs: without one every trial would fail at init, and a report
    // of "0 hangs, 0 wrong" would claim what was never tested.
    if let Err(code) = require_gpus("faults", "fault injection runs ranks on GPUs") {
        return code;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e.to_string_lossy().into_owned(),
        Err(e) => {
            eprintln!("p2p-bench faults: finding this executable: {e}");
            return ExitCode::from(exit::FAILED);
        }
    };
    let (json, md) = p2p_bench::faults::run_suite(&exe, options);
    let date: String = p2p_bench::utc_now().chars().take(10).collect();
    let gpus = p2p_mem::Device::count().unwrap_or(0);
    let stem = out.join(format!("faults-{date}-{ranks}ranks-{gpus}xgpu"));
    let written = std::fs::create_dir_all(out)
        .and_then(|()| {
            std::fs::write(
                stem.with_extension("json"),
                serde_json::to_string_pretty(&json).unwrap_or_default(),
            )
        })
        .and_then(|()| std::fs::write(stem.with_extension("md"), &md));
    out!("{md}");
    match written {
        Ok(()) => {
            eprintln!("wrote {}.{{json,md}}", stem.display());
            let failed = p2p_bench::faults::verdict(&json);
            let short = p2p_bench::faults::short_of_targets(&json);
            if !failed.is_empty() {
                eprintln!("p2p-bench faults: FAILED: {}", failed.join("; "));
                ExitCode::from(exit::FAILED)
            } else if !short.is_empty() {
                eprintln!(
                    "p2p-bench faults: nothing failed, but the run ended before its targets: {} (give it more --seconds)",
                    short.join("; ")
                );
                ExitCode::from(exit::INCOMPLETE)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("p2p-bench faults: writing {}: {e}", stem.display());
            ExitCode::from(exit::FAILED)
        }
    }
}

/// The machine `p2p-bench plan` shows: the reference machine `name`, the topology in `load`,
/// this machine where it has a GPU, else the default reference machine (saying so on stderr).
fn plan_machine(
    name: Option<&str>,
    load: Option<PathBuf>,
) -> Result<p2p_bench::plan::Machine, ExitCode> {
    use p2p_bench::plan::Machine;
    if let Some(name) = name {
        return Machine::reference(name).map_err(|e| {
            eprintln!("p2p-bench plan: {e}");
            ExitCode::from(exit::USAGE)
        });
    }
    if let Some(path) = load {
        return load_topology(&path)
            .map(|t| Machine::from_topology(path.display().to_string(), t))
            .map_err(|e| {
                eprintln!("p2p-bench plan: {}: {e}", path.display());
                ExitCode::from(exit::FAILED)
            });
    }
    let reference = p2p_transport::topo::reference::DEFAULT;
    let why = match p2p_mem::Device::count() {
        Ok(n) if n > 0 => match topo::discover() {
            Ok(t) => return Ok(Machine::from_topology("this machine", t)),
            Err(e) => format!("the topology could not be read: {e}"),
        },
        Ok(_) => exit::NO_DEVICE.to_string(),
        Err(e) => e.to_string(),
    };
    eprintln!("p2p-bench plan: no GPU here ({why}); showing the reference machine {reference} (--machine picks another)");
    Machine::reference(reference).map_err(|e| {
        eprintln!("p2p-bench plan: {e}");
        ExitCode::from(exit::FAILED)
    })
}

/// Plans and prints `opts` (Markdown tables, or JSON).
fn plan_cmd(opts: &p2p_bench::plan::Options, json: bool) -> ExitCode {
    match p2p_bench::plan::run(opts) {
        Ok(report) => {
            if json {
                match serde_json::to_string_pretty(&report) {
                    Ok(text) => outln!("{text}"),
                    Err(e) => {
                        eprintln!("p2p-bench plan: {e}");
                        return ExitCode::from(exit::FAILED);
                    }
                }
            } else {
                out!("{}", p2p_bench::plan::render(&report));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("p2p-bench plan: {e}");
            ExitCode::from(exit::USAGE)
        }
    }
}

/// The collectives named in `names`, or exit status 2 after saying which name `p2p-bench TOOL`
/// does not know.
fn parse_ops(tool: &str, names: &[String]) -> Result<Vec<Op>, ExitCode> {
    names
        .iter()
        .map(|name| {
            Op::ALL
                .into_iter()
                .find(|o| o.name() == name.trim())
                .ok_or_else(|| {
                    eprintln!(
                        "p2p-bench {tool}: unknown collective {name:?}; choose from {}",
                        Op::ALL.map(|o| o.name()).join(", ")
                    );
                    ExitCode::from(exit::USAGE)
                })
        })
        .collect()
}

/// `p2p-bench launch`: SIGINT, SIGTERM and SIGHUP stop every rank (their process groups) and
/// exit 130; past `--time-limit` the same, exit 124; otherwise the first failing rank's status.
fn launch_cmd(
    n: usize,
    hosts: usize,
    time_limit: Option<std::time::Duration>,
    command: &[String],
) -> ExitCode {
    use p2p_collective::launch::{LaunchOptions, Stopped, GRACE};
    let Some((program, args)) = command.split_first() else {
        eprintln!("p2p-bench launch: no command given (p2p-bench launch -n 2 -- CMD ARGS)");
        return ExitCode::from(exit::USAGE);
    };
    if n == 0 {
        eprintln!("p2p-bench launch: -n must be at least 1");
        return ExitCode::from(exit::USAGE);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        if let Err(e) = signal_hook::flag::register(signal, stop.clone()) {
            eprintln!("p2p-bench launch: cannot watch signal {signal}: {e}");
            return ExitCode::from(exit::FAILED);
        }
    }
    let opts = LaunchOptions {
        hosts,
        time_limit,
        stop: Some(stop),
    };
    match p2p_collective::launch::launch_with(n, program, args, &opts) {
        Ok(out) if out.status.success() && out.stopped.is_none() => ExitCode::SUCCESS,
        Ok(out) => {
            let k = out.killed;
            match out.stopped {
                Some(Stopped::Asked) => {
                    eprintln!("p2p-bench launch: stopped by a signal: {k} rank(s) stopped");
                    return ExitCode::from(exit::SIGNALLED);
                }
                Some(Stopped::TimeLimit(limit)) => {
                    eprintln!(
                        "p2p-bench launch: the job ran past its time limit ({}): {k} rank(s) stopped",
                        humantime::format_duration(limit)
                    );
                    return ExitCode::from(exit::TIME_LIMIT);
                }
                None => {}
            }
            let rank = out
                .failed_rank
                .map_or("a rank".to_string(), |r| format!("rank {r}"));
            let killed = match k {
                0 => String::new(),
                k => format!("; {k} other rank(s) still ran {GRACE:?} later and were killed"),
            };
            eprintln!("p2p-bench launch: {rank} failed ({}){killed}", out.status);
            ExitCode::from(out.status.code().map_or(1, |c| c.clamp(1, 255) as u8))
        }
        Err(e) => {
            eprintln!("p2p-bench launch: {e}");
            ExitCode::from(exit::FAILED)
        }
    }
}

/// `p2p-bench kernels`: compiles the collective kernels for each target into the cache.
fn kernels_cmd(mut archs: Vec<String>) -> ExitCode {
    use p2p_collective::comm::COLL_PARTS;
    use p2p_mem::kernel::cache_dir;
    if archs.is_empty() {
        let gpus = Device::all();
        if let Some(reason) = exit::no_gpu_reason(&gpus) {
            let then = "name the targets, e.g. --arch sm_90 (H100, H200) --arch sm_80 (A100)";
            return no_gpu("kernels", &reason, then);
        }
        archs = gpus.map_or_else(|_| Vec::new(), |g| p2p_bench::gpu_archs(&g));
    }
    let Some(dir) = cache_dir() else {
        eprintln!("p2p-bench kernels: no cache folder: set XDG_CACHE_HOME or HOME");
        return ExitCode::from(exit::FAILED);
    };
    for arch in &archs {
        let t = std::time::Instant::now();
        let compiled = match p2p_collective::Communicator::precompile(arch) {
            Ok(n) => n,
            Err(e) => {
                eprintln!("p2p-bench kernels: {arch}: {e}");
                return ExitCode::from(exit::FAILED);
            }
        };
        let parts = COLL_PARTS.len();
        if compiled == 0 {
            outln!("{arch}: the {parts} parts of the collective kernels were cached already");
        } else {
            outln!(
                "{arch}: compiled {compiled} of the {parts} parts of the collective kernels in {:.1} s",
                t.elapsed().as_secs_f64()
            );
        }
    }
    outln!("cache: {}", dir.display());
    if let Ok(nvrtc) = p2p_mem::kernel::compiler() {
        outln!("compiler: {nvrtc}");
    }
    ExitCode::SUCCESS
}

/// `p2p-bench list`: the CUDA libraries found and the GPUs; with no GPU, the libraries still,
/// then the [`no_gpu`] answer.
fn list(json: bool) -> ExitCode {
    let libs = libraries();
    let gpus = Device::all().map(|ds| ds.iter().map(GpuInfo::of).collect::<Vec<_>>());
    let missing = exit::no_gpu_reason(&gpus);
    let gpus = gpus.unwrap_or_default();
    if json {
        let doc = serde_json::json!({
            "libraries": libs.iter().map(|(l, r)| (l.name().to_string(), match r {
                Ok(f) => serde_json::json!({"found": f}),
                Err(e) => serde_json::json!({"error": e}),
            })).collect::<serde_json::Map<_, _>>(),
            "gpus": gpus.iter().map(GpuInfo::to_json).collect::<Vec<_>>(),
            "error": missing,
        });
        outln!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        outln!("libraries:");
        let rows = libs.iter().map(|(lib, r)| {
            let file = r.clone().unwrap_or_else(|_| "not found".into());
            vec![format!("  {}", lib.name()), file]
        });
        out!("{}", p2p_transport::text_columns(rows.collect(), &[]));
        if missing.is_none() {
            outln!("\n{} GPU(s):", gpus.len());
            out!("{}", gpu_table(&gpus));
            print_peer_matrix();
            outln!(
                "\nNext: `p2p-bench doctor` (does P2P work, and why not), `p2p-bench p2p` (bandwidth and latency), `p2p-bench coll` (collectives beside NCCL), `p2p-bench faults -n 2` (fault injection)."
            );
        }
    }
    match missing {
        Some(reason) => no_gpu(
            "list",
            &reason,
            "the CUDA libraries that load are listed above; `p2p-bench topo --load FILE` shows a saved topology",
        ),
        None => ExitCode::SUCCESS,
    }
}

/// Which pairs can access each other (`cuDeviceCanAccessPeer`) and their P2P performance rank.
fn print_peer_matrix() {
    let Ok(devs) = Device::all() else { return };
    if devs.len() < 2 {
        return;
    }
    outln!("\npeer access (rank; '-' = none):");
    let head =
        std::iter::once(String::new()).chain(devs.iter().map(|d| format!("GPU{}", d.ordinal())));
    let mut rows = vec![head.collect::<Vec<_>>()];
    for a in &devs {
        let mut row = vec![format!("GPU{}", a.ordinal())];
        for b in &devs {
            row.push(if a == b {
                "X".to_string()
            } else {
                match (a.can_access_peer(b), a.p2p_attributes(b)) {
                    (Ok(true), Ok(attr)) => format!("r{}", attr.performance_rank),
                    (Ok(false), _) => "-".into(),
                    (Err(e), _) | (_, Err(e)) => format!("err: {e}"),
                }
            });
        }
        rows.push(row);
    }
    out!("{}", p2p_transport::text_columns(rows, &[]));
}

/// The topology saved in `path` (`topo --json`), or why it could not be read.
fn load_topology(path: &std::path::Path) -> Result<Topology, String> {
    std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|s| Topology::from_json(&s).map_err(|e| e.to_string()))
}

fn topo_cmd(json: bool, load: Option<PathBuf>) -> ExitCode {
    let t = match load {
        Some(path) => match load_topology(&path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("p2p-bench topo: {}: {e}", path.display());
                return ExitCode::from(exit::FAILED);
            }
        },
        None => {
            match require_gpus("topo", "show a saved topology with --load FILE").and_then(|_| {
                topo::discover().map_err(|e| {
                    eprintln!("p2p-bench topo: no topology to show: {e}");
                    ExitCode::from(exit::FAILED)
                })
            }) {
                Ok(t) => t,
                Err(code) => return code,
            }
        }
    };
    if json {
        outln!("{}", t.to_json());
        return ExitCode::SUCCESS;
    }
    outln!("{}\n", t.source);
    outln!("{}", topo::render_matrix(&t));
    if t.gpus.len() > 1 {
        for m in [
            P2pMatrix::Read,
            P2pMatrix::Write,
            P2pMatrix::NvLink,
            P2pMatrix::Atomics,
            P2pMatrix::Cuda,
        ] {
            outln!("{}", topo::render_p2p_matrix(&t, m));
        }
        outln!("Legend: OK = supported; NS = not supported; CNS = chipset not supported; GNS = GPU not\n\
                  supported; TNS = topology not supported; DR = disabled by regkey; - = unknown.\n");
    }
    outln!("{}", topo::render_links(&t));
    if t.gpus.len() > 1 {
        outln!("{}", topo::render_paths(&t));
    } else {
        outln!("One GPU: no paths between GPUs.");
    }
    ExitCode::SUCCESS
}

fn p2p_cmd(out: PathBuf, matrix_mib: usize, max_mib: usize, samples: usize) -> ExitCode {
    let opts = p2p_bench::p2p::Options {
        matrix_bytes: matrix_mib << 20,
        max_bytes: max_mib << 20,
        samples: samples.max(1),
    };
    let results = p2p_bench::p2p::run(&opts);
    match report_and_write(&out, "p2p", results, p2p_bench::p2p::render, None) {
        Some(_) => ExitCode::SUCCESS,
        None => ExitCode::from(exit::FAILED),
    }
}

fn doctor_cmd(json: bool, functional: bool) -> ExitCode {
    let report = doctor::run(functional);
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        out!("{}", report.render());
    }
    if report.worst() == Status::Fail {
        ExitCode::from(exit::FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every help text of the tool: the commands' and their arguments'.
    fn help_texts(cmd: &clap::Command) -> Vec<String> {
        let mut texts: Vec<String> = [cmd.get_about(), cmd.get_long_about(), cmd.get_after_help()]
            .into_iter()
            .flatten()
            .map(|t| t.to_string())
            .collect();
        for arg in cmd.get_arguments() {
            texts.extend(
                [arg.get_help(), arg.get_long_help()]
                    .into_iter()
                    .flatten()
                    .map(|t| t.to_string()),
            );
        }
        for sub in cmd.get_subcommands() {
            texts.extend(help_texts(sub));
        }
        texts
    }

    /// The help cites a part of docs/performance.md by its title (`docs/performance.md, "The
    /// title"`), which the document has, and never by a section number.
    #[test]
    fn the_help_names_sections_by_their_titles() {
        let performance = include_str!("../../../docs/performance.md");
        let mut cited = 0;
        for text in help_texts(&Cli::command()) {
            assert!(
                !text.contains('§') && !text.contains("perf-notes"),
                "{text}"
            );
            for (at, _) in text.match_indices("docs/performance.md, \"") {
                let title = text[at..].split('"').nth(1).unwrap_or_default();
                assert!(
                    performance.contains(&format!("\n## {title}\n")),
                    "docs/performance.md has no section {title:?}"
                );
                cited += 1;
            }
        }
        assert!(cited > 0, "no help text cites docs/performance.md");
    }
}
