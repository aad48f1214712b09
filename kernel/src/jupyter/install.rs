//! `gpumem-kernel install [--user | --prefix DIR]`: writes the kernelspec `gpumem`.
//!
//! kernel.json comes from the template `kernel/kernelspec/kernel.json` (the executable's path
//! and the version filled in); the two logos are the PNGs committed beside it.

use std::path::{Path, PathBuf};

/// The kernelspec's name (its directory).
pub const KERNEL_NAME: &str = "gpumem";

const TEMPLATE: &str = include_str!("../../kernelspec/kernel.json");

/// The logos Jupyter shows for the kernel (a rust-coloured square with four memory bars of
/// growing height, the last over a dashed budget line), as committed in `kernel/kernelspec/`.
const LOGOS: [(&str, &[u8]); 2] = [
    ("logo-32x32.png", include_bytes!("../../kernelspec/logo-32x32.png")),
    ("logo-64x64.png", include_bytes!("../../kernelspec/logo-64x64.png")),
];

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
    for (name, png) in LOGOS {
        std::fs::write(dir.join(name), png)?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logos_are_pngs_of_their_names_size() {
        for (name, png) in LOGOS {
            let n: u32 = name.trim_start_matches("logo-").split('x').next().unwrap().parse().unwrap();
            assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}");
            assert_eq!(&png[12..16], b"IHDR");
            assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), n, "{name}");
            assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), n, "{name}");
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
        assert_eq!(std::fs::read(dir.join("logo-64x64.png")).unwrap(), LOGOS[1].1);
    }
}
