//! `kernelbox exec --url`: run a cell on a kernelbox server instead of a local orchestrator,
//! and the exit code of any failed call to a server (`exec --url`, `cp`).

use std::process::ExitCode;

use kernelbox::client::{Client, ClientError};
use kernelbox::wire::ExecuteBody;
use kernelbox::CellStatus;

/// What to send.
pub struct Remote<'a> {
    pub url: &'a str,
    pub token: Option<&'a str>,
    pub session: &'a str,
    pub child: Option<&'a str>,
    pub code: &'a str,
    pub timeout_seconds: f64,
    pub reset: bool,
    pub language: kernelbox::wire::Language,
}

/// Posts the cell, prints the result JSON; exit 1 when the cell did not succeed.
pub async fn exec(r: Remote<'_>) -> anyhow::Result<ExitCode> {
    let client = Client::new(r.url, r.token.map(str::to_owned));
    let body = ExecuteBody {
        code: r.code.to_owned(),
        reset: r.reset,
        timeout: Some(r.timeout_seconds.into()),
        child: r.child.map(str::to_owned),
        language: Some(r.language),
        ..ExecuteBody::default()
    };
    let result = client.execute(r.session, &body).await?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(if result.status == CellStatus::Success {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The exit code of a failed call to a server (`docs/cli.md`, exit codes): 3 when the server
/// cannot be reached or its answer broke off, 2 when it refused the request as the caller's
/// mistake (4xx: a bad name or path, a wrong token, nothing there), 5 otherwise.
pub fn exit_code(e: &ClientError) -> u8 {
    match e {
        ClientError::Unreachable { .. } | ClientError::Read(_) => 3,
        ClientError::Refused { status, .. } if status.is_client_error() => 2,
        _ => 5,
    }
}
