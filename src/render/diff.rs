//! A [`SnapshotDiff`] as text and HTML: one summary line, the changes per label and owner, and
//! the largest changed allocations.

use super::{MimeBundle, Table, escape};
use crate::snapshot::diff::{Change, Count, SnapshotDiff};
use crate::units::{iec, iec_delta};
use std::fmt;

/// Allocations listed one by one (the largest changes); the groups cover them all.
const MAX_ROWS: usize = 20;

fn counted(c: Count) -> String {
    if c.n == 0 { "–".into() } else { format!("{} ({})", c.n, iec(c.bytes)) }
}

fn label(l: &str) -> &str {
    if l.is_empty() { "–" } else { l }
}

impl SnapshotDiff {
    /// The summary line: both states, the net change, and what changed.
    pub fn headline(&self) -> String {
        format!(
            "memory diff {} → {}: {} → {} live allocations ({} → {}, {}) · appeared {} · disappeared {} · grew {} · \
             shrank {} · unchanged {}",
            self.a,
            self.b,
            self.total_a.n,
            self.total_b.n,
            iec(self.total_a.bytes),
            iec(self.total_b.bytes),
            iec_delta(self.net()),
            counted(self.count(Change::Appeared)),
            counted(self.count(Change::Disappeared)),
            counted(self.count(Change::Grew)),
            counted(self.count(Change::Shrank)),
            counted(self.unchanged),
        )
    }

    /// Changes per label and owner, the largest net change first.
    pub fn groups_table(&self) -> Table {
        let mut t = Table::new(["label", "owner", "appeared", "disappeared", "grew", "shrank", "net"])
            .right_align([2, 3, 4, 5, 6])
            .caption("per label (the cell that made them) and owner (the first frame of their stack)");
        for g in &self.groups {
            t.row([
                label(&g.label).to_string(),
                g.owner.clone(),
                counted(g.appeared),
                counted(g.disappeared),
                counted(g.grew),
                counted(g.shrank),
                iec_delta(g.net()),
            ]);
        }
        t
    }

    /// The changed allocations, the largest first (at most 20).
    pub fn changes_table(&self) -> Table {
        let mut t = Table::new(["change", "device", "address", "before", "after", "label", "owner"])
            .right_align([1, 3, 4])
            .caption(if self.changes.len() > MAX_ROWS {
                format!("the {MAX_ROWS} largest of {} changed allocations", self.changes.len())
            } else {
                format!("{} changed allocations", self.changes.len())
            });
        for c in self.changes.iter().take(MAX_ROWS) {
            let bytes = |b: u64| if b == 0 { "–".to_string() } else { iec(b) };
            t.row([
                c.change.name().to_string(),
                c.device.to_string(),
                format!("{:#x}", c.address),
                bytes(c.before),
                bytes(c.after),
                label(&c.label).to_string(),
                c.owner.clone(),
            ]);
        }
        t
    }

    /// Text and HTML.
    pub fn bundle(&self) -> MimeBundle {
        if self.changes.is_empty() {
            let line = self.headline();
            return MimeBundle::text(&line).with_html(format!("<div class=\"gpumem\">{}</div>", escape(&line)));
        }
        let (groups, changes) = (self.groups_table(), self.changes_table());
        let html = format!(
            "<div class=\"gpumem\" style=\"font-family:monospace;font-size:12px\"><div>{}</div>{}<br>{}</div>",
            escape(&self.headline()),
            groups.to_html(),
            changes.to_html()
        );
        MimeBundle::text(self.to_string()).with_html(html)
    }
}

impl fmt::Display for SnapshotDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.headline())?;
        if !self.changes.is_empty() {
            write!(f, "{}\n{}", self.groups_table().to_text(), self.changes_table().to_text())?;
        }
        Ok(())
    }
}

super::evcxr_display!(SnapshotDiff);

#[cfg(test)]
mod tests {
    use crate::snapshot::diff::{LiveAlloc, SnapshotDiff};

    #[test]
    fn text_and_html_name_every_group() {
        let x = |address, size, label: &str, owner: &str| LiveAlloc {
            device: 0,
            address,
            size,
            label: label.into(),
            owner: owner.into(),
        };
        let d = SnapshotDiff::between(
            "after cell 3",
            &[x(1, 1 << 20, "cell 2", "a")],
            "after cell 5",
            &[x(2, 64 << 20, "cell 5", "make_weights (nb.rs:4)"), x(3, 1 << 10, "", "b<c>")],
        );
        let b = d.bundle();
        assert!(b.text.starts_with("memory diff after cell 3 → after cell 5: 1 → 2 live allocations"), "{}", b.text);
        assert!(b.text.contains("appeared 2 (64.00 MiB)") && b.text.contains("+63.00 MiB"), "{}", b.text);
        assert!(b.text.contains("make_weights (nb.rs:4)") && b.text.contains("cell 2"), "{}", b.text);
        let html = b.html.unwrap();
        assert!(html.contains("b&lt;c&gt;") && html.contains("<table"), "{html}");
        let same = SnapshotDiff::between("A", &[x(1, 8, "", "a")], "B", &[x(1, 8, "", "a")]);
        assert!(same.bundle().text.contains("unchanged 1 (8 B)"), "{}", same.bundle().text);
    }
}
