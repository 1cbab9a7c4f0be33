//! Policy overhead per invocation: instantiate + run + three reads (one batch) from a reader that
//! answers instantly, so what is measured is the runtime, not a model. Also the time from a file
//! write to the new version serving.
//!
//!     cargo bench -p hunch --bench policy_overhead              # release, the real numbers
//!     cargo bench -p hunch --bench policy_overhead --profile dev   # quick, reuses the test build
//!
//! Not a test: it prints numbers and asserts nothing.

use hunch::policy::testing::{built_policy, with_marker, InstantReader};
use hunch::policy::{build_engine, watch, EngineSettings, Limits, Registry, StaticReaders};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{percentile, samples_from_env};

fn report(label: &str, mut samples: Vec<f64>) {
    samples.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{label:<28} p50 {:>8.1} µs   p99 {:>8.1} µs   ({} samples)",
        percentile(&samples, 0.5) * 1e3,
        percentile(&samples, 0.99) * 1e3,
        samples.len()
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = samples_from_env();
    let dir = tempfile::tempdir()?;
    let wasm = built_policy("hostile")?;
    std::fs::write(dir.path().join("bench.wasm"), &wasm)?;
    let settings = EngineSettings {
        cache_dir: Some(dir.path().join("cache")),
        ..EngineSettings::default()
    };
    let engine = build_engine(&settings)?;
    let registry = Registry::new(
        engine,
        Some(dir.path().to_path_buf()),
        Limits::default(),
        Arc::new(StaticReaders::single(Arc::new(InstantReader::uniform()))),
        hunch::policy::Capacity::split(settings.max_concurrent, 0),
    );
    let started = Instant::now();
    registry.scan().await;
    println!(
        "first load (compile + describe): {:.1} ms, component {} KB",
        started.elapsed().as_secs_f64() * 1e3,
        wasm.len() / 1024
    );
    let input = json!({"attack": "batch"});
    for _ in 0..200 {
        registry.invoke("bench", &input).await?;
    }

    let (mut total, mut inst, mut run) = (Vec::new(), Vec::new(), Vec::new());
    let started = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let out = registry.invoke("bench", &input).await?;
        total.push(t.elapsed().as_secs_f64() * 1e3);
        inst.push(out.timings.instantiate_ms);
        run.push(out.timings.run_ms);
    }
    let seq = n as f64 / started.elapsed().as_secs_f64();
    println!("policy overhead per invocation (3 instant reads in one batch):");
    report("  total (validate..output)", total);
    report("  instantiate", inst);
    report("  run decide (incl. reads)", run);
    println!("  sequential: {seq:.0} invocations/s");

    let tasks = 8;
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (registry, input) = (registry.clone(), input.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..n / tasks {
                registry.invoke("bench", &input).await?;
            }
            Ok::<_, hunch::policy::InvokeError>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    println!(
        "  {tasks} concurrent clients: {:.0} invocations/s",
        (n / tasks * tasks) as f64 / started.elapsed().as_secs_f64()
    );

    let _watcher = watch(registry.clone())?;
    let mut reloads = Vec::new();
    for i in 0..10 {
        let new = with_marker(wasm.clone(), &format!("bench-{i}"));
        let version = hunch::policy::invoke::content_hash(&new);
        let tmp = dir.path().join("bench.wasm.part");
        std::fs::write(&tmp, &new)?;
        let t = Instant::now();
        std::fs::rename(&tmp, dir.path().join("bench.wasm"))?;
        while registry.get("bench").map(|p| p.version.clone()) != Some(version.clone()) {
            if t.elapsed() > Duration::from_secs(10) {
                return Err("a reload never served".into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        reloads.push(t.elapsed().as_secs_f64() * 1e3);
    }
    reloads.sort_by(|a, b| a.total_cmp(b));
    println!(
        "file write -> new version serving: p50 {:.0} ms, max {:.0} ms (20 ms debounce + compile of a new hash + describe)",
        percentile(&reloads, 0.5),
        reloads.last().copied().unwrap_or(f64::NAN)
    );
    Ok(())
}
