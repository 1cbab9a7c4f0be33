//! The tests of `metrics.rs`.

use super::*;

#[test]
fn renders_counters_and_histograms() {
    let m = Metrics::new();
    m.record_request("/v1/systemone", 200, Duration::from_millis(3));
    m.record_request("/v1/systemone", 200, Duration::from_millis(30));
    m.record_read("jev", "ok", 4, Duration::from_millis(2));
    let text = m.render();
    assert!(text.contains("hunch_http_requests_total{route=\"/v1/systemone\",status=\"200\"} 2"));
    assert!(text.contains(
        "hunch_http_request_duration_seconds_bucket{route=\"/v1/systemone\",le=\"0.005\"} 1"
    ));
    assert!(text.contains("hunch_http_request_duration_seconds_count{route=\"/v1/systemone\"} 2"));
    assert!(text.contains("hunch_reads_total{model=\"jev\",outcome=\"ok\"} 1"));
    assert!(text.contains("hunch_read_draws_total 4"));
    assert!(text.contains("hunch_queue_depth 0"));
}

#[test]
fn renders_the_model_side_figures_of_reads() {
    let m = Metrics::new();
    let stats = hunch_core::ReadStats {
        reads: 2,
        draws: 5,
        prompt_tokens: 300,
        reused_tokens: 120,
        tokenize_seconds: 0.001,
        prefill_seconds: 0.2,
        denoise_seconds: 0.05,
        cache_hits: 1,
        forwards: 6,
        max_batch_requests: 3,
        max_batch_rows: 200,
        batch_deviation: Some(0.00019),
        engine: Some(hunch_core::EngineGauges {
            active_requests: 4,
            queued_requests: 2,
            cache_bytes: 1 << 20,
            cache_entries: 12,
            inflight_kv_bytes: 4096,
            cache_capacity_bytes: 4 << 20,
        }),
        ..Default::default()
    };
    m.record_read_stats("dg", &stats);
    // A later read alone: its snapshot replaces the gauges; the deviation is kept (none was
    // reported).
    m.record_read_stats(
        "dg",
        &hunch_core::ReadStats {
            max_batch_requests: 1,
            max_batch_rows: 5000,
            batch_deviation: None,
            engine: Some(hunch_core::EngineGauges {
                active_requests: 1,
                queued_requests: 0,
                cache_bytes: 2 << 20,
                cache_entries: 13,
                inflight_kv_bytes: 0,
                cache_capacity_bytes: 8 << 20,
            }),
            ..stats.clone()
        },
    );
    let text = m.render();
    assert!(text.contains("hunch_model_prefills_total{model=\"dg\"} 4"));
    assert!(text.contains("hunch_model_prompt_tokens_total{model=\"dg\"} 600"));
    assert!(text.contains("hunch_model_reused_prompt_tokens_total{model=\"dg\"} 240"));
    assert!(text.contains("hunch_model_prefill_seconds_count{model=\"dg\"} 2"));
    assert!(text.contains("hunch_model_denoise_seconds_bucket{model=\"dg\",le=\"0.05\"} 2"));
    for (name, kind, value) in [
        ("hunch_model_prefix_cache_hits_total", "counter", "2"),
        ("hunch_model_forwards_total", "counter", "12"),
        ("hunch_model_active_requests", "gauge", "1"),
        ("hunch_model_queued_requests", "gauge", "0"),
        ("hunch_model_prefix_cache_bytes", "gauge", "2097152"),
        ("hunch_model_prefix_cache_entries", "gauge", "13"),
        ("hunch_model_inflight_kv_bytes", "gauge", "0"),
        ("hunch_model_batch_deviation", "gauge", "0.00019"),
    ] {
        let family = format!("# TYPE {name} {kind}\n{name}{{model=\"dg\"}} {value}\n");
        assert!(text.contains(&family), "{family} in\n{text}");
    }
    let requests = histogram_text(
        "hunch_model_batch_requests",
        &["1", "2", "4", "8", "16", "32", "64", "+Inf"],
        &[1, 1, 2, 2, 2, 2, 2, 2],
        4,
    );
    let rows = histogram_text(
        "hunch_model_batch_rows",
        &["16", "64", "256", "1024", "4096", "16384", "+Inf"],
        &[0, 0, 1, 1, 1, 2, 2],
        5200,
    );
    for histogram in [requests, rows] {
        assert!(text.contains(&histogram), "{histogram} in\n{text}");
    }
}

/// The text of histogram `name` of model `dg`: the cumulative count of each bucket bound
/// (the last bound `+Inf`, whose count is the histogram's count), then the sum.
fn histogram_text(name: &str, bounds: &[&str], counts: &[u64], sum: u64) -> String {
    let mut text = format!("# TYPE {name} histogram\n");
    for (le, count) in bounds.iter().zip(counts) {
        text += &format!("{name}_bucket{{model=\"dg\",le=\"{le}\"}} {count}\n");
    }
    let count = counts.last().copied().unwrap_or(0);
    text + &format!("{name}_sum{{model=\"dg\"}} {sum}\n{name}_count{{model=\"dg\"}} {count}\n")
}

#[test]
fn the_gateway_gauges_follow_the_queue_the_readers_and_the_fullest_prefix_cache() {
    let m = Metrics::new();
    let text = m.render();
    for empty in [
        "# TYPE hunch_queued_requests gauge\nhunch_queued_requests 0\n",
        "# TYPE hunch_running_requests gauge\nhunch_running_requests 0\n",
        "# TYPE hunch_prefix_cache_utilization gauge\nhunch_prefix_cache_utilization 0\n",
    ] {
        assert!(text.contains(empty), "{empty} in\n{text}");
    }
    m.queue_depth(3);
    m.queue_depth(-1);
    m.reads_in_flight(5);
    let snapshot = |bytes: u64, capacity: u64| hunch_core::ReadStats {
        engine: Some(hunch_core::EngineGauges {
            cache_bytes: bytes,
            cache_capacity_bytes: capacity,
            ..Default::default()
        }),
        ..Default::default()
    };
    m.record_read_stats("a", &snapshot(1 << 20, 4 << 20));
    m.record_read_stats("b", &snapshot(3 << 20, 4 << 20));
    // A sidecar that does not report its bound counts for nothing.
    m.record_read_stats("old", &snapshot(9 << 20, 0));
    let text = m.render();
    assert!(text.contains("\nhunch_queued_requests 2\n"), "{text}");
    assert!(text.contains("\nhunch_running_requests 5\n"), "{text}");
    assert!(
        text.contains("\nhunch_prefix_cache_utilization 0.75\n"),
        "{text}"
    );
    // The newest snapshot of a model replaces its older one.
    m.record_read_stats("b", &snapshot(0, 4 << 20));
    assert!(m
        .render()
        .contains("\nhunch_prefix_cache_utilization 0.25\n"));
}

#[test]
fn a_sidecar_without_batching_figures_adds_no_batch_samples() {
    let m = Metrics::new();
    m.record_read_stats(
        "old",
        &hunch_core::ReadStats {
            reads: 1,
            ..Default::default()
        },
    );
    let text = m.render();
    assert!(text.contains("hunch_model_prefix_cache_hits_total{model=\"old\"} 0\n"));
    assert!(text.contains("hunch_model_forwards_total{model=\"old\"} 0\n"));
    assert!(text.contains("hunch_model_batch_requests_count{model=\"old\"} 0\n"));
    assert!(text.contains("hunch_model_batch_rows_count{model=\"old\"} 0\n"));
    for gauge in [
        "hunch_model_active_requests{",
        "hunch_model_queued_requests{",
        "hunch_model_prefix_cache_bytes{",
        "hunch_model_prefix_cache_entries{",
        "hunch_model_inflight_kv_bytes{",
        "hunch_model_batch_deviation{",
    ] {
        assert!(!text.contains(gauge), "{gauge} without a snapshot");
    }

    // A deviation of exactly 0 (bit-exact batching) is rendered as such.
    m.record_read_stats(
        "old",
        &hunch_core::ReadStats {
            max_batch_requests: 2,
            batch_deviation: Some(0.0),
            ..Default::default()
        },
    );
    assert!(m
        .render()
        .contains("hunch_model_batch_deviation{model=\"old\"} 0\n"));
}
