//! Which value fits, measured: one step run at a few values of one variable (a batch size), its
//! peak and each component's peak fitted as constant or linear in that value, and the largest
//! value that fits a device, with the component that limits it.
//!
//! The runs are measured by whoever runs them (gpumem-kernel's `%%gpumem sweep`: each run's
//! tracked bytes on the device, what was live before it included); this module is the policy:
//! [`fit_shape`] tells constant from linear from neither (with the residual), [`Sweep::largest`]
//! solves the fitted peak against a capacity. Nothing here reads a device.
#![forbid(unsafe_code)]

use crate::units::iec;
use serde::Serialize;
use std::collections::BTreeMap;

/// Below this, a difference between runs is noise, not growth (1 MiB), whatever the peak.
const TOLERANCE_FLOOR: f64 = (1u64 << 20) as f64;
/// Above the floor, the share of the largest peak a fit may miss by and still be called a fit.
const TOLERANCE_SHARE: f64 = 0.02;

/// One measured run of the swept step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepRun {
    /// The swept variable's value.
    pub value: f64,
    /// The device's tracked bytes at their highest during the run (what was live before it
    /// included).
    pub peak: u64,
    /// Each component's own highest during the run (`parameter`, `activation`, …).
    pub components: BTreeMap<String, u64>,
    /// Each owner's own highest during the run (`candle`, `burn/cubecl`, `gpumem-nb`, …).
    pub owners: BTreeMap<String, u64>,
    /// What the device gave the run where a pool reserves beyond its allocations: the CUDA
    /// stream-ordered pool's reserved bytes at the run's end (trimmed before it, so what it
    /// reserved during it) plus the tracked bytes outside the pool. On an H100 a candle step's
    /// pool reserved 3-6 % above its tracked peak. `None` where no pool was read.
    pub held: Option<u64>,
}

impl SweepRun {
    /// What the run needed of the device: its tracked peak, or what the pool held when that is
    /// more.
    pub fn need(&self) -> u64 {
        self.peak.max(self.held.unwrap_or(0))
    }
}

/// How a series of peaks depends on the swept value.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "shape", rename_all = "snake_case")]
pub enum Shape {
    /// The same at every value (within the tolerance): `bytes`, their mean.
    Constant {
        /// The mean peak.
        bytes: f64,
    },
    /// `intercept + slope · value`, every run within the tolerance of the line.
    Linear {
        /// Bytes at value 0.
        intercept: f64,
        /// Bytes per unit of the value.
        slope: f64,
    },
    /// Neither: the least-squares line, and the largest distance of a run from it.
    Neither {
        /// Bytes at value 0 of the least-squares line.
        intercept: f64,
        /// Bytes per unit of the value of the least-squares line.
        slope: f64,
        /// The largest |run − line|, in bytes.
        residual: f64,
    },
}

impl Shape {
    /// The bytes the shape predicts at `value`.
    pub fn at(&self, value: f64) -> f64 {
        match *self {
            Shape::Constant { bytes } => bytes,
            Shape::Linear { intercept, slope } | Shape::Neither { intercept, slope, .. } => intercept + slope * value,
        }
    }

    /// Bytes per unit of the value (0 for a constant).
    pub fn slope(&self) -> f64 {
        match *self {
            Shape::Constant { .. } => 0.0,
            Shape::Linear { slope, .. } | Shape::Neither { slope, .. } => slope,
        }
    }

    /// `constant`, `linear` or `neither (±R)`.
    pub fn word(&self) -> String {
        match *self {
            Shape::Constant { .. } => "constant".into(),
            Shape::Linear { .. } => "linear".into(),
            Shape::Neither { residual, .. } => format!("neither (a line misses by {})", iec(residual.round() as u64)),
        }
    }
}

/// The tolerance a series is judged with: 1 MiB, or 2 % of its largest peak when that is more.
pub fn tolerance(ys: &[f64]) -> f64 {
    let max = ys.iter().copied().fold(0.0, f64::max);
    (max * TOLERANCE_SHARE).max(TOLERANCE_FLOOR)
}

/// Fits peaks `ys` measured at values `xs` (at least two distinct values): constant when they
/// spread by no more than [`tolerance`], linear when each is within it of the least-squares line,
/// else neither, with the residual.
pub fn fit_shape(xs: &[f64], ys: &[f64]) -> Shape {
    assert_eq!(xs.len(), ys.len(), "one peak per value");
    let n = xs.len() as f64;
    let tol = tolerance(ys);
    let (lo, hi) = ys.iter().fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(*y), hi.max(*y)));
    let mean_y = ys.iter().sum::<f64>() / n;
    if hi - lo <= tol {
        return Shape::Constant { bytes: mean_y };
    }
    let mean_x = xs.iter().sum::<f64>() / n;
    let sxx: f64 = xs.iter().map(|x| (x - mean_x).powi(2)).sum();
    let sxy: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mean_x) * (y - mean_y)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let intercept = mean_y - slope * mean_x;
    let residual = xs.iter().zip(ys).map(|(x, y)| (y - (intercept + slope * x)).abs()).fold(0.0, f64::max);
    if residual <= tol { Shape::Linear { intercept, slope } } else { Shape::Neither { intercept, slope, residual } }
}

/// A device or card the answer is given for.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Target {
    /// `this device (H100 …)`, `24 GB`, `--on 20.00 GiB`.
    pub name: String,
    /// What the step may use there: the card's size, or the device's total less what other
    /// processes hold on it.
    pub capacity: u64,
}

/// The largest value that fits one target.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Largest {
    /// The peak does not grow with the value and fits: any value.
    Any {
        /// What is left at the constant peak.
        margin: u64,
    },
    /// The largest value, what the step needs there (overhead included) and what is left.
    Value {
        /// The largest value (whole when every swept value was).
        value: f64,
        /// Predicted need at it, overhead included.
        need: u64,
        /// capacity − need.
        margin: u64,
    },
    /// Not even the smallest value (1 for whole values, else 0) fits.
    None {
        /// Predicted need at that smallest value, overhead included.
        need: u64,
    },
}

/// The share of a target's capacity an answer keeps free: what a line fitted to a few runs
/// cannot see, the rounding of each allocation to the pool's chunk (32 MiB on an H100 with CUDA
/// 13) at a value not run. On an H100 the line through candle's two largest runs predicted the
/// process's use at a batch 2.3 times the largest run to 0.1 %, and the answer on the line itself
/// (155,717) sat 0.2 % under a batch that ran out of memory (156,000).
pub(crate) const HEADROOM: f64 = 0.01;

/// A sweep's runs, fitted.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sweep {
    /// The swept variable.
    pub variable: String,
    /// The measured runs, in ascending value.
    pub runs: Vec<SweepRun>,
    /// The device peak's shape.
    pub total: Shape,
    /// What the answer extrapolates: `total` where it is constant or there are two runs; else
    /// the line through the two largest runs, the ones nearest the values it predicts. A
    /// least-squares line through every run is pulled by the smallest, where the step's peak may
    /// be reached elsewhere (on an H100, candle's step peaked where it grows 315 KB a sample up to
    /// batch 20,480 and in the backward pass, 504 KB a sample, from 32,768 on): its answer ran out
    /// of memory where this one's held.
    pub line: Shape,
    /// Whether `line` is the two largest runs' rather than `total`.
    pub from_largest_two: bool,
    /// Each component's shape.
    pub components: BTreeMap<String, Shape>,
    /// Each owner's shape.
    pub owners: BTreeMap<String, Shape>,
    /// Bytes the device holds for the process beyond its tracked allocations (the CUDA context,
    /// modules, framework and pool caches), added to every prediction, and where it was read.
    pub overhead: (u64, String),
    /// Whether every value was whole (the answer is then whole too).
    pub whole: bool,
}

impl Sweep {
    /// Fits `runs` (at least two distinct values; sorted here). `overhead`: see [`Sweep::overhead`].
    pub fn new(variable: &str, mut runs: Vec<SweepRun>, overhead: (u64, String)) -> Sweep {
        runs.sort_by(|a, b| a.value.total_cmp(&b.value));
        let xs: Vec<f64> = runs.iter().map(|r| r.value).collect();
        let series = |get: &dyn Fn(&SweepRun) -> BTreeMap<String, u64>| {
            let mut names: Vec<String> = runs.iter().flat_map(|r| get(r).into_keys()).collect();
            names.sort();
            names.dedup();
            names
                .into_iter()
                .map(|name| {
                    let ys: Vec<f64> = runs.iter().map(|r| get(r).get(&name).copied().unwrap_or(0) as f64).collect();
                    (name, fit_shape(&xs, &ys))
                })
                .collect::<BTreeMap<_, _>>()
        };
        let components = series(&|r| r.components.clone());
        let owners = series(&|r| r.owners.clone());
        let ys: Vec<f64> = runs.iter().map(|r| r.need() as f64).collect();
        let total = fit_shape(&xs, &ys);
        let (line, from_largest_two) = match total {
            Shape::Constant { .. } => (total, false),
            _ if xs.len() > 2 => {
                let n = xs.len();
                (fit_shape(&xs[n - 2..], &ys[n - 2..]), true)
            }
            _ => (total, false),
        };
        Sweep {
            variable: variable.to_string(),
            total,
            line,
            from_largest_two,
            whole: xs.iter().all(|x| x.fract() == 0.0),
            runs,
            components,
            owners,
            overhead,
        }
    }

    /// What the step needs at `value`: the extrapolated device peak ([`Sweep::line`]) and the
    /// overhead.
    pub fn need(&self, value: f64) -> u64 {
        (self.line.at(value).max(0.0) as u64).saturating_add(self.overhead.0)
    }

    /// The largest value that fits `capacity` bytes with [`HEADROOM`] of it kept free.
    pub fn largest(&self, capacity: u64) -> Largest {
        let slope = self.line.slope();
        let smallest = if self.whole { 1.0 } else { 0.0 };
        let usable = capacity - (capacity as f64 * HEADROOM).ceil() as u64;
        if slope <= 0.0 {
            let need = self.need(self.runs.last().map_or(0.0, |r| r.value));
            return if need <= usable { Largest::Any { margin: capacity - need } } else { Largest::None { need } };
        }
        let room = usable as f64 - self.overhead.0 as f64 - self.line.at(0.0);
        let mut value = room / slope;
        if self.whole {
            value = value.floor();
        }
        // The need at the answer, exactly as shown; a rounding that lands a byte over steps down.
        while self.whole && value >= smallest && self.need(value) > usable {
            value -= 1.0;
        }
        if value < smallest || self.need(value) > usable {
            return Largest::None { need: self.need(smallest) };
        }
        let need = self.need(value);
        Largest::Value { value, need, margin: capacity - need }
    }

    /// The component that grows fastest with the value (the one that runs out first), with its
    /// bytes per unit; `None` when none grows.
    pub fn limiting(&self) -> Option<(&str, f64)> {
        self.components
            .iter()
            .map(|(n, s)| (n.as_str(), s.slope()))
            .filter(|(_, s)| *s > 0.0)
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// `8`, `12.5`: a value as the answer writes it.
    pub fn value_text(&self, v: f64) -> String {
        if self.whole || v.fract() == 0.0 { format!("{}", v as i64) } else { format!("{v:.3}") }
    }

    /// The runs: one row per value, its device peak and each component's and owner's peak.
    pub fn runs_table(&self) -> crate::render::Table {
        let comps: Vec<&String> = self.components.keys().collect();
        let owners: Vec<&String> = self.owners.keys().collect();
        let held = self.runs.iter().any(|r| r.held.is_some());
        let mut header = vec![self.variable.clone(), "device peak".to_string()];
        if held {
            header.push("CUDA pool held".to_string());
        }
        header.extend(comps.iter().map(|c| c.to_string()));
        header.extend(owners.iter().map(|o| format!("{o} (owner)")));
        let n = header.len();
        let mut t = crate::render::Table::new(header).right_align(0..n);
        for r in &self.runs {
            let mut row = vec![self.value_text(r.value), iec(r.peak)];
            if held {
                row.push(r.held.map_or_else(|| "–".to_string(), iec));
            }
            row.extend(comps.iter().map(|c| iec(r.components.get(*c).copied().unwrap_or(0))));
            row.extend(owners.iter().map(|o| iec(r.owners.get(*o).copied().unwrap_or(0))));
            t.row(row);
        }
        let t = t.title(format!(
            "gpumem sweep {}: each run's peak (tracked bytes on the device, highest during the run)",
            self.variable
        ));
        if held {
            t.caption(
                "CUDA pool held: what the stream-ordered pool reserved during the run plus the tracked bytes outside \
                 it; where that is above the tracked peak, it is what the fit uses",
            )
        } else {
            t
        }
    }

    /// The fits: the device peak, each component and each owner, as constant, linear or neither.
    pub fn fits_table(&self) -> crate::render::Table {
        let mut t = crate::render::Table::new(["what", "grows", "per unit", "at 0"]).right_align([2, 3]);
        let per = |s: &Shape| match s {
            Shape::Constant { .. } => "–".to_string(),
            s => signed(s.slope()),
        };
        let at0 = |s: &Shape| signed(s.at(0.0));
        t.row(["device peak".to_string(), self.total.word(), per(&self.total), at0(&self.total)]);
        if self.from_largest_two {
            let (a, b) = (self.runs.len() - 2, self.runs.len() - 1);
            let between =
                format!("{} and {}", self.value_text(self.runs[a].value), self.value_text(self.runs[b].value));
            t.row([
                format!("device peak from {between} (the answer's line)"),
                self.line.word(),
                per(&self.line),
                at0(&self.line),
            ]);
        }
        for (name, s) in self
            .components
            .iter()
            .map(|(n, s)| (n.clone(), s))
            .chain(self.owners.iter().map(|(n, s)| (format!("{n} (owner)"), s)))
        {
            t.row([name, s.word(), per(s), at0(s)]);
        }
        t.title(format!("how each part depends on {} (a fit within 1 MiB or 2 % of its largest peak)", self.variable))
    }

    /// The answer for each target: the largest value, the need there, the margin, what limits it.
    pub fn answer_table(&self, targets: &[Target]) -> crate::render::Table {
        let mut t =
            crate::render::Table::new(["on", "capacity", &format!("largest {}", self.variable), "needs", "margin"])
                .right_align([1, 2, 3, 4]);
        for target in targets {
            let (v, need, margin) = match self.largest(target.capacity) {
                Largest::Any { margin } => ("any (its peak does not grow)".to_string(), String::new(), iec(margin)),
                Largest::Value { value, need, margin } => (self.value_text(value), iec(need), iec(margin)),
                Largest::None { need } => ("none fits".to_string(), iec(need), String::new()),
            };
            t.row([target.name.clone(), iec(target.capacity), v, need, margin]);
        }
        let limiting = match self.limiting() {
            Some((c, s)) => format!("what limits it: {c}, {} per unit of {}", iec(s.round() as u64), self.variable),
            None => "no component grows with it".to_string(),
        };
        let swept = self.runs.last().map_or(0.0, |r| r.value);
        let line = match (self.from_largest_two, &self.total) {
            (true, Shape::Neither { .. }) => {
                "; the peak is not one line in the value (where it is reached moved), so the answer follows the \
                 two largest runs: sweep larger values to be surer"
            }
            (true, _) => "; the answer follows the line through the two largest runs",
            _ => "",
        };
        t.title(format!("the largest {} that fits", self.variable)).caption(format!(
            "{limiting}; every need counts {} beyond the tracked allocations ({}){line}; {}% of each capacity is \
             kept free; a value past {} (the largest run) is predicted, not run",
            iec(self.overhead.0),
            self.overhead.1,
            HEADROOM * 100.0,
            self.value_text(swept),
        ))
    }
}

/// `+1.50 MiB`, `-2.00 KiB`.
fn signed(bytes: f64) -> String {
    let b = bytes.round();
    if b < 0.0 { format!("-{}", iec((-b) as u64)) } else { iec(b as u64) }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn run(value: f64, parts: &[(&str, u64)]) -> SweepRun {
        let components: BTreeMap<String, u64> = parts.iter().map(|(n, b)| (n.to_string(), *b)).collect();
        SweepRun { value, peak: components.values().sum(), components, owners: BTreeMap::new(), held: None }
    }

    #[test]
    fn what_a_pool_held_beyond_the_tracked_peak_is_what_is_fitted() {
        // candle's step on an H100 (2026-12-07): the CUDA pool reserved 3-6 % above the tracked
        // peak, and an answer from the tracked peaks alone ran out of memory.
        let mut runs = vec![
            run(16384.0, &[("activation", 10_738_353_160)]),
            run(32768.0, &[("activation", 18_187_731_976)]),
            run(65536.0, &[("activation", 33_086_973_608)]),
        ];
        for (r, held) in runs.iter_mut().zip([10_938_888_064u64, 18_857_740_288, 35_496_000_000]) {
            r.held = Some(held);
        }
        let s = Sweep::new("batch", runs, (0, String::new()));
        let need = s.need(32768.0);
        assert!(need > 18_187_731_976 + (400 << 20), "fitted on what the pool held, not the tracked peak: {need}");
        let text = s.runs_table().to_text();
        assert!(text.contains("CUDA pool held") && text.contains("17.56 GiB"), "{text}");
        let mut smaller = s.runs.clone();
        smaller.iter_mut().for_each(|r| r.held = Some(1));
        assert_eq!(smaller[1].need(), 18_187_731_976, "a pool below the tracked peak: the tracked peak");
    }

    #[test]
    fn a_peak_that_moves_is_extrapolated_from_the_two_largest_runs() {
        // candle's step on an H100 (2026-12-07): at 8192 the peak is in the optimizer's update,
        // from 16384 on in the backward pass; the least-squares line through all three runs
        // under-predicts past them, the two largest runs' line does not.
        let runs = vec![
            run(8192.0, &[("temp", 3_758_096_384), ("activation", 4_396_401_672)]),
            run(16384.0, &[("temp", 4_429_185_024), ("activation", 6_309_168_136)]),
            run(32768.0, &[("temp", 8_858_370_048), ("activation", 9_329_361_928)]),
        ];
        let s = Sweep::new("batch", runs, (0, "none".into()));
        assert!(matches!(s.total, Shape::Neither { .. }), "{:?}", s.total);
        assert!(s.from_largest_two);
        let slope = (18_187_731_976.0 - 10_738_353_160.0) / 16384.0;
        assert!((s.line.slope() - slope).abs() < 1e-6, "{:?}", s.line);
        assert_eq!(s.need(32768.0), 18_187_731_976, "the line passes through the largest run");
        assert!(s.fits_table().to_text().contains("device peak from 16384 and 32768 (the answer's line)"));
        assert!(s.answer_table(&[]).to_text().contains("follows the two largest runs"));
        // A linear peak is its own line.
        let linear = Sweep::new(
            "n",
            vec![run(1.0, &[("a", 10 * MIB)]), run(2.0, &[("a", 20 * MIB)]), run(4.0, &[("a", 40 * MIB)])],
            (0, String::new()),
        );
        assert!(linear.from_largest_two && (linear.line.slope() - linear.total.slope()).abs() < 1e-6);
        assert!(linear.answer_table(&[]).to_text().contains("the line through the two largest runs"));
        // Two runs are their own line; a constant peak is not extrapolated.
        let two = Sweep::new("n", vec![run(1.0, &[("a", 10 * MIB)]), run(2.0, &[("a", 20 * MIB)])], (0, String::new()));
        assert!(!two.from_largest_two && two.line == two.total);
    }

    #[test]
    fn constant_linear_and_neither_are_told_apart() {
        let xs = [8.0, 16.0, 32.0];
        assert_eq!(fit_shape(&xs, &[100.0, 100.0, 100.0]), Shape::Constant { bytes: 100.0 });
        match fit_shape(&xs, &[(10 * MIB) as f64, (18 * MIB) as f64, (34 * MIB) as f64]) {
            Shape::Linear { intercept, slope } => {
                assert!((slope - MIB as f64).abs() < 1.0 && (intercept - (2 * MIB) as f64).abs() < 1.0);
            }
            other => panic!("{other:?}"),
        }
        // Quadratic: 8² MiB, 16² MiB, 32² MiB misses any line by far more than 2 %.
        match fit_shape(&xs, &[(64 * MIB) as f64, (256 * MIB) as f64, (1024 * MIB) as f64]) {
            Shape::Neither { residual, .. } => assert!(residual > (50 * MIB) as f64, "{residual}"),
            other => panic!("{other:?}"),
        }
        // Half a MiB of noise on a flat series is not growth.
        assert!(matches!(
            fit_shape(&xs, &[(64 * MIB) as f64, (64 * MIB + MIB / 2) as f64, (64 * MIB) as f64]),
            Shape::Constant { .. }
        ));
    }

    #[test]
    fn the_largest_value_is_where_the_line_meets_the_capacity_less_the_overhead() {
        // Parameters 100 MiB at every value, activations 64 MiB per unit.
        let runs = vec![
            run(4.0, &[("parameter", 100 * MIB), ("activation", 256 * MIB)]),
            run(1.0, &[("parameter", 100 * MIB), ("activation", 64 * MIB)]),
            run(2.0, &[("parameter", 100 * MIB), ("activation", 128 * MIB)]),
        ];
        let s = Sweep::new("batch", runs, (36 * MIB, "NVML less tracked".into()));
        assert_eq!(s.runs.iter().map(|r| r.value).collect::<Vec<_>>(), [1.0, 2.0, 4.0], "sorted");
        assert!(matches!(s.components["parameter"], Shape::Constant { .. }));
        assert!(matches!(s.components["activation"], Shape::Linear { .. }));
        assert_eq!(s.limiting().map(|(c, _)| c), Some("activation"));
        // 1 GiB, 1 % kept free: (1013.76 − 36 − 100) / 64 = 13.7 → 13, needing 136 + 13·64 = 968 MiB.
        assert_eq!(s.largest(1 << 30), Largest::Value { value: 13.0, need: 968 * MIB, margin: 56 * MIB });
        // 136 + 14·64 = 1032 MiB: not on a 1032 MiB device (1 % kept free), on a 1043 MiB one.
        assert!(matches!(s.largest(1032 * MIB), Largest::Value { value: 13.0, .. }));
        assert!(matches!(s.largest(1043 * MIB), Largest::Value { value: 14.0, margin, .. } if margin == 11 * MIB));
        // Not even one: 136 + 64 = 200 MiB.
        assert_eq!(s.largest(150 * MIB), Largest::None { need: 200 * MIB });
        let text = s.answer_table(&[Target { name: "1 GiB".into(), capacity: 1 << 30 }]).to_text();
        assert!(text.contains("13") && text.contains("activation") && text.contains("36.00 MiB"), "{text}");
    }

    #[test]
    fn a_peak_that_does_not_grow_fits_any_value_or_none() {
        let runs = vec![
            run(1.0, &[("parameter", 100 * MIB)]),
            run(2.0, &[("parameter", 100 * MIB)]),
            run(3.0, &[("parameter", 100 * MIB)]),
        ];
        let s = Sweep::new("n", runs, (0, "simulated".into()));
        assert_eq!(s.largest(1 << 30), Largest::Any { margin: (1 << 30) - 100 * MIB });
        assert_eq!(s.largest(50 * MIB), Largest::None { need: 100 * MIB });
        assert_eq!(s.limiting(), None);
    }

    #[test]
    fn fractional_values_give_a_fractional_answer() {
        let runs = vec![run(0.5, &[("x", 50 * MIB)]), run(1.0, &[("x", 100 * MIB)]), run(1.5, &[("x", 150 * MIB)])];
        let s = Sweep::new("scale", runs, (0, "simulated".into()));
        assert!(!s.whole);
        match s.largest(125 * MIB) {
            // 1 % kept free: 123.75 MiB at 100 MiB per unit.
            Largest::Value { value, .. } => assert!((value - 1.2375).abs() < 1e-9, "{value}"),
            other => panic!("{other:?}"),
        }
    }
}
