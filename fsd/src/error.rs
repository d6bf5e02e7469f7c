//! The filesystem core's error type. Mapping to errno happens only at the FUSE
//! boundary (`fuse.rs`), so the core never deals in raw integers.

use crate::remote::RemoteError;
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("invalid argument")]
    Invalid,
    #[error("file name too long")]
    NameTooLong,
    #[error("file too large")]
    TooLarge,
    #[error("too many links")]
    TooManyLinks,
    #[error("operation not permitted")]
    NotPermitted,
    #[error("permission denied")]
    AccessDenied,
    #[error("no such attribute")]
    NoAttribute,
    #[error("attribute buffer too small")]
    Range,
    #[error("operation not supported")]
    NotSupported,
    /// lseek SEEK_DATA / SEEK_HOLE at or past end of file, or no data after it.
    #[error("no data or hole at or after this offset")]
    NoSuchOffset,
    #[error("remote memory is full")]
    NoSpace,
    /// Remote memory could not be reached or refused the access: the data involved
    /// is unavailable (EIO).
    #[error("remote I/O error: {0}")]
    Io(String),
}

impl From<RemoteError> for FsError {
    fn from(e: RemoteError) -> FsError {
        match e {
            RemoteError::NoSpace => FsError::NoSpace,
            other => FsError::Io(other.to_string()),
        }
    }
}

pub type FsResult<T> = Result<T, FsError>;
