//! The module map of `docs/architecture.md` and the list in `src/lib.rs` stay true: every
//! top-level module is in both, and each module imports only modules listed below it (the
//! front ends indented under `src/server.rs` import none of one another, but for the one
//! documented exception: `simulate` borrows `proxy`'s `route::HostBuf`).

// Tests unwrap: a failed unwrap is a failed test (the crate denies it elsewhere).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Imports the map allows across front ends of the same level.
const EXCEPTIONS: &[(&str, &str)] = &[("simulate", "proxy")];

/// One module of the map: its name, its place from the top, and the group of front ends it
/// belongs to (indented entries), if any.
struct Entry {
    rank: usize,
    group: Option<usize>,
}

/// The module map's block: `src/NAME` entries, top to bottom.
fn module_map() -> BTreeMap<String, Entry> {
    let doc = std::fs::read_to_string("docs/architecture.md").unwrap();
    let start = doc.find("## Module map").expect("a module map");
    let block = doc[start..].split("```").nth(1).expect("the map's block");
    let mut map = BTreeMap::new();
    let mut group = 0;
    for (rank, line) in block.lines().enumerate() {
        let trimmed = line.trim_start();
        let Some(path) = trimmed.strip_prefix("src/") else {
            continue;
        };
        let name = path
            .split(|c: char| c == '/' || c == '.' || c.is_whitespace())
            .next()
            .unwrap();
        if name == "main" {
            continue;
        }
        let indented = trimmed.len() < line.len();
        if !indented {
            group += 1;
        }
        let group = indented.then_some(group);
        map.insert(name.to_string(), Entry { rank, group });
    }
    map
}

/// `pub mod NAME;` of `src/lib.rs`.
fn top_modules() -> BTreeSet<String> {
    let lib = std::fs::read_to_string("src/lib.rs").unwrap();
    lib.lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';').to_string())
        .collect()
}

/// The top-level names a `crate::` path names: `crate::a::b` → `a`, `crate::{a, b::{c}}` →
/// `a`, `b`.
fn crate_names(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(inner) = rest.strip_prefix('{') {
            let (mut depth, mut item) = (0usize, String::new());
            let mut items = Vec::new();
            for c in inner.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                    _ if depth == 0 => item.push(c),
                    _ => {}
                }
            }
            items.push(item);
            names.extend(items.iter().filter_map(|i| first_ident(i)));
        } else if let Some(name) = first_ident(rest) {
            names.push(name);
        }
    }
    names
}

fn first_ident(text: &str) -> Option<String> {
    let name: String = text
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `(from, to, file)` for every import of one top-level module by another, comments
/// (doc links included) left out.
fn imports(modules: &BTreeSet<String>) -> Vec<(String, String, String)> {
    let mut files = Vec::new();
    sources(Path::new("src"), &mut files);
    let mut found = Vec::new();
    for file in files {
        let rel = file.strip_prefix("src").unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let from = first.trim_end_matches(".rs").to_string();
        if !modules.contains(&from) {
            continue;
        }
        let code: String = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for to in crate_names(&code) {
            if to != from && modules.contains(&to) {
                found.push((from.clone(), to, file.display().to_string()));
            }
        }
    }
    found
}

#[test]
fn every_top_level_module_is_in_the_map_and_in_the_crate_docs() {
    let modules = top_modules();
    assert!(modules.len() > 10, "{modules:?}");
    let map = module_map();
    let mapped: BTreeSet<String> = map.keys().cloned().collect();
    assert_eq!(mapped, modules, "docs/architecture.md's module map");
    let lib = std::fs::read_to_string("src/lib.rs").unwrap();
    for m in &modules {
        assert!(
            lib.contains(&format!("//! - [`{m}`]:")),
            "src/lib.rs's module doc has no line for `{m}`"
        );
    }
}

#[test]
fn modules_import_only_what_the_map_puts_below_them() {
    let map = module_map();
    let modules: BTreeSet<String> = map.keys().cloned().collect();
    let found = imports(&modules);
    assert!(
        found
            .iter()
            .any(|(f, t, _)| f == "runtime" && t == "config"),
        "the scan finds imports"
    );
    let mut wrong = BTreeSet::new();
    for (from, to, file) in &found {
        let (a, b) = (&map[from], &map[to]);
        let siblings = a.group.is_some() && a.group == b.group;
        let allowed = EXCEPTIONS.contains(&(from.as_str(), to.as_str()));
        if (b.rank <= a.rank || siblings) && !allowed {
            wrong.insert(format!("{from} -> {to} ({file})"));
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against docs/architecture.md's module map: {wrong:#?}"
    );
}

#[test]
fn the_scan_reads_grouped_and_nested_paths() {
    let code = "use crate::{config::{a, b}, limits};\nlet x = crate::runtime::policy::f();";
    assert_eq!(crate_names(code), ["config", "limits", "runtime"]);
}
