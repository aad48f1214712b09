//! Labels ("cell 3") interned as the small ids that blocks, events and tracked allocations
//! carry.
#![forbid(unsafe_code)]

use std::sync::Arc;

/// Interned label texts; id 0 is the empty label (none).
#[derive(Clone, Debug)]
pub(crate) struct Labels(Vec<Arc<str>>);

impl Default for Labels {
    fn default() -> Self {
        Labels(vec![Arc::from("")])
    }
}

impl Labels {
    /// The id of `label` (0 for `None` or ""), interned the first time it is seen.
    pub(crate) fn intern(&mut self, label: Option<&str>) -> u32 {
        match label {
            None | Some("") => 0,
            Some(l) => match self.0.iter().position(|x| &**x == l) {
                Some(i) => i as u32,
                None => {
                    self.0.push(Arc::from(l));
                    (self.0.len() - 1) as u32
                }
            },
        }
    }

    /// The text of an id ("" for 0 or an unknown id).
    pub(crate) fn name(&self, id: u32) -> &str {
        self.0.get(id as usize).map_or("", |l| l)
    }

    /// Every text, indexed by id.
    pub(crate) fn all(&self) -> Vec<String> {
        self.0.iter().map(|l| l.to_string()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_zero_is_none() {
        let mut l = Labels::default();
        assert_eq!(l.intern(None), 0);
        assert_eq!(l.intern(Some("")), 0);
        let a = l.intern(Some("cell 1"));
        let b = l.intern(Some("cell 2"));
        assert_eq!((a, b), (1, 2));
        assert_eq!(l.intern(Some("cell 1")), a, "interned once");
        assert_eq!((l.name(a), l.name(0), l.name(99)), ("cell 1", "", ""));
        assert_eq!(l.all(), ["", "cell 1", "cell 2"]);
    }
}
