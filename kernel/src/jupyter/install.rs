//! `gpumem-kernel install [--user | --prefix DIR]`: writes the kernelspec `gpumem`.
//!
//! kernel.json comes from the template `kernel/kernelspec/kernel.json` (the executable's path
//! and the version filled in); the two logos are drawn here and written as PNG.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The kernelspec's name (its directory).
pub const KERNEL_NAME: &str = "gpumem";

const TEMPLATE: &str = include_str!("../../kernelspec/kernel.json");

/// Where to install.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The user's Jupyter data dir (`~/.local/share/jupyter` on Linux, as jupyter-zmq-client
    /// computes it; `JUPYTER_DATA_DIR` is honoured).
    User,
    /// `DIR/share/jupyter/kernels/gpumem` (a virtualenv, a conda env, a test prefix).
    Prefix(PathBuf),
}

/// The kernelspec directory for a target.
pub fn kernel_dir(target: &Target) -> anyhow::Result<PathBuf> {
    Ok(match target {
        Target::User => {
            let data = match std::env::var_os("JUPYTER_DATA_DIR") {
                Some(d) => PathBuf::from(d),
                None => jupyter_zmq_client::user_data_dir().map_err(|e| anyhow::anyhow!("no Jupyter data dir: {e}"))?,
            };
            data.join("kernels").join(KERNEL_NAME)
        }
        Target::Prefix(p) => p.join("share").join("jupyter").join("kernels").join(KERNEL_NAME),
    })
}

/// kernel.json for this executable.
pub fn kernel_json(exe: &Path) -> String {
    let exe = serde_json::to_string(&exe.to_string_lossy()).unwrap_or_default();
    TEMPLATE.replace("\"@EXE@\"", &exe).replace("@VERSION@", env!("CARGO_PKG_VERSION"))
}

/// Writes kernel.json and the logos; returns the directory.
pub fn install(target: &Target) -> anyhow::Result<PathBuf> {
    let dir = kernel_dir(target)?;
    std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    let exe = std::env::current_exe()?;
    let exe = exe.canonicalize().unwrap_or(exe);
    std::fs::write(dir.join("kernel.json"), kernel_json(&exe))?;
    for size in [32u32, 64] {
        std::fs::write(dir.join(format!("logo-{size}x{size}.png")), logo_png(size))?;
    }
    Ok(dir)
}

/// The logo as RGBA pixels: a rust-coloured rounded square with four white memory bars of
/// growing height, the last one over a dashed "budget" line.
fn logo_pixels(n: u32) -> Vec<u8> {
    let mut px = vec![0u8; (n * n * 4) as usize];
    let f = n as f64;
    let r = f * 0.18;
    for y in 0..n {
        for x in 0..n {
            let (cx, cy) = (x as f64 + 0.5, y as f64 + 0.5);
            // Rounded-square coverage (1 sample per pixel, soft edge).
            let dx = (r - cx).max(cx - (f - r)).max(0.0);
            let dy = (r - cy).max(cy - (f - r)).max(0.0);
            let d = (dx * dx + dy * dy).sqrt() - r;
            let alpha = (0.5 - d).clamp(0.0, 1.0);
            let mut rgb = [0xb7u8, 0x41, 0x0e];
            // Bars.
            let bar_w = f * 0.13;
            let gap = f * 0.06;
            let left = f * 0.17;
            let base = f * 0.80;
            for (i, h) in [0.25, 0.38, 0.5, 0.62].iter().enumerate() {
                let x0 = left + i as f64 * (bar_w + gap);
                if cx >= x0 && cx < x0 + bar_w && cy <= base && cy >= base - h * f {
                    rgb = [0xff, 0xff, 0xff];
                }
            }
            // Budget line: dashed, near the top.
            let line_y = f * 0.22;
            if (cy - line_y).abs() < (f * 0.025).max(0.6)
                && ((cx / (f * 0.1)) as u32).is_multiple_of(2)
                && cx > f * 0.12
                && cx < f * 0.88
            {
                rgb = [0xff, 0xd5, 0x4f];
            }
            let i = ((y * n + x) * 4) as usize;
            px[i..i + 3].copy_from_slice(&rgb);
            px[i + 3] = (alpha * 255.0).round() as u8;
        }
    }
    px
}

/// The logo as a PNG file of `n`×`n` pixels.
pub fn logo_png(n: u32) -> Vec<u8> {
    encode_png(n, n, &logo_pixels(n))
}

/// A minimal PNG encoder: 8-bit RGBA, no filtering, zlib through flate2.
pub fn encode_png(w: u32, h: u32, rgba: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity((w * h * 4 + h) as usize);
    for row in rgba.chunks((w * 4) as usize) {
        raw.push(0);
        raw.extend_from_slice(row);
    }
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let _ = z.write_all(&raw);
    let idat = z.finish().unwrap_or_default();
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &idat);
    chunk(&mut out, b"IEND", &[]);
    out
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc = Crc::new();
    crc.update(kind);
    crc.update(data);
    out.extend_from_slice(&crc.finish().to_be_bytes());
}

/// CRC-32 (IEEE), as PNG chunks use it.
struct Crc(u32);

impl Crc {
    fn new() -> Self {
        Crc(0xffff_ffff)
    }
    fn update(&mut self, data: &[u8]) {
        for &b in data {
            let mut c = (self.0 ^ u32::from(b)) & 0xff;
            for _ in 0..8 {
                c = if c & 1 != 0 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
            }
            self.0 = c ^ (self.0 >> 8);
        }
    }
    fn finish(&self) -> u32 {
        self.0 ^ 0xffff_ffff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_matches_the_reference_value() {
        let mut c = Crc::new();
        c.update(b"123456789");
        assert_eq!(c.finish(), 0xcbf4_3926);
    }

    #[test]
    fn logos_are_pngs_of_the_right_size() {
        for n in [32u32, 64] {
            let png = logo_png(n);
            assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
            assert_eq!(&png[12..16], b"IHDR");
            assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), n);
            assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), n);
            assert!(png.ends_with(&[0xae, 0x42, 0x60, 0x82]), "IEND's CRC");
            // Decompress IDAT and check the size.
            let len = u32::from_be_bytes(png[33..37].try_into().unwrap()) as usize;
            assert_eq!(&png[37..41], b"IDAT");
            let mut d = flate2::read::ZlibDecoder::new(&png[41..41 + len]);
            let mut raw = Vec::new();
            std::io::Read::read_to_end(&mut d, &mut raw).unwrap();
            assert_eq!(raw.len(), (n * (n * 4 + 1)) as usize);
        }
    }

    #[test]
    fn kernel_json_from_the_template() {
        let j: serde_json::Value = serde_json::from_str(&kernel_json(Path::new("/opt/x \"y\"/gpumem-kernel"))).unwrap();
        assert_eq!(j["argv"][0], "/opt/x \"y\"/gpumem-kernel");
        assert_eq!(j["argv"][1], "--connection-file");
        assert_eq!(j["argv"][2], "{connection_file}");
        assert_eq!(j["display_name"], "Rust (gpumem)");
        assert_eq!(j["language"], "rust");
        assert_eq!(j["interrupt_mode"], "message");
    }

    #[test]
    fn install_into_a_prefix() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = install(&Target::Prefix(tmp.path().to_path_buf())).unwrap();
        assert_eq!(dir, tmp.path().join("share/jupyter/kernels/gpumem"));
        for f in ["kernel.json", "logo-32x32.png", "logo-64x64.png"] {
            assert!(dir.join(f).is_file(), "{f}");
        }
    }
}
