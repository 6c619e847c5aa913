//! Files on the seam: the bytes of a file a platform sent a bot, as a stream.

use bytes::Bytes;

use crate::{ErrorKind, PlatformError};

/// The bytes of a file, read as they come (a 10 MB photo is never held whole unless asked
/// for with [`FileBody::read_all`]).
pub struct FileBody {
    /// Its MIME type, as the platform's download says.
    pub mime: Option<String>,
    /// Its length in bytes, when known before reading.
    pub len: Option<u64>,
    body: Body,
}

enum Body {
    Http(reqwest::Response),
    Bytes(Option<Bytes>),
}

impl std::fmt::Debug for FileBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileBody")
            .field("mime", &self.mime)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl FileBody {
    /// The body of a successful download (its `Content-Type` and `Content-Length` taken as
    /// the file's).
    pub fn from_response(resp: reqwest::Response) -> Self {
        let mime = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Self {
            mime,
            len: resp.content_length(),
            body: Body::Http(resp),
        }
    }

    /// Bytes already at hand.
    pub fn from_bytes(data: impl Into<Bytes>, mime: Option<String>) -> Self {
        let data = data.into();
        Self {
            mime,
            len: Some(data.len() as u64),
            body: Body::Bytes(Some(data)),
        }
    }

    /// The next chunk, `None` at the end.
    ///
    /// # Errors
    /// The download broke off (transient).
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, PlatformError> {
        match &mut self.body {
            Body::Bytes(b) => Ok(b.take()),
            Body::Http(r) => r.chunk().await.map_err(|e| {
                PlatformError::new(
                    ErrorKind::Transient,
                    "download",
                    format!("the file's download broke off: {}", e.without_url()),
                )
            }),
        }
    }

    /// Every byte, refusing a file over `max` bytes before or while it is read.
    ///
    /// # Errors
    /// `Rejected` (`too_large`) over `max`; as [`FileBody::chunk`].
    pub async fn read_all(mut self, max: u64) -> Result<Vec<u8>, PlatformError> {
        if let Some(n) = self.len.filter(|n| *n > max) {
            return Err(too_large(n, max));
        }
        let mut out =
            Vec::with_capacity(usize::try_from(self.len.unwrap_or(0).min(max)).unwrap_or(0));
        while let Some(c) = self.chunk().await? {
            if (out.len() + c.len()) as u64 > max {
                return Err(too_large((out.len() + c.len()) as u64, max));
            }
            out.extend_from_slice(&c);
        }
        Ok(out)
    }
}

/// A file's bytes as a request body, without copying them.
pub fn upload_body(f: &botfleet_core::Upload) -> reqwest::Body {
    reqwest::Body::from(f.data.clone())
}

/// A file as a multipart part with its name and MIME type, without copying its bytes.
///
/// # Errors
/// `Rejected` for a MIME type that does not parse.
pub fn upload_part(f: &botfleet_core::Upload) -> Result<reqwest::multipart::Part, PlatformError> {
    reqwest::multipart::Part::stream_with_length(upload_body(f), f.data.len() as u64)
        .file_name(f.name.clone())
        .mime_str(&f.mime)
        .map_err(|_| {
            PlatformError::new(
                ErrorKind::Rejected,
                "bad_mime",
                format!("the MIME type of {:?} does not parse", f.name),
            )
        })
}

/// The refusal of a file over the bound.
pub fn too_large(len: u64, max: u64) -> PlatformError {
    PlatformError::new(
        ErrorKind::Rejected,
        "too_large",
        format!("the file is {len} bytes or more, over the {max}-byte bound"),
    )
}

/// The refusal of a file a platform has no way to serve.
pub fn no_files() -> PlatformError {
    PlatformError::new(
        ErrorKind::Rejected,
        "unsupported",
        "this platform's mode serves no files",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_read_whole_within_the_bound_and_not_past_it() {
        let b = FileBody::from_bytes(vec![1u8; 10], Some("a/b".into()));
        assert_eq!(b.len, Some(10));
        assert_eq!(b.read_all(10).await.unwrap().len(), 10);
        let e = FileBody::from_bytes(vec![1u8; 11], None)
            .read_all(10)
            .await
            .unwrap_err();
        assert_eq!((e.kind(), e.reason()), (ErrorKind::Rejected, "too_large"));
    }
}
