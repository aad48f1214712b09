//! A watched framework's own numbers in a cell's record (`frameworks`): what it holds in use,
//! what it keeps cached and what it reserved, before and after the cell, per pool kind; the
//! words the line and the details table show them with; and what a re-run left behind.

use super::{CellRecord, Span};
use crate::notebook::protocol::{FrameworkPool, FrameworkReading};
use crate::render::Table;
use crate::units::{iec, iec_delta};
use serde::{Deserialize, Serialize};

/// One framework's books over a cell (cubecl's pools for burn): the sums of its pools, then per
/// pool kind. `in_use + padding + cached = reserved`, before and after. `before` is `None` when
/// the framework was first watched during the cell.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameworkPart {
    /// `cubecl`.
    pub framework: String,
    /// Its device, in its words (`cuda:0`).
    pub device: String,
    /// Where the numbers come from.
    pub source: String,
    /// Why there are no numbers after the cell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Bytes live allocations asked for (tensors, and the framework's own buffers).
    pub in_use: Span,
    /// Alignment padding inside them.
    pub padding: Span,
    /// Bytes held for reuse that no live allocation uses: "the framework keeps it cached".
    pub cached: Span,
    /// Bytes of the pools' pages: what the driver gave the framework.
    pub reserved: Span,
    /// Live allocations (not pages).
    pub allocations: Span,
    /// Per pool kind (cubecl: `sliced`, `adaptive`, `exclusive`, `direct`, `persistent`,
    /// `dedicated`), in the framework's order.
    pub kinds: Vec<PoolKindPart>,
}

/// The pools of one kind (one per stream, usually), summed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolKindPart {
    /// The kind.
    pub kind: String,
    /// How many pools of this kind there are after the cell.
    pub pools: u64,
    /// Their page size, when they all have one and the same.
    pub page_size: Option<u64>,
    /// Bytes in use.
    pub in_use: Span,
    /// Bytes cached (reserved − in use − padding).
    pub cached: Span,
    /// Bytes reserved (pages).
    pub reserved: Span,
    /// Pages held.
    pub pages: Span,
    /// The framework's page high-water marks, summed over the pools (each since its pool was
    /// made, not since the cell began).
    pub pages_peak: u64,
    /// The largest allocation any of them ever served.
    pub largest_alloc: u64,
}

/// Sums of a set of pools.
#[derive(Clone, Copy, Default)]
struct Sums {
    in_use: u64,
    padding: u64,
    reserved: u64,
    allocations: u64,
    pages: u64,
}

fn sums<'a>(pools: impl IntoIterator<Item = &'a FrameworkPool>) -> Sums {
    pools.into_iter().fold(Sums::default(), |s, p| Sums {
        in_use: s.in_use + p.in_use,
        padding: s.padding + p.padding,
        reserved: s.reserved + p.reserved,
        allocations: s.allocations + p.allocations,
        pages: s.pages + p.pages,
    })
}

impl Sums {
    fn cached(&self) -> u64 {
        self.reserved.saturating_sub(self.in_use + self.padding)
    }
}

fn span(before: Option<Sums>, after: Option<Sums>, f: fn(&Sums) -> u64) -> Span {
    Span { before: before.as_ref().map(f), after: after.as_ref().map(f) }
}

/// The record's `frameworks` from the readings before and after a cell (`before` is `None`
/// when the crate was not connected before it). A framework first watched during the cell has
/// no `before`; one whose reader failed after the cell has its error and no `after`.
pub fn framework_parts(before: Option<&[FrameworkReading]>, after: Option<&[FrameworkReading]>) -> Vec<FrameworkPart> {
    let Some(after) = after else { return Vec::new() };
    after
        .iter()
        .map(|a| {
            let b = before.and_then(|v| v.iter().find(|b| b.framework == a.framework && b.device == a.device));
            let b = b.filter(|b| b.error.is_none());
            let ok = a.error.is_none();
            let total_b = b.map(|b| sums(&b.pools));
            let total_a = ok.then(|| sums(&a.pools));
            let mut kinds: Vec<String> = Vec::new();
            for p in a.pools.iter().chain(b.map_or(&[][..], |b| &b.pools)) {
                if !kinds.contains(&p.kind) {
                    kinds.push(p.kind.clone());
                }
            }
            let kinds = kinds
                .into_iter()
                .map(|kind| {
                    let of =
                        |r: &FrameworkReading| r.pools.iter().filter(|p| p.kind == kind).cloned().collect::<Vec<_>>();
                    let pa = of(a);
                    let (sb, sa) = (b.map(|b| sums(&of(b))), ok.then(|| sums(&pa)));
                    let sizes: Vec<Option<u64>> = pa.iter().map(|p| p.page_size).collect();
                    PoolKindPart {
                        pools: pa.len() as u64,
                        page_size: sizes.first().copied().flatten().filter(|_| sizes.windows(2).all(|w| w[0] == w[1])),
                        in_use: span(sb, sa, |s| s.in_use),
                        cached: span(sb, sa, Sums::cached),
                        reserved: span(sb, sa, |s| s.reserved),
                        pages: span(sb, sa, |s| s.pages),
                        pages_peak: pa.iter().map(|p| p.pages_peak).sum(),
                        largest_alloc: pa.iter().map(|p| p.largest_alloc).max().unwrap_or(0),
                        kind,
                    }
                })
                .collect();
            FrameworkPart {
                framework: a.framework.clone(),
                device: a.device.clone(),
                source: a.source.clone(),
                error: a.error.clone(),
                in_use: span(total_b, total_a, |s| s.in_use),
                padding: span(total_b, total_a, |s| s.padding),
                cached: span(total_b, total_a, Sums::cached),
                reserved: span(total_b, total_a, |s| s.reserved),
                allocations: span(total_b, total_a, |s| s.allocations),
                kinds,
            }
        })
        .collect()
}

/// The smallest growth of a framework's books that counts as a re-run leak: its metadata and
/// launch buffers move by a few KiB from run to run.
pub const FRAMEWORK_GROWTH_MIN: i64 = 1 << 20;

/// What a cell left behind that it did not find, and which numbers say so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Growth {
    /// Bytes more than before the cell.
    pub bytes: i64,
    /// What grew, when more than the allocator's allocated bytes can say: `cubecl: live tensors
    /// +64.00 MiB, pool reserve 0 B`.
    pub detail: Option<String>,
}

impl FrameworkPart {
    /// Live bytes (in use and their padding) after − before.
    pub fn live_delta(&self) -> Option<i64> {
        Some(self.in_use.delta()? + self.padding.delta()?)
    }

    /// The line's words: `cubecl in use +64.00 MiB (cached 12.00 MiB, reserved 76.00 MiB)`.
    pub fn line(&self) -> String {
        match (&self.error, self.in_use.after) {
            (Some(e), _) => format!("{} n/a ({e})", self.framework),
            (None, Some(after)) => {
                let used = self.in_use.delta().map_or_else(|| iec(after), iec_delta);
                format!(
                    "{} in use {used} (cached {}, reserved {})",
                    self.framework,
                    iec(self.cached.after.unwrap_or(0)),
                    iec(self.reserved.after.unwrap_or(0))
                )
            }
            (None, None) => format!("{} n/a", self.framework),
        }
    }

    /// Its rows in a cell's details table.
    pub fn rows(&self, t: &mut Table) {
        let b = |v: Option<u64>| v.map_or("–".to_string(), iec);
        let d = |s: &Span| s.delta().map_or("–".to_string(), iec_delta);
        let name = format!("{} {}", self.framework, self.device);
        if let Some(e) = &self.error {
            t.row([name, "–".into(), "–".into(), "–".into(), "–".into(), format!("no numbers: {e}")]);
            return;
        }
        let source =
            if self.source.is_empty() { format!("{}'s own books", self.framework) } else { self.source.clone() };
        for (what, s) in [
            ("in use (live tensors)", &self.in_use),
            ("padding", &self.padding),
            ("cached (reserved, not in use)", &self.cached),
            ("reserved (its pages)", &self.reserved),
        ] {
            t.row([format!("{name}: {what}"), b(s.before), b(s.after), d(s), "–".into(), source.clone()]);
        }
        for k in &self.kinds {
            let page = k.page_size.map_or(String::new(), |p| format!(", page {}", iec(p)));
            t.row([
                format!("  {} pools ({}{page})", k.kind, k.pools),
                b(k.reserved.before),
                b(k.reserved.after),
                d(&k.reserved),
                "–".into(),
                format!(
                    "reserved; in use {}, cached {}; {} pages (at most {} ever); largest allocation {}",
                    b(k.in_use.after),
                    b(k.cached.after),
                    k.pages.after.unwrap_or(0),
                    k.pages_peak,
                    iec(k.largest_alloc)
                ),
            ]);
        }
    }
}

impl CellRecord {
    /// What the cell left behind, when it left more than it found, from the most telling
    /// numbers: gpumem-nb's allocated bytes; else a watched framework's books, split into live
    /// tensors and pool reserve (at least [`FRAMEWORK_GROWTH_MIN`]); else NVML's process memory
    /// (more than 2 MiB: the driver's granularity). `None` when nothing grew or nothing says.
    pub fn growth(&self) -> Option<Growth> {
        if let Some(d) = self.allocator.as_ref().and_then(|a| a.allocated.delta()).filter(|&d| d > 0) {
            return Some(Growth { bytes: d, detail: None });
        }
        for f in self.frameworks.iter().filter(|f| f.error.is_none()) {
            let (Some(live), Some(reserved)) = (f.live_delta(), f.reserved.delta()) else { continue };
            if live >= FRAMEWORK_GROWTH_MIN || reserved >= FRAMEWORK_GROWTH_MIN {
                return Some(Growth {
                    bytes: live.max(reserved),
                    detail: Some(format!(
                        "{}: live tensors {}, pool reserve {}",
                        f.framework,
                        iec_delta(live),
                        iec_delta(f.cached.delta().unwrap_or(0))
                    )),
                });
            }
        }
        self.nvml.process.delta().filter(|&d| d > 2 << 20).map(|d| Growth { bytes: d, detail: None })
    }
}
