//! The process's file descriptors (`docs/reliability.md`, "Descriptors"): the soft limit
//! (`RLIMIT_NOFILE`) is raised to the hard one at start, and the server's connection totals
//! (the API's `--max-connections`, the egress proxy's total) are kept well below it, so that no
//! tenant's connections can take the descriptors another tenant's API calls need.

/// Descriptors kept for everything that is not a connection the server counts: the engine's
/// connections, the catalog, the log and audit files, workspace images, listeners.
pub const RESERVED_DESCRIPTORS: u64 = 256;

/// Descriptors kept for each kernel the server may run (`--max-kernels`): its streams and
/// file transfers.
pub const DESCRIPTORS_PER_KERNEL: u64 = 4;

/// Descriptors one egress proxy connection uses: the kernel's socket and the destination's.
pub const DESCRIPTORS_PER_EGRESS_CONNECTION: u64 = 2;

/// Fewer descriptors than this left for connections after the reserve: the server does not
/// start.
pub const MIN_CONNECTION_DESCRIPTORS: u64 = 64;

/// The descriptor limit cannot be read or is too low to serve.
#[derive(Debug, thiserror::Error)]
pub enum DescriptorError {
    /// `getrlimit` failed.
    #[error("{op} RLIMIT_NOFILE: {source}")]
    Limit {
        /// What was done to the limit (`reading`).
        op: &'static str,
        /// What the system said.
        source: std::io::Error,
    },
    /// The limit leaves too few descriptors for connections.
    #[error(
        "the open-file limit is {limit}: {reserved} are kept for kernels and the server's own files, leaving fewer than {min} for connections; raise it (ulimit -n, LimitNOFILE=) or lower --max-kernels"
    )]
    TooLow {
        /// The soft limit.
        limit: u64,
        /// What is kept aside.
        reserved: u64,
        /// The fewest descriptors left for connections that serving needs
        /// ([`MIN_CONNECTION_DESCRIPTORS`]).
        min: u64,
    },
}

/// The descriptor limit before and after [`raise_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    /// The soft limit found.
    pub before: u64,
    /// The soft limit now (the hard limit, unless raising failed).
    pub now: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (when the system refuses, the soft limit
/// stays, with a warning).
#[allow(unsafe_code, clippy::unnecessary_cast)]
pub fn raise_limit() -> Result<Raised, DescriptorError> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(DescriptorError::Limit {
            op: "reading",
            source: std::io::Error::last_os_error(),
        });
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit; raising the soft limit to the hard one is allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            // Serving within the soft limit is still safe: the totals are fitted to it.
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "raising RLIMIT_NOFILE to its hard limit failed"
            );
            lim.rlim_cur = before;
        }
    }
    Ok(Raised {
        before: before as u64,
        now: lim.rlim_cur as u64,
    })
}

/// The connection totals that fit a descriptor limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fitted {
    /// The API's connections at once (`--max-connections`).
    pub api: usize,
    /// The egress proxy's connections at once in all, when it runs.
    pub egress: Option<usize>,
}

/// The totals that fit `limit` descriptors with `max_kernels` kernels: `api` and `egress`
/// unchanged when `api + 2 * egress` fits what the reserve leaves, else lowered (the API to at
/// most half of it, the proxy to what remains). An error when too little is left at all.
pub fn fit(
    limit: u64,
    max_kernels: usize,
    api: usize,
    egress: Option<usize>,
) -> Result<Fitted, DescriptorError> {
    let reserved = RESERVED_DESCRIPTORS
        .saturating_add(DESCRIPTORS_PER_KERNEL.saturating_mul(max_kernels as u64));
    let left = limit.saturating_sub(reserved);
    if left < MIN_CONNECTION_DESCRIPTORS {
        return Err(DescriptorError::TooLow {
            limit,
            reserved,
            min: MIN_CONNECTION_DESCRIPTORS,
        });
    }
    let need = api as u64 + egress.unwrap_or(0) as u64 * DESCRIPTORS_PER_EGRESS_CONNECTION;
    if need <= left {
        return Ok(Fitted { api, egress });
    }
    let api_share = if egress.is_some() { left / 2 } else { left };
    let api = api.min(api_share as usize).max(1);
    let egress = egress.map(|e| {
        let room = (left - api as u64) / DESCRIPTORS_PER_EGRESS_CONNECTION;
        e.min(room as usize).max(1)
    });
    Ok(Fitted { api, egress })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_that_fit_are_kept_and_the_rest_lowered_below_the_limit() {
        // The defaults fit a 20,000 limit unchanged.
        assert_eq!(
            fit(20_000, 32, 1024, Some(4096)).expect("fits"),
            Fitted {
                api: 1024,
                egress: Some(4096)
            }
        );
        // A 1,024 limit: 384 reserved, 320 for the API, 160 tunnels (320 descriptors).
        let f = fit(1024, 32, 1024, Some(4096)).expect("fits");
        assert_eq!(
            f,
            Fitted {
                api: 320,
                egress: Some(160)
            }
        );
        assert!(f.api as u64 + 2 * 160 + 384 <= 1024);
        // Without egress the API may use all that is left.
        assert_eq!(fit(1024, 32, 1024, None).expect("fits").api, 640);
        assert!(matches!(
            fit(256, 32, 1024, Some(4096)),
            Err(DescriptorError::TooLow { .. })
        ));
    }

    #[test]
    fn the_limit_is_raised_to_the_hard_one() {
        let raised = raise_limit().expect("raised");
        assert!(raised.now >= raised.before);
    }
}
