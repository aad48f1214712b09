//! Records a small workload with stacks and writes a snapshot: `snapshot_demo DIR`.
//! Runs on whatever device `GPUMEM_NB_DEVICE` selects (the GPU when there is one), so the GPU
//! check can hand a snapshot written on a real GPU to PyTorch's own tools.
use gpumem_nb::{DeviceBuffer, HistoryOptions, StreamId};

#[inline(never)]
fn forward(alloc: &std::sync::Arc<gpumem_nb::Allocator>, n: usize) -> gpumem_nb::Result<Vec<DeviceBuffer<f32>>> {
    (0..n).map(|i| DeviceBuffer::<f32>::zeros(alloc, (1 << 18) * (i + 1), StreamId::DEFAULT)).collect()
}

fn main() -> gpumem_nb::Result<()> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "snapshot-demo".into());
    let alloc = gpumem_nb::current()?;
    alloc.record_memory_history_with(HistoryOptions::default());
    let weights = DeviceBuffer::<f32>::zeros(&alloc, 16 << 20, StreamId::DEFAULT)?;
    for step in 0..3 {
        alloc.set_label(Some(&format!("step {step}")));
        let acts = forward(&alloc, 6)?;
        drop(acts);
    }
    let small: Vec<_> = (0..20).map(|i| DeviceBuffer::<u8>::zeros(&alloc, 1000 * (i + 1), StreamId::DEFAULT)).collect();
    let (_, total) = alloc.mem_get_info()?;
    let oom = DeviceBuffer::<u8>::zeros(&alloc, (total + (1 << 30)) as usize, StreamId::DEFAULT).err();
    let snap = alloc.snapshot();
    let files = snap.save(std::path::Path::new(&dir)).map_err(|e| gpumem_nb::Error::Setting(e.to_string()))?;
    println!(
        "device {} ({:?}): allocated {} reserved {}; {} events; oom: {}",
        alloc.device(),
        alloc.backend_kind(),
        alloc.memory_allocated(),
        alloc.memory_reserved(),
        snap.num_events(),
        oom.map_or("none".to_string(), |e| e.to_string().chars().take(60).collect())
    );
    println!("{}\n{}\n{}", files.pickle.display(), files.json.display(), files.html.display());
    drop((weights, small));
    Ok(())
}
