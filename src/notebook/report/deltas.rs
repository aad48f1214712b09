//! Each component's and each owner's bytes over a cell: the record's `by_component` and
//! `by_owner`, from the tracked readings before and after it.

use crate::notebook::protocol::{Held, PlaceReading};
use serde::{Deserialize, Serialize};

/// One component's bytes over a cell.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentDelta {
    /// What the bytes are: a component, or the allocator's cached free memory.
    pub component: Held,
    /// Live at the start of the cell (`None`: not read then).
    pub before: Option<u64>,
    /// Live at the end.
    pub after: u64,
    /// Its highest during the cell (start + its rise), when the cell's changes are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak: Option<u64>,
}

impl ComponentDelta {
    /// after − before, when both are known.
    pub(crate) fn delta(&self) -> Option<i64> {
        self.before.map(|b| self.after as i64 - b as i64)
    }
}

/// One owner's bytes over a cell (the framework or library that holds them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerDelta {
    /// The framework's word (`candle`, `burn/cubecl`, `cudarc`, `cuBLAS`, `gpumem-nb`, …).
    pub owner: String,
    /// Live at the start of the cell (`None`: not read then).
    pub before: Option<u64>,
    /// Live at the end.
    pub after: u64,
    /// Its highest during the cell, when the cell's changes are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak: Option<u64>,
}

impl OwnerDelta {
    /// after − before, when both are known.
    pub fn delta(&self) -> Option<i64> {
        self.before.map(|b| self.after as i64 - b as i64)
    }
}

/// Each component's bytes before and after a cell, in the order the readings list them (the
/// `after` reading's, then any only the `before` one had). `before` is known where the reading
/// before the cell classified its bytes, or where the place held nothing then (`known_start`
/// without a reading).
pub(super) fn component_deltas(b: Option<&PlaceReading>, a: &PlaceReading, known_start: bool) -> Vec<ComponentDelta> {
    if a.by_component.is_empty() {
        return Vec::new();
    }
    let before_of = |c: Held| -> Option<u64> {
        match b {
            Some(b) if !b.by_component.is_empty() || b.live == 0 => {
                Some(b.by_component.iter().find(|x| x.component == c).map_or(0, |x| x.live))
            }
            Some(_) => None,
            None => known_start.then_some(0),
        }
    };
    // The cell's changes were known where any component carries a rise.
    let rises_known = a.by_component.iter().any(|x| x.rise.is_some());
    let mut out: Vec<ComponentDelta> = a
        .by_component
        .iter()
        .map(|x| {
            let before = before_of(x.component);
            let peak = before.zip(x.rise).map(|(b, r)| (b + r).max(x.live));
            ComponentDelta { component: x.component, before, after: x.live, peak }
        })
        .collect();
    for x in b.map(|b| b.by_component.as_slice()).unwrap_or_default() {
        if !out.iter().any(|o| o.component == x.component) {
            let peak = (rises_known && x.component != Held::Cached).then_some(x.live);
            out.push(ComponentDelta { component: x.component, before: Some(x.live), after: 0, peak });
        }
    }
    out
}

/// Each owner's bytes before and after a cell (as [`component_deltas`] for components):
/// largest after the cell first, then those that held memory only before it.
pub(super) fn owner_deltas(b: Option<&PlaceReading>, a: &PlaceReading, known_start: bool) -> Vec<OwnerDelta> {
    if a.by_owner.is_empty() && b.is_none_or(|b| b.by_owner.is_empty()) {
        return Vec::new();
    }
    let before_of = |o: &str| -> Option<u64> {
        match b {
            Some(b) if !b.by_owner.is_empty() || b.live == 0 => {
                Some(b.by_owner.iter().find(|x| x.owner == o).map_or(0, |x| x.live))
            }
            Some(_) => None,
            None => known_start.then_some(0),
        }
    };
    let rises_known = a.by_owner.iter().any(|x| x.rise.is_some());
    let mut out: Vec<OwnerDelta> = a
        .by_owner
        .iter()
        .map(|x| {
            let before = before_of(&x.owner);
            let peak = before.zip(x.rise).map(|(b, r)| (b + r).max(x.live));
            OwnerDelta { owner: x.owner.clone(), before, after: x.live, peak }
        })
        .collect();
    for x in b.map(|b| b.by_owner.as_slice()).unwrap_or_default() {
        if !out.iter().any(|o| o.owner == x.owner) {
            let peak = rises_known.then_some(x.live);
            out.push(OwnerDelta { owner: x.owner.clone(), before: Some(x.live), after: 0, peak });
        }
    }
    out
}
