//! `--exec`: the user's command as the workload, validated from its arguments. The command given as
//! one string is split as a shell would (and what a shell would have acted on is refused or
//! warned), the program must be found, its placeholders are checked for typos, the built-in
//! model's flags are refused, its fingerprint files hashed and its out-of-memory patterns compiled.

use super::{BackendChoice, ConfigError, SweepParam};
use crate::cli::{
    CpuLimitArg, IsolationArg, ObserveArg, OptimizerArg, PrecisionArg, ProbeArgs, WarmArg,
};
use crate::plan::schema::{exec_fingerprint, ExecInfo, ExecKind, FileHash};
use crate::platform::files;

/// `--exec`: the command and how its trials are judged and limited.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// The plan's description of it (argv, fingerprint, environment set).
    pub info: ExecInfo,
    pub oom_patterns: Vec<regex_lite::Regex>,
    /// `--threads`, when given: `OMP_NUM_THREADS` of every trial (else the user's environment).
    pub threads: Option<u32>,
    pub cpu_limit: CpuLimitArg,
    /// Trials after the first may run in warm processes (`--warm`; a Python launch).
    pub warm: bool,
    /// Warm trials may fork from a fork server where the limit is `RLIMIT_DATA` (`--warm auto` or
    /// `on`; not `ahead`).
    pub fork: bool,
    /// The trials' torch DataLoaders are watched (`--observe`).
    pub observe: bool,
}

/// The two ways to give `--exec` its command, for the messages that refuse another.
pub const EXEC_FORMS: &str = "give it after `--`, as separate words (batchfit probe --exec -- python \
     train.py --batch-size {batch}), or as one quoted string (batchfit probe --exec 'python train.py \
     --batch-size {batch}')";

/// `--exec 'CMD ARG…'`: the command given as one string becomes the command after `--`, split into
/// words as a POSIX shell splits them (quotes and backslashes; no shell runs it, nothing is
/// expanded), so the two forms are the same probe (argv, fingerprint, cache key), with the warnings
/// of [`shell_syntax`]. `None` when there is no string to split.
pub(super) fn exec_words(a: &ProbeArgs) -> Result<Option<(ProbeArgs, Vec<String>)>, ConfigError> {
    let Some(Some(line)) = &a.exec else {
        return Ok(None);
    };
    if !a.command.is_empty() {
        return Err(ConfigError(format!(
            "--exec was given the command twice, as {} and after `--` ({}); {EXEC_FORMS}, not both",
            crate::output::env::shell_quote(line),
            a.command.join(" ")
        )));
    }
    let words = shell_words::split(line).map_err(|e| {
        ConfigError(format!(
            "--exec {}: the command cannot be split into words ({e}); {EXEC_FORMS}",
            crate::output::env::shell_quote(line)
        ))
    })?;
    if words.is_empty() {
        return Err(ConfigError(format!(
            "--exec was given an empty command; {EXEC_FORMS}"
        )));
    }
    let warnings = shell_syntax(line, &words)?;
    let mut b = a.clone();
    b.exec = Some(None);
    b.command = words;
    Ok(Some((b, warnings)))
}

/// The words of a command given as one string that a shell would have acted on, though none runs
/// it: an operator word (`>`, `|`, `&&`, …) is refused, since the job would get it as an argument
/// and its output would go nowhere it was sent; a `$NAME` is kept as written, with a warning (a
/// regular expression may mean it). A command that runs its own shell (`sh -c '…'`) holds these
/// inside one word and is not touched.
fn shell_syntax(line: &str, words: &[String]) -> Result<Vec<String>, ConfigError> {
    const OPERATORS: &[&str] = &[
        ">", ">>", "<", "<<", "|", "||", "&&", ";", "&", "2>", "2>>", "2>&1", "&>", ">&",
    ];
    let fix = |what: &str| {
        format!(
            "no shell runs a command given to --exec, so {what}; run it through one: batchfit \
             probe --exec -- sh -c {}",
            crate::output::env::shell_quote(line)
        )
    };
    let redirects = |w: &str| {
        [">", "1>", "2>", "&>", "|"]
            .iter()
            .any(|p| w.starts_with(p))
    };
    if let Some(op) = words
        .iter()
        .find(|w| OPERATORS.contains(&w.as_str()) || redirects(w))
    {
        return Err(ConfigError(format!(
            "--exec {}: `{op}` would reach the command as an argument; {}",
            crate::output::env::shell_quote(line),
            fix("redirections, pipes and command lists do nothing there")
        )));
    }
    if let Some(e) = tilde_program(line, words) {
        return Err(e);
    }
    let variable = regex_lite::Regex::new(
        r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)|^~[A-Za-z0-9_.-]*(/|$)",
    )
    .expect("a valid expression");
    Ok(words
        .iter()
        .filter_map(|w| variable.find(w))
        .map(|m| {
            format!(
                "the command's `{}` reaches it as written ({})",
                m.as_str(),
                fix("nothing is expanded")
            )
        })
        .take(1)
        .collect())
}

/// A program word that starts with `~` (`~/venv/bin/python`) in a command given as one string: no
/// shell expands it, so the program would be looked for in a folder named `~`. Refused with the path
/// written in full where `HOME` says what a shell would have made of `~/`.
fn tilde_program(line: &str, words: &[String]) -> Option<ConfigError> {
    let program = words.first().filter(|w| w.starts_with('~'))?;
    if std::path::Path::new(program).exists() {
        return None;
    }
    let full = match (program.strip_prefix("~/"), std::env::var("HOME")) {
        (Some(rest), Ok(home)) if !home.is_empty() => {
            format!(" (here {}/{rest})", home.trim_end_matches('/'))
        }
        _ => String::new(),
    };
    Some(ConfigError(format!(
        "--exec {}: no shell runs a command given as one string, so `~` is not expanded and the \
         program `{program}` would be looked for in a folder named `~`; write its path in full{full}, \
         or give the command after `--` so that your shell expands it (batchfit probe --exec -- \
         {line})",
        crate::output::env::shell_quote(line),
    )))
}

/// A command after `--` that is one word with whitespace in it and no such file (`--exec -- "python
/// train.py --batch {batch}"`): quoted by mistake, it would be looked for as one program named by the
/// whole line. Refused with the two forms that work.
fn quoted_command(command: &[String]) -> Result<(), ConfigError> {
    let [word] = command else {
        return Ok(());
    };
    if !word.contains(char::is_whitespace) || std::path::Path::new(word).exists() {
        return Ok(());
    }
    Err(ConfigError(format!(
        "the command after `--` is one quoted word with spaces ({}): batchfit runs its words as \
         given, so it would look for a program named by the whole line; pass the command unquoted, \
         as separate words after `--` (batchfit probe --exec -- {word}), or as one string without \
         `--` (batchfit probe --exec {})",
        crate::output::env::shell_quote(word),
        crate::output::env::shell_quote(word)
    )))
}

/// A `{name}` in the command that is not a placeholder but looks meant as one (`{batc}`,
/// `{BATCH}`, `{batch_size}`, `$batch`): batchfit passes it as written, so the job would get the
/// text, not a size.
fn placeholder_typos(command: &[String]) -> Vec<String> {
    const NAMES: [&str; 3] = ["batch", "steps", "accumulation"];
    const ALIASES: [(&str, &str); 6] = [
        ("batch_size", "batch"),
        ("batchsize", "batch"),
        ("bs", "batch"),
        ("micro_batch", "batch"),
        ("accum", "accumulation"),
        ("step", "steps"),
    ];
    let braces = regex_lite::Regex::new(r"\$?\{([A-Za-z_]+)\}|\$([A-Za-z_]+)").expect("valid");
    let meant = |name: &str| {
        let lower = name.to_lowercase();
        NAMES
            .into_iter()
            .find(|n| n[..1] == lower[..1.min(lower.len())] && strsim::levenshtein(n, &lower) <= 2)
            .or_else(|| ALIASES.iter().find(|(a, _)| *a == lower).map(|(_, n)| *n))
    };
    let has_placeholder = crate::workload::exec::has_placeholder;
    let mut out = vec![];
    for word in command {
        for c in braces.captures_iter(word) {
            let (whole, name) = (&c[0], c.get(1).or(c.get(2)).map_or("", |m| m.as_str()));
            let real = NAMES.contains(&name);
            if whole.starts_with('{') && real {
                continue;
            }
            let given = |n: &str| {
                command
                    .iter()
                    .any(|w| has_placeholder(w, &format!("{{{n}}}")))
            };
            // `${batch}`: the placeholder is replaced, and the job gets a `$` before the size
            let dollar_brace = real && whole.starts_with("${");
            let typo = meant(name)
                .filter(|n| dollar_brace || (!given(n) && !has_placeholder_at(word, whole)));
            if let Some(n) = typo {
                out.push(format!(
                    "the command's `{whole}` (in {}) is not a placeholder batchfit replaces, so the \
                     job gets it as written; did you mean `{{{n}}}`?",
                    crate::output::env::shell_quote(word)
                ));
            }
        }
    }
    out
}

/// Whether `part` of `word` is inside a doubled-brace escape (`{{batch}}`, a literal on purpose).
fn has_placeholder_at(word: &str, part: &str) -> bool {
    word.contains(&format!("{{{part}}}"))
}

/// `--exec -- CMD ARG…`: the command checked (it can be started), its fingerprint files hashed, its
/// patterns compiled, the built-in model's flags refused (the command trains its own model).
pub(super) fn exec(
    a: &ProbeArgs,
    backend: &BackendChoice,
) -> Result<Option<(ExecConfig, Vec<String>)>, ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    if a.exec.is_none() {
        return exec_flags_without_exec(a).map(|()| None);
    }
    if a.command.is_empty() {
        return err(format!("--exec needs the command: {EXEC_FORMS}"));
    }
    quoted_command(&a.command)?;
    model_flags_refused(a)?;
    find_program(&a.command[0])?;
    let mut files = vec![];
    for f in &a.fingerprint_file {
        let sha256 = files::sha256(f)
            .map_err(|e| ConfigError(format!("--fingerprint-file {}: {e}", f.display())))?;
        files.push(FileHash {
            path: f.display().to_string(),
            sha256,
        });
    }
    let oom_patterns = a
        .oom_pattern
        .iter()
        .map(|p| {
            regex_lite::Regex::new(p).map_err(|e| {
                ConfigError(format!(
                    "--oom-pattern {p:?} is not a regular expression: {e}"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    sweep_placeholders_swept(a)?;
    let mut warnings = vec![];
    if !a
        .command
        .iter()
        .any(|w| crate::workload::exec::has_placeholder(w, "{batch}"))
    {
        // said once, in the plan and its summary, unless the trials' reports prove the job read it
        warnings.push(NO_BATCH_WARNING.to_string());
    }
    warnings.extend(placeholder_typos(&a.command));
    let python = crate::workload::exec::warm::python_launch(&a.command).is_some();
    if matches!(a.warm, WarmArg::On | WarmArg::Ahead) && !python {
        return err(format!(
            "--warm {} needs a Python interpreter running a script or a module (python train.py \
             …, python -m pkg …); {} is not one: use --warm auto or off",
            if a.warm == WarmArg::On { "on" } else { "ahead" },
            a.command[0]
        ));
    }
    let threads = a.threads;
    let mut environment: Vec<String> = crate::workload::exec::ENVIRONMENT
        .iter()
        .map(|s| s.to_string())
        .collect();
    if threads.is_some() {
        environment.push("OMP_NUM_THREADS".into());
    }
    let info = ExecInfo {
        kind: ExecKind::Exec,
        fingerprint: exec_fingerprint(&a.command, &files),
        argv: a.command.clone(),
        fingerprint_files: files,
        environment,
        oom_patterns: a.oom_pattern.clone(),
        threads,
        auto_fingerprint_files: crate::plan::schema::auto_fingerprint(&a.command),
        sweep_point: None,
        environment_sha256: crate::plan::schema::environment_sha256(),
        read_files: None,
        python_environment: None,
    };
    if matches!(backend, BackendChoice::Sim(_)) {
        return err(
            "--exec runs your command on a real device, and --backend sim runs nothing (it \
             simulates batchfit's own model from --sim): use --backend cpu, cuda or auto with --exec"
                .into(),
        );
    }
    let exec = ExecConfig {
        info,
        oom_patterns,
        threads,
        cpu_limit: a.cpu_limit,
        warm: python && a.warm != WarmArg::Off,
        fork: python && matches!(a.warm, WarmArg::Auto | WarmArg::On),
        observe: a.observe == ObserveArg::On,
    };
    Ok(Some((exec, warnings)))
}

/// Without `--exec`: no command after `--`, and none of the flags that judge one.
fn exec_flags_without_exec(a: &ProbeArgs) -> Result<(), ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    if !a.command.is_empty() {
        return err(format!(
            "a command after `--` ({}) is probed only with --exec: batchfit probe --exec -- {}",
            a.command.join(" "),
            a.command.join(" ")
        ));
    }
    for (flag, given) in [
        ("--fingerprint-file", !a.fingerprint_file.is_empty()),
        ("--oom-pattern", !a.oom_pattern.is_empty()),
        ("--cpu-limit", a.cpu_limit != CpuLimitArg::Auto),
        ("--warm", a.warm != WarmArg::Auto),
        ("--observe", a.observe != ObserveArg::On),
    ] {
        if given {
            return err(format!(
                "{flag} goes with --exec (probing your own command)"
            ));
        }
    }
    Ok(())
}

/// With `--exec`: none of the flags that describe batchfit's own model.
fn model_flags_refused(a: &ProbeArgs) -> Result<(), ConfigError> {
    let model_flags = [
        ("--model", a.model != "mlp"),
        ("--input", !a.inputs.is_empty()),
        ("--loss", a.loss.is_some()),
        ("--precision", a.precision != PrecisionArg::Fp32),
        ("--optimizer", a.optimizer != OptimizerArg::Adam),
        (
            "--mlp-input/--mlp-hidden/--mlp-classes",
            a.mlp_input != 1024 || a.mlp_hidden != [2048, 2048] || a.mlp_classes != 10,
        ),
        ("--layers", a.layers.is_some()),
        ("--d-model", a.d_model.is_some()),
        ("--heads", a.heads.is_some()),
        ("--seq-len", a.seq_len.is_some()),
        ("--vocab", a.vocab.is_some()),
        ("--image-size", a.image_size.is_some()),
        ("--patch", a.patch.is_some()),
        ("--isolation hybrid", a.isolation == IsolationArg::Hybrid),
        ("--inject-fault", a.inject_fault.is_some()),
    ];
    if let Some((flag, _)) = model_flags.iter().find(|(_, given)| *given) {
        return Err(ConfigError(format!(
            "{flag} describes batchfit's own model; with --exec your command trains its own, so drop \
             {flag}"
        )));
    }
    Ok(())
}

/// The command's program is a file that exec can run: found (on PATH when it has no `/`), with an
/// execute bit.
fn find_program(program: &str) -> Result<(), ConfigError> {
    let err = |m: String| Err(ConfigError(m));
    // what exec would run: a file with an execute bit (execvp skips the others on PATH)
    let executable = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let candidates: Vec<std::path::PathBuf> = if program.contains('/') {
        vec![std::path::PathBuf::from(program)]
    } else {
        std::env::var_os("PATH")
            .map(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(program))
                    .collect()
            })
            .unwrap_or_default()
    };
    if !candidates.iter().any(|p| executable(p)) {
        if let Some(file) = candidates.iter().find(|p| p.is_file()) {
            // found now, not as every trial failing to start (`Permission denied`) after the set-up
            return err(format!(
                "--exec: {} is not executable (no execute permission); make it executable (chmod \
                 +x {}) or run it through its interpreter, e.g. --exec -- sh {} …",
                file.display(),
                file.display(),
                file.display()
            ));
        }
        return err(format!(
            "--exec: cannot find the program {program:?} (not a file{}); give its path or check PATH",
            if program.contains('/') { "" } else { " in any PATH directory" }
        ));
    }
    Ok(())
}

/// `{S}` and `{image}` in the command only where `--sweep` varies them.
fn sweep_placeholders_swept(a: &ProbeArgs) -> Result<(), ConfigError> {
    for param in [SweepParam::SeqLen, SweepParam::ImageSize] {
        let ph = param.placeholder();
        let swept = a
            .sweep
            .as_deref()
            .and_then(|s| s.split_once('='))
            .map(|x| x.0.trim());
        if swept != Some(param.as_str()) && a.command.iter().any(|w| w.contains(ph)) {
            return Err(ConfigError(format!(
                "the command has {ph} in its arguments but there is no --sweep {}=V1,V2,…: \
                 {ph} is the sweep's point (give that --sweep, or write the value itself)",
                param.as_str()
            )));
        }
    }
    Ok(())
}

/// The warning for a command without `{batch}` (kept in the plan unless the trials' reports show the
/// job read `BATCHFIT_BATCH`).
pub const NO_BATCH_WARNING: &str =
    "the command has no {batch} in its arguments: it must read the size from BATCHFIT_BATCH \
     (or batchfit_trial.batch_size()), or every trial trains the same size";

/// What a probe says of a command without `{batch}` before its first trial, when nothing has yet
/// shown whether the job reads the size from its environment.
pub const NO_BATCH_NOTE: &str =
    "no {batch} in the command: each trial's size reaches it only as BATCHFIT_BATCH in its \
     environment (batchfit_trial.batch_size() reads it); a job that reads neither trains one size \
     whatever batchfit asks, and the plan will say so";

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        shell_words::split(line).unwrap()
    }

    #[test]
    fn a_mistyped_placeholder_gets_did_you_mean() {
        let said = |line: &str| placeholder_typos(&words(line)).join("\n");
        for (line, meant) in [
            ("python t.py --batch-size {batc}", "{batch}"),
            ("python t.py --batch-size {BATCH}", "{batch}"),
            ("python t.py --batch-size {batch_size}", "{batch}"),
            ("python t.py --batch-size=$batch", "{batch}"),
            ("python t.py --bs ${batch}", "{batch}"),
            ("python t.py --batch {batch} --steps {stpes}", "{steps}"),
            (
                "python t.py --batch {batch} --accum {acumulation}",
                "{accumulation}",
            ),
        ] {
            assert!(
                said(line).contains(&format!("did you mean `{meant}`")),
                "{line}: {}",
                said(line)
            );
        }
    }

    #[test]
    fn placeholders_escapes_and_unrelated_braces_are_not_typos() {
        for line in [
            "python t.py --batch-size {batch} --steps {steps} --accumulation {accumulation}",
            "python t.py --batch-size {batch} --name {{batc}}",
            "python t.py --batch-size {batch} --ckpt ckpt-{epoch}-{bs}.pt",
            "python t.py --batch-size {batch} --fmt {match} --x $HOME",
        ] {
            assert_eq!(
                placeholder_typos(&words(line)),
                Vec::<String>::new(),
                "{line}"
            );
        }
    }

    #[test]
    fn shell_operators_in_a_one_string_command_are_refused_with_sh_c() {
        for line in [
            "python t.py --batch-size {batch} > log.txt",
            "python t.py --batch-size {batch} 2>&1",
            "python t.py --batch-size {batch} >log.txt",
            "python t.py --batch-size {batch} | tee log",
            "cd /data && python t.py --batch-size {batch}",
        ] {
            let e = shell_syntax(line, &words(line)).unwrap_err().0;
            assert!(e.contains("sh -c"), "{line}: {e}");
        }
        let line = "sh -c 'python t.py --batch-size {batch} > log.txt'";
        assert_eq!(
            shell_syntax(line, &words(line)).unwrap(),
            Vec::<String>::new()
        );
        let line = "python t.py --batch-size {batch} --token '<s>' --expr 'a>b'";
        assert_eq!(
            shell_syntax(line, &words(line)).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_variable_in_a_one_string_command_is_kept_with_a_warning() {
        let line = "python t.py --batch-size {batch} --data $DATA/train";
        let w = shell_syntax(line, &words(line)).unwrap();
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("`$DATA`") && w[0].contains("sh -c"), "{w:?}");
        let line = "python t.py --batch-size {batch} --pattern '^a$'";
        assert_eq!(
            shell_syntax(line, &words(line)).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_tilde_in_a_one_string_command_is_refused_as_the_program_and_warned_as_an_argument() {
        let line = "~/no-such-venv-here/bin/python t.py --batch-size {batch}";
        let e = shell_syntax(line, &words(line)).unwrap_err().0;
        assert!(
            e.contains("`~` is not expanded") && e.contains("--exec -- "),
            "{e}"
        );
        let line = "python t.py --batch-size {batch} --data ~/data";
        let w = shell_syntax(line, &words(line)).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("`~/`") && w[0].contains("nothing is expanded"),
            "{w:?}"
        );
        let line = "python t.py --batch-size {batch} --name a~b";
        assert_eq!(
            shell_syntax(line, &words(line)).unwrap(),
            Vec::<String>::new()
        );
    }
}
