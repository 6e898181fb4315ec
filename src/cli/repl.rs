//! `kernelbox repl`: cells from standard input, a blank line ends each, state kept.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use base64::Engine as _;
use kernelbox::{CellStatus, ExecuteRequest, Orchestrator, RichResult};

/// Reads cells until EOF and runs each in the session's kernel.
pub async fn run(orchestrator: &Orchestrator, session: &str) -> anyhow::Result<ExitCode> {
    let interactive = std::io::stdin().is_terminal();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1);
    // Standard input is read on a blocking thread; cells arrive here whole.
    let reader = tokio::task::spawn_blocking(move || read_cells(interactive, tx));
    let mut failures = 0u32;
    let mut cell = 0u64;
    while let Some(code) = rx.recv().await {
        cell += 1;
        // Rich results print as they come: images saved to files, the rest as text.
        let images = Arc::new(AtomicU64::new(0));
        let display_sink: kernelbox::DisplaySink =
            Arc::new(move |result: &RichResult| show(result, cell, &images));
        // Output streams to the terminal as the cell writes it: its stderr to stderr.
        let sink: kernelbox::OutputSink = Arc::new(|stream, bytes: &[u8]| {
            if stream == kernelbox::OutputStream::Stderr {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(bytes);
                let _ = err.flush();
                return;
            }
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(bytes);
            let _ = out.flush();
        });
        let request = ExecuteRequest {
            scope: kernelbox::Scope::session(session),
            code,
            sink: Some(sink),
            display_sink: Some(display_sink),
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

/// Prints a rich result: an image is saved as `cell-N-K.EXT` in the current directory and
/// named (`[image/png 640x480 -> cell-3-1.png]`); anything else prints its `text/plain`.
fn show(result: &RichResult, cell: u64, images: &AtomicU64) {
    let image = [
        ("image/png", "png"),
        ("image/jpeg", "jpg"),
        ("image/svg+xml", "svg"),
    ]
    .into_iter()
    .find_map(|(mime, ext)| result.text(mime).map(|value| (mime, ext, value)));
    let mut out = std::io::stdout().lock();
    let Some((mime, ext, value)) = image else {
        if let Some(text) = result.text("text/plain") {
            let _ = writeln!(out, "{}", text.trim_end_matches('\n'));
        }
        return;
    };
    let bytes = if mime == "image/svg+xml" {
        Ok(value.into_bytes())
    } else {
        base64::engine::general_purpose::STANDARD.decode(value.trim())
    };
    let k = images.fetch_add(1, Ordering::Relaxed) + 1;
    let name = format!("cell-{cell}-{k}.{ext}");
    let size = bytes
        .as_deref()
        .ok()
        .and_then(kernelbox::rich::png_size)
        .map(|(w, h)| format!(" {w}x{h}"))
        .unwrap_or_default();
    let saved = match bytes {
        Ok(bytes) => std::fs::write(&name, bytes).map_err(|e| e.to_string()),
        Err(e) => Err(format!("not base64: {e}")),
    };
    let _ = match saved {
        Ok(()) => writeln!(out, "[{mime}{size} -> {name}]"),
        Err(e) => writeln!(out, "[{mime}{size}: could not be saved as {name}: {e}]"),
    };
    let _ = out.flush();
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
