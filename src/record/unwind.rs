//! Fast stack capture: framehop's caching DWARF unwinder over this process's own modules.
//!
//! A stack is walked from the registers where [`capture`] runs, with the unwind tables
//! (`.eh_frame` / `.eh_frame_hdr`) of every executable mapping of the process: the program,
//! libstd, CUDA's libraries (which have no frame pointers), evcxr's cell libraries. framehop
//! keeps each unwind rule it derives in a per-thread cache keyed by address, so a walk through
//! code seen before costs a few nanoseconds a frame instead of a table search (samply, the
//! profiler framehop was made for, walks other processes the same way).
//!
//! The modules are read from `/proc/self/maps` and the files behind them (`object`), once, and
//! again whenever a walk meets an address outside every known module (evcxr loads a library per
//! cell; CUDA loads its libraries late). Only the raw return addresses are kept; naming them is
//! [`super::frames::Symbolizer`]'s job, later.
//!
//! Where no register reader exists for the architecture (see `machine`), the thread's stack
//! bounds are unknown, or `/proc` cannot be read, [`capture`] falls back to the portable
//! unwinder of the `backtrace` crate.

#[allow(unsafe_code)]
mod machine;

use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

type Native = framehop::UnwinderNative<Vec<u8>, framehop::MayAllocateDuringUnwind>;
type Cache = framehop::CacheNative<framehop::MayAllocateDuringUnwind>;

/// The process's modules as the unwinder knows them.
struct Known {
    unwinder: Native,
    /// Executable ranges of the modules, sorted by start.
    ranges: Vec<(u64, u64)>,
    /// Files already read (by mapping start), so a refresh only reads new ones.
    loaded: Vec<(u64, String)>,
    /// Addresses found in no module even after a refresh (anonymous code, the vDSO): not
    /// worth another refresh.
    unknown: Vec<u64>,
}

static KNOWN: RwLock<Option<Arc<Known>>> = RwLock::new(None);
/// Bumped on every refresh; threads compare it with the version of their copy.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Serialises refreshes (reading files is slow; two threads need not do it twice).
static REFRESH: Mutex<()> = Mutex::new(());

/// Rule caches per thread. framehop's cache is direct-mapped (509 slots by address): two return
/// addresses of one stack that share a slot evict each other at every walk, and each eviction
/// costs a table search in `.eh_frame` (measured: a deep walk twice as slow with one such pair).
/// Each frame's address picks one of these caches by a hash of it, so a pair that collides in
/// one cache almost never collides in the chosen ones.
const CACHES: usize = 8;

struct ThreadState {
    known: Option<(u64, Arc<Known>)>,
    caches: Box<[Cache; CACHES]>,
    /// Its recent walks.
    memo: Memo,
    /// The serial of its last walk ([`capture`]) and what that walk found.
    serial: u64,
    last: Vec<usize>,
    /// This thread's stack, once asked (`Some(None)`: its bounds cannot be known here).
    stack: Option<Option<machine::Stack>>,
}

thread_local! {
    static THREAD: RefCell<ThreadState> =
        RefCell::new(ThreadState {
            known: None,
            caches: Box::new(std::array::from_fn(|_| Cache::new())),
            memo: Memo::default(),
            serial: 0,
            last: Vec::new(),
            stack: None,
        });
}

fn current_known() -> Option<Arc<Known>> {
    KNOWN.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Reads the modules not known yet; returns whether anything changed.
fn refresh() -> bool {
    let _one = crate::sync::lock(&REFRESH);
    let old = current_known();
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return false };
    let mut unwinder = old.as_ref().map(|k| k.unwinder.clone()).unwrap_or_default();
    let mut ranges = old.as_ref().map(|k| k.ranges.clone()).unwrap_or_default();
    let mut loaded = old.as_ref().map(|k| k.loaded.clone()).unwrap_or_default();
    let unknown = old.as_ref().map(|k| k.unknown.clone()).unwrap_or_default();
    let mut changed = false;
    for m in exec_mappings(&maps) {
        if loaded.iter().any(|(s, p)| *s == m.start && *p == m.path) {
            continue;
        }
        // A library unloaded and another loaded at its address: forget the old one.
        if let Some(i) = loaded.iter().position(|(s, _)| *s == m.start) {
            unwinder.remove_module(m.start);
            loaded.remove(i);
            ranges.retain(|r| r.0 != m.start);
        }
        loaded.push((m.start, m.path.clone()));
        if let Some(module) = module_of(&m) {
            unwinder.add_module(module);
            ranges.push((m.start, m.end));
            changed = true;
        }
    }
    ranges.sort_unstable();
    let known = Known { unwinder, ranges, loaded, unknown };
    *KNOWN.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(known));
    GENERATION.fetch_add(1, Ordering::Release);
    changed
}

/// Remembers addresses that no refresh could place.
fn note_unknown(addrs: &[u64]) {
    let _one = crate::sync::lock(&REFRESH);
    let Some(old) = current_known() else { return };
    let mut unknown = old.unknown.clone();
    unknown.extend_from_slice(addrs);
    unknown.sort_unstable();
    unknown.dedup();
    let known =
        Known { unwinder: old.unwinder.clone(), ranges: old.ranges.clone(), loaded: old.loaded.clone(), unknown };
    *KNOWN.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(known));
    GENERATION.fetch_add(1, Ordering::Release);
}

/// An executable mapping of a file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ExecMapping {
    start: u64,
    end: u64,
    /// File offset of the mapping.
    offset: u64,
    path: String,
}

/// The executable file mappings in `/proc/self/maps` text.
fn exec_mappings(maps: &str) -> Vec<ExecMapping> {
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
            let path = f.nth(2)?;
            if !perms.contains('x') || !path.starts_with('/') || line.ends_with("(deleted)") {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            Some(ExecMapping {
                start: u64::from_str_radix(a, 16).ok()?,
                end: u64::from_str_radix(b, 16).ok()?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                path: path.to_string(),
            })
        })
        .collect()
}

/// One executable mapping of a file, placed: what symbolisation needs of a module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ModuleMap {
    /// Start of the executable mapping.
    pub start: u64,
    /// Its end.
    pub end: u64,
    /// Where the file's virtual address 0 sits in memory (address − base = the address the
    /// file's own tables use).
    pub base: u64,
    /// The file.
    pub path: Arc<str>,
    /// Its file name (`libcuda.so.1`).
    pub name: Arc<str>,
}

/// The process's executable file mappings now, sorted by start. A mapping `known` (sorted by start) already holds
/// (same start, same file) is taken from it rather than read again: a long notebook session maps
/// a library per cell, and only the new ones need their headers read.
pub(crate) fn module_maps(known: &[ModuleMap]) -> Vec<ModuleMap> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return Vec::new() };
    let mut out: Vec<ModuleMap> = exec_mappings(&maps)
        .into_iter()
        .filter_map(|m| {
            let same = known.binary_search_by_key(&m.start, |k| k.start).ok().map(|i| &known[i]);
            if let Some(k) = same.filter(|k| k.end == m.end && *k.path == *m.path) {
                return Some(k.clone());
            }
            let file = std::fs::File::open(&m.path).ok()?;
            let cache = object::ReadCache::new(file);
            let obj = object::File::parse(&cache).ok()?;
            let base = base_of(&obj, &m)?;
            let name = std::path::Path::new(&m.path).file_name()?.to_str()?.into();
            Some(ModuleMap { start: m.start, end: m.end, base, path: m.path.as_str().into(), name })
        })
        .collect();
    out.sort_by_key(|m| m.start);
    out
}

/// Where file address 0 of `obj` sits in memory, from the load segment `m` maps.
fn base_of<'d, R: object::ReadRef<'d>>(obj: &object::File<'d, R>, m: &ExecMapping) -> Option<u64> {
    use object::{Object, ObjectSegment, SegmentFlags};
    // The executable load segment the mapping starts in: its file offset is rounded down to a
    // page by the loader (up to 64 KiB pages).
    let exec =
        |s: &object::Segment<'d, '_, R>| matches!(s.flags(), SegmentFlags::Elf { p_flags, .. } if p_flags.0 & 1 != 0);
    let holds = |s: &object::Segment<'d, '_, R>| {
        let (off, size) = s.file_range();
        off & !0xffff <= m.offset && m.offset < off + size.max(1)
    };
    let seg = obj.segments().find(|s| exec(s) && holds(s)).or_else(|| obj.segments().find(|s| holds(s)))?;
    let (seg_off, _) = seg.file_range();
    Some(m.start.wrapping_sub(seg.address()).wrapping_add(seg_off).wrapping_sub(m.offset))
}

/// The framehop module of a mapping: its file's unwind sections, placed where the mapping says.
fn module_of(m: &ExecMapping) -> Option<Module<Vec<u8>>> {
    use object::{Object, ObjectSection};
    let file = std::fs::File::open(&m.path).ok()?;
    let cache = object::ReadCache::new(file);
    let obj = object::File::parse(&cache).ok()?;
    let base = base_of(&obj, m)?;
    let section = |name: &str| obj.section_by_name(name);
    let range = |name: &str| section(name).map(|s| s.address()..s.address() + s.size());
    let data = |name: &str| section(name).and_then(|s| s.data().ok()).map(<[u8]>::to_vec);
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: range(".text"),
        got_svma: range(".got"),
        eh_frame_svma: range(".eh_frame"),
        eh_frame: data(".eh_frame"),
        eh_frame_hdr_svma: range(".eh_frame_hdr"),
        eh_frame_hdr: data(".eh_frame_hdr"),
        ..Default::default()
    };
    info.eh_frame.as_ref()?;
    Some(Module::new(m.path.clone(), m.start..m.end, base, info))
}

impl Known {
    fn holds(&self, addr: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.0 <= addr);
        i > 0 && addr < self.ranges[i - 1].1
    }
}

/// The raw return addresses of the caller's stack, innermost first: at most `limit` of them
/// (the caller's own frame first, as the portable unwinder gives it). Returns the walk's serial
/// on this thread: the same serial as the thread's previous walk when this one found the same
/// addresses (so a caller that kept what it made of the previous stack can use it again), a new
/// one otherwise.
#[inline(never)]
pub(crate) fn capture(limit: usize, out: &mut Vec<usize>) -> u64 {
    if machine::SUPPORTED
        && let Some(serial) = walk(limit, out)
    {
        return serial;
    }
    out.clear();
    backtrace::trace(|f| {
        out.push(f.ip() as usize);
        out.len() < limit
    });
    THREAD.with(|t| {
        let t = &mut *t.borrow_mut();
        t.serial += 1;
        t.last.clear();
        t.serial
    })
}

/// Which of a thread's rule caches serves a frame at `address` (a multiplicative hash's top bits:
/// independent of the address modulo 509, which picks the slot inside the cache).
#[inline]
fn cache_of(address: u64) -> usize {
    (address.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - CACHES.trailing_zeros())) as usize
}

/// What one step of a walk depends on besides the stack words it reads: the frame's address
/// (and whether it is a return address), and the registers framehop's rules use: on x86_64 the
/// instruction, stack and frame pointers (its rules and its DWARF evaluation read no other
/// register), on aarch64 the link register, stack and frame pointers. `[address, ip|lr, sp,
/// bp|fp]`.
type Key = [u64; 4];

/// The bit of a key's address that says it is a return address.
const RETURN_ADDRESS: u64 = 1 << 63;

#[inline(always)]
fn key_of(address: FrameAddress, regs: &framehop::UnwindRegsNative) -> Key {
    let a = address.address() ^ if address.is_return_address() { RETURN_ADDRESS } else { 0 };
    #[cfg(target_arch = "aarch64")]
    return [a, regs.lr(), regs.sp(), regs.fp()];
    #[cfg(not(target_arch = "aarch64"))]
    [a, regs.ip(), regs.sp(), regs.bp()]
}

/// Whether two states are the same, word by word (an array comparison loads 16 bytes at a time
/// from a key just stored 8 bytes at a time, and waits for the stores at every frame).
#[inline(always)]
fn same(a: &Key, b: &Key) -> bool {
    ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3])) == 0
}

/// The frame address of a state.
#[inline(always)]
fn address_of(key: &Key) -> FrameAddress {
    match FrameAddress::from_return_address(key[0] ^ RETURN_ADDRESS) {
        Some(ra) if key[0] & RETURN_ADDRESS != 0 => ra,
        _ => FrameAddress::from_instruction_pointer(key[0]),
    }
}

/// The registers of a state (those the rules read; see [`Key`]).
#[inline(always)]
fn regs_of(key: &Key) -> framehop::UnwindRegsNative {
    framehop::UnwindRegsNative::new(key[1], key[2], key[3])
}

/// The most stack words one step may read and still be remembered (framehop's rules read the
/// return address, the saved frame pointer and the registers a function pops: at most ten).
const STEP_READS: usize = 10;

/// One step of a walk as it went: the state it started from, the stack words it read (address
/// and value) and the state it led to, `[return address, registers…]` (all 0: the walk ended
/// there).
#[derive(Clone, Copy)]
struct Step {
    from: Key,
    to: Key,
    /// How many of `reads` it made; above [`STEP_READS`]: too many to remember (never taken).
    n: u32,
    /// Bit `k`: read `k` failed (outside the live stack; its value is 0).
    failed: u32,
    reads: [(u64, u64); STEP_READS],
}

impl Step {
    /// Whether every word this step read reads the same now.
    #[inline(always)]
    fn holds(&self, live: &machine::LiveStack<'_>) -> bool {
        let n = self.n as usize;
        n <= STEP_READS
            && self.reads[..n].iter().enumerate().all(|(k, &(a, v))| match live.read(a) {
                Ok(w) => w == v && self.failed & (1 << k) == 0,
                Err(()) => self.failed & (1 << k) != 0,
            })
    }
}

/// The recent walks of a thread, a step per position (position `i`: step `i` of the last walk
/// that went that deep). A step is a pure function of its starting state, the unwind rules
/// (fixed for a generation of the known modules) and the stack words it reads: a new walk that
/// reaches a state the memo holds, and finds every word that step read unchanged, takes the
/// step's result without unwinding. An allocation loop walks the same stack thousands of times:
/// checking two or three words a frame replaces a rule lookup and its evaluation, and only the
/// steps that changed are written back (BENCHMARKS.md, "Sites").
#[derive(Default)]
struct Memo {
    generation: u64,
    steps: Vec<Step>,
}

impl Memo {
    /// Step `i` of the walk under way is `step`: kept at position `i` (every later lookup is at
    /// a position above `i`).
    #[inline]
    fn put(&mut self, i: usize, step: &Step) {
        match self.steps.get_mut(i) {
            Some(s) => *s = *step,
            None => self.steps.push(*step),
        }
    }
}

/// framehop's walk, frame by frame, taking the steps of this thread's recent walks where they
/// still hold; its serial ([`capture`]), or `None` when it cannot run here (no `/proc`).
#[inline(always)]
fn walk(limit: usize, out: &mut Vec<usize>) -> Option<u64> {
    let regs = machine::registers();
    for attempt in 0..2 {
        let done = THREAD.with(|t| {
            let t = &mut *t.borrow_mut();
            let generation = GENERATION.load(Ordering::Acquire);
            if t.known.as_ref().is_none_or(|(g, _)| *g != generation) {
                if generation == 0 {
                    refresh();
                }
                let g = GENERATION.load(Ordering::Acquire);
                t.known = current_known().map(|k| (g, k));
            }
            let stack = *t.stack.get_or_insert_with(machine::Stack::current);
            // Reads stay between the walk's stack pointer and the top of this thread's stack;
            // a stack pointer elsewhere (a signal or coroutine stack) takes the portable path.
            let (Some((generation, known)), Some(live)) = (&t.known, stack.as_ref().and_then(|s| s.live_from(regs.sp)))
            else {
                return None;
            };
            out.clear();
            #[cfg(target_arch = "aarch64")]
            let start = framehop::UnwindRegsNative::new(regs.lr, regs.sp, regs.fp);
            #[cfg(not(target_arch = "aarch64"))]
            let start = framehop::UnwindRegsNative::new(regs.pc, regs.sp, regs.fp);
            // The walk's state: the frame's address and the registers the rules read (a `Key`;
            // framehop's register set is made only for a step of its own).
            let mut key = key_of(FrameAddress::from_instruction_pointer(regs.pc), &start);
            let mut strange = Vec::new();
            out.push(regs.pc as usize);

            let memo = &mut t.memo;
            if memo.generation != *generation {
                memo.generation = *generation;
                memo.steps.clear();
            }
            // The position after the last step taken from the memo (its successor is the first
            // candidate for the next step).
            let mut next: Option<usize> = None;
            // Positions below `p` hold steps whose stack pointer is below the walk's (positions
            // written by one walk have growing stack pointers).
            let mut p = 0usize;
            let mut own = Step { from: [0; 4], to: [0; 4], n: 0, failed: 0, reads: [(0, 0); STEP_READS] };
            while out.len() < limit {
                let i = out.len() - 1;
                let found = match next {
                    Some(q) if q < memo.steps.len() && same(&memo.steps[q].from, &key) => Some(q),
                    _ => {
                        p = p.max(i);
                        while p < memo.steps.len() && memo.steps[p].from[2] < key[2] {
                            p += 1;
                        }
                        (p < memo.steps.len() && same(&memo.steps[p].from, &key)).then_some(p)
                    }
                };
                next = None;
                if let Some(q) = found {
                    let s = &memo.steps[q];
                    if s.holds(&live) {
                        let to = s.to;
                        if q != i {
                            let s = *s;
                            memo.put(i, &s);
                        }
                        next = Some(q + 1);
                        if to[0] == 0 {
                            break;
                        }
                        out.push(to[0] as usize);
                        key = [to[0] ^ RETURN_ADDRESS, to[1], to[2], to[3]];
                        continue;
                    }
                }
                // A step of its own.
                own.from = key;
                own.n = 0;
                own.failed = 0;
                let mut read = |addr: u64| {
                    let v = live.read(addr);
                    if let Some(slot) = own.reads.get_mut(own.n as usize) {
                        *slot = (addr, v.unwrap_or(0));
                        if v.is_err() {
                            own.failed |= 1 << own.n;
                        }
                    }
                    own.n += 1;
                    v
                };
                let address = address_of(&key);
                let mut unwind_regs = regs_of(&key);
                let cache = &mut t.caches[cache_of(address.address())];
                own.to = match known.unwinder.unwind_frame(address, &mut unwind_regs, cache, &mut read) {
                    Ok(Some(ra)) if ra != 0 => {
                        if !known.holds(ra) && known.unknown.binary_search(&ra).is_err() {
                            strange.push(ra);
                        }
                        let mut to = key_of(address, &unwind_regs);
                        to[0] = ra;
                        to
                    }
                    Ok(_) | Err(_) => [0; 4],
                };
                memo.put(i, &own);
                if own.to[0] == 0 {
                    break;
                }
                out.push(own.to[0] as usize);
                key = [own.to[0] ^ RETURN_ADDRESS, own.to[1], own.to[2], own.to[3]];
            }
            // The same addresses as the last walk: the same serial.
            if t.serial == 0 || t.last != *out {
                t.serial += 1;
                t.last.clone_from(out);
            }
            Some((strange, t.serial))
        });
        match done {
            None => return None,
            Some((strange, serial)) if strange.is_empty() => return Some(serial),
            Some((strange, serial)) => {
                // A module loaded since the last look (a new cell's library): read it and walk
                // again; addresses still in no module are remembered as such.
                if attempt == 0 && !refresh() {
                    note_unknown(&strange);
                    return Some(serial);
                }
                if attempt == 1 {
                    note_unknown(&strange);
                    return Some(serial);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn deep(n: usize, out: &mut Vec<usize>) {
        if n == 0 {
            capture(64, out);
        } else {
            deep(n - 1, out);
        }
        std::hint::black_box(n);
    }

    #[test]
    fn framehop_walks_the_same_stack_as_the_portable_unwinder() {
        let mut fast = Vec::new();
        deep(5, &mut fast);
        let mut slow = Vec::new();
        backtrace::trace(|f| {
            if f.ip() as usize != 0 {
                slow.push(f.ip() as usize);
            }
            true
        });
        assert!(fast.len() > 8, "{fast:x?}");
        // The fast path itself, not the portable fallback, walked it.
        let mut own = Vec::new();
        assert!(walk(64, &mut own).is_some() && own.len() > 4, "framehop's walk ran: {own:x?}");
        // Beyond the first two frames (the two walks start in different functions), every
        // return address of the test thread's bottom is found by both.
        let tail = &slow[slow.len().saturating_sub(4)..];
        for ra in tail {
            assert!(fast.contains(ra), "{ra:#x} missing from {fast:x?} (portable: {slow:x?})");
        }
    }

    /// Captures at the bottom of `depth` nested frames, through one of two leaf functions (two
    /// paths whose stacks differ in their innermost frames), with or without the thread's memo.
    #[inline(never)]
    fn nested(depth: usize, path: bool, limit: usize, memo: bool, out: &mut Vec<usize>) -> u64 {
        #[inline(never)]
        fn leaf_a(limit: usize, memo: bool, out: &mut Vec<usize>) -> u64 {
            if !memo {
                forget_memo();
            }
            let serial = capture(limit, out);
            std::hint::black_box(limit);
            serial
        }
        #[inline(never)]
        fn leaf_b(limit: usize, memo: bool, out: &mut Vec<usize>) -> u64 {
            let pad = std::hint::black_box([limit; 3]);
            if !memo {
                forget_memo();
            }
            let serial = capture(pad[1], out);
            std::hint::black_box(pad);
            serial
        }
        let serial = if depth == 0 {
            if path { leaf_a(limit, memo, out) } else { leaf_b(limit, memo, out) }
        } else {
            nested(depth - 1, path, limit, memo, out)
        };
        std::hint::black_box(depth);
        serial
    }

    fn forget_memo() {
        THREAD.with(|t| t.borrow_mut().memo.steps.clear());
    }

    #[test]
    fn walks_that_reuse_the_last_walk_find_what_a_walk_from_scratch_finds() {
        // Same stacks again, deeper and shallower ones, the other path, shorter and longer
        // limits: each walk (which may follow the memo the one before left) equals a walk of
        // the same stack with no memo.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut followed_some = false;
        for i in 0..400 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (depth, path, limit) = ((x % 9) as usize, (x >> 8) & 1 == 1, [4, 16, 32, 64][(x >> 12) as usize % 4]);
            // One call site for both walks: their stacks are the same up to the test's frame.
            let mut walks = [Vec::new(), Vec::new()];
            let mut before = 0;
            // (A trip count the compiler cannot see: an unrolled loop has two call sites.)
            for (k, walk) in walks.iter_mut().enumerate().take(std::hint::black_box(2)) {
                if k == 1 {
                    before = THREAD.with(|t| t.borrow().memo.steps.len());
                }
                nested(depth, path, limit, k == 0, walk);
            }
            let [with, without] = walks;
            assert_eq!(with, without, "walk {i}: depth {depth}, path {path}, limit {limit}");
            assert!(with.len() >= 4.min(limit), "{with:x?}");
            followed_some |= before > 0;
            // Leave a memo of another stack behind for the next walk, sometimes.
            if x & 3 == 0 {
                nested((x % 5) as usize, !path, 64, true, &mut Vec::new());
            }
        }
        assert!(followed_some);
    }

    #[test]
    fn the_memo_holds_the_last_walk_step_by_step() {
        let depths = std::hint::black_box(vec![3, 5, 3, 3]);
        for &depth in &depths {
            let mut w = Vec::new();
            nested(depth, true, 64, true, &mut w);
            THREAD.with(|t| {
                let memo = &t.borrow().memo;
                // Step i led from frame i to frame i + 1.
                for (i, ra) in w.iter().enumerate().skip(1) {
                    assert_eq!(memo.steps[i - 1].to[0], *ra as u64, "depth {depth}, step {}", i - 1);
                }
                assert!(memo.steps.len() >= w.len() - 1);
            });
        }
    }

    #[test]
    fn a_walk_that_repeats_the_last_one_keeps_its_serial() {
        let runs =
            std::hint::black_box(vec![(3, true), (3, true), (5, true), (5, true), (3, true), (3, false), (3, true)]);
        let (mut serials, mut walks) = (Vec::new(), Vec::new());
        for &(depth, path) in &runs {
            let mut w = Vec::new();
            serials.push(nested(depth, path, 64, true, &mut w));
            walks.push(w);
        }
        for i in 1..runs.len() {
            assert_eq!(serials[i] == serials[i - 1], walks[i] == walks[i - 1], "walk {i}: {serials:?}");
        }
        assert_eq!((serials[0], serials[2]), (serials[1], serials[3]), "repeated walks: {serials:?}");
        assert!(serials.windows(2).all(|w| w[1] >= w[0]), "serials only grow: {serials:?}");
    }

    #[test]
    fn addresses_sharing_a_slot_of_framehops_cache_spread_over_the_caches() {
        // framehop's slot is the address modulo 509: these 64 addresses all share one slot.
        let used: std::collections::HashSet<usize> = (0..64u64).map(|k| cache_of(0x5555_0000_0007 + k * 509)).collect();
        assert_eq!(used.len(), CACHES, "{used:?}");
        assert!((0..1000u64).all(|a| cache_of(a * 4099) < CACHES));
    }

    #[test]
    fn mappings_are_read_from_proc_maps_text() {
        let text = "00400000-00452000 r-xp 00001000 08:02 173521 /usr/bin/dbus-daemon\n\
                    00651000-00652000 r--p 00051000 08:02 173521 /usr/bin/dbus-daemon\n\
                    7f0000000000-7f0000001000 r-xp 00000000 00:00 0 [vdso]\n\
                    7f0000002000-7f0000003000 r-xp 00000000 00:00 0 /gone/libx.so (deleted)\n";
        let m = exec_mappings(text);
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].start, m[0].end, m[0].offset), (0x400000, 0x452000, 0x1000));
    }
}
