//! The user's own training command, unchanged (`batchfit probe --exec -- CMD ARG…`): a plain PyTorch
//! script, Lightning, Hugging Face Trainer, torchrun — the job the user will actually run, so the proof
//! holds for it and not only for a replay of its model.
//!
//! Each trial runs the command fresh with `{batch}`, `{steps}` and `{accumulation}` substituted in its
//! arguments (`{{batch}}` is a literal `{batch}`) and `BATCHFIT_BATCH`, `BATCHFIT_STEPS`, `BATCHFIT_ACCUMULATION`, `BATCHFIT_TRIAL` and
//! `BATCHFIT_RESULT` added to its environment, and `TMPDIR` (`TEMP`, `TMP`) set to a fresh directory
//! of its own, removed when the trial ends — nothing else of the user's environment is changed (no
//! malloc tuning; threads only when `--threads` asks) but for batchfit's start-up hook
//! ([`observe`]: `PYTHONPATH` with batchfit's `sitecustomize` first, which records what each process
//! reads for the cache key) and the DataLoader watcher in it (`BATCHFIT_OBSERVED`; `--observe off`
//! leaves it unset). The device limits and measures its whole process tree. What the end means:
//!
//! * exit 0 → fits (the device has kept it under the limit); when the command wrote a report
//!   ([`crate::protocol::TrialReport`], `batchfit python-helper`), it must say it trained the size it
//!   was given, with the steps and accumulation asked for, or the trial is an error; when it wrote
//!   none, a DataLoader the watcher saw yield less than the size makes it an error too;
//! * a non-zero exit → the one classifier ([`crate::protocol::classify`]) decides from the output,
//!   the kernel's OOM kills of the tree and the data segment against its limit, plus `--oom-pattern`;
//!   anything else is an error with the output's last line, never a fit and never an out-of-memory;
//! * whatever the exit, a process tree whose anonymous and shared memory (each page once:
//!   [`crate::device::tree`]) went above an `RLIMIT_DATA` limit, which bounds each process alone, is
//!   **over budget** ([`TrialOutcome::OverBudget`]): the job needs more than this budget, so the size
//!   bounds the search like an out-of-memory and is never a fit (an out-of-memory the classifier
//!   proved stays one).

pub mod observe;
pub mod warm;

use crate::plan::schema::ExecInfo;
use crate::protocol::classify::{classify, classify_clean_exit, CleanExit, Evidence, Verdict};
use crate::protocol::{
    AllocatorReport, Finished, FootprintMethod, GpuMeasure, Placement, StepTime, TreeFigure,
    TreeMeasure, Trial, TrialDetails, TrialOutcome, TrialReport, TrialRequest, Workload,
    REPORT_SCHEMA,
};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// `batchfit python-helper`: the optional helper for training scripts (standard library only). One
/// source: the same file is the `batchfit.batchfit_trial` module of the Python package (the wheel).
pub const PYTHON_HELPER: &str = include_str!("../../../python/batchfit/batchfit_trial.py");

/// The placeholders substituted in the command's arguments.
pub const PLACEHOLDERS: [&str; 3] = ["{batch}", "{steps}", "{accumulation}"];

/// The environment variables set in every trial (values per trial).
pub const ENVIRONMENT: [&str; 9] = [
    "BATCHFIT_BATCH",
    "BATCHFIT_STEPS",
    "BATCHFIT_ACCUMULATION",
    "BATCHFIT_TRIAL",
    "BATCHFIT_RESULT",
    // set by the process runner: marks every process of the trial, so that all are ended
    crate::device::process::TRIAL_MARKER,
    // the trial's own temporary directory, removed when the trial ends (TEMP and TMP for tools
    // that read those)
    "TMPDIR",
    "TEMP",
    "TMP",
];

/// A user's command as a workload.
pub struct ExecWorkload {
    info: ExecInfo,
    oom_patterns: Vec<regex_lite::Regex>,
    /// `OMP_NUM_THREADS` when the user asked (`--threads`).
    threads: Option<u32>,
    /// Where the trials' reports go.
    results: crate::platform::scratch::Scratch,
    /// The trials' temporary directories (`TMPDIR`): one per trial inside it, removed when the
    /// trial ends ([`Workload::trial_ended`]); the whole directory goes with the workload.
    temp: crate::platform::scratch::Scratch,
    trials: AtomicU32,
    /// The plan's `--world-size`: every rank's report must say the same.
    world_size: Option<u64>,
    /// The command as a Python launch, when its trials may run warm (`--warm`).
    warm: Option<warm::Launch>,
    /// The installed packages the job imported (the first report that named them): what a warm
    /// process imports.
    modules: Mutex<Option<Vec<String>>>,
    /// Trials of fewer steps than this end once their report is complete ([`Self::ending_early_below`]);
    /// the others run to the job's own end.
    ends_early_below: u32,
    /// The folder holding batchfit's start-up hook, `sitecustomize.py`, and the helper it imports.
    site: Option<PathBuf>,
    /// Whether the DataLoader watcher in the start-up hook is on (`--observe`).
    observing: bool,
}

/// `arg` with each placeholder `{name}` replaced by `value(name)`; a doubled one, `{{name}}`, is the
/// literal `{name}` (for a command that itself takes a `{batch}` template).
fn expand(arg: &str, value: &dyn Fn(&str) -> String) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    'scan: while !rest.is_empty() {
        for p in PLACEHOLDERS {
            let escaped = format!("{{{p}}}");
            if rest.starts_with(&escaped) {
                out.push_str(p);
                rest = &rest[escaped.len()..];
                continue 'scan;
            }
            if rest.starts_with(p) {
                out.push_str(&value(p));
                rest = &rest[p.len()..];
                continue 'scan;
            }
        }
        let c = rest.chars().next().expect("not empty");
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Whether `arg` holds the placeholder `p` (`{batch}`, …) to be replaced, not only escaped
/// (`{{batch}}`).
pub fn has_placeholder(arg: &str, p: &str) -> bool {
    expand(arg, &|q| if q == p { "\0".into() } else { String::new() }).contains('\0')
}

/// The argv of a trial: placeholders replaced (`{{batch}}` stays a literal `{batch}`).
pub fn substitute(argv: &[String], req: &TrialRequest) -> Vec<String> {
    let value = |p: &str| match p {
        "{batch}" => req.batch.to_string(),
        "{steps}" => req.steps.to_string(),
        _ => req.accumulation.to_string(),
    };
    argv.iter().map(|a| expand(a, &value)).collect()
}

impl ExecWorkload {
    pub fn new(
        info: ExecInfo,
        oom_patterns: Vec<regex_lite::Regex>,
        threads: Option<u32>,
    ) -> std::io::Result<Self> {
        // what a killed batchfit's trials left goes before this one's start: their processes, then
        // (in `scratch::make`) their folders
        crate::device::process::end_abandoned_trials();
        Ok(ExecWorkload {
            info,
            oom_patterns,
            threads,
            results: crate::platform::scratch::make("batchfit-reports-")?,
            temp: crate::platform::scratch::make("batchfit-tmp-")?,
            trials: AtomicU32::new(0),
            world_size: None,
            warm: None,
            modules: Mutex::new(None),
            ends_early_below: 0,
            site: None,
            observing: false,
        })
    }

    /// Writes batchfit's start-up hook into the workload's own folder (what each process reads, for
    /// the cache key) and watches the trials' torch DataLoaders with it ([`observe`]) when `on`.
    pub fn with_observe(mut self, on: bool) -> std::io::Result<Self> {
        self.site = Some(observe::install(&self.temp.path().join("site"))?);
        self.observing = on;
        Ok(self)
    }

    /// The start-up hook's environment, with `observed` as the folder of the watcher's observations
    /// (none when it is off).
    fn observe_env(&self, observed: Option<&Path>) -> Vec<(String, std::ffi::OsString)> {
        let Some(site) = &self.site else {
            return vec![];
        };
        let path = observe::python_path(site, std::env::var_os("PYTHONPATH"));
        let mut env = vec![("PYTHONPATH".into(), path)];
        if let Some(o) = observed {
            env.push((observe::OBSERVED.into(), o.as_os_str().to_owned()));
        }
        env
    }

    /// A fresh folder of observations for trial `n` (removed when the trial ends): `None` when the
    /// watcher is off or the folder cannot be made (the trial is then judged without it).
    fn fresh_observed(&self, n: u32) -> Option<PathBuf> {
        self.site.as_ref().filter(|_| self.observing)?;
        let dir = self.temp.path().join(format!("observed-{n}"));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).ok()?;
        Some(dir)
    }

    /// Trials of fewer than `steps` steps (the search's exploration, which never confirms an answer)
    /// end a grace after their report is complete, without waiting for the job's teardown. A trial
    /// that can confirm an answer runs to the job's own end: what a job does after its last step
    /// (an evaluation pass, a prediction, a checkpoint) may need more memory than the steps did, and
    /// a size whose job runs out of memory there does not fit. Without it (`verify`), every trial
    /// runs to the end.
    pub fn ending_early_below(mut self, steps: u32) -> Self {
        self.ends_early_below = steps;
        self
    }

    /// Trials after the first may run in warm processes ([`warm`]) when `on` and the command is a
    /// Python interpreter running a script or a module.
    pub fn with_warm(mut self, on: bool) -> Self {
        self.warm = on.then(|| warm::python_launch(&self.info.argv)).flatten();
        self
    }

    /// The environment every trial gets alike: `--threads`, a sweep's point.
    fn common_env(&self) -> Vec<(String, String)> {
        let mut v = vec![];
        if let Some(t) = self.threads {
            v.push(("OMP_NUM_THREADS".into(), t.to_string()));
        }
        if let Some(p) = &self.info.sweep_point {
            v.push((p.variable.clone(), p.value.to_string()));
        }
        v
    }

    /// The world size the plan is for (`--world-size`): the ranks' reports are checked against it.
    pub fn with_world_size(mut self, world_size: Option<u64>) -> Self {
        self.world_size = world_size;
        self
    }

    /// Keeps the packages the first report that says so says the job imported (for
    /// [`Workload::warm_command`]; none: a warm process saves only the interpreter's start).
    fn learn_modules(&self, report: Option<&TrialReport>) {
        let Some(m) = report.and_then(|r| r.modules.clone()) else {
            return;
        };
        self.modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(m);
    }
}

/// Removes the directory `dir` and everything in it, without following links; directories the
/// command made unwritable (which keep their entries from a batchfit that is not root) are made
/// writable first. What cannot be removed is left to the per-probe directory's removal.
fn remove_tree(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if std::fs::remove_dir_all(dir).is_err()
        && std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
    {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        writable_tree(dir);
        let _ = std::fs::remove_dir_all(dir);
    }
}

impl Drop for ExecWorkload {
    fn drop(&mut self) {
        // (`temp` and `results` are removed by their own drop; a tree the command made unwritable
        // is made removable first)
        writable_tree(self.temp.path());
    }
}

/// Makes every directory under `dir` writable by its owner (links not followed), so that it can be
/// removed.
fn writable_tree(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700));
            writable_tree(&p);
        }
    }
}

/// The last `n` non-empty lines of stderr, then of stdout.
fn tail(f: &Finished, n: usize) -> Vec<String> {
    crate::device::process::output_tail(&f.stderr, &f.stdout, n)
}

/// The line that says what went wrong: the last non-empty line of stderr (a Python traceback ends
/// with the exception), else of stdout.
fn error_line(f: &Finished) -> String {
    let last = |s: &str| {
        s.lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(|l| l.chars().take(400).collect::<String>())
    };
    last(&f.stderr)
        .or_else(|| last(&f.stdout))
        .unwrap_or_else(|| "(no output)".into())
}

/// Reads the report at `path`: `Ok(None)` when the command wrote none.
/// A report is a few KB of JSON; a larger file is not one (and is never read whole).
const REPORT_MAX_BYTES: u64 = 4 << 20;

fn read_report(path: &Path) -> Result<Option<TrialReport>, String> {
    use crate::platform::files::{open_regular, OpenError};
    use std::io::Read;
    // The command may have put anything at the report's path: only a regular file is read, never
    // through a symbolic link (batchfit runs as root), never waiting on a FIFO, never more than
    // REPORT_MAX_BYTES (a link to /dev/zero was read until batchfit was killed for memory).
    let not_regular = |kind: &str| {
        format!(
            "the trial report {} is not a regular file ({kind}): batchfit reads only a file the \
             command wrote there",
            path.display()
        )
    };
    let file = match open_regular(path, std::fs::OpenOptions::new().read(true), false) {
        Ok(f) => f,
        Err(OpenError::Missing(_)) => return Ok(None),
        Err(OpenError::Link(_)) => {
            return Err(format!(
                "the trial report {} is a symbolic link, not a file the command wrote: batchfit \
                 does not follow links there (batchfit_trial's report() writes a regular file)",
                path.display()
            ))
        }
        Err(OpenError::Io(e)) => {
            return Err(format!(
                "cannot read the trial report {}: {e}",
                path.display()
            ))
        }
        Err(OpenError::Directory) => return Err(not_regular("a directory")),
        Err(OpenError::NotRegular(kind)) => return Err(not_regular(kind)),
    };
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read the trial report {}: {e}", path.display()))?;
    if meta.len() > REPORT_MAX_BYTES {
        return Err(format!(
            "the trial report {} holds {} bytes, more than a report's {REPORT_MAX_BYTES}: it is \
             not a batchfit trial report",
            path.display(),
            meta.len()
        ));
    }
    let mut text = String::new();
    file.take(REPORT_MAX_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read the trial report {}: {e}", path.display()))?;
    let r: TrialReport = serde_json::from_str(&text).map_err(|e| {
        if ["NaN", "Infinity"].iter().any(|w| text.contains(w)) {
            format!(
                "the command's trial report {} holds NaN or Infinity, which is not a number (JSON \
                 has none): a step time or count it reported was not measured ({e})",
                path.display()
            )
        } else {
            format!("the command's trial report is not valid ({e})")
        }
    })?;
    if r.schema != REPORT_SCHEMA {
        return Err(format!(
            "the command's trial report has schema {:?}, not {REPORT_SCHEMA:?} (get the helper of \
             this batchfit: batchfit python-helper)",
            r.schema
        ));
    }
    Ok(Some(r))
}

/// Reads every rank's report: rank 0's at `path`, rank r's at `path.rank<r>` (the helper's names).
/// `Ok(None)` when no rank wrote one; an error when some ranks did and others did not, when the
/// ranks disagree on the world size, or when it is not the plan's.
fn read_reports(
    path: &Path,
    plan_world: Option<u64>,
) -> Result<Option<(TrialReport, Vec<TrialReport>)>, String> {
    let rank_path = |r: u32| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".rank{r}"));
        PathBuf::from(p)
    };
    let Some(first) = read_report(path)? else {
        if rank_path(1).exists() {
            return Err(format!(
                "rank 1 wrote a trial report ({}) but rank 0 wrote none",
                rank_path(1).display()
            ));
        }
        return Ok(None);
    };
    let world = first.world_size.max(1);
    if let Some(w) = plan_world.filter(|&w| w != u64::from(world)) {
        return Err(format!(
            "the command's report says world size {world}, but the plan is for --world-size {w}: \
             the job ran another number of ranks than the plan is for"
        ));
    }
    let mut others = vec![];
    for r in 1..world {
        let Some(rep) = read_report(&rank_path(r))? else {
            return Err(format!(
                "rank {r} of {world} wrote no trial report ({}): not every rank is shown to have \
                 trained the size",
                rank_path(r).display()
            ));
        };
        if rep.world_size != world || rep.rank != r {
            return Err(format!(
                "the report of rank {r} says rank {} of world size {}, but rank 0's says world size \
                 {world}",
                rep.rank, rep.world_size
            ));
        }
        others.push(rep);
    }
    if rank_path(world).exists() {
        return Err(format!(
            "a report of rank {world} exists, but rank 0's says world size {world}"
        ));
    }
    Ok(Some((first, others)))
}

/// Why a report does not match the request, if it does not. The accumulation is checked when the
/// command was given it (`{accumulation}`) or asked for it (the helper's `accumulation()`).
fn mismatch(r: &TrialReport, req: &TrialRequest, takes_accumulation: bool) -> Option<String> {
    let mut why = vec![];
    if r.batch != req.batch {
        why.push(format!("the job trained {}, not {}", r.batch, req.batch));
    }
    if let Some(n) = r.samples.filter(|&n| n < r.batch) {
        why.push(format!(
            "the job trained {n}, not {} (its largest micro-batch had {n} samples: a dataset \
             shorter than the batch?)",
            req.batch
        ));
    }
    if r.steps < u64::from(req.steps) {
        why.push(format!("{} optimizer steps (asked {})", r.steps, req.steps));
    }
    if (r.reads_accumulation || takes_accumulation) && r.accumulation != u64::from(req.accumulation)
    {
        why.push(format!(
            "accumulation {} (asked {})",
            r.accumulation, req.accumulation
        ));
    }
    (!why.is_empty()).then(|| {
        format!(
            "the command did not train the size it was given: its report says {}",
            why.join(", ")
        )
    })
}

/// Whether the reports (rank 0's, `others`) are the complete evidence of `req`: every step asked for
/// done, at the size and accumulation asked.
fn complete(first: &TrialReport, others: &[TrialReport], req: &TrialRequest) -> bool {
    std::iter::once(first)
        .chain(others)
        .all(|r| r.steps == u64::from(req.steps) && mismatch(r, req, false).is_none())
}

/// Why a trial that exited 0 was not bounded by its limit as a whole, if it was not (and not shown
/// to be over budget: [`over_budget`]).
fn unbounded(m: &crate::protocol::TreeMeasure) -> Option<String> {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    if !m.unattributed.is_empty() {
        return Some(format!(
            "the command exited 0, but a process left its tree ({}: a daemon out of its session \
             and environment) while other trials ran at once with no memory cgroup, so it cannot \
             be told to be this trial's or another's: its memory is not measured, and this size \
             is not proven to fit; run with --parallel 1, or --cpu-limit cgroup",
            m.unattributed.join(", ")
        ));
    }
    if let (Some(limit), Some(escaped)) = (m.cgroup_limit, m.escaped_peak) {
        let total = m.cgroup_peak.unwrap_or(0).saturating_add(escaped);
        if total > limit {
            return Some(format!(
                "the command exited 0, but processes of its tree outside the trial's memory cgroup \
                 held {:.0} MiB of anonymous memory: with the group's {:.0} MiB peak that is above \
                 the {:.0} MiB limit, which did not bound the whole job (a process that left the \
                 cgroup), so this size is not proven to fit",
                mib(escaped),
                mib(m.cgroup_peak.unwrap_or(0)),
                mib(limit)
            ));
        }
    }
    // the tree's figure above the limit, measured with an overcount: not shown either way
    if let (Some(limit), Some(tree), Some(TreeFigure::RssSum)) =
        (m.data_limit, m.pss_peak, m.tree_figure)
    {
        if tree > limit {
            return Some(format!(
                "the command exited 0, but its process tree's anonymous and shared memory ({}; {} \
                 process(es)) peaked at {:.0} MiB, above the {:.0} MiB limit: RLIMIT_DATA bounds \
                 each process's data segment alone, not shared memory or several processes \
                 together, so this size is not proven to fit under the limit, nor shown to need \
                 more (pages shared between its processes were counted once per process; \
                 --cpu-limit cgroup limits and measures the tree as a whole)",
                TreeFigure::RssSum.describe(),
                m.processes,
                mib(tree),
                mib(limit)
            ));
        }
    }
    None
}

/// The trial's process tree went above its limit under `RLIMIT_DATA` (which bounds each process's
/// data segment alone): its anonymous and shared memory, each page once, was above the limit: an
/// over-budget outcome (`then`: what the command did after, for the message).
fn over_budget(m: &crate::protocol::TreeMeasure, then: Option<&str>) -> Option<TrialOutcome> {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let (limit, tree) = (m.data_limit?, m.pss_peak?);
    if tree <= limit || m.tree_figure != Some(TreeFigure::Pss) {
        return None;
    }
    let mut message = format!(
        "the process tree's anonymous and shared memory ({}; {} process(es)) peaked at {:.0} \
         MiB, above the {:.0} MiB limit: this size needs more than the budget (RLIMIT_DATA bounds \
         each process's data segment alone, so it did not stop the job; --cpu-limit cgroup limits \
         the tree as a whole)",
        TreeFigure::Pss.describe(),
        m.processes,
        mib(tree),
        mib(limit)
    );
    if let Some(then) = then {
        message.push_str("; ");
        message.push_str(then);
    }
    Some(TrialOutcome::OverBudget {
        message,
        measure: "tree-pss".into(),
        peak_bytes: tree,
        limit_bytes: limit,
    })
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

impl Workload for ExecWorkload {
    fn command(&self, req: &TrialRequest, at: &Placement) -> (Command, Trial) {
        let n = self.trials.fetch_add(1, Ordering::SeqCst);
        let report = self.results.path().join(format!("trial-{n}.json"));
        let _ = std::fs::remove_file(&report);
        // a fresh temporary directory of its own: whatever the command leaves there (its files,
        // multiprocessing's pymp-*, a DataLoader's shared memory files) goes when the trial ends
        let temp = self.temp.path().join(format!("trial-{n}"));
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&temp);
        let argv = substitute(&self.info.argv, req);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env("TMPDIR", &temp)
            .env("TEMP", &temp)
            .env("TMP", &temp)
            .env("BATCHFIT_BATCH", req.batch.to_string())
            .env("BATCHFIT_STEPS", req.steps.to_string())
            .env("BATCHFIT_ACCUMULATION", req.accumulation.to_string())
            .env("BATCHFIT_TRIAL", n.to_string())
            .env("BATCHFIT_RESULT", &report);
        for (k, v) in self.common_env() {
            cmd.env(k, v);
        }
        let observed = self.fresh_observed(n);
        for (k, v) in self.observe_env(observed.as_deref()) {
            cmd.env(k, v);
        }
        // the cuda device adds CUDA_VISIBLE_DEVICES and PYTORCH_CUDA_ALLOC_CONF itself
        let _ = at;
        let trial = Trial {
            request: *req,
            number: n,
            report: Some(report),
            temp: Some(temp),
            observed,
            warm_ack: None,
        };
        (cmd, trial)
    }

    fn measured_by_device(&self) -> bool {
        true
    }

    fn trial_ended(&self, trial: &Trial) {
        for dir in trial.temp.iter().chain(&trial.observed) {
            remove_tree(dir);
        }
        if let Some(ack) = &trial.warm_ack {
            let _ = std::fs::remove_file(ack);
        }
    }

    fn warm_modules(&self) -> Option<Vec<String>> {
        self.warm.as_ref()?;
        self.modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn warm_guess(&self) -> Vec<String> {
        let Some(warm::Target::Script(path)) = self.warm.as_ref().map(|l| &l.target) else {
            return vec![];
        };
        // a regular file of a script's size only: a FIFO's read would wait for a writer
        let script = std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() <= 1 << 20);
        (script.then(|| std::fs::read(path).ok()).flatten())
            .map(|source| warm::framework_imports(&String::from_utf8_lossy(&source)))
            .unwrap_or_default()
    }

    fn warm_command(&self, modules: &[String], serve: bool) -> Option<Command> {
        let launch = self.warm.as_ref()?;
        // its own temporary directory until the hand-off gives it the trial's
        let temp = self.temp.path().join("warm");
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&temp);
        let mut env = self.common_env();
        for k in ["TMPDIR", "TEMP", "TMP"] {
            env.push((k.into(), temp.display().to_string()));
        }
        let mut cmd = warm::command(launch, modules, &env, serve);
        // the watcher must be in place before the warm process imports torch; the hand-off then
        // gives it the trial's own folder of observations
        for (k, v) in self.observe_env(self.observing.then_some(temp.as_path())) {
            cmd.env(k, v);
        }
        Some(cmd)
    }

    fn warm_handoff(&self, trial: &mut Trial, command: &Command) -> Option<Vec<u8>> {
        self.warm.as_ref()?;
        let ack = self.temp.path().join(format!("warm-ack-{}", trial.number));
        let _ = std::fs::remove_file(&ack);
        let line = warm::handoff(command, &ack)?;
        trial.warm_ack = Some(ack);
        Some(line)
    }

    fn warm_took(&self, trial: &Trial) -> bool {
        trial.warm_ack.as_ref().is_some_and(|a| a.exists())
    }

    fn evidence_in(&self, trial: &Trial) -> bool {
        let (req, Some(path)) = (&trial.request, &trial.report) else {
            return false;
        };
        if req.steps >= self.ends_early_below {
            return false;
        }
        // (a cheap look first: the check runs every few milliseconds while the trial runs)
        std::fs::symlink_metadata(path).is_ok()
            && matches!(read_reports(path, self.world_size),
                        Ok(Some((r, others))) if complete(&r, &others, req))
    }

    fn outcome(&self, trial: &Trial, f: &Finished) -> (TrialOutcome, Option<TrialDetails>) {
        let (req, Some(report_path)) = (trial.request, &trial.report) else {
            return (
                TrialOutcome::Error {
                    message: "internal error: a trial of a command without its report's path"
                        .into(),
                },
                None,
            );
        };
        let observed = trial.observed.as_deref().and_then(observe::read);
        let mut details = details(f, observed.as_ref());
        // a trial batchfit ended after its complete report: the status is that of the kill, and the
        // report (checked again) and the measurements decide
        let outcome = if !f.status.success() && !f.ended_after_report {
            self.failed_exit(f)
        } else {
            self.clean_exit(f, &req, report_path, observed.as_ref(), &mut details)
        };
        (outcome, Some(details))
    }
}

/// What a trial's end means (the module doc's list): a failed exit, then a clean exit's reports
/// and the evidence against a fit, then the fit itself.
impl ExecWorkload {
    /// A non-zero exit that batchfit did not cause: the classifier decides from the output and the
    /// measurements; anything but an out-of-memory is an error that says how the command ended.
    fn failed_exit(&self, f: &Finished) -> TrialOutcome {
        let m = &f.measure;
        let message = format!("{}\n{}", f.stderr, f.stdout);
        let verdict = classify(&Evidence {
            message: &message,
            data_peak: m.data_peak,
            data_limit: m.data_limit,
            kernel_oom_kill: m.group_oom_kills.is_some_and(|n| n > 0),
            extra_markers: &self.oom_patterns,
            output: true,
            // a memory cgroup's limit acts on its peak: an out-of-memory far below it is not this
            // limit's
            limit_peak: m.cgroup_peak.zip(m.cgroup_limit),
            machine_oom_kill: m.machine_oom_kill,
            ..Default::default()
        });
        let line = match verdict {
            Verdict::Oom(message) => return oom(m, message),
            // the classifier's account of the evidence it weighed says more than the output's end
            Verdict::OomRejected(why) => why,
            Verdict::Error(_) => error_line(f),
        };
        let message = format!("the command failed ({}): {line}", how_it_ended(f.status));
        // a tree above its limit needs more than the budget, however it then ended
        over_budget(m, Some(&format!("then {message}"))).unwrap_or(TrialOutcome::Error { message })
    }

    /// An exit 0, or one batchfit caused after the complete report: the reports, the evidence
    /// against a fit, the limit's bound on the whole tree, then the fit. `details` gets the reports
    /// and the step time as they are read.
    fn clean_exit(
        &self,
        f: &Finished,
        req: &TrialRequest,
        report_path: &Path,
        observed: Option<&observe::Observed>,
        details: &mut TrialDetails,
    ) -> TrialOutcome {
        let (report, others) = match self.reports(f, req, report_path) {
            Ok(r) => r,
            Err(message) => return TrialOutcome::Error { message },
        };
        let against = self
            .evidence_against_fit(f, req, report.as_ref(), &others)
            .or_else(|| {
                self.untrained(req, report.as_ref(), &others, observed)
                    .map(|message| TrialOutcome::Error { message })
            });
        if let Some(against) = against {
            details.report = report;
            details.rank_reports = others;
            return against;
        }
        details.rank_reports = others;
        let m = &f.measure;
        if let Some(over) = over_budget(m, None) {
            details.report = report;
            return over;
        }
        let Some(peak) = limited_peak(m).filter(|&p| p > 0) else {
            return TrialOutcome::Error {
                message: "the command exited 0, but no memory of its process tree was measured \
                          (it ended before the first sample)"
                    .into(),
            };
        };
        // The limit must have bounded the whole job: memory of the tree outside its cgroup, or
        // (under RLIMIT_DATA, which bounds each process's data segment alone) the tree's anonymous
        // and shared memory above the limit counted with shared pages once per process, means the
        // fit is not proven under it (counted once per page, it is over budget: above).
        if let Some(message) = unbounded(m) {
            details.report = report;
            return TrialOutcome::Error { message };
        }
        let (outcome, step_time) = fit(m, req, report.as_ref(), peak);
        details.step_time = Some(step_time);
        details.report = report;
        outcome
    }

    /// The trial's reports (rank 0's, if it wrote one, and the other ranks'), once the packages
    /// they name are learned; an error when they cannot be read, or when batchfit ended the trial on
    /// a report that, read again, is not complete.
    fn reports(
        &self,
        f: &Finished,
        req: &TrialRequest,
        path: &Path,
    ) -> Result<(Option<TrialReport>, Vec<TrialReport>), String> {
        let (report, others) = match read_reports(path, self.world_size)? {
            Some((r, o)) => (Some(r), o),
            None => (None, vec![]),
        };
        self.learn_modules(report.as_ref());
        if f.ended_after_report && !report.as_ref().is_some_and(|r| complete(r, &others, req)) {
            return Err(
                "internal error: batchfit ended the trial after its report, but the \
                        report read then does not show every step asked for"
                    .into(),
            );
        }
        Ok((report, others))
    }

    /// Exit 0 is not a fit when the trial's own group counted an OOM kill, the allocator counted
    /// an OOM, a descendant was killed or left running, or the output shows an out-of-memory the
    /// job caught ([`classify_clean_exit`]); an error with the tree above its limit is over budget.
    fn evidence_against_fit(
        &self,
        f: &Finished,
        req: &TrialRequest,
        report: Option<&TrialReport>,
        others: &[TrialReport],
    ) -> Option<TrialOutcome> {
        let m = &f.measure;
        let allocator_ooms = report
            .into_iter()
            .chain(others)
            .filter_map(|r| r.cuda.as_ref())
            .map(|c| c.ooms)
            .sum();
        let output = format!("{}\n{}", f.stderr, f.stdout);
        let verdict = classify_clean_exit(&CleanExit {
            group_oom_kills: m.group_oom_kills.unwrap_or(0),
            allocator_ooms,
            killed_descendants: &m.killed_descendants,
            left_behind: &m.left_behind,
            output: &output,
            extra_markers: &self.oom_patterns,
            steps_done: report.is_some_and(|r| complete(r, others, req)),
        })?;
        Some(match verdict {
            Verdict::Oom(message) => oom(m, message),
            Verdict::Error(message) | Verdict::OomRejected(message) => {
                over_budget(m, Some(&format!("and {message}")))
                    .unwrap_or(TrialOutcome::Error { message })
            }
        })
    }

    /// Why the trial did not train the size it was given, if it did not: the helper's report is
    /// the job's own word (every rank's); without one, what its DataLoaders yielded.
    fn untrained(
        &self,
        req: &TrialRequest,
        report: Option<&TrialReport>,
        others: &[TrialReport],
        observed: Option<&observe::Observed>,
    ) -> Option<String> {
        if report.is_none() {
            return observe::short(observed, req.batch);
        }
        // the job's word is the size it configured; its loader says what it trained
        if let Some(why) = observe::shorter_than_its_own_batch(observed, req.batch) {
            return Some(why);
        }
        let takes = self
            .info
            .argv
            .iter()
            .any(|a| has_placeholder(a, "{accumulation}"));
        report
            .into_iter()
            .chain(others)
            .enumerate()
            .find_map(|(k, r)| {
                mismatch(r, req, takes).map(|w| if k == 0 { w } else { format!("rank {k}: {w}") })
            })
    }
}

/// What a trial's record keeps whatever its outcome: the output's end and the tree's measurements
/// (the judgment adds the reports and the step time as it reads them).
fn details(f: &Finished, observed: Option<&observe::Observed>) -> TrialDetails {
    let m = &f.measure;
    TrialDetails {
        output_tail: tail(f, crate::device::process::TAIL_LINES),
        log: m
            .log
            .as_ref()
            .map(|p| format!("{}.stdout/.stderr", p.display())),
        report: None,
        tree_rss_peak_bytes: m.rss_peak,
        processes: Some(m.processes),
        left_behind: m.left_running,
        step_time: None,
        gpu_peaks: vec![],
        tree_anon_peak_bytes: m.anon_peak,
        tree_pss_peak_bytes: m.pss_peak,
        tree_measure: m.pss_peak.and(m.tree_figure),
        cgroup_anon_peak_bytes: m.cgroup_anon_peak,
        rank_reports: vec![],
        ended_after_report: f.ended_after_report,
        warm: false,
        forked: false,
        dataloader_batch: observe::largest(observed),
    }
}

/// What the limit acts on: the cgroup's peak, else the largest data segment of the tree. The
/// tree's summed RSS is no fallback: it is not what the limit acts on (a trial that exited 0 with
/// no sample at all is an error).
fn limited_peak(m: &TreeMeasure) -> Option<u64> {
    m.cgroup_peak.or(m.data_peak)
}

/// An out-of-memory the classifier proved, with the tree's peaks.
fn oom(m: &TreeMeasure, message: String) -> TrialOutcome {
    TrialOutcome::Oom {
        message,
        peak_bytes: limited_peak(m),
        rss_peak_bytes: m.rss_peak,
        gpu: None,
    }
}

/// How a failed command ended, for its error message.
fn how_it_ended(status: std::process::ExitStatus) -> String {
    match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(c), _) => format!("exit code {c}"),
        (_, Some(s)) => format!("signal {s}"),
        _ => "an unknown status".into(),
    }
}

/// A trial that fit at `peak`, with where its step time came from. The allocator's view goes with
/// it (the cuda device adds NVML's, which decides); a trial that fit only by flushing the cache
/// bounds the search, as for batchfit's own trials.
fn fit(
    m: &TreeMeasure,
    req: &TrialRequest,
    report: Option<&TrialReport>,
    peak: u64,
) -> (TrialOutcome, StepTime) {
    let (step_seconds, source) = step_time(m, req, report);
    let allocator = report
        .and_then(|r| r.cuda.as_ref())
        .map(|c| AllocatorReport {
            peak_allocated_bytes: c.peak_allocated_bytes,
            peak_reserved_bytes: c.peak_reserved_bytes,
            reserved_bytes: c.reserved_bytes,
            alloc_retries: c.alloc_retries,
            ooms: c.ooms,
        });
    let gpu = allocator.map(|a| GpuMeasure {
        nvml_peak_bytes: 0,
        method: FootprintMethod::NvmlDeviceDelta,
        allocator: Some(a),
    });
    (
        TrialOutcome::completed(peak, m.rss_peak, step_seconds, gpu),
        source,
    )
}

/// Seconds per micro-batch step: the report's median step (the first, which warms up, left out
/// when there are more), else the wall clock over the steps asked for.
fn step_time(m: &TreeMeasure, req: &TrialRequest, report: Option<&TrialReport>) -> (f64, StepTime) {
    let reported = report.and_then(|r| {
        let s = if r.step_seconds.len() >= 2 {
            &r.step_seconds[1..]
        } else {
            &r.step_seconds[..]
        };
        median(s)
    });
    match reported {
        Some(s) => (s / f64::from(req.accumulation.max(1)), StepTime::Report),
        None => (
            m.seconds / f64::from(req.steps.max(1)) / f64::from(req.accumulation.max(1)),
            StepTime::WallClock,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{{batch}}` is the literal `{batch}` (a command that takes a template of its own); `{batch}`
    /// is the size, also inside a longer argument.
    #[test]
    fn doubled_braces_escape_a_placeholder() {
        let req = TrialRequest {
            batch: 12,
            steps: 3,
            fresh: true,
            accumulation: 2,
        };
        let argv: Vec<String> = [
            "--bs={batch}",
            "{{batch}}",
            "out-{{steps}}-{steps}",
            "{accumulation}{",
            "{x}",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            substitute(&argv, &req),
            ["--bs=12", "{batch}", "out-{steps}-3", "2{", "{x}"]
        );
        assert!(has_placeholder("--bs={batch}", "{batch}"));
        assert!(!has_placeholder("{{batch}}", "{batch}"));
        assert!(has_placeholder("{{batch}}{batch}", "{batch}"));
    }
}
