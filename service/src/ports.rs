//! Free TCP ports on 127.0.0.1 for services that are configured now and bind
//! later.
//!
//! Ports are chosen below the kernel's ephemeral range, where it picks the
//! local ports of outgoing connections. A port the kernel hands out for
//! `bind(0)` is free only at that instant: any client connection may be
//! given it before the service binds it, and the service then fails with
//! "address in use". Outside that range only another listener can take it.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, TcpListener};
use std::ops::RangeInclusive;

/// Where the kernel keeps the ephemeral range.
const EPHEMERAL_RANGE_FILE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
/// The environment variable that confines the ports chosen to a range.
pub const PORT_RANGE_ENV: &str = "STRATA_PORT_RANGE";
/// The lowest port chosen: below it live well-known and registered services.
const LOWEST: u16 = 10_000;
/// A range narrower than this is not worth probing; the kernel chooses instead.
const MIN_SPAN: u32 = 1_000;

/// `n` distinct free ports, none of them in `avoid`. All are bound until every
/// one is chosen, so none is handed out twice within a call; ports in `avoid`
/// (given to stopped services) are skipped.
///
/// [`PORT_RANGE_ENV`], when set (`low-high`), is the range to choose from
/// instead: clusters started side by side (tests run in parallel) are
/// given disjoint ranges so that a port one has chosen and not yet bound
/// is never chosen by another.
pub fn allocate(n: usize, avoid: &[u16]) -> std::io::Result<Vec<u16>> {
    if let Ok(text) = std::env::var(PORT_RANGE_ENV) {
        return probe(n, avoid, configured_range(&text)?, random_u64());
    }
    let ephemeral = std::fs::read_to_string(EPHEMERAL_RANGE_FILE).ok().and_then(|s| parse_range(&s));
    match ephemeral.and_then(outside) {
        Some(range) => probe(n, avoid, range, random_u64()),
        None => from_kernel(n, avoid),
    }
}

/// The range a [`PORT_RANGE_ENV`] value (`low-high`) names.
fn configured_range(text: &str) -> std::io::Result<RangeInclusive<u16>> {
    match text.trim().split_once('-').and_then(|(lo, hi)| parse_range(&format!("{lo} {hi}"))) {
        Some((lo, hi)) if lo > 0 => Ok(lo..=hi),
        _ => Err(std::io::Error::other(format!("{PORT_RANGE_ENV}={text:?}: expected a range of ports, low-high"))),
    }
}

/// Whether `port` can be bound on 127.0.0.1 right now.
pub fn is_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Parses the ephemeral range file ("32768\t60999").
fn parse_range(text: &str) -> Option<(u16, u16)> {
    let mut it = text.split_whitespace().map(str::parse::<u16>);
    let (lo, hi) = (it.next()?.ok()?, it.next()?.ok()?);
    (lo <= hi).then_some((lo, hi))
}

/// The wider of the ranges below and above the ephemeral one, if either is
/// wide enough to probe.
fn outside((lo, hi): (u16, u16)) -> Option<RangeInclusive<u16>> {
    let below = (lo > LOWEST).then(|| LOWEST..=lo - 1);
    let above = (hi < u16::MAX).then(|| hi.max(LOWEST - 1) + 1..=u16::MAX);
    let span = |r: &RangeInclusive<u16>| u32::from(*r.end()) - u32::from(*r.start()) + 1;
    [below, above].into_iter().flatten().filter(|r| span(r) >= MIN_SPAN).max_by_key(span)
}

/// Tries the ports of `range` in order from a point given by `seed`, so that
/// allocators running side by side rarely try the same ports.
fn probe(n: usize, avoid: &[u16], range: RangeInclusive<u16>, seed: u64) -> std::io::Result<Vec<u16>> {
    let free = probe_order(&range, seed).filter_map(|p| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).ok()).map(Ok);
    let ports = choose(n, avoid, free)?;
    if ports.len() < n {
        return Err(std::io::Error::other(format!(
            "only {} of {n} ports free in {}..={}",
            ports.len(),
            range.start(),
            range.end()
        )));
    }
    Ok(ports)
}

/// Every port of `range` once, from the one `seed` points at, wrapping around.
fn probe_order(range: &RangeInclusive<u16>, seed: u64) -> impl Iterator<Item = u16> {
    let (start, len) = (u32::from(*range.start()), u32::from(*range.end()) - u32::from(*range.start()) + 1);
    let first = (seed % u64::from(len)) as u32;
    (0..len).map(move |i| (start + (first + i) % len) as u16)
}

/// The fallback when no range outside the ephemeral one is wide enough: the
/// kernel's own choice, with every listener held until all are chosen.
fn from_kernel(n: usize, avoid: &[u16]) -> std::io::Result<Vec<u16>> {
    // Bounded: the kernel would have to return avoided ports many times over.
    let tries = (n + avoid.len()) * 4 + 16;
    let ports = choose(n, avoid, (0..tries).map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0))))?;
    if ports.len() < n {
        return Err(std::io::Error::other("the kernel kept returning ports that are to be avoided"));
    }
    Ok(ports)
}

/// The ports of the first `n` of `listeners` not in `avoid` (fewer if
/// they run out), every listener held until all are chosen so that none
/// is handed out twice; the first error ends the choice.
fn choose(
    n: usize,
    avoid: &[u16],
    mut listeners: impl Iterator<Item = std::io::Result<TcpListener>>,
) -> std::io::Result<Vec<u16>> {
    let mut held = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        let Some(listener) = listeners.next() else { break };
        let listener = listener?;
        let port = listener.local_addr()?.port();
        if !avoid.contains(&port) {
            ports.push(port);
        }
        held.push(listener);
    }
    Ok(ports)
}

/// A per-call random number, from the standard library's randomly keyed hasher.
fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kernel_range_and_rejects_garbage() {
        assert_eq!(parse_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(parse_range("1024 65535"), Some((1024, 65535)));
        assert_eq!(parse_range("60999 32768"), None);
        assert_eq!(parse_range("32768"), None);
        assert_eq!(parse_range("a b"), None);
        assert_eq!(parse_range("32768 70000"), None);
    }

    #[test]
    fn a_configured_range_is_two_ports_low_to_high() {
        assert_eq!(configured_range("20000-20999").unwrap(), 20000..=20999);
        assert_eq!(configured_range(" 20000-20000\n").unwrap(), 20000..=20000);
        for bad in ["", "20000", "20999-20000", "0-10", "a-b", "20000-70000", "20000 20999"] {
            let err = configured_range(bad).unwrap_err().to_string();
            assert!(err.contains("STRATA_PORT_RANGE"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn chooses_the_wider_side_outside_the_ephemeral_range() {
        assert_eq!(outside((32768, 60999)), Some(10_000..=32767));
        assert_eq!(outside((10_500, 30_000)), Some(30_001..=65535));
        assert_eq!(outside((1024, 65535)), None);
        assert_eq!(outside((10_200, 65_000)), None);
        assert_eq!(outside((5_000, 9_000)), Some(10_000..=65535));
    }

    #[test]
    fn ports_are_distinct_free_and_avoid_what_they_are_told() {
        let first = allocate(8, &[]).unwrap();
        let mut sorted = first.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8);
        let second = allocate(8, &first).unwrap();
        assert!(second.iter().all(|p| !first.contains(p)));
        assert!(second.iter().all(|&p| is_free(p)));
        let _held = TcpListener::bind((Ipv4Addr::LOCALHOST, second[1])).unwrap();
        assert!(!is_free(second[1]));
        if let Some(range) = std::fs::read_to_string(EPHEMERAL_RANGE_FILE).ok().and_then(|s| parse_range(&s)) {
            assert!(first.iter().all(|p| !(range.0..=range.1).contains(p)), "{first:?} inside {range:?}");
        }
    }

    #[test]
    fn probing_visits_every_port_once_from_the_seed() {
        assert_eq!(probe_order(&(100..=103), 6).collect::<Vec<_>>(), vec![102, 103, 100, 101]);
        assert_eq!(probe_order(&(65534..=65535), 1).collect::<Vec<_>>(), vec![65535, 65534]);
        assert_eq!(probe_order(&(7..=7), u64::MAX).collect::<Vec<_>>(), vec![7]);
    }

    #[test]
    fn probing_skips_taken_and_avoided_ports() {
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let t = taken.local_addr().unwrap().port();
        let err = probe(1, &[], t..=t, 0).unwrap_err();
        assert!(err.to_string().contains("only 0 of 1"), "{err}");
        let free = allocate(1, &[]).unwrap()[0];
        assert!(probe(1, &[free], free..=free, 0).is_err());
        assert_eq!(probe(1, &[], free..=free, 0).unwrap(), vec![free]);
    }
}
