//! The harness catches a deliberately broken dltsub end to end: the faulted instance runs
//! the variant that resubmits an in-doubt batch without asking the ledger, its answer to a
//! POST is lost (an injected error after E6), and the checker reports the duplicate the
//! ledger saw; the same scenario with the real code passes.

use std::process::Command;

fn scenario(broken: Option<&str>) -> (i32, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_chaos"));
    command.args([
        "one",
        "--plan",
        "E6.after@3",
        "--fault",
        "error",
        "--backend",
        "postgres",
    ]);
    if let Some(broken) = broken {
        command.args(["--broken", broken]);
    }
    let output = command.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

#[test]
fn the_checker_catches_a_blind_resubmission() {
    let (code, text) = scenario(Some("resubmit-in-doubt"));
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("1 duplicate POSTs where self-fencing must prevent them"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|line| line.starts_with("ERROR E6.after@3"))
        .unwrap();
    assert!(row.ends_with("FAILED"), "{row}");
}

#[test]
fn the_real_code_passes_the_same_scenario() {
    let (code, text) = scenario(None);
    assert_eq!(code, 0, "{text}");
    let row = text
        .lines()
        .find(|line| line.starts_with("ERROR E6.after@3"))
        .unwrap();
    // fired, 64 batches, nothing lost, no disagreement, order, stale write accepted (the
    // ones fencing rejected may vary) or duplicate.
    let mut cells: Vec<&str> = row.split_whitespace().collect();
    let stale = cells[7].split_once('/').expect("accepted/rejected").0;
    cells[7] = stale;
    assert_eq!(
        &cells[2..10],
        ["yes", "64", "0", "0", "0", "0", "0", "-"],
        "{row}"
    );
}
