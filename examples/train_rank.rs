//! A training binary as a user of gpumem-nb writes one, started once per rank: by Slurm's
//! `srun` (`deploy/slurm/train.sbatch`), by torchrun, or by hand. Each rank trains the same
//! small model (data parallel) on gpumem-nb's allocator: the GPU when there is one, else the
//! simulated device (`GPUMEM_NB_DEVICE` chooses, as everywhere). Its memory is stamped by
//! component (parameters, gradients, Adam's moments, activations, temporaries), every step is
//! measured as a notebook cell is (`gpumem_nb::steps`), and the latest step's numbers are served
//! to Prometheus (`gpumem_nb::metrics`) on port BASE + the rank's local rank, labelled with its
//! rank, host, GPU and Slurm job.
//!
//! ```text
//! cargo run --release --features metrics --example train_rank -- [OPTIONS]
//!   --steps N         training steps (100)
//!   --step-ms MS      time each step computes, simulated by a sleep (200)
//!   --hidden H        the model's width (1024); --layers L its depth (4)
//!   --batch B         sequences per step (8); --max-seq S the longest sequence (512): each
//!                     step's length is drawn per rank, so ranks' activations differ as
//!                     they do with real batches of text
//!   --metrics ADDR    HOST:BASE to serve on (0.0.0.0:9464); the rank serves on BASE + local rank
//!   --records DIR     also write each step's record to DIR/rankN.jsonl (the numbers served)
//!   --linger SECS     keep serving after the last step, for a last scrape (0)
//!   --every N         print the step's report line every N steps (10)
//! ```
//!
//! The rank and local rank come from `RANK`/`LOCAL_RANK`, else Slurm's `SLURM_PROCID`/
//! `SLURM_LOCALID`; each rank uses its device 0 (Slurm's `--gpus-per-task=1` makes that the
//! task's own GPU).
use gpumem_nb::metrics::{self, Identity};
use gpumem_nb::steps::Steps;
use gpumem_nb::units::iec;
use gpumem_nb::{Allocator, Component, DeviceBuffer, StreamId, component};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

struct Opts {
    steps: u64,
    step_ms: u64,
    hidden: usize,
    layers: usize,
    batch: usize,
    max_seq: usize,
    metrics: String,
    records: Option<PathBuf>,
    linger: u64,
    every: u64,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        steps: 100,
        step_ms: 200,
        hidden: 1024,
        layers: 4,
        batch: 8,
        max_seq: 512,
        metrics: "0.0.0.0:9464".into(),
        records: None,
        linger: 0,
        every: 10,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|_| format!("{flag}: not a number: {value}"));
        match flag.as_str() {
            "--steps" => o.steps = number()?,
            "--step-ms" => o.step_ms = number()?,
            "--hidden" => o.hidden = number()? as usize,
            "--layers" => o.layers = number()? as usize,
            "--batch" => o.batch = number()? as usize,
            "--max-seq" => o.max_seq = number()?.max(1) as usize,
            "--metrics" => o.metrics = value.clone(),
            "--records" => o.records = Some(PathBuf::from(value)),
            "--linger" => o.linger = number()?,
            "--every" => o.every = number()?.max(1),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(o)
}

/// BASE + the local rank: each rank of a host on a port of its own.
fn rank_addr(base: &str, local_rank: u32) -> Result<String, String> {
    let addr = metrics::parse_addr(base).map_err(|e| e.to_string())?;
    let port = u32::from(addr.port()) + local_rank;
    let port = u16::try_from(port).map_err(|_| format!("{base}: port {port} for local rank {local_rank}"))?;
    Ok(std::net::SocketAddr::new(addr.ip(), port).to_string())
}

/// xorshift: the same sequence lengths for a rank on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

type Buf = DeviceBuffer<f32>;

fn zeros(alloc: &Arc<Allocator>, len: usize) -> gpumem_nb::Result<Buf> {
    DeviceBuffer::zeros(alloc, len, StreamId::DEFAULT)
}

/// A linear layer's weight and bias (or their gradients, or one of Adam's moments of them).
struct Linear {
    w: Buf,
    b: Buf,
}

impl Linear {
    fn new(alloc: &Arc<Allocator>, h: usize) -> gpumem_nb::Result<Linear> {
        Ok(Linear { w: zeros(alloc, h * h)?, b: zeros(alloc, h)? })
    }

    fn bytes(&self) -> u64 {
        ((self.w.len() + self.b.len()) * 4) as u64
    }
}

fn like(alloc: &Arc<Allocator>, layers: &[Linear]) -> gpumem_nb::Result<Vec<Linear>> {
    layers.iter().map(|l| Linear::new(alloc, l.b.len())).collect()
}

/// One step of data-parallel training: forward (an activation kept per layer), backward (a
/// temporary per layer; gradients kept between steps, as `zero_grad(set_to_none=False)` keeps
/// them), the optimizer (Adam's two moments, made at its first step). The all-reduce of the
/// gradients would go between backward and the optimizer.
fn train_step(
    alloc: &Arc<Allocator>,
    params: &[Linear],
    grads: &mut Option<Vec<Linear>>,
    adam: &mut Option<[Vec<Linear>; 2]>,
    rows: usize,
) -> gpumem_nb::Result<()> {
    let h = params[0].b.len();
    let mut acts = component(Component::Activation, || {
        params.iter().map(|_| zeros(alloc, rows * h)).collect::<gpumem_nb::Result<Vec<_>>>()
    })?;
    if grads.is_none() {
        *grads = Some(component(Component::Gradient, || like(alloc, params))?);
    }
    while let Some(act) = acts.pop() {
        // The gradient of this layer's input, used and dropped as backward moves down.
        let _dx = component(Component::Temp, || zeros(alloc, rows * h))?;
        drop(act);
    }
    if adam.is_none() {
        *adam = Some(component(Component::OptimizerState, || {
            Ok::<_, gpumem_nb::Error>([like(alloc, params)?, like(alloc, params)?])
        })?);
    }
    Ok(())
}

fn run(o: &Opts) -> Result<(), Box<dyn std::error::Error>> {
    let who = Identity::of_process();
    let (rank, local) = (who.rank.unwrap_or(0), who.local_rank.unwrap_or(0));
    let alloc = gpumem_nb::current()?;
    let server = metrics::serve(&rank_addr(&o.metrics, local)?)?;
    let job = who.slurm_job_id.as_deref().map_or(String::new(), |j| format!(", Slurm job {j}"));
    let device = match alloc.backend_kind() {
        gpumem_nb::BackendKind::Cuda => format!("cuda:{}", alloc.device()),
        _ => format!("sim:{} (simulated)", alloc.device()),
    };
    println!("rank {rank} (local {local}{job}) on {}: {device}, metrics at http://{}/metrics", who.host, server.addr());
    let mut records = match &o.records {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            Some(std::fs::File::create(dir.join(format!("rank{rank}.jsonl")))?)
        }
        None => None,
    };

    let params = component(Component::Parameter, || {
        (0..o.layers).map(|_| Linear::new(&alloc, o.hidden)).collect::<gpumem_nb::Result<Vec<_>>>()
    })?;
    let n_params: u64 = params.iter().map(Linear::bytes).sum();
    println!("rank {rank}: {} layers of width {}, parameters {}", o.layers, o.hidden, iec(n_params));
    let (mut grads, mut adam) = (None, None);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (u64::from(rank) + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut steps = Steps::new();
    for step in 1..=o.steps {
        steps.begin(step);
        let seq = o.max_seq / 4 + (rng.next() % (o.max_seq - o.max_seq / 4 + 1) as u64) as usize;
        train_step(&alloc, &params, &mut grads, &mut adam, o.batch * seq)?;
        std::thread::sleep(Duration::from_millis(o.step_ms));
        let Some(rec) = steps.end() else { continue };
        if let Some(f) = records.as_mut() {
            writeln!(f, "{}", serde_json::to_string(&rec)?)?;
            f.flush()?;
        }
        if step % o.every == 0 || step == o.steps {
            println!("rank {rank} step {step}: {}", rec.line());
        }
    }
    if o.linger > 0 {
        println!("rank {rank}: done, serving for {} s more", o.linger);
        std::thread::sleep(Duration::from_secs(o.linger));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("train_rank: {e} (options: see the top of examples/train_rank.rs)");
            return ExitCode::from(2);
        }
    };
    match run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train_rank: {e}");
            ExitCode::FAILURE
        }
    }
}
