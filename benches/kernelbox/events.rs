//! Timed samples with their wall-clock bounds, and the Docker event log that splits them into
//! segments at the engine's own event times (create, attach, start, die).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use bollard::query_parameters::EventsOptionsBuilder;
use bollard::Docker;
use futures::StreamExt;

use crate::stats::{ms, stats, Stats};
use crate::CASE;

fn unix_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A timed sample: its duration, and its wall-clock bounds to match Docker events against.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub ms: f64,
    from_ns: i64,
    to_ns: i64,
}

/// A sample under way.
pub struct Began(Instant, i64);

impl Window {
    pub fn begin() -> Began {
        Began(Instant::now(), unix_ns())
    }
}

impl Began {
    pub fn end(self) -> Window {
        Window {
            ms: ms(self.0.elapsed()),
            from_ns: self.1,
            to_ns: unix_ns(),
        }
    }
}

/// Container events carrying the bench label, with the engine's timestamps.
pub struct EventLog {
    events: Arc<std::sync::Mutex<Vec<(i64, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl EventLog {
    pub fn start(docker: &Docker, label: &str) -> EventLog {
        let filters = HashMap::from([
            ("label".to_string(), vec![format!("{CASE}={label}")]),
            ("type".to_string(), vec!["container".to_string()]),
        ]);
        let options = EventsOptionsBuilder::default().filters(&filters).build();
        let mut stream = docker.events(Some(options));
        let events: Arc<std::sync::Mutex<Vec<(i64, String)>>> = Arc::default();
        let sink = events.clone();
        let task = tokio::spawn(async move {
            while let Some(Ok(e)) = stream.next().await {
                if let (Some(t), Some(action)) = (e.time_nano, e.action) {
                    sink.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((t, action));
                }
            }
        });
        EventLog { events, task }
    }

    /// Splits each window at the first event of each action, in order; p50 per segment.
    pub fn split(&self, windows: &[Window], actions: &[&str]) -> Vec<(String, Stats)> {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let mut names = vec![format!("request→{}", actions[0])];
        for pair in actions.windows(2) {
            names.push(format!("{}→{}", pair[0], pair[1]));
        }
        names.push(format!("{}→result", actions[actions.len() - 1]));
        let mut segments: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        for w in windows {
            let mut points = vec![w.from_ns];
            for a in actions {
                let after = *points.last().unwrap_or(&w.from_ns);
                match events
                    .iter()
                    .filter(|(t, act)| act == a && *t >= after && *t <= w.to_ns)
                    .map(|(t, _)| *t)
                    .min()
                {
                    Some(t) => points.push(t),
                    None => break,
                }
            }
            if points.len() != actions.len() + 1 {
                continue;
            }
            points.push(w.to_ns);
            for (i, pair) in points.windows(2).enumerate() {
                segments[i].push((pair[1] - pair[0]) as f64 / 1e6);
            }
        }
        names
            .into_iter()
            .zip(segments)
            .map(|(n, s)| (n, stats(&s)))
            .collect()
    }

    pub fn stop(self) {
        self.task.abort();
    }
}
