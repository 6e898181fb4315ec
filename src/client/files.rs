//! The file API (`docs/files.md`): `PUT` an upload (a file, or with `tar` an archive
//! extracted into a directory), `GET` a download (a file streamed, a directory as a tar
//! stream) or a listing, for a session's kernel or its delegated child's.

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE};
use hyper::Method;

use super::{json_answer, one_piece, read_answer, Client, ClientError, RequestBody};
use crate::files::{ByteStream, Listing, Written};
use crate::wire::path;

/// Where a file call goes: a path (relative to the kernel's working directory; empty for the
/// directory itself) in a session's kernel, or in its delegated child's.
#[derive(Debug, Clone, Copy)]
pub struct FileTarget<'a> {
    /// The session whose kernel holds the file.
    pub session: &'a str,
    /// The session's delegated child, when its kernel is meant (`?child=`).
    pub child: Option<&'a str>,
    /// The path, as the caller wrote it (the server checks it).
    pub path: &'a str,
}

impl FileTarget<'_> {
    fn url(&self) -> String {
        path::files(self.session, self.path, self.child)
    }
}

/// What an upload sends.
pub enum Content {
    /// Bytes in hand (sent with their length).
    Bytes(Bytes),
    /// A stream, sent as it is read (a local file, a tar built on the fly).
    Stream(ByteStream),
}

/// A download's bytes; an error ([`ClientError::Read`]) ends it.
pub type Download = BoxStream<'static, Result<Bytes, ClientError>>;

/// What a `GET` found.
pub enum Fetched {
    /// A file: its bytes, and its size when the server gave it.
    File {
        /// Its size in bytes, from `Content-Length` when the server gave one.
        size: Option<u64>,
        /// The file's bytes as the server sends them.
        body: Download,
    },
    /// A directory, streamed as a tar (asked for with `tar`).
    Tar {
        /// The tar archive's bytes as the server sends them.
        body: Download,
    },
    /// A directory, listed.
    Listing(Listing),
}

impl Client {
    /// `PUT`s `content` at `target`: a file, or with `tar` an archive extracted into the
    /// directory at `target` (the session's kernel is started when it has none).
    pub async fn upload(
        &self,
        target: &FileTarget<'_>,
        tar: bool,
        content: Content,
    ) -> Result<Written, ClientError> {
        let content_type = if tar {
            "application/x-tar"
        } else {
            "application/octet-stream"
        };
        let body: RequestBody = match content {
            Content::Bytes(bytes) => one_piece(bytes),
            Content::Stream(stream) => StreamBody::new(stream.map_ok(Frame::data)).boxed_unsync(),
        };
        let response = self
            .send(
                Method::PUT,
                &target.url(),
                "application/json",
                Some((content_type, body)),
            )
            .await?;
        json_answer(response, "an upload's account").await
    }

    /// `GET`s `target`: a file's bytes, or a directory's listing (with `tar`, the directory
    /// as a tar stream). Dropping a body unread closes its connection.
    pub async fn download(
        &self,
        target: &FileTarget<'_>,
        tar: bool,
    ) -> Result<Fetched, ClientError> {
        let accept = if tar {
            "application/x-tar, application/octet-stream"
        } else {
            "application/json"
        };
        let response = self.send(Method::GET, &target.url(), accept, None).await?;
        let status = response.status();
        if !status.is_success() {
            let bytes = read_answer(response).await?;
            return Err(ClientError::refused(status, &bytes));
        }
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|v: &hyper::header::HeaderValue| v.to_str().ok())
                .map(str::to_owned)
        };
        let content_type = header(CONTENT_TYPE).unwrap_or_default();
        if content_type.starts_with("application/json") {
            return Ok(Fetched::Listing(json_answer(response, "a listing").await?));
        }
        let is_tar = content_type.starts_with("application/x-tar");
        let size = header(CONTENT_LENGTH).and_then(|v| v.parse::<u64>().ok());
        let body = response
            .into_body()
            .into_data_stream()
            .map_err(|e| ClientError::Read(Box::new(e)))
            .boxed();
        Ok(if is_tar {
            Fetched::Tar { body }
        } else {
            Fetched::File { size, body }
        })
    }
}
