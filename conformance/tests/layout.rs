//! The crate's layout rules, checked: the kit never imports the suite, the
//! test environment is read in one place, and no file grows past 500 lines
//! without saying why at its top.

use std::path::{Path, PathBuf};

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The code of a file, without comment lines (doc links may point anywhere).
fn code(path: &Path) -> Vec<(usize, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l.to_owned()))
        .collect()
}

/// The kit (`src/kit/`) builds on nothing of the suite, so it could become a
/// crate of its own by moving one directory.
#[test]
fn the_kit_never_imports_the_suite() {
    let kit = crate_dir().join("src/kit");
    let mut offending = Vec::new();
    for path in files(&kit) {
        // How many `super::` lead out of the kit: `kit/poll.rs` is
        // `crate::kit::poll`, two levels down; `kit/mod.rs` is `crate::kit`.
        let below_kit = path
            .strip_prefix(&kit)
            .expect("under the kit")
            .components()
            .count();
        let out_of_kit = if path.ends_with("mod.rs") {
            below_kit
        } else {
            below_kit + 1
        };
        for (n, line) in code(&path) {
            let mut rest = line.as_str();
            while let Some(at) = rest.find("crate::") {
                let after = &rest[at + "crate::".len()..];
                let from_macro = rest[..at].ends_with('$');
                if !after.starts_with("kit") && !from_macro {
                    offending.push(format!("{}:{n}: {line}", path.display()));
                }
                rest = after;
            }
            if line.contains(&"super::".repeat(out_of_kit)) {
                offending.push(format!("{}:{n}: {line}", path.display()));
            }
        }
    }
    assert!(
        offending.is_empty(),
        "the kit imports the suite:\n{}",
        offending.join("\n")
    );
}

/// Every `LOCK_TEST_*` variable is named in `kit/env.rs` only; everything
/// else reads it through `kit::env`.
#[test]
fn the_environment_is_read_in_one_place() {
    let env_rs = crate_dir().join("src/kit/env.rs");
    let mut offending = Vec::new();
    for path in files(&crate_dir().join("src")) {
        if path == env_rs {
            continue;
        }
        for (n, line) in code(&path) {
            if line.contains("\"LOCK_TEST_") || line.contains("env::var(\"LOCK_") {
                offending.push(format!("{}:{n}: {line}", path.display()));
            }
        }
    }
    assert!(
        offending.is_empty(),
        "read these through kit::env:\n{}",
        offending.join("\n")
    );
}

/// Files of one job stay short; a longer one says why in its first lines.
#[test]
fn no_file_over_500_lines_without_a_reason() {
    let mut offending = Vec::new();
    for dir in ["src", "tests"] {
        for path in files(&crate_dir().join(dir)) {
            let text = std::fs::read_to_string(&path).expect("a source file");
            let lines = text.lines().count();
            let head: String = text.lines().take(10).collect::<Vec<_>>().join("\n");
            if lines > 500 && !head.contains("Longer than 500 lines because") {
                offending.push(format!("{} ({lines} lines)", path.display()));
            }
        }
    }
    assert!(
        offending.is_empty(),
        "split these, or say at the top why not (\"Longer than 500 lines because ...\"):\n{}",
        offending.join("\n")
    );
}
