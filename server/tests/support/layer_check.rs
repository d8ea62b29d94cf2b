//! Checks that the imports between a crate's files point one way: each file is placed in a
//! layer, each layer may import only the layers its table lists below it, and no files of one
//! layer import each other in a circle. It reads every file under `src`, collects what it
//! imports (`use` trees, `crate::`/`super::`/`self::` paths in code, paths through its own
//! child modules), and reports an import that points up, a cycle within a layer, and a file
//! the table does not place. Test modules (`#[cfg(test)]` items) and comments do not count.
//!
//! Nothing but `std`: it reads source text and knows just enough Rust syntax for that. Shared
//! by the layer tests of several crates (`server/tests/layers.rs`, `gate/tests/layers.rs`,
//! `proxy/tests/layers.rs`), which include this file by path.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

pub struct Layer {
    pub name: &'static str,
    /// The lower layers its files may import (their own layer is always allowed).
    pub uses: &'static [&'static str],
}

/// A crate's layers, bottom to top, and the layer of each of its files under `src`: a file,
/// or a folder (ending in `/`) for all of its files (the longest match wins).
pub struct Layers {
    pub layers: &'static [Layer],
    pub files: &'static [(&'static str, &'static str)],
}

impl Layers {
    /// The table itself: each layer uses only layers below it, each file names a layer.
    pub fn table_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for used in layer.uses {
                if !self.layers[..i].iter().any(|l| l.name == *used) {
                    problems.push(format!(
                        "layer {} uses {used}, which is not below it",
                        layer.name
                    ));
                }
            }
        }
        for (file, layer) in self.files {
            if !self.layers.iter().any(|l| l.name == *layer) {
                problems.push(format!("{file}: unknown layer {layer}"));
            }
        }
        problems
    }

    fn layer_of(&self, rel: &str) -> Option<&'static Layer> {
        let (_, name) = self
            .files
            .iter()
            .filter(|(pattern, _)| {
                rel == *pattern || (pattern.ends_with('/') && rel.starts_with(pattern))
            })
            .max_by_key(|(pattern, _)| pattern.len())?;
        self.layers.iter().find(|l| l.name == *name)
    }
}

/// Checks the tree under `src`; one line per problem.
pub fn check(src: &Path, layers: &Layers) -> Vec<String> {
    let layer_of = |rel: &str| layers.layer_of(rel);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<Vec<String>, String> = files
        .iter()
        .map(|f| (module_of(&relative(src, f)), relative(src, f)))
        .collect();
    let test_only = test_only_files(src, &files);
    let mut problems = Vec::new();
    // file -> (imported file -> the first path that imports it)
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in &files {
        let rel = relative(src, file);
        if test_only.contains(&rel) {
            continue;
        }
        let text = fs::read_to_string(file).expect("readable source");
        let Some(parsed) = parse(&text) else {
            continue; // `#![cfg(test)]`
        };
        let module = module_of(&rel);
        for path in parsed.paths {
            let Some(absolute) = absolute(&module, &parsed.children, &path) else {
                continue; // another crate
            };
            let target = resolve(&modules, &absolute);
            if target != rel {
                graph
                    .entry(rel.clone())
                    .or_default()
                    .entry(target)
                    .or_insert_with(|| path.join("::"));
            }
        }
        graph.entry(rel).or_default();
    }
    for rel in graph.keys() {
        if layer_of(rel).is_none() {
            problems.push(format!("{rel}: not placed in a layer (add it to FILES)"));
        }
    }
    for (from, imports) in &graph {
        let Some(from_layer) = layer_of(from) else {
            continue;
        };
        for (to, path) in imports {
            let Some(to_layer) = layer_of(to) else {
                continue;
            };
            let allowed =
                from_layer.name == to_layer.name || from_layer.uses.contains(&to_layer.name);
            if !allowed {
                problems.push(format!(
                    "{from} ({}) imports `{path}` from {to} ({}): that points up",
                    from_layer.name, to_layer.name
                ));
            }
        }
    }
    // Once imports between layers point down only, any cycle lies within one layer: look for
    // cycles along the imports inside each layer.
    let within: BTreeMap<String, BTreeMap<String, String>> = graph
        .iter()
        .map(|(from, imports)| {
            let same = imports
                .iter()
                .filter(|(to, _)| layer_of(from).map(|l| l.name) == layer_of(to).map(|l| l.name))
                .map(|(to, path)| (to.clone(), path.clone()))
                .collect();
            (from.clone(), same)
        })
        .collect();
    for cycle in cycles(&within) {
        let mut edges = Vec::new();
        for (i, from) in cycle.iter().enumerate() {
            let to = &cycle[(i + 1) % cycle.len()];
            edges.push(format!("{from} -> {to} (`{}`)", within[from][to]));
        }
        problems.push(format!("import cycle: {}", edges.join(", ")));
    }
    problems
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .expect("readable folder")
        .map(|e| e.expect("folder entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

fn relative(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// `conn/http1.rs` -> [conn, http1]; `conn/mod.rs` -> [conn]; `lib.rs` -> [].
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// Files declared by a `#[cfg(test)] mod name;` of their parent: test code, not checked.
fn test_only_files(src: &Path, files: &[PathBuf]) -> BTreeSet<String> {
    let mut test_only = BTreeSet::new();
    for file in files {
        let text = fs::read_to_string(file).expect("readable source");
        let rel = relative(src, file);
        let module = module_of(&rel);
        for child in test_modules(&tokens(&text)) {
            let mut m = module.clone();
            m.push(child);
            let dir = m.join("/");
            test_only.insert(format!("{dir}.rs"));
            test_only.insert(format!("{dir}/mod.rs"));
        }
    }
    test_only
}

/// The file holding the longest prefix of `path` that is a module (the root if none is).
fn resolve(modules: &BTreeMap<Vec<String>, String>, path: &[String]) -> String {
    (0..=path.len())
        .rev()
        .find_map(|n| modules.get(&path[..n]).cloned())
        .unwrap_or_else(|| "lib.rs".to_string())
}

/// `path` as written in `module` (with child modules `children`) made absolute from the
/// crate root, or None if it names another crate.
fn absolute(
    module: &[String],
    children: &BTreeSet<String>,
    path: &[String],
) -> Option<Vec<String>> {
    let mut out: Vec<String> = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => module.to_vec(),
        first if children.contains(first) => module.to_vec(),
        _ => return None,
    };
    let mut rest = match path[0].as_str() {
        "crate" | "self" => &path[1..],
        _ => path,
    };
    while rest.first().is_some_and(|s| s == "super") {
        out.pop();
        rest = &rest[1..];
    }
    out.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(out)
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

/// The tokens of `text` that matter here: comments, string and char literals, numbers and
/// lifetimes are dropped.
fn tokens(text: &str) -> Vec<Token> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_string(&c, i + 1);
        } else if let Some(end) = raw_string_start(&c, i).filter(|_| ch == 'r' || ch == 'b') {
            i = end;
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): skip either.
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // `r#ident`
            if word == "r" && c.get(i) == Some(&'#') {
                i += 1;
                continue;
            }
            out.push(Token::Ident(word));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                i += 1;
            }
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Token::PathSep);
            i += 2;
        } else {
            if !ch.is_whitespace() {
                out.push(Token::Punct(ch));
            }
            i += 1;
        }
    }
    out
}

/// Past the end of a string whose body starts at `i`.
fn skip_string(c: &[char], mut i: usize) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// If `r"`, `r#"`, `b"`, `br"`, `br#"` starts at `i`: the index past the literal.
fn raw_string_start(c: &[char], i: usize) -> Option<usize> {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None; // inside an identifier
    }
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
        if c.get(j) == Some(&'"') {
            return Some(skip_string(c, j + 1));
        }
        if c.get(j) == Some(&'\'') {
            // b'x' or b'\n'
            j += 1;
            if c.get(j) == Some(&'\\') {
                j += 1;
            }
            j += 1;
            return (c.get(j) == Some(&'\'')).then_some(j + 1);
        }
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(j)
}

struct Parsed {
    /// Child modules declared here (`mod name;`), which relative paths may start with.
    children: BTreeSet<String>,
    /// Every path into the crate or a child module, as written (`use` trees expanded).
    paths: Vec<Vec<String>>,
}

/// Test modules declared as files here (`#[cfg(test)] mod name;`).
fn test_modules(toks: &[Token]) -> Vec<String> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if is_cfg_test(toks, i) {
            let after = skip_attributes(toks, i);
            if let [Token::Ident(m), Token::Ident(name), Token::Punct(';'), ..] = &toks[after..] {
                if m == "mod" {
                    found.push(name.clone());
                }
            }
        }
        i += 1;
    }
    found
}

/// None if the whole file is a test module (`#![cfg(test)]`).
fn parse(text: &str) -> Option<Parsed> {
    let toks = tokens(text);
    if toks.starts_with(&[
        Token::Punct('#'),
        Token::Punct('!'),
        Token::Punct('['),
        Token::Ident("cfg".into()),
        Token::Punct('('),
        Token::Ident("test".into()),
    ]) {
        return None;
    }
    let toks = without_test_items(&toks);
    let mut children = BTreeSet::new();
    for w in toks.windows(3) {
        if let [Token::Ident(m), Token::Ident(name), Token::Punct(';')] = w {
            if m == "mod" {
                children.insert(name.clone());
            }
        }
    }
    let mut paths = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Token::Ident(w) if w == "use" => {
                let end = (i..toks.len())
                    .find(|&j| toks[j] == Token::Punct(';'))
                    .unwrap_or(toks.len());
                use_tree(&toks[i + 1..end], &mut Vec::new(), &mut paths);
                i = end + 1;
            }
            // `pub(in crate::x)` is a visibility, not an import.
            Token::Ident(w) if w == "in" && i > 0 && toks[i - 1] == Token::Punct('(') => {
                while i < toks.len() && toks[i] != Token::Punct(')') {
                    i += 1;
                }
            }
            Token::Ident(w)
                if toks.get(i + 1) == Some(&Token::PathSep)
                    && (matches!(w.as_str(), "crate" | "super" | "self") || children.contains(w))
                    // `a::b::c`: only where a path starts, not in the middle of one.
                    && (i == 0 || toks[i - 1] != Token::PathSep) =>
            {
                let mut path = vec![w.clone()];
                let mut j = i + 1;
                while toks.get(j) == Some(&Token::PathSep) {
                    match toks.get(j + 1) {
                        Some(Token::Ident(next)) => path.push(next.clone()),
                        _ => break,
                    }
                    j += 2;
                }
                paths.push(path);
                i = j;
            }
            _ => i += 1,
        }
    }
    Some(Parsed { children, paths })
}

/// The paths a `use` tree names (after `use`, before `;`), each with `prefix` in front.
fn use_tree(toks: &[Token], prefix: &mut Vec<String>, into: &mut Vec<Vec<String>>) {
    let toks = match toks.first() {
        Some(Token::PathSep) => &toks[1..],
        _ => toks,
    };
    let depth = prefix.len();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Token::Ident(w) if w == "as" => {
                i += 2; // the alias
                continue;
            }
            Token::Ident(w) if w == "self" => {} // `{self, ..}`: the module itself
            Token::Ident(w) => prefix.push(w.clone()),
            Token::PathSep => {}
            Token::Punct('*') => {}
            Token::Punct('{') => {
                // Split the group at its top-level commas.
                let close = matching(toks, i);
                let mut start = i + 1;
                let mut level = 0;
                for j in i + 1..close {
                    match toks[j] {
                        Token::Punct('{') => level += 1,
                        Token::Punct('}') => level -= 1,
                        Token::Punct(',') if level == 0 => {
                            use_tree(&toks[start..j], prefix, into);
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
                if start < close {
                    use_tree(&toks[start..close], prefix, into);
                }
                prefix.truncate(depth);
                return;
            }
            _ => {}
        }
        i += 1;
    }
    if prefix.len() > depth || depth > 0 {
        into.push(prefix.clone());
    }
    prefix.truncate(depth);
}

/// The index of the bracket closing the one at `open`.
fn matching(toks: &[Token], open: usize) -> usize {
    let (o, c) = match toks[open] {
        Token::Punct('{') => ('{', '}'),
        Token::Punct('[') => ('[', ']'),
        _ => ('(', ')'),
    };
    let mut level = 0;
    for (j, t) in toks.iter().enumerate().skip(open) {
        if *t == Token::Punct(o) {
            level += 1;
        } else if *t == Token::Punct(c) {
            level -= 1;
            if level == 0 {
                return j;
            }
        }
    }
    toks.len()
}

/// `#[cfg(test)]` starts at `i`.
fn is_cfg_test(toks: &[Token], i: usize) -> bool {
    toks[i..].starts_with(&[
        Token::Punct('#'),
        Token::Punct('['),
        Token::Ident("cfg".into()),
        Token::Punct('('),
        Token::Ident("test".into()),
        Token::Punct(')'),
        Token::Punct(']'),
    ])
}

/// The index past the attributes starting at `i`.
fn skip_attributes(toks: &[Token], mut i: usize) -> usize {
    while toks.get(i) == Some(&Token::Punct('#')) && toks.get(i + 1) == Some(&Token::Punct('[')) {
        i = matching(toks, i + 1) + 1;
    }
    i
}

/// `toks` without the items marked `#[cfg(test)]` (test modules, test-only functions).
fn without_test_items(toks: &[Token]) -> Vec<Token> {
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        if !is_cfg_test(toks, i) {
            out.push(toks[i].clone());
            i += 1;
            continue;
        }
        // The item ends at its `;` or at the end of its first top-level `{ .. }` block.
        i = skip_attributes(toks, i);
        while i < toks.len() {
            match toks[i] {
                Token::Punct(';') => {
                    i += 1;
                    break;
                }
                Token::Punct('{') => {
                    i = matching(toks, i) + 1;
                    break;
                }
                Token::Punct('(') | Token::Punct('[') => i = matching(toks, i) + 1,
                _ => i += 1,
            }
        }
    }
    out
}

/// The strongly connected components of more than one file (Tarjan), each in cycle order
/// where one exists along the edges, files sorted otherwise.
fn cycles(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        if let Some(edges) = s.graph.get(v) {
            for w in edges.keys() {
                let w = w.as_str();
                if !s.graph.contains_key(w) {
                    continue;
                }
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let low = s.low[v].min(s.low[w]);
                    s.low.insert(v, low);
                } else if s.on_stack.contains(w) {
                    let low = s.low[v].min(s.index[w]);
                    s.low.insert(v, low);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            loop {
                let w = s.stack.pop().expect("on the stack");
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.found.push(cycle_order(s.graph, component));
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found
}

/// A closed walk through every file of a component, as short as a simple search finds (files
/// may repeat), so the message shows which import closes each loop.
fn cycle_order(
    graph: &BTreeMap<String, BTreeMap<String, String>>,
    mut component: Vec<String>,
) -> Vec<String> {
    component.sort();
    let members: BTreeSet<&str> = component.iter().map(String::as_str).collect();
    // Shortest path between members, by breadth-first search inside the component.
    let path = |from: &str, to: &str| -> Vec<String> {
        let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([from]);
        while let Some(v) = queue.pop_front() {
            for w in graph[v].keys() {
                let w = w.as_str();
                if !members.contains(w) || prev.contains_key(w) {
                    continue;
                }
                prev.insert(w, v);
                if w == to {
                    let mut p = vec![to.to_string()];
                    let mut at = to;
                    while prev[at] != from {
                        at = prev[at];
                        p.push(at.to_string());
                    }
                    p.reverse();
                    return p;
                }
                queue.push_back(w);
            }
        }
        Vec::new()
    };
    let mut walk = vec![component[0].clone()];
    let mut seen: BTreeSet<String> = walk.iter().cloned().collect();
    for target in &component[1..] {
        if seen.contains(target) {
            continue;
        }
        let at = walk.last().expect("not empty").clone();
        for step in path(&at, target) {
            seen.insert(step.clone());
            walk.push(step);
        }
    }
    // Back to the start.
    let at = walk.last().expect("not empty").clone();
    let back = path(&at, &walk[0]);
    walk.extend(
        back.into_iter()
            .filter(|f| f != &walk[0])
            .collect::<Vec<_>>(),
    );
    walk
}
