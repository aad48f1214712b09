//! Allocator history: PyTorch's trace vocabulary and a bounded ring of entries.
//!
//! Recording is opt-in ([`RecordMode`]). `State` keeps only the last entry (PyTorch forces a
//! one-entry ring for `enabled="state"`); `All` keeps up to `max_entries`, oldest dropped first.
#![forbid(unsafe_code)]

use crate::device::StreamId;
use crate::record::frames::Frames;
use std::collections::VecDeque;

/// One allocator event kind, with PyTorch's action names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceAction {
    /// A block handed out (`size` = unrounded request).
    Alloc,
    /// The user freed a block (`size` = its requested size).
    FreeRequested,
    /// The block returned to the pool (after any stream events).
    FreeCompleted,
    /// A new segment from the device (`size` = segment size).
    SegmentAlloc,
    /// A segment returned to the device.
    SegmentFree,
    /// Pages mapped into an expandable segment.
    SegmentMap,
    /// Pages unmapped from an expandable segment.
    SegmentUnmap,
    /// A snapshot was taken (`size` = active bytes).
    Snapshot,
    /// An out-of-memory error (`addr` holds the device's free bytes; `size` the rounded request).
    Oom,
}

impl TraceAction {
    /// PyTorch's string for the action.
    pub fn name(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Snapshot => "snapshot",
            TraceAction::Oom => "oom",
        }
    }
    /// Parses PyTorch's action name.
    pub fn from_name(s: &str) -> Option<Self> {
        Some(match s {
            "alloc" => TraceAction::Alloc,
            "free_requested" => TraceAction::FreeRequested,
            "free_completed" => TraceAction::FreeCompleted,
            "segment_alloc" => TraceAction::SegmentAlloc,
            "segment_free" => TraceAction::SegmentFree,
            "segment_map" => TraceAction::SegmentMap,
            "segment_unmap" => TraceAction::SegmentUnmap,
            "snapshot" => TraceAction::Snapshot,
            "oom" => TraceAction::Oom,
            _ => return None,
        })
    }
    /// Whether the action is a segment-level (device) event.
    pub fn is_segment(self) -> bool {
        matches!(
            self,
            TraceAction::SegmentAlloc | TraceAction::SegmentFree | TraceAction::SegmentMap | TraceAction::SegmentUnmap
        )
    }
}

/// One recorded allocator event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// Block or segment address (for `Oom`: the device's free bytes, as PyTorch stores it).
    pub addr: u64,
    /// Bytes (see [`TraceAction`] for what each action's size means).
    pub size: u64,
    /// The stream the block or segment belongs to.
    pub stream: StreamId,
    /// Microseconds since the Unix epoch.
    pub time_us: i64,
    /// Raw stack of the call that caused the event, when stacks are recorded.
    pub frames: Option<Frames>,
    /// Label id (see `DeviceState::set_label`), 0 for none.
    pub label: u32,
}

/// Where stacks are kept (PyTorch's `context` argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum StackContext {
    /// No stacks.
    None,
    /// Stacks on live blocks only (snapshot `frames`), none in trace entries.
    State,
    /// Also on allocation events; free events reuse the block's allocation stack.
    Alloc,
    /// Every event captures its own stack.
    All,
}

/// `record_memory_history` settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryOptions {
    /// What is recorded.
    pub enabled: RecordMode,
    /// Where stacks are kept.
    pub context: StackContext,
    /// Ring size (`State` forces 1).
    pub max_entries: usize,
}

impl Default for HistoryOptions {
    /// PyTorch's defaults: everything, with stacks, unbounded.
    fn default() -> Self {
        HistoryOptions { enabled: RecordMode::All, context: StackContext::All, max_entries: usize::MAX }
    }
}

/// What is recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordMode {
    /// Nothing (PyTorch's `enabled=None`).
    Off,
    /// The last event only (`enabled="state"`).
    State,
    /// A ring of `max_entries` events (`enabled="all"`).
    All,
}

/// The ring of recorded events.
#[derive(Clone, Debug)]
pub(crate) struct History {
    mode: RecordMode,
    context: StackContext,
    max_entries: usize,
    entries: VecDeque<TraceEntry>,
}

impl Default for History {
    fn default() -> Self {
        History {
            mode: RecordMode::Off,
            context: StackContext::None,
            max_entries: usize::MAX,
            entries: VecDeque::new(),
        }
    }
}

impl History {
    /// Sets what is recorded. `Off` clears the ring; `State` keeps one entry, which leaving
    /// `State` forgets too (it tracked the live blocks' state, not a history to continue).
    pub(crate) fn set_mode(&mut self, mode: RecordMode, max_entries: usize) {
        if self.mode == RecordMode::State && mode != RecordMode::State {
            self.entries.clear();
        }
        self.mode = mode;
        self.max_entries = match mode {
            RecordMode::State => 1,
            _ => max_entries.max(1),
        };
        if mode == RecordMode::Off {
            self.entries.clear();
        }
        while self.entries.len() > self.max_entries {
            self.entries.pop_front();
        }
    }
    /// The current mode.
    pub(crate) fn mode(&self) -> RecordMode {
        self.mode
    }
    /// Sets where stacks are kept.
    pub(crate) fn set_context(&mut self, context: StackContext) {
        self.context = context;
    }
    /// Where stacks are kept (`None` while recording is off).
    pub(crate) fn context(&self) -> StackContext {
        if self.mode == RecordMode::Off { StackContext::None } else { self.context }
    }
    /// The ring size.
    pub(crate) fn max_entries(&self) -> usize {
        self.max_entries
    }
    /// Appends an event with its stack and label when recording is on.
    #[inline(always)]
    pub(crate) fn record_with(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: StreamId,
        frames: Option<Frames>,
        label: u32,
    ) {
        if self.mode != RecordMode::Off {
            self.push(action, addr, size, stream, frames, label);
        }
    }

    #[inline(never)]
    fn push(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: StreamId,
        frames: Option<Frames>,
        label: u32,
    ) {
        if self.entries.len() >= self.max_entries {
            self.entries.pop_front();
        }
        self.entries.push_back(TraceEntry { action, addr, size, stream, time_us: now_us(), frames, label });
    }
    /// The recorded events, oldest first.
    pub(crate) fn entries(&self) -> &VecDeque<TraceEntry> {
        &self.entries
    }
    /// Removes and returns the recorded events.
    pub(crate) fn drain(&mut self) -> Vec<TraceEntry> {
        self.entries.drain(..).collect()
    }
}

/// Microseconds since the Unix epoch.
pub(crate) fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}
