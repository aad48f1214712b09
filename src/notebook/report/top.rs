//! The sites holding the most memory, as a table: `%gpumem top` and `gpumem_nb::tracking::top(n)`.

use crate::notebook::protocol::{OwnerBytes, TopReport};
use crate::render::{MimeBundle, Table};
use crate::units::iec;

impl TopReport {
    /// One table: for every place, the sites holding the most memory now, then those that held
    /// the most at the session's peak.
    pub fn table(&self) -> Table {
        let mut t = Table::new(["", "site (function ← cell:line)", "owner", "bytes", "share"]).right_align([3, 4]);
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
                    t.row([head, s.site(), s.owner.clone(), iec(s.bytes), share]);
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
