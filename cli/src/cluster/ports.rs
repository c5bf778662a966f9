//! Free TCP ports on 127.0.0.1, chosen by the kernel.

use std::net::TcpListener;

use super::layout::HOST;

/// `n` distinct free ports, none of them in `avoid`. All listeners are held
/// until every port is chosen, so the kernel cannot hand out one twice;
/// ports in `avoid` (given to stopped services or endpoints) are skipped.
pub fn allocate(n: usize, avoid: &[u16]) -> std::io::Result<Vec<u16>> {
    let mut held = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    // Bounded: the kernel would have to return avoided ports many times over.
    for _ in 0..(n + avoid.len()) * 4 + 16 {
        if ports.len() == n {
            break;
        }
        let listener = TcpListener::bind((HOST, 0))?;
        let port = listener.local_addr()?.port();
        held.push(listener);
        if !avoid.contains(&port) && !ports.contains(&port) {
            ports.push(port);
        }
    }
    if ports.len() < n {
        return Err(std::io::Error::other("the kernel kept returning ports already in use by this cluster"));
    }
    Ok(ports)
}

/// Whether `port` can be bound on 127.0.0.1 right now.
pub fn is_free(port: u16) -> bool {
    TcpListener::bind((HOST, port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_and_avoiding() {
        let first = allocate(8, &[]).unwrap();
        let mut sorted = first.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8);
        let second = allocate(8, &first).unwrap();
        assert!(second.iter().all(|p| !first.contains(p)));
        assert!(is_free(second[0]));
        let _held = TcpListener::bind((HOST, second[1])).unwrap();
        assert!(!is_free(second[1]));
    }
}
