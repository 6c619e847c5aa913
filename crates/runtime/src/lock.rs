//! The instance lock of the embedded mode: one worker per database file.

use std::{fs::File, path::PathBuf};

/// Holds an exclusive lock on `<database>.lock` while alive (released by the OS even on
/// `kill -9`).
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
    path: PathBuf,
}

impl InstanceLock {
    /// Takes the lock beside the SQLite database at `db_path`.
    ///
    /// # Errors
    /// A message saying another worker holds it, or why the file cannot be opened.
    pub fn acquire(db_path: &std::path::Path) -> Result<Self, String> {
        let mut path = db_path.as_os_str().to_owned();
        path.push(".lock");
        let path = PathBuf::from(path);
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("cannot open lock file {}: {e}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file, path }),
            Err(std::fs::TryLockError::WouldBlock) => Err(format!(
                "another botfleet worker is running on this database (lock {} is held); \
                 stop it first, or run a fleet with --redis-url",
                path.display()
            )),
            Err(std::fs::TryLockError::Error(e)) => {
                Err(format!("cannot lock {}: {e}", path.display()))
            }
        }
    }

    /// The lock file's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}
