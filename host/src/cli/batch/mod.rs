//! `hunch batch`: answer a JSONL file of requests in OpenAI's batch line format, against a
//! running server or a model loaded here, resumably. See docs/cli.md.
//!
//! - [`input`]: parsing and validating lines, and the sending order (shared question lists
//!   back to back).
//! - [`output`]: appending answers, resuming from a previous run's output.
//! - [`send`]: one request with retries and backoff.
//! - [`progress`] / [`summary`]: what the user sees while and after it runs.

pub mod input;
pub mod output;
pub mod progress;
pub mod send;
pub mod summary;

use crate::cli::target::{Target, TargetArgs};
use clap::Args;
use input::Job;
use output::Writer;
use progress::{Counters, Display, ProgressMode};
use send::{Outcome, RetryPolicy, Sender};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use summary::{Report, Totals};
use tokio::sync::watch;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  hunch batch -i tickets.jsonl -o answers.jsonl --server https://hunch.example.com --api-key \"$KEY\"
  hunch batch -i tickets.jsonl -o answers.jsonl --model dg=/models/diffusiongemma --policies policies/

An input line: {\"custom_id\": \"t1\", \"method\": \"POST\", \"url\": \"/v1/systemone\", \"body\": {...}}
(or \"url\": \"/v1/policies/NAME\" with the policy's input as the body). Each output line carries the
custom_id and either \"response\": {\"status_code\", \"request_id\", \"body\"} or \"error\": {\"code\", \"message\"}.
Rerun the same command to resume: answered custom_ids are not sent again.
Exit status: 0 when every line has a response, 1 when some do not, 2 when the batch could not run.")]
pub struct BatchArgs {
    /// The requests, one JSON object per line.
    #[arg(short = 'i', long, value_name = "IN.jsonl")]
    pub input: PathBuf,
    /// Where answers are appended; an existing file is resumed.
    #[arg(short = 'o', long, value_name = "OUT.jsonl")]
    pub output: PathBuf,
    #[command(flatten)]
    pub target: TargetArgs,
    /// Requests in flight at once (the server batches concurrent reads into shared forward passes).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub concurrency: u32,
    /// Retries of a request answered 408, 429 or 5xx, or not answered at all.
    #[arg(long, default_value_t = 5)]
    pub retries: u32,
    /// Seconds one attempt may take.
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    /// How progress is shown on stderr.
    #[arg(long, value_enum, default_value = "auto")]
    pub progress: ProgressMode,
    /// Seconds between progress lines when not drawing a bar.
    #[arg(long, default_value_t = 10.0)]
    pub progress_every: f64,
}

/// Why a batch could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("cannot read {path}: {source}")]
    Input {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Output(#[from] output::OutputError),
    #[error(transparent)]
    Target(#[from] crate::cli::target::TargetError),
    #[error("cannot build the HTTP client: {0}")]
    Client(reqwest::Error),
    #[error("--timeout must be a positive number of seconds")]
    Timeout,
}

/// Runs the batch; the exit code follows the help text.
pub async fn run(args: BatchArgs) -> ExitCode {
    match execute(args).await {
        Ok(report) => {
            eprintln!("{report}");
            if report.answered == report.lines {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("hunch batch: {e}");
            ExitCode::from(2)
        }
    }
}

/// Resolves when the user asks to stop (Ctrl-C or SIGTERM).
async fn stop_requested() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn execute(args: BatchArgs) -> Result<Report, BatchError> {
    let timeout = Duration::try_from_secs_f64(args.timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or(BatchError::Timeout)?;
    let text = std::fs::read_to_string(&args.input).map_err(|source| BatchError::Input {
        path: args.input.clone(),
        source,
    })?;
    let input = input::parse(&text);
    let (writer, previous) = Writer::open(&args.output)?;
    if !previous.answered.is_empty() || previous.dropped_errors > 0 || previous.repaired_tail {
        eprintln!(
            "hunch batch: resuming {}: {} lines answered already{}{}",
            args.output.display(),
            previous.answered.len(),
            if previous.dropped_errors > 0 {
                format!(", {} error lines to retry", previous.dropped_errors)
            } else {
                String::new()
            },
            if previous.repaired_tail {
                ", torn last line repaired"
            } else {
                ""
            }
        );
    }
    for refusal in &input.refusals {
        writer.write(&output::error_line(
            refusal.line,
            refusal.custom_id.as_deref(),
            refusal.code.as_str(),
            &refusal.message,
        ))?;
    }
    let answered_before = input
        .jobs
        .iter()
        .filter(|j| previous.answered.contains(&j.custom_id))
        .count();
    let jobs: Vec<Job> = input
        .jobs
        .into_iter()
        .filter(|j| !previous.answered.contains(&j.custom_id))
        .collect();
    let to_send = jobs.len();

    let totals = Arc::new(Totals::default());
    let counters = Arc::new(Counters::default());
    counters.total.store(to_send as u64, Ordering::Relaxed);
    let started = Instant::now();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut cache = None;
    let mut interrupted = false;
    if to_send > 0 {
        let target = Target::start(&args.target).await?;
        let sender = Arc::new(
            Sender::new(
                &target.url,
                target.api_key.clone(),
                RetryPolicy {
                    retries: args.retries,
                    ..RetryPolicy::default()
                },
                timeout,
            )
            .map_err(BatchError::Client)?,
        );
        let before = summary::scrape(&target.url).await;
        let display = Display::start(
            counters.clone(),
            args.progress,
            Duration::try_from_secs_f64(args.progress_every)
                .unwrap_or(Duration::from_secs(10))
                .max(Duration::from_millis(100)),
        );
        let jobs = Arc::new(jobs);
        let next = Arc::new(AtomicUsize::new(0));
        let writer = Arc::new(writer);
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..args.concurrency.min(to_send as u32).max(1) {
            let worker = Worker {
                jobs: jobs.clone(),
                next: next.clone(),
                sender: sender.clone(),
                writer: writer.clone(),
                totals: totals.clone(),
                counters: counters.clone(),
                stop: stop_rx.clone(),
            };
            workers.spawn(worker.run());
        }
        let write_failure = {
            let all_done = async {
                let mut failure = None;
                while let Some(result) = workers.join_next().await {
                    if let Ok(Err(e)) = result {
                        failure.get_or_insert(e);
                        let _ = stop_tx.send(true);
                    }
                }
                failure
            };
            tokio::pin!(all_done);
            tokio::select! {
                failure = &mut all_done => failure,
                _ = stop_requested() => {
                    interrupted = true;
                    let _ = stop_tx.send(true);
                    eprintln!("\nhunch batch: stopping: waiting for the requests in flight (Ctrl-C again to quit now)");
                    tokio::select! {
                        failure = &mut all_done => failure,
                        _ = stop_requested() => {
                            // Every finished line is already written; in-flight ones stay unanswered.
                            let _ = writer.finish();
                            eprintln!("hunch batch: quit; rerun the same command to resume");
                            std::process::exit(1);
                        }
                    }
                }
            }
        };
        display.finish();
        writer.finish()?;
        if let Some(e) = write_failure {
            target.shutdown().await;
            return Err(e.into());
        }
        let after = summary::scrape(&target.url).await;
        cache = before.zip(after).map(|(b, a)| summary::CacheCounters {
            prefills: a.prefills.saturating_sub(b.prefills),
            hits: a.hits.saturating_sub(b.hits),
        });
        target.shutdown().await;
    } else {
        writer.finish()?;
    }

    let answered_now = totals.answered.load(Ordering::Relaxed) as usize;
    let transport_errors = totals.transport_errors.load(Ordering::Relaxed);
    Ok(Report {
        lines: input.lines,
        answered: answered_before + answered_now,
        answered_before,
        refused: input.refusals.len(),
        transport_errors,
        unanswered: to_send.saturating_sub(answered_now + transport_errors as usize),
        sent: counters.done.load(Ordering::Relaxed) as usize,
        elapsed: started.elapsed(),
        answered_2xx: totals.answered_2xx.load(Ordering::Relaxed),
        answered_4xx: totals.answered_4xx.load(Ordering::Relaxed),
        answered_5xx: totals.answered_5xx.load(Ordering::Relaxed),
        reads: totals.reads.load(Ordering::Relaxed),
        input_tokens: totals.input_tokens.load(Ordering::Relaxed),
        output_tokens: totals.output_tokens.load(Ordering::Relaxed),
        cache,
        interrupted,
    })
}

/// One of `--concurrency` loops taking the next job in sending order.
struct Worker {
    jobs: Arc<Vec<Job>>,
    next: Arc<AtomicUsize>,
    sender: Arc<Sender>,
    writer: Arc<Writer>,
    totals: Arc<Totals>,
    counters: Arc<Counters>,
    stop: watch::Receiver<bool>,
}

impl Worker {
    async fn run(mut self) -> Result<(), output::OutputError> {
        loop {
            if *self.stop.borrow() {
                return Ok(());
            }
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(job) = self.jobs.get(i) else {
                return Ok(());
            };
            let outcome = self.sender.send(&job.url, &job.body, &mut self.stop).await;
            let stopping = *self.stop.borrow();
            match outcome {
                // Once stopping, an answer a retry could change (the local sidecar may have
                // been interrupted too) is left for the next run rather than recorded.
                Outcome::Response { retryable, .. } if stopping && retryable => continue,
                Outcome::Response {
                    status,
                    request_id,
                    calibration,
                    body,
                    ..
                } => {
                    self.totals.record_response(status, &body);
                    if !(200..=299).contains(&status) {
                        self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    }
                    self.writer.write(&output::response_line(
                        job,
                        output::Answered {
                            status,
                            request_id: request_id.as_deref(),
                            calibration: calibration.as_deref(),
                            body,
                        },
                    ))?;
                }
                Outcome::Transport(_) if stopping => continue,
                Outcome::Transport(message) => {
                    self.totals.transport_errors.fetch_add(1, Ordering::Relaxed);
                    self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    self.writer.write(&output::error_line(
                        job.line,
                        Some(&job.custom_id),
                        "transport",
                        &format!("no answer after retries: {message}"),
                    ))?;
                }
                Outcome::Interrupted => continue,
            }
            self.counters.done.fetch_add(1, Ordering::Relaxed);
        }
    }
}
