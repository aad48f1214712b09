//! The names of a snapshot's files, per rank: `snapshot.pickle` in a single process,
//! `snapshot_rank1.pickle` in rank 1 of a distributed job (`RANK`, else `LOCAL_RANK`), the
//! names PyTorch users already give memory_viz; and finding them again in a directory.

use std::path::{Path, PathBuf};

/// The rank a file name carries: `RANK`, else `LOCAL_RANK`, when one is set to a number.
pub fn rank() -> Option<u32> {
    ["RANK", "LOCAL_RANK"].iter().find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

/// `_rankN` when this process has a rank (see [`rank`]), else empty.
pub fn rank_suffix() -> String {
    rank().map_or(String::new(), |r| format!("_rank{r}"))
}

/// `STEM.EXT`, or `STEM_rankN.EXT` in a process with a rank: `file_name("snapshot", "pickle")`.
pub fn file_name(stem: &str, ext: &str) -> String {
    format!("{stem}{}.{ext}", rank_suffix())
}

/// The rank in a file name (`snapshot_rank3.pickle`, `rank3/…`'s name part only), if any.
pub fn rank_of(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let at = name.rfind("rank")?;
    let digits: String = name[at + 4..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Every `STEM_rankN.EXT` in `dir`, by rank.
pub fn rank_files(dir: &Path, stem: &str, ext: &str) -> Vec<PathBuf> {
    let prefix = format!("{stem}_rank");
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let rank: u32 = name.strip_prefix(&prefix)?.strip_suffix(&format!(".{ext}"))?.parse().ok()?;
            Some((rank, e.path()))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// The `STEM.EXT` a directory holds: `STEM.EXT` itself, else this process's rank's file, else
/// the one rank file there is. `Err` names the files when there are several ranks' and none is
/// this process's (name one), and `Ok` of the plain name when there is none at all (reading it
/// then says it is missing).
pub(crate) fn find_in_dir(dir: &Path, stem: &str, ext: &str) -> Result<PathBuf, super::ReadError> {
    let plain = dir.join(format!("{stem}.{ext}"));
    if plain.is_file() {
        return Ok(plain);
    }
    let own = dir.join(file_name(stem, ext));
    if own.is_file() {
        return Ok(own);
    }
    match rank_files(dir, stem, ext).as_slice() {
        [] => Ok(plain),
        [one] => Ok(one.clone()),
        many => Err(super::ReadError::Ambiguous(format!(
            "{}: {} ranks' snapshots ({}): name one file",
            dir.display(),
            many.len(),
            many.iter().filter_map(|p| p.file_name()?.to_str()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_names_and_lookup() {
        assert_eq!(rank_of(Path::new("d/snapshot_rank12.pickle")), Some(12));
        assert_eq!(rank_of(Path::new("d/snapshot.pickle")), None);
        let dir = std::env::temp_dir().join(format!("gpumem-rank-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(
            find_in_dir(&dir, "snapshot", "pickle").unwrap(),
            dir.join("snapshot.pickle"),
            "none: the plain name"
        );
        std::fs::write(dir.join("snapshot_rank1.pickle"), b"x").unwrap();
        assert_eq!(find_in_dir(&dir, "snapshot", "pickle").unwrap(), dir.join("snapshot_rank1.pickle"));
        std::fs::write(dir.join("snapshot_rank0.pickle"), b"x").unwrap();
        std::fs::write(dir.join("snapshot_rank0.json"), b"x").unwrap();
        assert_eq!(
            rank_files(&dir, "snapshot", "pickle"),
            [dir.join("snapshot_rank0.pickle"), dir.join("snapshot_rank1.pickle")]
        );
        if rank().is_none() {
            let e = find_in_dir(&dir, "snapshot", "pickle").unwrap_err().to_string();
            assert!(e.contains("2 ranks' snapshots (snapshot_rank0.pickle, snapshot_rank1.pickle)"), "{e}");
        }
        std::fs::write(dir.join("snapshot.pickle"), b"x").unwrap();
        assert_eq!(find_in_dir(&dir, "snapshot", "pickle").unwrap(), dir.join("snapshot.pickle"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
