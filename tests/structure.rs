//! The shape of the source tree, checked: the top-level modules of `src/` form a layered
//! graph with no import cycle (a cycle means two modules that cannot be understood, tested
//! or changed apart).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Top-level module → the top-level modules it names through `crate::`.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (f, text) in sources("") {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        // The binaries and the crate root sit above every module.
        if matches!(module.as_str(), "main" | "lib" | "bin") {
            continue;
        }
        let deps = graph.entry(module.clone()).or_default();
        for (i, _) in text.match_indices("crate::") {
            let name: String = text[i + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() && name != module {
                deps.insert(name);
            }
        }
    }
    graph
}

fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            let mut cycle = path[at..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(d, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut vec![], &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn top_level_modules_have_no_import_cycle() {
    let g = module_graph();
    assert!(
        g.contains_key("supervisor") && g.contains_key("protocol"),
        "{g:?}"
    );
    if let Some(c) = find_cycle(&g) {
        panic!("import cycle between top-level modules: {}", c.join(" -> "));
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        find_cycle(&g).unwrap(),
        vec!["a".to_string(), "b".into(), "c".into(), "a".into()]
    );
    g.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&g), None);
}

/// Every Rust file under `src/<dir>`, with its text.
fn sources(dir: &str) -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(dir);
    let mut files = vec![];
    rust_files(&root, &mut files);
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            (f, text)
        })
        .collect()
}

/// The coordinator decodes rows by column name (`rows::RowExt::col`): a positional
/// `Row::get(0)` silently decodes the wrong column once a select list changes.
#[test]
fn the_coordinator_reads_no_row_by_position() {
    let mut found = vec![];
    for (f, text) in sources("coordinator") {
        for (n, line) in text.lines().enumerate() {
            let positional = line.match_indices(".get(").any(|(i, _)| {
                line[i + 5..]
                    .trim_start()
                    .starts_with(|c: char| c.is_ascii_digit())
            }) || line.contains("get::<_,");
            if positional {
                found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "positional row reads:\n{}",
        found.join("\n")
    );
}

/// No lane, lifecycle, generation, handoff or continuation state as a bare Rust string in
/// the coordinator: code names states through the enums
/// of `coordinator::states` (which alone spell them), so a typo cannot compile. (SQL text
/// is checked by `the_coordinator_spells_no_state_in_sql_text`.)
#[test]
fn the_coordinator_names_no_state_as_a_rust_string() {
    use mosaic::coordinator::states::*;
    let mut states: Vec<&str> = vec![];
    states.extend(LaneState::ALL.iter().map(|s| s.as_str()));
    states.extend(Lifecycle::ALL.iter().map(|s| s.as_str()));
    states.extend(GenState::ALL.iter().map(|s| s.as_str()));
    states.extend(HandoffState::ALL.iter().map(|s| s.as_str()));
    states.extend(ContinuationState::ALL.iter().map(|s| s.as_str()));
    // (The lower-case work statuses and watchdog steps — "active", "none", "handoff" —
    // are ordinary words in messages and receipt keys; the enums carry them in code, but a
    // text search cannot tell them apart.)
    let mut found = vec![];
    for (f, text) in sources("coordinator") {
        // The enums' own file spells them, and `model.rs` spells the outcome an operator
        // asks for (its own enum, `Outcome`).
        let name = f.file_name().unwrap().to_string_lossy();
        if name == "states.rs" {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            for st in &states {
                let quoted = format!("\"{st}\"");
                if line.contains(&quoted) && !(name == "model.rs" && line.contains("Outcome::")) {
                    found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "state literals:\n{}", found.join("\n"));
}

/// No state as a quoted SQL literal (`'RUNNING'`, `work_status = 'active'`) in coordinator
/// statement text: statements build their text at compile time from the enums
/// (`LaneState::Running.sql()` inside `concatcp!`), so a misspelt state is a compile error and
/// the schema drift test covers every state a statement names.
#[test]
fn the_coordinator_spells_no_state_in_sql_text() {
    use mosaic::coordinator::states::*;
    let mut upper: Vec<&str> = vec![];
    upper.extend(LaneState::ALL.iter().map(|s| s.as_str()));
    upper.extend(Lifecycle::ALL.iter().map(|s| s.as_str()));
    upper.extend(GenState::ALL.iter().map(|s| s.as_str()));
    upper.extend(HandoffState::ALL.iter().map(|s| s.as_str()));
    upper.extend(ContinuationState::ALL.iter().map(|s| s.as_str()));
    // The lower-case columns are recognised by the column they are compared with or set to.
    let lower: Vec<(&str, Vec<&str>)> = vec![
        (
            "work_status",
            WorkStatus::ALL.iter().map(|s| s.as_str()).collect(),
        ),
        (
            "watchdog_step",
            WatchdogStep::ALL.iter().map(|s| s.as_str()).collect(),
        ),
    ];
    let mut found = vec![];
    for (f, text) in sources("coordinator") {
        if f.file_name().unwrap() == "states.rs" {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            let mut hit = upper.iter().any(|st| line.contains(&format!("'{st}'")));
            for (col, values) in &lower {
                for v in values {
                    for op in ["=", "<>", "IN ("] {
                        hit |= line.contains(&format!("{col} {op} '{v}'"));
                    }
                }
            }
            if hit {
                found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "states in SQL text:\n{}",
        found.join("\n")
    );
}

/// Files say what they hold: no source file grows past 800 lines (split it by concern,
/// one noun per file, when it would).
#[test]
fn no_source_file_is_over_800_lines() {
    let mut long = vec![];
    for (f, text) in sources("") {
        let n = text.lines().count();
        if n > 800 {
            long.push(format!("{} ({n} lines)", f.display()));
        }
    }
    assert!(
        long.is_empty(),
        "split these by concern:\n{}",
        long.join("\n")
    );
}

/// The constant-time boundary (`src/util/ct.rs`, spec §17 Raw token leakage/timing): no
/// other file calls `subtle`, and no line compares a value that names a secret or a value
/// derived from one (a fence proof or commitment, a nonce, a token, a reveal, a secret, a
/// credential placeholder) with `==` or `!=` — `util::ct::eq` does, in time that depends
/// only on the lengths.
#[test]
fn secrets_are_compared_only_at_the_constant_time_boundary() {
    let names = [
        "fence_proof",
        "commitment",
        "nonce",
        "token",
        "reveal",
        "secret",
        "placeholder",
    ];
    let mut offenders = vec![];
    for (f, text) in sources("") {
        let name = f.display().to_string();
        if name.ends_with("util/ct.rs") {
            continue;
        }
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains("subtle::") || code.contains("ct_eq(") {
                offenders.push(format!("{name}:{}: calls subtle itself", i + 1));
            }
            let compares = code.contains("==") || code.contains("!=");
            if compares && names.iter().any(|n| code.contains(n)) {
                offenders.push(format!("{name}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "compare these with mosaic::util::ct::eq:\n{}",
        offenders.join("\n")
    );
}

/// The CLI prints its answers through `out::line`: `println!` panics when the reader has
/// gone away (`mosaic … | head`), since the binary ignores SIGPIPE for its daemons. The
/// library's report renderers (`doctor`) return text for it to print.
#[test]
fn the_cli_prints_no_answer_with_println() {
    let mut found = vec![];
    let doctor = sources("")
        .into_iter()
        .filter(|(f, _)| f.ends_with("src/doctor.rs"));
    for (f, text) in sources("bin/mosaic").into_iter().chain(doctor) {
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            let bare = code
                .match_indices("print!(")
                .chain(code.match_indices("println!("))
                .any(|(i, _)| !code[..i].ends_with('e'));
            if bare {
                found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "print through out::line:\n{}",
        found.join("\n")
    );
}
