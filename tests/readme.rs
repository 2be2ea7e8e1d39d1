//! The exit-code tables of docs/exit-codes.md (the page README links for exit codes) are the exit-code
//! type's ([`batchfit::exit`]): a code added, removed or reworded in one place and not the other fails
//! here (the message prints the table to paste).

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
