//! `kernelbox repl`: cells from standard input, a blank line ends each, state kept.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;

use kernelbox::{CellStatus, ExecuteRequest, Orchestrator};

/// Reads cells until EOF and runs each in the session's kernel.
pub async fn run(orchestrator: &Orchestrator, session: &str) -> anyhow::Result<ExitCode> {
    let interactive = std::io::stdin().is_terminal();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1);
    // Standard input is read on a blocking thread; cells arrive here whole.
    let reader = tokio::task::spawn_blocking(move || read_cells(interactive, tx));
    let mut failures = 0u32;
    while let Some(code) = rx.recv().await {
        // Output streams to the terminal as the cell writes it.
        let sink: kernelbox::OutputSink = Arc::new(|bytes: &[u8]| {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(bytes);
            let _ = out.flush();
        });
        let request = ExecuteRequest {
            session: session.to_string(),
            code,
            sink: Some(sink),
            ..ExecuteRequest::default()
        };
        let result = orchestrator.execute(request).await?;
        if let Some(lost) = &result.kernel.state_lost {
            eprintln!(
                "[kernelbox] the previous kernel was lost ({}); state starts fresh",
                lost.reason.as_str()
            );
        }
        match result.status {
            CellStatus::Success => {}
            // A traceback is already part of the streamed output.
            CellStatus::Error if result.exit_code == 1 => failures += 1,
            _ => {
                failures += 1;
                eprintln!(
                    "[kernelbox] {}",
                    result.error.as_deref().unwrap_or("cell failed")
                );
            }
        }
        if let Some(warning) = &result.warning {
            eprintln!("[kernelbox] {warning}");
        }
        if result.kernel.ended {
            eprintln!("[kernelbox] the kernel ended (sys.exit); the next cell starts a fresh one");
        }
    }
    reader.await??;
    Ok(if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn read_cells(interactive: bool, tx: tokio::sync::mpsc::Sender<String>) -> anyhow::Result<()> {
    let stdin = std::io::stdin();
    let mut cell = String::new();
    let prompt = |continuing: bool| {
        if interactive {
            eprint!("{}", if continuing { "... " } else { ">>> " });
        }
    };
    prompt(false);
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            if !cell.trim().is_empty() && tx.blocking_send(std::mem::take(&mut cell)).is_err() {
                return Ok(());
            }
            cell.clear();
            prompt(false);
            continue;
        }
        cell.push_str(&line);
        cell.push('\n');
        prompt(true);
    }
    if !cell.trim().is_empty() {
        let _ = tx.blocking_send(cell);
    }
    Ok(())
}
