//! The Python side of batchfit, run by the test suite: the helper's unit tests
//! (`tests/support/exec/test_batchfit_trial.py`) and the fake commands' (`test_fakes.py`), under the
//! Python of the environment with torch (`BATCHFIT_PYTHON`), so that the tests that need torch run
//! too. Lightning's and CUDA's tests skip where those are absent, and say so in the output.

mod common;
use common::*;

#[test]
fn the_python_helpers_unit_tests_pass() {
    let o = std::process::Command::new(venv_python())
        .args(["-m", "unittest", "discover", "-s", "tests/support/exec"])
        .args(["-p", "test_*.py"])
        .current_dir(repo())
        .env_remove("BATCHFIT_RESULT")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let ran = err
        .lines()
        .find_map(|l| {
            l.strip_prefix("Ran ")?
                .split(' ')
                .next()?
                .parse::<u32>()
                .ok()
        })
        .unwrap_or(0);
    assert!(ran >= 50, "only {ran} tests ran: {err}");
}
