//! A no-op tool call from inside a cell, timed in Python (the tool-call round trip of the
//! docs/performance.md).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use kernelbox::{ExecuteRequest, FnDispatcher, Scope, ToolCall, ToolDispatcher};
use serde_json::{json, Value};

use super::{last_json, ok_cell, Bench};
use crate::report::Row;
use crate::stats::{fmt_ms, ms};

impl Bench {
    /// Phase 4: the no-op tool call round trip, measured inside Python.
    pub async fn tools(&mut self) -> Result<()> {
        let n = self.sizes.tool_calls;
        let tools: BTreeSet<String> = BTreeSet::from(["noop".to_string()]);
        let dispatcher: Arc<dyn ToolDispatcher> =
            Arc::new(FnDispatcher(|_call: ToolCall| Ok(Value::Null)));
        let request = |code: String| ExecuteRequest {
            dispatcher: Some(dispatcher.clone()),
            ..ExecuteRequest::new(
                Scope {
                    tools: tools.clone(),
                    ..Scope::session("tools")
                },
                code,
            )
        };
        let r = self
            .exec(request(
                "import json, time, kernel_tools\nkernel_tools.noop()".into(),
            ))
            .await?;
        ok_cell("tool warm-up", &r)?;
        let code = format!(
            "n = {n}\n\
             ts = []\n\
             start = time.perf_counter()\n\
             for _ in range(n):\n    \
                 t = time.perf_counter()\n    \
                 kernel_tools.noop()\n    \
                 ts.append(time.perf_counter() - t)\n\
             total = time.perf_counter() - start\n\
             ts.sort()\n\
             print(json.dumps({{'n': n, 'mean_ms': total / n * 1e3, 'p50_ms': ts[n // 2] * 1e3, \
             'p99_ms': ts[min(n - 1, int(n * 0.99))] * 1e3, 'max_ms': ts[-1] * 1e3}}))\n"
        );
        let t = Instant::now();
        let r = self.exec(request(code)).await?;
        let cell_ms = ms(t.elapsed());
        ok_cell("tool cell", &r)?;
        if r.tool_calls_made as usize != n {
            bail!("tool_calls_made = {}, expected {n}", r.tool_calls_made);
        }
        let v = last_json(
            &r.output,
            format_args!("in the tool cell's output: {}", r.output),
        )?;
        let get = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
        let (mean, p50, p99) = (get("mean_ms"), get("p50_ms"), get("p99_ms"));
        let row = Row::new(
            format!("no-op tool call from a cell (n={n}, timed in Python)"),
            format!(
                "mean {} / p50 {} / p99 {}",
                fmt_ms(mean),
                fmt_ms(p50),
                fmt_ms(p99)
            ),
        );
        self.rows.push(self.vs_attach(row, p50));
        self.details.insert(
            "tool_call".into(),
            json!({"in_python": v, "cell_wall_ms": cell_ms, "tool_calls_made": r.tool_calls_made}),
        );
        Ok(())
    }
}
