//! The `infertrace` command.
use std::{io::Write as _, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};
use infertrace::{
    capture::kernel::KernelOptions,
    discover::engine,
    doctor,
    export::console::Console,
    session::{self, LiveOptions},
};

/// Zero-code tracing for vLLM and SGLang: attach with eBPF to a running inference server and
/// see every request's HTTP exchange and engine messages, without modifying or restarting it.
#[derive(Parser)]
#[command(
    name = "infertrace",
    version,
    after_help = "Start with `infertrace discover` to find engine \
processes, `sudo infertrace doctor` to check this host, then `sudo infertrace attach --pid N`."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Attach to running engine processes and print what they exchange (needs root).
    Attach(CaptureArgs),
    /// Like attach, but write the raw event stream to a file for `replay` (needs root).
    Record {
        #[command(flatten)]
        capture: CaptureArgs,
        /// File to write.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Decode a recording made by `record`, offline (no root needed).
    Replay {
        /// The recording.
        file: PathBuf,
    },
    /// List vLLM and SGLang processes on this host: role, version, model, ports.
    Discover {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check what this host supports (privileges, tracefs, BTF, uprobes, ring buffers, perf).
    Doctor,
}

#[derive(Args, Clone)]
struct CaptureArgs {
    /// Process to trace: an engine's API server (its engine processes are followed); find it
    /// with `infertrace discover`. Repeatable.
    #[arg(short, long = "pid", required = true)]
    pids: Vec<u32>,
    /// Stop after this many seconds (default: until Ctrl-C, SIGTERM, or the processes exit).
    #[arg(long)]
    duration: Option<f64>,
    /// Most payload bytes copied per syscall; larger messages are truncated and counted.
    #[arg(long, default_value_t = infertrace_common::DEFAULT_CAP_BYTES)]
    cap_bytes: u32,
    /// Ring buffer size in MiB.
    #[arg(long, default_value_t = 32)]
    ring_mib: u32,
    /// How often the ring buffer is drained, in milliseconds.
    #[arg(long, default_value_t = 20)]
    poll_ms: u64,
}

impl CaptureArgs {
    fn options(&self) -> anyhow::Result<LiveOptions> {
        let duration = match self.duration {
            Some(s) if !(s.is_finite() && s > 0.0) => anyhow::bail!("--duration must be > 0"),
            Some(s) => Some(Duration::from_secs_f64(s)),
            None => None,
        };
        Ok(LiveOptions {
            pids: self.pids.clone(),
            kernel: KernelOptions {
                ring_bytes: self.ring_mib.clamp(1, 1024) * 1024 * 1024,
                cap_bytes: self.cap_bytes,
            },
            poll_interval: Duration::from_millis(self.poll_ms.clamp(1, 10_000)),
            duration,
        })
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("INFERTRACE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("infertrace: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Attach(args) => live(&args, None),
        Command::Record { capture, output } => live(&capture, Some(output)),
        Command::Replay { file } => {
            let mut console = None;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let (header, summary) = session::replay(&file, |header, d| {
                let c =
                    console.get_or_insert_with(|| Console::new(header.realtime_minus_monotonic_ns));
                let _ = writeln!(out, "{}", c.line(d));
            })?;
            out.flush()?;
            eprintln!(
                "replayed {} (host {}, kernel {}, pids {:?}): {summary}",
                file.display(),
                header.host,
                header.kernel,
                header.pids
            );
            Ok(())
        }
        Command::Discover { json } => {
            let found = engine::scan();
            if json {
                println!("{}", serde_json::to_string_pretty(&found)?);
            } else {
                print!("{}", engine::render_table(&found));
            }
            Ok(())
        }
        Command::Doctor => {
            print!("{}", doctor::render(&doctor::run()));
            Ok(())
        }
    }
}

fn live(args: &CaptureArgs, record: Option<PathBuf>) -> anyhow::Result<()> {
    let options = args.options()?;
    for &pid in &options.pids {
        if infertrace::discover::procfs::exists(pid) && engine::identify(pid).is_none() {
            tracing::warn!(
                "pid {pid} is not a vLLM/SGLang process (found: {}); capturing its sockets anyway",
                engine::describe_non_engine(pid)
            );
        }
    }
    let console = Console::new(session::realtime_minus_monotonic_ns());
    let quiet = record.is_some();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let summary = runtime.block_on(session::run_live(&options, record.as_deref(), |batch| {
        if !quiet {
            // One write per batch: a busy engine produces thousands of lines a second.
            let mut text = String::new();
            for decoded in batch {
                text.push_str(&console.line(decoded));
                text.push('\n');
            }
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        }
    }))?;
    let (cpu_s, peak_rss_kib) = own_usage();
    eprintln!(
        "infertrace: detached. {summary}; agent used {cpu_s:.3} s of CPU, peak RSS \
         {peak_rss_kib} KiB"
    );
    Ok(())
}

/// CPU seconds (user + system) this process used, and its peak RSS in KiB.
fn own_usage() -> (f64, i64) {
    // SAFETY: all-zero is a valid rusage; RUSAGE_SELF with a valid out pointer.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(usage.ru_utime) + secs(usage.ru_stime), usage.ru_maxrss)
}
