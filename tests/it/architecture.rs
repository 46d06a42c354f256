//! The module order of `src/lib.rs` is enforced: a module may name (`crate::x`) only modules
//! below it in the documented order, so no change can quietly add an upward arrow. The order
//! is read from the crate docs, and `docs/architecture.md` must state the same order.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The order line of a document: `Layers, top to bottom: a > b > c`.
fn order_in(text: &str) -> Vec<String> {
    let line = text
        .lines()
        .find_map(|l| l.split_once("Layers, top to bottom:").map(|(_, r)| r.to_owned()))
        .expect("an order line `Layers, top to bottom: a > b > ...`");
    line.trim_end_matches('`').split('>').map(|m| m.trim().trim_matches('`').to_owned()).collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The crate modules named by `crate::<name>` in a module's code (comments left out).
fn named_modules(module: &str) -> BTreeSet<(String, String)> {
    let src = Path::new(ROOT).join("src");
    let mut files = Vec::new();
    if src.join(module).is_dir() {
        rust_files(&src.join(module), &mut files);
    }
    if src.join(format!("{module}.rs")).is_file() {
        files.push(src.join(format!("{module}.rs")));
    }
    assert!(!files.is_empty(), "module {module} has no source files");
    let mut named = BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        // Comments out, lines joined: a `crate::{` group may span lines.
        let code: Vec<&str> = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect();
        let code = code.join(" ");
        let shown = f.strip_prefix(ROOT).unwrap().display().to_string();
        let mut rest = code.as_str();
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            for name in heads(rest) {
                named.insert((name, shown.clone()));
            }
        }
    }
    named
}

/// The first path segment(s) after `crate::`: one name, or each name of a group
/// `{a::x, b, c::{..}}`.
fn heads(rest: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
    };
    let Some(group) = rest.strip_prefix('{') else { return vec![ident(rest)] };
    let (mut depth, mut start, mut out) = (0usize, 0usize, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                out.push(ident(&group[start..i]));
                break;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(ident(&group[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

#[test]
fn no_module_names_a_module_above_it() {
    let lib = std::fs::read_to_string(Path::new(ROOT).join("src/lib.rs")).unwrap();
    let order = order_in(&lib);
    assert!(order.len() >= 8, "{order:?}");
    let declared: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| {
            ["pub mod ", "pub(crate) mod ", "mod "].iter().find_map(|p| l.strip_prefix(p))
        })
        .map(|l| l.trim_end_matches(';').to_owned())
        .collect();
    let ordered: BTreeSet<String> = order.iter().cloned().collect();
    assert_eq!(declared, ordered, "every module of lib.rs is in the order, and only those");
    let mut upward = Vec::new();
    for (rank, module) in order.iter().enumerate() {
        for (name, file) in named_modules(module) {
            match order.iter().position(|m| *m == name) {
                Some(r) if r > rank => {}
                Some(r) if r == rank => {}
                Some(_) => upward.push(format!("{file}: {module} -> {name}")),
                None => {}
            }
        }
    }
    assert!(upward.is_empty(), "upward arrows (order {order:?}):\n{}", upward.join("\n"));
}

#[test]
fn the_architecture_doc_states_the_same_order() {
    let lib = std::fs::read_to_string(Path::new(ROOT).join("src/lib.rs")).unwrap();
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/architecture.md")).unwrap();
    assert_eq!(order_in(&lib), order_in(&doc));
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    assert!(readme.contains("docs/architecture.md"), "README links the architecture doc");
}

#[test]
fn an_upward_arrow_is_seen() {
    // The scanner itself: the CLI names the app (downward), so it finds that arrow.
    assert!(named_modules("cli").iter().any(|(m, _)| m == "app"));
    assert_eq!(order_in("x\n//! Layers, top to bottom: `a > b > c`\n"), ["a", "b", "c"]);
    // A grouped import names each of its modules.
    assert_eq!(heads("{node::Node, app, control::{pb, client}};"), ["node", "app", "control"]);
    assert_eq!(heads("store::fs::StdFs;"), ["store"]);
    assert_eq!(heads("{\n    app::App,\n    node::{Node, NodeStatus},\n};"), ["app", "node"]);
}
