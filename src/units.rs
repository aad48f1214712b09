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
    match iec_unit(bytes) {
        None => format!("{bytes} B"),
        Some((unit, div)) => format!("{:.2} {unit}", bytes as f64 / div as f64),
    }
}

/// The IEC unit `bytes` are written in (KiB up to a MiB, …), `None` below a KiB.
fn iec_unit(bytes: u64) -> Option<(&'static str, u64)> {
    match bytes {
        b if b < KIB => None,
        b if b < MIB => Some(("KiB", KIB)),
        b if b < GIB => Some(("MiB", MIB)),
        b if b < TIB => Some(("GiB", GIB)),
        _ => Some(("TiB", TIB)),
    }
}

/// Bytes in IEC units with three significant digits, for lines read at a glance: `512 B`,
/// `1.50 GiB`, `78.9 GiB`, `256 MiB` (tables and records keep [`iec`]'s two decimals).
pub fn iec3(bytes: u64) -> String {
    let Some((unit, div)) = iec_unit(bytes) else { return format!("{bytes} B") };
    let v = bytes as f64 / div as f64;
    if v < 9.995 {
        format!("{v:.2} {unit}")
    } else if v < 99.95 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.0} {unit}")
    }
}

/// [`iec3`] with an explicit sign: `+2.00 MiB`, `-512 MiB`, `±0 B`.
pub fn iec3_delta(delta: i64) -> String {
    match delta {
        0 => "±0 B".to_string(),
        d if d > 0 => format!("+{}", iec3(d as u64)),
        d => format!("-{}", iec3(d.unsigned_abs())),
    }
}

/// A signed byte delta in IEC units with an explicit sign: `+2.00 MiB`, `-512 B`, `±0 B`.
pub fn iec_delta(delta: i64) -> String {
    match delta {
        0 => "±0 B".to_string(),
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

/// `n` of a `noun` in words: `1 cell`, `3 cells` (`noun` takes an `s` for every count but one).
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{} {noun}s", group_digits(n as u64)) }
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

/// A duration as people read it, to three significant digits: "850 µs", "1.25 ms",
/// "12.3 ms", "4.21 s", then "3 min 7 s" and "2 h 5 min". The one duration format of every
/// report (scopes, cell reports, snapshot summaries).
pub fn format_duration(d: std::time::Duration) -> String {
    let us = d.as_micros();
    let sig3 = |v: f64, unit: &str| match v {
        v if v < 10.0 => format!("{v:.2} {unit}"),
        v if v < 100.0 => format!("{v:.1} {unit}"),
        v => format!("{v:.0} {unit}"),
    };
    if us < 1_000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        sig3(us as f64 / 1e3, "ms")
    } else if us < 60_000_000 {
        sig3(us as f64 / 1e6, "s")
    } else if us < 3_600_000_000 {
        format!("{} min {} s", us / 60_000_000, (us / 1_000_000) % 60)
    } else {
        format!("{} h {} min", us / 3_600_000_000, (us / 60_000_000) % 60)
    }
}

/// [`format_duration`] of a microsecond count (negative counts as 0).
pub fn format_duration_us(us: i64) -> String {
    format_duration(std::time::Duration::from_micros(us.max(0) as u64))
}

/// Microseconds since the Unix epoch as a UTC date and time: "2026-03-01 14:05:09 UTC".
pub fn format_utc(time_us: i64) -> String {
    let secs = time_us.div_euclid(1_000_000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, (rem / 60) % 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_in_words() {
        assert_eq!(count(1, "cell"), "1 cell");
        assert_eq!(count(0, "cell"), "0 cells");
        assert_eq!(count(3001, "earlier cell"), "3,001 earlier cells");
    }

    #[test]
    fn durations_have_three_significant_digits() {
        use std::time::Duration;
        assert_eq!(format_duration(Duration::from_micros(850)), "850 µs");
        assert_eq!(format_duration(Duration::from_micros(1_254)), "1.25 ms");
        assert_eq!(format_duration(Duration::from_micros(12_345)), "12.3 ms");
        assert_eq!(format_duration(Duration::from_micros(123_456)), "123 ms");
        assert_eq!(format_duration(Duration::from_millis(3_200)), "3.20 s");
        assert_eq!(format_duration_us(4_210_000), "4.21 s");
        assert_eq!(format_duration_us(187_000_000), "3 min 7 s");
        assert_eq!(format_duration_us(7_500_000_000), "2 h 5 min");
        assert_eq!(format_duration_us(-5), "0 µs");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_utc(1_709_301_909_000_000), "2024-03-01 14:05:09 UTC");
    }

    #[test]
    fn three_significant_digits_for_lines() {
        assert_eq!(iec3(512), "512 B");
        assert_eq!(iec3(3 << 29), "1.50 GiB");
        assert_eq!(iec3(48 << 20), "48.0 MiB");
        assert_eq!(iec3(256 << 20), "256 MiB");
        assert_eq!(iec3((78.88 * GIB as f64) as u64), "78.9 GiB");
        assert_eq!(iec3_delta(-(64 << 20)), "-64.0 MiB");
        assert_eq!(iec3_delta(0), "±0 B");
    }

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
