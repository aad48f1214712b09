//! What the notebook's variables hold by a framework's own types in a cell's record
//! (`variables`): the session library's probe (burn 0.21) at the cell's end, per variable, and
//! per component before and after the cell; the words the line and the details table show it
//! with.

use crate::notebook::protocol::{VariableHeld, VariablesReading};
use crate::render::Table;
use crate::units::{iec, iec_delta, iec3, iec3_delta};
use serde::{Deserialize, Serialize};

/// The probe's answer at a cell's end, with each component's sum at the end of the cell probed
/// before it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariablesPart {
    /// The framework whose types were read (`burn`).
    pub framework: String,
    /// Where the numbers come from.
    pub source: String,
    /// Each variable holding tensors at the cell's end.
    pub variables: Vec<VariableHeld>,
    /// Per component (`parameter`, `optimizer_state`, `tensor`), in that order.
    pub components: Vec<VariableComponent>,
}

/// One component's logical bytes over a cell, summed over the variables.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariableComponent {
    /// `parameter`, `optimizer_state` or `tensor`.
    pub component: String,
    /// At the end of the cell probed before (`None`: none was).
    pub before: Option<u64>,
    /// At this cell's end.
    pub after: u64,
}

impl VariableComponent {
    fn delta(&self) -> Option<i64> {
        self.before.map(|b| self.after as i64 - b as i64)
    }
}

/// The order components are shown in.
const ORDER: [&str; 3] = ["parameter", "optimizer_state", "tensor"];

fn rank(component: &str) -> usize {
    ORDER.iter().position(|c| *c == component).unwrap_or(ORDER.len())
}

fn sums(r: &VariablesReading) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for v in &r.variables {
        match out.iter_mut().find(|(c, _)| *c == v.component) {
            Some((_, b)) => *b += v.bytes,
            None => out.push((v.component.clone(), v.bytes)),
        }
    }
    out
}

/// The part for a cell whose readings before and after it are `before` and `after`: `None`
/// unless the probe saw this cell's end (its number rose: a cell that stored no variable or
/// returned early leaves the last answer, which is not this cell's).
pub fn variables_part(before: Option<&VariablesReading>, after: Option<&VariablesReading>) -> Option<VariablesPart> {
    let after = after?;
    if before.is_some_and(|b| b.probe >= after.probe) {
        return None;
    }
    let was = before.map(sums);
    let now = sums(after);
    let mut names: Vec<&str> = now.iter().map(|(c, _)| c.as_str()).collect();
    for (c, _) in was.iter().flatten() {
        if !names.contains(&c.as_str()) {
            names.push(c);
        }
    }
    names.sort_by_key(|c| rank(c));
    let of = |s: &[(String, u64)], c: &str| s.iter().find(|(k, _)| k == c).map_or(0, |(_, b)| *b);
    let components = names
        .iter()
        .map(|c| VariableComponent {
            component: c.to_string(),
            before: was.as_deref().map(|w| of(w, c)),
            after: of(&now, c),
        })
        .collect();
    Some(VariablesPart {
        framework: after.framework.clone(),
        source: after.source.clone(),
        variables: after.variables.clone(),
        components,
    })
}

/// A type as Rust names it, without module paths (`Model<Autodiff<NdArray>>`).
fn short_type(t: &str) -> String {
    let mut out = String::new();
    let mut word = String::new();
    for ch in t.chars() {
        if ch.is_alphanumeric() || ch == '_' || ch == ':' {
            word.push(ch);
        } else {
            out.push_str(word.rsplit("::").next().unwrap_or(""));
            word.clear();
            out.push(ch);
        }
    }
    out.push_str(word.rsplit("::").next().unwrap_or(""));
    out
}

impl VariablesPart {
    /// The line's forms, longest first: each component with its change
    /// (`burn: parameter 1.55 MiB (+1.55 MiB), optimizer_state 3.11 MiB (+3.11 MiB)`), then the
    /// changes alone (`burn: parameter +1.55 MiB`), then the one that changed most, or where
    /// none did the largest held, without the framework's name, which the line's owner already
    /// says (`optimizer_state +3.11 MiB`). None where nothing changed and nothing is held.
    pub fn line_forms(&self) -> Vec<String> {
        let held: Vec<&VariableComponent> =
            self.components.iter().filter(|c| c.after > 0 || c.before.unwrap_or(0) > 0).collect();
        let change = |c: &VariableComponent| c.delta().filter(|d| *d != 0);
        let full: Vec<String> = held
            .iter()
            .map(|c| match change(c) {
                Some(d) => format!("{} {} ({})", c.component, iec3(c.after), iec3_delta(d)),
                None => format!("{} {}", c.component, iec3(c.after)),
            })
            .collect();
        let changed: Vec<String> =
            held.iter().filter_map(|c| Some(format!("{} {}", c.component, iec3_delta(change(c)?)))).collect();
        // Of equals, the first in the components' order (`max_by_key` keeps the last).
        let most = held.iter().rev().filter_map(|c| Some((c, change(c)?))).max_by_key(|(_, d)| d.unsigned_abs());
        let shortest = match most {
            Some((c, d)) => format!("{} {}", c.component, iec3_delta(d)),
            None => match held.iter().rev().max_by_key(|c| c.after) {
                Some(c) => format!("{} {}", c.component, iec3(c.after)),
                None => return Vec::new(),
            },
        };
        let mut forms = vec![format!("{}: {}", self.framework, full.join(", "))];
        if !changed.is_empty() {
            forms.push(format!("{}: {}", self.framework, changed.join(", ")));
        }
        forms.push(shortest);
        forms
    }

    /// The details table's rows: per component, then per variable.
    pub fn rows(&self, t: &mut Table) {
        let b = |v: Option<u64>| v.map_or_else(|| "–".into(), iec);
        for c in &self.components {
            t.row([
                format!("{} variables: {}", self.framework, c.component),
                b(c.before),
                iec(c.after),
                c.delta().map_or_else(|| "–".into(), iec_delta),
                "–".into(),
                self.source.clone(),
            ]);
        }
        for v in &self.variables {
            let lazy = if v.lazy > 0 { format!(", {} not initialised yet", v.lazy) } else { String::new() };
            t.row([
                format!("  `{}` ({}: {})", v.name, v.component, short_type(&v.type_name)),
                "–".into(),
                iec(v.bytes),
                "–".into(),
                "–".into(),
                format!("{} tensors{lazy}", v.tensors),
            ]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(name: &str, component: &str, bytes: u64) -> VariableHeld {
        VariableHeld {
            name: name.into(),
            component: component.into(),
            bytes,
            tensors: 2,
            lazy: 0,
            type_name: "demo::Model<burn_autodiff::backend::Autodiff<burn_ndarray::backend::NdArray>>".into(),
        }
    }

    fn reading(probe: u64, variables: Vec<VariableHeld>) -> VariablesReading {
        VariablesReading { framework: "burn".into(), probe, source: "probe".into(), variables }
    }

    #[test]
    fn a_cell_s_part_sums_components_against_the_cell_probed_before() {
        let before = reading(3, vec![held("model", "parameter", 1000), held("x", "tensor", 40)]);
        let after = reading(
            4,
            vec![
                held("model", "parameter", 1000),
                held("optim", "optimizer_state", 2000),
                held("m2", "parameter", 1000),
            ],
        );
        let p = variables_part(Some(&before), Some(&after)).unwrap();
        let c: Vec<(&str, Option<u64>, u64)> =
            p.components.iter().map(|c| (c.component.as_str(), c.before, c.after)).collect();
        assert_eq!(c, [("parameter", Some(1000), 2000), ("optimizer_state", Some(0), 2000), ("tensor", Some(40), 0)]);
        assert_eq!(p.variables.len(), 3);
        let forms = p.line_forms();
        assert_eq!(
            forms[0],
            "burn: parameter 1.95 KiB (+1000 B), optimizer_state 1.95 KiB (+1.95 KiB), tensor 0 B (-40 B)"
        );
        assert_eq!(forms[1], "burn: parameter +1000 B, optimizer_state +1.95 KiB, tensor -40 B");
        assert_eq!(forms[2], "optimizer_state +1.95 KiB", "the largest change alone");
        // The first probed cell: no before, the sums alone, then the largest held.
        let first = variables_part(None, Some(&after)).unwrap();
        assert!(first.components.iter().all(|c| c.before.is_none()));
        assert_eq!(first.line_forms(), ["burn: parameter 1.95 KiB, optimizer_state 1.95 KiB", "parameter 1.95 KiB"]);
    }

    #[test]
    fn a_cell_the_probe_did_not_see_has_no_part() {
        let r = reading(4, vec![held("model", "parameter", 1000)]);
        assert_eq!(variables_part(Some(&r), Some(&r)), None, "the same answer: not this cell's");
        assert_eq!(variables_part(Some(&r), None), None);
        let empty = variables_part(None, Some(&reading(1, vec![]))).unwrap();
        assert!(empty.line_forms().is_empty(), "nothing held, nothing on the line");
    }

    #[test]
    fn details_name_each_variable_with_its_type_short() {
        let p = variables_part(None, Some(&reading(1, vec![held("model", "parameter", 1000)]))).unwrap();
        let mut t = Table::new(["", "before", "after", "Δ", "peak in cell", "source"]);
        p.rows(&mut t);
        let text = t.to_text();
        assert!(text.contains("burn variables: parameter"), "{text}");
        assert!(text.contains("`model` (parameter: Model<Autodiff<NdArray>>)"), "{text}");
        assert!(text.contains("2 tensors"), "{text}");
    }
}
