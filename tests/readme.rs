//! The exit-code tables of docs/exit-codes.md (the page README links for exit codes) are the exit-code
//! type's ([`batchfit::exit`]): a code added, removed or reworded in one place and not the other fails
//! here (the message prints the table to paste). The README's formula for a trial's limit is the
//! limit batchfit sets and prints.

use batchfit::exit::{table, Program};

fn exit_codes_page() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/exit-codes.md")).unwrap()
}

/// The markdown table under the line `` `NAME`: `` of docs/exit-codes.md (after its "Exit codes" title).
fn page_table(text: &str, name: &str) -> Vec<(String, String)> {
    let section = &text[text.find("# Exit codes").expect("an Exit codes title")..];
    let start = section
        .find(&format!("`{name}`:\n"))
        .unwrap_or_else(|| panic!("no `{name}`: table"));
    section[start..]
        .lines()
        .skip(1)
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            (cells[0].to_string(), cells[1].replace('`', ""))
        })
        .collect()
}

fn expected(program: Program) -> Vec<(String, String)> {
    table(program)
        .into_iter()
        .map(|(c, m)| (c, m.to_string()))
        .collect()
}

fn markdown(rows: &[(String, String)]) -> String {
    let mut s = String::from("| code | meaning |\n|---|---|\n");
    for (c, m) in rows {
        s += &format!("| {c} | {m} |\n");
    }
    s
}

#[test]
fn documented_exit_codes_are_the_exit_type() {
    let text = exit_codes_page();
    for (name, program) in [
        ("batchfit", Program::Batchfit),
        ("batchfit-train", Program::Train),
    ] {
        let want = expected(program);
        assert_eq!(
            page_table(&text, name),
            want,
            "docs/exit-codes.md's `{name}` exit codes differ from src/exit.rs; the table should read:\n\n{}",
            markdown(&want)
        );
    }
}

mod common;

/// The README's formula for a trial's limit: the backquoted expression of the sentence that begins
/// "Each trial's limit is".
fn readme_limit_formula() -> String {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let at = flat
        .find("Each trial's limit is `")
        .expect("README.md says how a trial's limit is computed: \"Each trial's limit is `…`\"");
    let rest = &flat[at + "Each trial's limit is `".len()..];
    rest[..rest.find('`').unwrap()].to_string()
}

/// Evaluates an arithmetic formula over `budget`, `reserve`, `margin` (bytes, bytes, a share) with
/// `+ - − * ×`, parentheses, numbers and sizes (`16 MiB`).
fn evaluate(formula: &str, vars: &[(&str, f64)]) -> f64 {
    fn expr(t: &[String], i: &mut usize, vars: &[(&str, f64)]) -> f64 {
        let mut v = term(t, i, vars);
        while *i < t.len() && matches!(t[*i].as_str(), "+" | "-" | "−") {
            let op = t[*i].clone();
            *i += 1;
            let r = term(t, i, vars);
            v = if op == "+" { v + r } else { v - r };
        }
        v
    }
    fn term(t: &[String], i: &mut usize, vars: &[(&str, f64)]) -> f64 {
        let mut v = atom(t, i, vars);
        while *i < t.len() && matches!(t[*i].as_str(), "*" | "×") {
            *i += 1;
            v *= atom(t, i, vars);
        }
        v
    }
    fn atom(t: &[String], i: &mut usize, vars: &[(&str, f64)]) -> f64 {
        let tok = t[*i].clone();
        *i += 1;
        if tok == "(" {
            let v = expr(t, i, vars);
            assert_eq!(t[*i], ")", "unbalanced formula");
            *i += 1;
            return v;
        }
        if let Ok(n) = tok.parse::<f64>() {
            let unit = match t.get(*i).map(String::as_str) {
                Some("KiB") => 1024.0,
                Some("MiB") => 1024.0 * 1024.0,
                Some("GiB") => 1024.0 * 1024.0 * 1024.0,
                _ => return n,
            };
            *i += 1;
            return n * unit;
        }
        vars.iter()
            .find(|(name, _)| *name == tok)
            .unwrap_or_else(|| panic!("unknown term {tok:?} in the README's formula"))
            .1
    }
    let mut tokens = vec![];
    let mut word = String::new();
    for c in formula.chars() {
        if c.is_alphanumeric() || c == '.' || c == '_' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            tokens.push(std::mem::take(&mut word));
        }
        if !c.is_whitespace() {
            tokens.push(c.to_string());
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    let mut i = 0;
    let v = expr(&tokens, &mut i, vars);
    assert_eq!(
        i,
        tokens.len(),
        "the README's formula {formula:?} was not read to its end"
    );
    v
}

/// The limit the README's formula gives for a budget, reserve and margin is the limit a cpu probe of
/// a command prints and records (`limit_bytes`) for the same flags, to the byte.
#[test]
fn the_readmes_trial_limit_formula_is_the_limit_batchfit_sets() {
    let formula = readme_limit_formula();
    let d = common::tmp();
    let out = d.path().join("plan.json");
    for (budget, reserve, margin) in [(1u64 << 30, 0u64, 0.1), (3 << 30, 256 << 20, 0.05)] {
        let o = common::batchfit()
            .args(["probe", "--backend", "cpu", "--cpu-limit", "rlimit"])
            .args(["--memory-budget", &budget.to_string()])
            .args(["--reserve", &reserve.to_string()])
            .args([
                "--margin",
                &margin.to_string(),
                "--max-trials",
                "1",
                "--out",
            ])
            .arg(&out)
            .args(["--exec", "--", "sh", "-c", "sleep 0.1"])
            .output()
            .unwrap();
        let plan = common::read_json(&d.path().join("plan.partial.json"));
        let recorded = plan["limit_bytes"].as_u64().unwrap();
        let vars = [
            ("budget", budget as f64),
            ("reserve", reserve as f64),
            ("margin", margin),
        ];
        let want = evaluate(&formula, &vars).floor() as u64;
        assert_eq!(recorded, want, "README: `{formula}`; the plan: {recorded}");
        let printed = format!("limit {} (", batchfit::platform::units::format_size(want));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains(&printed), "wanted {printed:?} in {stderr}");
    }
}
