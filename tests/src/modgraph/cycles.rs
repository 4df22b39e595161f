//! Cycles among a crate's modules (strongly connected components of more than one module)
//! and their comparison with a checked-in baseline.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// How many items an edge's description names.
const ITEMS_SHOWN: usize = 3;

/// One dependency inside a cycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CycleEdge {
    pub from: String,
    pub to: String,
    /// The items of `to` that `from` uses, sorted.
    pub items: Vec<String>,
}

/// A strongly connected component of more than one module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cycle {
    /// The crate's name.
    pub krate: String,
    /// The modules (relative to the crate root, `crate` for the root) and their files, sorted.
    pub modules: Vec<(String, String)>,
    /// The dependencies between the component's modules, sorted.
    pub edges: Vec<CycleEdge>,
}

impl Cycle {
    /// The module names, sorted.
    pub fn module_names(&self) -> BTreeSet<String> {
        self.modules.iter().map(|(m, _)| m.clone()).collect()
    }

    /// The cycle's line in the baseline: `<crate>: mod1 mod2 ...`.
    pub fn baseline_line(&self) -> String {
        let names: Vec<String> = self.module_names().into_iter().collect();
        format!("{}: {}", self.krate, names.join(" "))
    }

    /// A description of the cycle: its modules with their files, and each edge with up to
    /// three of the items that make it.
    pub fn report(&self) -> String {
        let mut out = format!("{} ({} modules)\n", self.krate, self.modules.len());
        for (module, file) in &self.modules {
            let _ = writeln!(out, "    {module}  [{file}]");
        }
        for e in &self.edges {
            let mut shown: Vec<&str> = e
                .items
                .iter()
                .take(ITEMS_SHOWN)
                .map(String::as_str)
                .collect();
            let more = e.items.len().saturating_sub(ITEMS_SHOWN);
            let extra = format!("+{more} more");
            if more > 0 {
                shown.push(&extra);
            }
            let _ = writeln!(out, "    {} -> {} ({})", e.from, e.to, shown.join(", "));
        }
        out
    }
}

/// The cycles of the crate `krate` whose modules are `modules` (path and file, by index)
/// and whose edges are `edges` (`(from, to)` → the items), largest first.
pub(crate) fn find(
    krate: &str,
    modules: &[(String, String)],
    edges: &BTreeMap<(usize, usize), BTreeSet<String>>,
) -> Vec<Cycle> {
    let mut adj = vec![Vec::new(); modules.len()];
    for &(a, b) in edges.keys() {
        adj[a].push(b);
    }
    let mut out: Vec<Cycle> = tarjan(&adj)
        .into_iter()
        .filter(|scc| scc.len() > 1)
        .map(|scc| {
            let members: BTreeSet<usize> = scc.into_iter().collect();
            let mut cycle_modules: Vec<(String, String)> =
                members.iter().map(|&i| modules[i].clone()).collect();
            cycle_modules.sort();
            let mut cycle_edges: Vec<CycleEdge> = edges
                .iter()
                .filter(|((a, b), _)| members.contains(a) && members.contains(b))
                .map(|(&(a, b), items)| CycleEdge {
                    from: modules[a].0.clone(),
                    to: modules[b].0.clone(),
                    items: items.iter().cloned().collect(),
                })
                .collect();
            cycle_edges.sort_by(|x, y| (&x.from, &x.to).cmp(&(&y.from, &y.to)));
            Cycle {
                krate: krate.to_string(),
                modules: cycle_modules,
                edges: cycle_edges,
            }
        })
        .collect();
    sort_largest_first(&mut out);
    out
}

/// Sorts cycles by size (largest first), then crate and modules.
pub fn sort_largest_first(cycles: &mut [Cycle]) {
    cycles.sort_by(|a, b| {
        b.modules
            .len()
            .cmp(&a.modules.len())
            .then_with(|| a.krate.cmp(&b.krate))
            .then_with(|| a.modules.cmp(&b.modules))
    });
}

/// Tarjan's strongly connected components of the graph `adj` (iterative).
fn tarjan(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let n = adj.len();
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut next = 0;
    let mut sccs = Vec::new();
    for start in 0..n {
        if index[start] != UNSEEN {
            continue;
        }
        // (node, position of the next successor to look at)
        let mut work = vec![(start, 0)];
        index[start] = next;
        low[start] = next;
        next += 1;
        stack.push(start);
        on_stack[start] = true;
        while let Some(&mut (v, ref mut pos)) = work.last_mut() {
            if let Some(&w) = adj[v].get(*pos) {
                *pos += 1;
                if index[w] == UNSEEN {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut scc = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                sccs.push(scc);
            }
        }
    }
    sccs
}

/// One line of the baseline.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Known {
    krate: String,
    modules: BTreeSet<String>,
}

/// Parses the baseline: one `<crate>: mod1 mod2 ...` line per known cycle; blank lines and
/// lines starting with `#` are ignored.
fn parse_baseline(text: &str) -> Result<Vec<Known>, String> {
    let mut known = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (krate, modules) = line
            .split_once(':')
            .ok_or_else(|| format!("baseline line {}: expected `<crate>: mod1 mod2 ...`", n + 1))?;
        let modules: BTreeSet<String> = modules.split_whitespace().map(str::to_string).collect();
        if modules.len() < 2 {
            return Err(format!(
                "baseline line {}: a cycle has at least two modules",
                n + 1
            ));
        }
        known.push(Known {
            krate: krate.trim().to_string(),
            modules,
        });
    }
    Ok(known)
}

/// Compares `cycles` with the baseline `text`. Fails when a cycle is not within one baseline
/// line (a new cycle, or one that grew), or when a baseline line matches no cycle exactly (a
/// cycle was broken or shrank: the baseline only ever shrinks). The error describes the
/// offending cycles and gives the baseline for the current code.
pub fn check_baseline(cycles: &[Cycle], text: &str) -> Result<(), String> {
    let known = parse_baseline(text)?;
    let covers =
        |k: &Known, c: &Cycle| k.krate == c.krate && c.module_names().is_subset(&k.modules);
    let uncovered: Vec<&Cycle> = cycles
        .iter()
        .filter(|c| !known.iter().any(|k| covers(k, c)))
        .collect();
    let current: BTreeMap<(String, BTreeSet<String>), &Cycle> = cycles
        .iter()
        .map(|c| ((c.krate.clone(), c.module_names()), c))
        .collect();
    let stale: Vec<&Known> = known
        .iter()
        .filter(|k| !current.contains_key(&(k.krate.clone(), k.modules.clone())))
        .collect();
    if uncovered.is_empty() && stale.is_empty() {
        return Ok(());
    }
    let mut msg = String::from("the module graph's cycles differ from the baseline\n");
    if !uncovered.is_empty() {
        msg.push_str("\nNew cycles, or cycles grown beyond their baseline line (break them):\n\n");
        for c in &uncovered {
            msg.push_str(&c.report());
            let grown: Vec<String> = known
                .iter()
                .filter(|k| k.krate == c.krate && !k.modules.is_disjoint(&c.module_names()))
                .map(|k| format!("{}: {}", k.krate, join(&k.modules)))
                .collect();
            for line in grown {
                let _ = writeln!(msg, "    (overlaps the baseline line `{line}`)");
            }
            msg.push('\n');
        }
    }
    if !stale.is_empty() {
        msg.push_str("\nBaseline lines that match no current cycle (one was broken or shrank):\n");
        for k in &stale {
            let _ = writeln!(msg, "    {}: {}", k.krate, join(&k.modules));
        }
        let within: Vec<&Cycle> = cycles
            .iter()
            .filter(|c| stale.iter().any(|k| covers(k, c)))
            .collect();
        if !within.is_empty() {
            msg.push_str("Current cycles within those lines:\n\n");
            for c in within {
                msg.push_str(&c.report());
                msg.push('\n');
            }
        }
    }
    msg.push_str(
        "\nThe baseline for the current code (replace the file's cycle lines with these):\n\n",
    );
    for c in cycles {
        let _ = writeln!(msg, "{}", c.baseline_line());
    }
    Err(msg)
}

fn join(names: &BTreeSet<String>) -> String {
    names
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(" ")
}
