//! Latency summaries in milliseconds (nearest-rank percentiles) and their formatting.

use std::time::Duration;

use serde::Serialize;

/// Latency summary in milliseconds (nearest-rank percentiles).
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub n: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

pub fn stats(samples: &[f64]) -> Stats {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let rank = |p: f64| -> f64 {
        if n == 0 {
            return f64::NAN;
        }
        let i = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
        s[i]
    };
    Stats {
        n,
        mean_ms: if n == 0 {
            f64::NAN
        } else {
            s.iter().sum::<f64>() / n as f64
        },
        p50_ms: rank(0.50),
        p99_ms: rank(0.99),
        min_ms: s.first().copied().unwrap_or(f64::NAN),
        max_ms: s.last().copied().unwrap_or(f64::NAN),
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn fmt_ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.3} ms")
    } else if v < 1000.0 {
        format!("{v:.1} ms")
    } else {
        format!("{:.2} s", v / 1e3)
    }
}

/// `p50 … / p99 …`, as the table shows a latency.
pub fn pq(s: &Stats) -> String {
    format!("p50 {} / p99 {}", fmt_ms(s.p50_ms), fmt_ms(s.p99_ms))
}
