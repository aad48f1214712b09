//! `%gpumem trim`: the notebook process's caches given back (gpumem-nb's allocator's, each CUDA
//! device's stream-ordered pool: `gpumem_nb::kernel::protocol::Op::Trim`), inside the cell's
//! measured time, so that its report line shows the change; a table of what each owner held
//! before and after, by its own counters, and NVML's figure of the process before and after.

use super::Engine;
use super::SLOW_TIMEOUT;
use gpumem_nb::device::nvml::{self, NvmlSnapshot};
use gpumem_nb::kernel::protocol::{Op, Trimmed};
use gpumem_nb::render::Table;
use gpumem_nb::units::{iec, iec_delta};
use serde_json::{Map, Value, json};

/// `%gpumem trim`'s figures for programs, beside its table (a vendor type, as `%gpumem explain`'s).
pub(super) const TRIM_MIME: &str = "application/vnd.gpumem.trim+json";

/// What no trim here can reach, said under the table.
const NOT_REACHED: &str = "cubecl's pools (burn) are given back only by cubecl's own cleanup, which needs code \
                           compiled against the notebook's cubecl: not trimmed";

impl Engine {
    /// Trims the child's caches and shows what was given back.
    pub(super) fn trim(&mut self) {
        let pid = self.child_pid();
        self.hooks.poll(pid);
        if self.hooks.control().connected().is_none() {
            self.stream("stdout", "gpumem: nothing to trim (the notebook's process has not used a device)");
            return;
        }
        let before = nvml::snapshot();
        let reply = self.hooks.control().request(Op::Trim, SLOW_TIMEOUT);
        let after = nvml::snapshot();
        match reply {
            Ok(r) => {
                let rows = r.trim.unwrap_or_default();
                let table = table(&rows, pid, &before, &after);
                let b = table.bundle();
                let mut m = Map::new();
                m.insert("text/plain".into(), Value::String(b.text));
                if let Some(html) = b.html {
                    m.insert("text/html".into(), Value::String(html));
                }
                m.insert(TRIM_MIME.into(), figures(&rows, pid, &before, &after));
                self.display(m);
            }
            Err(e) => self.magic_error(&format!("trim: {e}")),
        }
    }
}

/// NVML's figure of process `pid` on each device, before and after: (device, before, after).
fn nvml_rows(pid: Option<u32>, before: &NvmlSnapshot, after: &NvmlSnapshot) -> Vec<(String, u64, u64)> {
    let Some(pid) = pid else { return Vec::new() };
    after
        .devices
        .iter()
        .filter_map(|d| {
            let a = d.process_used(pid)?;
            let b = before.devices.iter().find(|x| x.uuid == d.uuid).and_then(|x| x.process_used(pid))?;
            Some((format!("GPU {} ({})", d.index, d.name), b, a))
        })
        .collect()
}

/// The table: one row per owner and device that was trimmed, then NVML's rows.
fn table(rows: &[Trimmed], pid: Option<u32>, before: &NvmlSnapshot, after: &NvmlSnapshot) -> Table {
    let mut t = Table::new(["owner", "device", "reserved before", "reserved after", "given back", "in use", "source"])
        .right_align([2, 3, 4, 5]);
    for r in rows {
        let back = match &r.error {
            Some(e) => e.clone(),
            None => iec(r.given_back()),
        };
        t.row([
            r.owner.clone(),
            r.device.clone(),
            iec(r.reserved_before),
            iec(r.reserved_after),
            back,
            iec(r.in_use),
            r.source.clone(),
        ]);
    }
    for (device, b, a) in nvml_rows(pid, before, after) {
        let change = a as i64 - b as i64;
        t.row([
            "process (NVML)".to_string(),
            device,
            iec(b),
            iec(a),
            iec_delta(change),
            String::new(),
            format!("NVML per-process (pid {})", pid.unwrap_or(0)),
        ]);
    }
    let title = if rows.is_empty() {
        "gpumem trim: no cache to give back (no gpumem-nb allocator open, no CUDA pool in use)"
    } else {
        "gpumem trim: cached memory given back; what is in use was not touched"
    };
    t.title(title).caption(NOT_REACHED)
}

/// The same for programs.
fn figures(rows: &[Trimmed], pid: Option<u32>, before: &NvmlSnapshot, after: &NvmlSnapshot) -> Value {
    let nvml: Vec<Value> = nvml_rows(pid, before, after)
        .into_iter()
        .map(|(device, b, a)| json!({"device": device, "before": b, "after": a}))
        .collect();
    json!({"trimmed": rows, "process": nvml, "pid": pid})
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_nb::device::nvml::{NvmlDevice, NvmlProcess};

    fn snap(used: u64) -> NvmlSnapshot {
        NvmlSnapshot {
            devices: vec![NvmlDevice {
                index: 0,
                uuid: "GPU-1".into(),
                name: "H100".into(),
                total: 80 << 30,
                free: 0,
                used,
                processes: vec![NvmlProcess { pid: 42, used: Some(used) }],
            }],
            error: None,
        }
    }

    #[test]
    fn each_owner_and_the_process_before_and_after() {
        let rows = [
            Trimmed {
                owner: "CUDA pool".into(),
                device: "cuda:0".into(),
                source: "the driver's pool counters".into(),
                reserved_before: 3 << 30,
                reserved_after: 2 << 30,
                in_use: 2 << 30,
                error: None,
            },
            Trimmed {
                owner: "gpumem-nb".into(),
                device: "cuda:0".into(),
                error: Some("not trimmed: the CUDA context was lost".into()),
                ..Default::default()
            },
        ];
        let text = table(&rows, Some(42), &snap(4 << 30), &snap(3 << 30)).to_text();
        assert!(text.contains("cached memory given back"), "{text}");
        assert!(text.contains("CUDA pool") && text.contains("3.00 GiB") && text.contains("1.00 GiB"), "{text}");
        assert!(text.contains("not trimmed: the CUDA context was lost"), "{text}");
        assert!(text.contains("process (NVML)") && text.contains("-1.00 GiB"), "{text}");
        assert!(text.contains("cubecl"), "what it cannot reach is said: {text}");
        let f = figures(&rows, Some(42), &snap(4 << 30), &snap(3 << 30));
        assert_eq!(f["process"][0]["before"], 4u64 << 30);
        assert_eq!(f["trimmed"][0]["reserved_after"], 2u64 << 30);
        let none = table(&[], None, &NvmlSnapshot::default(), &NvmlSnapshot::default()).to_text();
        assert!(none.contains("no cache to give back"), "{none}");
    }
}
