//! Progress of a batch run: a redrawn bar on a terminal, a plain line every so often otherwise
//! (logs and CI), both on stderr.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Counters the workers bump and the display reads.
#[derive(Debug, Default)]
pub struct Counters {
    /// Lines to send in this run.
    pub total: AtomicU64,
    /// Lines finished in this run (answered or failed).
    pub done: AtomicU64,
    /// Lines finished without a 2xx answer.
    pub errors: AtomicU64,
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressMode {
    /// A bar on a terminal, lines otherwise.
    Auto,
    Bar,
    Lines,
    Off,
}

fn clock(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

/// One progress report: `done/total`, percent, rate, ETA, errors.
pub fn render(counters: &Counters, elapsed: Duration, bar_width: Option<usize>) -> String {
    let total = counters.total.load(Ordering::Relaxed);
    let done = counters.done.load(Ordering::Relaxed);
    let errors = counters.errors.load(Ordering::Relaxed);
    let fraction = if total == 0 {
        1.0
    } else {
        done as f64 / total as f64
    };
    let rate = done as f64 / elapsed.as_secs_f64().max(1e-3);
    let eta = if done == 0 || rate <= 0.0 {
        "?".to_string()
    } else {
        clock(Duration::from_secs_f64(
            (total.saturating_sub(done)) as f64 / rate,
        ))
    };
    let bar = match bar_width {
        Some(width) => {
            let filled = ((fraction * width as f64).round() as usize).min(width);
            format!("[{}{}] ", "#".repeat(filled), "-".repeat(width - filled))
        }
        None => String::new(),
    };
    format!(
        "{bar}{done}/{total} {:>3.0}% {rate:.1}/s ETA {eta} errors {errors} elapsed {}",
        fraction * 100.0,
        clock(elapsed)
    )
}

/// Draws progress until dropped.
pub struct Display {
    task: Option<tokio::task::JoinHandle<()>>,
    bar: bool,
}

impl Display {
    pub fn start(
        counters: std::sync::Arc<Counters>,
        mode: ProgressMode,
        every: Duration,
    ) -> Display {
        use std::io::IsTerminal;
        let bar = match mode {
            ProgressMode::Off => {
                return Display {
                    task: None,
                    bar: false,
                }
            }
            ProgressMode::Bar => true,
            ProgressMode::Lines => false,
            ProgressMode::Auto => std::io::stderr().is_terminal(),
        };
        let started = Instant::now();
        let period = if bar {
            Duration::from_millis(200)
        } else {
            every
        };
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.tick().await;
            loop {
                tick.tick().await;
                let text = render(&counters, started.elapsed(), bar.then_some(30));
                let mut err = std::io::stderr().lock();
                if bar {
                    let _ = write!(err, "\r\x1b[2K{text}");
                } else {
                    let _ = writeln!(err, "hunch batch: {text}");
                }
                let _ = err.flush();
            }
        });
        Display {
            task: Some(task),
            bar,
        }
    }

    /// Stops drawing and leaves the terminal on a fresh line.
    pub fn finish(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            if self.bar {
                eprint!("\r\x1b[2K");
            }
        }
    }
}

impl Drop for Display {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_shows_count_rate_eta_and_errors() {
        let c = Counters::default();
        c.total.store(100, Ordering::Relaxed);
        c.done.store(25, Ordering::Relaxed);
        c.errors.store(2, Ordering::Relaxed);
        let text = render(&c, Duration::from_secs(5), Some(8));
        assert_eq!(
            text,
            "[##------] 25/100  25% 5.0/s ETA 0:15 errors 2 elapsed 0:05"
        );
    }
}
