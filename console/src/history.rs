//! The graphs' history, kept by the console itself (no time-series
//! database): every [`SAMPLE_INTERVAL`] it reads the metrics of the
//! running computes and pageservers, turns counters into rates, and keeps
//! each series for the last hour at that interval and for the last day in
//! 5-minute averages. Bounded by [`MAX_SERIES`] series of fixed length;
//! written to `console/history.json` every minute, so a restart keeps it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_control_plane::layout::{Kind, Workdir};
use tracing::warn;

use crate::limits::{
    DAY_SLOTS, DAY_SLOT_SECS, HISTORY_SAVE_INTERVAL, HOUR_SLOTS, MAX_METRICS_BYTES, MAX_SERIES, SAMPLE_INTERVAL,
    SCRAPE_TIMEOUT,
};
use crate::snapshot::Snapshots;

/// The series the console draws: name, label, unit; whether it exists per
/// tenant (else only for the whole cluster).
pub const SERIES: &[(&str, &str, &str, bool)] = &[
    ("tps", "Transactions per second", "tx/s", true),
    ("connections", "Client connections", "count", true),
    ("commit_latency", "Commit wait on the safekeepers", "s", true),
    ("wal_rate", "WAL written", "bytes/s", true),
    ("replica_lag", "Replica lag (largest)", "s", true),
    ("ingest_lag", "Ingest lag (largest branch)", "bytes", true),
    ("getpage_latency", "GetPage latency (mean)", "s", false),
    ("wal_ingest", "WAL ingested by pageservers", "bytes/s", false),
    ("object_storage_write", "Layer uploads to object storage", "bytes/s", false),
    ("object_storage_read", "Layer downloads from object storage", "bytes/s", false),
];

/// The cluster's own series' tenant key.
pub const CLUSTER: &str = "";

/// One series: its points of the last hour (slot of [`SAMPLE_INTERVAL`],
/// value) and of the last day (5-minute slot, sum, count).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct Series {
    hour: VecDeque<(u64, f64)>,
    day: VecDeque<(u64, f64, u32)>,
}

impl Series {
    fn add(&mut self, now: u64, value: f64) {
        let slot = now / SAMPLE_INTERVAL.as_secs();
        match self.hour.back_mut() {
            Some((s, v)) if *s == slot => *v = value,
            _ => self.hour.push_back((slot, value)),
        }
        while self.hour.front().is_some_and(|(s, _)| *s + HOUR_SLOTS <= slot) {
            self.hour.pop_front();
        }
        let day = now / DAY_SLOT_SECS;
        match self.day.back_mut() {
            Some((s, sum, n)) if *s == day => {
                *sum += value;
                *n += 1;
            }
            _ => self.day.push_back((day, value, 1)),
        }
        while self.day.front().is_some_and(|(s, _, _)| *s + DAY_SLOTS <= day) {
            self.day.pop_front();
        }
        debug_assert!(self.hour.len() as u64 <= HOUR_SLOTS && self.day.len() as u64 <= DAY_SLOTS);
    }

    /// The points of a range ending at `now`, one per slot, null where nothing was sampled.
    fn points(&self, now: u64, day: bool) -> Vec<(u64, Option<f64>)> {
        let (step, slots) = if day { (DAY_SLOT_SECS, DAY_SLOTS) } else { (SAMPLE_INTERVAL.as_secs(), HOUR_SLOTS) };
        let last = now / step;
        let first = (last + 1).saturating_sub(slots);
        let mut out: Vec<(u64, Option<f64>)> = (first..=last).map(|s| (s * step, None)).collect();
        if day {
            for (s, sum, n) in &self.day {
                if let Some(p) = s.checked_sub(first).and_then(|i| out.get_mut(i as usize)) {
                    p.1 = Some(sum / f64::from((*n).max(1)));
                }
            }
        } else {
            for (s, v) in &self.hour {
                if let Some(p) = s.checked_sub(first).and_then(|i| out.get_mut(i as usize)) {
                    p.1 = Some(*v);
                }
            }
        }
        out
    }
}

/// Every series, by (name, tenant).
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Store {
    version: u32,
    series: BTreeMap<String, Series>,
}

fn key(name: &str, tenant: &str) -> String {
    format!("{name}/{tenant}")
}

/// A graph's data as the API answers it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SeriesOut {
    pub name: &'static str,
    pub label: &'static str,
    pub unit: &'static str,
    pub points: Vec<(u64, Option<f64>)>,
}

/// The history, and where it is saved.
pub struct History {
    path: PathBuf,
    store: Mutex<Store>,
    dropped: Mutex<u64>,
}

impl History {
    /// The history saved at `path`, if any (one that does not read is
    /// started afresh, and said so).
    pub fn open(path: PathBuf) -> Arc<History> {
        let store = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice::<Store>(&bytes).unwrap_or_else(|e| {
                warn!(file = %path.display(), "the graphs' history does not read ({e}); starting afresh");
                Store::default()
            }),
            Err(_) => Store::default(),
        };
        Arc::new(History { path, store: Mutex::new(store), dropped: Mutex::new(0) })
    }

    /// Adds a value of series `name` of `tenant` ([`CLUSTER`] for the whole cluster) at `now`.
    pub fn add(&self, name: &str, tenant: &str, now: u64, value: f64) {
        if !value.is_finite() {
            return;
        }
        let mut store = self.store.lock();
        let k = key(name, tenant);
        if !store.series.contains_key(&k) && store.series.len() >= MAX_SERIES {
            *self.dropped.lock() += 1;
            return;
        }
        store.series.entry(k).or_default().add(now, value);
    }

    /// Forgets the series of tenants that are gone.
    pub fn keep_tenants(&self, tenants: &[String]) {
        self.store.lock().series.retain(|k, _| {
            let tenant = k.split_once('/').map_or("", |(_, t)| t);
            tenant == CLUSTER || tenants.iter().any(|t| t == tenant)
        });
    }

    /// The series of `tenant` (or the cluster's), over the last hour or day.
    pub fn query(&self, tenant: Option<&str>, day: bool, now: u64) -> Vec<SeriesOut> {
        let store = self.store.lock();
        SERIES
            .iter()
            .filter(|(_, _, _, per_tenant)| tenant.is_none() || *per_tenant)
            .map(|(name, label, unit, _)| {
                let points = match store.series.get(&key(name, tenant.unwrap_or(CLUSTER))) {
                    Some(s) => s.points(now, day),
                    None => Series::default().points(now, day),
                };
                SeriesOut { name, label, unit, points }
            })
            .collect()
    }

    pub fn series_count(&self) -> usize {
        self.store.lock().series.len()
    }

    /// Writes the history to its file (mode 0600, replaced whole).
    pub fn save(&self) -> Result<(), String> {
        let text = {
            let mut store = self.store.lock();
            store.version = 1;
            serde_json::to_vec(&*store).expect("the history serializes")
        };
        strata_service::durable::replace_file_with_mode(&self.path, &text, false, 0o600).map_err(|e| e.to_string())
    }
}

/// The values of the metrics of one scrape: name (with labels) to value.
pub fn parse_metrics(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text.lines().take(100_000) {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // `name{labels} value [timestamp]`: the value follows the last space
        // after the labels' closing brace.
        let split = match line.rfind('}') {
            Some(i) => i + 1,
            None => line.find(' ').unwrap_or(line.len()),
        };
        let (name, rest) = line.split_at(split);
        let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        out.insert(name.trim().to_string(), value);
    }
    out
}

/// The counters of the last scrape of each source, for rates.
#[derive(Default)]
struct Previous {
    at: HashMap<String, (u64, f64)>,
}

impl Previous {
    /// The increase of counter `id` since its last value (none the first
    /// time, and after a reset: a restarted process counts from zero).
    fn delta(&mut self, id: String, now: u64, value: f64) -> Option<(f64, f64)> {
        let before = self.at.insert(id, (now, value));
        let (t, v) = before?;
        (value >= v && now > t).then(|| (value - v, (now - t) as f64))
    }
}

/// A source's sums toward one tenant's (or the cluster's) series.
#[derive(Default)]
struct Sums {
    tx: Option<f64>,
    connections: Option<f64>,
    ack_wait: f64,
    acks: f64,
    wal: Option<f64>,
    replica_lag: Option<f64>,
}

impl Sums {
    fn add_rate(slot: &mut Option<f64>, rate: f64) {
        *slot = Some(slot.unwrap_or(0.0) + rate);
    }
}

/// Samples every interval until the process ends.
pub fn run_sampler(root: PathBuf, history: Arc<History>, snapshots: Arc<Snapshots>) {
    let mut previous = Previous::default();
    let mut last_save = std::time::Instant::now();
    loop {
        let started = std::time::Instant::now();
        if let Err(e) = sample(&root, &history, &snapshots, &mut previous) {
            warn!("sampling the metrics: {e}");
        }
        if last_save.elapsed() >= HISTORY_SAVE_INTERVAL {
            if let Err(e) = history.save() {
                warn!("saving the graphs' history: {e}");
            }
            last_save = std::time::Instant::now();
        }
        std::thread::sleep(SAMPLE_INTERVAL.saturating_sub(started.elapsed()));
    }
}

fn scrape(url: &str) -> Option<HashMap<String, f64>> {
    let r = strata_control_plane::http::get(url, SCRAPE_TIMEOUT).ok().filter(|r| r.status == 200)?;
    let text = r.body.as_str()?;
    (text.len() <= MAX_METRICS_BYTES).then(|| parse_metrics(text))
}

fn sample(root: &Path, history: &History, snapshots: &Snapshots, previous: &mut Previous) -> Result<(), String> {
    let wd = Workdir::open(root).map_err(|e| e.to_string())?;
    let snap = snapshots.current();
    let now = strata_service::auth::now();
    let mut per_tenant: HashMap<String, Sums> = HashMap::new();
    // The agents' ports, read once (the endpoints of other hosts through their nodes).
    let ports: HashMap<String, u16> = strata_control_plane::endpoint::inventory(&wd)
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r.file.name, r.file.http_port))
        .collect();
    for ep in snap.endpoints.iter().filter(|e| e.state == "running") {
        let Some(host) = wd.cluster.host(&ep.host) else { continue };
        let Some(&port) = ports.get(&ep.name) else { continue };
        let url = format!(
            "{}://{}/metrics",
            strata_control_plane::http::scheme(),
            std::net::SocketAddr::new(host.address, port)
        );
        let Some(m) = scrape(&url) else { continue };
        let sums = per_tenant.entry(ep.tenant.clone()).or_default();
        let id = |metric: &str| format!("{}:{metric}", ep.name);
        if let Some(v) = m.get("strata_compute_transactions_total") {
            if let Some((d, secs)) = previous.delta(id("tx"), now, *v) {
                Sums::add_rate(&mut sums.tx, d / secs);
            }
        }
        if let Some(v) = m.get("strata_compute_client_connections") {
            Sums::add_rate(&mut sums.connections, *v);
        }
        if ep.role == "writer" {
            let acks = m.get("strata_proposer_acks_total").copied();
            let wait = m.get("strata_proposer_ack_wait_seconds_total").copied();
            if let (Some(acks), Some(wait)) = (acks, wait) {
                let da = previous.delta(id("acks"), now, acks);
                let dw = previous.delta(id("ack_wait"), now, wait);
                if let (Some((da, _)), Some((dw, _))) = (da, dw) {
                    sums.acks += da;
                    sums.ack_wait += dw;
                }
            }
            if let Some(v) = m.get("strata_proposer_commit_lsn") {
                if let Some((d, secs)) = previous.delta(id("commit_lsn"), now, *v) {
                    Sums::add_rate(&mut sums.wal, d / secs);
                }
            }
        }
        if let Some(v) = m.get("strata_compute_replica_lag_seconds") {
            sums.replica_lag = Some(sums.replica_lag.unwrap_or(0.0).max(*v));
        }
    }
    let mut cluster = Sums::default();
    for (tenant, s) in &per_tenant {
        if let Some(tx) = s.tx {
            history.add("tps", tenant, now, tx);
            Sums::add_rate(&mut cluster.tx, tx);
        }
        if let Some(c) = s.connections {
            history.add("connections", tenant, now, c);
            Sums::add_rate(&mut cluster.connections, c);
        }
        if s.acks > 0.0 {
            history.add("commit_latency", tenant, now, s.ack_wait / s.acks);
        }
        cluster.acks += s.acks;
        cluster.ack_wait += s.ack_wait;
        if let Some(w) = s.wal {
            history.add("wal_rate", tenant, now, w);
            Sums::add_rate(&mut cluster.wal, w);
        }
        if let Some(l) = s.replica_lag {
            history.add("replica_lag", tenant, now, l);
            cluster.replica_lag = Some(cluster.replica_lag.unwrap_or(0.0).max(l));
        }
    }
    let cl = CLUSTER;
    if let Some(v) = cluster.tx {
        history.add("tps", cl, now, v);
    }
    if let Some(v) = cluster.connections {
        history.add("connections", cl, now, v);
    }
    if cluster.acks > 0.0 {
        history.add("commit_latency", cl, now, cluster.ack_wait / cluster.acks);
    }
    if let Some(v) = cluster.wal {
        history.add("wal_rate", cl, now, v);
    }
    if let Some(v) = cluster.replica_lag {
        history.add("replica_lag", cl, now, v);
    }
    // Ingest lag from the last snapshot: the pageservers' and safekeepers' own answers.
    let mut cluster_lag: Option<u64> = None;
    for (tenant, branches) in &snap.branches {
        if let Some(lag) = branches.iter().filter_map(|b| b.ingest_lag_bytes).max() {
            history.add("ingest_lag", tenant, now, lag as f64);
            cluster_lag = Some(cluster_lag.unwrap_or(0).max(lag));
        }
    }
    if let Some(lag) = cluster_lag {
        history.add("ingest_lag", cl, now, lag as f64);
    }
    // The pageservers' own metrics.
    let (mut secs, mut reqs, mut up, mut down, mut ingest) = (0.0, 0.0, None, None, None);
    for ps in wd.cluster.of_kind(Kind::Pageserver) {
        if !snap.services.iter().any(|s| s.name == ps.name && s.health == "ok") {
            continue;
        }
        let Some(m) = scrape(&format!("{}/metrics", ps.http_url())) else { continue };
        let id = |metric: &str| format!("{}:{metric}", ps.name);
        let mut rate = |metric: &str, slot: &mut Option<f64>| {
            if let Some(v) = m.get(metric) {
                if let Some((d, s)) = previous.delta(id(metric), now, *v) {
                    Sums::add_rate(slot, d / s);
                }
            }
        };
        rate("strata_pageserver_upload_bytes_total", &mut up);
        rate("strata_pageserver_download_bytes_total", &mut down);
        rate("strata_pageserver_wal_bytes_ingested_total", &mut ingest);
        let sum = m.get("strata_pageserver_request_seconds_sum").copied();
        let count = m.get("strata_pageserver_request_seconds_count").copied();
        if let (Some(sum), Some(count)) = (sum, count) {
            let ds = previous.delta(id("req_sum"), now, sum);
            let dc = previous.delta(id("req_count"), now, count);
            if let (Some((ds, _)), Some((dc, _))) = (ds, dc) {
                secs += ds;
                reqs += dc;
            }
        }
    }
    if reqs > 0.0 {
        history.add("getpage_latency", cl, now, secs / reqs);
    }
    for (name, v) in [("object_storage_write", up), ("object_storage_read", down), ("wal_ingest", ingest)] {
        if let Some(v) = v {
            history.add(name, cl, now, v);
        }
    }
    let tenants: Vec<String> = wd.cluster.tenants.iter().map(|t| t.name.clone()).collect();
    history.keep_tenants(&tenants);
    // Endpoints that are gone leave their last counters: forget them.
    previous.at.retain(|_, (t, _)| now.saturating_sub(*t) < 10 * SAMPLE_INTERVAL.as_secs());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_text_is_read_by_name_and_labels() {
        let text =
            "# HELP x y\n# TYPE a counter\na_total 12\nb{tenant=\"t 1\"} 3.5\nc 1e3 1700000000\nbad line here\n\n";
        let m = parse_metrics(text);
        assert_eq!(m["a_total"], 12.0);
        assert_eq!(m["b{tenant=\"t 1\"}"], 3.5);
        assert_eq!(m["c"], 1000.0);
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn series_keep_an_hour_and_a_day_and_no_more() {
        let mut s = Series::default();
        let start = 1_800_000_000u64;
        for i in 0..(2 * 24 * 360) {
            s.add(start + i * 10, i as f64);
        }
        assert_eq!(s.hour.len() as u64, HOUR_SLOTS);
        assert_eq!(s.day.len() as u64, DAY_SLOTS);
        let now = start + (2 * 24 * 360 - 1) * 10;
        let hour = s.points(now, false);
        assert_eq!(hour.len() as u64, HOUR_SLOTS);
        assert!(hour.iter().all(|(_, v)| v.is_some()));
        assert_eq!(hour.last().unwrap().1, Some((2 * 24 * 360 - 1) as f64));
        let day = s.points(now, true);
        assert_eq!(day.len() as u64, DAY_SLOTS);
        // A 5-minute slot is the mean of its 30 samples.
        let full = day[day.len() - 2].1.unwrap();
        assert!(full > 0.0);
        // An hour later with nothing sampled: all gaps.
        assert!(s.points(now + 3600, false).iter().all(|(_, v)| v.is_none()));
    }

    #[test]
    fn rates_skip_the_first_sample_and_resets() {
        let mut p = Previous::default();
        assert_eq!(p.delta("a".into(), 10, 100.0), None);
        assert_eq!(p.delta("a".into(), 20, 150.0), Some((50.0, 10.0)));
        assert_eq!(p.delta("a".into(), 30, 5.0), None);
        assert_eq!(p.delta("a".into(), 40, 25.0), Some((20.0, 10.0)));
    }

    #[test]
    fn the_series_count_is_bounded_and_saved() {
        let dir = std::env::temp_dir().join(format!("strata-console-history-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let h = History::open(dir.join("history.json"));
        for i in 0..MAX_SERIES + 10 {
            h.add("tps", &format!("t{i}"), 1_800_000_000, 1.0);
        }
        assert_eq!(h.series_count(), MAX_SERIES);
        h.save().unwrap();
        let again = History::open(dir.join("history.json"));
        assert_eq!(again.series_count(), MAX_SERIES);
        again.keep_tenants(&["t1".to_string()]);
        assert_eq!(again.series_count(), 1);
        assert_eq!(again.query(Some("t1"), false, 1_800_000_000)[0].points.last().unwrap().1, Some(1.0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
