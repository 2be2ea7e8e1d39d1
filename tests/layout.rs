//! The source layout stays readable: src/'s top-level modules import each other only downward (the
//! order of `pub mod` in src/lib.rs is the layer order), so the graph has no cycle; and the engine
//! (search, split, plan, protocol, sim device, exporters) uses no tch, clap or NVML. Imports are
//! counted as `crate::` paths outside comments and test modules.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level modules in src/lib.rs's order.
fn layers() -> Vec<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect()
}

fn rust_files(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(p).unwrap().flatten().collect();
        entries.sort_by_key(|e| e.path());
        for e in entries {
            rust_files(&e.path(), out);
        }
    } else if p.extension().is_some_and(|e| e == "rs")
        && p.file_name().is_some_and(|n| n != "tests.rs")
    {
        out.push(p.to_path_buf());
    }
}

/// The files of top-level module `m`.
fn files_of(m: &str) -> Vec<PathBuf> {
    let mut v = vec![];
    let file = src().join(format!("{m}.rs"));
    if file.exists() {
        v.push(file);
    }
    rust_files(&src().join(m), &mut v);
    assert!(!v.is_empty(), "no source for module {m}");
    v
}

/// The code of a file: comments and `#[cfg(test)]` items dropped (a test module may use anything).
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            // skip the item that follows: up to its closing brace at the same indent, or its `;`
            let indent = line.len() - t.len();
            let mut depth = 0i32;
            let mut opened = false;
            for l in lines.by_ref() {
                depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
                opened |= l.contains('{');
                let done = (opened && depth <= 0)
                    || (!opened && l.trim_end().ends_with(';'))
                    || (l.len() - l.trim_start().len() == indent && l.trim() == "}");
                if done {
                    break;
                }
            }
            continue;
        }
        if t.starts_with("//") {
            continue;
        }
        let no_comment = match line.find("//") {
            // keep `://` in strings (URLs); good enough for this code base
            Some(i) if !line[..i].ends_with(':') && line[..i].matches('"').count() % 2 == 0 => {
                &line[..i]
            }
            _ => line,
        };
        out.push_str(no_comment);
        out.push('\n');
    }
    out
}

/// The macros exported at the crate's root (`#[macro_export] macro_rules! NAME`), each with the
/// top-level module that defines it: `crate::NAME` is an import of that module.
fn exported_macros() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for m in layers() {
        for f in files_of(&m) {
            let text = std::fs::read_to_string(&f).unwrap();
            let mut exported = false;
            for line in text.lines().map(str::trim) {
                if let Some(rest) = line.strip_prefix("macro_rules!").filter(|_| exported) {
                    let name: String = (rest.trim().chars())
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    out.insert(name, m.clone());
                }
                exported = line == "#[macro_export]" || (exported && line.starts_with("#["));
            }
        }
    }
    out
}

/// `crate::NAME` with an exported macro's name read as the path through its module.
fn through_macros(path: &str, macros: &BTreeMap<String, String>) -> String {
    match path
        .strip_prefix("crate::")
        .and_then(|n| macros.get(n).map(|m| (n, m)))
    {
        Some((name, module)) => format!("crate::{module}::{name}"),
        None => path.to_string(),
    }
}

/// The top-level modules `text` names as `crate::NAME`.
fn crate_imports(text: &str) -> Vec<String> {
    let mut v = vec![];
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + 7..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // `batchfit::crate::` does not occur; `$crate::` is macro hygiene
        let before = rest[..i].chars().last();
        if !name.is_empty() && before != Some('$') {
            v.push(name);
        }
        rest = after;
    }
    v
}

#[test]
fn top_level_modules_import_only_downward() {
    let order = layers();
    assert!(order.len() >= 10, "lib.rs lists {order:?}");
    let rank: BTreeMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, m)| (m.as_str(), i))
        .collect();
    let macros = exported_macros();
    let mut wrong = vec![];
    for (i, m) in order.iter().enumerate() {
        for f in files_of(m) {
            for dep in crate_imports(&code(&f)) {
                let dep = macros.get(&dep).cloned().unwrap_or(dep);
                let Some(&j) = rank.get(dep.as_str()) else {
                    wrong.push(format!(
                        "{}: crate::{dep} is not a module of lib.rs",
                        f.display()
                    ));
                    continue;
                };
                if j > i {
                    wrong.push(format!(
                        "{} ({m}, layer {i}) imports crate::{dep} (layer {j}): only modules listed \
                         before it in src/lib.rs may be imported",
                        f.display()
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "upward imports:\n{}", wrong.join("\n"));
    // every module under src/ is declared in lib.rs (no module outside the layers)
    for e in std::fs::read_dir(src()).unwrap().flatten() {
        let name = e
            .file_name()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if ["lib", "bin"].contains(&name.as_str())
            || e.path().extension().is_some_and(|x| x == "cpp")
        {
            continue;
        }
        assert!(
            rank.contains_key(name.as_str()),
            "src/{name} is not in lib.rs's layers"
        );
    }
}

/// The engine: what the search, the plan and the exporters are made of.
const ENGINE: &[&str] = &[
    "exit.rs",
    "platform/mod.rs",
    "platform/units.rs",
    "platform/files.rs",
    "protocol",
    "search",
    "accumulate.rs",
    "plan",
    "device/mod.rs",
    "device/sim.rs",
    "output/mod.rs",
    "output/json.rs",
    "output/text.rs",
    "output/env.rs",
    "output/deepspeed.rs",
];

/// What engine files may import from the crate: engine modules only (`crate::device::` only for the
/// trait, the device facts and the sim device).
fn engine_path_allowed(path: &str) -> bool {
    const OK: &[&str] = &[
        "crate::exit",
        "crate::platform::units",
        "crate::platform::files",
        "crate::platform::now_unix",
        "crate::platform::{",
        "crate::protocol",
        "crate::search",
        "crate::accumulate",
        "crate::plan",
        "crate::output::",
        "crate::device::sim",
    ];
    if OK.iter().any(|p| path.starts_with(p)) {
        return !path.starts_with("crate::platform::{")
            || !path.contains("sysmem") && !path.contains("interrupt");
    }
    if let Some(items) = path.strip_prefix("crate::device::") {
        let items = items.trim_start_matches('{').trim_end_matches('}');
        return items.split(',').map(str::trim).all(|i| {
            [
                "Backend",
                "BackendError",
                "DeviceInfo",
                "DeviceKind",
                "IsolationMode",
                "LimitMechanism",
                "RoundTrial",
                "run_one",
            ]
            .contains(&i)
                || i.starts_with("sim::")
                || i.starts_with("lanes::")
                || i.is_empty()
        });
    }
    false
}

/// `crate::…` paths in `text` with their `{…}` groups.
fn crate_paths(text: &str) -> Vec<String> {
    let mut v = vec![];
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i..];
        let mut depth = 0;
        let mut end = after.len();
        for (k, c) in after.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth > 0 => depth -= 1,
                c if depth == 0 && !(c.is_ascii_alphanumeric() || c == '_' || c == ':') => {
                    end = k;
                    break;
                }
                _ => {}
            }
        }
        v.push(
            after[..end]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        );
        rest = &after[7..];
    }
    v
}

#[test]
fn the_engine_uses_no_tch_clap_or_nvml() {
    let mut files = vec![];
    for e in ENGINE {
        rust_files(&src().join(e), &mut files);
    }
    assert!(files.len() > 20, "{files:?}");
    let macros = exported_macros();
    let mut wrong = vec![];
    for f in &files {
        let code = code(f);
        for banned in ["tch::", "use tch", "clap", "nvml_wrapper", "torch_sys"] {
            if code.contains(banned) {
                wrong.push(format!("{} uses {banned}", f.display()));
            }
        }
        for p in crate_paths(&code) {
            let p = through_macros(&p, &macros);
            if !engine_path_allowed(&p) {
                wrong.push(format!(
                    "{} imports {p}, which is outside the engine",
                    f.display()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Where `code` branches on which workload a probe runs (a command or batchfit's model) rather than
/// asking the workload (`config::WorkloadSpec`'s questions), as `what it names`.
fn workload_branches(code: &str) -> Vec<&'static str> {
    [
        "WorkloadSpec::Exec",
        "WorkloadSpec::Model",
        "exec.is_some()",
        "exec.is_none()",
        "cfg.exec",
        "c.exec",
    ]
    .into_iter()
    .filter(|b| code.contains(b))
    .collect()
}

/// The kind of workload is chosen once, from the arguments (`src/config/`), and matched only where
/// the running workload is built (`probe::setup`'s `workload`); the rest of a probe, and the whole
/// engine, ask the workload's questions instead.
#[test]
fn only_the_config_and_the_builder_branch_on_the_kind_of_workload() {
    let mut files = vec![];
    rust_files(&src(), &mut files);
    let mut wrong = vec![];
    for f in &files {
        let rel = f
            .strip_prefix(src())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel.starts_with("config/") {
            continue;
        }
        let code = code(f);
        let found = workload_branches(&code);
        let builder = rel == "probe/setup.rs"
            && found.iter().all(|b| b.starts_with("WorkloadSpec::"))
            && code.matches("WorkloadSpec::").count() == 2;
        if !found.is_empty() && !builder {
            wrong.push(format!("{rel}: {found:?}"));
        }
    }
    let mut engine = vec![];
    for e in ENGINE {
        rust_files(&src().join(e), &mut engine);
    }
    for f in engine.iter().filter(|f| !f.ends_with("plan/schema.rs")) {
        let code = code(f);
        for kind in ["WorkloadInfo::Exec", "WorkloadInfo::Model", ".exec()"] {
            if code.contains(kind) {
                wrong.push(format!("{} (engine) branches on {kind}", f.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "branches on the kind of workload:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_checks_can_fail() {
    // an exported macro is an import of the module that defines it
    let macros = exported_macros();
    assert_eq!(macros.get("note").map(String::as_str), Some("exit"));
    assert_eq!(through_macros("crate::note", &macros), "crate::exit::note");
    assert_eq!(through_macros("crate::plan::x", &macros), "crate::plan::x");
    // the scanners see what they must see
    assert_eq!(
        crate_imports("use crate::probe::x; // crate::cli"),
        ["probe", "cli"]
    );
    assert!(code(&src().join("lib.rs")).contains("pub mod search"));
    assert!(!engine_path_allowed("crate::device::cuda::CudaBackend"));
    assert!(!engine_path_allowed("crate::workload::model::step"));
    assert_eq!(
        workload_branches("if cfg.exec.is_some() { x }"),
        ["exec.is_some()", "cfg.exec"]
    );
    assert!(workload_branches("if cfg.workload.may_not_train_the_size() {}").is_empty());
    assert!(engine_path_allowed(
        "crate::device::{sim::SimSpec, DeviceInfo}"
    ));
    assert_eq!(
        crate_paths("use crate::device::{sim::SimSpec, DeviceInfo};"),
        ["crate::device::{sim::SimSpec, DeviceInfo}"]
    );
}

/// The `batchfit` package's dependency tree (normal dependencies, as Cargo resolves them).
fn batchfit_dependencies() -> String {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-p",
            "batchfit",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The crate boundary, not a text scan, keeps the command free of libtorch: `tch` and `torch-sys`
/// are dependencies of `crates/batchfit-torch` alone.
#[test]
fn the_batchfit_package_depends_on_no_torch() {
    let tree = batchfit_dependencies();
    assert!(tree.lines().any(|l| l.starts_with("clap ")), "{tree}");
    for banned in ["tch ", "torch-sys ", "batchfit-torch "] {
        assert!(
            !tree.lines().any(|l| l.starts_with(banned)),
            "the batchfit package depends on {banned}:\n{tree}"
        );
    }
}

/// The shared libraries an executable names (`DT_NEEDED`), and its RUNPATH/RPATH entries: those
/// lines of its dynamic section only (the rest are addresses, whose hex digits can spell anything).
fn dynamic_section(exe: &str) -> String {
    let out = std::process::Command::new("readelf")
        .args(["-d", exe])
        .output()
        .expect("readelf (binutils) runs");
    assert!(out.status.success(), "readelf -d {exe} failed");
    let all = String::from_utf8_lossy(&out.stdout).into_owned();
    let named = ["(NEEDED)", "(RUNPATH)", "(RPATH)"];
    (all.lines())
        .filter(|l| named.iter().any(|tag| l.contains(tag)))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_batchfit_commands_link_no_libtorch() {
    for exe in [
        env!("CARGO_BIN_EXE_batchfit"),
        env!("CARGO_BIN_EXE_batchfit-train"),
    ] {
        let d = dynamic_section(exe);
        assert!(d.contains("libc.so"), "{exe}: {d}");
        for banned in ["torch", "c10", "cuda", "libstdc++", "RUNPATH", "RPATH"] {
            assert!(!d.contains(banned), "{exe} names {banned}:\n{d}");
        }
    }
}
