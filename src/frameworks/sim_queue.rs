//! A framework with a device thread of its own, on the simulated device: what cubecl does with
//! burn's work, small enough to test the readings against. Work is queued (`alloc_later`) and
//! runs on the queue's thread only when a batch is full or someone flushes it (cubecl runs its
//! device queue in batches of 32 tasks the same way), so a cell that queues an allocation and
//! returns has allocated nothing yet: only a reading that first settles the framework (the
//! queue's `flush`, as cubecl's `client.flush()`) counts it in the cell that queued it.
//!
//! For tests and demonstrations: its memory comes from the simulated driver
//! (`gpumem_nb::mem::driver_alloc_mib`, on the queue's thread), as a framework's pages come from
//! `cuMemAllocAsync` under CUPTI.

use crate::error::{Error, Result};
use crate::notebook::mem::DriverBuffer;
use crate::notebook::protocol::{FrameworkPool, FrameworkReading};
use crate::notebook::watched;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::Duration;

/// One job of the queue.
enum Job {
    /// Allocates this many MiB and keeps them.
    Alloc(u64),
    /// Releases everything kept.
    FreeAll,
    /// Answers when every job before it has run.
    Flush(mpsc::SyncSender<()>),
}

struct Inner {
    jobs: Mutex<VecDeque<Job>>,
    wake: Condvar,
    /// A batch this long runs by itself; shorter ones wait for a flush.
    batch: usize,
    held: Mutex<Vec<DriverBuffer>>,
    /// The thread answers nothing while set (a framework that hangs).
    stalled: AtomicBool,
    stop: AtomicBool,
}

/// See the module's documentation.
pub struct SimQueue {
    inner: Arc<Inner>,
    name: String,
}

impl SimQueue {
    /// A queue named `name` whose thread runs its jobs `batch` at a time (or at a flush).
    pub fn start(name: &str, batch: usize) -> Result<SimQueue> {
        let inner = Arc::new(Inner {
            jobs: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            batch: batch.max(1),
            held: Mutex::new(Vec::new()),
            stalled: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let work = Arc::clone(&inner);
        std::thread::Builder::new()
            .name(format!("simq-{name}"))
            .spawn(move || run(&work))
            .map_err(|e| Error::Unsupported(format!("SimQueue: no thread ({e})")))?;
        Ok(SimQueue { inner, name: name.to_string() })
    }

    /// Queues an allocation of `mib` MiB; returns at once (it runs on the queue's thread).
    pub fn alloc_later(&self, mib: u64) {
        self.push(Job::Alloc(mib));
    }

    /// Queues the release of everything the queue keeps.
    pub fn free_later(&self) {
        self.push(Job::FreeAll);
    }

    /// Runs everything queued so far; `Err` when the thread did not answer within `timeout`.
    pub fn flush(&self, timeout: Duration) -> std::result::Result<(), String> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.push(Job::Flush(tx));
        rx.recv_timeout(timeout).map_err(|_| format!("the queue's thread did not answer in {timeout:?}"))
    }

    /// Bytes the queue keeps now (what its thread has allocated so far).
    pub fn held(&self) -> u64 {
        crate::sync::lock(&self.inner.held).iter().map(|b| b.size()).sum()
    }

    /// Makes the thread hang (`true`) or go on (`false`).
    pub fn stall(&self, on: bool) {
        self.inner.stalled.store(on, Ordering::SeqCst);
        self.inner.wake.notify_all();
    }

    /// Watches the queue from now on: every cell's reading settles it first (a flush, bounded)
    /// and then reads what it holds, as `simqueue NAME`. Its reading itself does not flush:
    /// without the settle step a cell's queued allocations would be missed. Returns the key.
    pub fn watch(&self) -> Result<String> {
        crate::notebook::session::current()?;
        let key = format!("simqueue {}", self.name);
        let (reader, settler) = (Arc::clone(&self.inner), Arc::clone(&self.inner));
        let name = self.name.clone();
        watched::watch(
            &key,
            Arc::new(move || {
                let held: u64 = crate::sync::lock(&reader.held).iter().map(|b| b.size()).sum();
                let pages = crate::sync::lock(&reader.held).len() as u64;
                FrameworkReading {
                    framework: "simqueue".into(),
                    device: name.clone(),
                    source: "the queue's own books (simulated)".into(),
                    pools: vec![FrameworkPool {
                        kind: "pages".into(),
                        allocations: pages,
                        in_use: held,
                        reserved: held,
                        pages,
                        ..Default::default()
                    }],
                    ..Default::default()
                }
            }),
            Some(Arc::new(move || SimQueue::flush_inner(&settler, watched::settle_timeout()))),
        );
        Ok(key)
    }

    /// Stops watching the queue; false when it was not watched.
    pub fn unwatch(&self) -> bool {
        watched::unwatch(&format!("simqueue {}", self.name))
    }

    fn push(&self, job: Job) {
        crate::sync::lock(&self.inner.jobs).push_back(job);
        self.inner.wake.notify_all();
    }

    fn flush_inner(inner: &Arc<Inner>, timeout: Duration) -> std::result::Result<(), String> {
        let (tx, rx) = mpsc::sync_channel(1);
        crate::sync::lock(&inner.jobs).push_back(Job::Flush(tx));
        inner.wake.notify_all();
        rx.recv_timeout(timeout).map_err(|_| format!("the queue's thread did not answer in {timeout:?}"))
    }
}

impl Drop for SimQueue {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.wake.notify_all();
    }
}

/// The queue's thread: waits for a full batch or a flush, then runs the jobs in order.
fn run(inner: &Inner) {
    loop {
        let jobs: Vec<Job> = {
            let mut q = crate::sync::lock(&inner.jobs);
            loop {
                if inner.stop.load(Ordering::SeqCst) {
                    return;
                }
                let flush = q.iter().any(|j| matches!(j, Job::Flush(_)));
                if !inner.stalled.load(Ordering::SeqCst) && (flush || q.len() >= inner.batch) {
                    break;
                }
                q = inner
                    .wake
                    .wait_timeout(q, Duration::from_millis(200))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            q.drain(..).collect()
        };
        for job in jobs {
            match job {
                Job::Alloc(mib) => {
                    if let Ok(b) = crate::notebook::mem::driver_alloc_mib(mib) {
                        crate::sync::lock(&inner.held).push(b);
                    }
                }
                Job::FreeAll => crate::sync::lock(&inner.held).clear(),
                Job::Flush(ack) => {
                    let _ = ack.send(());
                }
            }
        }
    }
}
