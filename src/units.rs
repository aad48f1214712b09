//! Byte sizes: PyTorch's two size printers, and the IEC form used on screen.
//!
//! Three printers, each with one job:
//! - [`format_size`] is PyTorch's C++ `format_size` (OOM messages): "N bytes", then KiB/MiB/GiB
//!   with two decimals, inclusive boundaries.
//! - [`summary_size`] / [`summary_count`] are the `memory_summary()` column formatters from
//!   `torch/cuda/memory.py` (integer division, unit chosen by the row's reference value).
//! - [`iec`] is ours: what reports show (`1.50 MiB`), always base 1024.

/// 1 KiB in bytes.
pub const KIB: u64 = 1 << 10;
/// 1 MiB in bytes.
pub const MIB: u64 = 1 << 20;
/// 1 GiB in bytes.
pub const GIB: u64 = 1 << 30;
/// 1 TiB in bytes.
pub const TIB: u64 = 1 << 40;

/// PyTorch's C++ `format_size`, used in the out-of-memory message.
///
/// `≤ 1024` prints "N bytes"; then KiB up to and including 1 MiB, MiB up to and including
/// 1 GiB, GiB beyond, each with two decimals ("1024.00 KiB" for exactly 1 MiB).
pub fn format_size(size: u64) -> String {
    if size <= KIB {
        format!("{size} bytes")
    } else if size <= MIB {
        format!("{:.2} KiB", size as f64 / KIB as f64)
    } else if size <= GIB {
        format!("{:.2} MiB", size as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", size as f64 / GIB as f64)
    }
}

/// `memory_summary()`'s size column: `f"{sz:6d} {unit}"`, dividing by 1024 while the row's
/// reference value (`pref`) is at least 768 units of the current prefix.
pub fn summary_size(value: i64, pref: i64) -> String {
    const PREFIXES: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut sz = value;
    let mut pref_sz = pref as f64;
    let mut prefix = PREFIXES[0];
    for p in &PREFIXES[1..] {
        if pref_sz < 768.0 * 1024.0 {
            break;
        }
        prefix = p;
        sz = py_floordiv(sz, 1024);
        pref_sz /= 1024.0;
    }
    format!("{sz:6} {prefix}")
}

/// `memory_summary()`'s count column: `f"{cnt:7d} {unit} "`, units " ", K, M at 750,000.
pub fn summary_count(value: i64, pref: i64) -> String {
    const PREFIXES: [&str; 3] = [" ", "K", "M"];
    let mut cnt = value;
    let mut pref_cnt = pref as f64;
    let mut prefix = PREFIXES[0];
    for p in &PREFIXES[1..] {
        if pref_cnt < 750.0 * 1000.0 {
            break;
        }
        prefix = p;
        cnt = py_floordiv(cnt, 1000);
        pref_cnt /= 1000.0;
    }
    format!("{cnt:7} {prefix} ")
}

/// Python's `//` on integers (rounds toward negative infinity).
fn py_floordiv(a: i64, b: i64) -> i64 {
    a.div_euclid(b)
}

/// A size in bytes as people read it: `512 B`, `1.50 KiB`, `20.00 MiB`, `139.80 GiB`.
pub fn iec(bytes: u64) -> String {
    if bytes < KIB {
        return format!("{bytes} B");
    }
    let (unit, div) = if bytes < MIB {
        ("KiB", KIB)
    } else if bytes < GIB {
        ("MiB", MIB)
    } else if bytes < TIB {
        ("GiB", GIB)
    } else {
        ("TiB", TIB)
    };
    format!("{:.2} {unit}", bytes as f64 / div as f64)
}

/// A signed byte delta in IEC units with an explicit sign: `+2.00 MiB`, `-512 B`, `0 B`.
pub fn iec_delta(delta: i64) -> String {
    match delta {
        0 => "0 B".to_string(),
        d if d > 0 => format!("+{}", iec(d as u64)),
        d => format!("-{}", iec(d.unsigned_abs())),
    }
}

/// A count with thousands separators: `1234567` → `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Parses a size as a user writes it: `1024`, `512B`, `1.5GiB`, `20 MiB`, `2G` (binary units).
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => TIB,
        _ => return None,
    };
    let v = num * mult as f64;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_size_boundaries_match_pytorch() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(MIB), "1024.00 KiB");
        assert_eq!(format_size(2 * MIB), "2.00 MiB");
        assert_eq!(format_size(GIB), "1024.00 MiB");
        assert_eq!(format_size(TIB), "1024.00 GiB");
        assert_eq!(format_size(150_109_880_320), "139.80 GiB");
    }

    #[test]
    fn summary_formatters_follow_reference_value() {
        assert_eq!(summary_size(0, 0), "     0 B  ");
        assert_eq!(summary_size(26_681_344, 26_681_344), " 26056 KiB");
        // a sub-row uses the unit of its "all" row
        assert_eq!(summary_size(2_049_536, 26_681_344), "  2001 KiB");
        assert_eq!(summary_count(7, 7), "      7   ");
        assert_eq!(summary_count(1_500_000, 1_500_000), "   1500 K ");
    }

    #[test]
    fn digit_groups() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1_234_567), "1,234,567");
    }

    #[test]
    fn iec_and_parse() {
        assert_eq!(iec(512), "512 B");
        assert_eq!(iec(3 * MIB / 2), "1.50 MiB");
        assert_eq!(iec_delta(-(MIB as i64)), "-1.00 MiB");
        assert_eq!(parse_size("1.5GiB"), Some(3 * GIB / 2));
        assert_eq!(parse_size("20 MiB"), Some(20 * MIB));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("12 parsecs"), None);
        assert_eq!(parse_size(""), None);
    }
}
