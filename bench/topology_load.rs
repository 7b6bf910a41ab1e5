//! Load generator of `bench/topology.sh`: posts `COUNT` signed `pull_request`
//! (`synchronized`) deliveries, each with a fresh delivery id, spread round-robin over
//! `REPOS` repositories (so `SHEPHERD_SHARDS` spreads them over shards, and on a
//! cluster over nodes), `CONNS` in flight, to one Shepherd ingest; prints one
//! tab-separated line: count, seconds, deliveries/s, p50 ms, p99 ms, 202s, others, and
//! the answers by status (`202:18,401:2`; status 0: no answer, a connection error).
//! `bench/lib.sh` also uses it as the load generator where wrk or the peers' harness is
//! missing (smoke mode).
//!
//! ```sh
//! cargo run --release --example topology_load -- URL SECRET FIXTURE COUNT CONNS REPOS RUN_ID
//! ```

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use shepherd::app::send::{ContentType, ForgejoRequest};

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 8,
        "usage: topology_load URL SECRET FIXTURE COUNT CONNS REPOS RUN_ID"
    );
    let (url, secret) = (args[1].clone(), args[2].clone());
    let fixture: serde_json::Value = serde_json::from_slice(&std::fs::read(&args[3])?)?;
    let count: usize = args[4].parse()?;
    let conns: usize = args[5].parse()?;
    let repos: usize = args[6].parse()?;
    let run = &args[7];
    // One body per repository: the fixture with its repository renamed.
    let bodies: Vec<Vec<u8>> = (0..repos)
        .map(|r| {
            let mut body = fixture.clone();
            let name = format!("bench-{r}");
            body["repository"]["name"] = name.clone().into();
            body["repository"]["full_name"] = format!("bench-org/{name}").into();
            body["repository"]["owner"]["login"] = "bench-org".into();
            serde_json::to_vec(&body).expect("JSON")
        })
        .collect();
    let requests: Vec<ForgejoRequest> = (0..count)
        .map(|i| {
            let delivery = format!("{run}-{i:012}");
            ForgejoRequest::new(
                &bodies[i % repos],
                "pull_request_sync",
                &delivery,
                secret.as_bytes(),
                ContentType::Json,
            )
        })
        .collect();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(conns)
        .build()?;
    let started = Instant::now();
    let answers: Vec<(u16, Duration)> = futures_util::stream::iter(requests)
        .map(|request| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let sent = Instant::now();
                let mut builder = client.post(&url).body(request.body.clone());
                for (name, value) in &request.headers {
                    builder = builder.header(name, value);
                }
                let status = builder.send().await.map_or(0, |r| r.status().as_u16());
                (status, sent.elapsed())
            }
        })
        .buffer_unordered(conns)
        .collect()
        .await;
    let secs = started.elapsed().as_secs_f64();
    let mut latencies: Vec<Duration> = answers.iter().map(|a| a.1).collect();
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p) as usize];
    let accepted = answers.iter().filter(|a| a.0 == 202).count();
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for a in &answers {
        *by_status.entry(a.0).or_default() += 1;
    }
    let by_status: Vec<String> = by_status.iter().map(|(s, n)| format!("{s}:{n}")).collect();
    println!(
        "{count}\t{secs:.2}\t{:.0}\t{:.2}\t{:.2}\t{accepted}\t{}\t{}",
        count as f64 / secs,
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        count - accepted,
        by_status.join(",")
    );
    Ok(())
}
