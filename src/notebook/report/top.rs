//! The sites holding the most memory, as a table: `%gpumem top` and `gpumem_nb::tracking::top(n)`.

use crate::notebook::protocol::{Held, OwnerBytes, TopReport};
use crate::render::{MimeBundle, Table};
use crate::units::iec;

impl TopReport {
    /// One table: for every place, the sites holding the most memory now, then those that held
    /// the most at the session's peak.
    pub fn table(&self) -> Table {
        // A buffer of gpumem-nb's allocator is named by its own site; the segment it sits in
        // (made by an earlier, maybe dropped, buffer) only in a column of its own.
        let segments = self.places.iter().flat_map(|p| p.now.iter().chain(&p.at_peak)).any(|s| s.segment.is_some());
        let mut head = vec!["", "site (function ← cell:line)", "owner", "bytes", "share"];
        if segments {
            head.push("in a segment made at");
        }
        // What each site's memory is, once anything is more than `other` (a stamp or a rule).
        let show_what = self
            .places
            .iter()
            .flat_map(|p| p.now.iter().chain(&p.at_peak))
            .any(|s| s.component.map(Held::from).is_some_and(Held::is_classified));
        if show_what {
            head.push("what");
        }
        let mut t = Table::new(head).right_align([3, 4]);
        for p in &self.places {
            let place = p.device.map_or("host pinned".to_string(), |d| format!("device {d}"));
            let mut part = |what: String, total: u64, sites: &[OwnerBytes]| {
                for (i, s) in sites.iter().enumerate() {
                    let share = if total == 0 {
                        "–".into()
                    } else {
                        format!("{:.0} %", 100.0 * s.bytes as f64 / total as f64)
                    };
                    let head = if i == 0 { what.clone() } else { String::new() };
                    let mut row = vec![head, s.site(), s.owner.clone(), iec(s.bytes), share];
                    if segments {
                        row.push(s.segment.clone().unwrap_or_default());
                    }
                    if show_what {
                        row.push(s.component.map_or(String::new(), |c| c.key().to_string()));
                    }
                    t.row(row);
                }
            };
            part(format!("{place}: live now ({})", iec(p.live)), p.live, &p.now);
            part(format!("{place}: at the session's peak ({})", iec(p.peak)), p.peak, &p.at_peak);
        }
        let cap = if self.places.is_empty() {
            format!("no tracked memory (tracking: {})", self.tracking)
        } else {
            format!("every allocation of the process, by site (tracking: {}; exact bytes)", self.tracking)
        };
        t.caption(cap)
    }

    /// The table as text and HTML.
    pub fn bundle(&self) -> MimeBundle {
        self.table().bundle()
    }
}

crate::render::evcxr_display!(TopReport);

impl std::fmt::Display for TopReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.table().to_text())
    }
}
