//! `batchfit probe --exec` and the plan cache: a cached plan answers only while what the job reads
//! is unchanged. The helper reports the job's own modules and the files it opened under the working
//! directory (the plan keeps their hashes, rechecked at every lookup); the environment, less the
//! variables that do not change a job, is in the key; a job without the helper is answered from the
//! cache only with `--fingerprint-file`. Each job is a fast standard-library fake (tests/support/exec).

mod common;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A job in `dir`: imports the local module `model.py` (its WIDTH), reads `cfg.toml` (its scale)
/// and `$WIDTH_MULT`, holds batch × width × scale × mult MiB, and runs out of memory above 6 of them.
fn write_job(dir: &Path) {
    let support = repo().join("tests/support/exec");
    let helper = repo().join("python/batchfit");
    std::fs::write(dir.join("model.py"), "WIDTH = 1\n").unwrap();
    std::fs::write(dir.join("cfg.toml"), "scale = 1\n").unwrap();
    // a file the job never reads, for `--fingerprint-file`
    std::fs::write(dir.join("notes.txt"), "v1\n").unwrap();
    std::fs::write(
        dir.join("job.py"),
        format!(
            "import os, sys\n\
             sys.path[:0] = [{helper:?}, {support:?}]\n\
             import batchfit_trial as bt\n\
             import hold, model\n\
             with open('cfg.toml') as f:\n    scale = int(f.read().split('=')[1])\n\
             b = bt.batch_size(default=4)\n\
             need = b * model.WIDTH * scale * int(os.environ.get('WIDTH_MULT', '1'))\n\
             if need > 6:\n    import oom; oom.run_out()\n\
             held = hold.hold(need, 0.1)\n\
             with bt.Trial() as t:\n    for _ in range(bt.steps(default=1)): t.step()\n",
            helper = helper.display().to_string(),
            support = support.display().to_string(),
        ),
    )
    .unwrap();
}

/// Probes `cmd` in `dir` with the plan cache `cache` and the variables `env`: the plan and stderr.
fn probe(
    dir: &Path,
    cache: &Path,
    env: &[(&str, &str)],
    flags: &[&str],
    cmd: &[&str],
) -> (Value, String) {
    let o = probe_command(dir, cache, env, flags, cmd).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    (read_json(&dir.join("plan.json")), err)
}

/// [`probe`] without variables or flags that must end within `limit` (killed and failed past it).
fn probe_within(dir: &Path, cache: &Path, cmd: &[&str], limit: Duration) -> (Value, String) {
    let stderr = dir.join("probe-stderr.txt");
    let mut child = probe_command(dir, cache, &[], &[], cmd)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let (status, _) = wait_within(&mut child, limit);
    let err = std::fs::read_to_string(&stderr).unwrap();
    assert!(status.success(), "{err}");
    (read_json(&dir.join("plan.json")), err)
}

/// The `batchfit probe` of [`probe`], its `--out` (`plan.json` in `dir`) removed first.
fn probe_command(
    dir: &Path,
    cache: &Path,
    env: &[(&str, &str)],
    flags: &[&str],
    cmd: &[&str],
) -> Command {
    let out = dir.join("plan.json");
    let _ = std::fs::remove_file(&out);
    let mut c = Command::new(env!("CARGO_BIN_EXE_batchfit"));
    c.env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .current_dir(dir)
        .env("BATCHFIT_CACHE_DIR", cache)
        .envs(env.iter().copied())
        .args(["probe", "--backend", "cpu", "--cpu-limit", "rlimit"])
        .args(["--memory-budget", "2GiB", "--max-batch", "16", "--out"])
        .arg(&out)
        .args(flags)
        .arg("--exec")
        .arg("--")
        .args(cmd);
    c
}

const JOB: [&str; 2] = ["/usr/bin/python3", "job.py"];

/// Probes the job once, changes it with `change`, probes again: the second plan and stderr.
fn probe_changed(change: impl FnOnce(&Path), env: [(&str, &str); 2]) -> (Value, Value, String) {
    probe_changed_with(&[], change, env)
}

/// [`probe_changed`] with `flags` given to both probes (paths in them relative to the job's folder).
fn probe_changed_with(
    flags: &[&str],
    change: impl FnOnce(&Path),
    env: [(&str, &str); 2],
) -> (Value, Value, String) {
    let d = tmp();
    let cache = fresh_cache_dir();
    write_job(d.path());
    let (first, _) = probe(d.path(), &cache, &env[..1], flags, &JOB);
    assert_eq!(first["recommendation"]["max_fitting_batch"], 6, "{first}");
    change(d.path());
    let (second, err) = probe(d.path(), &cache, &env[1..], flags, &JOB);
    (first, second, err)
}

/// `job.py` in `dir` with `from` replaced by `to`.
fn edit_job(dir: &Path, from: &str, to: &str) {
    let job = std::fs::read_to_string(dir.join("job.py")).unwrap();
    assert!(job.contains(from), "{from:?} not in job.py");
    std::fs::write(dir.join("job.py"), job.replace(from, to)).unwrap();
}

/// Probes `cmd` in `work` (answer 6), probes it again from the cache, runs `change` and probes a
/// third time: that plan and stderr.
fn cached_then_changed(work: &Path, cmd: &[&str], change: impl FnOnce()) -> (Value, String) {
    let cache = fresh_cache_dir();
    let (first, _) = probe(work, &cache, &[], &[], cmd);
    assert_eq!(first["recommendation"]["max_fitting_batch"], 6, "{first}");
    let (_, err) = probe(work, &cache, &[], &[], cmd);
    assert!(err.contains("plan from cache"), "{err}");
    change();
    probe(work, &cache, &[], &[], cmd)
}

#[test]
fn an_unchanged_job_is_answered_from_the_cache() {
    let (first, _, err) = probe_changed(|_| {}, [("WIDTH_MULT", "1"), ("WIDTH_MULT", "1")]);
    assert!(err.contains("plan from cache"), "{err}");
    let read = first["model"]["read_files"].to_string();
    for f in ["model.py", "cfg.toml", "job.py"] {
        assert!(read.contains(f), "{f} not in {read}");
    }
    assert!(
        first["model"]["environment_sha256"].is_string(),
        "{}",
        first["model"]
    );
}

#[test]
fn a_changed_local_module_is_not_answered_from_the_cache() {
    let (_, second, err) = probe_changed(
        |d| std::fs::write(d.join("model.py"), "WIDTH = 2\n").unwrap(),
        [("WIDTH_MULT", "1"), ("WIDTH_MULT", "1")],
    );
    assert!(!err.contains("plan from cache"), "{err}");
    assert!(
        err.contains("model.py changed since the plan was made"),
        "{err}"
    );
    assert_eq!(second["recommendation"]["max_fitting_batch"], 3, "{second}");
}

#[test]
fn a_changed_config_file_the_job_reads_is_not_answered_from_the_cache() {
    let (_, second, err) = probe_changed(
        |d| std::fs::write(d.join("cfg.toml"), "scale = 3\n").unwrap(),
        [("WIDTH_MULT", "1"), ("WIDTH_MULT", "1")],
    );
    assert!(!err.contains("plan from cache"), "{err}");
    assert!(
        err.contains("cfg.toml changed since the plan was made"),
        "{err}"
    );
    assert_eq!(second["recommendation"]["max_fitting_batch"], 2, "{second}");
}

/// A job that finds its data by listing a folder (`glob.glob('shards/*.txt')`, one shard a unit
/// of its scale): a shard added there changes what the job reads, though no file it opened did.
#[test]
fn a_new_file_in_a_folder_the_job_lists_is_not_answered_from_the_cache() {
    let d = tmp();
    write_job(d.path());
    edit_job(
        d.path(),
        "with open('cfg.toml') as f:\n    scale = int(f.read().split('=')[1])\n",
        "import glob\nscale = len(glob.glob('shards/*.txt'))\n",
    );
    std::fs::create_dir(d.path().join("shards")).unwrap();
    std::fs::write(d.path().join("shards/a.txt"), "1\n").unwrap();
    let (second, err) = cached_then_changed(d.path(), &JOB, || {
        std::fs::write(d.path().join("shards/b.txt"), "1\n").unwrap()
    });
    assert!(!err.contains("plan from cache"), "{err}");
    assert!(
        err.contains("shards changed since the plan was made"),
        "{err}"
    );
    assert_eq!(second["recommendation"]["max_fitting_batch"], 3, "{second}");
}

/// A job whose worker process (forked, as a DataLoader's) reads its config: the worker's read is
/// recorded, batchfit's own files are not, so the unchanged job is answered from the cache and a
/// changed config is not.
#[test]
fn a_job_whose_worker_reads_its_config_is_answered_from_the_cache_until_it_changes() {
    let d = tmp();
    write_job(d.path());
    edit_job(
        d.path(),
        "with open('cfg.toml') as f:\n    scale = int(f.read().split('=')[1])\n",
        "r, w = os.pipe()\n\
         if os.fork() == 0:\n    os.write(w, open('cfg.toml').read().split('=')[1].strip().encode()); os._exit(0)\n\
         os.wait(); scale = int(os.read(r, 16))\n",
    );
    let (second, err) = cached_then_changed(d.path(), &JOB, || {
        std::fs::write(d.path().join("cfg.toml"), "scale = 3\n").unwrap()
    });
    assert!(!err.contains("plan from cache"), "{err}");
    assert_eq!(second["recommendation"]["max_fitting_batch"], 2, "{second}");
    // the re-probed plan records what the job read: the worker's config, none of batchfit's files
    let read = second["model"]["read_files"].to_string();
    assert!(read.contains("cfg.toml"), "{read}");
    assert!(!read.contains("batchfit-"), "batchfit's own files: {read}");
}

/// A job that reads its config before it imports the helper: the read is recorded from the
/// process's start, with the DataLoader watcher on or off, so a changed config is not answered from
/// the cache.
#[test]
fn a_config_read_before_the_helper_is_imported_is_in_the_cache_key() {
    for observe in ["on", "off"] {
        let d = tmp();
        write_job(d.path());
        edit_job(
            d.path(),
            "import batchfit_trial as bt\n",
            "early = open('cfg.toml').read()\nimport batchfit_trial as bt\n",
        );
        edit_job(
            d.path(),
            "with open('cfg.toml') as f:\n    scale = int(f.read().split('=')[1])\n",
            "scale = int(early.split('=')[1])\n",
        );
        let cache = fresh_cache_dir();
        let flags = ["--observe", observe];
        let (first, _) = probe(d.path(), &cache, &[], &flags, &JOB);
        assert_eq!(first["recommendation"]["max_fitting_batch"], 6, "{first}");
        let (_, err) = probe(d.path(), &cache, &[], &flags, &JOB);
        assert!(
            err.contains("plan from cache"),
            "--observe {observe}: {err}"
        );
        std::fs::write(d.path().join("cfg.toml"), "scale = 3\n").unwrap();
        let (second, err) = probe(d.path(), &cache, &[], &flags, &JOB);
        assert!(
            !err.contains("plan from cache"),
            "--observe {observe}: {err}"
        );
        assert_eq!(second["recommendation"]["max_fitting_batch"], 2, "{second}");
        let read = second["model"]["read_files"].to_string();
        assert!(read.contains("cfg.toml"), "--observe {observe}: {read}");
        assert!(
            !read.contains("_batchfit_reads"),
            "batchfit's own files: {read}"
        );
    }
}

#[test]
fn a_changed_environment_variable_is_not_answered_from_the_cache() {
    let (_, second, err) = probe_changed(|_| {}, [("WIDTH_MULT", "1"), ("WIDTH_MULT", "2")]);
    assert!(!err.contains("plan from cache"), "{err}");
    assert_eq!(second["recommendation"]["max_fitting_batch"], 3, "{second}");
}

/// A job without the helper says nothing of what it reads: its plan is not answered from the cache
/// (said in one line) unless `--fingerprint-file` names what it reads.
#[test]
fn a_job_without_the_helper_is_answered_from_the_cache_only_with_fingerprint_files() {
    let d = tmp();
    let cache = fresh_cache_dir();
    let script = format!("[ \"$1\" -le 5 ] || {}; {}", run_out_sh(), hold_sh("$1"));
    let cmd = ["sh", "-c", script.as_str(), "sh", "{batch}"];
    for _ in 0..2 {
        let (_, err) = probe(d.path(), &cache, &[], &[], &cmd);
        assert!(!err.contains("plan from cache"), "{err}");
        assert!(
            err.contains("cache not used: the command reports no helper data"),
            "{err}"
        );
    }
    let hold = repo().join("tests/support/exec/hold.py");
    let flags = ["--fingerprint-file", hold.to_str().unwrap()];
    probe(d.path(), &cache, &[], &flags, &cmd);
    let (_, err) = probe(d.path(), &cache, &[], &flags, &cmd);
    assert!(err.contains("plan from cache"), "{err}");
}

/// `--fingerprint-file` adds files to the check, it never replaces the check of the files the job
/// read: with the named file unchanged, an edited module the job imports is still not answered
/// from the cache.
#[test]
fn a_changed_module_is_not_answered_from_the_cache_when_fingerprint_files_are_also_named() {
    let flags = ["--fingerprint-file", "notes.txt"];
    let (first, second, err) = probe_changed_with(
        &flags,
        |d| std::fs::write(d.join("model.py"), "WIDTH = 2\n").unwrap(),
        [("WIDTH_MULT", "1"), ("WIDTH_MULT", "1")],
    );
    assert!(
        first["model"]["fingerprint_files"]
            .to_string()
            .contains("notes.txt"),
        "{}",
        first["model"]
    );
    assert!(!err.contains("plan from cache"), "{err}");
    assert!(
        err.contains("model.py changed since the plan was made"),
        "{err}"
    );
    assert_eq!(second["recommendation"]["max_fitting_batch"], 3, "{second}");
}

/// An installed package the job imports (a module under a `site-packages` folder that sets the
/// model's width) is not hashed like the job's own modules, but its files' sizes and modification
/// times are recorded: edited in place (or upgraded), the cached plan is not answered.
#[test]
fn a_changed_installed_package_is_not_answered_from_the_cache() {
    let d = tmp();
    let work = d.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    write_job(&work);
    let site = d.path().join("venv/lib/python3/site-packages");
    std::fs::create_dir_all(site.join("widthpkg")).unwrap();
    std::fs::create_dir_all(site.join("widthpkg-1.0.dist-info")).unwrap();
    let init = site.join("widthpkg/__init__.py");
    std::fs::write(&init, "WIDTH = 1\n").unwrap();
    let import = format!(
        "sys.path.insert(0, {:?})\nimport hold, widthpkg as model\n",
        site.display().to_string()
    );
    edit_job(&work, "import hold, model\n", &import);
    let (second, err) = cached_then_changed(&work, &JOB, || {
        std::fs::write(&init, "WIDTH = 2\n").unwrap()
    });
    assert!(!err.contains("plan from cache"), "{err}");
    assert!(
        err.contains("widthpkg/__init__.py changed since the plan was made"),
        "{err}"
    );
    assert_eq!(second["recommendation"]["max_fitting_batch"], 3, "{second}");
}

/// A config file outside the working directory, named on the command line (`../conf/model.cfg`,
/// an extension batchfit does not know) and opened by the job: changed, the cached plan is not
/// answered.
#[test]
fn a_changed_config_file_outside_the_working_directory_is_not_answered_from_the_cache() {
    let (d, work, conf) = job_with_outside_config();
    edit_job(&work, "open('cfg.toml')", "open(sys.argv[1])");
    let cmd = ["/usr/bin/python3", "job.py", "../conf/model.cfg"];
    let (second, err) = cached_then_changed(&work, &cmd, || {
        std::fs::write(&conf, "scale = 3\n").unwrap()
    });
    assert!(!err.contains("plan from cache"), "{err}");
    assert_eq!(second["recommendation"]["max_fitting_batch"], 2, "{second}");
    drop(d);
}

/// The job in `work/` of a temporary folder, and `conf/model.cfg` beside `work/` (scale 1).
fn job_with_outside_config() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let d = tmp();
    let work = d.path().join("work");
    let conf = d.path().join("conf/model.cfg");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    std::fs::write(&conf, "scale = 1\n").unwrap();
    write_job(&work);
    (d, work, conf)
}

/// A config file outside the working directory that the job opens without naming it on the command
/// line (`../conf/model.cfg` in its code) is recorded like the files it reads inside: changed, the
/// cached plan is not answered, and the message names it.
#[test]
fn a_changed_file_the_job_opens_outside_the_working_directory_is_not_answered_from_the_cache() {
    let (d, work, conf) = job_with_outside_config();
    edit_job(&work, "open('cfg.toml')", "open('../conf/model.cfg')");
    let (second, err) = cached_then_changed(&work, &JOB, || {
        std::fs::write(&conf, "scale = 3\n").unwrap()
    });
    assert!(!err.contains("plan from cache"), "{err}");
    assert!(
        err.contains("conf/model.cfg changed since the plan was made"),
        "{err}"
    );
    assert_eq!(second["recommendation"]["max_fitting_batch"], 2, "{second}");
    drop(d);
}

/// A helper that reports the files the job read but not its installed packages (a copy older than
/// this batchfit) cannot show a changed package: its plan is not answered from the cache, said in
/// one line.
#[test]
fn a_job_whose_helper_reports_no_installed_packages_is_not_answered_from_the_cache() {
    let d = tmp();
    let cache = fresh_cache_dir();
    write_job(d.path());
    let old_helper = "import batchfit_trial as bt\nbt._python_environment = lambda: None\n";
    edit_job(d.path(), "import batchfit_trial as bt\n", old_helper);
    for _ in 0..2 {
        let (plan, err) = probe(d.path(), &cache, &[], &[], &JOB);
        assert_eq!(plan["recommendation"]["max_fitting_batch"], 6, "{plan}");
        assert!(!err.contains("plan from cache"), "{err}");
        assert!(
            err.contains("cache not used: the command's helper reports no installed packages"),
            "{err}"
        );
    }
}

/// A file the job reads of at least `STAT_ONLY_BYTES` (a dataset) is known by its size,
/// modification time and inode, never read by batchfit: the job's 1 TiB sparse file would take
/// minutes to hash, and each probe, the cached one too, must end in well under that. Grown by a
/// page, it is seen changed: the cached plan is not answered, and the message names it.
#[test]
fn a_large_file_the_job_reads_is_checked_by_its_stat_without_being_read() {
    let d = tmp();
    let cache = fresh_cache_dir();
    write_job(d.path());
    let data = d.path().join("data.bin");
    let size: u64 = 1 << 40;
    std::fs::File::create(&data).unwrap().set_len(size).unwrap();
    edit_job(
        d.path(),
        "import hold, model\n",
        "import hold, model\nopen('data.bin', 'rb').read(16)\n",
    );
    let limit = Duration::from_secs(120);
    let (first, _) = probe_within(d.path(), &cache, &JOB, limit);
    assert_eq!(
        first["model"]["read_files"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| {
                f["path"].as_str().unwrap().ends_with("/data.bin")
                    && f["size"] == size
                    && f.get("sha256").is_none()
            })
            .count(),
        1,
        "{}",
        first["model"]
    );
    let (_, err) = probe_within(d.path(), &cache, &JOB, limit);
    assert!(err.contains("plan from cache"), "{err}");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(size + 4096)
        .unwrap();
    let (second, err) = probe_within(d.path(), &cache, &JOB, limit);
    assert!(!err.contains("plan from cache"), "{err}");
    assert!(
        err.contains("data.bin changed since the plan was made (the command reads it)"),
        "{err}"
    );
    assert_eq!(second["recommendation"]["max_fitting_batch"], 6, "{second}");
}

/// A plan keeps only a summary of the installed packages the job imported (their counts and a
/// digest), not a line per file: the list, which the cache needs to see and name a changed file,
/// is stored beside the cached plan. Removed, the cached plan is not answered, said in one line.
#[test]
fn the_plan_summarises_the_installed_packages_and_the_cache_keeps_their_list_beside_it() {
    let d = tmp();
    let cache = fresh_cache_dir();
    write_job(d.path());
    let (first, _) = probe(d.path(), &cache, &[], &[], &JOB);
    let env = &first["model"]["python_environment"];
    assert!(env["record_sha256"].is_string(), "{env}");
    assert!(
        env["file_count"].is_u64() && env.get("files").is_none(),
        "{env}"
    );
    let records: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".environment.json"))
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    let (_, err) = probe(d.path(), &cache, &[], &[], &JOB);
    assert!(err.contains("plan from cache"), "{err}");
    std::fs::remove_file(&records[0]).unwrap();
    let (_, err) = probe(d.path(), &cache, &[], &[], &JOB);
    assert!(!err.contains("plan from cache"), "{err}");
    assert!(
        err.contains("the record of its installed packages") && err.contains("cannot be read"),
        "{err}"
    );
}

/// A plan whose verification failed is no answer for the next probe of the same job: `verify`
/// removes it from the cache, and the job is probed again.
#[test]
fn a_plan_that_failed_its_verification_is_not_answered_from_the_cache() {
    let d = tmp();
    let cache = fresh_cache_dir();
    write_job(d.path());
    let (first, _) = probe(d.path(), &cache, &[], &[], &JOB);
    assert_eq!(first["recommendation"]["max_fitting_batch"], 6, "{first}");
    // the job needs twice the memory while it is verified: its answer runs out
    std::fs::write(d.path().join("cfg.toml"), "scale = 2\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_batchfit"))
        .current_dir(d.path())
        .env("BATCHFIT_CACHE_DIR", &cache)
        .args(["verify", "--quiet", "--out", "verified.json", "plan.json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "{err}");
    assert!(
        err.contains("the cached plan of this probe is removed"),
        "{err}"
    );
    std::fs::write(d.path().join("cfg.toml"), "scale = 1\n").unwrap();
    let (again, err) = probe(d.path(), &cache, &[], &[], &JOB);
    assert!(!err.contains("plan from cache"), "{err}");
    assert_eq!(again["recommendation"]["max_fitting_batch"], 6, "{again}");
}
