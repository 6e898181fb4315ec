//! The warm cell round trip through the library, and the bare attach echo floor.

use std::time::Instant;

use anyhow::{bail, Result};
use kernelbox::ExecuteRequest;
use serde_json::json;

use super::{ok_cell, Bench};
use crate::floors::EchoFloor;
use crate::report::Row;
use crate::stats::{fmt_ms, ms, pq, stats};

impl Bench {
    /// Phase 1: the warm cell round trip, and the bare attach echo floor.
    pub async fn warm(&mut self) -> Result<()> {
        let n = self.sizes.warm;
        let mut echo = EchoFloor::start(&self.engine, &self.label).await?;
        let session = "warm";
        for _ in 0..20 {
            let r = self.exec(ExecuteRequest::new(session, "x = 1")).await?;
            ok_cell("warm-up", &r)?;
        }
        // Floor and kernel alternate in blocks of 10, so both see the same machine: on a small
        // shared machine either can drift by 2x over a run.
        let mut floor_samples = Vec::with_capacity(n);
        let mut wall = Vec::with_capacity(n);
        let mut inner = Vec::with_capacity(n);
        let measured = async {
            while wall.len() < n {
                for _ in 0..10 {
                    floor_samples.push(echo.sample().await?);
                }
                for _ in 0..10.min(n - wall.len()) {
                    let t = Instant::now();
                    let r = self.exec(ExecuteRequest::new(session, "x = 1")).await?;
                    wall.push(ms(t.elapsed()));
                    ok_cell("warm cell", &r)?;
                    if !r.kernel.reused {
                        bail!("warm cell ran in a new kernel");
                    }
                    inner.push(r.duration_seconds * 1e3);
                }
            }
            Ok(())
        }
        .await;
        echo.stop().await;
        measured?;
        let floor = stats(&floor_samples);
        let w = stats(&wall);
        let d = stats(&inner);
        let ratio = w.p50_ms / floor.p50_ms;
        self.attach_p50 = floor.p50_ms;
        self.warm_p50 = w.p50_ms;
        self.rows.push(
            Row::new(format!("warm cell `x = 1`, library (n={n})"), pq(&w))
                .floor(format!("attach echo: {}", pq(&floor)), ratio)
                .target(
                    "p50 ≤ 2x floor and < 0.5 ms",
                    ratio <= 2.0 && w.p50_ms < 0.5,
                ),
        );
        self.notes.push(format!(
            "warm cell: CellResult.duration_seconds (inside execute, from owner lookup to result) \
             p50 {}; the rest of the wall time ({}) is the call around it",
            fmt_ms(d.p50_ms),
            fmt_ms(w.p50_ms - d.p50_ms)
        ));
        self.details.insert(
            "warm".into(),
            json!({"library_wall": w, "library_duration_seconds": d, "attach_floor": floor, "ratio_p50": ratio}),
        );
        Ok(())
    }
}
