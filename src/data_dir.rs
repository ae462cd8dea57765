//! Whether the folders the service keeps its state in still take a write, for `/readyz`.
//!
//! A `data_dir` deleted (or remounted read-only) under a running node does not stop it:
//! sled and the journals keep writing into files that no longer have a name, and every
//! write since is lost at the next restart. Nothing on the request path notices, so
//! readiness asks: each folder must still exist and take a new file.

use std::path::{Path, PathBuf};

/// `data_dir` and the folders the service made in it at start-up.
#[derive(Debug, Clone, Default)]
pub struct StateFolders {
    dirs: Vec<PathBuf>,
}

impl StateFolders {
    /// `data_dir` and every folder in it now: call it once start-up has opened them all
    /// (behaviour, events, the embedded windows, the recording), so a folder deleted later
    /// is still asked about.
    pub fn of(data_dir: &Path) -> StateFolders {
        let mut dirs = vec![data_dir.to_path_buf()];
        if let Ok(entries) = std::fs::read_dir(data_dir) {
            let mut inside: Vec<PathBuf> = entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect();
            inside.sort();
            dirs.extend(inside);
        }
        StateFolders { dirs }
    }

    /// What is wrong with each folder that cannot take a write; empty when all can.
    /// Blocking (a file is made and dropped in each): call it off the async workers.
    pub fn problems(&self) -> Vec<String> {
        self.dirs
            .iter()
            .filter_map(|dir| writable(dir).err())
            .collect()
    }
}

/// Makes and drops an unnamed file in `dir` (`O_TMPFILE` where Linux has it): nothing
/// stays behind, and a folder that is gone or read-only fails.
fn writable(dir: &Path) -> Result<(), String> {
    tempfile::tempfile_in(dir)
        .map(drop)
        .map_err(|e| format!("data folder {}: cannot write: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_gone_is_named_and_one_in_place_is_not() {
        let data = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(data.path().join("events")).expect("mkdir");
        std::fs::write(data.path().join("a-file"), b"x").expect("write");
        let folders = StateFolders::of(data.path());
        assert!(folders.problems().is_empty(), "{:?}", folders.problems());
        // Nothing left behind by the probe.
        assert_eq!(
            std::fs::read_dir(data.path().join("events"))
                .unwrap()
                .count(),
            0
        );

        std::fs::remove_dir_all(data.path().join("events")).expect("rm");
        let problems = folders.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("events"), "{problems:?}");
    }
}
