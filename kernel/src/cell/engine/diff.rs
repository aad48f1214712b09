//! `%gpumem diff A B`: two states compared allocation by allocation (gpumem-nb's
//! `snapshot::diff`), each a snapshot written by `%gpumem snapshot`, the allocations live now,
//! or those live after a cell of this session.
//!
//! A cell's state is not stored: it is rebuilt when asked, from a snapshot of the child taken
//! then and its recorded history walked back to the moment the cell ended (the kernel notes
//! that moment after every cell). So it needs history recorded, without a break, from before
//! the cell ended until now, in the same child: `%gpumem record on --stacks` early in the
//! notebook (stacks give the owners; labels come with every recorded event).

use super::{Engine, SLOW_TIMEOUT};
use crate::cell::magic::DiffSide;
use gpumem_nb::kernel::protocol::Op;
use gpumem_nb::snapshot::diff::{LiveAlloc, SnapshotDiff, live, live_at};
use gpumem_nb::snapshot::{Snapshot, json};

impl Engine {
    /// Shows the diff of `a` and `b`, or why one side cannot be had (one line and the usage).
    pub(super) fn diff(&mut self, count: u64, a: &DiffSide, b: &DiffSide) {
        let mut now: Option<Snapshot> = None;
        let sides = self.diff_state(count, a, &mut now).and_then(|a| Ok((a, self.diff_state(count, b, &mut now)?)));
        match sides {
            Ok(((a_name, a), (b_name, b))) => {
                let d = SnapshotDiff::between(&a_name, &a, &b_name, &b).bundle();
                self.display_text_html(&d.text, d.html.unwrap_or_default());
            }
            Err(why) => self.magic_error(&format!("diff: {why}")),
        }
    }

    /// One side's name and allocations; `now` holds the child's snapshot once taken (both
    /// sides may need it).
    fn diff_state(
        &mut self,
        count: u64,
        side: &DiffSide,
        now: &mut Option<Snapshot>,
    ) -> Result<(String, Vec<LiveAlloc>), String> {
        let cell = match side {
            DiffSide::Path(p) => {
                let path = super::magics::absolute(p);
                let snap = json::load(&path).map_err(|e| e.to_string())?;
                return Ok((path.display().to_string(), live(&snap)));
            }
            DiffSide::Now => return Ok((format!("now (cell {count})"), live(self.child_snapshot(count, now)?))),
            DiffSide::Cell(n) => *n,
        };
        let &(pid, ended) = self.cell_ends.get(&cell).ok_or(format!("cell {cell} has not run code in this session"))?;
        let child = self.child_pid();
        if pid != child {
            return Err(format!("cell {cell} ran in an earlier child process; its allocations went with it"));
        }
        match self.hooks.recording_since() {
            Some((p, since)) if Some(p) == child && since <= ended => {}
            _ => {
                return Err(format!(
                    "a cell's state is rebuilt from the recorded history, which must run from before cell {cell} \
                     ended until now: `%gpumem record on --stacks` before the cells to compare"
                ));
            }
        }
        let snap = self.child_snapshot(count, now)?;
        Ok((format!("after cell {cell}"), live_at(snap, ended).map_err(|e| e.to_string())?))
    }

    /// The child's snapshot (every tracked allocation with its history), taken once.
    fn child_snapshot<'a>(&mut self, count: u64, now: &'a mut Option<Snapshot>) -> Result<&'a Snapshot, String> {
        if now.is_none() {
            let pid = self.child_pid();
            self.hooks.poll(pid);
            if self.hooks.control().connected().is_none() {
                return Err("gpumem-nb is not loaded in this notebook (no allocations to compare)".into());
            }
            // Written into the kernel's private directory, read back, removed.
            let dir = self.hooks.control().dir().join(format!("diff-{count}"));
            let reply = self.hooks.control().request(Op::Snapshot { dir: dir.display().to_string() }, SLOW_TIMEOUT);
            let snap = reply.and_then(|_| json::load(&dir).map_err(|e| e.to_string()));
            let _ = std::fs::remove_dir_all(&dir);
            *now = Some(snap?);
        }
        Ok(now.as_ref().expect("taken above"))
    }
}
