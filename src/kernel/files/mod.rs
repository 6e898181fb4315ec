//! The file transport: `runner/file_helper.py` run inside the kernel's container with the
//! engine's exec API, as the kernel's user, in its working directory and cgroup
//! (docs/architecture.md "File transport"). A helper serves requests one after another: the
//! kernel keeps one resident, started by the first file operation, reused by the next ones
//! and ended after [`Config::files.helper_idle`](crate::config::FileTransfer::helper_idle) without use
//! or when the kernel goes; a transfer that finds it busy runs on a one-shot helper. Its
//! frames travel on its channel: a Unix socket the host listens on (`channel.rs`), or, in a
//! kernel made without the channels' directory, the exec's stdin and stdout.
//!
//! Framing: a request frame in (a 4-byte length and its JSON), then for an upload, once the
//! helper acknowledged it, length-prefixed frames and a zero frame to commit; out, frames of
//! a kind byte and a 4-byte length: `A` (send the upload), `H` (a read's JSON header), `D`
//! (data) and `S`, the status that ends every request. The host trusts none of it: every read
//! from the helper and every write to it must progress within [`FILE_IDLE_TIMEOUT`], the
//! header and the status are size-bounded, a file's announced size is enforced, and the host
//! holds at most one chunk of a transfer at a time. A helper is reused only after an
//! exchange that ended with an ok status exactly where the framing puts it; anything else
//! (an error, a deadline, a protocol doubt, a download dropped mid-way) drops it, and the
//! next transfer starts a fresh one.
//!
//! | file | what |
//! |---|---|
//! | `channel.rs` | the Unix socket a helper's frames travel on instead of the exec streams, in the host directory bind-mounted into kernels, and its preparation |
//! | `frame.rs` | what a helper writes: its frames (`Frame`, `Status`), read whole and bounded from a stream that stays open (`Reader`), and its stderr |
//! | `helper.rs` | a running helper (`Helper`), the kernel's resident one (`Resident`), and the lease a transfer holds on a helper, which gives a clean one back |
//! | `write.rs` | uploads (`Kernel::write_file`): the body as gathered, vectored frames |
//! | `read.rs` | downloads and listings (`Kernel::read_file`), a download's byte stream and its cut when the kernel goes |
//! | `mod.rs` | the step deadline and the operations answered by a status alone: removal, stat, mkdir, move (`Kernel::remove_file`, `Kernel::manage_file`) |

mod channel;
pub(crate) mod frame;
mod helper;
mod read;
mod write;

use std::time::Duration;

use super::Kernel;
use crate::files::{FileOp, FileOpDone, FilePath, TransferError};
use frame::{breach, Frame};

pub(crate) use channel::prepare_dir as prepare_socket_dir;
pub(super) use channel::{mount_refused, IN_KERNEL_DIR as SOCKET_DIR_IN_KERNEL};
pub(super) use helper::Resident;

/// How long any one step of a transfer (a chunk from the client, a write to the helper, a
/// chunk from the helper) may take before the transfer is abandoned.
const FILE_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

impl Kernel {
    /// Removes a file or a directory tree (a symlink itself, never its target).
    pub(crate) async fn remove_file(&self, path: &FilePath) -> Result<(), TransferError> {
        self.status_op("remove", path, None).await.map(drop)
    }

    /// Runs `op` on `path` (`runner/file_helper.py`'s `stat`, `mkdir`, `move`).
    pub(crate) async fn manage_file(
        &self,
        path: &FilePath,
        op: &FileOp,
    ) -> Result<FileOpDone, TransferError> {
        match op {
            FileOp::Stat => {
                let status = self.status_op("stat", path, None).await?;
                status
                    .entry
                    .map(FileOpDone::Entry)
                    .ok_or_else(|| breach("a stat without its entry"))
            }
            FileOp::MakeDir => {
                let status = self.status_op("mkdir", path, None).await?;
                Ok(FileOpDone::Created(status.created.unwrap_or(false)))
            }
            FileOp::Move(to) => {
                self.status_op("move", path, Some(to)).await?;
                Ok(FileOpDone::Moved)
            }
        }
    }

    async fn status_op(
        &self,
        op: &str,
        path: &FilePath,
        to: Option<&FilePath>,
    ) -> Result<frame::Status, TransferError> {
        let (mut lease, first) = self.open_to(op, path, to).await?;
        match first {
            Frame::Status(status) => {
                let status = status.result()?;
                lease.clean = true;
                Ok(status)
            }
            _ => Err(breach("a frame other than the status")),
        }
    }
}
