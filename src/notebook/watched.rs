//! Frameworks that keep their own books of device memory: cubecl's pools, which burn allocates
//! from (`gpumem_nb::frameworks::cubecl`, feature `cubecl`). Tracking sees a framework's pages
//! as they come from the driver, not what inside them is in use; the framework's own numbers
//! say that. A notebook registers a reader once ([`watch`]); every cell's `pre`, `post` and
//! `read` (both kernels) then ask each reader at the same moment as the other numbers.
//!
//! Readers live in the process-wide anchor: under evcxr the cell that registers one runs its
//! own copy of this crate while the control channel's thread runs the copy that opened the
//! device. A reader's code stays the registering cell's (evcxr never unloads a cell's library),
//! and so does what it captured (a framework's client, which its own copy's statics found).
//!
//! A reader runs on a thread of its own with a time limit ([`READ_TIMEOUT`]): a framework whose
//! queue is stuck costs its numbers in the report, never the report or the kernel. A panicking
//! reader is an error in its reading.
//!
//! A component stamp (`gpumem_nb::component`) is a phase here: each watched framework is settled
//! and read when a stamp begins and when it ends ([`phase_begin`], [`phase_end`]), and the
//! change of its in-use bytes goes to the stamp's component, less what stamps nested in it
//! changed. The next reading carries the phases that ended ([`FrameworkPhase`]). That is what a
//! framework keeping tensors in pools of its own (cubecl) lets one know of what its memory is.
#![forbid(unsafe_code)]

use super::protocol::{FrameworkPhase, FrameworkPool, FrameworkReading, Settled, Trimmed};
use crate::record::component::Component;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::ThreadId;
use std::time::Duration;

/// How long a cell's reading waits for one framework's answer.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// A framework's reader: its numbers now.
pub(crate) type Reader = Arc<dyn Fn() -> FrameworkReading + Send + Sync>;

/// Brings a framework to a point where everything queued before the call has run (cubecl:
/// `client.flush()`), so that what a cell queued is allocated before its reading; `Err` says
/// why it could not.
pub(crate) type Settler = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Gives back what a framework keeps cached and unused, by its own means (cubecl:
/// `client.memory_cleanup()`), for `%gpumem trim`; `Err` says why it could not.
pub(crate) type Trimmer = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// How long a reading waits, in all, for the devices and the watched frameworks to run what was
/// queued before it; what does not answer by then is read as it is, and the reply says so. One
/// second, or `GPUMEM_NB_SETTLE_SECS` (seconds, more than 0 and at most 600: a slow framework, a
/// loaded machine), read once.
pub(crate) fn settle_timeout() -> Duration {
    static TIMEOUT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *TIMEOUT.get_or_init(|| {
        let value = std::env::var("GPUMEM_NB_SETTLE_SECS").ok();
        parse_settle(value.as_deref()).unwrap_or_else(|why| {
            eprintln!("gpumem-nb: {why}; readings wait 1 s");
            Duration::from_secs(1)
        })
    })
}

/// `GPUMEM_NB_SETTLE_SECS`'s value as a duration (unset: 1 s), or why it is not one.
fn parse_settle(value: Option<&str>) -> Result<Duration, String> {
    let Some(v) = value.map(str::trim) else { return Ok(Duration::from_secs(1)) };
    match v.parse::<f64>() {
        Ok(secs) if secs > 0.0 && secs <= 600.0 => Ok(Duration::from_secs_f64(secs)),
        _ => Err(format!("GPUMEM_NB_SETTLE_SECS={v:?} is not a number of seconds above 0 and at most 600")),
    }
}

/// One watched framework.
struct Watch {
    /// `framework device` (`cubecl cuda:0`): watching the same again replaces it.
    key: String,
    reader: Reader,
    settle: Option<Settler>,
    trim: Option<Trimmer>,
    /// A reading that has not answered yet (no second one is started meanwhile).
    busy: Arc<AtomicBool>,
}

/// A stamped phase not ended yet: each framework's in-use bytes when it began (`None`: it did
/// not answer), and what the phases nested in it changed.
struct Open {
    component: Component,
    start: Vec<(String, Option<u64>)>,
    nested: HashMap<String, i64>,
}

/// The frameworks watched in this process (one per process, in the anchor).
#[derive(Default)]
pub(crate) struct Watched {
    list: Mutex<Vec<Watch>>,
    /// Phases begun and not ended, per thread, innermost last.
    open: Mutex<HashMap<ThreadId, Vec<Open>>>,
    /// Phases ended since the last reading, per framework key: one entry per component.
    ended: Mutex<HashMap<String, Vec<FrameworkPhase>>>,
}

fn watched() -> &'static Watched {
    super::anchor::per_process!("frameworks", Watched, Watched::default)
}

/// Watches a framework from now on: every cell's reading asks `reader` too. `key` names what
/// is watched (`cubecl cuda:0`); a second watch with the same key replaces the first.
pub(crate) fn watch(key: &str, reader: Reader, settle: Option<Settler>) {
    let mut list = crate::sync::lock(&watched().list);
    list.retain(|w| w.key != key);
    list.push(Watch { key: key.to_string(), reader, settle, trim: None, busy: Arc::new(AtomicBool::new(false)) });
}

/// Gives the framework watched as `key` a way to give back its cache (`%gpumem trim`); false
/// when nothing is watched as `key`. (Only cubecl's watches have one: without its features
/// nothing calls this outside the tests.)
#[cfg_attr(not(any(feature = "cubecl", feature = "cubecl010")), allow(dead_code))]
pub(crate) fn set_trim(key: &str, trim: Trimmer) -> bool {
    let mut list = crate::sync::lock(&watched().list);
    list.iter_mut().find(|w| w.key == key).map(|w| w.trim = Some(trim)).is_some()
}

/// Each watched framework that can give back its cache, read (settled) before and after doing
/// so, in its own numbers: reserved (every pool's) before and after, in use after. A trim that
/// fails or does not answer in `timeout` is that framework's error; a reading that fails is too.
pub(crate) fn trim_all(timeout: Duration) -> Vec<Trimmed> {
    let list: Vec<(String, Reader, Trimmer, Arc<AtomicBool>)> = {
        let list = crate::sync::lock(&watched().list);
        list.iter()
            .filter_map(|w| {
                Some((w.key.clone(), Arc::clone(&w.reader), Arc::clone(w.trim.as_ref()?), Arc::clone(&w.busy)))
            })
            .collect()
    };
    if list.is_empty() {
        return Vec::new();
    }
    settle(settle_timeout());
    let reserved = |r: &FrameworkReading| r.pools.iter().map(|p| p.reserved).sum::<u64>();
    list.into_iter()
        .map(|(key, reader, trim, busy)| {
            let before = read_one(&key, Arc::clone(&reader), Arc::clone(&busy));
            let trimmed = match &before.error {
                Some(why) => Err(format!("not trimmed: its reading failed ({why})")),
                None => on_thread("gpumem-trim", timeout, move || trim()).unwrap_or_else(|f| {
                    Err(match f {
                        Failure::NoThread(e) => format!("no thread to run it on ({e})"),
                        Failure::Panicked(why) => format!("it panicked: {why}"),
                        Failure::NoAnswer => format!("no answer in {:.1} s", timeout.as_secs_f64()),
                    })
                }),
            };
            let after = read_one(&key, reader, busy);
            Trimmed {
                owner: before.framework.clone(),
                device: before.device.clone(),
                source: format!("{}; given back by its own cleanup", before.source),
                reserved_before: reserved(&before),
                reserved_after: if after.error.is_none() { reserved(&after) } else { reserved(&before) },
                in_use: after.pools.iter().map(|p| p.in_use).sum(),
                error: trimmed.err().or(after.error),
            }
        })
        .collect()
}

/// Why [`on_thread`] has no result.
enum Failure {
    NoThread(std::io::Error),
    /// The panic's message, its first line.
    Panicked(String),
    NoAnswer,
}

/// `f` on a thread of its own, waited for at most `timeout`: its result, or why there is none.
fn on_thread<T: Send + 'static>(
    name: &str,
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Failure> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
        })
        .map_err(Failure::NoThread)?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(panic)) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Err(Failure::Panicked(why.lines().next().unwrap_or("").to_string()))
        }
        Err(_) => Err(Failure::NoAnswer),
    }
}

/// Whether a framework is watched under a key that starts with `prefix` (`cubecl `).
pub(crate) fn watching(prefix: &str) -> bool {
    crate::sync::lock(&watched().list).iter().any(|w| w.key.starts_with(prefix))
}

/// The kind of a framework's one pool entry when it reports totals only (cubecl 0.10). (Without
/// the features that read cubecl nothing uses it.)
#[cfg_attr(not(any(feature = "cuda", feature = "cubecl010")), allow(dead_code))]
pub(crate) const TOTALS: &str = "all pools";

/// A reading of a framework that reports totals only: one pool entry of kind [`TOTALS`], or,
/// when its reader failed, the error's first line and no pools.
#[cfg_attr(not(any(feature = "cuda", feature = "cubecl010")), allow(dead_code))]
pub(crate) fn totals(
    framework: &str,
    device: &str,
    source: &str,
    read: Result<FrameworkPool, String>,
) -> FrameworkReading {
    let (pools, error) = match read {
        Ok(totals) => (vec![FrameworkPool { kind: TOTALS.into(), ..totals }], None),
        Err(e) => (Vec::new(), Some(e.lines().next().unwrap_or("").to_string())),
    };
    FrameworkReading {
        framework: framework.into(),
        device: device.into(),
        source: source.into(),
        error,
        pools,
        ..Default::default()
    }
}

/// Stops watching what `key` names; false when it was not watched.
pub(crate) fn unwatch(key: &str) -> bool {
    let mut list = crate::sync::lock(&watched().list);
    let n = list.len();
    list.retain(|w| w.key != key);
    crate::sync::lock(&watched().ended).remove(key);
    list.len() != n
}

/// Settles every watched framework (each on a thread of its own, all against one `deadline`,
/// so that N frameworks cost at most `deadline`): what did not answer in time, or failed, with
/// why. A framework without a settle step counts as settled.
pub(crate) fn settle(deadline: Duration) -> Vec<Settled> {
    let list: Vec<(String, Settler, Arc<AtomicBool>)> = {
        let list = crate::sync::lock(&watched().list);
        list.iter().filter_map(|w| Some((w.key.clone(), Arc::clone(w.settle.as_ref()?), Arc::clone(&w.busy)))).collect()
    };
    let end = std::time::Instant::now() + deadline;
    let mut waiting = Vec::new();
    let mut out = Vec::new();
    for (key, settle, busy) in list {
        if busy.swap(true, Ordering::SeqCst) {
            out.push(Settled { key, waited_us: 0, error: Some("its previous reading has not answered yet".into()) });
            continue;
        }
        let (tx, rx) = mpsc::channel();
        let flag = Arc::clone(&busy);
        let t = std::time::Instant::now();
        let spawned = std::thread::Builder::new().name("gpumem-settle".into()).spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| settle()));
            flag.store(false, Ordering::SeqCst);
            let _ = tx.send(r);
        });
        match spawned {
            Ok(_) => waiting.push((key, rx, t)),
            Err(e) => {
                busy.store(false, Ordering::SeqCst);
                out.push(Settled { key, waited_us: 0, error: Some(format!("no thread to settle it on ({e})")) });
            }
        }
    }
    for (key, rx, t) in waiting {
        let left = end.saturating_duration_since(std::time::Instant::now());
        let error = match rx.recv_timeout(left) {
            Ok(Ok(Ok(()))) => None,
            Ok(Ok(Err(why))) => Some(why),
            Ok(Err(_)) => Some("its settle step panicked".into()),
            Err(_) => Some(format!("no answer in {:.1} s: read as it is", deadline.as_secs_f64())),
        };
        out.push(Settled { key, waited_us: t.elapsed().as_micros() as u64, error });
    }
    out
}

/// Every watched framework's numbers now, in the order they were watched, each with the
/// stamped phases that ended since the previous reading; `None` when nothing is watched (the
/// reply then has no `frameworks` field at all).
pub(crate) fn readings() -> Option<Vec<FrameworkReading>> {
    let read = read_all()?;
    let mut ended = crate::sync::lock(&watched().ended);
    Some(
        read.into_iter()
            .map(|(key, mut r)| {
                r.phases = ended.remove(&key).unwrap_or_default();
                r
            })
            .collect(),
    )
}

/// Every watched framework's reading, with its key; `None` when nothing is watched.
fn read_all() -> Option<Vec<(String, FrameworkReading)>> {
    let list: Vec<(String, Reader, Arc<AtomicBool>)> = {
        let list = crate::sync::lock(&watched().list);
        list.iter().map(|w| (w.key.clone(), Arc::clone(&w.reader), Arc::clone(&w.busy))).collect()
    };
    if list.is_empty() {
        return None;
    }
    Some(list.into_iter().map(|(key, reader, busy)| (key.clone(), read_one(&key, reader, busy))).collect())
}

/// Each watched framework's bytes in use now, settled first; `None` for one that did not
/// answer (a phase has no change for it then, and says so).
fn in_use_now() -> Vec<(String, Option<u64>)> {
    settle(settle_timeout());
    read_all()
        .unwrap_or_default()
        .into_iter()
        .map(|(key, r)| {
            let in_use = r.error.is_none().then(|| r.pools.iter().map(|p| p.in_use).sum());
            (key, in_use)
        })
        .collect()
}

/// Begins a stamped phase of `component` on this thread when a framework is watched: reads
/// each one's in-use bytes. False (and nothing read) when none is.
pub(crate) fn phase_begin(component: Component) -> bool {
    if crate::sync::lock(&watched().list).is_empty() {
        return false;
    }
    let start = in_use_now();
    let open = Open { component, start, nested: HashMap::new() };
    crate::sync::lock(&watched().open).entry(std::thread::current().id()).or_default().push(open);
    true
}

/// Ends this thread's innermost phase: reads the frameworks again and keeps, per framework, the
/// change less what its nested phases changed, for the next reading; the whole change counts
/// as nested in the phase around it. A framework not read at either end has no change for
/// this stamp (it is counted as `unread`), and what its nested stamps changed is passed up
/// instead, so that no byte counts twice.
pub(crate) fn phase_end() {
    let id = std::thread::current().id();
    let Some(open) = ({
        let mut map = crate::sync::lock(&watched().open);
        let v = map.get_mut(&id);
        let top = v.and_then(|v| v.pop());
        if map.get(&id).is_some_and(|v| v.is_empty()) {
            map.remove(&id);
        }
        top
    }) else {
        return;
    };
    let now = in_use_now();
    // Per framework watched at the beginning: the change, or `None` when one end was not read.
    let changes: Vec<(String, Option<i64>)> = open
        .start
        .iter()
        .map(|(key, before)| {
            let after = now.iter().find(|(k, _)| k == key).and_then(|(_, a)| *a);
            (key.clone(), before.zip(after).map(|(b, a)| a as i64 - b as i64))
        })
        .collect();
    let nested = |key: &str| open.nested.get(key).copied().unwrap_or(0);
    if let Some(parent) = crate::sync::lock(&watched().open).get_mut(&id).and_then(|v| v.last_mut()) {
        for (key, change) in &changes {
            *parent.nested.entry(key.clone()).or_default() += change.unwrap_or_else(|| nested(key));
        }
    }
    let mut ended = crate::sync::lock(&watched().ended);
    for (key, change) in changes {
        let own = change.map(|c| c - nested(&key));
        let list = ended.entry(key).or_default();
        let p = match list.iter().position(|p| p.component == open.component) {
            Some(i) => &mut list[i],
            None => {
                list.push(FrameworkPhase { component: open.component, phases: 0, change: 0, unread: 0 });
                list.last_mut().expect("just pushed")
            }
        };
        match own {
            Some(own) => {
                p.phases += 1;
                p.change += own;
            }
            None => p.unread += 1,
        }
    }
}

/// One reader's answer, or an error reading that names the key and what went wrong.
fn read_one(key: &str, reader: Reader, busy: Arc<AtomicBool>) -> FrameworkReading {
    let failed = |why: String| {
        let (framework, device) = key.split_once(' ').unwrap_or((key, ""));
        FrameworkReading {
            framework: framework.to_string(),
            device: device.to_string(),
            error: Some(why),
            ..Default::default()
        }
    };
    if busy.swap(true, Ordering::SeqCst) {
        return failed("its previous reading has not answered yet".into());
    }
    /// Marks the reading answered when the reader returns or panics (or never runs).
    struct Answered(Arc<AtomicBool>);
    impl Drop for Answered {
        fn drop(&mut self) {
            self.0.store(false, Ordering::SeqCst);
        }
    }
    let answered = Answered(Arc::clone(&busy));
    match on_thread("gpumem-framework", READ_TIMEOUT, move || {
        let _answered = answered;
        reader()
    }) {
        Ok(reading) => reading,
        // The closure, and with it `answered`, was dropped: the flag is down again.
        Err(Failure::NoThread(e)) => failed(format!("no thread to read it on ({e})")),
        Err(Failure::Panicked(why)) => failed(format!("its reader panicked: {why}")),
        Err(Failure::NoAnswer) => failed(format!("no answer in {} s", READ_TIMEOUT.as_secs())),
    }
}

/// The watched list is the process's: tests that watch frameworks or stamp (a stamp reads every
/// watched framework) take turns.
#[cfg(test)]
pub(crate) static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notebook::protocol::FrameworkPool;

    /// The settle time: 1 s unset, seconds as given, and a clear reason for a value that is not
    /// a duration a reading can wait.
    #[test]
    fn settle_time_is_one_second_or_what_the_variable_says() {
        assert_eq!(parse_settle(None), Ok(Duration::from_secs(1)));
        assert_eq!(parse_settle(Some(" 5 ")), Ok(Duration::from_secs(5)));
        assert_eq!(parse_settle(Some("0.25")), Ok(Duration::from_millis(250)));
        for bad in ["", "0", "-1", "601", "ten", "NaN", "inf"] {
            let why = parse_settle(Some(bad)).unwrap_err();
            assert!(why.starts_with("GPUMEM_NB_SETTLE_SECS=") && why.contains("at most 600"), "{why}");
        }
    }

    fn reading(in_use: u64) -> FrameworkReading {
        FrameworkReading {
            framework: "test".into(),
            device: "sim:9".into(),
            pools: vec![FrameworkPool { kind: "sliced".into(), in_use, reserved: 4 << 20, ..Default::default() }],
            ..Default::default()
        }
    }

    /// `%gpumem trim` of watched frameworks: one whose cleanup gives pages back is read before
    /// and after in its own numbers; one whose cleanup fails says why, its figures untouched;
    /// one with no cleanup is not in the list.
    #[test]
    fn a_watched_framework_s_cleanup_is_its_trim() {
        use std::sync::atomic::AtomicU64;
        let _one = crate::sync::lock(&ONE_AT_A_TIME);
        let reserved = Arc::new(AtomicU64::new(96 << 20));
        let r = Arc::clone(&reserved);
        let at = |r: &AtomicU64| FrameworkReading {
            framework: "test".into(),
            device: "sim:7".into(),
            pools: vec![FrameworkPool {
                kind: "sliced".into(),
                in_use: 8 << 20,
                reserved: r.load(Ordering::SeqCst),
                ..Default::default()
            }],
            ..Default::default()
        };
        watch("test sim:7", Arc::new(move || at(&r)), None);
        watch("test sim:8", Arc::new(|| reading(1)), None);
        watch("test sim:9", Arc::new(|| reading(2)), None);
        assert!(!set_trim("test sim:6", Arc::new(|| Ok(()))), "nothing watched as that key");
        let r = Arc::clone(&reserved);
        let cleanup = move || {
            r.store(8 << 20, Ordering::SeqCst);
            Ok(())
        };
        assert!(set_trim("test sim:7", Arc::new(cleanup)));
        assert!(set_trim("test sim:8", Arc::new(|| Err("the server is gone".into()))));
        let t = trim_all(Duration::from_secs(5));
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!(
            (t[0].device.as_str(), t[0].reserved_before, t[0].reserved_after, t[0].in_use),
            ("sim:7", 96 << 20, 8 << 20, 8 << 20)
        );
        assert_eq!((t[0].given_back(), &t[0].error), (88 << 20, &None));
        assert_eq!(
            (t[1].device.as_str(), t[1].given_back(), t[1].error.as_deref()),
            ("sim:9", 0, Some("the server is gone"))
        );
        for key in ["test sim:7", "test sim:8", "test sim:9"] {
            unwatch(key);
        }
    }

    /// Stamps as phases: a framework's in-use change from a stamp's beginning to its end goes to
    /// its component, a nested stamp's to its own and not to the outer one's, stamps of one
    /// component add up, and the next reading takes them (the one after has none).
    #[test]
    fn a_stamp_is_a_phase_of_each_watched_framework() {
        let _one = crate::sync::lock(&ONE_AT_A_TIME);
        use std::sync::atomic::AtomicU64;
        let in_use = Arc::new(AtomicU64::new(100));
        // A reader that fails (panics) while `fail` is set: a framework that does not answer.
        let fail = Arc::new(AtomicBool::new(false));
        let (r, f) = (Arc::clone(&in_use), Arc::clone(&fail));
        let key = "test phases";
        let read = move || {
            assert!(!f.load(Ordering::SeqCst), "not now");
            FrameworkReading { device: "phases".into(), ..reading(r.load(Ordering::SeqCst)) }
        };
        watch(key, Arc::new(read), None);
        let add = |n: i64| in_use.fetch_add(n as u64, Ordering::SeqCst);
        assert!(phase_begin(Component::Parameter));
        add(24);
        assert!(phase_begin(Component::OptimizerState));
        add(48);
        phase_end();
        add(-4);
        phase_end();
        assert!(phase_begin(Component::OptimizerState));
        add(8);
        phase_end();
        let mine = |all: Vec<FrameworkReading>| all.into_iter().find(|r| r.device == "phases").unwrap().phases;
        let phases = mine(readings().unwrap());
        let p = |component, phases: u64, change: i64| FrameworkPhase { component, phases, change, unread: 0 };
        assert_eq!(phases, vec![p(Component::OptimizerState, 2, 56), p(Component::Parameter, 1, 20)]);
        assert!(mine(readings().unwrap()).is_empty(), "taken by the reading before");
        // A framework not read at the end of the middle stamp: that stamp is `unread`, and what
        // its nested stamp changed still does not count for the outer one.
        assert!(phase_begin(Component::Other));
        add(1);
        assert!(phase_begin(Component::Activation));
        add(10);
        assert!(phase_begin(Component::Temp));
        add(100);
        phase_end();
        fail.store(true, Ordering::SeqCst);
        phase_end();
        fail.store(false, Ordering::SeqCst);
        phase_end();
        let got = mine(readings().unwrap());
        let unread = FrameworkPhase { unread: 1, ..p(Component::Activation, 0, 0) };
        assert_eq!(
            got,
            vec![p(Component::Temp, 1, 100), unread, p(Component::Other, 1, 11)],
            "the 10 of the unread stamp go to the outer one"
        );
        // A phase ended with nothing open is nothing; unwatching drops what no reading took.
        phase_end();
        assert!(unwatch(key));
        assert!(!crate::sync::lock(&watched().ended).contains_key(key));
    }

    /// Watching, replacing by key, a reader that panics and one that hangs: each is its own
    /// reading, the others still answer, and nothing is left watched afterwards.
    #[test]
    fn readers_answer_fail_alone_and_are_replaced_by_key() {
        let _one = crate::sync::lock(&ONE_AT_A_TIME);
        watch("test sim:9", Arc::new(|| reading(1)), None);
        watch("test sim:9", Arc::new(|| reading(2)), None);
        watch("test panics", Arc::new(|| panic!("server gone\nsecond line")), None);
        let (tx, rx) = mpsc::channel::<()>();
        let rx = Mutex::new(rx);
        watch(
            "test hangs",
            Arc::new(move || {
                let _ = rx.lock().unwrap().recv();
                reading(3)
            }),
            None,
        );
        let r = readings().unwrap();
        let mine: Vec<&FrameworkReading> = r.iter().filter(|r| r.framework == "test").collect();
        assert_eq!(mine.len(), 3, "{r:?}");
        assert_eq!(mine[0].pools[0].in_use, 2, "the second watch replaced the first");
        assert_eq!(mine[1].error.as_deref(), Some("its reader panicked: server gone"));
        // The list is the process's: another test of this binary reading every framework at the
        // same moment may have asked the hanging reader first, and then this is its second ask.
        let hang = mine[2].error.as_deref();
        assert!(matches!(hang, Some("no answer in 2 s" | "its previous reading has not answered yet")), "{hang:?}");
        assert_eq!(mine[2].device, "hangs");
        // Still busy: no second thread is started for it.
        let again = readings().unwrap();
        let hung = again.iter().find(|r| r.device == "hangs").unwrap();
        assert_eq!(hung.error.as_deref(), Some("its previous reading has not answered yet"));
        tx.send(()).unwrap();
        for key in ["test sim:9", "test panics", "test hangs"] {
            assert!(unwatch(key), "{key}");
        }
        assert!(!unwatch("test sim:9"));
        assert!(!crate::sync::lock(&watched().list).iter().any(|w| w.key.starts_with("test ")));
    }
}
