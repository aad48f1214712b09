//! Fitting a report line into its width: its parts, each with forms from richest to shortest and
//! how long each form is kept; the least important goes first.

/// How long a part of the line is kept when the line is too long (the lowest goes first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Keep {
    Free,
    Nvml,
    Devices,
    Top,
    /// Worker processes a cell started: memory beyond the notebook's process.
    Children,
    Pool,
    /// An owner of the device's memory after the one that changed most (the smallest change
    /// goes first).
    Owner,
    What,
    /// The allocator's reserved bytes with their change; then without; then left out (the
    /// details have them), before every allocation is (memory beyond the allocator's) or the
    /// components' largest change.
    Reserved,
    ReservedShort,
    All,
    /// A watched framework's own numbers (cubecl's pools for burn).
    Framework,
    WhatShortest,
    /// A framework's figures without its stamps' changes.
    FrameworkShort,
    Flag,
    Restart,
    /// A warning's or a restart's short form (`⚠ over budget`, `⟳ restarted`): the details and
    /// the history's notes have it whole.
    FlagShort,
    Always,
}

/// A line's parts in the order they are shown, each with its forms from richest to shortest,
/// and how long each form is kept.
#[derive(Default)]
pub(super) struct Parts(Vec<Vec<(Keep, String)>>);

impl Parts {
    pub(super) fn keep(&mut self, text: String) {
        self.add(Keep::Always, text);
    }

    /// A part always kept, shortened to its next form where the line needs it.
    pub(super) fn keep_variants(&mut self, forms: Vec<String>) {
        self.0.push(forms.into_iter().map(|f| (Keep::Always, f)).collect());
    }

    pub(super) fn add(&mut self, keep: Keep, text: String) {
        self.0.push(vec![(keep, text)]);
    }

    pub(super) fn add_forms(&mut self, forms: Vec<(Keep, String)>) {
        if !forms.is_empty() {
            self.0.push(forms);
        }
    }

    fn text(&self) -> String {
        let shown: Vec<&str> = self.0.iter().map(|f| f[0].1.as_str()).collect();
        shown.join(" · ")
    }

    /// The parts joined by ` · `, at most `width` characters where the parts that are always
    /// kept allow it: the part whose form is least important is shortened (its next form) or
    /// left out, until the line fits.
    pub(super) fn fit(mut self, width: usize) -> String {
        loop {
            let line = self.text();
            if line.chars().count() <= width {
                return line;
            }
            // The least important form that can still change; the later one of equals (a
            // part always kept can only be shortened).
            let can_change = |i: &usize| self.0[*i][0].0 != Keep::Always || self.0[*i].len() > 1;
            let Some(i) = (0..self.0.len()).filter(can_change).min_by_key(|&i| (self.0[i][0].0, std::cmp::Reverse(i)))
            else {
                return line;
            };
            if self.0[i].len() > 1 {
                self.0[i].remove(0);
            } else {
                self.0.remove(i);
            }
        }
    }
}
