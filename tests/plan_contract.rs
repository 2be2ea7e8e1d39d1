//! The v1 plan is a contract with job scripts, `batchfit-train`, `merge`/`verify` and the cache: saved
//! plans (a multi-GPU cuda plan with every optional section, a sim plan, a cpu plan with hybrid
//! isolation, all written by an earlier build) are parsed and re-serialised unchanged. Renaming or
//! dropping a field of any type the plan embeds fails here.

mod common;
use batchfit::plan::Plan;
use common::*;
use serde_json::Value;
use std::path::Path;

fn files() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("plan-v1"))
        })
        .collect();
    v.sort();
    assert!(v.len() >= 3, "{v:?}");
    v
}

#[test]
fn saved_plans_round_trip_unchanged() {
    for f in files() {
        let text = std::fs::read_to_string(&f).unwrap();
        let original: Value = serde_json::from_str(&text).unwrap();
        let plan = Plan::parse(&text, &f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let again: Value = serde_json::from_str(&plan.to_json()).unwrap();
        assert_eq!(again, original, "{} changed on a round trip", f.display());
    }
}

#[test]
fn show_prints_the_saved_plan_as_it_is() {
    for f in files() {
        let out = batchfit()
            .args(["show", "--format", "json"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}: {out:?}", f.display());
        let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(shown, read_json(&f), "{}", f.display());
    }
}
