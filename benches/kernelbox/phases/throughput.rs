//! Throughput: many owners, each running its cells in sequence, all at once.

use std::time::Instant;

use anyhow::Result;
use kernelbox::ExecuteRequest;
use serde_json::json;

use super::{ok_cell, Bench};
use crate::report::Row;
use crate::stats::{ms, pq, stats};

impl Bench {
    /// Phase 5: throughput, owners x cells concurrently (each owner's cells in sequence).
    pub async fn throughput(&mut self) -> Result<()> {
        let (owners, cells) = (self.sizes.owners, self.sizes.cells_per_owner);
        let warmups: Vec<_> = (0..owners)
            .map(|o| {
                self.kb
                    .execute(ExecuteRequest::new(format!("tp-{o}"), "x = 0"))
            })
            .collect();
        for r in futures::future::join_all(warmups).await {
            ok_cell("throughput warm-up", &r?)?;
        }
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..owners)
            .map(|o| {
                let kb = self.kb.clone();
                tokio::spawn(async move {
                    let mut lat = Vec::with_capacity(cells);
                    for c in 0..cells {
                        let t = Instant::now();
                        let r = kb
                            .execute(ExecuteRequest::new(format!("tp-{o}"), format!("x = {c}")))
                            .await?;
                        lat.push(ms(t.elapsed()));
                        ok_cell("throughput cell", &r)?;
                    }
                    Ok::<_, anyhow::Error>(lat)
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await??);
        }
        let wall = t0.elapsed().as_secs_f64();
        let s = stats(&all);
        let rate = all.len() as f64 / wall;
        self.rows.push(Row::new(
            format!("throughput, {owners} owners x {cells} cells concurrently"),
            format!("{rate:.0} cells/s; {}", pq(&s)),
        ));
        self.details.insert(
            "throughput".into(),
            json!({"owners": owners, "cells_per_owner": cells, "wall_s": wall, "cells_per_second": rate, "latency": s}),
        );
        Ok(())
    }
}
