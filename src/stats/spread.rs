//! One figure of several ranks (or processes) side by side: the least, the most, the mean and
//! the sum, and which one holds the most. `%gpumem ranks` and `gpumem-replay` over a directory of
//! ranks' files both summarise with it.
//!
//! The sum of several peaks adds each one's own highest figure: they need not have happened at
//! the same moment, so it is an upper bound of what they held together, not a measured total.

use serde::Serialize;

/// A figure (bytes) across several ranks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spread<K> {
    /// How many there are.
    pub count: usize,
    /// The smallest figure.
    pub min: u64,
    /// The largest figure.
    pub max: u64,
    /// The mean of the figures.
    pub mean: f64,
    /// The figures added up.
    pub sum: u64,
    /// Which one holds `max` (the first of equals, in the order given).
    pub highest: K,
}

impl<K> Spread<K> {
    /// The spread of `(who, figure)` pairs; `None` when there are none.
    pub fn of(items: impl IntoIterator<Item = (K, u64)>) -> Option<Spread<K>> {
        let mut it = items.into_iter();
        let (first, v) = it.next()?;
        let mut s = Spread { count: 1, min: v, max: v, mean: 0.0, sum: v, highest: first };
        for (k, v) in it {
            s.count += 1;
            s.min = s.min.min(v);
            s.sum = s.sum.saturating_add(v);
            if v > s.max {
                s.max = v;
                s.highest = k;
            }
        }
        s.mean = s.sum as f64 / s.count as f64;
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_max_mean_sum_and_the_first_highest() {
        let s = Spread::of([("rank 0", 48u64 << 20), ("rank 1", 80 << 20), ("rank 2", 80 << 20)]).unwrap();
        assert_eq!((s.count, s.min, s.max, s.sum), (3, 48 << 20, 80 << 20, 208 << 20));
        assert_eq!(s.mean, (208u64 << 20) as f64 / 3.0);
        assert_eq!(s.highest, "rank 1", "the first of equals");
        let one = Spread::of([(7u32, 5)]).unwrap();
        assert_eq!((one.count, one.min, one.max, one.mean, one.sum, one.highest), (1, 5, 5, 5.0, 5, 7));
        assert!(Spread::<u32>::of([]).is_none());
        let j = serde_json::to_value(&one).unwrap();
        assert_eq!(j, serde_json::json!({"count": 1, "min": 5, "max": 5, "mean": 5.0, "sum": 5, "highest": 7}));
    }
}
