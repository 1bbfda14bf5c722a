//! `memarts status`: every slot's counters, as a table or as JSON.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use memarts_settings::size::format_size;
use memarts_shim::Client;
use serde_json::{json, Value};

use crate::cli::{Common, StatusArgs};
use crate::settings::resolve;

pub fn status(common: &Common, args: &StatusArgs) -> Result<ExitCode> {
    let cfg = resolve(common)?;
    let client =
        match Client::new(crate::settings::shim_config(&memarts_settings::Settings::from_env()?, &cfg)) {
            Ok(c) => c,
            // Not "no fleet": one runs there, and it is refused.
            Err(e @ memarts_shim::Error::Untrusted(_)) => return Err(e.into()),
            Err(e) => {
                if args.json {
                    println!(
                        "{}",
                        json!({"run_dir": cfg.run_dir, "running": false, "slots": [], "error": e.to_string()})
                    );
                } else {
                    println!("memarts: no fleet running in {} ({e})", cfg.run_dir.display());
                }
                return Ok(ExitCode::FAILURE);
            }
        };
    let mut slots = Vec::new();
    let mut all_alive = true;
    // In a cluster each slot also reports its peer counters; a fleet outside one is not asked.
    let in_cluster = memarts_shim::FleetFile::read(&cfg.run_dir).is_ok_and(|fleet| fleet.in_cluster);
    let cluster: std::collections::HashMap<u32, _> = if in_cluster {
        client
            .cluster_status(Duration::from_secs(3))
            .into_iter()
            .filter_map(|(slot, r)| r.ok().filter(|c| !c.node.is_empty()).map(|c| (slot, c)))
            .collect()
    } else {
        Default::default()
    };
    // A slot too old to know PrefetchStatus simply has no "prefetch" entry.
    let prefetch: std::collections::HashMap<u32, _> = client
        .prefetch_status(Duration::from_secs(3))
        .into_iter()
        .filter_map(|(slot, r)| r.ok().map(|p| (slot, p)))
        .collect();
    // The eviction counters, from proxies that report them (a proxy of an older build does not:
    // its slot shows them as null, and the totals count the slots that do).
    let admission: std::collections::HashMap<u32, _> = client
        .admission_status(Duration::from_secs(3))
        .into_iter()
        .filter_map(|(slot, r)| r.ok().map(|a| (slot, a)))
        .collect();
    for (slot, res) in client.status(Duration::from_secs(3)) {
        let v = match res {
            Ok(s) => json!({
                "slot": slot, "pid": s.pid, "alive": true, "uptime_s": s.uptime_ms as f64 / 1000.0,
                "connections": s.connections, "requests": s.requests, "hits": s.hits, "misses": s.misses,
                "bytes_from_cache": s.bytes_from_cache, "bytes_from_origin": s.bytes_from_origin,
                "origin_requests": s.origin_requests, "origin_retries": s.origin_retries,
                "corrupt_chunks": s.corrupt_chunks, "evicted_chunks": s.evicted_chunks,
                "cached_chunks": s.cached_chunks, "cache_bytes_used": s.cache_bytes_used,
                "cache_capacity": s.cache_capacity, "index_ready": s.index_ready, "io_engine": s.io_engine,
            }),
            Err(e) => {
                all_alive = false;
                let pid = std::fs::read_to_string(cfg.pid_path(slot))
                    .ok()
                    .and_then(|t| t.trim().parse::<u32>().ok());
                json!({"slot": slot, "pid": pid, "alive": false, "error": e.to_string()})
            }
        };
        let mut v = v;
        if v["alive"] == true {
            let a = admission.get(&slot);
            v["eviction"] = json!(a.map(|a| a.eviction.clone()));
            v["rejected_chunks"] = json!(a.map(|a| a.rejected_chunks));
        }
        if let Some(c) = cluster.get(&slot) {
            v["cluster"] = json!({
                "node": c.node, "bytes_from_peers": c.bytes_from_peers, "peer_reads": c.peer_reads,
                "peer_errors": c.peer_errors, "fallbacks": c.fallbacks, "served_chunks": c.served_chunks,
                "served_bytes": c.served_bytes, "refused_connections": c.refused_connections,
                "refused_requests": c.refused_requests, "forged_frames": c.forged_frames,
            });
        }
        if let Some(p) = prefetch.get(&slot).filter(|_| v["alive"] == true) {
            v["prefetch"] = json!({
                "hinted": p.hinted, "queued": p.queued, "inflight": p.inflight,
                "peak_inflight": p.peak_inflight, "limit": p.limit, "limit_low": p.limit_low,
                "limit_max": p.limit_max, "objects": p.objects, "chunks": p.chunks,
                "skipped_cached": p.skipped_cached, "dropped": p.dropped, "throttled": p.throttled,
                "failed": p.failed,
            });
        }
        slots.push(v);
    }
    let psum = |k: &str| slots.iter().filter_map(|s| s["prefetch"][k].as_u64()).sum::<u64>();
    let prefetch_totals = json!({
        "hinted": psum("hinted"), "queued": psum("queued"), "inflight": psum("inflight"),
        "objects": psum("objects"), "chunks": psum("chunks"), "skipped_cached": psum("skipped_cached"),
        "dropped": psum("dropped"), "throttled": psum("throttled"), "failed": psum("failed"),
    });
    let sum = |k: &str| slots.iter().filter_map(|s| s[k].as_u64()).sum::<u64>();
    let totals = json!({
        "hits": sum("hits"), "misses": sum("misses"), "bytes_from_cache": sum("bytes_from_cache"),
        "bytes_from_origin": sum("bytes_from_origin"), "cache_bytes_used": sum("cache_bytes_used"),
        "cache_capacity": sum("cache_capacity"), "cached_chunks": sum("cached_chunks"),
        "prefetch": prefetch_totals,
        "evicted_chunks": sum("evicted_chunks"),
        // Null when no slot reports it (proxies of an older build), rather than a made-up 0.
        "rejected_chunks": slots.iter().any(|s| s["rejected_chunks"].is_u64()).then(|| sum("rejected_chunks")),
    });
    // The pid of the supervisor (`start_proxy --foreground`) that starts dead slots again, if one runs.
    let supervisor = match crate::slots::probe(&crate::supervise::supervisor_pid_path(&cfg.run_dir)) {
        crate::slots::Probe::Live(pid) => Some(pid),
        _ => None,
    };
    if args.json {
        let out = json!({
            "run_dir": cfg.run_dir, "running": all_alive, "supervisor": supervisor, "slots": slots, "totals": totals,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        if let Some(pid) = supervisor {
            println!("supervised by pid {pid} (start_proxy --foreground): it starts a slot that dies again");
        }
        print_table(&slots, &totals);
    }
    Ok(if all_alive { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn print_table(slots: &[Value], totals: &Value) {
    println!(
        "{:>4} {:>8} {:>6} {:>9} {:>5} {:>9} {:>9} {:>11} {:>11} {:>11}",
        "slot",
        "pid",
        "alive",
        "uptime",
        "conns",
        "hits",
        "misses",
        "from cache",
        "from origin",
        "cache used"
    );
    for s in slots {
        let v = |k: &str| s[k].to_string();
        if s["alive"].as_bool() == Some(true) {
            println!(
                "{:>4} {:>8} {:>6} {:>8.0}s {:>5} {:>9} {:>9} {:>11} {:>11} {:>11}",
                v("slot"),
                v("pid"),
                "yes",
                s["uptime_s"].as_f64().unwrap_or(0.0),
                v("connections"),
                v("hits"),
                v("misses"),
                format_size(s["bytes_from_cache"].as_u64().unwrap_or(0)),
                format_size(s["bytes_from_origin"].as_u64().unwrap_or(0)),
                format_size(s["cache_bytes_used"].as_u64().unwrap_or(0)),
            );
        } else {
            println!("{:>4} {:>8} {:>6}  {}", v("slot"), v("pid"), "NO", s["error"].as_str().unwrap_or(""));
        }
    }
    let (hits, misses) = (totals["hits"].as_u64().unwrap_or(0), totals["misses"].as_u64().unwrap_or(0));
    let ratio = if hits + misses > 0 { 100.0 * hits as f64 / (hits + misses) as f64 } else { 0.0 };
    println!(
        "total: {hits} hits, {misses} misses ({ratio:.1}% hit ratio); cache {} of {} in {} chunks; \
         {} chunks evicted, {} not kept (colder than what is cached)",
        format_size(totals["cache_bytes_used"].as_u64().unwrap_or(0)),
        format_size(totals["cache_capacity"].as_u64().unwrap_or(0)),
        totals["cached_chunks"],
        totals["evicted_chunks"],
        totals["rejected_chunks"].as_u64().map_or("?".to_string(), |n| n.to_string()),
    );
    let p = &totals["prefetch"];
    if p["hinted"].as_u64().unwrap_or(0) > 0 {
        println!(
            "prefetch: {} hinted, {} objects ({} chunks) fetched ahead, {} already cached, {} queued, \
             {} in flight, {} dropped, {} throttled, {} failed",
            p["hinted"],
            p["objects"],
            p["chunks"],
            p["skipped_cached"],
            p["queued"],
            p["inflight"],
            p["dropped"],
            p["throttled"],
            p["failed"],
        );
    }
}
