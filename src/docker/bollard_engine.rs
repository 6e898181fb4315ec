//! [`Engine`] on the real Docker daemon, through bollard.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount as BollardMount, MountType,
    NetworkCreateRequest, VolumeCreateRequest,
};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, EventsOptionsBuilder, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, ListVolumesOptionsBuilder, RemoveContainerOptionsBuilder,
    RenameContainerOptionsBuilder, UploadToContainerOptionsBuilder, WaitContainerOptionsBuilder,
};
use bollard::Docker;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use super::{
    Attached, Chunk, ContainerInfo, ContainerSpec, Engine, EngineError, EngineEvent, ExecProcess,
    ExecSpec, Mount, NetworkSpec, TmpfsVolume, VolumeInfo,
};

/// The real engine. Cheap to clone; make one per tokio runtime.
#[derive(Clone, Debug)]
pub struct BollardEngine {
    pub(super) docker: Docker,
}

impl BollardEngine {
    /// Creates and starts an exec attached to its streams; returns the exec's id with them.
    async fn start_exec(
        &self,
        id: &str,
        spec: &ExecSpec,
    ) -> Result<(String, Attached), EngineError> {
        let options = bollard::exec::CreateExecOptions {
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(false),
            cmd: Some(spec.cmd.clone()),
            env: Some(spec.env.clone()),
            user: Some(spec.user.clone()),
            working_dir: Some(spec.working_dir.clone()),
            ..Default::default()
        };
        let created = self
            .docker
            .create_exec(id, options)
            .await
            .map_err(|e| map_err("exec create", id, e))?;
        let started = self
            .docker
            .start_exec(
                &created.id,
                Some(bollard::exec::StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: Some(64 * 1024),
                }),
            )
            .await
            .map_err(|e| map_err("exec start", id, e))?;
        let bollard::exec::StartExecResults::Attached { output, input } = started else {
            return Err(EngineError::Other {
                op: "exec start",
                target: id.to_string(),
                message: "the engine started the exec detached".into(),
            });
        };
        let output = chunks(output, "exec stream", id);
        Ok((created.id, Attached { output, input }))
    }

    /// Sends `signal` to the container's main process; a stopped or missing container is a
    /// success.
    async fn signal(&self, id: &str, signal: &str, op: &'static str) -> Result<(), EngineError> {
        let options = KillContainerOptionsBuilder::default()
            .signal(signal)
            .build();
        match self.docker.kill_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if matches!(status_of(&e), Some(404 | 409)) => Ok(()),
            Err(e) => Err(map_err(op, id, e)),
        }
    }

    /// Connects with Docker's defaults (`DOCKER_HOST`, else the local socket) and negotiates
    /// the API version once.
    pub async fn connect() -> Result<BollardEngine, EngineError> {
        let docker = Docker::connect_with_defaults().map_err(|e| unreachable("connect", e))?;
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| unreachable("connect", e))?;
        Ok(BollardEngine { docker })
    }

    /// The underlying client, for operations outside the kernel path (image builds).
    pub fn client(&self) -> &Docker {
        &self.docker
    }
}

fn unreachable(op: &'static str, e: BollardError) -> EngineError {
    EngineError::Unreachable {
        op,
        message: e.to_string(),
    }
}

/// Maps a bollard error to ours, telling "the engine said no" from "no engine".
pub(super) fn map_err(op: &'static str, target: &str, e: BollardError) -> EngineError {
    match e {
        BollardError::DockerResponseServerError {
            status_code,
            message,
        } => EngineError::Api {
            op,
            target: target.to_string(),
            status: status_code,
            message,
        },
        BollardError::SocketNotFoundError(_)
        | BollardError::HyperResponseError { .. }
        | BollardError::HyperLegacyError { .. }
        | BollardError::IOError { .. }
        | BollardError::HttpClientError { .. } => unreachable(op, e),
        other => EngineError::Other {
            op,
            target: target.to_string(),
            message: other.to_string(),
        },
    }
}

fn status_of(e: &BollardError) -> Option<u16> {
    match e {
        BollardError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

fn label_filters(labels: &[String]) -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_string(), labels.to_vec())])
}

fn to_btree(labels: Option<HashMap<String, String>>) -> BTreeMap<String, String> {
    labels.unwrap_or_default().into_iter().collect()
}

#[async_trait]
impl Engine for BollardEngine {
    async fn ping(&self) -> Result<(), EngineError> {
        self.docker
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| unreachable("ping", e))
    }

    async fn runtimes(&self) -> Result<Vec<String>, EngineError> {
        let info = self
            .docker
            .info()
            .await
            .map_err(|e| map_err("info", "engine", e))?;
        Ok(info.runtimes.unwrap_or_default().into_keys().collect())
    }

    async fn image_exists(&self, image: &str) -> Result<bool, EngineError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) if status_of(&e) == Some(404) => Ok(false),
            Err(e) => Err(map_err("inspect image", image, e)),
        }
    }

    async fn create_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        tmpfs: Option<TmpfsVolume>,
    ) -> Result<(), EngineError> {
        let driver_opts = tmpfs.map(|t| {
            HashMap::from([
                ("type".to_string(), "tmpfs".to_string()),
                ("device".to_string(), "tmpfs".to_string()),
                (
                    "o".to_string(),
                    format!(
                        "size={},uid={},gid={},mode=0700,nosuid,nodev",
                        t.size_bytes, t.uid, t.gid
                    ),
                ),
            ])
        });
        let request = VolumeCreateRequest {
            name: Some(name.to_string()),
            driver: Some("local".into()),
            driver_opts,
            labels: Some(labels.clone().into_iter().collect()),
            ..Default::default()
        };
        self.docker
            .create_volume(request)
            .await
            .map(|_| ())
            .map_err(|e| map_err("create volume", name, e))
    }

    async fn create_device_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        device: &str,
        fstype: &str,
    ) -> Result<(), EngineError> {
        let request = VolumeCreateRequest {
            name: Some(name.to_string()),
            driver: Some("local".into()),
            driver_opts: Some(HashMap::from([
                ("type".to_string(), fstype.to_string()),
                ("device".to_string(), device.to_string()),
                // `discard`: blocks a cell frees go back to the host (the loop device punches
                // them out of the image; docs/workspaces.md, "Quota").
                ("o".to_string(), "nosuid,nodev,discard".to_string()),
            ])),
            labels: Some(labels.clone().into_iter().collect()),
            ..Default::default()
        };
        self.docker
            .create_volume(request)
            .await
            .map(|_| ())
            .map_err(|e| map_err("create volume", name, e))
    }

    async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        match self
            .docker
            .remove_volume(name, None::<bollard::query_parameters::RemoveVolumeOptions>)
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) if status_of(&e) == Some(409) => Err(EngineError::VolumeInUse {
                name: name.to_string(),
            }),
            Err(e) => Err(map_err("remove volume", name, e)),
        }
    }

    async fn list_volumes(
        &self,
        labels: &[String],
        dangling: bool,
    ) -> Result<Vec<VolumeInfo>, EngineError> {
        let mut filters = label_filters(labels);
        if dangling {
            filters.insert("dangling".into(), vec!["true".into()]);
        }
        let options = ListVolumesOptionsBuilder::default()
            .filters(&filters)
            .build();
        let response = self
            .docker
            .list_volumes(Some(options))
            .await
            .map_err(|e| map_err("list volumes", "", e))?;
        Ok(response
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| VolumeInfo {
                name: v.name,
                labels: v.labels.into_iter().collect(),
            })
            .collect())
    }

    async fn create_container(&self, spec: &ContainerSpec) -> Result<String, EngineError> {
        let sandbox = &spec.sandbox;
        let mounts = spec
            .mounts
            .iter()
            .map(|m| match m {
                Mount::Volume { name, target } => BollardMount {
                    typ: Some(MountType::VOLUME),
                    source: Some(name.clone()),
                    target: Some(target.clone()),
                    ..Default::default()
                },
                Mount::Bind {
                    source,
                    target,
                    read_only,
                } => BollardMount {
                    typ: Some(MountType::BIND),
                    source: Some(source.clone()),
                    target: Some(target.clone()),
                    read_only: Some(*read_only),
                    ..Default::default()
                },
            })
            .collect();
        let host_config = HostConfig {
            runtime: Some(sandbox.runtime.name().into()),
            network_mode: Some(sandbox.network_mode.clone()),
            cap_drop: Some(vec!["ALL".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            init: Some(true),
            readonly_rootfs: Some(sandbox.readonly_rootfs),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_string(),
                sandbox.tmp_mount_options(),
            )])),
            memory: Some(sandbox.memory_bytes),
            memory_swap: Some(sandbox.memory_bytes),
            nano_cpus: Some(sandbox.nano_cpus),
            pids_limit: Some(sandbox.pids_limit),
            // The daemon removes the container when it exits, so a kernel whose host vanished
            // disappears by itself once the runner sees stdin close (unless it is kept for
            // hibernation: then kernelbox, or the watchdog, removes it).
            auto_remove: Some(!sandbox.keep_stopped),
            // Cell output, code and tool results must not pile up in plaintext on the host.
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".into()),
                config: None,
            }),
            mounts: Some(mounts),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(spec.cmd.clone()),
            env: Some(spec.env.clone()),
            user: Some(spec.user.clone()),
            working_dir: Some(spec.working_dir.clone()),
            labels: Some(spec.labels.clone().into_iter().collect()),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(true),
            stdin_once: Some(true),
            tty: Some(false),
            network_disabled: Some(sandbox.network_mode == "none"),
            host_config: Some(host_config),
            ..Default::default()
        };
        match self.docker.create_container(None, body).await {
            Ok(response) => Ok(response.id),
            Err(e) if status_of(&e) == Some(404) => Err(EngineError::ImageMissing {
                image: spec.image.clone(),
            }),
            Err(e) => Err(map_err("create container", &spec.image, e)),
        }
    }

    async fn create_network(&self, spec: &NetworkSpec) -> Result<super::NetworkAddrs, EngineError> {
        let request = NetworkCreateRequest {
            name: spec.name.clone(),
            driver: Some("bridge".into()),
            internal: Some(true),
            labels: Some(spec.labels.clone().into_iter().collect()),
            options: Some(HashMap::from([
                (
                    "com.docker.network.bridge.enable_icc".to_string(),
                    "false".to_string(),
                ),
                (
                    "com.docker.network.bridge.name".to_string(),
                    spec.bridge.clone(),
                ),
            ])),
            ..Default::default()
        };
        self.docker
            .create_network(request)
            .await
            .map_err(|e| map_err("create network", &spec.name, e))?;
        let network = self
            .docker
            .inspect_network(&spec.name, None)
            .await
            .map_err(|e| map_err("inspect network", &spec.name, e))?;
        // The IPv4 configuration: its gateway and subnet (`172.18.0.0/16`).
        network
            .ipam
            .and_then(|ipam| ipam.config)
            .into_iter()
            .flatten()
            .find_map(|c| {
                let gateway = c.gateway?.parse::<std::net::IpAddr>().ok()?;
                let (base, len) = c
                    .subnet?
                    .split_once('/')
                    .map(|(b, l)| (b.to_string(), l.to_string()))?;
                let subnet = (
                    base.parse::<std::net::IpAddr>().ok()?,
                    len.parse::<u8>().ok()?,
                );
                gateway
                    .is_ipv4()
                    .then_some(super::NetworkAddrs { gateway, subnet })
            })
            .ok_or_else(|| EngineError::Other {
                op: "inspect network",
                target: spec.name.clone(),
                message: "the network has no IPv4 gateway and subnet".into(),
            })
    }

    async fn remove_network(&self, name: &str) -> Result<(), EngineError> {
        match self.docker.remove_network(name).await {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(map_err("remove network", name, e)),
        }
    }

    async fn list_networks(&self, labels: &[String]) -> Result<Vec<String>, EngineError> {
        let options = bollard::query_parameters::ListNetworksOptionsBuilder::default()
            .filters(&label_filters(labels))
            .build();
        let networks = self
            .docker
            .list_networks(Some(options))
            .await
            .map_err(|e| map_err("list networks", "", e))?;
        Ok(networks.into_iter().filter_map(|n| n.name).collect())
    }

    async fn container_address(
        &self,
        id: &str,
        network: &str,
    ) -> Result<Option<std::net::IpAddr>, EngineError> {
        let info = self
            .docker
            .inspect_container(id, None)
            .await
            .map_err(|e| map_err("inspect container", id, e))?;
        Ok(info
            .network_settings
            .and_then(|s| s.networks)
            .and_then(|mut n| n.remove(network))
            .and_then(|e| e.ip_address)
            .and_then(|ip| ip.parse().ok()))
    }

    async fn attach(&self, id: &str) -> Result<Attached, EngineError> {
        let options = AttachContainerOptionsBuilder::default()
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .stream(true)
            .logs(false)
            .build();
        let results = self
            .docker
            .attach_container(id, Some(options))
            .await
            .map_err(|e| map_err("attach", id, e))?;
        let output = chunks(results.output, "attach stream", id);
        Ok(Attached {
            output,
            input: results.input,
        })
    }

    async fn start(&self, id: &str) -> Result<(), EngineError> {
        self.docker
            .start_container(id, None)
            .await
            .map_err(|e| map_err("start", id, e))
    }

    async fn checkpoint(
        &self,
        id: &str,
        name: &str,
        dir: &std::path::Path,
    ) -> Result<(), EngineError> {
        self.checkpoint_into(id, name, dir).await
    }

    async fn checkpoint_running(
        &self,
        id: &str,
        name: &str,
        dir: &std::path::Path,
    ) -> Result<(), EngineError> {
        self.checkpoint_leaving_running(id, name, dir).await
    }

    async fn start_from_checkpoint(
        &self,
        id: &str,
        name: &str,
        dir: &std::path::Path,
    ) -> Result<(), EngineError> {
        self.start_checkpointed(id, name, dir).await
    }

    async fn kill(&self, id: &str) -> Result<(), EngineError> {
        self.signal(id, "SIGKILL", "kill").await
    }

    async fn interrupt(&self, id: &str) -> Result<(), EngineError> {
        self.signal(id, "SIGINT", "interrupt").await
    }

    async fn remove_container(&self, id: &str) -> Result<(), EngineError> {
        let options = RemoveContainerOptionsBuilder::default().force(true).build();
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) if status_of(&e) == Some(409) => {
                // Auto-removal is already under way: wait until the container is gone, so the
                // caller can remove its volume next.
                let options = WaitContainerOptionsBuilder::default()
                    .condition("removed")
                    .build();
                let mut wait = self.docker.wait_container(id, Some(options));
                let deadline = tokio::time::sleep(std::time::Duration::from_secs(30));
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        item = wait.next() => match item {
                            None => return Ok(()),
                            Some(Err(e)) if status_of(&e).is_some_and(|s| s != 404 && s != 409) => {
                                return Err(map_err("remove container", id, e));
                            }
                            Some(_) => {}
                        },
                        _ = &mut deadline => {
                            return Err(EngineError::Other {
                                op: "remove container",
                                target: id.to_string(),
                                message: "removal did not finish within 30s".into(),
                            });
                        }
                    }
                }
            }
            Err(e) => Err(map_err("remove container", id, e)),
        }
    }

    async fn rename_container(&self, id: &str, name: &str) -> Result<(), EngineError> {
        let options = RenameContainerOptionsBuilder::default().name(name).build();
        match self.docker.rename_container(id, options).await {
            Ok(()) => Ok(()),
            Err(e) if status_of(&e) == Some(404) => Ok(()),
            Err(e) => Err(map_err("rename container", id, e)),
        }
    }

    async fn list_containers(&self, labels: &[String]) -> Result<Vec<ContainerInfo>, EngineError> {
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&label_filters(labels))
            .build();
        let list = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| map_err("list containers", "", e))?;
        Ok(list
            .into_iter()
            .map(|c| ContainerInfo {
                id: c.id.unwrap_or_default(),
                state: c
                    .state
                    .map(|s| s.to_string())
                    .unwrap_or_default()
                    .to_lowercase(),
                labels: to_btree(c.labels),
                created: c.created.unwrap_or_default(),
                name: c
                    .names
                    .and_then(|n| n.into_iter().next())
                    .map(|n| n.trim_start_matches('/').to_string())
                    .unwrap_or_default(),
            })
            .collect())
    }

    async fn upload(&self, id: &str, dir: &str, tar: Bytes) -> Result<(), EngineError> {
        let options = UploadToContainerOptionsBuilder::default().path(dir).build();
        self.docker
            .upload_to_container(id, Some(options), bollard::body_full(tar))
            .await
            .map_err(|e| map_err("upload", id, e))
    }

    async fn exec(&self, id: &str, spec: &ExecSpec) -> Result<Attached, EngineError> {
        Ok(self.start_exec(id, spec).await?.1)
    }

    async fn exec_process(&self, id: &str, spec: &ExecSpec) -> Result<ExecProcess, EngineError> {
        let (exec, streams) = self.start_exec(id, spec).await?;
        let docker = self.docker.clone();
        let target = id.to_string();
        let exit_code = Box::pin(async move {
            let inspected = docker
                .inspect_exec(&exec)
                .await
                .map_err(|e| map_err("exec inspect", &target, e))?;
            Ok(if inspected.running == Some(true) {
                None
            } else {
                inspected.exit_code
            })
        });
        Ok(ExecProcess { streams, exit_code })
    }

    fn events(
        &self,
        labels: &[String],
        since: Option<i64>,
    ) -> BoxStream<'static, Result<EngineEvent, EngineError>> {
        let mut filters = label_filters(labels);
        filters.insert("type".into(), vec!["container".into()]);
        let mut options = EventsOptionsBuilder::default().filters(&filters);
        if let Some(since) = since {
            options = options.since(&since.to_string());
        }
        let options = options.build();
        self.docker
            .events(Some(options))
            .map_err(|e| map_err("events", "", e))
            .try_filter_map(|event| async move {
                let Some(actor) = event.actor else {
                    return Ok(None);
                };
                let Some(id) = actor.id else { return Ok(None) };
                let attributes = actor.attributes.unwrap_or_default();
                Ok(Some(EngineEvent {
                    id,
                    action: event.action.unwrap_or_default(),
                    exit_code: attributes.get("exitCode").and_then(|c| c.parse().ok()),
                    signal: attributes.get("signal").and_then(|c| c.parse().ok()),
                }))
            })
            .boxed()
    }
}

/// An attached container's or exec's output as [`Chunk`]s (stdin echoes dropped), its errors
/// naming `op` on `id`.
fn chunks(
    output: impl futures::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send + 'static,
    op: &'static str,
    id: &str,
) -> BoxStream<'static, Result<Chunk, EngineError>> {
    let target = id.to_string();
    output
        .try_filter_map(|item| async move {
            Ok(match item {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    Some(Chunk::Stdout(message))
                }
                LogOutput::StdErr { message } => Some(Chunk::Stderr(message)),
                LogOutput::StdIn { .. } => None,
            })
        })
        .map_err(move |e| map_err(op, &target, e))
        .boxed()
}
