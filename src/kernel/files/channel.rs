//! The file channel: the Unix socket a helper's frames travel on instead of the engine's exec
//! streams (docs/files.md "Files in and out of a kernel", "The file channel"). The host listens on a
//! socket with an unguessable name in a directory it owns (mode 0711: kernels can reach a
//! socket whose name they know, never list the directory), bind-mounted read-only into every
//! kernel at [`IN_KERNEL_DIR`]; a helper started with that name and a token connects and
//! presents the token, and the socket is unlinked as soon as it is accepted. A kernel made
//! without the directory (an engine on another host) keeps the exec streams.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::PollNext;
use futures::StreamExt;
use rand::Rng;
use tokio::io::AsyncReadExt;
use tokio::net::unix::OwnedReadHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::io::ReaderStream;

use super::frame::{breach, Output};
use crate::docker::{Chunk, EngineError};
use crate::files::TransferError;

/// Where the directory appears inside a kernel.
pub(in crate::kernel) const IN_KERNEL_DIR: &str = "/run/kernelbox";

/// Connections a listener takes before one presents the token: a cell that knows its own
/// helper's socket (it is the same user) can knock on it, never hold a transfer forever.
const MAX_KNOCKS: usize = 8;

/// How long a connection has to present the token.
const KNOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest directory path: a socket's path (the directory, `/`, 32 hex digits and `.sock`)
/// must fit a Unix socket address (108 bytes).
const MAX_DIR_LEN: usize = 64;

/// Age past which a socket left in the directory is an earlier process's.
const STALE_SOCKET: Duration = Duration::from_secs(60);

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 256 * 1024;

/// Makes `dir` ready to hold the channels' sockets: created if missing, a directory this
/// process owns (not a symlink) that nobody else may write to, mode 0711; sockets an earlier
/// process left are removed (a socket lives for a helper's start only: one older than a
/// minute is nobody's).
pub(crate) fn prepare_dir(dir: &Path) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    let text = dir.as_os_str().len();
    if !dir.is_absolute() || text > MAX_DIR_LEN {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("must be an absolute path of at most {MAX_DIR_LEN} bytes"),
        ));
    }
    std::fs::create_dir_all(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a directory"));
    }
    let me = crate::config::effective_uid();
    if Some(meta.uid()) != me {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            format!("owned by uid {}, not this process's", meta.uid()),
        ));
    }
    // A directory others may write to (`/tmp`) is shared, not this server's to take over.
    if meta.permissions().mode() & 0o1022 != 0 {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            "writable by others (group, world or sticky): name a directory of its own",
        ));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    let now = std::time::SystemTime::now();
    for entry in std::fs::read_dir(dir)?.flatten() {
        let path = entry.path();
        let old = std::fs::symlink_metadata(&path)
            .and_then(|m| m.modified())
            .is_ok_and(|at| now.duration_since(at).unwrap_or_default() > STALE_SOCKET);
        if path.extension().is_some_and(|e| e == "sock") && old {
            let _ = std::fs::remove_file(&path);
        }
    }
    Ok(())
}

/// Whether `error`, from creating a container, is the engine refusing to bind-mount `dir`
/// because it does not exist where the engine runs.
pub(in crate::kernel) fn mount_refused(error: &EngineError, dir: &Path) -> bool {
    matches!(error, EngineError::Api { status: 400, message, .. }
        if message.contains("bind source path does not exist")
            && message.contains(&*dir.to_string_lossy()))
}

/// A socket waiting for one helper; unlinked when dropped.
pub(super) struct Rendezvous {
    listener: UnixListener,
    path: PathBuf,
    name: String,
    token: String,
}

impl Rendezvous {
    /// Listens on a new socket in `dir`.
    pub(super) fn open(dir: &Path) -> Result<Rendezvous, TransferError> {
        let mut rng = rand::rng();
        let name = format!("{}.sock", hex::encode(rng.random::<[u8; 16]>()));
        let token = hex::encode(rng.random::<[u8; 16]>());
        let path = dir.join(&name);
        let failed = |e: std::io::Error| {
            TransferError::Helper(format!("listening on {}: {e}", path.display()))
        };
        let listener = UnixListener::bind(&path).map_err(failed)?;
        let rendezvous = Rendezvous {
            listener,
            path: path.clone(),
            name,
            token,
        };
        // The kernel's user connects (its uid may differ from every host user's). The token,
        // which only the helper's stdin carries, keeps everyone else out; the name is no
        // secret from host users (/proc/net/unix lists it), and the peer check drops
        // connections from outside the kernel before they count.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).map_err(failed)?;
        Ok(rendezvous)
    }

    /// What the helper is told on its stdin (never its command line, which any host user
    /// can read in /proc): the socket as the kernel sees it and the token, on one line.
    pub(super) fn invitation(&self) -> String {
        format!("{IN_KERNEL_DIR}/{} {}\n", self.name, self.token)
    }

    /// The first connection from `kernel` that presents the token, within `deadline`.
    /// Connections from elsewhere are dropped unread; at most [`MAX_KNOCKS`] from the kernel
    /// are tried. The socket is unlinked either way.
    pub(super) async fn accept(
        self,
        kernel: &Peer<'_>,
        deadline: Duration,
    ) -> Result<UnixStream, TransferError> {
        let knocks = async {
            let mut knocks = 0;
            while knocks < MAX_KNOCKS {
                let (mut stream, _) =
                    self.listener.accept().await.map_err(|e| {
                        TransferError::Helper(format!("accepting its channel: {e}"))
                    })?;
                if !kernel.is(&stream).await {
                    continue;
                }
                knocks += 1;
                let mut token = [0u8; 32];
                let presented =
                    tokio::time::timeout(KNOCK_TIMEOUT, stream.read_exact(&mut token)).await;
                if matches!(presented, Ok(Ok(_))) && same(&token, self.token.as_bytes()) {
                    return Ok(stream);
                }
            }
            Err(breach("its channel was knocked on without the token"))
        };
        match tokio::time::timeout(deadline, knocks).await {
            Ok(result) => result,
            Err(_) => Err(TransferError::Stalled(deadline)),
        }
    }
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Who may knock on a channel: the kernel its helper runs in.
pub(super) enum Peer<'a> {
    /// A process of this kernel.
    Kernel {
        /// Its container's full id.
        container: &'a str,
        /// The uid it runs as (`None` when not numeric).
        uid: Option<u32>,
    },
    /// Any process (the unit tests knock from their own).
    #[cfg(test)]
    Anyone,
}

impl Peer<'_> {
    /// Whether `stream`'s peer (its credentials when it connected) is a process of this
    /// kernel: when its pid is visible here, one whose cgroups name the container
    /// ([`in_container`]); when it is not (this process runs in another pid namespace, as the
    /// compose deployment's server), one running as the kernel's uid, which all kernels share:
    /// a weaker check, the token being what tells kernels apart then.
    async fn is(&self, stream: &UnixStream) -> bool {
        let (container, uid) = match self {
            Peer::Kernel { container, uid } => (*container, *uid),
            #[cfg(test)]
            Peer::Anyone => return true,
        };
        let Ok(cred) = stream.peer_cred() else {
            return false;
        };
        match cred.pid() {
            Some(pid) if pid > 0 => {
                // /proc reads can wait on the kernel's cgroup lock: off the async threads.
                let read = tokio::task::spawn_blocking(move || {
                    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                })
                .await;
                matches!(read, Ok(Ok(cgroups)) if in_container(&cgroups, container))
            }
            _ => uid == Some(cred.uid()),
        }
    }
}

/// Whether a `/proc/PID/cgroup` text puts the process in the container `id`: some cgroup's
/// path has a component that is the id (cgroupfs: `/docker/ID`) or `docker-ID.scope`
/// (systemd), outside a user's own tree (`user.slice`, where a user can name a scope as it
/// likes).
fn in_container(cgroups: &str, id: &str) -> bool {
    if id.is_empty() {
        return false;
    }
    let scope = format!("docker-{id}.scope");
    cgroups.lines().any(|line| {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        let parts: Vec<&str> = path.split('/').collect();
        !parts.contains(&"user.slice") && parts.iter().any(|c| *c == id || *c == scope)
    })
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A helper's output once its channel is the socket: the socket's bytes as its stdout, and
/// from the exec only stderr (a byte on the exec's stdout is a breach: nothing goes there),
/// the exec's read first whenever it has something.
pub(super) fn output(socket: OwnedReadHalf, exec: Output) -> Output {
    let socket = ReaderStream::with_capacity(socket, READ_CHUNK).map(|read| {
        read.map(Chunk::Stdout).map_err(|e| {
            TransferError::Engine(EngineError::Other {
                op: "file channel",
                target: "helper".into(),
                message: e.to_string(),
            })
        })
    });
    let exec = exec.map(|chunk| match chunk {
        Ok(Chunk::Stdout(bytes)) if !bytes.is_empty() => Err(breach(
            "it wrote on its stdout, which carries nothing once its channel is the socket",
        )),
        Ok(Chunk::Stdout(_)) => Ok(Chunk::Stdout(Bytes::new())),
        other => other,
    });
    // The exec's side first: a byte it holds fails the transfer before the socket's first
    // bytes can start a reply (it carries only stderr otherwise, which a helper writes little).
    futures::stream::select_with_strategy(exec, socket, |_: &mut ()| PollNext::Left).boxed()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    use super::{prepare_dir, Peer, Rendezvous};
    use crate::files::TransferError;

    fn dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kb-chan-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        prepare_dir(&dir).unwrap();
        dir
    }

    /// The socket path of `r` on the host, and its token, from its invitation.
    fn invited(dir: &std::path::Path, r: &Rendezvous) -> (std::path::PathBuf, String) {
        let line = r.invitation();
        let (path, token) = line.trim_end().split_once(' ').unwrap();
        (
            dir.join(path.rsplit('/').next().unwrap()),
            token.to_string(),
        )
    }

    /// `n` connections to `path`, each having sent `says`, kept open.
    async fn knock(path: &std::path::Path, says: &[u8], n: usize) -> Vec<UnixStream> {
        let mut knocks = Vec::new();
        for _ in 0..n {
            let mut k = UnixStream::connect(path).await.unwrap();
            k.write_all(says).await.unwrap();
            knocks.push(k);
        }
        knocks
    }

    #[tokio::test]
    async fn only_a_connection_presenting_the_token_is_accepted_and_the_socket_goes() {
        let dir = dir("token");
        let r = Rendezvous::open(&dir).unwrap();
        let (path, token) = invited(&dir, &r);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&dir).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o711, "the directory must not be listable");
        // A knock with a wrong token, one that says nothing (cut), then the helper.
        let mut wrong = UnixStream::connect(&path).await.unwrap();
        wrong.write_all(&[b'0'; 32]).await.unwrap();
        drop(UnixStream::connect(&path).await.unwrap());
        let mut right = UnixStream::connect(&path).await.unwrap();
        right.write_all(token.as_bytes()).await.unwrap();
        right.write_all(b"hello").await.unwrap();
        let mut accepted = r
            .accept(&Peer::Anyone, Duration::from_secs(5))
            .await
            .unwrap();
        let mut got = [0u8; 5];
        accepted.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        assert!(!path.exists(), "the socket is unlinked once accepted");
        drop(wrong);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_channel_knocked_on_without_the_token_is_refused_after_a_bounded_number_of_tries() {
        let dir = dir("knocks");
        let r = Rendezvous::open(&dir).unwrap();
        let (path, _) = invited(&dir, &r);
        let _knocks = knock(&path, &[b'x'; 32], 20).await;
        let error = r
            .accept(&Peer::Anyone, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(error.to_string().contains("without the token"), "{error}");
        assert!(!path.exists(), "the socket is unlinked when refused");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A process outside the kernel's container (a host user who learnt the name and the
    /// token) is never handed the channel, whatever its uid.
    #[tokio::test]
    async fn connections_from_outside_the_kernel_are_never_handed_the_channel_even_with_the_token()
    {
        let dir = dir("outsider");
        let r = Rendezvous::open(&dir).unwrap();
        let (path, token) = invited(&dir, &r);
        let _outsiders = knock(&path, token.as_bytes(), 20).await;
        // This process's pid is visible and its cgroups do not name the container; its uid
        // is the kernel's, which must not matter then.
        let elsewhere = Peer::Kernel {
            container: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            uid: crate::config::effective_uid(),
        };
        let error = r
            .accept(&elsewhere, Duration::from_millis(500))
            .await
            .unwrap_err();
        assert!(matches!(error, TransferError::Stalled(_)), "{error}");
        assert!(!path.exists(), "the socket is unlinked when given up");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_process_is_in_the_container_only_when_a_cgroup_path_names_it_outside_user_trees() {
        let id = "508badf518f84358476e2be9a780cbee68c64beb02992506649586b15d66870d";
        let yes = [
            format!("4:memory:/docker/{id}\n0::/docker/{id}\n"),
            format!("0::/system.slice/docker-{id}.scope\n"),
            format!("0::/../docker-{id}.scope\n"),
            format!("0::/kubepods/besteffort/pod1/{id}\n"),
        ];
        let no = [
            "0::/\n".to_string(),
            "9:name=systemd:/\n0::/user.slice/user-1000.slice/session-3.scope\n".to_string(),
            format!(
                "0::/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{id}.scope\n"
            ),
            format!("0::/docker/{id}x\n"),
            format!("0::/docker/x{id}\n"),
            format!("0::/docker/{}\n", &id[..63]),
        ];
        for text in &yes {
            assert!(super::in_container(text, id), "{text}");
        }
        for text in &no {
            assert!(!super::in_container(text, id), "{text}");
        }
        assert!(
            !super::in_container("0::/docker/\n", ""),
            "an empty id names nothing"
        );
    }

    #[test]
    fn a_directory_owned_by_someone_else_shared_or_a_symlink_is_refused() {
        let base = dir("owner");
        let link = base.join("link");
        std::os::unix::fs::symlink("/tmp", &link).unwrap();
        assert!(prepare_dir(&link).is_err(), "a symlink was accepted");
        assert!(prepare_dir(std::path::Path::new("relative")).is_err());
        let shared = base.join("shared");
        std::fs::create_dir(&shared).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let error = prepare_dir(&shared).unwrap_err();
        assert!(error.to_string().contains("writable by others"), "{error}");
        let other = base.join("other");
        std::fs::create_dir(&other).unwrap();
        // Only root can give a directory away; as anyone else this half has nothing to test.
        if std::os::unix::fs::chown(&other, Some(12345), None).is_ok() {
            let error = prepare_dir(&other).unwrap_err();
            assert!(error.to_string().contains("owned by uid 12345"), "{error}");
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}
