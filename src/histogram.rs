//! A Prometheus histogram (text exposition format 0.0.4): cumulative bucket counts, count and
//! sum, rendered with its labels. The orchestrator's kernel start times and the server's cell
//! durations both use it.

use std::fmt::Write;

/// A Prometheus histogram: cumulative counts of observations (seconds) per upper bound, plus
/// their count and sum. [`Stats`](crate::orchestrator::Stats) gives kernel start times and
/// [`PoolStats`](crate::orchestrator::PoolStats) refill times as these; read them with
/// [`Histogram::buckets`], [`Histogram::count`] and [`Histogram::sum`], or write them for a
/// scrape with [`Histogram::render`]. Named as `kernelbox::orchestrator::Histogram`.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    /// An empty histogram with these upper bounds (seconds, ascending; `+Inf` is implied).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            buckets: vec![0; bounds.len()],
            count: 0,
            sum: 0.0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, value: f64) {
        for (n, bound) in self.buckets.iter_mut().zip(self.bounds) {
            if value <= *bound {
                *n += 1;
            }
        }
        self.count += 1;
        self.sum += value;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of the observations.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Cumulative counts per upper bound, as `(bound, count)`.
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        self.bounds
            .iter()
            .copied()
            .zip(self.buckets.iter().copied())
    }

    /// Writes the `_bucket`, `_sum` and `_count` series of `name`; `labels` (e.g.
    /// `status="ok"`) go on every line.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) -> std::fmt::Result {
        // No labels: `name_bucket{le="..."}` and bare `name_sum` / `name_count`.
        let (sep, own) = match labels {
            "" => ("", String::new()),
            l => (",", format!("{{{l}}}")),
        };
        for (bound, n) in self.buckets() {
            writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {n}")?;
        }
        writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        )?;
        writeln!(out, "{name}_sum{own} {}", self.sum)?;
        writeln!(out, "{name}_count{own} {}", self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_rendered_with_labels() {
        let mut h = Histogram::new(&[0.5, 1.0]);
        h.observe(0.5);
        h.observe(0.75);
        h.observe(3.0);
        let mut out = String::new();
        h.render(&mut out, "m", "k=\"v\"").expect("render");
        assert_eq!(
            out,
            "m_bucket{k=\"v\",le=\"0.5\"} 1\nm_bucket{k=\"v\",le=\"1\"} 2\n\
             m_bucket{k=\"v\",le=\"+Inf\"} 3\nm_sum{k=\"v\"} 4.25\nm_count{k=\"v\"} 3\n"
        );
    }
}
