//! The torch runner: the separate executable that runs batchfit's own tch models (`batchfit probe
//! --model`, `batchfit-train`), and the user's PyTorch it runs on.
//!
//! Why a separate executable: everything else batchfit does (the engine, `--exec`, NVML, plans,
//! outputs) needs no libtorch, and a binary that links it takes most of a second and hundreds of MB
//! to start, and does not start at all where libtorch is not installed. So `batchfit` links none;
//! the runner (`batchfit-torch`, package `crates/batchfit-torch`) links libtorch, and this module
//! finds both halves at run time:
//!
//! * the runner: `BATCHFIT_TORCH_RUNNER`, else `batchfit-torch` next to this executable (a wheel
//!   installs them side by side; so does `cargo build`), else on `PATH`;
//! * libtorch: the `torch` package of the user's own Python (`BATCHFIT_PYTHON`, else the `python3`
//!   next to this executable, as in a virtual environment's `bin/`, else `python3`/`python` on
//!   `PATH`), found without importing torch (which takes seconds). The runner is started with that
//!   package's `lib/` on `LD_LIBRARY_PATH`; it has no RUNPATH into a build machine's directories.
//!
//! The runner is built against one PyTorch minor version ([`TORCH_MINOR`], what `tch` binds); a
//! torch of another version is refused here, naming both, before the runner fails to load.

use crate::plan::model::ModelSpec;
use crate::workload::fault::FaultAt;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use thiserror::Error;

/// The PyTorch minor version the runner is built against (`tch 0.24` binds PyTorch 2.11). The
/// runner's build script refuses to build against another.
pub const TORCH_MINOR: &str = "2.11";

/// The runner's file name.
pub const RUNNER_NAME: &str = "batchfit-torch";

/// Set on the runner's environment by [`Runner::command`]: the version of the torch whose `lib/` it
/// is started with (what a probe records as the plan's `tool.libtorch_version`), so the trainer can
/// compare a plan's torch with its own.
pub const TORCH_VERSION_ENV: &str = "BATCHFIT_RUNNER_TORCH_VERSION";

/// Set in the runner's environment to the version of the `batchfit` that starts it: the trial spec,
/// the result line and the trainer's arguments are one version's protocol, so a runner of another
/// version (an older one on `PATH`, say) refuses to run (exit 3) rather than misread a spec and
/// report a run that was not asked for as a fit.
pub const CALLER_VERSION_ENV: &str = "BATCHFIT_CALLER_VERSION";

/// This batchfit's version (what the runner must be).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How long a Python may take to say where torch is (a `find_spec`: milliseconds, seconds on a cold
/// network file system). One that never answers is an error, not a hang.
pub const PYTHON_TIMEOUT: Duration = Duration::from_secs(20);

/// How long `batchfit-torch info` may take (loading libtorch and asking the CUDA driver for devices).
pub const INFO_TIMEOUT: Duration = Duration::from_secs(120);

/// Everything a model trial needs (passed as JSON on the runner's command line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrialSpec {
    pub model: ModelSpec,
    pub batch: u64,
    pub steps: u32,
    /// libtorch intra-op threads (the trainer uses the same number).
    pub threads: u32,
    pub seed: i64,
    /// Micro-batches of `batch` per optimizer step (gradient accumulation).
    #[serde(default = "one")]
    pub accumulation: u32,
    #[serde(default)]
    pub fault: Option<FaultAt>,
    /// Run on this CUDA device (NVML's index; the parent exposes it as `cuda:0`) instead of the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_device: Option<u32>,
}

fn one() -> u32 {
    1
}

/// What the runner says of itself and of the libtorch it loaded (`batchfit-torch info`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunnerInfo {
    /// The PyTorch version the runner was built against.
    pub built_for: String,
    /// Whether libtorch can use a CUDA device in this process.
    pub cuda_available: bool,
    pub cuda_device_count: u32,
    /// The CUDA runtime version libtorch's CUDA half reports (e.g. 13000), when it is loaded and
    /// registered (also on a machine without a GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_runtime: Option<i64>,
    /// Why libtorch's CUDA library could not be loaded (a CPU-only torch has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_library: Option<String>,
}

/// Why the runner cannot be used.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum RunnerError {
    #[error(
        "batchfit's torch runner ({RUNNER_NAME}) is not installed: it is what runs --model probes \
         and batchfit-train. Install batchfit with pip into the Python environment that has torch \
         (pip install batchfit), or build it from source (cargo build --release --workspace) and \
         set BATCHFIT_TORCH_RUNNER=/path/to/{RUNNER_NAME}; --exec probes need no runner"
    )]
    NoRunner,
    #[error("BATCHFIT_TORCH_RUNNER={0} is not an executable file")]
    BadRunnerVar(String),
    #[error(
        "BATCHFIT_PYTHON={0} is not an executable file: set it to the python of an environment that \
         has torch=={TORCH_MINOR}.*"
    )]
    BadPythonVar(String),
    #[error(
        "{python} did not say where torch is within {secs} s: set BATCHFIT_PYTHON=/path/to/python of \
         an environment that has torch=={TORCH_MINOR}.*"
    )]
    PythonHangs { python: String, secs: u64 },
    #[error(
        "no PyTorch found for batchfit's torch runner (it runs --model probes and batchfit-train \
         on your own torch): tried {tried}. Install torch=={TORCH_MINOR}.* into that Python \
         environment, or set BATCHFIT_PYTHON=/path/to/python of an environment that has it"
    )]
    NoTorch { tried: String },
    #[error(
        "the torch at {dir} is version {found}; batchfit's torch runner was built for PyTorch \
         {TORCH_MINOR} (what tch binds). Use an environment with torch=={TORCH_MINOR}.* \
         (BATCHFIT_PYTHON=/path/to/its/python), or rebuild the runner against your torch \
         (LIBTORCH_USE_PYTORCH=1 cargo build --release -p batchfit-torch); --exec probes work \
         with any torch"
    )]
    WrongTorch { dir: String, found: String },
    #[error(
        "batchfit's torch runner {exe} does not work here (`info`: {why}): point \
         BATCHFIT_TORCH_RUNNER at batchfit's own {RUNNER_NAME}, or reinstall batchfit and torch"
    )]
    Info { exe: String, why: String },
}

/// The user's PyTorch: its package directory and version.
#[derive(Debug, Clone, PartialEq)]
pub struct Torch {
    /// `…/site-packages/torch`.
    pub dir: PathBuf,
    /// `torch.__version__`, e.g. `2.11.0+cu130`.
    pub version: String,
    /// The Python interpreter it was found through.
    pub python: PathBuf,
}

impl Torch {
    /// libtorch's shared libraries.
    pub fn lib_dir(&self) -> PathBuf {
        self.dir.join("lib")
    }
}

/// The runner and the torch it runs on, found once per process.
#[derive(Debug, Clone, PartialEq)]
pub struct Runner {
    pub exe: PathBuf,
    pub torch: Torch,
}

impl Runner {
    /// Finds the runner and the user's torch (once per process; the answer is kept).
    pub fn locate() -> Result<Runner, RunnerError> {
        static FOUND: OnceLock<Result<Runner, RunnerError>> = OnceLock::new();
        FOUND
            .get_or_init(|| {
                let exe = runner_exe()?;
                let torch = find_torch()?;
                Ok(Runner { exe, torch })
            })
            .clone()
    }

    /// The runner as a command (`batchfit-torch ARGS…` to be added), with libtorch on its library
    /// path.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.exe);
        if let Some(joined) = library_path(
            &self.torch.lib_dir(),
            std::env::var_os("LD_LIBRARY_PATH").as_deref(),
        ) {
            cmd.env("LD_LIBRARY_PATH", joined);
        }
        cmd.env(TORCH_VERSION_ENV, &self.torch.version);
        cmd.env(CALLER_VERSION_ENV, VERSION);
        cmd
    }

    /// `batchfit-torch info`: the version it was built for, and whether it sees CUDA.
    pub fn info(&self) -> Result<RunnerInfo, RunnerError> {
        let fail = |why: String| RunnerError::Info {
            exe: self.exe.display().to_string(),
            why,
        };
        let out = output_within(self.command().arg("info"), INFO_TIMEOUT)
            .map_err(|e| fail(e.to_string()))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(fail(format!(
                "{}; {}",
                out.status,
                stderr.lines().next().unwrap_or("no message")
            )));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| fail(format!("unreadable answer: {e}")))
    }
}

/// `lib` followed by the `LD_LIBRARY_PATH` the user had, without empty entries (which the dynamic
/// loader reads as the current directory: an empty `LD_LIBRARY_PATH` must not become `lib:`).
pub fn library_path(lib: &Path, old: Option<&std::ffi::OsStr>) -> Option<std::ffi::OsString> {
    let mut paths = vec![lib.to_path_buf()];
    if let Some(old) = old {
        paths.extend(std::env::split_paths(old).filter(|p| !p.as_os_str().is_empty()));
    }
    std::env::join_paths(paths).ok()
}

/// Why [`output_within`] has no output.
#[derive(Debug, Error)]
pub enum OutputError {
    #[error("{0}")]
    Start(std::io::Error),
    #[error("no answer within {} s", .0.as_secs())]
    Late(Duration),
}

/// Runs `cmd` with stdin closed and collects its output, or kills it after `limit` (a Python or
/// runner that never answers must not hang batchfit). Also late when the output pipes stay open
/// past `limit` (a child left running holds them).
pub fn output_within(cmd: &mut Command, limit: Duration) -> Result<Output, OutputError> {
    use std::io::Read;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(OutputError::Start)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let pipes: [Option<Box<dyn Read + Send>>; 2] = [
        child.stdout.take().map(|p| Box::new(p) as _),
        child.stderr.take().map(|p| Box::new(p) as _),
    ];
    for (i, pipe) in pipes.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = vec![];
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            let _ = tx.send((i, buf));
        });
    }
    drop(tx);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(OutputError::Start)? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(OutputError::Late(limit));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut bufs = [vec![], vec![]];
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        let (i, buf) = rx
            .recv_timeout(left)
            .map_err(|_| OutputError::Late(limit))?;
        bufs[i] = buf;
    }
    let [stdout, stderr] = bufs;
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// Whether `p` is a regular file with an execute bit.
fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `name` in the `PATH` directories, as `execvp` would find it.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(name))
        .find(|p| executable(p))
}

/// The directory of this executable (symbolic links resolved, so a link on PATH to a wheel's binary
/// still finds its neighbours).
fn own_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
    exe.parent().map(Path::to_path_buf)
}

fn runner_exe() -> Result<PathBuf, RunnerError> {
    if let Some(v) = std::env::var_os("BATCHFIT_TORCH_RUNNER") {
        let p = PathBuf::from(&v);
        return if executable(&p) {
            Ok(p)
        } else {
            Err(RunnerError::BadRunnerVar(p.display().to_string()))
        };
    }
    own_dir()
        .map(|d| d.join(RUNNER_NAME))
        .filter(|p| executable(p))
        .or_else(|| on_path(RUNNER_NAME))
        .ok_or(RunnerError::NoRunner)
}

/// The Python interpreters to ask for torch, in order: `BATCHFIT_PYTHON` alone when set (a path, or
/// a name looked up on `PATH`); else the `python3`/`python` next to this executable, then on `PATH`.
fn pythons() -> Result<Vec<PathBuf>, RunnerError> {
    if let Some(v) = std::env::var_os("BATCHFIT_PYTHON") {
        let p = PathBuf::from(&v);
        let found = if p.components().count() > 1 || p.is_absolute() {
            Some(p.clone()).filter(|p| executable(p))
        } else {
            v.to_str().filter(|n| !n.is_empty()).and_then(on_path)
        };
        return found
            .map(|p| vec![p])
            .ok_or_else(|| RunnerError::BadPythonVar(p.display().to_string()));
    }
    let mut out = vec![];
    for name in ["python3", "python"] {
        if let Some(p) = own_dir().map(|d| d.join(name)).filter(|p| executable(p)) {
            out.push(p);
        }
    }
    for name in ["python3", "python"] {
        if let Some(p) = on_path(name) {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// Where `python` would import torch from, without importing it (a `find_spec`, milliseconds).
/// A Python that does not answer within [`PYTHON_TIMEOUT`] is an error.
fn torch_dir_of(python: &Path) -> Result<Option<PathBuf>, RunnerError> {
    const FIND: &str = "import importlib.util as u\n\
                        s = u.find_spec('torch')\n\
                        print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')";
    let out = match output_within(Command::new(python).args(["-c", FIND]), PYTHON_TIMEOUT) {
        Ok(out) => out,
        Err(OutputError::Start(_)) => return Ok(None),
        Err(OutputError::Late(_)) => {
            return Err(RunnerError::PythonHangs {
                python: python.display().to_string(),
                secs: PYTHON_TIMEOUT.as_secs(),
            })
        }
    };
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok((out.status.success() && !dir.is_empty()).then(|| PathBuf::from(dir)))
}

/// `__version__` of a torch package, read from its `version.py` (importing torch takes seconds).
pub fn torch_version(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("version.py")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("__version__"))
        .and_then(|rest| rest.split_once('='))
        .map(|(_, v)| {
            v.split('#')
                .next()
                .unwrap_or("")
                .trim()
                .trim_matches(|c| c == '\'' || c == '"')
                .to_string()
        })
        .filter(|v| !v.is_empty())
}

/// Whether `version` (e.g. `2.11.0+cu130`) is of the minor version `minor` (e.g. `2.11`).
pub fn same_minor(version: &str, minor: &str) -> bool {
    version
        .strip_prefix(minor)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '+', 'a', 'b', 'r']))
}

fn find_torch() -> Result<Torch, RunnerError> {
    let candidates = pythons()?;
    for python in &candidates {
        let Some(dir) = torch_dir_of(python)? else {
            continue;
        };
        if !dir.join("lib").join("libtorch_cpu.so").is_file() {
            continue;
        }
        let found = torch_version(&dir)
            .unwrap_or_else(|| "unreadable (no __version__ in its version.py)".into());
        if !same_minor(&found, TORCH_MINOR) {
            return Err(RunnerError::WrongTorch {
                dir: dir.display().to_string(),
                found,
            });
        }
        return Ok(Torch {
            dir,
            version: found,
            python: python.clone(),
        });
    }
    let tried = if candidates.is_empty() {
        "none (no python3 or python on PATH)".to_string()
    } else {
        candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(RunnerError::NoTorch { tried })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_versions_match_by_minor_version_only() {
        assert!(same_minor("2.11.0+cu130", "2.11"));
        assert!(same_minor("2.11.1", "2.11"));
        assert!(same_minor("2.11", "2.11"));
        assert!(same_minor("2.11.0a0+git1234", "2.11"));
        assert!(!same_minor("2.1.0", "2.11"));
        assert!(!same_minor("2.110.0", "2.11"));
        assert!(!same_minor("2.12.0", "2.11"));
        assert!(!same_minor("", "2.11"));
    }

    #[test]
    fn output_within_gives_up_on_a_command_that_never_answers() {
        let start = Instant::now();
        let late = output_within(
            Command::new("sh").args(["-c", "sleep 30"]),
            Duration::from_millis(300),
        );
        assert!(matches!(late, Err(OutputError::Late(_))), "{late:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        let out = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2"]),
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(
            (&out.stdout[..], &out.stderr[..]),
            (&b"out\n"[..], &b"err\n"[..])
        );
    }

    #[test]
    fn torch_version_is_read_from_version_py() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("version.py"),
            "from typing import Optional\n__all__ = ['__version__']\n__version__ = '2.11.0+cu130'\n\
             git_version = 'abc'\n",
        )
        .unwrap();
        assert_eq!(torch_version(dir.path()).as_deref(), Some("2.11.0+cu130"));
        std::fs::write(
            dir.path().join("version.py"),
            "__version__: str = \"2.5.1\"  # x\n",
        )
        .unwrap();
        assert_eq!(torch_version(dir.path()).as_deref(), Some("2.5.1"));
        std::fs::write(dir.path().join("version.py"), "nothing = 1\n").unwrap();
        assert_eq!(torch_version(dir.path()), None);
    }
}
