//! One stable hash for everything the kernel keeps on disk or compares between runs: the name
//! of a session-dependency build, the key of a build without cargo (`state.json`), a cell's code
//! in its record (re-run detection, exported with the history).
//!
//! 64-bit FNV-1a over bytes the caller names explicitly. std's `DefaultHasher` is not stable
//! across Rust releases, and neither are the `Hash` impls it would be fed through: a key written
//! by one kernel build must mean the same to the next.

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0100_0000_01b3;

/// FNV-1a, fed field by field.
#[derive(Clone, Copy, Debug)]
pub struct StableHash(u64);

impl Default for StableHash {
    fn default() -> StableHash {
        StableHash(OFFSET)
    }
}

impl StableHash {
    /// Feeds `bytes` as they are.
    pub fn write(&mut self, bytes: &[u8]) -> &mut StableHash {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(PRIME);
        }
        self
    }

    /// Feeds a text field ended by a 0 byte, so that two fields cannot run into each other.
    pub fn text(&mut self, s: &str) -> &mut StableHash {
        self.write(s.as_bytes()).write(&[0])
    }

    /// Feeds bytes of any content, or their absence: a tag, the length, the bytes.
    pub fn blob(&mut self, bytes: Option<&[u8]>) -> &mut StableHash {
        match bytes {
            None => self.write(&[0]),
            Some(b) => self.write(&[1]).write(&(b.len() as u64).to_le_bytes()).write(b),
        }
    }

    /// The hash as 16 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_as_published_and_fields_kept_apart() {
        // The FNV-1a 64 test vectors (the empty input is the offset basis).
        assert_eq!(StableHash::default().hex(), "cbf29ce484222325");
        assert_eq!(StableHash::default().write(b"a").hex(), "af63dc4c8601ec8c");
        assert_eq!(StableHash::default().write(b"foobar").hex(), "85944171f73967e8");
        let two = |a: &str, b: &str| StableHash::default().text(a).text(b).hex();
        assert_ne!(two("ab", "c"), two("a", "bc"));
        let blob = |a: Option<&[u8]>| StableHash::default().blob(a).hex();
        assert_ne!(blob(None), blob(Some(b"")));
        assert_ne!(blob(Some(b"\0")), blob(Some(b"")));
    }
}
