//! The `infertrace` command.
use std::{
    fs::File,
    io::{BufWriter, Write as _},
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use clap::{Args, CommandFactory as _, Parser, Subcommand};
use infertrace::{
    capture::{
        cuda_watch::CudaOptions,
        kernel::KernelOptions,
        python_watch::{self, PythonOptions},
    },
    config,
    discover::{
        engine::{self, Target},
        kubernetes::PodWatch,
        node::{self, Node},
        selection::{Selection, Verdict},
        servers::Finder,
    },
    doctor, engines,
    export::{
        Exporter,
        console::{Console, ConsoleExporter},
        health::Health,
        jsonl::Jsonl,
        otlp::{Otlp, OtlpOptions, OtlpProtocol},
        prometheus,
    },
    pipeline::{Pipeline, PipelineOptions},
    session::{self, LiveOptions},
    telemetry::{
        Clock, SpanOptions, agent_metrics, gpu,
        metrics::{MetricDef, Registry},
        python_samples,
    },
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
    /// Node agent: trace every vLLM and SGLang server on this host, those running and each
    /// one that starts, until stopped (needs root).
    Run(NodeArgs),
    /// Like attach, but write the raw event stream to a file for `replay` (needs root).
    Record {
        #[command(flatten)]
        capture: CaptureArgs,
        /// The recording file to write (spans and metrics go where --output says, as with
        /// attach).
        #[arg(short = 'o', long = "recording", value_name = "FILE")]
        recording: PathBuf,
    },
    /// Sample the Python stacks of processes (and everything they fork) for a while, then print
    /// the hottest stacks of each thread (needs root).
    Profile {
        #[command(flatten)]
        capture: CaptureArgs,
        /// Stacks listed per thread.
        #[arg(long, default_value_t = 5)]
        top: usize,
    },
    /// Decode a recording made by `record`, offline (no root needed).
    Replay {
        /// The recording.
        file: PathBuf,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// List vLLM and SGLang processes on this host: role, version, model, ports; and which
    /// servers `infertrace run` would trace, and why (its selection rules, from the flags or
    /// from its configuration file).
    Discover {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// `infertrace run`'s configuration file: its selection rules apply (its other settings
        /// are checked, not used).
        #[arg(long, env = config::CONFIG_ENV, value_name = "FILE")]
        config: Option<PathBuf>,
        #[command(flatten)]
        selection: SelectionArgs,
    },
    /// Check what this host supports (privileges, tracefs, BTF, uprobes, ring buffers, perf).
    Doctor,
    /// The configuration file.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
}

#[derive(Subcommand)]
enum ConfigAction {
    /// Check a configuration file: every key a setting, every value one its flag takes.
    Check {
        file: PathBuf,
        /// The command it is for.
        #[arg(long = "for", default_value = "run", value_parser = ["run", "attach", "record", "profile"])]
        command: String,
    },
}

#[derive(Args, Clone)]
struct CaptureArgs {
    /// Process to trace: an engine's API server (its engine processes are followed); find it
    /// with `infertrace discover`. Repeatable.
    #[arg(short, long = "pid", required = true)]
    pids: Vec<u32>,
    #[command(flatten)]
    trace: TraceArgs,
}

#[derive(Args, Clone)]
struct NodeArgs {
    /// This node's name in Kubernetes: each server's spans and metrics then carry its pod's
    /// identity (k8s.namespace.name, k8s.pod.name, ...), from a watch of the pods scheduled on
    /// it (pods get/list/watch; the client is configured in-cluster, else by KUBECONFIG).
    /// A DaemonSet sets NODE_NAME from the downward API.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    kubernetes_node: Option<String>,
    #[command(flatten)]
    selection: SelectionArgs,
    #[command(flatten)]
    trace: TraceArgs,
}

/// Which servers node mode traces.
#[derive(Args, Clone)]
struct SelectionArgs {
    /// Trace only the servers a rule matches (default: every vLLM and SGLang server). A rule
    /// is conditions joined by `,`, all of which must hold: engine=vllm|sglang, port=N,
    /// container=ID (or prefix), namespace=NS, pod=NAME, label.KEY=VALUE, cmdline=REGEX (last:
    /// it takes the rest). Repeatable: any rule may match.
    #[arg(long, value_name = "RULE")]
    include: Vec<String>,
    /// Leave out the servers a rule matches (as --include; wins over it). Repeatable.
    #[arg(long, value_name = "RULE")]
    exclude: Vec<String>,
}

impl SelectionArgs {
    fn selection(&self) -> anyhow::Result<Selection> {
        Ok(Selection::parse(&self.include, &self.exclude)?)
    }
}

/// How to trace, whatever is traced.
#[derive(Args, Clone)]
struct TraceArgs {
    /// Read settings from this YAML file: each key a flag's name without `--`, e.g.
    /// `otlp-endpoint: http://collector:4317` (environment variables INFERTRACE_<FLAG> override
    /// it, flags override both; check it with `infertrace config check`).
    #[arg(long, env = config::CONFIG_ENV, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Stop after this many seconds (default: until Ctrl-C, SIGTERM, or the processes exit).
    #[arg(long)]
    duration: Option<f64>,
    /// Most payload bytes copied per syscall; larger messages are truncated and counted.
    #[arg(long, default_value_t = infertrace_common::DEFAULT_CAP_BYTES)]
    cap_bytes: u32,
    /// Ring buffer size in MiB (the kernel's memory; the agent's RSS counts it twice, as the
    /// ring is mapped twice for wrap-around).
    #[arg(long, default_value_t = 8)]
    ring_mib: u32,
    /// How often the ring buffer is drained, in milliseconds: the longest a record waits to be
    /// decoded (a ring buffer a quarter full, or a new socket to classify, wakes the agent
    /// sooner). Each wakeup costs CPU whatever it finds.
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
    /// Do not sample the Python stacks of traced Python processes.
    #[arg(long)]
    no_python_sampling: bool,
    /// Python stack samples per second of a thread's CPU time [default: 49 with
    /// --granularity 2, --profile-output, `record` or `profile`, where each iteration's
    /// samples or the stacks themselves are shown (or may be, on replay); else 19, enough for
    /// the phase shares of the samples metric].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    python_sample_hz: Option<u64>,
    /// Do not probe the CUDA driver (GPU launch and synchronisation timing).
    #[arg(long)]
    no_cuda: bool,
    /// Leave out CUDA driver entry points whose first instruction the kernel must single-step
    /// (tens of microseconds per call each; the agent says at attach which ones they are).
    #[arg(long)]
    cuda_skip_single_stepped: bool,
    /// One ring-buffer record per CUDA driver call instead of one per step (to check the
    /// in-kernel aggregation and measure what it saves; costs more).
    #[arg(long, hide = true)]
    cuda_every_call: bool,
    /// Do not probe libzmq's zmq_msg_send (which times each message's hand-over to libzmq:
    /// SGLang's dispatch and its scheduler's sends); they are then timed by libzmq's own
    /// wake-ups, or at the socket write.
    #[arg(long)]
    no_zmq_probe: bool,
    /// Do not probe CPython's pickle.dumps in SGLang's main process and DP controller (whose
    /// entry times the start of each request's dispatch: SGLang's api_server_dispatch and
    /// dpc_dispatch stages; without it the tokenize span covers the first, and the second is
    /// left out).
    #[arg(long)]
    no_pickle_probe: bool,
    #[command(flatten)]
    output: OutputArgs,
}

/// Where spans and metrics go, and what they contain.
#[derive(Args, Clone)]
struct OutputArgs {
    /// Output: `console` (default: a line per finished request, metrics per interval),
    /// `jsonl:PATH` (spans and metrics as JSON lines; `jsonl:-` for stdout), or `none`.
    /// Repeatable.
    #[arg(long = "output", value_name = "OUTPUT")]
    outputs: Vec<String>,
    /// Also print every decoded HTTP exchange and ZeroMQ message.
    #[arg(long)]
    messages: bool,
    /// Span detail: 0 = entry span + llm_request; 1 = + wait/prefill/decode spans;
    /// 2 = + one event per engine iteration (token ids, logprobs when requested).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=2))]
    granularity: u8,
    /// SGLang's native span levels (its SGLANG_TRACE_LEVEL): stage spans of a higher level
    /// than this are left out (1: tokenize, prefill_waiting, prefill_forward, decode_waiting,
    /// decode_forward, retract events; 2: + request_process; 3: + chunked_prefill, decode_loop,
    /// schedule events); 0 leaves out the native hierarchy (request, thread and stage spans),
    /// keeping the entry span.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=4))]
    sglang_trace_level: u8,
    /// Put prompts and generated text on the entry spans (off by default: they may be
    /// sensitive). Without it, the kernel reports the writes of streamed text by time and
    /// size only, which costs the agent far less.
    #[arg(long)]
    capture_content: bool,
    /// Seconds between metrics snapshots (console, JSONL, OTLP).
    #[arg(long, default_value_t = 10.0)]
    metrics_interval: f64,
    /// Export spans and metrics over OTLP to this collector (e.g. http://127.0.0.1:4317 for
    /// gRPC, http://127.0.0.1:4318 for HTTP). Default: OTEL_EXPORTER_OTLP_ENDPOINT (and the
    /// other OTEL_EXPORTER_OTLP_* variables) when set; otherwise no OTLP export.
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// OTLP transport: `grpc` or `http/protobuf` (default: OTEL_EXPORTER_OTLP_PROTOCOL, else
    /// grpc).
    #[arg(long, value_name = "PROTOCOL")]
    otlp_protocol: Option<String>,
    /// Serve the metrics for Prometheus to scrape at http://ADDR/metrics (e.g. 0.0.0.0:9464).
    #[arg(long, value_name = "ADDR")]
    prometheus: Option<String>,
    /// Write the Python stack samples so far as folded stacks (flame graph input: one
    /// `pid;thread (tid);outer;...;inner count` line per stack) to FILE, every metrics
    /// interval and at the end.
    #[arg(long, value_name = "FILE")]
    profile_output: Option<PathBuf>,
}

impl OutputArgs {
    /// OTLP settings, when OTLP export is asked for (flag or environment).
    fn otlp(&self) -> anyhow::Result<Option<OtlpOptions>> {
        let from_env = [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()));
        if self.otlp_endpoint.is_none() && !from_env {
            return Ok(None);
        }
        let protocol = match self
            .otlp_protocol
            .clone()
            .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").ok())
        {
            None => OtlpProtocol::Grpc,
            Some(p) => OtlpProtocol::parse(&p).ok_or_else(|| {
                anyhow::anyhow!("OTLP protocol {p:?}: expected `grpc` or `http/protobuf`")
            })?,
        };
        Ok(Some(OtlpOptions {
            endpoint: self.otlp_endpoint.clone(),
            protocol,
            host: infertrace::discover::system::hostname(),
        }))
    }

    fn exporters(&self) -> anyhow::Result<Vec<Box<dyn Exporter>>> {
        let specs: Vec<&str> = if self.outputs.is_empty() {
            vec!["console"]
        } else {
            self.outputs.iter().map(String::as_str).collect()
        };
        let mut out: Vec<Box<dyn Exporter>> = Vec::new();
        for spec in specs {
            match spec.split_once(':') {
                None if spec == "console" => out.push(Box::new(ConsoleExporter::new(
                    engines::Engine::ALL
                        .iter()
                        .map(|e| engines::kind(e).console_fields())
                        .collect(),
                ))),
                None if spec == "none" => {}
                Some(("jsonl", "-")) => out.push(Box::new(Jsonl::new(std::io::stdout()))),
                Some(("jsonl", path)) => {
                    let file = File::create(path).with_context(|| format!("creating {path}"))?;
                    out.push(Box::new(Jsonl::new(BufWriter::new(file))));
                }
                _ => anyhow::bail!(
                    "--output {spec}: expected `console`, `jsonl:PATH`, `jsonl:-` or `none`"
                ),
            }
        }
        Ok(out)
    }

    /// The pipeline and its outputs; `health` is what the Prometheus endpoint's probes answer.
    fn pipeline(
        &self,
        clock: Clock,
        targets: Vec<Target>,
        host: String,
        health: Arc<Health>,
    ) -> anyhow::Result<Pipeline> {
        if !(self.metrics_interval.is_finite() && self.metrics_interval > 0.0) {
            anyhow::bail!("--metrics-interval must be > 0");
        }
        let options = PipelineOptions {
            spans: SpanOptions {
                granularity: self.granularity,
                sglang_trace_level: self.sglang_trace_level,
                capture_content: self.capture_content,
                default_model: None,
                host_id: std::fs::read_to_string("/etc/machine-id")
                    .ok()
                    .map(|id| id.trim().to_owned())
                    .filter(|id| !id.is_empty()),
            },
            metrics_interval_ns: (self.metrics_interval * 1e9) as u64,
            targets,
            host,
            profile_output: self.profile_output.clone(),
        };
        let registry = Arc::new(Mutex::new(Registry::default()));
        let mut exporters = self.exporters()?;
        if let Some(otlp) = self.otlp()? {
            tracing::info!(
                "exporting over OTLP ({:?}) to {}",
                otlp.protocol,
                otlp.endpoint
                    .as_deref()
                    .unwrap_or("the OTEL_EXPORTER_OTLP_* endpoint")
            );
            exporters.push(Box::new(Otlp::start(
                &otlp,
                registry.clone(),
                &[
                    &engine_metrics(),
                    &agent_metrics::ALL[..],
                    &gpu::ALL[..],
                    &[&python_samples::PYTHON_SAMPLES],
                ]
                .concat(),
            )?));
        }
        if let Some(addr) = &self.prometheus {
            let bound = prometheus::serve(addr, registry.clone(), health)?;
            tracing::info!(
                "Prometheus metrics at http://{bound}/metrics (probes: /healthz, /readyz)"
            );
        }
        Ok(Pipeline::new(options, clock, registry, exporters))
    }
}

impl TraceArgs {
    /// The capture's settings; `recording`: the session writes a recording, whose replay may
    /// show the stacks or each iteration's samples.
    fn options(&self, recording: bool) -> anyhow::Result<LiveOptions> {
        let duration = match self.duration {
            Some(s) if !(s.is_finite() && s > 0.0) => anyhow::bail!("--duration must be > 0"),
            Some(s) => Some(Duration::from_secs_f64(s)),
            None => None,
        };
        Ok(LiveOptions {
            kernel: KernelOptions {
                ring_bytes: self.ring_mib.clamp(1, 1024) * 1024 * 1024,
                cap_bytes: self.cap_bytes,
                cuda: CudaOptions {
                    off: self.no_cuda,
                    skip_single_stepped: self.cuda_skip_single_stepped,
                    every_call: self.cuda_every_call,
                },
                python: PythonOptions {
                    off: self.no_python_sampling,
                    hz: self.python_sample_hz.unwrap_or_else(|| {
                        python_watch::default_hz(
                            self.output.granularity,
                            self.output.profile_output.is_some() || recording,
                        )
                    }),
                },
                no_zmq_probe: self.no_zmq_probe,
                no_pickle_probe: self.no_pickle_probe,
                announce_execs: false,
            },
            // Metrics snapshots are taken when the loop wakes: it wakes for each one (a bad
            // interval is refused when the pipeline is made).
            poll_interval: Duration::from_millis(self.poll_ms.clamp(1, 10_000)).min(
                Duration::try_from_secs_f64(self.output.metrics_interval)
                    .unwrap_or(Duration::MAX)
                    .max(Duration::from_millis(1)),
            ),
            duration,
            targets: Vec::new(),
            elide_content: !self.output.capture_content,
        })
    }
}

/// The subcommands whose flags a configuration file and the environment may set (`discover`
/// reads `run`'s file for its selection rules).
const CONFIGURABLE: [&str; 5] = ["run", "attach", "record", "profile", "discover"];

/// The flags of subcommand `name` that the configuration may set.
fn configurable_flags(name: &str) -> Vec<config::Flag> {
    let cli = Cli::command();
    let Some(command) = cli.find_subcommand(name) else {
        return Vec::new();
    };
    command
        .get_arguments()
        .filter_map(|arg| {
            let long = arg.get_long()?;
            (!["help", "version", "config"].contains(&long)).then(|| config::Flag {
                long: long.to_owned(),
                takes_value: arg.get_action().takes_values(),
                repeatable: matches!(arg.get_action(), clap::ArgAction::Append),
            })
        })
        .collect()
}

/// The command line with the configuration file's and the environment's settings in it.
fn configured(argv: Vec<String>) -> anyhow::Result<Vec<String>> {
    let Some(command) = argv.get(1).filter(|c| CONFIGURABLE.contains(&c.as_str())) else {
        return Ok(argv);
    };
    let flags = configurable_flags(command);
    let rest = &argv[2..];
    let path = rest
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| rest.get(i + 1).cloned())
        .or_else(|| {
            rest.iter()
                .find_map(|a| a.strip_prefix("--config=").map(str::to_owned))
        })
        .or_else(|| {
            std::env::var(config::CONFIG_ENV)
                .ok()
                .filter(|p| !p.is_empty())
        });
    let file = match path {
        // `run`'s file, checked as such; only the settings discover has are used.
        Some(path) if command == "discover" => {
            config::read_file(Path::new(&path), "run", &configurable_flags("run"))?
                .into_iter()
                .filter(|s| flags.iter().any(|f| f.long == s.flag))
                .collect()
        }
        Some(path) => config::read_file(Path::new(&path), command, &flags)?,
        None => Vec::new(),
    };
    let merged = config::merged_args(rest, &file, |var| std::env::var(var).ok(), &flags)?;
    Ok(argv[..2].iter().cloned().chain(merged).collect())
}

/// `config check`: the file read as `command` would read it, every value parsed by its flag.
fn check_config(file: &Path, command: &str) -> anyhow::Result<()> {
    let flags = configurable_flags(command);
    let settings = config::read_file(file, command, &flags)?;
    let mut argv = vec!["infertrace".to_owned(), command.to_owned()];
    argv.extend(config::merged_args(&[], &settings, |_| None, &flags)?);
    // What the command line must say whatever the file says: not the file's to check.
    if command != "run" && !settings.iter().any(|s| s.flag == "pid") {
        argv.push("--pid=1".into());
    }
    if command == "record" && !settings.iter().any(|s| s.flag == "recording") {
        argv.push("--recording=x".into());
    }
    if let Err(e) = Cli::try_parse_from(&argv) {
        let text = e.to_string();
        let first = text.lines().next().unwrap_or_default();
        anyhow::bail!(
            "{}: {}",
            file.display(),
            first.strip_prefix("error: ").unwrap_or(first)
        );
    }
    let names: Vec<&str> = settings.iter().map(|s| s.flag.as_str()).collect();
    println!(
        "{}: valid for `infertrace {command}`: {} settings{}",
        file.display(),
        names.len(),
        if names.is_empty() {
            String::new()
        } else {
            format!(" ({})", names.join(", "))
        }
    );
    Ok(())
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
    let argv = match configured(std::env::args().collect()) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("infertrace: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    match run(Cli::parse_from(argv)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("infertrace: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Attach(args) => {
            live(&args.trace, attach_targets(&args.pids), None, None).map(|_| ())
        }
        Command::Run(args) => node(&args),
        Command::Profile { capture, top } => profile(capture, top),
        Command::Record { capture, recording } => live(
            &capture.trace,
            attach_targets(&capture.pids),
            Some(recording),
            None,
        )
        .map(|_| ()),
        Command::Replay { file, output } => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let (header, summary, pipeline) = session::replay_pipeline(
                &file,
                |header| {
                    let clock = Clock::fixed(header.realtime_minus_monotonic_ns);
                    let health = Arc::new(Health::default());
                    health.round();
                    output.pipeline(clock, header.targets(), header.host.clone(), health)
                },
                |header, d| {
                    if output.messages
                        && let Some(line) = Console::new(header.realtime_minus_monotonic_ns).line(d)
                    {
                        let _ = writeln!(out, "{line}");
                    }
                },
            )?;
            out.flush()?;
            eprintln!(
                "replayed {} (host {}, kernel {}, pids {:?}): {summary}{}",
                file.display(),
                header.host,
                header.kernel,
                header.pids,
                pipeline.as_ref().map(results).unwrap_or_default()
            );
            Ok(())
        }
        Command::Discover {
            json,
            config: _,
            selection,
        } => discover(json, &selection.selection()?),
        Command::Doctor => {
            print!("{}", doctor::render(&doctor::run()));
            Ok(())
        }
        Command::Config {
            action: ConfigAction::Check { file, command },
        } => check_config(&file, &command),
    }
}

/// `discover`: the engine processes, and what `run` would make of each server.
fn discover(json: bool, selection: &Selection) -> anyhow::Result<()> {
    let found = engine::scan();
    let verdicts: Vec<(Target, Verdict)> = Finder::default()
        .scan()
        .into_iter()
        .map(|t| {
            let verdict = selection.judge(&node::facts(&t, None).as_facts());
            (t, verdict)
        })
        .collect();
    let said = |verdict: &Verdict| match verdict {
        Verdict::Trace(why) => (Some(true), why.clone()),
        Verdict::Skip(why) => (Some(false), why.clone()),
        Verdict::NeedsPod => (None, "decided when Kubernetes names its pod".to_owned()),
    };
    if json {
        let mut list = serde_json::to_value(&found)?;
        for item in list.as_array_mut().into_iter().flatten() {
            let pid = item["pid"].as_u64();
            if let Some((_, verdict)) = verdicts.iter().find(|(t, _)| Some(u64::from(t.pid)) == pid)
            {
                let (trace, why) = said(verdict);
                item["run"] = serde_json::json!({"trace": trace, "why": why});
            }
        }
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    print!("{}", engine::render_table(&found));
    if !verdicts.is_empty() {
        println!("\n`infertrace run` would trace:");
    }
    for (target, verdict) in &verdicts {
        let (trace, why) = said(verdict);
        let answer = match trace {
            Some(true) => "yes",
            Some(false) => "no",
            None => "maybe",
        };
        println!("  {answer}: {} ({why})", session::describe(target));
    }
    Ok(())
}

/// `profile`: a live session whose output is the Python profile.
fn profile(mut capture: CaptureArgs, top: usize) -> anyhow::Result<()> {
    let trace = &mut capture.trace;
    if trace.no_python_sampling {
        anyhow::bail!("profile samples Python stacks: leave out --no-python-sampling");
    }
    if trace.output.outputs.is_empty() {
        trace.output.outputs = vec!["none".into()];
    }
    trace
        .python_sample_hz
        .get_or_insert(python_watch::DETAIL_HZ);
    let pipeline = live(trace, attach_targets(&capture.pids), None, None)?;
    print!("{}", pipeline.profile().report(top));
    Ok(())
}

/// The servers `attach --pid` names, as discovery finds them.
fn attach_targets(pids: &[u32]) -> Vec<Target> {
    pids.iter()
        .map(|&pid| {
            let target = Target::discover(pid);
            if target.engine.is_none() && infertrace::discover::procfs::exists(pid) {
                tracing::warn!(
                    "pid {pid} is not a vLLM/SGLang process (found: {}); capturing its sockets \
                     anyway",
                    engine::describe_non_engine(pid)
                );
            }
            target
        })
        .collect()
}

/// `run`: every server on the host, those running now and each that starts.
fn node(args: &NodeArgs) -> anyhow::Result<()> {
    let pods = match &args.kubernetes_node {
        Some(name) => match PodWatch::start(name) {
            Ok(watch) => Some(watch),
            // Tracing matters more than naming pods: say why, and trace.
            Err(e) => {
                tracing::warn!("{e:#}; servers are traced without their pod identity");
                None
            }
        },
        None => None,
    };
    let selection = args.selection.selection()?;
    let mut node = Node::new(selection, pods);
    let targets = node.scan();
    if targets.is_empty() {
        tracing::info!("no vLLM or SGLang server to trace yet; each is traced as it starts");
    }
    for target in &targets {
        tracing::info!("tracing {}", session::describe(target));
    }
    live(&args.trace, targets, None, Some(node)).map(|_| ())
}

fn live(
    args: &TraceArgs,
    targets: Vec<Target>,
    record: Option<PathBuf>,
    node: Option<Node>,
) -> anyhow::Result<Pipeline> {
    if let Some(path) = &args.config {
        tracing::info!("settings from {}", path.display());
    }
    let mut options = args.options(record.is_some())?;
    options.targets = targets;
    options.kernel.announce_execs = node.is_some();
    let clock = Clock::fixed(session::realtime_minus_monotonic_ns());
    let console = args.output.messages.then(|| Console::new(clock.latest()));
    let health = Arc::new(Health::default());
    let mut pipeline = args.output.pipeline(
        clock,
        options.targets.clone(),
        infertrace::discover::system::hostname(),
        health.clone(),
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let summary = runtime.block_on(session::run_live(
        &options,
        record.as_deref(),
        node,
        |batch, so_far| {
            health.round();
            if let Some(console) = &console {
                // One write per batch: a busy engine produces thousands of lines a second.
                let mut text = String::new();
                for line in batch.iter().filter_map(|d| console.line(d)) {
                    text.push_str(&line);
                    text.push('\n');
                }
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
            }
            pipeline.handle(batch);
            pipeline.observe_capture(
                &so_far.kernel,
                &so_far.flows,
                (so_far.records, so_far.bad_records),
            );
            pipeline.tick(session::monotonic_ns());
        },
    ))?;
    pipeline.finish(session::monotonic_ns());
    let (cpu_s, peak_rss_kib) = agent_metrics::own_usage();
    eprintln!(
        "infertrace: detached. {summary}{}; agent used {cpu_s:.3} s of CPU, peak RSS \
         {peak_rss_kib} KiB",
        results(&pipeline)
    );
    Ok(pipeline)
}

/// Every engine kind's metrics (each once), for exporters that declare their instruments up
/// front: in node mode any kind may start later.
fn engine_metrics() -> Vec<&'static MetricDef> {
    let mut defs: Vec<&'static MetricDef> = Vec::new();
    for engine in engines::Engine::ALL {
        for def in engines::kind(&engine).metrics() {
            if !defs.iter().any(|d| d.name == def.name) {
                defs.push(def);
            }
        }
    }
    defs
}

/// What the pipeline made of it, for the summary line.
fn results(pipeline: &Pipeline) -> String {
    let s = pipeline.stats;
    let h = pipeline.handoff_stats();
    let engines: Vec<String> = pipeline.instances().map(|i| i.summary()).collect();
    let unrouted = if s.unrouted > 0 {
        format!(
            "; {} messages of processes outside every traced server left out",
            s.unrouted
        )
    } else {
        String::new()
    };
    format!(
        "; {} requests traced ({} spans); {}; messages timed at the event loop's \
         take-over: {} (at its next iteration: {}), at their arrival: {} (moved to the end of \
         a long loop iteration: {}); sends timed at the hand-over to libzmq: {} ({} by its \
         send's probe), at the send: {}{unrouted}",
        s.traces,
        s.spans,
        engines.join("; "),
        h.taken_over,
        h.next_iteration,
        h.at_arrival,
        h.after_long_iteration,
        h.handed_over,
        h.send_probed,
        h.at_send,
    )
}
