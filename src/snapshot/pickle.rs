//! The snapshot as a pickle (protocol 4), written with only the opcodes PyTorch's web viewer
//! (`MemoryViz.js`) reads: PROTO 4, FRAME, EMPTY_DICT/MARK/SETITEMS, EMPTY_LIST/APPENDS,
//! SHORT_BINUNICODE/BINUNICODE, BININT1/BININT2/BININT/LONG1, NEWTRUE/NEWFALSE, BINFLOAT,
//! TUPLE2, MEMOIZE with BINGET/LONG_BINGET, STOP (what the pickle reader of PyTorch's `MemoryViz.js` accepts).
//! Python's `pickle.load` and `torch.cuda._memory_viz` read it as well.
//!
//! Repeated strings (dict keys, action and state names, file names) are memoised and referred
//! back to, as Python's pickler does, which keeps large traces compact.

use super::model::{BlockSnap, Segment, Snapshot, TraceSnap};
use crate::record::frames::Frame;
use std::collections::HashMap;

mod op {
    pub(super) const PROTO: u8 = 0x80;
    pub(super) const FRAME: u8 = 0x95;
    pub(super) const STOP: u8 = b'.';
    pub(super) const MARK: u8 = b'(';
    pub(super) const EMPTY_DICT: u8 = b'}';
    pub(super) const SETITEMS: u8 = b'u';
    pub(super) const EMPTY_LIST: u8 = b']';
    pub(super) const APPENDS: u8 = b'e';
    pub(super) const SHORT_BINUNICODE: u8 = 0x8c;
    pub(super) const BINUNICODE: u8 = b'X';
    pub(super) const BININT1: u8 = b'K';
    pub(super) const BININT2: u8 = b'M';
    pub(super) const BININT: u8 = b'J';
    pub(super) const LONG1: u8 = 0x8a;
    pub(super) const NEWTRUE: u8 = 0x88;
    pub(super) const NEWFALSE: u8 = 0x89;
    pub(super) const BINFLOAT: u8 = b'G';
    pub(super) const TUPLE2: u8 = 0x86;
    pub(super) const MEMOIZE: u8 = 0x94;
    pub(super) const BINGET: u8 = b'h';
    pub(super) const LONG_BINGET: u8 = b'j';
}

/// Items per SETITEMS/APPENDS batch (Python's batch size).
const BATCH: usize = 1000;

struct Writer {
    buf: Vec<u8>,
    memo: HashMap<String, u32>,
    next_memo: u32,
}

impl Writer {
    fn str(&mut self, s: &str) {
        if let Some(&i) = self.memo.get(s) {
            if i < 256 {
                self.buf.extend_from_slice(&[op::BINGET, i as u8]);
            } else {
                self.buf.push(op::LONG_BINGET);
                self.buf.extend_from_slice(&i.to_le_bytes());
            }
            return;
        }
        let b = s.as_bytes();
        if b.len() < 256 {
            self.buf.extend_from_slice(&[op::SHORT_BINUNICODE, b.len() as u8]);
        } else {
            self.buf.push(op::BINUNICODE);
            self.buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
        }
        self.buf.extend_from_slice(b);
        self.buf.push(op::MEMOIZE);
        self.memo.insert(s.to_string(), self.next_memo);
        self.next_memo += 1;
    }

    fn int(&mut self, v: i128) {
        if (0..=0xff).contains(&v) {
            self.buf.extend_from_slice(&[op::BININT1, v as u8]);
        } else if (0..=0xffff).contains(&v) {
            self.buf.push(op::BININT2);
            self.buf.extend_from_slice(&(v as u16).to_le_bytes());
        } else if (-(1i128 << 31)..(1i128 << 31)).contains(&v) {
            self.buf.push(op::BININT);
            self.buf.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            // Minimal little-endian two's complement, as Python's encode_long.
            let bytes = v.to_le_bytes();
            let mut n = 16;
            while n > 1 {
                let (last, prev) = (bytes[n - 1], bytes[n - 2]);
                if (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.buf.extend_from_slice(&[op::LONG1, n as u8]);
            self.buf.extend_from_slice(&bytes[..n]);
        }
    }

    fn u64(&mut self, v: u64) {
        self.int(v as i128);
    }

    fn bool(&mut self, v: bool) {
        self.buf.push(if v { op::NEWTRUE } else { op::NEWFALSE });
    }

    fn float(&mut self, v: f64) {
        self.buf.push(op::BINFLOAT);
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    /// A list whose items `item` writes.
    fn list<T>(&mut self, items: &[T], mut item: impl FnMut(&mut Self, &T)) {
        self.buf.push(op::EMPTY_LIST);
        for chunk in items.chunks(BATCH) {
            self.buf.push(op::MARK);
            for x in chunk {
                item(self, x);
            }
            self.buf.push(op::APPENDS);
        }
    }

    /// A dict: `body` writes key, value, key, value … (at most `BATCH` pairs).
    fn dict(&mut self, body: impl FnOnce(&mut Self)) {
        self.buf.extend_from_slice(&[op::EMPTY_DICT, op::MARK]);
        body(self);
        self.buf.push(op::SETITEMS);
    }

    fn frames(&mut self, frames: &[Frame]) {
        self.list(frames, |w, f| {
            w.dict(|w| {
                w.str("name");
                w.str(&f.name);
                w.str("filename");
                w.str(&f.filename);
                w.str("line");
                w.u64(f.line as u64);
            })
        });
    }

    fn block(&mut self, b: &BlockSnap) {
        self.dict(|w| {
            w.str("address");
            w.u64(b.address);
            w.str("size");
            w.u64(b.size);
            w.str("requested_size");
            w.u64(b.requested_size);
            w.str("state");
            w.str(b.state);
            w.str("frames");
            w.frames(&b.frames);
        });
    }

    fn segment(&mut self, s: &Segment) {
        self.dict(|w| {
            w.str("device");
            w.int(s.device as i128);
            w.str("address");
            w.u64(s.address);
            w.str("total_size");
            w.u64(s.total_size);
            w.str("allocated_size");
            w.u64(s.allocated_size);
            w.str("active_size");
            w.u64(s.active_size);
            w.str("requested_size");
            w.u64(s.requested_size);
            w.str("stream");
            w.u64(s.stream);
            w.str("segment_type");
            w.str(s.segment_type);
            w.str("segment_pool_id");
            w.u64(s.segment_pool_id.0);
            w.u64(s.segment_pool_id.1);
            w.buf.push(op::TUPLE2);
            w.str("is_expandable");
            w.bool(s.is_expandable);
            w.str("frames");
            w.frames(&s.frames);
            w.str("blocks");
            w.list(&s.blocks, |w, b| w.block(b));
        });
    }

    fn trace(&mut self, e: &TraceSnap) {
        self.dict(|w| {
            w.str("action");
            w.str(e.action);
            if let Some(a) = e.addr {
                w.str("addr");
                w.u64(a);
            }
            if let Some(f) = e.device_free {
                w.str("device_free");
                w.u64(f);
            }
            w.str("size");
            w.u64(e.size);
            w.str("stream");
            w.u64(e.stream);
            w.str("time_us");
            w.int(e.time_us as i128);
            w.str("compile_context");
            w.str(e.compile_context);
            w.str("user_metadata");
            w.str(&e.user_metadata);
            if let Some(f) = &e.frames {
                w.str("frames");
                w.frames(f);
            }
        });
    }
}

/// The snapshot as pickle bytes (protocol 4, one frame).
pub fn to_bytes(s: &Snapshot) -> Vec<u8> {
    let mut w = Writer { buf: Vec::with_capacity(64 + s.num_events() * 48), memo: HashMap::new(), next_memo: 0 };
    w.dict(|w| {
        w.str("segments");
        w.list(&s.segments, |w, seg| w.segment(seg));
        w.str("device_traces");
        w.list(&s.device_traces, |w, t| w.list(t, |w, e| w.trace(e)));
        w.str("allocator_settings");
        let a = &s.allocator_settings;
        w.dict(|w| {
            w.str("PYTORCH_CUDA_ALLOC_CONF");
            w.str(&a.conf);
            w.str("max_split_size");
            w.int(a.max_split_size as i128);
            w.str("garbage_collection_threshold");
            w.float(a.garbage_collection_threshold);
            w.str("expandable_segments");
            w.bool(a.expandable_segments);
            w.str("pinned_num_register_threads");
            w.u64(a.pinned_num_register_threads);
            w.str("release_lock_on_cudamalloc");
            w.bool(a.release_lock_on_cudamalloc);
            w.str("pinned_use_cuda_host_register");
            w.bool(a.pinned_use_cuda_host_register);
            w.str("graph_capture_record_stream_reuse");
            w.bool(a.graph_capture_record_stream_reuse);
            w.str("roundup_power2_divisions");
            w.dict(|w| {
                for (k, d) in &a.roundup_power2_divisions {
                    w.str(k);
                    w.u64(*d);
                }
            });
        });
        w.str("external_annotations");
        w.list::<serde_json::Value>(&[], |_, _| {});
    });
    w.buf.push(op::STOP);
    let mut out = Vec::with_capacity(w.buf.len() + 11);
    out.extend_from_slice(&[op::PROTO, 4, op::FRAME]);
    out.extend_from_slice(&(w.buf.len() as u64).to_le_bytes());
    out.extend_from_slice(&w.buf);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(f: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer { buf: Vec::new(), memo: HashMap::new(), next_memo: 0 };
        f(&mut w);
        w.buf
    }

    #[test]
    fn integers_use_pythons_encodings() {
        assert_eq!(bytes_of(|w| w.int(7)), [b'K', 7]);
        assert_eq!(bytes_of(|w| w.int(300)), [b'M', 0x2c, 0x01]);
        assert_eq!(bytes_of(|w| w.int(-1)), [b'J', 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(bytes_of(|w| w.int(1 << 31)), [0x8a, 5, 0, 0, 0, 0x80, 0]);
        assert_eq!(bytes_of(|w| w.u64(u64::MAX)), [0x8a, 9, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]);
        assert_eq!(bytes_of(|w| w.int(-(1i128 << 40))), [0x8a, 6, 0, 0, 0, 0, 0, 0xff]);
    }

    #[test]
    fn repeated_strings_are_memoised() {
        let b = bytes_of(|w| {
            w.str("size");
            w.str("size");
        });
        assert_eq!(b, [0x8c, 4, b's', b'i', b'z', b'e', 0x94, b'h', 0]);
    }
}
