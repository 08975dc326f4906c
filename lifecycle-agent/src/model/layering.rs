//! The model's one rule, checked: it is pure. Its sources may not import the crate's I/O layers
//! (`agent`, `cli`, `discovery`, `export`, `kernel`, `probe`) nor crates and std modules that do
//! I/O or read a clock. A new `use` that breaks this fails the unit tier.

use std::path::Path;

/// Crate modules the model may not reach.
const IO_LAYERS: [&str; 6] = ["agent", "cli", "discovery", "export", "kernel", "probe"];
/// Paths that mean I/O or a clock, wherever they appear in model code.
const IO_PATHS: [&str; 12] = [
    "aya::",
    "tokio::",
    "procfs::",
    "hyper::",
    "tonic::",
    "k8s_cri::",
    "libc::",
    "std::fs",
    "std::net",
    "std::process",
    "SystemTime::now",
    "Instant::now",
];

/// Every forbidden reference in one source file, as `line: what`.
fn forbidden_references(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    let code: Vec<(usize, &str)> = source
        .lines()
        .enumerate()
        .map(|(n, line)| (n + 1, line.split("//").next().unwrap_or("")))
        .filter(|(_, line)| !line.trim().is_empty())
        .collect();
    for (n, line) in &code {
        for path in IO_PATHS {
            if line.contains(path) {
                found.push(format!("{n}: {path}"));
            }
        }
        for layer in IO_LAYERS {
            if line.contains(&format!("crate::{layer}")) || line.contains(&format!("super::super::{layer}")) {
                found.push(format!("{n}: crate::{layer}"));
            }
        }
    }
    // `use crate::{ kernel::x, ... }`: the top-level names of a grouped crate import.
    let joined: String = code.iter().map(|(_, l)| *l).collect::<Vec<_>>().join("\n");
    let mut rest = joined.as_str();
    while let Some(start) = rest.find("crate::{") {
        let group = &rest[start + "crate::{".len()..];
        let mut depth = 0usize;
        let mut at_item = true;
        let mut token = String::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => at_item = true,
                c if at_item && depth == 0 && (c.is_alphanumeric() || c == '_') => token.push(c),
                _ if at_item && !token.is_empty() => {
                    if IO_LAYERS.contains(&token.as_str()) {
                        found.push(format!("group: crate::{token}"));
                    }
                    token.clear();
                    at_item = false;
                }
                _ => {}
            }
        }
        rest = &group[1..];
    }
    found
}

fn model_sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("model sources are readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            model_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("layering.rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_model_imports_no_io_layer() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/model");
    let mut files = Vec::new();
    model_sources(&dir, &mut files);
    assert!(files.len() > 10, "found only {files:?}");
    let violations: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let source = std::fs::read_to_string(file).expect("readable");
            forbidden_references(&source).into_iter().map(move |v| format!("{}:{v}", file.display()))
        })
        .collect();
    assert!(violations.is_empty(), "the model must stay pure:\n{}", violations.join("\n"));
}

#[test]
fn the_checker_sees_direct_grouped_and_std_imports() {
    let source = "use crate::kernel::Sensor;\nuse crate::{\n    model::event::Event,\n    discovery::cri::CriClient,\n};\nlet now = std::time::Instant::now();\n// crate::agent in a comment is fine\n";
    assert_eq!(
        forbidden_references(source),
        vec!["1: crate::kernel".to_owned(), "6: Instant::now".to_owned(), "group: crate::discovery".to_owned()]
    );
    assert!(forbidden_references("use crate::model::{backoff::Verdict, node::Unit};\n").is_empty());
}
