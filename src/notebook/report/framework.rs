//! A watched framework's own numbers in a cell's record (`frameworks`): what it holds in use,
//! what it keeps cached and what it reserved, before and after the cell, per pool kind; the
//! words the line and the details table show them with; and what a re-run left behind.

use super::{CellRecord, Span};
use crate::notebook::protocol::{FrameworkPhase, FrameworkPool, FrameworkReading, Held};
use crate::render::Table;
use crate::units::{count, iec, iec_delta};
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
    /// What the component stamps that ended in the cell changed in its in-use bytes, per
    /// component (`gpumem_nb::component`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<FrameworkPhase>,
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
/// no `before`, unless its first reading says it held nothing before (`from_empty`: zeros then);
/// one whose reader failed after the cell has its error and no `after`.
pub fn framework_parts(before: Option<&[FrameworkReading]>, after: Option<&[FrameworkReading]>) -> Vec<FrameworkPart> {
    let Some(after) = after else { return Vec::new() };
    after
        .iter()
        .map(|a| {
            let b = before.and_then(|v| v.iter().find(|b| b.framework == a.framework && b.device == a.device));
            let b = b.filter(|b| b.error.is_none());
            let ok = a.error.is_none();
            // A watch that began at this reading with nothing held before counts from zero.
            let empty = || a.from_empty.then(Sums::default);
            let total_b = b.map(|b| sums(&b.pools)).or_else(empty);
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
                    let (sb, sa) = (b.map(|b| sums(&of(b))).or_else(empty), ok.then(|| sums(&pa)));
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
                phases: a.phases.clone(),
            }
        })
        .collect()
}

/// The smallest growth of a framework's books that counts as a re-run leak: its metadata and
/// launch buffers move by a few KiB from run to run.
const FRAMEWORK_GROWTH_MIN: i64 = 1 << 20;

/// What a cell left behind that it did not find, and which numbers say so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Growth {
    /// Bytes more than before the cell.
    pub bytes: i64,
    /// What grew, when more than the allocator's allocated bytes can say: `cubecl: live tensors
    /// +64.00 MiB, pool reserve 0 B`.
    pub detail: Option<String>,
}

impl Growth {
    /// The re-run leak warning: `re-run leak: same code as [4], this run left +32.00 MiB more
    /// (cubecl: live tensors +32.00 MiB, pool reserve 0 B)`, `prev` being the earlier run's cell.
    pub fn warning(&self, prev: u64) -> String {
        let detail = self.detail.as_ref().map_or(String::new(), |d| format!(" ({d})"));
        format!("re-run leak: same code as [{prev}], this run left {} more{detail}", iec_delta(self.bytes))
    }
}

/// `1 stamp`, `3 stamps`.
fn stamps(n: u64) -> String {
    count(n as usize, "stamp")
}

/// One component's stamps on the line: `parameter +80.28 MiB`, with the stamps whose books were
/// not read at one end said (`parameter +80.28 MiB (1 stamp not read)`, `parameter not read`).
fn phase_words(p: &FrameworkPhase) -> String {
    match (p.phases, p.unread) {
        (_, 0) => format!("{} {}", p.component, iec_delta(p.change)),
        (0, n) => format!("{} not read ({})", p.component, stamps(n)),
        (_, n) => format!("{} {} ({} not read)", p.component, iec_delta(p.change), stamps(n)),
    }
}

impl FrameworkPart {
    /// Live bytes (in use and their padding) after − before.
    pub fn live_delta(&self) -> Option<i64> {
        Some(self.in_use.delta()? + self.padding.delta()?)
    }

    /// The line's words, in the report's vocabulary: `cubecl in use 64.00 MiB (+64.00 MiB,
    /// cached 12.00 MiB)` (what it reserved is in the details), then what the cell's stamped
    /// phases changed: `; by stamp: parameter +24.14 MiB`.
    pub fn line(&self) -> String {
        let line = self.short_line();
        if self.phases.is_empty() {
            return line;
        }
        format!("{line}; by stamp: {}", self.phases.iter().map(phase_words).collect::<Vec<_>>().join(", "))
    }

    /// [`Self::line`] without the stamps' changes (the details have them), for a line short of
    /// room.
    pub(crate) fn short_line(&self) -> String {
        match (&self.error, self.in_use.after) {
            (Some(e), _) => format!("{} n/a ({e})", self.framework),
            (None, Some(after)) => {
                let mut more: Vec<String> = self.in_use.delta().map(iec_delta).into_iter().collect();
                more.push(format!("cached {}", iec(self.cached.after.unwrap_or(0))));
                format!("{} in use {} ({})", self.framework, iec(after), more.join(", "))
            }
            (None, None) => format!("{} n/a", self.framework),
        }
    }

    /// Its shortest words for the line: what is in use and its change (`cubecl in use 2.15 MiB
    /// (+2.15 MiB)`), what it keeps cached left to the details.
    pub(crate) fn shortest_line(&self) -> String {
        match (&self.error, self.in_use.after) {
            (None, Some(after)) => match self.in_use.delta() {
                Some(d) => format!("{} in use {} ({})", self.framework, iec(after), iec_delta(d)),
                None => format!("{} in use {}", self.framework, iec(after)),
            },
            _ => self.short_line(),
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
        for p in &self.phases {
            let unread = if p.unread > 0 { format!(", {} not read", stamps(p.unread)) } else { String::new() };
            t.row([
                format!("{name}: in use, `{}` stamps", p.component),
                "–".into(),
                "–".into(),
                if p.phases > 0 { iec_delta(p.change) } else { "–".into() },
                "–".into(),
                format!(
                    "{source}: read when each stamp began and ended ({}{unread}; nested stamps count for their own)",
                    stamps(p.phases)
                ),
            ]);
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
    /// tensors and pool reserve (at least 1 MiB); else NVML's process memory (more than 2 MiB:
    /// the driver's granularity). `None` when nothing grew or nothing says.
    pub fn growth(&self) -> Option<Growth> {
        let mut g = self.growth_by_source()?;
        // Which components grew, when tracking says what the memory is.
        if let Some(what) = self.components_grown() {
            g.detail = Some(match g.detail.take() {
                Some(d) => format!("{d}; grew: {what}"),
                None => format!("grew: {what}"),
            });
        }
        Some(g)
    }

    /// The components whose bytes grew over the cell, largest first (`activation +48.00 MiB,
    /// gradient +16.00 MiB`); the allocator's cache is not a component, and nothing is said
    /// while only `other` grew (nothing was classified).
    fn components_grown(&self) -> Option<String> {
        let mut grown: Vec<(i64, Held)> = self.component_changes().filter(|(d, _)| *d > 0).collect();
        grown.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.key().cmp(b.1.key())));
        // As on the line: said only once something is more than `other`.
        let classified = grown.iter().any(|(_, c)| c.is_classified());
        classified.then(|| grown.iter().map(|(d, c)| format!("{c} {}", iec_delta(*d))).collect::<Vec<_>>().join(", "))
    }

    /// Each component's change over the cell, where known (the allocator's cache is not a
    /// component).
    fn component_changes(&self) -> impl Iterator<Item = (i64, Held)> {
        self.all_allocations
            .iter()
            .flat_map(|a| a.place.by_component.iter())
            .filter(|c| c.component != Held::Cached)
            .filter_map(|c| c.delta().map(|d| (d, c.component)))
    }

    /// [`Self::growth`]'s amount and the source that says it.
    fn growth_by_source(&self) -> Option<Growth> {
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
        // Tracking: every allocation's bytes, what the components hold (not the cache).
        let tracked: i64 = self.component_changes().map(|(d, _)| d).sum();
        if tracked >= FRAMEWORK_GROWTH_MIN {
            return Some(Growth { bytes: tracked, detail: None });
        }
        self.nvml.process.delta().filter(|&d| d > 2 << 20).map(|d| Growth { bytes: d, detail: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    fn pool(kind: &str, stream: u64, in_use: u64, padding: u64, reserved: u64, pages: u64) -> FrameworkPool {
        FrameworkPool {
            kind: kind.into(),
            stream,
            page_size: (kind == "sliced").then_some(8 * MIB),
            in_use,
            padding,
            reserved,
            pages,
            pages_peak: pages + 2,
            largest_alloc: in_use / 2,
            ..Default::default()
        }
    }

    fn reading(pools: Vec<FrameworkPool>) -> FrameworkReading {
        FrameworkReading { framework: "cubecl".into(), device: "cuda:0".into(), pools, ..Default::default() }
    }

    /// Sums and per-kind parts: two streams' sliced pools add up, kinds keep the framework's
    /// order, and in use + padding + cached = reserved on both sides.
    #[test]
    fn parts_sum_pools_by_kind_and_add_up() {
        let before = [reading(vec![pool("sliced", 0, MIB, 0, 8 * MIB, 1), pool("persistent", 0, 0, 0, 0, 0)])];
        let after = [reading(vec![
            pool("sliced", 0, 5 * MIB, 512, 16 * MIB, 2),
            pool("persistent", 0, 64 * MIB, 0, 64 * MIB, 1),
            pool("sliced", 1, 2 * MIB, 0, 8 * MIB, 1),
        ])];
        let parts = framework_parts(Some(&before), Some(&after));
        let f = &parts[0];
        assert_eq!(f.in_use, Span { before: Some(MIB), after: Some(71 * MIB) });
        assert_eq!(f.reserved.delta(), Some(80 * MIB as i64));
        let side = |pick: fn(&Span) -> Option<u64>| {
            pick(&f.in_use).unwrap() + pick(&f.padding).unwrap() + pick(&f.cached).unwrap()
        };
        assert_eq!(side(|s| s.before), f.reserved.before.unwrap());
        assert_eq!(side(|s| s.after), f.reserved.after.unwrap());
        let kinds: Vec<&str> = f.kinds.iter().map(|k| k.kind.as_str()).collect();
        assert_eq!(kinds, ["sliced", "persistent"]);
        let sliced = &f.kinds[0];
        assert_eq!(
            (sliced.pools, sliced.page_size, sliced.pages),
            (2, Some(8 * MIB), Span { before: Some(1), after: Some(3) })
        );
        assert_eq!((sliced.pages_peak, sliced.largest_alloc), (4 + 3, 5 * MIB / 2));
        assert_eq!(sliced.cached.after, Some(24 * MIB - 7 * MIB - 512));
        assert_eq!(f.live_delta(), Some(70 * MIB as i64 + 512));
        let line = f.line();
        assert_eq!(line, "cubecl in use 71.00 MiB (+70.00 MiB, cached 17.00 MiB)");
        let mut t = crate::render::Table::new(["", "before", "after", "Δ", "peak in cell", "source"]);
        f.rows(&mut t);
        let text = t.to_text();
        assert!(text.contains("cubecl cuda:0: cached (reserved, not in use)"), "{text}");
        assert!(
            text.contains("sliced pools (2, page 8.00 MiB)") && text.contains("3 pages (at most 7 ever)"),
            "{text}"
        );
    }

    /// The stamps that ended in the cell: after the numbers on the line, a row each in the
    /// details, from the reading after the cell (the one before had the earlier cell's).
    #[test]
    fn stamped_phases_follow_the_line_and_have_rows() {
        use crate::record::component::Component;
        let phase = |component, phases, change| FrameworkPhase { component, phases, change, unread: 0 };
        let before = FrameworkReading { phases: vec![phase(Component::Temp, 1, 5)], ..reading(vec![]) };
        let after = FrameworkReading {
            phases: vec![
                phase(Component::Parameter, 1, 80 * MIB as i64),
                phase(Component::OptimizerState, 3, -(2 * MIB as i64)),
            ],
            ..reading(vec![pool("sliced", 0, 80 * MIB, 0, 96 * MIB, 1)])
        };
        let f = &framework_parts(Some(&[before]), Some(&[after]))[0];
        assert_eq!(
            f.line(),
            "cubecl in use 80.00 MiB (+80.00 MiB, cached 16.00 MiB); by stamp: parameter +80.00 MiB, optimizer_state \
             -2.00 MiB"
        );
        let mut t = crate::render::Table::new(["", "before", "after", "Δ", "peak in cell", "source"]);
        f.rows(&mut t);
        let text = t.to_text();
        let row = text.lines().find(|l| l.contains("`optimizer_state` stamps")).unwrap_or_else(|| panic!("{text}"));
        assert!(row.contains("-2.00 MiB") && row.contains("3 stamps"), "{row}");
        assert!(!text.contains("`temp`"), "{text}");
        // Stamps whose books were not read at one end are said, not counted.
        let p = |phases, unread| FrameworkPhase { unread, ..phase(Component::Temp, phases, 4 * MIB as i64) };
        assert_eq!(phase_words(&p(2, 1)), "temp +4.00 MiB (1 stamp not read)");
        assert_eq!(phase_words(&FrameworkPhase { change: 0, ..p(0, 3) }), "temp not read (3 stamps)");
        // Without stamps the line is as before.
        let plain = &framework_parts(None, Some(&[reading(vec![])]))[0];
        assert!(!plain.line().contains("by stamp"), "{}", plain.line());
    }

    /// Watched during the cell: no `before`, absolute numbers in the line; a reader that failed
    /// after the cell: its error, no numbers; nothing watched: no parts.
    #[test]
    fn a_watch_that_began_with_nothing_held_counts_the_cell_from_zero() {
        let after = FrameworkReading { from_empty: true, ..reading(vec![pool("all pools", 0, 3000, 72, 2 << 20, 0)]) };
        let part = &framework_parts(Some(&[]), Some(std::slice::from_ref(&after)))[0];
        assert_eq!((part.in_use.before, part.in_use.after, part.in_use.delta()), (Some(0), Some(3000), Some(3000)));
        assert_eq!((part.reserved.before, part.kinds[0].reserved.before), (Some(0), Some(0)));
        assert_eq!(part.short_line(), "cubecl in use 2.93 KiB (+2.93 KiB, cached 2.00 MiB)");
        // Without the mark, a first watch has no before and no change.
        let plain = FrameworkReading { from_empty: false, ..after };
        let part = &framework_parts(Some(&[]), Some(&[plain]))[0];
        assert_eq!((part.in_use.before, part.in_use.delta()), (None, None));
    }

    #[test]
    fn first_watch_failed_reading_and_nothing_watched() {
        let after = [reading(vec![pool("sliced", 0, 3 * MIB, 0, 8 * MIB, 1)])];
        let f = &framework_parts(None, Some(&after))[0];
        assert_eq!((f.in_use.before, f.in_use.delta()), (None, None));
        assert_eq!(f.line(), "cubecl in use 3.00 MiB (cached 5.00 MiB)");
        let failed = [FrameworkReading { error: Some("no answer in 2 s".into()), ..reading(vec![]) }];
        let f = &framework_parts(Some(&after), Some(&failed))[0];
        assert_eq!((f.in_use.after, f.reserved.after), (None, None));
        assert_eq!(f.line(), "cubecl n/a (no answer in 2 s)");
        assert!(framework_parts(Some(&after), None).is_empty());
        assert!(framework_parts(None, Some(&[])).is_empty());
    }

    /// What a re-run left behind: the allocator first; a framework's growth split into live
    /// tensors and pool reserve, from 1 MiB on; NVML past 2 MiB; nothing otherwise.
    #[test]
    fn growth_names_live_tensors_or_pool_reserve() {
        let rec = |b: Vec<FrameworkPool>, a: Vec<FrameworkPool>| CellRecord {
            frameworks: framework_parts(Some(&[reading(b)]), Some(&[reading(a)])),
            ..Default::default()
        };
        let live = rec(vec![pool("sliced", 0, 0, 0, 64 * MIB, 8)], vec![pool("sliced", 0, 32 * MIB, 0, 64 * MIB, 8)]);
        let g = live.growth().unwrap();
        assert_eq!(
            (g.bytes, g.detail.as_deref()),
            (32 * MIB as i64, Some("cubecl: live tensors +32.00 MiB, pool reserve -32.00 MiB"))
        );
        let reserve = rec(vec![pool("sliced", 0, 0, 0, 8 * MIB, 1)], vec![pool("sliced", 0, 0, 0, 40 * MIB, 5)]);
        let g = reserve.growth().unwrap();
        assert_eq!(
            (g.bytes, g.detail.as_deref()),
            (32 * MIB as i64, Some("cubecl: live tensors ±0 B, pool reserve +32.00 MiB"))
        );
        let noise = rec(vec![pool("sliced", 0, 0, 0, 8 * MIB, 1)], vec![pool("sliced", 0, 4096, 0, 8 * MIB, 1)]);
        assert_eq!(noise.growth(), None, "a few KiB of a framework's own buffers is no leak");
        let mut alloc = noise.clone();
        alloc.allocator = Some(super::super::AllocatorPart {
            allocated: Span { before: Some(0), after: Some(2 * MIB) },
            ..Default::default()
        });
        assert_eq!(alloc.growth(), Some(Growth { bytes: 2 * MIB as i64, detail: None }), "the allocator speaks first");
        let mut nvml = CellRecord::default();
        nvml.nvml.process = Span { before: Some(100 * MIB), after: Some(102 * MIB) };
        assert_eq!(nvml.growth(), None, "2 MiB is the driver's granularity");
        nvml.nvml.process.after = Some(103 * MIB);
        assert_eq!(nvml.growth(), Some(Growth { bytes: 3 * MIB as i64, detail: None }));
    }

    /// Issue 33: a re-run leak says which components grew; tracked components speak before
    /// NVML, and the allocator's cache is not a component.
    #[test]
    fn growth_says_which_components_grew() {
        use super::super::{AllAllocations, ComponentDelta, PlaceAll};
        use crate::record::component::Component;
        fn part(c: impl Into<Held>, before: u64, after: u64) -> ComponentDelta {
            ComponentDelta { component: c.into(), before: Some(before), after, peak: None }
        }
        let of = |by_component| AllAllocations {
            place: PlaceAll { by_component, ..Default::default() },
            ..Default::default()
        };
        let mut rec = CellRecord {
            all_allocations: Some(of(vec![
                part(Component::Parameter, 100 * MIB, 100 * MIB),
                part(Component::Gradient, 0, 16 * MIB),
                part(Component::Activation, 8 * MIB, 56 * MIB),
                part(Held::Cached, 0, 64 * MIB),
            ])),
            ..Default::default()
        };
        rec.nvml.process = Span { before: Some(0), after: Some(200 * MIB) };
        let g = rec.growth().unwrap();
        assert_eq!(g.bytes, 64 * MIB as i64, "the components' growth, before NVML's");
        assert_eq!(
            g.warning(4),
            "re-run leak: same code as [4], this run left +64.00 MiB more (grew: activation +48.00 MiB, gradient +16.00 MiB)"
        );
        rec.allocator = Some(super::super::AllocatorPart {
            allocated: Span { before: Some(0), after: Some(2 * MIB) },
            ..Default::default()
        });
        assert_eq!(rec.growth().unwrap().detail.as_deref(), Some("grew: activation +48.00 MiB, gradient +16.00 MiB"));
        // Nothing classified: no component is named.
        let only_other =
            CellRecord { all_allocations: Some(of(vec![part(Component::Other, 0, 8 * MIB)])), ..Default::default() };
        assert_eq!(only_other.growth(), Some(Growth { bytes: 8 * MIB as i64, detail: None }));
    }
}
