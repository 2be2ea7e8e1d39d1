//! Warm trial processes for Python commands (`--warm`). A Python job's trial spends most of its time
//! starting the interpreter and importing its packages (`import torch` takes seconds); none of that
//! is evidence. So the next trial's process is started ahead of time, under the trial's own limit
//! (the device places it as it places a fresh trial: `RLIMIT_DATA` set before its exec, or the
//! trial's own memory cgroup), imports the packages the job imported (the helper's report names
//! them), and waits; when the search has chosen the trial, it is handed the trial's argv, environment
//! and working directory and runs the script (or `-m` module) as the interpreter would. Each trial is
//! still its own fresh process, every byte of it measured: nothing is forked from a shared parent.
//! A hand-off that did not reach the command (the process died, or an import initialized CUDA) runs
//! the trial cold; it is never evidence.

use std::process::Command;

/// The warm process's program (`python -c BOOTSTRAP MODULES_JSON once|serve`).
pub const BOOTSTRAP: &str = include_str!("warm_bootstrap.py");

/// What a Python command runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Script(String),
    Module(String),
}

/// A command that is a Python interpreter running a script or a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The interpreter and its options (`python3 -u`).
    pub interpreter: Vec<String>,
    pub target: Target,
    /// The arguments after the script or module.
    pub args: Vec<String>,
}

/// Single-letter interpreter options that take no value and change nothing a warm process does
/// differently (`-u`, `-B`, `-O`, …; combined as `-uB`).
const PLAIN_FLAGS: &str = "bBdEIOPqsSuv";

/// `argv` as a Python interpreter (`python`, `python3`, `python3.11`) running a script or `-m
/// module`; `None` for anything else (`-c`, stdin, torchrun, another program).
pub fn python_launch(argv: &[String]) -> Option<Launch> {
    let program = std::path::Path::new(argv.first()?).file_name()?.to_str()?;
    let version = program.strip_prefix("python")?;
    if !version.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    let mut i = 1;
    while let Some(a) = argv.get(i) {
        let launch = |target, rest: usize| Launch {
            interpreter: argv[..i].to_vec(),
            target,
            args: argv[rest..].to_vec(),
        };
        if a == "-m" {
            return Some(launch(Target::Module(argv.get(i + 1)?.clone()), i + 2));
        }
        if let Some(m) = a.strip_prefix("-m").filter(|m| !m.is_empty()) {
            return Some(launch(Target::Module(m.to_string()), i + 1));
        }
        if a == "-X" || a == "-W" {
            i += 2;
            continue;
        }
        if a.starts_with("-X") || a.starts_with("-W") {
            i += 1;
            continue;
        }
        if let Some(flags) = a.strip_prefix('-') {
            if flags.is_empty() || !flags.chars().all(|c| PLAIN_FLAGS.contains(c)) {
                return None;
            }
            i += 1;
            continue;
        }
        return Some(launch(Target::Script(a.clone()), i + 1));
    }
    None
}

/// The warm process of `launch` importing `modules`, in the environment `base` of every trial (what
/// does not change between trials: `--threads`, a sweep's point, a temporary directory); a fork
/// server when `serve` ([`crate::device::process::ForkServer`]).
pub fn command(
    launch: &Launch,
    modules: &[String],
    base: &[(String, String)],
    serve: bool,
) -> Command {
    let mut cmd = Command::new(&launch.interpreter[0]);
    cmd.args(&launch.interpreter[1..])
        .arg("-c")
        .arg(BOOTSTRAP)
        .arg(serde_json::to_string(modules).expect("names serialise"))
        .arg(if serve { "serve" } else { "once" });
    for (k, v) in base {
        cmd.env(k, v);
    }
    cmd
}

/// The frameworks a fork server may import before the first trial has said what the job imports:
/// packages every trial of a PyTorch job spends its first seconds importing, whose import neither
/// reads the job's arguments nor starts a thread.
const FRAMEWORKS: &[&str] = &[
    "torch",
    "numpy",
    "lightning",
    "pytorch_lightning",
    "transformers",
    "accelerate",
    "torchvision",
];

/// The [`FRAMEWORKS`] a script's `source` imports at its top level (`import torch.nn as nn`, `from
/// lightning import Trainer`), in the order it names them. A guess read from the text: the first
/// trial's report says what the job really imported.
pub fn framework_imports(source: &str) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    for line in source.lines() {
        let names = if let Some(rest) = line.strip_prefix("import ") {
            rest.split(',').collect::<Vec<_>>()
        } else if let Some(rest) = line.strip_prefix("from ") {
            vec![rest.split(" import").next().unwrap_or("")]
        } else {
            continue;
        };
        for name in names {
            let root = name.trim().split(['.', ' ']).next().unwrap_or("");
            if FRAMEWORKS.contains(&root) && !out.iter().any(|o| o == root) {
                out.push(root.to_string());
            }
        }
    }
    out
}

/// The hand-off line for the trial whose fresh command is `trial`: its argv as the script sees it,
/// the environment it sets and unsets, the working directory, and `ack`, the file the warm process
/// creates once the trial is the command's. `None` when `trial` is not a Python launch.
pub fn handoff(trial: &Command, ack: &std::path::Path) -> Option<Vec<u8>> {
    let argv: Vec<String> = std::iter::once(trial.get_program())
        .chain(trial.get_args())
        .map(|a| a.to_str().map(str::to_string))
        .collect::<Option<_>>()?;
    let launch = python_launch(&argv)?;
    let mut env = serde_json::Map::new();
    let mut unset = vec![];
    for (k, v) in trial.get_envs() {
        let k = k.to_str()?.to_string();
        match v {
            Some(v) => {
                env.insert(k, v.to_str()?.into());
            }
            None => unset.push(k),
        }
    }
    let cwd = match trial.get_current_dir() {
        Some(d) => d.to_path_buf(),
        None => std::env::current_dir().ok()?,
    };
    let (script, module, first) = match &launch.target {
        Target::Script(s) => (Some(s.clone()), None, s.clone()),
        // runpy puts the module's file in argv[0], as `python -m` does
        Target::Module(m) => (None, Some(m.clone()), "-m".to_string()),
    };
    let line = serde_json::json!({
        "argv": std::iter::once(first).chain(launch.args).collect::<Vec<_>>(),
        "script": script,
        "module": module,
        "env": env,
        "unset": unset,
        "cwd": cwd.to_str()?,
        "ack": ack.to_str()?,
    });
    serde_json::to_vec(&line).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    /// A script or `-m module` after interpreter options is a launch; `-c`, stdin, torchrun and an
    /// option the warm process could not reproduce are not.
    #[test]
    fn python_launches_are_told_from_other_commands() {
        let l = python_launch(&v(&[
            "/x/bin/python3.11",
            "-u",
            "-X",
            "importtime",
            "t.py",
            "--b",
            "{batch}",
        ]))
        .unwrap();
        assert_eq!(
            l.interpreter,
            v(&["/x/bin/python3.11", "-u", "-X", "importtime"])
        );
        assert_eq!(l.target, Target::Script("t.py".into()));
        assert_eq!(l.args, v(&["--b", "{batch}"]));
        let m = python_launch(&v(&["python", "-m", "pkg.train", "a"])).unwrap();
        assert_eq!(m.target, Target::Module("pkg.train".into()));
        assert_eq!(m.args, v(&["a"]));
        assert_eq!(
            python_launch(&v(&["python", "-mpkg"])).unwrap().target,
            Target::Module("pkg".into())
        );
        for not in [
            &["python", "-c", "print(1)"][..],
            &["python", "-"],
            &["python"],
            &["torchrun", "--nproc-per-node", "2", "t.py"],
            &["pythonista", "t.py"],
            &["python", "--version"],
            &["bash", "-c", "python t.py"],
        ] {
            assert_eq!(python_launch(&v(not)), None, "{not:?}");
        }
    }

    /// The frameworks a script imports at its top level are read from its text; indented imports,
    /// other packages and repeats are not.
    #[test]
    fn a_scripts_top_level_framework_imports_are_read_from_its_text() {
        let source = "\"\"\"Train.\"\"\"\nimport os, numpy as np\nimport torch.nn as nn\n\
            from lightning.pytorch import Trainer\nimport torch\nimport mylib\n\
            def f():\n    import transformers\nfrom . import local\n";
        assert_eq!(
            framework_imports(source),
            v(&["numpy", "torch", "lightning"])
        );
        assert!(framework_imports("print(1)\n").is_empty());
    }

    /// The hand-off carries what a fresh trial gets: its argv after the script, the environment the
    /// workload set (and unset), the working directory.
    #[test]
    fn the_handoff_carries_the_trials_argv_and_environment() {
        let mut c = Command::new("python3");
        c.args(["-u", "train.py", "--batch", "12"])
            .env("BATCHFIT_BATCH", "12")
            .env_remove("GONE")
            .current_dir("/tmp");
        let h: serde_json::Value =
            serde_json::from_slice(&handoff(&c, std::path::Path::new("/t/ack")).unwrap()).unwrap();
        assert_eq!(h["argv"], serde_json::json!(["train.py", "--batch", "12"]));
        assert_eq!(h["script"], "train.py");
        assert_eq!(h["module"], serde_json::Value::Null);
        assert_eq!(h["env"]["BATCHFIT_BATCH"], "12");
        assert_eq!(h["unset"], serde_json::json!(["GONE"]));
        assert_eq!(h["cwd"], "/tmp");
        assert_eq!(h["ack"], "/t/ack");
        assert!(handoff(&Command::new("torchrun"), std::path::Path::new("/a")).is_none());
    }
}
