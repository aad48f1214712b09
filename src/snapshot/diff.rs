//! Two memory states compared allocation by allocation: what appeared, disappeared, grew or
//! shrank between them, grouped by owner (the code that made the allocation: the first frame
//! of its stack) and label (the notebook cell it was made in). PyTorch's `_memory_viz compare`
//! diffs whole segments; this pairs allocations.
//!
//! A state is a list of [`LiveAlloc`]s: a snapshot's allocated blocks ([`live`]), or what a
//! snapshot's recorded history says was live at an earlier moment ([`live_at`]: the trace is
//! walked back from the snapshot, so it needs every event since that moment). Labels and stacks
//! come from the recorded history (record with stacks to have owners); without it every
//! allocation is still compared, under "unknown" owners.
//!
//! Pairing is by device and address: the same address holding the same owner and label in both
//! states is one allocation (unchanged, grown or shrunk); a different owner or label there is a
//! new allocation in a reused address (one disappeared, one appeared). Sizes are the bytes the
//! caller asked for (the trace's sizes; blocks round them up).

use super::Snapshot;
use super::model::{Segment, TraceSnap};
use crate::record::frames::Frame;
use std::collections::{BTreeMap, HashMap};

/// One allocation live in a state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveAlloc {
    /// Device index.
    pub device: i32,
    /// Address.
    pub address: u64,
    /// Bytes asked for.
    pub size: u64,
    /// The label it was made under ("cell 3", "cell 3 · driver"), "" when unknown.
    pub label: String,
    /// Who made it: its stack's first frame (`name (file:line)`), or why that is unknown.
    pub owner: String,
}

/// How one allocation changed from the first state to the second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Change {
    /// Only in the second state.
    Appeared,
    /// Only in the first.
    Disappeared,
    /// In both, larger in the second.
    Grew,
    /// In both, smaller in the second.
    Shrank,
}

impl Change {
    /// The word reports use.
    pub fn name(self) -> &'static str {
        match self {
            Change::Appeared => "appeared",
            Change::Disappeared => "disappeared",
            Change::Grew => "grew",
            Change::Shrank => "shrank",
        }
    }
}

/// One allocation that changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocChange {
    /// What happened to it.
    pub change: Change,
    /// Device index.
    pub device: i32,
    /// Address.
    pub address: u64,
    /// Bytes in the first state (0 when it appeared).
    pub before: u64,
    /// Bytes in the second state (0 when it disappeared).
    pub after: u64,
    /// Its label.
    pub label: String,
    /// Its owner.
    pub owner: String,
}

impl AllocChange {
    /// after − before.
    pub fn delta(&self) -> i64 {
        self.after as i64 - self.before as i64
    }
}

/// A count of allocations and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Count {
    /// Allocations.
    pub n: u64,
    /// Bytes (for grew and shrank: the change).
    pub bytes: u64,
}

impl Count {
    fn add(&mut self, bytes: u64) {
        self.n += 1;
        self.bytes += bytes;
    }
}

/// The changes of one owner under one label.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupDiff {
    /// The label ("" when unknown).
    pub label: String,
    /// The owner.
    pub owner: String,
    /// Allocations that appeared.
    pub appeared: Count,
    /// Allocations that disappeared.
    pub disappeared: Count,
    /// Allocations that grew (bytes: by how much).
    pub grew: Count,
    /// Allocations that shrank (bytes: by how much).
    pub shrank: Count,
}

impl GroupDiff {
    /// The group's change in bytes.
    pub fn net(&self) -> i64 {
        (self.appeared.bytes + self.grew.bytes) as i64 - (self.disappeared.bytes + self.shrank.bytes) as i64
    }
}

/// Two states compared; shown in a notebook as text and an HTML table (`evcxr_display`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotDiff {
    /// What the first state is ("A", "after cell 3", a path).
    pub a: String,
    /// What the second state is.
    pub b: String,
    /// Allocations and bytes live in the first state.
    pub total_a: Count,
    /// In the second.
    pub total_b: Count,
    /// Allocations in both, unchanged.
    pub unchanged: Count,
    /// Per label and owner, the largest net change first.
    pub groups: Vec<GroupDiff>,
    /// Every allocation that changed, the largest change first.
    pub changes: Vec<AllocChange>,
}

/// Compares two snapshots' allocated blocks.
pub fn diff(a: &Snapshot, b: &Snapshot) -> SnapshotDiff {
    SnapshotDiff::between("A", &live(a), "B", &live(b))
}

impl SnapshotDiff {
    /// Compares two states, named `a_name` and `b_name`.
    pub fn between(a_name: &str, a: &[LiveAlloc], b_name: &str, b: &[LiveAlloc]) -> SnapshotDiff {
        let total = |v: &[LiveAlloc]| Count { n: v.len() as u64, bytes: v.iter().map(|x| x.size).sum() };
        let mut d = SnapshotDiff {
            a: a_name.to_string(),
            b: b_name.to_string(),
            total_a: total(a),
            total_b: total(b),
            ..Default::default()
        };
        let key = |x: &LiveAlloc| (x.device, x.address);
        let in_b: HashMap<(i32, u64), &LiveAlloc> = b.iter().map(|x| (key(x), x)).collect();
        let in_a: HashMap<(i32, u64), &LiveAlloc> = a.iter().map(|x| (key(x), x)).collect();
        let change = |change, x: &LiveAlloc, before, after| AllocChange {
            change,
            device: x.device,
            address: x.address,
            before,
            after,
            label: x.label.clone(),
            owner: x.owner.clone(),
        };
        for x in a {
            match in_b.get(&key(x)) {
                Some(y) if y.label == x.label && y.owner == x.owner => {
                    if y.size == x.size {
                        d.unchanged.add(x.size);
                    } else {
                        let c = if y.size > x.size { Change::Grew } else { Change::Shrank };
                        d.changes.push(change(c, x, x.size, y.size));
                    }
                }
                Some(y) => {
                    d.changes.push(change(Change::Disappeared, x, x.size, 0));
                    d.changes.push(change(Change::Appeared, y, 0, y.size));
                }
                None => d.changes.push(change(Change::Disappeared, x, x.size, 0)),
            }
        }
        d.changes
            .extend(b.iter().filter(|y| !in_a.contains_key(&key(y))).map(|y| change(Change::Appeared, y, 0, y.size)));
        d.changes.sort_by(|x, y| {
            y.delta()
                .abs()
                .cmp(&x.delta().abs())
                .then((x.device, x.address, x.change).cmp(&(y.device, y.address, y.change)))
        });
        let mut groups: BTreeMap<(String, String), GroupDiff> = BTreeMap::new();
        for c in &d.changes {
            let g = groups.entry((c.label.clone(), c.owner.clone())).or_insert_with(|| GroupDiff {
                label: c.label.clone(),
                owner: c.owner.clone(),
                ..Default::default()
            });
            match c.change {
                Change::Appeared => g.appeared.add(c.after),
                Change::Disappeared => g.disappeared.add(c.before),
                Change::Grew => g.grew.add(c.after - c.before),
                Change::Shrank => g.shrank.add(c.before - c.after),
            }
        }
        d.groups = groups.into_values().collect();
        d.groups
            .sort_by(|x, y| y.net().abs().cmp(&x.net().abs()).then((&x.label, &x.owner).cmp(&(&y.label, &y.owner))));
        d
    }

    /// Bytes live in the second state minus the first.
    pub fn net(&self) -> i64 {
        self.total_b.bytes as i64 - self.total_a.bytes as i64
    }

    /// The changed allocations of one kind: their count and bytes (for grew and shrank: the
    /// change).
    pub fn count(&self, change: Change) -> Count {
        let mut c = Count::default();
        for x in self.changes.iter().filter(|x| x.change == change) {
            c.add(x.delta().unsigned_abs());
        }
        c
    }
}

/// Who made an allocation, from its stack: the first frame (gpumem-nb's own frames are already
/// left out of recorded stacks).
fn owner(frames: &[Frame]) -> String {
    // A notebook's stack (its cell frames named `cell N` with their line): the site, as reports
    // name it (`candle_core::tensor::Tensor::zeros ← cell 5:3`, `cell 5:3`).
    if let (Some(first), Some(cell)) = (frames.first(), frames.iter().find(|f| f.filename.starts_with("cell "))) {
        let at = format!("{}:{}", cell.filename, cell.line);
        return if std::ptr::eq(first, cell) && first.is_anonymous() { at } else { format!("{} ← {at}", first.name) };
    }
    match frames.first() {
        Some(f) => {
            let file = f.filename.rsplit('/').next().unwrap_or(&f.filename);
            match (file, f.line) {
                // No debug information (an evcxr cell's code, a stripped library): the name.
                ("" | "??", _) => f.name.clone(),
                (file, 0) => format!("{} ({file})", f.name),
                (file, line) => format!("{} ({file}:{line})", f.name),
            }
        }
        None => "unknown (no stack recorded)".into(),
    }
}

/// Per device, the trace's `alloc` events by address: the latest one before each event index.
fn last_allocs(trace: &[TraceSnap]) -> Vec<Option<usize>> {
    let mut latest: HashMap<u64, usize> = HashMap::new();
    let mut out = Vec::with_capacity(trace.len());
    for (i, e) in trace.iter().enumerate() {
        out.push(e.addr.and_then(|a| latest.get(&a).copied()));
        if e.action == "alloc"
            && let Some(a) = e.addr
        {
            latest.insert(a, i);
        }
    }
    out
}

/// The label and owner an `alloc` event gives its allocation.
fn from_alloc_event(e: &TraceSnap) -> (String, String) {
    (e.user_metadata.clone(), e.frames.as_deref().map_or_else(|| owner(&[]), owner))
}

/// A snapshot's allocated blocks (blocks freed but waiting on a stream are not counted: their
/// owner let go of them), labelled from the trace's latest `alloc` at each address.
pub fn live(snap: &Snapshot) -> Vec<LiveAlloc> {
    let mut labels: HashMap<(i32, u64), String> = HashMap::new();
    for (d, trace) in snap.device_traces.iter().enumerate() {
        for e in trace.iter().filter(|e| e.action == "alloc") {
            if let Some(a) = e.addr {
                labels.insert((d as i32, a), e.user_metadata.clone());
            }
        }
    }
    let block_owner = |s: &Segment, frames: &[Frame]| {
        // A segment of one block is an allocation made past the caching allocator (tracking
        // adds those): its stack is the segment's.
        if frames.is_empty() && s.blocks.len() == 1 { owner(&s.frames) } else { owner(frames) }
    };
    let labels = &labels;
    snap.segments
        .iter()
        .flat_map(|s| {
            s.blocks.iter().filter(|b| b.state == "active_allocated").map(move |b| LiveAlloc {
                device: s.device,
                address: b.address,
                size: b.requested_size,
                label: labels.get(&(s.device, b.address)).cloned().unwrap_or_default(),
                owner: block_owner(s, &b.frames),
            })
        })
        .collect()
}

/// What was live at `time_us` (µs since the Unix epoch, the trace's clock), from the snapshot
/// and its recorded history: the snapshot's allocations, with every allocation made after
/// `time_us` taken out and every one freed after it put back (its label and owner from its
/// `alloc` event, when the trace still holds it). An error when the trace does not fit the
/// state (it misses events since `time_us`: recording started later, or its ring dropped
/// them), or when there is no trace.
pub fn live_at(snap: &Snapshot, time_us: i64) -> Result<Vec<LiveAlloc>, super::ReadError> {
    if snap.device_traces.iter().all(Vec::is_empty) {
        return Err(super::ReadError::NoHistory(
            "the snapshot has no recorded history (record it: `%gpumem record on`)".into(),
        ));
    }
    let mut state: BTreeMap<(i32, u64), LiveAlloc> =
        live(snap).into_iter().map(|x| ((x.device, x.address), x)).collect();
    let missing = |what: &str, e: &TraceSnap| {
        super::ReadError::NoHistory(format!(
            "the recorded history misses events since then ({what} at {:#x}, {} B, {}): record from before that moment, \
             with a ring large enough",
            e.addr.unwrap_or(0),
            e.size,
            crate::units::format_utc(e.time_us)
        ))
    };
    for (d, trace) in snap.device_traces.iter().enumerate() {
        let device = d as i32;
        let allocs = last_allocs(trace);
        for (i, e) in trace.iter().enumerate().rev().take_while(|(_, e)| e.time_us > time_us) {
            let Some(addr) = e.addr else { continue };
            match e.action {
                "alloc" if state.remove(&(device, addr)).is_none() => {
                    return Err(missing("an allocation not live in the snapshot", e));
                }
                "free_requested" => {
                    let (label, owner) = match allocs[i] {
                        Some(j) => from_alloc_event(&trace[j]),
                        None => (String::new(), "unknown (allocated before the recorded history)".into()),
                    };
                    let size = allocs[i].map_or(e.size, |j| trace[j].size);
                    let x = LiveAlloc { device, address: addr, size, label, owner };
                    if state.insert((device, addr), x).is_some() {
                        return Err(missing("a free of an address live again in the snapshot", e));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(state.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str) -> Frame {
        Frame { name: name.into(), filename: "/src/lib.rs".into(), line: 3 }
    }

    fn x(address: u64, size: u64, label: &str, owner: &str) -> LiveAlloc {
        LiveAlloc { device: 0, address, size, label: label.into(), owner: owner.into() }
    }

    #[test]
    fn allocations_pair_by_address_owner_and_label() {
        let a = [
            x(0x100, 10, "cell 1", "f"),
            x(0x200, 20, "cell 1", "g"),
            x(0x300, 30, "cell 2", "f"),
            x(0x400, 5, "", "h"),
        ];
        let b = [
            x(0x100, 10, "cell 1", "f"),
            x(0x200, 50, "cell 1", "g"),
            x(0x300, 7, "cell 3", "k"),
            x(0x500, 64, "cell 3", "k"),
        ];
        let d = SnapshotDiff::between("A", &a, "B", &b);
        assert_eq!(d.unchanged, Count { n: 1, bytes: 10 });
        assert_eq!((d.total_a.bytes, d.total_b.bytes, d.net()), (65, 131, 66));
        assert_eq!(d.count(Change::Grew), Count { n: 1, bytes: 30 });
        assert_eq!(d.count(Change::Appeared), Count { n: 2, bytes: 71 }, "a reused address is a new allocation");
        assert_eq!(d.count(Change::Disappeared), Count { n: 2, bytes: 35 });
        assert_eq!(d.changes[0].change, Change::Appeared, "largest change first: {:?}", d.changes);
        assert_eq!(d.changes[0].address, 0x500);
        let k = &d.groups[0];
        assert_eq!(
            (k.label.as_str(), k.owner.as_str(), k.appeared, k.net()),
            ("cell 3", "k", Count { n: 2, bytes: 71 }, 71)
        );
        assert_eq!(d.groups.iter().map(GroupDiff::net).sum::<i64>(), d.net(), "the groups add up");
        let empty = SnapshotDiff::between("A", &[], "B", &[]);
        assert!(empty.changes.is_empty() && empty.groups.is_empty());
    }

    fn event(action: &'static str, addr: u64, size: u64, time_us: i64, label: &str, by: &str) -> TraceSnap {
        TraceSnap {
            action,
            addr: Some(addr),
            device_free: None,
            size,
            stream: 0,
            time_us,
            compile_context: "N/A",
            user_metadata: label.into(),
            frames: Some(vec![frame(by)]),
        }
    }

    /// The states before and after events are rebuilt from the end state and its trace.
    #[test]
    fn earlier_states_come_back_from_the_trace() {
        use super::super::model::BlockSnap;
        let block = |address, size, state| BlockSnap { address, size, requested_size: size, state, frames: vec![] };
        let mut snap = crate::allocator::CachingAllocator::new(
            crate::device::sim::SimBackend::new(0, 1 << 30),
            crate::policy::config::AllocatorConfig::default(),
        )
        .snapshot();
        snap.segments = vec![Segment {
            device: 0,
            address: 0x1000,
            total_size: 4096,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: 0,
            segment_type: "large",
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: vec![],
            blocks: vec![
                block(0x1000, 512, "active_allocated"),
                block(0x1200, 512, "inactive"),
                block(0x1400, 1024, "active_allocated"),
            ],
        }];
        // t=10: 0x1000 by f (cell 1); t=20: 0x1200 by g (cell 2); t=30: 0x1200 freed (cell 3);
        // t=40: 0x1400 by h (cell 3).
        snap.device_traces = vec![vec![
            event("alloc", 0x1000, 512, 10, "cell 1", "f"),
            event("alloc", 0x1200, 512, 20, "cell 2", "g"),
            event("free_requested", 0x1200, 512, 30, "cell 3", "drop"),
            event("free_completed", 0x1200, 512, 30, "cell 3", "drop"),
            event("alloc", 0x1400, 1024, 40, "cell 3", "h"),
        ]];
        let now = live(&snap);
        assert_eq!(now.iter().map(|x| x.address).collect::<Vec<_>>(), vec![0x1000, 0x1400]);
        assert_eq!((now[1].label.as_str(), now[1].owner.as_str()), ("cell 3", "unknown (no stack recorded)"));
        let after2 = live_at(&snap, 25).unwrap();
        assert_eq!(after2.iter().map(|x| (x.address, x.size)).collect::<Vec<_>>(), vec![(0x1000, 512), (0x1200, 512)]);
        assert_eq!((after2[1].label.as_str(), after2[1].owner.as_str()), ("cell 2", "g (lib.rs:3)"));
        assert_eq!(live_at(&snap, 45).unwrap(), now);
        let d = SnapshotDiff::between("after cell 2", &after2, "after cell 3", &now);
        assert_eq!(d.count(Change::Disappeared), Count { n: 1, bytes: 512 });
        assert_eq!(d.count(Change::Appeared), Count { n: 1, bytes: 1024 });
        assert_eq!(d.unchanged.n, 1);
        // Before the trace's first event the state is not known: 0x1000 was live at t=5 by the
        // trace, yet allocated at t=10.
        snap.device_traces[0].remove(0);
        assert!(live_at(&snap, 5).is_ok(), "nothing contradicts it");
        snap.device_traces[0].insert(0, event("alloc", 0x1800, 8, 9, "", "x"));
        let err = live_at(&snap, 5).unwrap_err().to_string();
        assert!(err.contains("misses events"), "{err}");
        snap.device_traces.clear();
        assert!(live_at(&snap, 5).unwrap_err().to_string().contains("no recorded history"));
    }

    #[test]
    fn snapshots_read_back_from_json_compare() {
        let alloc = crate::allocator::CachingAllocator::new(
            crate::device::sim::SimBackend::new(0, 1 << 30),
            crate::policy::config::AllocatorConfig::default(),
        );
        alloc.record_memory_history(crate::record::history::RecordMode::All, 1000);
        alloc.set_label(Some("cell 1"));
        let keep = alloc.malloc(1 << 20, crate::device::StreamId::DEFAULT).unwrap();
        let temp = alloc.malloc(2 << 20, crate::device::StreamId::DEFAULT).unwrap();
        let a = super::super::json::from_str(&super::super::json::to_string(&alloc.snapshot())).unwrap();
        alloc.free(temp.block.unwrap()).unwrap();
        alloc.set_label(Some("cell 2"));
        let _more = alloc.malloc(3 << 20, crate::device::StreamId::DEFAULT).unwrap();
        let b = alloc.snapshot();
        let d = diff(&a, &b);
        assert_eq!(d.count(Change::Disappeared), Count { n: 1, bytes: 2 << 20 }, "{d:?}");
        assert_eq!(d.count(Change::Appeared), Count { n: 1, bytes: 3 << 20 });
        assert_eq!(d.unchanged, Count { n: 1, bytes: 1 << 20 });
        assert!(d.groups.iter().any(|g| g.label == "cell 2" && g.appeared.bytes == 3 << 20), "{:?}", d.groups);
        let _ = keep;
        assert!(super::super::json::from_str("{}").unwrap_err().to_string().contains("no `segments`"));
    }
}
