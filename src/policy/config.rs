//! The allocator configuration string: `GPUMEM_NB_ALLOC_CONF`, same syntax as PyTorch's
//! `PYTORCH_CUDA_ALLOC_CONF` (e.g. `max_split_size_mb:128,roundup_power2_divisions:[256:1,>:4]`).
//!
//! Tokens are separated by `,` `:` `[` `]`; whitespace is ignored; booleans are exactly `True`
//! or `False`. Every key PyTorch 2.11 accepts is accepted; the ones that change the caching
//! policy are applied, the pinned-memory and locking keys are kept and reported in snapshots'
//! `allocator_settings`. Two keys are our own: `compact` (the page-mapped policy that reserves
//! less than PyTorch, see `policy::state::compact`) and `compact_slack_bp`. A malformed string
//! is an [`ConfigError`] naming the bad option.

use super::constants::{LARGE_BUFFER, ROUNDUP_POWER2_INTERVALS};
use std::fmt;

/// The environment variable read by [`AllocatorConfig::from_env`].
pub(crate) const ENV_VAR: &str = "GPUMEM_NB_ALLOC_CONF";

const MB: u64 = 1 << 20;

/// `compact_slack_bp` unless set: 1.25 %, the smallest slack with no page moves per iteration
/// in steady state on every recorded training loop (DESIGN of issue 13, BENCHMARKS.md).
const DEFAULT_COMPACT_SLACK_BP: u64 = 125;
/// The largest `compact_slack_bp`: reserved may reach twice the active peak.
const MAX_COMPACT_SLACK_BP: u64 = 10_000;

/// Settings of the caching policy. `Default` is PyTorch's default behaviour.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// Blocks at least this large are "oversize": never split, never used for smaller requests.
    /// `u64::MAX` (the default) means unlimited; memory_stats shows it as −1.
    pub max_split_size: u64,
    /// An oversize request may take a cached oversize block less than this much bigger (20 MiB).
    pub max_non_split_rounding: u64,
    /// Fraction of the allowed memory above which cached blocks are garbage-collected
    /// (only active together with a per-process memory fraction). 0 = off.
    pub garbage_collection_threshold: f64,
    /// `roundup_power2_divisions`: one entry per power-of-two interval from 1 MiB to 32 GiB+.
    pub roundup_power2_divisions: [u64; ROUNDUP_POWER2_INTERVALS],
    /// Grow segments by mapping pages into one reserved address range per (stream, pool).
    pub expandable_segments: bool,
    /// Our `compact` policy (not PyTorch's): 2 MiB pages mapped into one address range per
    /// (stream, pool), whole free pages moved to where they are needed. Same API and statistics,
    /// less reserved memory. `max_split_size_mb` and `max_non_split_rounding_mb` do not apply
    /// (there are no oversize blocks), nor does `garbage_collection_threshold`.
    pub compact: bool,
    /// Under `compact`: how far reserved memory may grow above the peak of active bytes, in
    /// basis points (125 = 1.25 %), before pages are taken from elsewhere instead of created.
    pub compact_slack_bp: u64,
    /// Segment size for 1–10 MiB requests and the large-pool page of expandable segments.
    pub large_segment_size: u64,
    /// `backend`: `native` or `cudaMallocAsync` (only `native` is implemented; kept for reports).
    pub backend: String,
    /// Kept for `allocator_settings` (lock handling around cudaMalloc).
    pub release_lock_on_cudamalloc: bool,
    /// Kept for `allocator_settings` (pinned host memory).
    pub pinned_use_cuda_host_register: bool,
    /// Kept for `allocator_settings` (pinned host memory).
    pub pinned_num_register_threads: u64,
    /// Kept for `allocator_settings` (pinned host memory).
    pub pinned_use_background_threads: bool,
    /// Kept for `allocator_settings`.
    pub graph_capture_record_stream_reuse: bool,
    /// The string this was parsed from, as reported in snapshots.
    pub source: String,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            garbage_collection_threshold: 0.0,
            roundup_power2_divisions: [0; ROUNDUP_POWER2_INTERVALS],
            expandable_segments: false,
            compact: false,
            compact_slack_bp: DEFAULT_COMPACT_SLACK_BP,
            large_segment_size: LARGE_BUFFER,
            backend: "native".to_string(),
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            graph_capture_record_stream_reuse: false,
            source: String::new(),
        }
    }
}

/// A malformed allocator configuration string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The option (key) that was wrong, or empty when the string itself is malformed.
    pub option: String,
    /// What was wrong with it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.option.is_empty() {
            write!(f, "invalid allocator config: {}", self.message)
        } else {
            write!(f, "invalid allocator config option '{}': {}", self.option, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

struct Tokens<'a> {
    toks: Vec<&'a str>,
    key: &'a str,
}

impl<'a> Tokens<'a> {
    fn get(&self, i: usize) -> Result<&'a str, ConfigError> {
        self.toks.get(i).copied().ok_or_else(|| self.err("value missing"))
    }
    fn err(&self, message: impl Into<String>) -> ConfigError {
        ConfigError { option: self.key.to_string(), message: message.into() }
    }
    fn expect(&self, i: usize, tok: &str) -> Result<(), ConfigError> {
        let got = self.get(i)?;
        if got == tok { Ok(()) } else { Err(self.err(format!("expected '{tok}', found '{got}'"))) }
    }
    fn size(&self, i: usize) -> Result<u64, ConfigError> {
        let t = self.get(i)?;
        t.parse::<u64>().map_err(|_| self.err(format!("expected a non-negative integer, found '{t}'")))
    }
    fn float(&self, i: usize) -> Result<f64, ConfigError> {
        let t = self.get(i)?;
        t.parse::<f64>().map_err(|_| self.err(format!("expected a number, found '{t}'")))
    }
    fn boolean(&self, i: usize) -> Result<bool, ConfigError> {
        match self.get(i)? {
            "True" => Ok(true),
            "False" => Ok(false),
            t => Err(self.err(format!("expected 'True' or 'False', found '{t}'"))),
        }
    }
}

fn tokenize(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    for (i, c) in s.char_indices() {
        let sep = matches!(c, ',' | ':' | '[' | ']');
        if sep || c.is_whitespace() {
            if let Some(st) = start.take() {
                out.push(&s[st..i]);
            }
            if sep {
                out.push(&s[i..i + 1]);
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(st) = start {
        out.push(&s[st..]);
    }
    out
}

impl AllocatorConfig {
    /// The environment variable read by [`AllocatorConfig::from_env`] (`GPUMEM_NB_ALLOC_CONF`).
    pub const ENV_VAR: &'static str = ENV_VAR;

    /// Parses a configuration string (PyTorch's syntax). The empty string gives the default.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let mut cfg = AllocatorConfig { source: s.to_string(), ..Default::default() };
        let toks = tokenize(s);
        let mut i = 0;
        while i < toks.len() {
            let key = toks[i];
            if key == "," {
                i += 1;
                continue;
            }
            let t = Tokens { toks: toks.clone(), key };
            match key {
                "max_split_size_mb" => {
                    t.expect(i + 1, ":")?;
                    let v = t.size(i + 2)?;
                    if v < LARGE_BUFFER / MB {
                        return Err(t.err(format!(
                            "CachingAllocator option max_split_size_mb too small, must be >= {}",
                            LARGE_BUFFER / MB
                        )));
                    }
                    cfg.max_split_size = v.min(u64::MAX / MB) * MB;
                    i += 2;
                }
                "max_non_split_rounding_mb" => {
                    t.expect(i + 1, ":")?;
                    let v = t.size(i + 2)?;
                    if v < LARGE_BUFFER / MB {
                        return Err(
                            t.err(format!("max_non_split_rounding_mb too small, must be >= {}", LARGE_BUFFER / MB))
                        );
                    }
                    cfg.max_non_split_rounding = v.min(u64::MAX / MB) * MB;
                    i += 2;
                }
                "large_segment_size_mb" => {
                    t.expect(i + 1, ":")?;
                    let v = t.size(i + 2)?;
                    // Requests of up to 10 MiB get one segment of this size: smaller could not
                    // hold them.
                    let min = super::constants::MIN_LARGE_ALLOC / MB;
                    if v < min || v % 2 != 0 {
                        return Err(t.err(format!("must be a multiple of 2 (MiB) of at least {min}, found {v}")));
                    }
                    cfg.large_segment_size = v.checked_mul(MB).ok_or_else(|| t.err(format!("{v} MiB is too large")))?;
                    i += 2;
                }
                "garbage_collection_threshold" => {
                    t.expect(i + 1, ":")?;
                    let v = t.float(i + 2)?;
                    if !(v > 0.0 && v < 1.0) {
                        return Err(t.err("garbage_collect_threshold is invalid, set it in (0.0, 1.0)"));
                    }
                    cfg.garbage_collection_threshold = v;
                    i += 2;
                }
                "roundup_power2_divisions" => {
                    i = parse_roundup(&t, i, &mut cfg.roundup_power2_divisions)?;
                }
                key if cfg.flag(key).is_some() => {
                    t.expect(i + 1, ":")?;
                    let v = t.boolean(i + 2)?;
                    if let Some(flag) = cfg.flag(key) {
                        *flag = v;
                    }
                    i += 2;
                }
                "compact_slack_bp" => {
                    t.expect(i + 1, ":")?;
                    let v = t.size(i + 2)?;
                    if v > MAX_COMPACT_SLACK_BP {
                        return Err(t.err(format!("must be at most {MAX_COMPACT_SLACK_BP} (100 %), found {v}")));
                    }
                    cfg.compact_slack_bp = v;
                    i += 2;
                }
                "pinned_num_register_threads" => {
                    t.expect(i + 1, ":")?;
                    let v = t.size(i + 2)?;
                    if v == 0 || !v.is_power_of_two() {
                        return Err(t.err("Number of register threads has to be power of 2"));
                    }
                    cfg.pinned_num_register_threads = v;
                    i += 2;
                }
                "backend" => {
                    t.expect(i + 1, ":")?;
                    let v = t.get(i + 2)?;
                    if v != "native" && v != "cudaMallocAsync" {
                        return Err(
                            t.err(format!("Unknown allocator backend '{v}', options are native and cudaMallocAsync"))
                        );
                    }
                    cfg.backend = v.to_string();
                    i += 2;
                }
                other => {
                    return Err(ConfigError {
                        option: other.to_string(),
                        message: format!("Unrecognized key '{other}' in CUDA allocator config."),
                    });
                }
            }
            i += 1;
            if i < toks.len() {
                if toks[i] != "," {
                    return Err(ConfigError {
                        option: key.to_string(),
                        message: format!("expected ',' after the value, found '{}'", toks[i]),
                    });
                }
                i += 1;
            }
        }
        if cfg.compact {
            if cfg.expandable_segments {
                return Err(ConfigError {
                    option: "compact".into(),
                    message: "compact and expandable_segments are two policies; choose one".into(),
                });
            }
            // No oversize blocks under compact: reported as unlimited, as PyTorch's default.
            cfg.max_split_size = u64::MAX;
        }
        Ok(cfg)
    }

    /// The `True`/`False` option called `key`, if it is one.
    fn flag(&mut self, key: &str) -> Option<&mut bool> {
        Some(match key {
            "expandable_segments" => &mut self.expandable_segments,
            "compact" => &mut self.compact,
            "release_lock_on_cudamalloc" => &mut self.release_lock_on_cudamalloc,
            "pinned_use_cuda_host_register" => &mut self.pinned_use_cuda_host_register,
            "pinned_use_background_threads" => &mut self.pinned_use_background_threads,
            "graph_capture_record_stream_reuse" => &mut self.graph_capture_record_stream_reuse,
            _ => return None,
        })
    }

    /// Reads `GPUMEM_NB_ALLOC_CONF`; unset or empty gives the default.
    pub fn from_env() -> Result<Self, ConfigError> {
        match std::env::var(ENV_VAR) {
            Ok(s) => Self::parse(&s),
            Err(_) => Ok(Self::default()),
        }
    }

    /// `max_split_size` as PyTorch reports it: −1 for unlimited.
    pub(crate) fn max_split_size_reported(&self) -> i64 {
        if self.max_split_size == u64::MAX { -1 } else { self.max_split_size as i64 }
    }

    /// Divisions for a (rounded-up) size: the interval index is `clamp(log2(size) − 20, 0, 15)`.
    pub(crate) fn roundup_divisions(&self, size: u64) -> u64 {
        let log_size = 63 - size.max(1).leading_zeros() as usize;
        let index = log_size.saturating_sub(20).min(ROUNDUP_POWER2_INTERVALS - 1);
        self.roundup_power2_divisions[index]
    }
}

fn parse_roundup(
    t: &Tokens<'_>,
    start: usize,
    table: &mut [u64; ROUNDUP_POWER2_INTERVALS],
) -> Result<usize, ConfigError> {
    let mut i = start;
    i += 1;
    t.expect(i, ":")?;
    i += 1;
    if t.get(i)? == "[" {
        let mut first_value = true;
        let mut last_index = 0usize;
        loop {
            i += 1;
            let tok = t.get(i).map_err(|_| t.err("expected closing bracket ']'"))?;
            if tok == "]" {
                break;
            }
            let value_index = i;
            i += 1;
            t.expect(i, ":")?;
            i += 1;
            let value = t.size(i)?;
            if !(value == 0 || value.is_power_of_two()) {
                return Err(t.err("For roundups, the divisions has to be power of 2 or 0 to disable roundup"));
            }
            if t.get(value_index)? == ">" {
                for e in table.iter_mut().skip(last_index + 1) {
                    *e = value;
                }
            } else {
                let boundary = t.size(value_index)?;
                if !boundary.is_power_of_two() {
                    return Err(t.err("For roundups, the intervals have to be power of 2"));
                }
                let index = (63 - boundary.leading_zeros() as usize).min(ROUNDUP_POWER2_INTERVALS - 1);
                if first_value {
                    for e in table.iter_mut().take(index) {
                        *e = value;
                    }
                    first_value = false;
                }
                table[index] = value;
                last_index = index;
            }
            if t.get(i + 1).map_err(|_| t.err("expected closing bracket ']'"))? != "]" {
                i += 1;
                t.expect(i, ",")?;
            }
        }
    } else {
        let value = t.size(i)?;
        if !value.is_power_of_two() {
            return Err(t.err("For roundups, the divisions has to be power of 2"));
        }
        table.fill(value);
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_default() {
        let c = AllocatorConfig::parse("").unwrap();
        assert_eq!(c.max_split_size, u64::MAX);
        assert_eq!(c.max_split_size_reported(), -1);
    }

    #[test]
    fn max_split_and_gc() {
        let c = AllocatorConfig::parse(" max_split_size_mb : 64 , garbage_collection_threshold:0.5,roundup_power2_divisions:[256:1,>:4],expandable_segments:False").unwrap();
        assert_eq!(c.roundup_power2_divisions[8], 1);
        assert_eq!(c.max_split_size, 64 << 20);
        assert_eq!(c.garbage_collection_threshold, 0.5);
        let e = AllocatorConfig::parse("max_split_size_mb:10").unwrap_err();
        assert_eq!(e.option, "max_split_size_mb");
        assert!(e.to_string().contains("must be >= 20"), "{e}");
        assert_eq!(
            AllocatorConfig::parse("garbage_collection_threshold:1.5").unwrap_err().option,
            "garbage_collection_threshold"
        );
    }

    #[test]
    fn roundup_single_and_list() {
        let c = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        assert!(c.roundup_power2_divisions.iter().all(|&d| d == 4));
        let c = AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,>:8]").unwrap();
        let mut want = [1u64; 16];
        want[9] = 2;
        for w in want.iter_mut().skip(10) {
            *w = 8;
        }
        assert_eq!(c.roundup_power2_divisions, want);
        let c = AllocatorConfig::parse("roundup_power2_divisions:[64:8,256:4,1024:4,>:1]").unwrap();
        assert_eq!(&c.roundup_power2_divisions[..7], &[8; 7]);
        assert_eq!(c.roundup_power2_divisions[8], 4);
        assert_eq!(c.roundup_power2_divisions[10], 4);
        assert_eq!(c.roundup_power2_divisions[11], 1);
        assert!(AllocatorConfig::parse("roundup_power2_divisions:3").is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:[256:3]").is_err());
        assert!(AllocatorConfig::parse("roundup_power2_divisions:[256:2").is_err());
    }

    #[test]
    fn booleans_are_exact_words() {
        assert!(AllocatorConfig::parse("expandable_segments:True").unwrap().expandable_segments);
        let e = AllocatorConfig::parse("expandable_segments:true").unwrap_err();
        assert_eq!(e.option, "expandable_segments");
    }

    #[test]
    fn unknown_key_is_named() {
        let e = AllocatorConfig::parse("max_split_size_mb:64,foo:1").unwrap_err();
        assert_eq!(e.option, "foo");
        assert_eq!(
            e.to_string(),
            "invalid allocator config option 'foo': Unrecognized key 'foo' in CUDA allocator config."
        );
        let e = AllocatorConfig::parse("max_split_size_mb").unwrap_err();
        assert_eq!(e.option, "max_split_size_mb");
        let e = AllocatorConfig::parse("max_split_size_mb:abc").unwrap_err();
        assert!(e.to_string().contains("'abc'"), "{e}");
    }

    #[test]
    fn compact_and_its_slack() {
        let c = AllocatorConfig::parse("compact:True").unwrap();
        assert!(c.compact && !c.expandable_segments);
        assert_eq!(c.compact_slack_bp, 125);
        let c = AllocatorConfig::parse("compact:True,compact_slack_bp:0,max_split_size_mb:64").unwrap();
        assert_eq!((c.compact_slack_bp, c.max_split_size_reported()), (0, -1), "no oversize blocks");
        assert!(!AllocatorConfig::parse("compact:False").unwrap().compact);
        let e = AllocatorConfig::parse("compact:True,expandable_segments:True").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid allocator config option 'compact': compact and expandable_segments are two policies; choose one"
        );
        let e = AllocatorConfig::parse("compact_slack_bp:10001").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid allocator config option 'compact_slack_bp': must be at most 10000 (100 %), found 10001"
        );
        let e = AllocatorConfig::parse("compact_slack_bp:-1").unwrap_err();
        assert_eq!(e.option, "compact_slack_bp");
        assert_eq!(AllocatorConfig::parse("compact:yes").unwrap_err().option, "compact");
    }

    /// Found by the `alloc_conf` fuzz target: a 2 MiB large segment could not hold the 3 MiB
    /// request it was made for (an underflow in the split test); now refused when parsed. A size
    /// whose bytes overflow is refused too.
    #[test]
    fn large_segment_size_must_hold_the_requests_it_serves() {
        for bad in ["large_segment_size_mb:2,", "large_segment_size_mb:8", "large_segment_size_mb:11"] {
            let e = AllocatorConfig::parse(bad).unwrap_err();
            assert_eq!(e.option, "large_segment_size_mb", "{bad}");
            assert!(e.to_string().contains("at least 10"), "{e}");
        }
        let e = AllocatorConfig::parse("large_segment_size_mb:18446744073709551614").unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
        assert_eq!(AllocatorConfig::parse("large_segment_size_mb:10").unwrap().large_segment_size, 10 * MB);
    }
}
